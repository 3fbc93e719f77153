// trident/model/vocab_parallel_xent.hpp — the forward of Megatron's vocabulary-parallel
// cross-entropy, shared by 1D TP (over the TP group) and 2D TP (over the grid row): each rank
// holds its rows' logits for one slice of the vocabulary; the rows' max, sum of exponentials
// and target logit are reduced over the group, so no full row is ever gathered.
// defines: trident::model::vocab_parallel_xent_forward
#pragma once

#include <cstdint>

#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"

namespace trident::model {

// loss[rows] = log-sum-exp of each row minus its target's logit, from logits[rows, cols] (this
// rank's vocabulary slice, starting at global id vocab_start, its first `valid` columns real,
// the rest padding) and targets[rows] (global ids). Keeps for the backward (ops.xent_backward)
// row_max[rows] and stats[2 * rows]: the sums of exponentials, then the target logits.
void vocab_parallel_xent_forward(ops::Ops& ops, parallel::Comm& group, float* loss,
                                 float* row_max, float* stats, const float* logits,
                                 const std::int32_t* targets, int rows, int cols, int valid,
                                 int vocab_start);

}  // namespace trident::model
