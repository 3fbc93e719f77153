// trident/model/vocab_parallel_xent.hpp — Megatron's vocabulary-parallel cross-entropy over a
// communicator, shared by 1D TP (the TP group: Ops::lm_head) and 2D TP (the grid row): each
// rank holds its rows' logits for one slice of the vocabulary; the rows' max, sum of
// exponentials and target logit are reduced over the group, so no full row is ever gathered.
// The sequence itself is Ops::vocab_parallel_xent_forward; here the group as it takes it.
// defines: trident::model::GroupCollectives, vocab_parallel_xent_forward
#pragma once

#include <cstdint>

#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"

namespace trident::model {

// A communicator as the head's collectives (device buffers go through Comm's staging).
struct GroupCollectives final : ops::Ops::HeadCollectives {
  explicit GroupCollectives(parallel::Comm& g) : group(g) {}
  void allreduce_max(float* x, std::int64_t n) override { group.allreduce_max(x, n); }
  void allreduce_sum(float* x, std::int64_t n) override { group.allreduce_sum(x, n); }
  // What Ops takes: null for a group of one (an unsharded vocabulary).
  ops::Ops::HeadCollectives* or_null() { return group.size() > 1 ? this : nullptr; }
  parallel::Comm& group;
};

// loss[rows] = log-sum-exp of each row minus its target's logit, from logits[rows, cols] (this
// rank's vocabulary slice, starting at global id vocab_start, its first `valid` columns real,
// the rest padding) and targets[rows] (global ids). Keeps for the backward (ops.xent_backward)
// row_max[rows] and stats[2 * rows]: the sums of exponentials, then the target logits.
inline void vocab_parallel_xent_forward(ops::Ops& ops, parallel::Comm& group, float* loss,
                                        float* row_max, float* stats, const float* logits,
                                        const std::int32_t* targets, int rows, int cols,
                                        int valid, int vocab_start) {
  GroupCollectives tp(group);
  ops.vocab_parallel_xent_forward(loss, row_max, stats, logits, targets, rows, cols, valid,
                                  vocab_start, tp.or_null());
}

}  // namespace trident::model
