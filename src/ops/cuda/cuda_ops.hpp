// ops/cuda/cuda_ops.hpp — the CUDA backend of trident::ops::Ops (private to src/ops/cuda):
// cuBLAS for every matrix product, the kernels of kernels.hpp for everything else, all queued
// on one stream the object owns. The member functions are defined in cuda_ops.cpp (setup,
// scratch, copies, the non-GEMM ops), matmul.cpp (gemm, linear, attention),
// cudnn_attention.cpp (attention through cuDNN, tried first under bf16), attention_bf16.cpp
// (attention on bf16 q/k/v/out and gradients) and fused_block.cpp (the coarse GPT-2 block on
// bf16 activations).
// defines: trident::ops::cuda::CudaOps
//
// Memory: one cudaMalloc per object, made in the constructor: the arena of `memory_`
// (CudaMemory, memory.hpp), which memory() hands to the model and from which the backend takes
// its own blocks too: the cuBLAS workspace and the sum_squares partials (for the object's
// life), and `scratch_`, a block that holds what one op needs for the length of that call
// (bf16 copies of GEMM inputs, layernorm column partials, the ones vector of db). scratch()
// grows it (release + allocate in the arena, no cudaMalloc) only when a call needs more than
// it has, which happens at the first call of the largest shape, i.e. in the first training
// step; so the arena must leave room for the largest op's scratch besides the model.
//
// Precision (Ops::gemm, linear_*: the model's large products):
//   fp32  cublasGemmEx, CUBLAS_COMPUTE_32F: plain fp32, matches the CPU to rounding.
//   tf32  cublasGemmEx, CUBLAS_COMPUTE_32F_FAST_TF32: fp32 in and out, tensor cores round the
//         inputs to TF32 inside the GEMM; no extra memory or passes.
//   bf16  inputs converted to packed bf16 in scratch (round to nearest even), then
//         cublasGemmEx bf16 x bf16 -> fp32 with fp32 accumulation (CUBLAS_COMPUTE_32F), and
//         fp32 outputs. The kernels' interface stays fp32; what is stored as bf16 is the
//         model's stash (GptChunk::bf16_storage: each layer's large activations, packed with
//         to_bf16 after the layer's forward and unpacked with from_bf16 into one fp32 layer
//         before its backward), which halves the activation memory. Weights, gradients and
//         the optimizer stay fp32 (no loss scaling). A product's operand that lies in the
//         model's weights (set_weights) is read from a bf16 copy of them made once after each
//         change (the weight cache, 2 bytes per parameter in the arena); the activation
//         operands are converted in scratch per call. The fused GPT-2 block
//         (gpt2_block_forward/backward, fused_block.cpp) instead keeps its activations and the
//         stash in bf16 end to end (the model then carves a bf16 stash and packs nothing).
// Attention's per-head products (strided-batched, read in place from qkv) have no packed
// copy to convert, so under bf16 they use CUBLAS_COMPUTE_32F_FAST_16BF (cuBLAS rounds the
// fp32 inputs to bf16 itself); under tf32, 32F_FAST_TF32; under fp32, 32F.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cudnn_attention.hpp"
#include "memory.hpp"
#include "op_timer.hpp"
#include "trident/ops/cuda.hpp"
#include "trident/ops/ops.hpp"

namespace trident::ops::cuda {

struct FlashShape;  // kernels.hpp
class LtTuner;     // lt_tune.hpp
struct ColMajor;   // plans.hpp

// cuBLAS's (and cuBLASLt's) workspace: NVIDIA's recommendation for Hopper (32 MiB; 4 MiB
// would do before it).
constexpr std::size_t kCublasWorkspaceBytes = std::size_t(32) << 20;

class CudaOps final : public Ops {
 public:
  // arena_bytes: the size of memory()'s one cudaMalloc (0: default_arena_bytes).
  CudaOps(Precision precision, std::size_t arena_bytes, int ranks_per_device);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  Device device() const override { return Device::cuda; }
  std::string name() const override;
  Precision precision() const override { return precision_; }
  void set_weights(const float* params, std::int64_t n) override;
  void weights_changed() override { weights16_fresh_ = false; }
  // Graphs (graphs.cpp): stream capture on the backend's stream (thread-local mode).
  std::string graphs_unsupported() const override;
  void before_graph() override;
  bool begin_capture(std::string* why) override;
  int end_capture(std::string* why) override;
  bool launch_graph(int handle, std::string* why) override;
  void release_graph(int handle) override;
  cudaStream_t stream() const { return stream_; }
  DeviceMemory* memory() override { return memory_.get(); }
  CudaMemory& cuda_memory() { return *memory_; }
  // The scratch block's size now (grown by the largest op seen so far).
  std::size_t scratch_capacity() const { return scratch_.capacity(); }

  // Host <-> device copies on this object's stream, complete on return.
  void upload(void* device_dst, const void* host_src, std::size_t bytes);
  void download(void* host_dst, const void* device_src, std::size_t bytes);
  void synchronize();

  void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            int lda, const float* b, int ldb, float beta, float* c, int ldc) override;
  void linear_forward(float* y, const float* x, const float* w, const float* b, int n, int in,
                      int out) override;
  void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                       const float* w, int n, int in, int out) override;

  void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                         const float* b, int n, int c) override;
  void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                          const float* w, const float* mean, const float* rstd, int n,
                          int c) override;

  void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int n, int c,
                       float eps) override;
  void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                        const float* rstd, int n, int c) override;
  void rope_forward(float* x, int b, int t, int ld, int heads, int hs, int pos0,
                    float theta) override;
  void rope_backward(float* dx, int b, int t, int ld, int heads, int hs, int pos0,
                     float theta) override;
  void swiglu_forward(float* y, const float* gu, int n, int f) override;
  void swiglu_backward(float* dgu, const float* gu, const float* dy, int n, int f) override;

  void gelu_forward(float* y, const float* x, std::int64_t n) override;
  void gelu_backward(float* dx, const float* x, const float* dy, std::int64_t n) override;
  void add(float* y, const float* a, const float* b, std::int64_t n) override;
  void scale(float* x, float alpha, std::int64_t n) override;
  double sum_squares(const float* x, std::int64_t n) override;
  void fill(float* x, float value, std::int64_t n) override;
  void copy(float* dst, const float* src, std::int64_t n) override;
  void copy_rows(float* dst, std::int64_t ld_dst, const float* src, std::int64_t ld_src,
                 std::int64_t rows, std::int64_t width) override;
  void to_bf16(std::uint16_t* dst, const float* src, std::int64_t n) override;
  void from_bf16(float* dst, const std::uint16_t* src, std::int64_t n) override;

  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const AttentionShape& s) override;
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          const AttentionShape& s) override;
  void attention_merge(float* out, float* lse, const float* out_part, const float* lse_part,
                       const AttentionShape& s) override;
  std::int64_t fused_attention_bytes(const AttentionShape& s,
                                     bool bf16_io = false) override;  // cudnn_attention.cpp
  void attention_naive_forward(float* out, float* att, const float* qkv, int b, int t, int c,
                         int nh) override;
  void attention_naive_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                          const float* att, int b, int t, int c, int nh) override;

  void attention_decode(float* out, float* scratch, const float* q, const float* k,
                        const float* v, int b, int s, int nh, int nkv, int hs, std::int64_t ld_q,
                        std::int64_t ld_kv, std::int64_t kv_batch, std::int64_t ld_o) override;

  void embedding_forward(float* x, const std::int32_t* tokens, const float* wte, int n, int c,
                         int vocab_start, int v) override;
  void embedding_backward(float* dwte, const float* dx, const std::int32_t* tokens, int n,
                          int c, int vocab_start, int v) override;
  void position_forward(float* x, const float* wpe, int b, int t, int c) override;
  void position_backward(float* dwpe, const float* dx, int b, int t, int c) override;

  void xent_row_max(float* row_max, const float* logits, int n, int ld, int v_valid) override;
  void xent_sumexp(float* sumexp, float* target_logit, const float* logits,
                   const float* row_max, const std::int32_t* targets, int n, int ld, int v_valid,
                   int vocab_start) override;
  void xent_loss(float* loss, const float* row_max, const float* sumexp,
                 const float* target_logit, int n) override;
  void xent_backward(float* logits, const float* row_max, const float* sumexp,
                     const std::int32_t* targets, int n, int ld, int v_valid, int vocab_start,
                     float scale) override;
  void xent_shard_stats(float* row_max, float* sumexp, float* target_logit, const float* logits,
                        const std::int32_t* targets, int n, int ld, int v_valid,
                        int vocab_start) override;
  void xent_rescale_sumexp(float* sumexp, const float* shard_max, const float* row_max,
                           int n) override;
  void xent_forward(float* loss, float* row_max, float* sumexp, float* target_logit,
                    const float* logits, const std::int32_t* targets, int n, int ld, int v_valid,
                    int vocab_start) override;

  void add_loss(const float* loss, int n) override;
  double take_loss() override;
  // The head under bf16 with bf16 logits and the fused classifier (lm_head.cpp); otherwise
  // Ops::lm_head's composition.
  void lm_head(float* loss, float* dlnf, float* dwte, float* logits, float* row_max,
               float* stats, const float* lnf, const float* wte, const std::int32_t* targets,
               int n, int c, int v, int v_valid, float loss_scale, bool with_backward,
               int vocab_start, HeadCollectives* tp) override;
  bool fused_lm_head() const override;

  // The coarse GPT-2 block (fused_block.cpp): with a bf16 stash (Gpt2BlockStash::bf16), bf16
  // activations end to end inside the block; otherwise Ops' composition.
  bool gpt2_block_stash_bf16() const override;
  bool cp_attention_bf16() const override { return gpt2_block_stash_bf16() && cp_bf16_; }
  void gpt2_block_forward(const Gpt2BlockShape& s, const Gpt2BlockParams& p, const float* x,
                          float* out, const Gpt2BlockStash& la) override;
  // With a W stash (the split backward's B) the bf16 output gradients of c_fc and c_attn go
  // there (bf16; the biases' gradients are taken here), and gpt2_block_backward_weights adds
  // the two weight gradients from them.
  void gpt2_block_backward(const Gpt2BlockShape& s, const Gpt2BlockParams& p,
                           const Gpt2BlockParams& g, const float* x, float* dres,
                           const Gpt2BlockStash& la, const Gpt2BlockScratch& scratch,
                           const BlockWStash* w = nullptr) override;
  void gpt2_block_backward_weights(const Gpt2BlockShape& s, const Gpt2BlockParams& p,
                                   const Gpt2BlockParams& g, const Gpt2BlockStash& la,
                                   const BlockWStash& w) override;
  // Selective recompute on the bf16 stash: attention_forward_bf16 and the GELU kernel, the
  // calls gpt2_block_forward makes for a stash marked recomputed (no GELU epilogue there).
  void gpt2_block_recompute(const Gpt2BlockShape& s, const Gpt2BlockStash& la) override;
  // The coarse Llama block, the same way (fused_block.cpp): RMSNorms write bf16, RoPE and
  // SwiGLU on bf16, grouped-query attention_forward_bf16, o and down add the residual; TP and
  // SP as GPT-2's (kv heads split or replicated).
  void llama_block_forward(const LlamaBlockShape& s, const LlamaBlockParams& p, const float* x,
                           float* out, const LlamaBlockStash& la) override;
  void llama_block_backward(const LlamaBlockShape& s, const LlamaBlockParams& p,
                            const LlamaBlockParams& g, const float* x, float* dres,
                            const LlamaBlockStash& la, const Gpt2BlockScratch& scratch,
                            const BlockWStash* w = nullptr) override;
  void llama_block_backward_weights(const LlamaBlockShape& s, const LlamaBlockParams& p,
                                    const LlamaBlockParams& g, const LlamaBlockStash& la,
                                    const BlockWStash& w) override;
  // Selective recompute on the bf16 stash: attention_forward_bf16 and the SwiGLU kernel, the
  // calls llama_block_forward makes.
  void llama_block_recompute(const LlamaBlockShape& s, const LlamaBlockStash& la) override;

  void adamw(float* p, const float* g, float* m, float* v, std::int64_t n, float lr, float beta1,
             float beta2, float eps, float weight_decay, float bc1, float bc2) override;
  // The optimizer step over many tensors (cuda_ops.cpp): two launches, one copy back and one
  // synchronization for all the spans' sums; one launch for every segment's AdamW update, the
  // clip's scale inside, writing the weight cache's copy of each segment in set_weights' range
  // (so the update leaves the cache as fresh as it found it). Ops' loops under the baseline.
  void sum_squares_spans(const std::vector<Span>& spans, double* sums) override;
  void adamw_segments(const std::vector<AdamWSegment>& segments, float grad_scale, float lr,
                      float beta1, float beta2, float eps, float weight_decay, float bc1,
                      float bc2) override;

 private:
  void setup(std::size_t arena_bytes, int ranks_per_device);  // the constructor's work
  void release() noexcept;   // the destructor's, also after a failed setup()
  // The scratch block, emptied, with at least `bytes` (sum of aligned_bytes of the blocks the
  // caller will take). Grows (after waiting for the stream) only when too small.
  BumpBlock& scratch(std::size_t bytes);
  // Row-major C[m,n] = alpha op(A) op(B) + beta C in the object's precision.
  void gemm_rm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc);
  // Row-major C[m,n] = alpha op(A) op(B) + beta C on packed bf16 operands (lda, ldb: their
  // leading dimensions), fp32 C and accumulation.
  void gemm_rm16(bool ta, bool tb, int m, int n, int k, float alpha, const void* a16, int lda,
                 const void* b16, int ldb, float beta, float* c, int ldc);
  // d[N,out] (bf16 when d16, else fp32) = x16 @ w16 (w16^T when w_t: w16 is [out, in]) + bias
  // (none when null) (+ residual[N,out], fp32, when not null: cuBLASLt's C with beta = 1)
  // through cuBLASLt with the bias in the epilogue (one write of d, no bias pass before the
  // product); plans per shape, flags and alignments in lt_plans_ (bf16 D: bit 58 of the
  // alignments word, above the four 9-bit alignments; w_t bit 59, no bias bit 60; the GELU
  // epilogue and aux's alignment in the key's fifth word). False when cuBLASLt declines the
  // problem (the caller then falls back: the bias rows and a product with beta = 1).
  // gelu (the fused GPT-2 block's MLP; bf16 D, no residual; matmul.cpp cites the contracts):
  //   forward   CUBLASLT_EPILOGUE_GELU_AUX_BIAS: d = gelu(x16 @ w16 + bias) and aux[N,out] =
  //             the pre-GELU value (bf16, leading dimension out);
  //   backward  CUBLASLT_EPILOGUE_DGELU_BGRAD: d = (x16 @ w16) * gelu'(aux) with aux the
  //             forward's pre-GELU value, and bias_grad[out] (fp32, no bias) = d's column sums,
  //             written (the caller adds it to the accumulated gradient);
  //   backward_bgrad16  the same with bias_grad bf16 (D's type, cuBLASLt's default), for a
  //             cuBLASLt that refuses an fp32 bias gradient with bf16 D.
  // bias16: the (forward) bias is bf16, D's type (cuBLASLt's default; cublasLt.h documents the
  //   bias as D's type): the weight cache's copy, for a cuBLASLt that refuses an fp32 bias
  //   with bf16 D.
  enum class LtGelu { none, forward, backward, backward_bgrad16 };
  bool bias_lt(void* d, bool d16, const float* residual, const void* x16, const void* w16,
               bool w_t, const void* bias, int n, int in, int out,
               LtGelu gelu = LtGelu::none, const void* aux = nullptr,
               void* bias_grad = nullptr, bool bias16 = false);
  // The bf16 copy of the stored matrix [rows, cols] (leading dimension ld) at p, from the
  // weight cache when it lies in set_weights' range (converting the whole range first when
  // the weights changed since the last conversion); nullptr when it does not (the caller
  // converts it into scratch). The copy's leading dimension is ld.
  const void* cached_bf16(const float* p, std::int64_t rows, std::int64_t cols, std::int64_t ld);
  // An op of this backend is about to write [p, p + n): the cache is stale if that overlaps.
  void note_write(const void* p, std::int64_t bytes) {
    if (weights16_ && static_cast<const char*>(p) < weights_end_ &&
        static_cast<const char*>(p) + bytes > reinterpret_cast<const char*>(weights_))
      weights16_fresh_ = false;
  }
  // linear_backward under bf16 products (matmul.cpp says how the operands are converted).
  void linear_backward_bf16(float* dx, float* dw, float* db, const float* dy, const float* x,
                            const float* w, int n, int in, int out);
  // Attention through cuDNN's fused flash attention (cudnn_attention.cpp): true when it ran,
  // false when this call is not one cuDNN takes or cuDNN is unavailable (the caller then
  // runs flash_attention.cu's kernel). Timed as "attention_forward cudnn" / "... backward".
  bool attention_cudnn_forward(float* out, float* lse, const float* q, const float* k,
                               const float* v, const AttentionShape& s);
  bool attention_cudnn_backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* lse, const float* q,
                                const float* k, const float* v, const AttentionShape& s);
  // `batch` row-major products, operand i at a + i*sa, b + i*sb, c + i*sc.
  void gemm_batched_rm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
                       int lda, std::int64_t sa, const float* b, int ldb, std::int64_t sb,
                       float beta, float* c, int ldc, std::int64_t sc, int batch);

  Precision precision_;
  int device_ = 0;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<CudaMemory> memory_;  // the one arena
  BumpBlock scratch_;                   // a block of the arena
  void* cublas_workspace_ = nullptr;    // in the arena
  double* sum_partial_ = nullptr;       // in the arena: sum_squares_blocks() doubles
  double* sum_result_ = nullptr;        // in the arena
  double* loss_total_ = nullptr;        // in the arena: add_loss's total, zeroed by take_loss
  double* host_result_ = nullptr;       // pinned host memory, one double
  // The optimizer step's tables in device memory (kernels.hpp: SumSquaresSpan,
  // AdamWSegmentEntry), uploaded again only when they change (the first step); and the pinned
  // host copy of the spans' sums.
  struct DeviceTable {
    void* device = nullptr;  // in the arena
    std::size_t capacity = 0;
    std::vector<unsigned char> host;  // what `device` holds
  };
  const void* device_table(DeviceTable& t, const void* data, std::size_t bytes);
  DeviceTable sum_spans_table_, adamw_table_;
  double* host_sums_ = nullptr;  // pinned, host_sums_capacity_ doubles
  std::size_t host_sums_capacity_ = 0;
  std::unique_ptr<OpTimer> timer_;      // per-op timing (TRIDENT_OP_TIMING), null when off
  // TRIDENT_CUDA_BASELINE=1: the paths before issue 27 (three-pass classifier, per-product
  // conversions and the GEMV bias gradient in linear_backward), for before/after timings.
  bool baseline_ = false;
  // TRIDENT_CUDA_ATTENTION ("tc", "scalar", or empty when unset): tc_attention() reads it.
  std::string attention_kernel_;
  // Whether attention_forward/backward of shape s run the tensor-core kernels
  // (flash_attention_tc.cu) rather than the scalar fp32 ones (flash_attention.cu); matmul.cpp.
  bool tc_attention(const FlashShape& s) const;
  // The weight cache (bf16 products): a bf16 copy of set_weights' range, in the arena, made
  // at the first product after the weights changed (an op's or copy's write into the range,
  // weights_changed(): the optimizer's step). TRIDENT_CUDA_WEIGHT_CACHE=0 or the baseline
  // turn it off (each product converts its weight operand, as before).
  const float* weights_ = nullptr;
  const char* weights_end_ = nullptr;
  std::uint16_t* weights16_ = nullptr;
  bool weights16_fresh_ = false;
  bool weight_cache_ = true;
  // cuBLASLt (the bias epilogue): a plan per shape and pointer alignments, made at first use.
  struct LtPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;  // cuBLASLt offered an algorithm and has not refused one since
  };
  cublasLtHandle_t lt_ = nullptr;
  // cuDNN attention (bf16 products, not the baseline; null otherwise): loads cuDNN at the
  // first attention call.
  std::unique_ptr<CudnnAttention> cudnn_;
  // Graphs: each instantiated with the arena blocks live at its capture (its pointers lie
  // in them), checked before a launch when anything was released since.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    std::vector<ArenaAllocator::Block> blocks;
    std::uint64_t releases = 0;  // the arena's releases() at capture
  };
  std::vector<Graph> graphs_;
  std::uint64_t allocations_at_capture_ = 0;
  // {n, in, out, alignments, GELU epilogue | aux alignment << 8}
  std::map<std::array<std::int64_t, 5>, LtPlan> lt_plans_;
  // TRIDENT_CUDA_LT_TUNE (lt_tune.hpp; null when off and under the baseline): a new plan's
  // algorithm from the file, else the fastest of the heuristic's `found` candidates, timed on
  // the call's operands (matmul.cpp: lt_choose; beta != 0 times into a scratch D).
  std::unique_ptr<LtTuner> lt_tune_;
  int lt_heuristic(LtPlan& plan, std::int64_t align_a, std::int64_t align_b,
                   std::int64_t align_cd, cublasLtMatmulHeuristicResult_t* results);
  void lt_choose(const std::array<std::int64_t, 5>& key, LtPlan& plan, bool d16,
                 const cublasLtMatmulHeuristicResult_t* results, int found, const void* x16,
                 const void* w16, float alpha, float beta, const void* c, void* d,
                 std::size_t d_bytes);
  // Under TRIDENT_CUDA_LT_TUNE, gemm_rm16's products (the bf16 products without a bias) and,
  // with d16 (bf16 c, beta 0), gemm_rm16_to16's through tuned cuBLASLt plans too (column-major
  // g, P1 = b16, P2 = a16 as cublasGemmEx takes them); false when cuBLASLt declines
  // (cublasGemmEx then). Off: cublasGemmEx, as before.
  bool gemm_lt16(const ColMajor& g, float alpha, const void* p1, const void* p2,
                 float beta, void* c, bool d16, int ldc);
  friend struct LtTuneAccess;  // lt_tune_access.hpp: the GPU op test, emulate/lt_tune.cpp

  // A TRIDENT_CUDA_* switch of a fast path: on unless the variable is "0" (tests and
  // benchmarks turn paths off to compare against them).
  static bool on_unless_zero(const char* variable);
  // ---- the fused GPT-2 block (fused_block.cpp) ----------------------------------------------
  // TRIDENT_CUDA_FUSED_BLOCK=0 turns it off (the composition on fp32 activations, as before).
  bool fused_block_ = on_unless_zero("TRIDENT_CUDA_FUSED_BLOCK");
  // d[N,out] (bf16 when d16, else fp32) = x16 @ bf16(w) + bias (+ residual[N,out] fp32 when not
  // null): bias_lt, else (cuBLASLt declined) the product in fp32 scratch, then bias, residual,
  // bf16. w_t: w is [out, in] (Llama's: x @ w^T); a null bias: no bias.
  void block_linear(void* d, bool d16, const float* residual, const void* x16, const float* w,
                    const float* bias, int n, int in, int out, bool w_t = false);
  // The bf16 copy of weight w[rows, cols]: the weight cache's, else converted into scratch.
  const void* block_weight16(const float* w, int rows, int cols);
  // cuBLASLt's GELU epilogues in the GPT-2 block's MLP (bias_lt's LtGelu): on unless
  // TRIDENT_CUDA_GELU_EPILOGUE=0, and only inside the fused block (so off under the baseline
  // and TRIDENT_CUDA_FUSED_BLOCK=0). A shape cuBLASLt refuses runs the GELU kernels, said
  // once per direction on stderr (and once when only the fp32 bias gradient is refused).
  bool gelu_epilogue_ = on_unless_zero("TRIDENT_CUDA_GELU_EPILOGUE");
  // What cuBLASLt refused of the block's plans, each said once on stderr.
  enum class LtRefusal { gelu_forward, gelu_backward, fp32_bias_grad, fp32_bias, count };
  bool lt_refusal_told_[int(LtRefusal::count)] = {};
  void say_lt_refusal(LtRefusal what, int n, int in, int out);
  // bias_lt with bias16 on the weight cache's bf16 copy of bias, where cuBLASLt refused the
  // fp32 bias with bf16 D (said once on stderr); false when it refuses that too, or the bias
  // is not in the cache (its scratch copy could overwrite a weight converted there).
  bool bias_lt_bf16_bias(void* d, const void* x16, const void* w16, bool w_t, const float* bias,
                         int n, int in, int out, LtGelu gelu = LtGelu::none,
                         const void* aux = nullptr);
  // Row-major C16[m,n] = op(A16) op(B16) with bf16 C (fp32 accumulation); under
  // TRIDENT_CUDA_LT_TUNE through gemm_lt16's tuned plans (bf16 D).
  void gemm_rm16_to16(bool ta, bool tb, int m, int n, int k, const void* a16, int lda,
                      const void* b16, int ldb, void* c16, int ldc);

  // ---- attention on bf16 activations (attention_bf16.cpp; the fused GPT-2 block's) -------
  // attention_forward/backward with bf16 q, k, v, dout, out (std::uint16_t storage, round to
  // nearest even) and bf16 out, dq, dk, dv; lse fp32 [B, NH, T]; strides of s in elements
  // (GPT's fused qkv [B, T, 3C]: q = qkv, k = qkv + C, v = qkv + 2C, ld 3C; out ld C).
  // Gradients are written, never accumulated (s.accumulate is refused). Each call takes the
  // first path that accepts it: cuDNN on the caller's tensors (bf16 products, causal, nkv ==
  // nh, hs % 8 == 0 up to 128, packed sequences, strides % 8, 16-byte aligned), trident's
  // tensor-core kernels reading and writing bf16 (tc_attention: hs % 16 == 0), else the
  // fp32 kernels between a widening and a narrowing pass (fp32/tf32, other head sizes,
  // TRIDENT_CUDA_BASELINE). Timed as "attention_forward bf16 cudnn|tc|widened" (backward
  // alike). Friend AttentionBf16Access (attention_bf16_access.hpp): the GPU op test, the bench
  // and the stand-in check reach them.
  void attention_forward_bf16(std::uint16_t* out, float* lse, const std::uint16_t* q,
                              const std::uint16_t* k, const std::uint16_t* v,
                              const AttentionShape& s) override;
  void attention_backward_bf16(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                               const std::uint16_t* dout, const std::uint16_t* out,
                               const float* lse, const std::uint16_t* q, const std::uint16_t* k,
                               const std::uint16_t* v, const AttentionShape& s) override;
  friend struct AttentionBf16Access;
  // The bf16 blocks' attention core (fused_block.cpp: GPT-2's and Llama's forward, recompute
  // and backward) on the [q k v] rows qkv (q at column 0, k at k0, v at v0; att's strides):
  // attention_forward_bf16 / attention_backward_bf16, or under context parallelism (hook: the
  // shape's BlockAttention, the ring or Ulysses) the hook on fp32 copies in hook_block_ (the
  // bf16 rows widened, its fp32 results narrowed to the bf16 the products read). The
  // backward writes every column of dqkv (zero where no head of this rank reads: replicated
  // kv heads).
  void block_attention_forward(BlockAttention* hook, const AttentionShape& att, std::int64_t k0,
                               std::int64_t v0, std::uint16_t* atty, float* lse,
                               const std::uint16_t* qkv);
  void block_attention_backward(BlockAttention* hook, const AttentionShape& att,
                                std::int64_t k0, std::int64_t v0, std::uint16_t* dqkv,
                                const std::uint16_t* datty, const std::uint16_t* atty,
                                const float* lse, const std::uint16_t* qkv);
  // The hook is told its operands are bf16-exact and its results rounded to bf16 here
  // (BlockAttention's bf16_exact: the ring and Ulysses then send bf16 where that is exact);
  // TRIDENT_CUDA_CP_BF16_WIRE=0 tells it not (fp32 on the wire, the same results).
  bool cp_wire_bf16_ = on_unless_zero("TRIDENT_CUDA_CP_BF16_WIRE");
  // A hook that takes bf16 (BlockAttention::takes_bf16: the model's ring and Ulysses) is
  // called on the bf16 rows themselves, no fp32 copies (cp_attention_bf16);
  // TRIDENT_CUDA_CP_BF16=0: on the fp32 copies as before (comparison).
  bool cp_bf16_ = on_unless_zero("TRIDENT_CUDA_CP_BF16");
  // The hook's fp32 copies: qkv and dqkv [N, ld_q], atty and datty [N, ld_o] (the backward's;
  // the forward takes the first and the third), in a block of the arena of exactly that size,
  // made at the first call (the scratch block cannot hold them: the hook's own ops empty it).
  // model::predict_memory counts the same bytes.
  BumpBlock& hook_scratch(const AttentionShape& att);
  BumpBlock hook_block_;

  // TRIDENT_CUDA_FUSED_HEAD=0 turns the fused LM head off (lm_head.cpp; off under the
  // baseline too): the head then runs Ops::lm_head's composition.
  bool fused_head_ = true;
};

}  // namespace trident::ops::cuda
