// ops/cuda/attention_bf16.cpp — attention on bf16 activations (CudaOps::attention_forward_bf16,
// attention_backward_bf16; cuda_ops.hpp states the contract): q, k, v, dout, out read as bf16
// and out, dq, dk, dv written as bf16 where they lie (GPT's fused qkv: ld 3C), without
// conversion passes on the two tensor-core paths. The first path that accepts a call runs:
//   1. cuDNN's fused flash attention on the caller's tensors (CudnnAttention::forward_bf16:
//      the graphs declare the caller's row strides; under bf16 products, not the baseline);
//   2. trident's tensor-core kernels instantiated on bf16 storage (flash_attention_tc.cu,
//      where tc_attention says the fp32 entry points would run them: the same products,
//      since those round their fp32 inputs to bf16 as they stage them);
//   3. otherwise (fp32/tf32 products, head sizes the tensor-core kernels lack, the
//      baseline): q, k, v (dout, out) widened into packed fp32 scratch, the kernels that
//      attention_forward/backward run there (flash_attention.cu's: the tensor-core ones would
//      have taken the call at 2; not cuDNN, whose call would take the op scratch the widened
//      copies live in), the results narrowed into the bf16 outputs.
// Each path's time is its own row of the per-op table: "attention_forward bf16 cudnn|tc|
// widened" (and backward), under the "attention" group of bench/gpu_op_table.py.
// defines: CudaOps::attention_forward_bf16, CudaOps::attention_backward_bf16
#include <cstdint>

#include "check.hpp"
#include "cuda_ops.hpp"
#include "kernels.hpp"
#include "trident/core/error.hpp"

namespace trident::ops::cuda {

namespace {

// The shape's checks (matmul.cpp's flash_shape, plus the bf16 entry points' own) and its
// FlashShape with the batch strides resolved.
FlashShape bf16_flash_shape(const Ops::AttentionShape& s, const char* op) {
  TRIDENT_CHECK(!s.accumulate, op, ": gradients are written, not accumulated (the bf16 "
                "entry points refuse AttentionShape::accumulate)");
  TRIDENT_CHECK(s.hs > 0 && s.nh > 0 && s.nkv > 0 && s.nh % s.nkv == 0, op,
                ": bad shape (nh ", s.nh, ", nkv ", s.nkv, ", hs ", s.hs,
                "): nh must be a multiple of nkv");
  TRIDENT_CHECK(s.hs <= kFlashMaxHeadSize, op, ": head size ", s.hs,
                " is above the CUDA kernel's limit of ", kFlashMaxHeadSize);
  return FlashShape{s.b,         s.t,         s.nh,        s.nkv,       s.hs,
                    s.ld_q,      s.ld_k,      s.ld_v,      s.ld_o,      s.batch_q(),
                    s.batch_k(), s.batch_v(), s.batch_o(), s.lse_row(), s.causal,
                    false};
}

// The widened copies' shape: q, out [B*T, NH*hs] and k, v [B*T, NKV*hs], packed; lse as the
// caller's.
FlashShape packed_fp32(const FlashShape& f) {
  FlashShape p = f;
  p.ld_q = p.ld_o = std::int64_t(f.nh) * f.hs;
  p.ld_k = p.ld_v = std::int64_t(f.nkv) * f.hs;
  p.bs_q = p.bs_o = f.t * p.ld_q;
  p.bs_k = p.bs_v = f.t * p.ld_k;
  return p;
}

}  // namespace

void CudaOps::attention_forward_bf16(std::uint16_t* out, float* lse, const std::uint16_t* q,
                                     const std::uint16_t* k, const std::uint16_t* v,
                                     const AttentionShape& s) {
  const FlashShape fs = bf16_flash_shape(s, "attention_forward_bf16");
  if (s.b <= 0 || s.t <= 0) return;
  if (cudnn_ && !CudnnAttention::decline_bf16(s, {out, q, k, v, lse}) && cudnn_->available()) {
    const std::int64_t bytes = cudnn_->prepare(s, false, true);
    if (bytes >= 0) {
      OpScope timed(timer_.get(), "attention_forward bf16 cudnn");
      if (cudnn_->forward_bf16(scratch(std::size_t(bytes)), out, lse, q, k, v, s)) return;
    }
  }
  if (tc_attention(fs)) {
    OpScope timed(timer_.get(), "attention_forward bf16 tc");
    launch_flash_attention_tc_forward_bf16(stream_, out, lse, q, k, v, fs);
    return;
  }
  OpScope timed(timer_.get(), "attention_forward bf16 widened");
  const FlashShape p = packed_fp32(fs);
  const std::int64_t rows = std::int64_t(s.b) * s.t;
  const std::size_t qo = std::size_t(rows * p.ld_q), kv = std::size_t(rows * p.ld_k);
  BumpBlock& block = scratch(2 * aligned_bytes(qo * 4) + 2 * aligned_bytes(kv * 4));
  float* q32 = block.alloc_n<float>(qo);
  float* k32 = block.alloc_n<float>(kv);
  float* v32 = block.alloc_n<float>(kv);
  float* o32 = block.alloc_n<float>(qo);
  launch_bf16_rows_to_float(stream_, q32, p.ld_q, p.bs_q, q, s.ld_q, fs.bs_q, s.b, s.t, p.ld_q);
  launch_bf16_rows_to_float(stream_, k32, p.ld_k, p.bs_k, k, s.ld_k, fs.bs_k, s.b, s.t, p.ld_k);
  launch_bf16_rows_to_float(stream_, v32, p.ld_v, p.bs_v, v, s.ld_v, fs.bs_v, s.b, s.t, p.ld_v);
  launch_flash_attention_forward(stream_, o32, lse, q32, k32, v32, p);
  launch_float_rows_to_bf16(stream_, out, s.ld_o, fs.bs_o, o32, p.ld_o, p.bs_o, s.b, s.t, p.ld_o);
}

void CudaOps::attention_backward_bf16(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                                      const std::uint16_t* dout, const std::uint16_t* out,
                                      const float* lse, const std::uint16_t* q,
                                      const std::uint16_t* k, const std::uint16_t* v,
                                      const AttentionShape& s) {
  const FlashShape fs = bf16_flash_shape(s, "attention_backward_bf16");
  if (s.b <= 0 || s.t <= 0) return;
  if (cudnn_ && !CudnnAttention::decline_bf16(s, {dq, dk, dv, dout, out, q, k, v, lse}) &&
      cudnn_->available()) {
    const std::int64_t bytes = cudnn_->prepare(s, true, true);
    if (bytes >= 0) {
      OpScope timed(timer_.get(), "attention_backward bf16 cudnn");
      if (cudnn_->backward_bf16(scratch(std::size_t(bytes)), dq, dk, dv, dout, out, lse, q, k,
                                v, s))
        return;
    }
  }
  if (tc_attention(fs)) {
    OpScope timed(timer_.get(), "attention_backward bf16 tc");
    launch_flash_attention_tc_backward_bf16(stream_, dq, dk, dv, dout, out, lse, q, k, v, fs);
    return;
  }
  OpScope timed(timer_.get(), "attention_backward bf16 widened");
  const FlashShape p = packed_fp32(fs);
  const std::int64_t rows = std::int64_t(s.b) * s.t;
  const std::size_t qo = std::size_t(rows * p.ld_q), kv = std::size_t(rows * p.ld_k);
  // q, dout, out, dq [rows, NH*hs]; k, v, dk, dv [rows, NKV*hs]
  BumpBlock& block = scratch(4 * aligned_bytes(qo * 4) + 4 * aligned_bytes(kv * 4));
  float* q32 = block.alloc_n<float>(qo);
  float* do32 = block.alloc_n<float>(qo);
  float* o32 = block.alloc_n<float>(qo);
  float* dq32 = block.alloc_n<float>(qo);
  float* k32 = block.alloc_n<float>(kv);
  float* v32 = block.alloc_n<float>(kv);
  float* dk32 = block.alloc_n<float>(kv);
  float* dv32 = block.alloc_n<float>(kv);
  launch_bf16_rows_to_float(stream_, q32, p.ld_q, p.bs_q, q, s.ld_q, fs.bs_q, s.b, s.t, p.ld_q);
  launch_bf16_rows_to_float(stream_, k32, p.ld_k, p.bs_k, k, s.ld_k, fs.bs_k, s.b, s.t, p.ld_k);
  launch_bf16_rows_to_float(stream_, v32, p.ld_v, p.bs_v, v, s.ld_v, fs.bs_v, s.b, s.t, p.ld_v);
  launch_bf16_rows_to_float(stream_, do32, p.ld_o, p.bs_o, dout, s.ld_o, fs.bs_o, s.b, s.t,
                            p.ld_o);
  launch_bf16_rows_to_float(stream_, o32, p.ld_o, p.bs_o, out, s.ld_o, fs.bs_o, s.b, s.t, p.ld_o);
  launch_flash_attention_backward(stream_, dq32, dk32, dv32, do32, o32, lse, q32, k32, v32, p);
  launch_float_rows_to_bf16(stream_, dq, s.ld_q, fs.bs_q, dq32, p.ld_q, p.bs_q, s.b, s.t, p.ld_q);
  launch_float_rows_to_bf16(stream_, dk, s.ld_k, fs.bs_k, dk32, p.ld_k, p.bs_k, s.b, s.t, p.ld_k);
  launch_float_rows_to_bf16(stream_, dv, s.ld_v, fs.bs_v, dv32, p.ld_v, p.bs_v, s.b, s.t, p.ld_v);
}

}  // namespace trident::ops::cuda
