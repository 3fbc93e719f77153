// trident/model/xent2d.hpp — softmax cross-entropy over 2D-sharded logits: rank (r, c) holds
// the logits of token rows block r for vocabulary block c, and each row's max, sum of
// exponentials and target logit are reduced along the grid row (1D TP's parallel
// cross-entropy with the grid row as its TP group), never gathering a full row.
// defines: trident::model::CrossEntropy2d, xent2d_row_bytes
//
// Legend: logits [m, V]; mb = m/q rows per block; the vocabulary is padded up to a multiple of
// q, vb = its q-th part; block c holds columns [c*vb, (c+1)*vb), of which the first
// valid_columns() are real (the padding columns are ignored forward and get 0 backward).
#pragma once

#include <cstdint>

#include "trident/core/buffer.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/tp_grid2d.hpp"

namespace trident::model {

// What one forward makes the row communicator count: an allreduce (max) of mb floats and one
// (sum) of 2*mb, 2(q-1)/q * 4 * 3 * mb bytes (0 when q == 1). The backward sends nothing.
double xent2d_row_bytes(int q, int m);

class CrossEntropy2d {
 public:
  // An Error unless m divides by grid.q.
  CrossEntropy2d(ops::Ops& ops, parallel::Tp2dGrid& grid, int m, int vocab);

  int vocab_per_block() const { return vb_; }
  int vocab_start() const { return vocab_start_; }
  int valid_columns() const { return v_valid_; }

  // loss[mb] = log-sum-exp of each row minus its target's logit, from logits[mb, vb] and the
  // targets[mb] of this rank's rows (global vocabulary ids); the same on each rank of a grid
  // row. Keeps the rows' max and sum for the backward.
  void forward(float* loss, const float* logits, const std::int32_t* targets);
  // In place: logits[mb, vb] become scale * (softmax - onehot(target)).
  void backward(float* logits, const std::int32_t* targets, float scale);

 private:
  ops::Ops& ops_;
  parallel::Tp2dGrid& grid_;
  int mb_ = 0, vb_ = 0, v_valid_ = 0, vocab_start_ = 0;
  FloatBuffer row_max_;  // [mb]
  FloatBuffer stats_;    // [2, mb] sum of exponentials, target logit
};

}  // namespace trident::model
