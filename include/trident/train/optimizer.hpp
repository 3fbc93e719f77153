// trident/train/optimizer.hpp — the global gradient norm, clipping and AdamW over the
// elements of a chunk's flat buffers this rank updates (GradSync::segments): all of them,
// or under ZeRO-1 this DP rank's shard, whose moments alone it keeps (the shard layout).
// defines: trident::train::AdamW
#pragma once

#include <cstdint>

#include "trident/core/buffer.hpp"
#include "trident/model/stage_model.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/train/config.hpp"
#include "trident/train/grad_sync.hpp"

namespace trident::train {

class AdamW {
 public:
  AdamW(model::StageModel& chunk, ops::Ops& ops, const Config::Train& settings, GradSync& sync);

  // Global L2 norm of the reduced gradients, each logical parameter counted once: TP
  // shards summed over tp, replicated tensors counted on TP rank 0 only, stages summed
  // over pp, the tied wte counted on the first stage only, ZeRO-1 shards summed over dp.
  // Identical on every rank.
  double grad_norm(parallel::ParallelState& ps) const;

  // Clips to train.grad_clip as torch.nn.utils.clip_grad_norm_ does (coefficient
  // max_norm / (norm + 1e-6) when below 1), then one AdamW update at learning rate lr of
  // the owned elements (weight decay by each tensor's rule), then under ZeRO-1 the
  // all-gather of the updated parameters. The gradients are left unspecified (the clip may
  // be applied inside the update: Ops::adamw_segments).
  void step(double lr, double grad_norm);

  // Floats in each moment buffer on this rank, and the bytes of both.
  std::int64_t state_numel() const { return std::int64_t(m_.size()); }
  std::int64_t state_bytes() const { return 2 * state_numel() * std::int64_t(sizeof(float)); }

  std::int64_t steps_taken() const { return step_; }
  void set_steps_taken(std::int64_t s) { step_ = s; }
  // The moments in the shard layout (GradSync::gather_full makes them full local ones).
  float* exp_avg() { return m_.data(); }
  float* exp_avg_sq() { return v_.data(); }
  const float* exp_avg() const { return m_.data(); }
  const float* exp_avg_sq() const { return v_.data(); }

 private:
  model::StageModel& chunk_;
  ops::Ops& ops_;
  Config::Train settings_;
  GradSync& sync_;
  FloatBuffer m_, v_;  // first and second moments, the shard layout
  std::int64_t step_ = 0;
};

}  // namespace trident::train
