// trident/train/checkpointer.hpp — the run's checkpoints: where a run starts (resume from a
// checkpoint, the deck's init_weights, or a fresh initialization), when a step is saved,
// the save itself and the pruning of old ones (io.keep_checkpoints).
// defines: trident::train::Checkpointer
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "trident/io/shard_role.hpp"
#include "trident/train/trainer.hpp"

namespace trident::train {

class Checkpointer {
 public:
  explicit Checkpointer(Trainer& trainer);

  // Loads the weights the run starts from and returns the step it starts after (0: a new
  // run). Collective over the world; a failure on any rank fails on every rank (agree).
  // io.resume = "auto" falls back past damaged checkpoints, renaming each to *.damaged.
  std::int64_t start();
  bool resumed() const { return resume_.has_value(); }

  // Whether step is saved by the schedule: the last step (unless io.final_checkpoint is
  // false), or every io.checkpoint_every.
  bool due(std::int64_t step) const;
  // Writes the checkpoint of `step` (the model's current weights) and prunes old ones.
  void save(std::int64_t step);
  // Saves `step` unless it is already saved.
  void ensure_saved(std::int64_t step);
  std::string path_of(std::int64_t step) const;

 private:
  // Reads checkpoint `path` into the model and optimizer; returns its step. Collective.
  std::int64_t load(const std::string& path);

  Trainer& tr_;
  const Config& cfg_;
  io::ShardRole role_;
  std::string dir_;
  std::optional<std::string> resume_;
  std::int64_t last_saved_ = -1;
};

}  // namespace trident::train
