// Gradient norm, clipping and AdamW (see trident/train/optimizer.hpp).
#include "trident/train/optimizer.hpp"

#include <cmath>

namespace trident::train {

AdamW::AdamW(model::StageModel& chunk, ops::Ops& ops, const Config::Train& settings,
             GradSync& sync)
    : chunk_(chunk), ops_(ops), settings_(settings), sync_(sync),
      m_(std::size_t(sync.shard_numel()), ops.memory()),
      v_(std::size_t(sync.shard_numel()), ops.memory()) {
  ops_.fill(m_.data(), 0.0f, sync.shard_numel());
  ops_.fill(v_.data(), 0.0f, sync.shard_numel());
}

double AdamW::grad_norm(parallel::ParallelState& ps) const {
  const bool tied_elsewhere = !ps.first_stage();  // the first stage counts wte
  const float* g = sync_.grad_base();
  double sum = 0;
  for (const Segment& seg : sync_.segments()) {
    const model::ShardSpec& s = *seg.spec;
    if (s.tp_copy != 0) continue;  // another TP rank counts the same shard
    if (s.tied_across_stages() && tied_elsewhere) continue;
    sum += ops_.sum_squares(g + seg.shard, seg.count);
  }
  ps.tp.allreduce_sum(&sum, 1);
  ps.pp.allreduce_sum(&sum, 1);
  if (sync_.zero()) ps.replicas().allreduce_sum(&sum, 1);  // the shards of DP (× CP)
  return std::sqrt(sum);
}

void AdamW::step(double lr, double grad_norm) {
  float* g = sync_.grad_base();
  if (settings_.grad_clip > 0) {
    const double coef = settings_.grad_clip / (grad_norm + 1e-6);
    if (coef < 1.0)
      for (const Segment& seg : sync_.segments()) ops_.scale(g + seg.shard, float(coef), seg.count);
  }
  ++step_;
  const double bc1 = 1.0 - std::pow(settings_.beta1, double(step_));
  const double bc2 = 1.0 - std::pow(settings_.beta2, double(step_));
  for (const Segment& seg : sync_.segments()) {
    const float wd = seg.spec->weight_decay ? float(settings_.weight_decay) : 0.0f;
    ops_.adamw(chunk_.params() + seg.offset, g + seg.shard, m_.data() + seg.shard,
               v_.data() + seg.shard, seg.count, float(lr), float(settings_.beta1),
               float(settings_.beta2), float(settings_.eps), wd, float(bc1), float(bc2));
  }
  sync_.gather_params();
  ops_.weights_changed();  // the all-gather wrote them outside the backend's ops
}

}  // namespace trident::train
