// ops/cuda/cudnn_attention.hpp — causal attention through cuDNN's fused flash attention
// (private to src/ops/cuda; issue 27, step 1). cuDNN is loaded at run time (dlopen of
// libcudnn.so.9, or TRIDENT_CUDNN_LIBRARY), so trident builds, links and runs where it is
// missing; the cuDNN headers are used at compile time for enums and types only, and where
// the build does not find them (TRIDENT_HAVE_CUDNN unset by CMake's detection) this file's
// class is a stub that is never available. The CPU stand-in (emulate/train.sh) builds the
// real loader where the headers are and refuses after cudnnCreate (no device memory).
// defines: trident::ops::cuda::CudnnAttention
//
// What it takes (decline() says why not): causal, written (not accumulated) gradients,
// nkv == nh, hs a multiple of 8 and <= 128, each sequence's rows packed (batch stride
// t * ld: not ring attention's blocks) and lse rows of t. Everything else stays on
// flash_attention.cu's kernels. CudaOps calls it under bf16 products only.
//
// bf16 I/O (forward_bf16, backward_bf16: CudaOps::attention_forward_bf16's first path): the
// caller's bf16 q, k, v, out, dout and dq, dk, dv go to cuDNN as they are, [b,h,s,d] with
// strides {t * ld, hs, ld, 1} (ld each tensor's row stride): no conversion passes.
//
// Data: trident's q/k/v are fp32 strided views (of the fused qkv [B,T,3C]); each call
// converts them to packed bf16 [B,T,NH*hs] copies in the op scratch and hands cuDNN
// [b,h,s,d] views of those (strides {T*NH*hs, hs, NH*hs, 1}); O comes back as bf16 in the
// same layout and is widened into out (row stride ld_o). Stats, cuDNN's fp32 [b,h,s,1]
// (max + log(sum exp) of the scaled, masked scores, natural log) is trident's lse
// [B,NH,T] exactly, so cuDNN reads and writes lse in place. The backward converts dout and
// out too and widens dQ/dK/dV (bf16) into dq/dk/dv.
//
// Memory: each call takes its bf16 copies, the backward's fp32 row sums (and dQ accumulator
// when non-deterministic) and cuDNN's workspace from the op scratch; prepare() says how much,
// exactly, and Ops::fused_attention_bytes reports it to model::predict_memory. cuDNN states
// its workspace only per plan: plans asking more than cudnn_workspace_bound are skipped.
//
// Failure is never fatal: a library that is missing or older than 9.0, a graph that cuDNN
// does not support, no engine (or none deterministic, or none within the workspace bound),
// an execute error — each makes the call return false (the caller runs its own kernel), and
// the first one prints one line on stderr per process:
//   "cuDNN attention unavailable (REASON): using trident's kernel".
// A shape that failed is not tried again. Environment: TRIDENT_CUDNN=0 turns it off;
// TRIDENT_CUDNN_LIBRARY=PATH loads that file; TRIDENT_CUDNN_DETERMINISTIC=0 allows the
// faster backward that accumulates dQ with atomics (default: deterministic);
// TRIDENT_CUDNN_VERBOSE=1 prints the library and each plan's engine and workspace once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "memory.hpp"
#include "trident/ops/ops.hpp"

namespace trident::ops::cuda {

// The largest cuDNN workspace a plan may ask: the deterministic backward's dP buffer as
// cudnn-frontend sizes it on Hopper (bf16 [b, h, ceil64(s), ceil128(s)]), plus an fp32
// [b, h, s, d], and at least 64 MiB (a cap against absurd plans, not a prediction).
std::int64_t cudnn_workspace_bound(std::int64_t b, std::int64_t t, std::int64_t nh,
                                   std::int64_t hs);

class CudnnAttention {
 public:
  // nullptr when the shape is one this path takes; else why not (a fixed string).
  static const char* decline(const Ops::AttentionShape& s);
  // The same for the bf16-I/O calls (forward_bf16, backward_bf16), which hand cuDNN the
  // caller's tensors: also row strides multiples of 8 and every tensor 16-byte aligned (the
  // alignment the graphs declare, lse's Stats included).
  static const char* decline_bf16(const Ops::AttentionShape& s,
                                  std::initializer_list<const void*> tensors);

  // Nothing is loaded here: the library and handle come at the first available() call.
  explicit CudnnAttention(cudaStream_t stream);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Loads libcudnn, checks its version, makes the handle on `stream` (once). False, with
  // the reason in reason() (and the stderr line printed once), when that fails or is off.
  bool available();
  // Why the last refusal happened ("" when none).
  const std::string& reason() const { return reason_; }
  // "cuDNN 9.19.0 (/path/libcudnn.so.9)" once loaded, else "".
  std::string describe() const;

  // The op scratch one call of this shape needs (bf16 copies + workspace), after building
  // (and caching) its plan; -1 when no plan can be made (reason() says why). backward
  // selects the backward graph; bf16_io the graph on the caller's strides (no copies).
  // Plans are cached per (forward/backward, b, t, nh, hs, the four row strides).
  std::int64_t prepare(const Ops::AttentionShape& s, bool backward, bool bf16_io = false);
  // The calls themselves, after prepare() said yes for the shape; `scratch` holds at least
  // prepare()'s bytes (reset). False when cuDNN refused to execute (the outputs are then
  // untouched or partly written: the caller recomputes them).
  bool forward(BumpBlock& scratch, float* out, float* lse, const float* q, const float* k,
               const float* v, const Ops::AttentionShape& s);
  bool backward(BumpBlock& scratch, float* dq, float* dk, float* dv, const float* dout,
                const float* out, const float* lse, const float* q, const float* k,
                const float* v, const Ops::AttentionShape& s);
  // The bf16-I/O calls, after prepare(s, ..., true) said yes: cuDNN reads q, k, v (and out,
  // dout) and writes out (dq, dk, dv) in place with the shape's row strides, no copies; the
  // scratch holds only the backward's row sums (and dQ accumulator) and the workspace.
  bool forward_bf16(BumpBlock& scratch, std::uint16_t* out, float* lse, const std::uint16_t* q,
                    const std::uint16_t* k, const std::uint16_t* v, const Ops::AttentionShape& s);
  bool backward_bf16(BumpBlock& scratch, std::uint16_t* dq, std::uint16_t* dk,
                     std::uint16_t* dv, const std::uint16_t* dout, const std::uint16_t* out,
                     const float* lse, const std::uint16_t* q, const std::uint16_t* k,
                     const std::uint16_t* v, const Ops::AttentionShape& s);

  // For the probe (trident_cudnn_probe) and the GPU check: loads the library and builds
  // both graphs for (b, t, nh, hs) (packed copies, then the bf16-I/O graphs on GPT's fused
  // qkv strides) as far as it can — without a GPU, as far as cuDNN goes
  // without a handle — and returns a report, one step a line, ending with the first
  // failing call (cudnnGetErrorString and cudnnGetLastErrorString) or "ok".
  static std::string probe(int b, int t, int nh, int hs);

 private:
  // Says why (once per process on stderr) and returns false.
  bool refuse(std::string why);
  struct Impl;  // everything cuDNN (cudnn_attention.cpp); null in a build without headers
  std::unique_ptr<Impl> impl_;
  cudaStream_t stream_;
  std::string reason_;
  bool tried_ = false, ok_ = false;
};

}  // namespace trident::ops::cuda
