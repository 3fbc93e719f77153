// trident/train/run.hpp — the step loop of `trident train`: data, then one step after the
// other over a few objects with one job each (train/checkpointer.hpp: resume and saves;
// train/run_parts.hpp: metrics log, evaluator, progress line, stop policy).
// defines: trident::train::run_training, shard_role
#pragma once

#include "trident/io/shard_role.hpp"
#include "trident/train/trainer.hpp"

namespace trident::train {

// This rank's responsibilities when the model is written to a file.
io::ShardRole shard_role(const parallel::ParallelState& ps);

// Trains from the deck's data (or resumes) up to train.steps. Collective over the world.
void run_training(Trainer& trainer);

}  // namespace trident::train
