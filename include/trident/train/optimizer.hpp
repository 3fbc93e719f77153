// trident/train/optimizer.hpp — the global gradient norm, clipping and AdamW over a
// chunk's flat buffers (moments mirror the parameter buffer's layout).
// defines: trident::train::AdamW
#pragma once

#include <cstdint>

#include "trident/core/buffer.hpp"
#include "trident/model/gpt.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/train/config.hpp"

namespace trident::train {

class AdamW {
 public:
  AdamW(model::GptChunk& chunk, ops::Ops& ops, const Config::Train& settings);

  // Global L2 norm of the gradients, each logical parameter counted once: TP shards summed
  // over tp, replicated tensors counted on TP rank 0 only, stages summed over pp, the tied
  // wte counted on the first stage only. Identical on every rank.
  double grad_norm(parallel::ParallelState& ps) const;

  // Clips to train.grad_clip as torch.nn.utils.clip_grad_norm_ does (coefficient
  // max_norm / (norm + 1e-6) when below 1), then one AdamW update at learning rate lr.
  void step(double lr, double grad_norm);

  std::int64_t steps_taken() const { return step_; }
  void set_steps_taken(std::int64_t s) { step_ = s; }
  float* exp_avg() { return m_.data(); }
  float* exp_avg_sq() { return v_.data(); }
  const float* exp_avg() const { return m_.data(); }
  const float* exp_avg_sq() const { return v_.data(); }

 private:
  model::GptChunk& chunk_;
  ops::Ops& ops_;
  Config::Train settings_;
  FloatBuffer m_, v_;  // first and second moments, the chunk's flat layout
  std::int64_t step_ = 0;
};

}  // namespace trident::train
