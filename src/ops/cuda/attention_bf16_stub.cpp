// ops/cuda/attention_bf16_stub.cpp — TEMPORARY stand-in for attention_bf16.cpp (the helper
// "attbf16": cuDNN and the tensor-core kernels on bf16 directly), so that the fused block
// (fused_block.cpp) builds and runs before it merges; the lead deletes this file then. Each
// sequence in turn: the rows its q, k, v (and out, dout, dq, dk, dv) span widened to fp32 in
// scratch (strides kept), the fp32 attention_forward / attention_backward, the results narrowed
// back to bf16. Slow (extra passes). The fp32 kernels are launched directly (flash_attention
// or its tensor-core form, as attention_forward picks them), not through attention_forward:
// its cuDNN path takes the same scratch block.
// defines: CudaOps::attention_forward_bf16, CudaOps::attention_backward_bf16 (stub)
#include <algorithm>

#include "check.hpp"
#include "cuda_ops.hpp"
#include "kernels.hpp"
#include "trident/core/error.hpp"

namespace trident::ops::cuda {

namespace {

// The elements [lo, hi) of one sequence's rows of the tensors at ptrs (each t rows of stride
// ld, the last row `width` long): one span covering them all (q, k, v of a fused qkv share
// one).
struct Span {
  const std::uint16_t* lo = nullptr;
  std::int64_t n = 0;
  void cover(const std::uint16_t* p, int t, std::int64_t ld, std::int64_t width) {
    const std::uint16_t* hi = p + std::int64_t(t - 1) * ld + width;
    const std::uint16_t* old_hi = lo ? lo + n : hi;
    lo = lo ? std::min(lo, p) : p;
    n = std::max(old_hi, hi) - lo;
  }
};

FlashShape one_sequence(const Ops::AttentionShape& s) {
  TRIDENT_CHECK(s.hs > 0 && s.hs <= kFlashMaxHeadSize && s.nh % s.nkv == 0,
                "attention_bf16 (stub): bad shape");
  return FlashShape{1,        s.t,      s.nh,        s.nkv,       s.hs,        s.ld_q,
                    s.ld_k,   s.ld_v,   s.ld_o,      s.batch_q(), s.batch_k(), s.batch_v(),
                    s.batch_o(), s.lse_row(), s.causal, false};
}

}  // namespace

void CudaOps::attention_forward_bf16(std::uint16_t* out, float* lse, const std::uint16_t* q,
                                     const std::uint16_t* k, const std::uint16_t* v,
                                     const AttentionShape& s) {
  const std::int64_t wq = std::int64_t(s.nh) * s.hs, wkv = std::int64_t(s.nkv) * s.hs;
  const FlashShape one = one_sequence(s);
  OpScope timed(timer_.get(), "attention_bf16 stub");
  for (int b = 0; b < s.b; ++b) {
    const std::uint16_t *qb = q + b * s.batch_q(), *kb = k + b * s.batch_k(),
                        *vb = v + b * s.batch_v();
    std::uint16_t* ob = out + b * s.batch_o();
    Span in, o;
    in.cover(qb, s.t, s.ld_q, wq), in.cover(kb, s.t, s.ld_k, wkv), in.cover(vb, s.t, s.ld_v, wkv);
    o.cover(ob, s.t, s.ld_o, wq);
    BumpBlock& block =
        scratch(aligned_bytes(std::size_t(in.n) * 4) + aligned_bytes(std::size_t(o.n) * 4));
    float* in32 = block.alloc_n<float>(std::size_t(in.n));
    float* o32 = block.alloc_n<float>(std::size_t(o.n));
    launch_from_bf16(stream_, in32, in.lo, in.n);
    launch_from_bf16(stream_, o32, o.lo, o.n);  // keeps what lies between the rows
    float* lseb = lse + b * s.nh * s.lse_row();
    if (tc_attention(one))
      launch_flash_attention_tc_forward(stream_, o32 + (ob - o.lo), lseb, in32 + (qb - in.lo),
                                        in32 + (kb - in.lo), in32 + (vb - in.lo), one);
    else
      launch_flash_attention_forward(stream_, o32 + (ob - o.lo), lseb, in32 + (qb - in.lo),
                                     in32 + (kb - in.lo), in32 + (vb - in.lo), one);
    launch_to_bf16(stream_, const_cast<std::uint16_t*>(o.lo), o32, 1, o.n, o.n);
  }
}

void CudaOps::attention_backward_bf16(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                                      const std::uint16_t* dout, const std::uint16_t* out,
                                      const float* lse, const std::uint16_t* q,
                                      const std::uint16_t* k, const std::uint16_t* v,
                                      const AttentionShape& s) {
  TRIDENT_CHECK(!s.accumulate, "attention_backward_bf16 writes its gradients");
  const std::int64_t wq = std::int64_t(s.nh) * s.hs, wkv = std::int64_t(s.nkv) * s.hs;
  const FlashShape one = one_sequence(s);
  OpScope timed(timer_.get(), "attention_bf16 stub");
  for (int b = 0; b < s.b; ++b) {
    const std::uint16_t *qb = q + b * s.batch_q(), *kb = k + b * s.batch_k(),
                        *vb = v + b * s.batch_v(), *ob = out + b * s.batch_o(),
                        *dob = dout + b * s.batch_o();
    std::uint16_t *dqb = dq + b * s.batch_q(), *dkb = dk + b * s.batch_k(),
                  *dvb = dv + b * s.batch_v();
    Span in, o, d_o, g;
    in.cover(qb, s.t, s.ld_q, wq), in.cover(kb, s.t, s.ld_k, wkv), in.cover(vb, s.t, s.ld_v, wkv);
    o.cover(ob, s.t, s.ld_o, wq);
    d_o.cover(dob, s.t, s.ld_o, wq);
    g.cover(dqb, s.t, s.ld_q, wq), g.cover(dkb, s.t, s.ld_k, wkv), g.cover(dvb, s.t, s.ld_v, wkv);
    BumpBlock& block = scratch(aligned_bytes(std::size_t(in.n) * 4) +
                               aligned_bytes(std::size_t(o.n) * 4) +
                               aligned_bytes(std::size_t(d_o.n) * 4) +
                               aligned_bytes(std::size_t(g.n) * 4));
    float* in32 = block.alloc_n<float>(std::size_t(in.n));
    float* o32 = block.alloc_n<float>(std::size_t(o.n));
    float* do32 = block.alloc_n<float>(std::size_t(d_o.n));
    float* g32 = block.alloc_n<float>(std::size_t(g.n));
    launch_from_bf16(stream_, in32, in.lo, in.n);
    launch_from_bf16(stream_, o32, o.lo, o.n);
    launch_from_bf16(stream_, do32, d_o.lo, d_o.n);
    launch_from_bf16(stream_, g32, g.lo, g.n);  // keeps what lies between the gradients' rows
    const float* lseb = lse + b * s.nh * s.lse_row();
    if (tc_attention(one))
      launch_flash_attention_tc_backward(stream_, g32 + (dqb - g.lo), g32 + (dkb - g.lo),
                                         g32 + (dvb - g.lo), do32 + (dob - d_o.lo),
                                         o32 + (ob - o.lo), lseb, in32 + (qb - in.lo),
                                         in32 + (kb - in.lo), in32 + (vb - in.lo), one);
    else
      launch_flash_attention_backward(stream_, g32 + (dqb - g.lo), g32 + (dkb - g.lo),
                                      g32 + (dvb - g.lo), do32 + (dob - d_o.lo),
                                      o32 + (ob - o.lo), lseb, in32 + (qb - in.lo),
                                      in32 + (kb - in.lo), in32 + (vb - in.lo), one);
    launch_to_bf16(stream_, const_cast<std::uint16_t*>(g.lo), g32, 1, g.n, g.n);
  }
}

}  // namespace trident::ops::cuda
