// Gradient norm, clipping and AdamW (see trident/train/optimizer.hpp).
#include "trident/train/optimizer.hpp"

#include <cmath>

namespace trident::train {

AdamW::AdamW(model::GptChunk& chunk, ops::Ops& ops, const Config::Train& settings)
    : chunk_(chunk), ops_(ops), settings_(settings), m_(chunk.num_params()),
      v_(chunk.num_params()) {
  m_.zero();
  v_.zero();
}

double AdamW::grad_norm(parallel::ParallelState& ps) const {
  const bool tied_elsewhere = !ps.first_stage();  // the first stage counts wte
  double sum = 0;
  for (const auto& s : chunk_.specs()) {
    if (s.tp_replicated() && ps.tp.rank() != 0) continue;
    if (s.name == "wte" && tied_elsewhere) continue;
    sum += ops_.sum_squares(chunk_.grads() + s.offset, s.local_numel());
  }
  ps.tp.allreduce_sum(&sum, 1);
  ps.pp.allreduce_sum(&sum, 1);
  return std::sqrt(sum);
}

void AdamW::step(double lr, double grad_norm) {
  if (settings_.grad_clip > 0) {
    const double coef = settings_.grad_clip / (grad_norm + 1e-6);
    if (coef < 1.0) ops_.scale(chunk_.grads(), float(coef), chunk_.num_params());
  }
  ++step_;
  const double bc1 = 1.0 - std::pow(settings_.beta1, double(step_));
  const double bc2 = 1.0 - std::pow(settings_.beta2, double(step_));
  for (const auto& s : chunk_.specs()) {
    const float wd = s.weight_decay ? float(settings_.weight_decay) : 0.0f;
    ops_.adamw(chunk_.params() + s.offset, chunk_.grads() + s.offset, m_.data() + s.offset,
               v_.data() + s.offset, s.local_numel(), float(lr), float(settings_.beta1),
               float(settings_.beta2), float(settings_.eps), wd, float(bc1), float(bc2));
  }
}

}  // namespace trident::train
