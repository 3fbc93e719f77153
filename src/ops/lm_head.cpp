// Ops::lm_head's default: the head as the model composed it before the op existed (see
// trident/ops/ops.hpp): one product into fp32 logits, the one-pass forward, the loss added to
// the total, the backward in place, the two products. Backends without a fused head (the CPU
// ones; CUDA outside bf16) run exactly these calls.
#include "trident/ops/ops.hpp"

namespace trident::ops {

void Ops::lm_head(float* loss, float* dlnf, float* dwte, float* logits, float* row_max,
                  float* stats, const float* lnf, const float* wte, const std::int32_t* targets,
                  int n, int c, int v, int v_valid, float loss_scale, bool with_backward) {
  gemm(false, true, n, v, c, 1.0f, lnf, c, wte, c, 0.0f, logits, v);
  float* sumexp = stats;
  float* target_logit = stats + n;
  xent_forward(loss, row_max, sumexp, target_logit, logits, targets, n, v, v_valid, 0);
  add_loss(loss, n);
  if (!with_backward) return;
  xent_backward(logits, row_max, sumexp, targets, n, v, v_valid, 0, loss_scale);  // dlogits
  gemm(false, false, n, c, v, 1.0f, logits, v, wte, c, 0.0f, dlnf, c);
  gemm(true, false, v, c, n, 1.0f, logits, v, lnf, c, 1.0f, dwte, c);
}

}  // namespace trident::ops
