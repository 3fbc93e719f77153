// SUMMA linear layer on the 2D TP grid (see trident/model/summa.hpp).
#include "trident/model/summa.hpp"

#include <algorithm>

#include "trident/core/error.hpp"

namespace trident::model {

namespace {
double block_bytes(int rows, int cols, int q) {
  return 4.0 * double(rows / q) * double(cols / q);
}
}  // namespace

SummaBytes summa_forward_bytes(int q, const SummaShape& s) {
  if (q <= 1) return {};
  return {block_bytes(s.m, s.k, q), block_bytes(s.k, s.n, q)};
}

SummaBytes summa_backward_bytes(int q, const SummaShape& s, bool with_dx) {
  if (q <= 1) return {};
  const double xb = block_bytes(s.m, s.k, q), wb = block_bytes(s.k, s.n, q);
  // Without dx neither W's broadcasts nor dX's reduce-scatter happen.
  return {with_dx ? q * xb : xb, with_dx ? q * wb : (q - 1) * wb};
}

SummaLinear::SummaLinear(ops::Ops& ops, parallel::Tp2dGrid& grid, const SummaShape& shape)
    : ops_(ops), grid_(grid), shape_(shape) {
  const int q = grid.q;
  TRIDENT_CHECK(q >= 1 && shape.m > 0 && shape.k > 0 && shape.n > 0 && shape.m % q == 0 &&
                    shape.k % q == 0 && shape.n % q == 0,
                "SUMMA on a ", q, " x ", q, " grid needs m, k, n divisible by ", q, ", got ",
                shape.m, ", ", shape.k, ", ", shape.n);
  mb_ = shape.m / q;
  kb_ = shape.k / q;
  nb_ = shape.n / q;
  const std::size_t xb = std::size_t(mb_) * std::size_t(kb_);
  const std::size_t wb = std::size_t(kb_) * std::size_t(nb_);
  x_panel_ = FloatBuffer(xb, ops.memory());
  w_panel_ = FloatBuffer(wb, ops.memory());
  stack_ = FloatBuffer(std::size_t(q) * std::max(xb, wb), ops.memory());
  dw_sum_ = FloatBuffer(wb, ops.memory());
  ones_ = FloatBuffer(std::size_t(mb_), ops.memory());
  ops.fill(ones_.data(), 1.0f, mb_);
}

const float* SummaLinear::broadcast(parallel::Comm& line, const float* mine, float* panel,
                                    std::int64_t n, int root) {
  // The root's block is only read (MPI_Bcast's buffer is the source there).
  float* buf = line.rank() == root ? const_cast<float*>(mine) : panel;
  line.broadcast(buf, n * 4, root);
  return buf;
}

void SummaLinear::forward(float* y, const float* x, const float* w, const float* b) {
  const std::int64_t xb = std::int64_t(mb_) * kb_, wb = std::int64_t(kb_) * nb_;
  for (int j = 0; j < grid_.q; ++j) {
    const float* xj = broadcast(grid_.row, x, x_panel_.data(), xb, j);  // X_rj
    const float* wj = broadcast(grid_.col, w, w_panel_.data(), wb, j);  // W_jc
    ops_.gemm(false, false, mb_, nb_, kb_, 1.0f, xj, kb_, wj, nb_, j == 0 ? 0.0f : 1.0f, y, nb_);
  }
  // y[mb, nb] += ones[mb, 1] @ b[1, nb]
  if (b) ops_.gemm(false, false, mb_, nb_, 1, 1.0f, ones_.data(), 1, b, nb_, 1.0f, y, nb_);
}

void SummaLinear::bias_backward(float* db, const float* dy) {
  // db[1, nb] += ones[mb, 1]^T @ dy[mb, nb]
  ops_.gemm(true, false, 1, nb_, mb_, 1.0f, ones_.data(), 1, dy, nb_, 1.0f, db, nb_);
}

void SummaLinear::reduce_bias_grad(float* db) { grid_.col.allreduce_sum(db, nb_); }

void SummaLinear::backward(float* dx, float* dw, const float* dy, const float* x,
                           const float* w) {
  const std::int64_t xb = std::int64_t(mb_) * kb_, wb = std::int64_t(kb_) * nb_;
  float* stack = stack_.data();
  if (dx) {  // stack[j] = dY_rc W_jc^T [mb, kb]; summed along the row, block j lands on (r, j)
    for (int j = 0; j < grid_.q; ++j) {
      const float* wj = broadcast(grid_.col, w, w_panel_.data(), wb, j);
      ops_.gemm(false, true, mb_, kb_, nb_, 1.0f, dy, nb_, wj, nb_, 0.0f, stack + j * xb, kb_);
    }
    grid_.row.reduce_scatter_sum(stack, dx, xb);
  }
  // stack[j] = X_rj^T dY_rc [kb, nb]; summed along the column, block j lands on (j, c)
  for (int j = 0; j < grid_.q; ++j) {
    const float* xj = broadcast(grid_.row, x, x_panel_.data(), xb, j);
    ops_.gemm(true, false, kb_, nb_, mb_, 1.0f, xj, kb_, dy, nb_, 0.0f, stack + j * wb, nb_);
  }
  grid_.col.reduce_scatter_sum(stack, dw_sum_.data(), wb);
  ops_.add(dw, dw, dw_sum_.data(), wb);  // parameter gradients accumulate (+=)
}

}  // namespace trident::model
