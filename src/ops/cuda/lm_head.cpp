// ops/cuda/lm_head.cpp — CudaOps::lm_head: under bf16 products (not TRIDENT_CUDA_BASELINE,
// not TRIDENT_CUDA_FUSED_HEAD=0) the head with bf16 logits (fused_head.cpp); otherwise the
// composition of Ops::lm_head (fp32 logits, the one-pass forward, the backward in place and
// two products that each convert the logits to bf16). At any TP: a vocabulary shard's
// classifier runs in two passes around the collectives (fused_head.hpp).
// Bytes moved per logit (N x V): the composition writes fp32 logits (4), reads them for the
// forward (4), reads and writes them for the backward (8), and each backward product converts
// them (read 4, write 2, read 2: 16): 32. Fused: the product writes bf16 (2), the classifier
// reads (2), reads again from L2 at best (2) and writes dlogits (2), the two products read
// them (4): 12. The logits live in the model's logits buffer (GptChunk sizes it for bf16
// when fused_lm_head()).
// defines: CudaOps::lm_head, CudaOps::fused_lm_head
#include "cuda_ops.hpp"
#include "fused_head.hpp"
#include "kernels.hpp"

namespace trident::ops::cuda {

bool CudaOps::fused_lm_head() const {
  return precision_ == Precision::bf16 && !baseline_ && fused_head_;
}

void CudaOps::lm_head(float* loss, float* dlnf, float* dwte, float* logits, float* row_max,
                      float* stats, const float* lnf, const float* wte,
                      const std::int32_t* targets, int n, int c, int v, int v_valid,
                      float loss_scale, bool with_backward, int vocab_start,
                      HeadCollectives* tp) {
  if (!fused_lm_head() || n <= 0 || c <= 0 || v <= 0) {
    Ops::lm_head(loss, dlnf, dwte, logits, row_max, stats, lnf, wte, targets, n, c, v, v_valid,
                 loss_scale, with_backward, vocab_start, tp);
    return;
  }
  // Scratch: lnf in bf16 (the head's largest conversion now: N x C), and wte unless the weight
  // cache holds it (TRIDENT_CUDA_WEIGHT_CACHE=0).
  const void* wte16 = cached_bf16(wte, v, c, c);
  const std::size_t lnf_bytes = std::size_t(n) * std::size_t(c) * 2;
  const std::size_t wte_bytes = wte16 ? 0 : std::size_t(v) * std::size_t(c) * 2;
  BumpBlock& s = scratch(aligned_bytes(lnf_bytes) + aligned_bytes(wte_bytes));
  void* lnf16 = s.alloc(lnf_bytes);
  {
    OpScope timed(timer_.get(), "lm_head to_bf16");
    launch_to_bf16(stream_, lnf16, lnf, n, c, c);
    if (!wte16) {
      void* packed = s.alloc(wte_bytes);
      launch_to_bf16(stream_, packed, wte, v, c, c);
      wte16 = packed;
    }
  }
  // TP: this rank's vocabulary rows, the row statistics combined between the two passes
  const HeadShard shard{vocab_start, row_max, stats, tp};
  fused_head(cublas_, stream_, timer_.get(), loss, dlnf, dwte, logits, lnf16, wte16, targets, n,
             c, v, v_valid, loss_scale, with_backward, tp ? &shard : nullptr);
  add_loss(loss, n);  // on the device (CudaOps::add_loss), read once a step
}

}  // namespace trident::ops::cuda
