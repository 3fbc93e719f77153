// Ops::lm_head's default: the head as the model composed it before the op existed (see
// trident/ops/ops.hpp): one product into fp32 logits, the cross-entropy forward (one pass, or
// the vocabulary-parallel one over the TP group), the loss added to the total, the backward in
// place, the two products. Backends without a fused head (the CPU ones; CUDA outside bf16)
// run exactly these calls.
#include "trident/ops/ops.hpp"

namespace trident::ops {

void Ops::vocab_parallel_xent_forward(float* loss, float* row_max, float* stats,
                                      const float* logits, const std::int32_t* targets, int n,
                                      int ld, int v_valid, int vocab_start,
                                      HeadCollectives* tp) {
  float* sumexp = stats;
  float* target_logit = stats + n;
  if (!tp) {  // nothing to reduce between the passes: the backend's one pass
    xent_forward(loss, row_max, sumexp, target_logit, logits, targets, n, ld, v_valid,
                 vocab_start);
    return;
  }
  // One read of this shard's logits (max, sum of exponentials at that max, target logit); the
  // global max from the shards' maxima, each shard's sum rescaled to it, then the sums.
  float* shard_max = loss;  // loss[n] is written last: it holds the shard's max meanwhile
  xent_shard_stats(shard_max, sumexp, target_logit, logits, targets, n, ld, v_valid,
                   vocab_start);
  copy(row_max, shard_max, n);
  tp->allreduce_max(row_max, n);
  xent_rescale_sumexp(sumexp, shard_max, row_max, n);
  tp->allreduce_sum(stats, 2 * std::int64_t(n));  // both in one call
  xent_loss(loss, row_max, sumexp, target_logit, n);
}

void Ops::lm_head(float* loss, float* dlnf, float* dwte, float* logits, float* row_max,
                  float* stats, const float* lnf, const float* wte, const std::int32_t* targets,
                  int n, int c, int v, int v_valid, float loss_scale, bool with_backward,
                  int vocab_start, HeadCollectives* tp) {
  gemm(false, true, n, v, c, 1.0f, lnf, c, wte, c, 0.0f, logits, v);
  vocab_parallel_xent_forward(loss, row_max, stats, logits, targets, n, v, v_valid, vocab_start,
                              tp);
  add_loss(loss, n);
  if (!with_backward) return;
  xent_backward(logits, row_max, stats, targets, n, v, v_valid, vocab_start, loss_scale);
  gemm(false, false, n, c, v, 1.0f, logits, v, wte, c, 0.0f, dlnf, c);
  gemm(true, false, v, c, n, 1.0f, logits, v, lnf, c, 1.0f, dwte, c);
}

}  // namespace trident::ops
