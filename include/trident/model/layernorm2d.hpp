// trident/model/layernorm2d.hpp — LayerNorm over 2D-sharded activations (Colossal-AI's
// LayerNorm2D): each token row's mean and variance come from its q column blocks, summed
// along the grid's row communicator.
// defines: trident::model::LayerNorm2d, layernorm2d_row_bytes, layernorm2d_param_bytes
//
// Legend: X [m, C] rows of tokens; rank (r, c) holds block X_rc [mb, Cb], mb = m/q, Cb = C/q
// (model/summa.hpp's layout). Gain and bias are split by column: the q ranks of grid column c
// hold the same g_c, b_c [Cb]; their gradients are partial over this rank's rows until
// reduce_param_grads sums them along the column communicator (once per step, as sequence
// parallelism sums its LayerNorm gradients over TP).
// Host memory only for now: its row statistics are plain loops (a device backend would need
// row-sum kernels in ops); the constructor refuses a device backend.
#pragma once

#include <vector>

#include "trident/ops/ops.hpp"
#include "trident/parallel/tp_grid2d.hpp"

namespace trident::model {

// What one forward or one backward makes the row communicator count: one allreduce of two
// doubles per local row, 2(q-1)/q * 16 * mb bytes (0 when q == 1).
double layernorm2d_row_bytes(int q, int m);
// What reduce_param_grads makes the column communicator count: two allreduces of Cb floats,
// 2 * 2(q-1)/q * 4 * Cb bytes (0 when q == 1).
double layernorm2d_param_bytes(int q, int c);

class LayerNorm2d {
 public:
  // An Error unless m and c divide by grid.q, or on a device backend.
  LayerNorm2d(ops::Ops& ops, parallel::Tp2dGrid& grid, int m, int c, float eps);

  // y[mb, Cb] = (x - mean) * rstd * g + b; mean[mb] and rstd[mb] kept for the backward.
  void forward(float* y, float* mean, float* rstd, const float* x, const float* g,
               const float* b);
  // dx[mb, Cb] (overwritten) and dg[Cb], db[Cb] += this rank's rows' share.
  void backward(float* dx, float* dg, float* db, const float* dy, const float* x,
                const float* mean, const float* rstd, const float* g);
  // dg, db summed over the grid column's q ranks (in place, the same on each of them).
  void reduce_param_grads(float* dg, float* db);

 private:
  parallel::Tp2dGrid& grid_;
  int mb_ = 0, cb_ = 0, c_ = 0;
  float eps_ = 1e-5f;
  std::vector<double> sums_;  // [2, mb] per-row sums reduced along the row
};

}  // namespace trident::model
