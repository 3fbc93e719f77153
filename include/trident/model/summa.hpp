// trident/model/summa.hpp — one linear layer Y = X W as SUMMA on the q x q grid of 2D tensor
// parallelism (Colossal-AI's Linear2D; van de Geijn & Watts 1997), forward and backward.
// defines: trident::model::SummaShape, SummaBytes, summa_forward_bytes, summa_backward_bytes,
//          SummaLinear
//
// Legend: X [m, k] activations, W [k, n] weight, Y [m, n]; m, k, n each divisible by q;
// mb = m/q, kb = k/q, nb = n/q. Rank (r, c) of the grid holds block (r, c) of X, W and Y
// (and of their gradients), each a row-major [rows/q, cols/q] matrix of its own: nothing is
// replicated, so a layer's activations and weights per rank are 1/q^2 of the serial ones.
// Y's blocks lie as X's do, so the output of one SummaLinear is the input of the next.
//
// Communication (parallel::Tp2dGrid's row and column communicators):
//   forward  Y_rc  = sum_j X_rj W_jc    for j: X_rj broadcast along row r (root column j),
//                                              W_jc broadcast along column c (root row j);
//                                       local GEMMs accumulate Y_rc.
//   dX = dY W^T (SUMMA A B^T)           for j: W_jc broadcast along column c; this rank's
//                                       partial dY_rc W_jc^T stacked at j; one reduce-scatter
//                                       along row r sums the stack: rank (r, j) gets dX_rj.
//   dW = X^T dY (SUMMA A^T B)           for j: X_rj broadcast along row r; partial
//                                       X_rj^T dY_rc stacked at j; one reduce-scatter along
//                                       column c: rank (j, c) gets dW_jc.
// The backward broadcasts again rather than keeping the forward's panels (they would be
// q times the blocks this layer stashes). Workspace: one panel of X and one of W, and a
// stack of q partials (q * max(mb*kb, kb*nb) floats), allocated once in the backend's memory.
#pragma once

#include "trident/core/buffer.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/tp_grid2d.hpp"

namespace trident::model {

struct SummaShape {
  int m = 0;  // rows of X and Y (tokens)
  int k = 0;  // columns of X, rows of W (in features)
  int n = 0;  // columns of W and Y (out features)
};

// What one call makes this rank's row and column communicators count (Comm's measure: a
// broadcast counts its S bytes on the root, a reduce-scatter (p-1) * its shard's bytes).
// With Xb = 4*mb*kb and Wb = 4*kb*nb bytes, each rank is the root of one broadcast per
// direction and loop:
//   forward   row Xb             col Wb
//   backward  row Xb + (q-1) Xb  col Wb + (q-1) Wb   (= q Xb and q Wb)
// Without dx (a first layer) the backward counts row Xb, col (q-1) Wb. Zero when q == 1 (size-1
// communicators neither call MPI nor count).
struct SummaBytes {
  double row = 0;
  double col = 0;
};
SummaBytes summa_forward_bytes(int q, const SummaShape& shape);
SummaBytes summa_backward_bytes(int q, const SummaShape& shape, bool with_dx = true);

class SummaLinear {
 public:
  // An Error unless m, k and n divide by grid.q.
  SummaLinear(ops::Ops& ops, parallel::Tp2dGrid& grid, const SummaShape& shape);

  const SummaShape& shape() const { return shape_; }
  int q() const { return grid_.q; }

  // y[mb, nb] = block (r, c) of X W (overwritten), from x[mb, kb] and w[kb, nb], plus
  // b[nb] (this grid column's slice of the bias, the same on its q ranks; may be null) on
  // every row. Collective over the grid.
  void forward(float* y, const float* x, const float* w, const float* b = nullptr);
  // dx[mb, kb] = block of dY W^T (overwritten; skipped when dx is null) and
  // dw[kb, nb] += block of X^T dY, from dy[mb, nb] and the forward's x and w.
  // Collective over the grid.
  void backward(float* dx, float* dw, const float* dy, const float* x, const float* w);
  // db[nb] += the column sums of dy[mb, nb] over this rank's rows: partial until
  // reduce_bias_grad sums it along the grid column (once per step, like LayerNorm2d's).
  void bias_backward(float* db, const float* dy);
  // db[nb] summed over the grid column's q ranks (an allreduce of nb floats on `col`).
  void reduce_bias_grad(float* db);

 private:
  // Broadcasts a block along `line` (the grid row or column): this rank's block when it is
  // the root, else `panel` filled from it.
  const float* broadcast(parallel::Comm& line, const float* mine, float* panel, std::int64_t n,
                         int root);

  ops::Ops& ops_;
  parallel::Tp2dGrid& grid_;
  SummaShape shape_;
  int mb_ = 0, kb_ = 0, nb_ = 0;
  FloatBuffer x_panel_;  // [mb, kb] X_rj of another column
  FloatBuffer w_panel_;  // [kb, nb] W_jc of another row
  FloatBuffer stack_;    // [q, max(mb*kb, kb*nb)] the backward's partials
  FloatBuffer dw_sum_;   // [kb, nb] this rank's dW block before it is added to dw
  FloatBuffer ones_;     // [mb] of 1: the bias as a rank-1 product, its gradient as one
};

}  // namespace trident::model
