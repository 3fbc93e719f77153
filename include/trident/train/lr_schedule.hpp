// trident/train/lr_schedule.hpp — the learning rate of each optimizer step: linear warm-up,
// then cosine decay to min_lr (FORMAT.md, [train] lr, min_lr, warmup_steps, steps).
// defines: trident::train::learning_rate
//
// For optimizer step s = 1..steps, with W = warmup_steps, S = steps:
//   s <= W:  lr * s / W                                       (reaches lr at s = W)
//   s >  W:  min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * p)), p = (s - W) / (S - W)
// so the cosine starts from lr at s = W and reaches min_lr exactly at s = S. With W = 0 the
// cosine's starting point is the (virtual) step 0: step 1 already decays by p = 1/S. Steps
// past S hold min_lr (when W = S there is no decay); step <= 0 (before any update) gives
// 0 with warm-up, lr without.
#pragma once

#include <cmath>

#include "trident/train/config.hpp"

namespace trident::train {

inline double learning_rate(const Config::Train& t, long step) {
  const double s = static_cast<double>(step);
  const double warmup = static_cast<double>(t.warmup_steps);
  const double total = static_cast<double>(t.steps);
  if (step <= 0) return t.warmup_steps > 0 ? 0.0 : t.lr;
  if (step <= t.warmup_steps) return t.warmup_steps > 0 ? t.lr * s / warmup : t.lr;
  if (step >= t.steps) return t.min_lr;
  const double progress = (s - warmup) / (total - warmup);  // in (0, 1)
  const double pi = 3.14159265358979323846;
  return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(pi * progress));
}

}  // namespace trident::train
