// 2D tensor parallelism's building blocks under mpirun, the whole world as one TP group of
// q*q ranks: the row and column communicators (parallel/tp_grid2d.hpp), the SUMMA linear
// layer (model/summa.hpp) and the 2D LayerNorm (model/layernorm2d.hpp) against the serial
// results computed in double on every rank, with the bytes each communicator counts against
// their closed forms; the attention sublayer (SUMMA c_attn, local attention with the
// model/attention2d.hpp layout, SUMMA c_proj) against the same ops run serially; the
// cross-entropy over 2D logits (model/xent2d.hpp) against a serial double log-sum-exp; the
// embeddings and tied LM head (model/embedding2d.hpp) against serial double lookups and products;
// a whole GPT-2 block (model/block2d.hpp) against the serial ops, forward and backward;
// the whole GPT-2 in 2D (model/gpt2d.hpp) against the serial GptChunk's loss and gradients;
// a weights file written by the grid's 2D blocks (model/spec.hpp's Split::block2d) read
// serially and back.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "trident/core/rng.hpp"
#include "trident/io/checkpoint.hpp"
#include "trident/io/weights.hpp"
#include "trident/model/attention2d.hpp"
#include "trident/model/block2d.hpp"
#include "trident/model/embedding2d.hpp"
#include "trident/model/gpt.hpp"
#include "trident/model/gpt2d.hpp"
#include "trident/model/gpt2d_stage.hpp"
#include "trident/model/layernorm2d.hpp"
#include "trident/model/memory.hpp"
#include "trident/model/summa.hpp"
#include "trident/model/xent2d.hpp"
#include "trident/parallel/tp_grid2d.hpp"

namespace par = trident::parallel;
namespace model = trident::model;

namespace {

// Element (i, j) of a named global matrix: distinct, irregular, exactly representable.
double value(int tag, int i, int j) { return double(((i * 7 + j * 13 + tag * 5) % 17) - 8) / 8.0; }

struct Matrix {
  int rows, cols;
  std::vector<double> v;
  Matrix(int r, int c) : rows(r), cols(c), v(std::size_t(r) * std::size_t(c), 0.0) {}
  double& at(int i, int j) { return v[std::size_t(i) * std::size_t(cols) + std::size_t(j)]; }
  double at(int i, int j) const { return v[std::size_t(i) * std::size_t(cols) + std::size_t(j)]; }
};

Matrix global(int tag, int rows, int cols) {
  Matrix a(rows, cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) a.at(i, j) = value(tag, i, j);
  return a;
}

// op(A) @ op(B) in double.
Matrix product(const Matrix& a, bool ta, const Matrix& b, bool tb) {
  const int m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols, n = tb ? b.rows : b.cols;
  Matrix c(m, n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int l = 0; l < k; ++l) s += (ta ? a.at(l, i) : a.at(i, l)) * (tb ? b.at(j, l) : b.at(l, j));
      c.at(i, j) = s;
    }
  return c;
}

// Block (r, c) of a q x q blocking, as the float buffer a rank holds.
std::vector<float> block(const Matrix& a, const par::Tp2dCoord& rc, int q) {
  const int br = a.rows / q, bc = a.cols / q;
  std::vector<float> out;
  for (int i = 0; i < br; ++i)
    for (int j = 0; j < bc; ++j) out.push_back(float(a.at(rc.row * br + i, rc.col * bc + j)));
  return out;
}

void expect_block(const std::vector<float>& got, const Matrix& want, const par::Tp2dCoord& rc,
                  int q, double offset, const char* what) {
  const std::vector<float> w = block(want, rc, q);
  ASSERT_EQ(got.size(), w.size()) << what;
  for (std::size_t i = 0; i < w.size(); ++i)
    EXPECT_NEAR(got[i], double(w[i]) + offset, 1e-5) << what << " element " << i;
}

struct WorldGrid {  // the world as one q x q TP grid
  par::Comm world = par::Comm::world();
  par::Tp2dGrid grid = par::make_tp2d_grid(world);
  std::unique_ptr<trident::ops::Ops> ops = trident::ops::make_cpu_ops(1);
};

}  // namespace

TEST(Tp2dGrid, RowAndColumnCommunicators) {
  WorldGrid s;
  const int q = s.grid.q, r = s.world.rank();
  ASSERT_EQ(q * q, s.world.size());
  EXPECT_EQ(s.grid.coord.row, r / q);
  EXPECT_EQ(s.grid.coord.col, r % q);
  EXPECT_EQ(s.grid.row.size(), q);
  EXPECT_EQ(s.grid.col.size(), q);
  EXPECT_EQ(s.grid.row.rank(), s.grid.coord.col);
  EXPECT_EQ(s.grid.col.rank(), s.grid.coord.row);
  // Members by the sum of their world ranks: row r holds r*q .. r*q+q-1, column c holds
  // c, c+q, ..., c+(q-1)q.
  int row_sum = r, col_sum = r;
  s.grid.row.allreduce_max(&row_sum, 1);  // the largest member, then the sum
  EXPECT_EQ(row_sum, s.grid.coord.row * q + q - 1);
  std::vector<double> mine{double(r)};
  s.grid.row.allreduce_sum(mine.data(), 1);
  EXPECT_EQ(mine[0], q * s.grid.coord.row * q + q * (q - 1) / 2.0);
  mine[0] = r;
  s.grid.col.allreduce_sum(mine.data(), 1);
  EXPECT_EQ(mine[0], q * s.grid.coord.col + q * (q - 1) / 2.0 * q);
  s.grid.col.allreduce_max(&col_sum, 1);
  EXPECT_EQ(col_sum, (q - 1) * q + s.grid.coord.col);
  EXPECT_EQ(s.grid.row.name(), "tp_row");
  EXPECT_EQ(s.grid.col.name(), "tp_col");
}

TEST(Summa, ForwardAndBackwardMatchTheSerialProducts) {
  WorldGrid s;
  const int q = s.grid.q;
  const model::SummaShape shape{6 * q, 4 * q, 5 * q};  // odd block shapes: 6x4 @ 4x5
  const Matrix x = global(1, shape.m, shape.k), w = global(2, shape.k, shape.n),
               dy = global(3, shape.m, shape.n);
  const auto rc = s.grid.coord;
  model::SummaLinear lin(*s.ops, s.grid, shape);
  std::vector<float> xb = block(x, rc, q), wb = block(w, rc, q), dyb = block(dy, rc, q);
  std::vector<float> y(std::size_t(shape.m / q) * std::size_t(shape.n / q), -1.0f);
  s.grid.row.reset_counters();
  s.grid.col.reset_counters();

  lin.forward(y.data(), xb.data(), wb.data());
  expect_block(y, product(x, false, w, false), rc, q, 0.0, "Y = X W");
  const model::SummaBytes fwd = model::summa_forward_bytes(q, shape);
  EXPECT_DOUBLE_EQ(s.grid.row.counters().bytes, fwd.row);
  EXPECT_DOUBLE_EQ(s.grid.col.counters().bytes, fwd.col);
  if (q > 1) {
    EXPECT_DOUBLE_EQ(fwd.row, 4.0 * 6 * 4);  // one X block of 6 x 4 floats, as the root
    EXPECT_DOUBLE_EQ(fwd.col, 4.0 * 4 * 5);
    EXPECT_EQ(s.grid.row.counters().calls, q);
    EXPECT_EQ(s.grid.col.counters().calls, q);
  }

  s.grid.row.reset_counters();
  s.grid.col.reset_counters();
  std::vector<float> dx(xb.size(), -1.0f), dw(wb.size(), 0.5f);  // dw accumulates onto 0.5
  lin.backward(dx.data(), dw.data(), dyb.data(), xb.data(), wb.data());
  expect_block(dx, product(dy, false, w, true), rc, q, 0.0, "dX = dY W^T");
  expect_block(dw, product(x, true, dy, false), rc, q, 0.5, "dW += X^T dY");
  const model::SummaBytes bwd = model::summa_backward_bytes(q, shape);
  EXPECT_DOUBLE_EQ(s.grid.row.counters().bytes, bwd.row);
  EXPECT_DOUBLE_EQ(s.grid.col.counters().bytes, bwd.col);
  if (q > 1) {
    EXPECT_DOUBLE_EQ(bwd.row, q * 4.0 * 6 * 4);
    EXPECT_DOUBLE_EQ(bwd.col, q * 4.0 * 4 * 5);
  }

  // Without dx (a first layer): dW alone; no W broadcasts, no dX reduce-scatter.
  s.grid.row.reset_counters();
  s.grid.col.reset_counters();
  std::fill(dw.begin(), dw.end(), 0.0f);
  lin.backward(nullptr, dw.data(), dyb.data(), xb.data(), wb.data());
  expect_block(dw, product(x, true, dy, false), rc, q, 0.0, "dW without dX");
  const model::SummaBytes first = model::summa_backward_bytes(q, shape, false);
  EXPECT_DOUBLE_EQ(s.grid.row.counters().bytes, first.row);
  EXPECT_DOUBLE_EQ(s.grid.col.counters().bytes, first.col);
  if (q > 1) {
    EXPECT_DOUBLE_EQ(first.row, 4.0 * 6 * 4);
    EXPECT_DOUBLE_EQ(first.col, (q - 1) * 4.0 * 4 * 5);
  }
}

TEST(Summa, BiasAddsPerColumnAndItsGradientSumsAlongTheColumn) {
  WorldGrid s;
  const int q = s.grid.q;
  const model::SummaShape shape{2 * q, 3 * q, 2 * q};
  const Matrix x = global(15, shape.m, shape.k), w = global(16, shape.k, shape.n),
               bias = global(17, 1, shape.n), dy = global(18, shape.m, shape.n);
  const auto rc = s.grid.coord;
  const int nb = shape.n / q;
  model::SummaLinear lin(*s.ops, s.grid, shape);
  Matrix want = product(x, false, w, false), db_want(1, shape.n);
  for (int i = 0; i < shape.m; ++i)
    for (int j = 0; j < shape.n; ++j) {
      want.at(i, j) += bias.at(0, j);
      db_want.at(0, j) += dy.at(i, j);
    }
  std::vector<float> xb = block(x, rc, q), wb = block(w, rc, q), dyb = block(dy, rc, q),
                     y(std::size_t(shape.m / q) * nb), b(nb), db(nb, 0.5f);
  for (int j = 0; j < nb; ++j) b[j] = float(bias.at(0, rc.col * nb + j));
  lin.forward(y.data(), xb.data(), wb.data(), b.data());
  expect_block(y, want, rc, q, 0.0, "X W + b");
  s.grid.col.reset_counters();
  lin.bias_backward(db.data(), dyb.data());
  lin.reduce_bias_grad(db.data());  // db += (accumulates): each of the q ranks brings its 0.5
  for (int j = 0; j < nb; ++j)
    EXPECT_NEAR(db[j], db_want.at(0, rc.col * nb + j) + 0.5 * q, 1e-5) << j;
  EXPECT_DOUBLE_EQ(s.grid.col.counters().bytes, q > 1 ? 2.0 * (q - 1) / q * 4 * nb : 0.0);
}

TEST(Summa, ChainedLayersKeepTheBlockLayout) {
  // Y = (X W1) W2: the first layer's output blocks are the second's input blocks.
  WorldGrid s;
  const int q = s.grid.q;
  const model::SummaShape first{2 * q, 3 * q, 4 * q}, second{2 * q, 4 * q, 2 * q};
  const Matrix x = global(4, first.m, first.k), w1 = global(5, first.k, first.n),
               w2 = global(6, second.k, second.n);
  const auto rc = s.grid.coord;
  model::SummaLinear l1(*s.ops, s.grid, first), l2(*s.ops, s.grid, second);
  std::vector<float> xb = block(x, rc, q), w1b = block(w1, rc, q), w2b = block(w2, rc, q);
  std::vector<float> h(std::size_t(2 * 4)), y(std::size_t(2 * 2));
  l1.forward(h.data(), xb.data(), w1b.data());
  l2.forward(y.data(), h.data(), w2b.data());
  expect_block(y, product(product(x, false, w1, false), false, w2, false), rc, q, 0.0,
               "(X W1) W2");
}

TEST(Summa, RejectsShapesThatDoNotSplit) {
  WorldGrid s;
  if (s.grid.q == 1) GTEST_SKIP() << "every shape splits over one rank";
  EXPECT_THROW(model::SummaLinear(*s.ops, s.grid, model::SummaShape{3, 4, 4}), trident::Error);
}

TEST(LayerNorm2d, ForwardAndBackwardMatchTheSerialLayerNorm) {
  WorldGrid s;
  const int q = s.grid.q, m = 3 * q, c = 4 * q;
  const double eps = 1e-5;
  const Matrix x = global(7, m, c), dy = global(8, m, c), gb = global(9, 2, c);
  // Serial LayerNorm and its gradients in double.
  Matrix y(m, c), dx(m, c), dg(1, c), db(1, c);
  for (int i = 0; i < m; ++i) {
    double mu = 0, var = 0;
    for (int j = 0; j < c; ++j) mu += x.at(i, j) / c;
    for (int j = 0; j < c; ++j) var += (x.at(i, j) - mu) * (x.at(i, j) - mu) / c;
    const double rs = 1.0 / std::sqrt(var + eps);
    double m1 = 0, m2 = 0;
    for (int j = 0; j < c; ++j) {
      const double xhat = (x.at(i, j) - mu) * rs;
      y.at(i, j) = xhat * (1.0 + gb.at(0, j)) + gb.at(1, j);
      m1 += dy.at(i, j) * (1.0 + gb.at(0, j)) / c;
      m2 += dy.at(i, j) * (1.0 + gb.at(0, j)) * xhat / c;
      dg.at(0, j) += dy.at(i, j) * xhat;
      db.at(0, j) += dy.at(i, j);
    }
    for (int j = 0; j < c; ++j) {
      const double xhat = (x.at(i, j) - mu) * rs;
      dx.at(i, j) = rs * (dy.at(i, j) * (1.0 + gb.at(0, j)) - m1 - xhat * m2);
    }
  }
  const auto rc = s.grid.coord;
  const int mb = m / q, cb = c / q;
  std::vector<float> g(cb), b(cb);  // this grid column's gain and bias
  for (int j = 0; j < cb; ++j) {
    g[j] = float(1.0 + gb.at(0, rc.col * cb + j));
    b[j] = float(gb.at(1, rc.col * cb + j));
  }
  model::LayerNorm2d ln(*s.ops, s.grid, m, c, float(eps));
  std::vector<float> xb = block(x, rc, q), dyb = block(dy, rc, q), yb(xb.size()),
                     dxb(xb.size()), mean(mb), rstd(mb), dgb(cb, 0.0f), dbb(cb, 0.0f);
  s.grid.row.reset_counters();
  s.grid.col.reset_counters();
  ln.forward(yb.data(), mean.data(), rstd.data(), xb.data(), g.data(), b.data());
  expect_block(yb, y, rc, q, 0.0, "LayerNorm y");
  EXPECT_DOUBLE_EQ(s.grid.row.counters().bytes, model::layernorm2d_row_bytes(q, m));
  ln.backward(dxb.data(), dgb.data(), dbb.data(), dyb.data(), xb.data(), mean.data(),
              rstd.data(), g.data());
  expect_block(dxb, dx, rc, q, 0.0, "LayerNorm dx");
  EXPECT_DOUBLE_EQ(s.grid.row.counters().bytes, 2 * model::layernorm2d_row_bytes(q, m));
  ln.reduce_param_grads(dgb.data(), dbb.data());
  for (int j = 0; j < cb; ++j) {
    EXPECT_NEAR(dgb[j], dg.at(0, rc.col * cb + j), 1e-5) << "dg " << j;
    EXPECT_NEAR(dbb[j], db.at(0, rc.col * cb + j), 1e-5) << "db " << j;
  }
  EXPECT_DOUBLE_EQ(s.grid.col.counters().bytes, model::layernorm2d_param_bytes(q, c));
  if (q > 1) {
    EXPECT_DOUBLE_EQ(model::layernorm2d_row_bytes(q, m), 2.0 * (q - 1) / q * 16 * mb);
    EXPECT_DOUBLE_EQ(model::layernorm2d_param_bytes(q, c), 2 * 2.0 * (q - 1) / q * 4 * cb);
  }
}

namespace {
Matrix from_floats(const std::vector<float>& v, int rows, int cols) {
  Matrix a(rows, cols);
  for (std::size_t i = 0; i < v.size(); ++i) a.v[i] = v[i];
  return a;
}
std::vector<float> floats(const Matrix& a) { return std::vector<float>(a.v.begin(), a.v.end()); }
}  // namespace

TEST(Attention2d, QkvColumnOrderInterleavesHeadsPerGridColumn) {
  // C = 4, q = 2: block 0 = q0 q1 k0 k1 v0 v1 (serial columns 0 1 4 5 8 9), block 1 the rest.
  const std::vector<std::int64_t> want{0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11};
  for (int col = 0; col < 12; ++col) EXPECT_EQ(model::qkv2d_global_column(col, 4, 2), want[col]);
  for (int col = 0; col < 12; ++col) EXPECT_EQ(model::qkv2d_global_column(col, 4, 1), col);
  EXPECT_THROW(model::attention2d_shape(3, 4, 8, 2, 2), trident::Error);  // 3 sequences
  EXPECT_THROW(model::attention2d_shape(2, 4, 6, 3, 2), trident::Error);  // 3 heads
}

TEST(Attention2d, SublayerMatchesTheSerialOps) {
  WorldGrid s;
  const int q = s.grid.q, B = 2 * q, T = 3, NH = 2 * q, C = 4 * NH, N = B * T;
  trident::ops::Ops& ops = *s.ops;
  const Matrix x = global(10, N, C), wqkv = global(11, C, 3 * C), wproj = global(12, C, C),
               dy = global(13, N, C);
  // Serial: qkv = X Wqkv, attention, y = out Wproj, and the backward, with the same kernels.
  std::vector<float> fx = floats(x), fwqkv = floats(wqkv), fwproj = floats(wproj),
                     fdy = floats(dy), qkv(std::size_t(N) * 3 * C), out(std::size_t(N) * C),
                     lse(std::size_t(B) * NH * T), y(std::size_t(N) * C), dout(out.size()),
                     dqkv(qkv.size()), dx(fx.size()), dwqkv(fwqkv.size(), 0.0f),
                     dwproj(fwproj.size(), 0.0f);
  const auto shape = trident::ops::attention_shape_qkv(B, T, C, NH);
  ops.linear_forward(qkv.data(), fx.data(), fwqkv.data(), nullptr, N, C, 3 * C);
  ops.attention_forward(out.data(), lse.data(), qkv.data(), qkv.data() + C, qkv.data() + 2 * C,
                        shape);
  ops.linear_forward(y.data(), out.data(), fwproj.data(), nullptr, N, C, C);
  ops.linear_backward(dout.data(), dwproj.data(), nullptr, fdy.data(), out.data(),
                      fwproj.data(), N, C, C);
  ops.attention_backward(dqkv.data(), dqkv.data() + C, dqkv.data() + 2 * C, dout.data(),
                         out.data(), lse.data(), qkv.data(), qkv.data() + C, qkv.data() + 2 * C,
                         shape);
  ops.linear_backward(dx.data(), dwqkv.data(), nullptr, dqkv.data(), fx.data(), fwqkv.data(),
                      N, C, 3 * C);

  // 2D: W_qkv in the 2D column order, every matrix in blocks.
  Matrix w2d(C, 3 * C), dw2d_want(C, 3 * C);
  const Matrix dwqkv_serial = from_floats(dwqkv, C, 3 * C);
  for (int i = 0; i < C; ++i)
    for (int j = 0; j < 3 * C; ++j) {
      const auto g = int(model::qkv2d_global_column(j, C, q));
      w2d.at(i, j) = wqkv.at(i, g);
      dw2d_want.at(i, j) = dwqkv_serial.at(i, g);
    }
  const auto rc = s.grid.coord;
  const int mb = N / q, cb = C / q;
  model::SummaLinear c_attn(ops, s.grid, {N, C, 3 * C}), c_proj(ops, s.grid, {N, C, C});
  const auto local = model::attention2d_shape(B, T, C, NH, q);
  std::vector<float> xb = block(x, rc, q), wb = block(w2d, rc, q), pb = block(wproj, rc, q),
                     dyb = block(dy, rc, q), qkvb(std::size_t(mb) * 3 * cb),
                     outb(std::size_t(mb) * cb), lseb(std::size_t(B / q) * (NH / q) * T),
                     yb(outb.size()), doutb(outb.size()), dqkvb(qkvb.size()), dxb(xb.size()),
                     dwb(wb.size(), 0.0f), dpb(pb.size(), 0.0f);
  c_attn.forward(qkvb.data(), xb.data(), wb.data());
  ops.attention_forward(outb.data(), lseb.data(), qkvb.data(), qkvb.data() + cb,
                        qkvb.data() + 2 * cb, local);
  c_proj.forward(yb.data(), outb.data(), pb.data());
  expect_block(outb, from_floats(out, N, C), rc, q, 0.0, "attention output");
  expect_block(yb, from_floats(y, N, C), rc, q, 0.0, "y");
  c_proj.backward(doutb.data(), dpb.data(), dyb.data(), outb.data(), pb.data());
  ops.attention_backward(dqkvb.data(), dqkvb.data() + cb, dqkvb.data() + 2 * cb, doutb.data(),
                         outb.data(), lseb.data(), qkvb.data(), qkvb.data() + cb,
                         qkvb.data() + 2 * cb, local);
  c_attn.backward(dxb.data(), dwb.data(), dqkvb.data(), xb.data(), wb.data());
  expect_block(dxb, from_floats(dx, N, C), rc, q, 0.0, "dX");
  expect_block(dpb, from_floats(dwproj, C, C), rc, q, 0.0, "dW_proj");
  expect_block(dwb, dw2d_want, rc, q, 0.0, "dW_qkv (2D column order)");
}

TEST(CrossEntropy2d, LossAndGradientMatchTheSerialSoftmax) {
  WorldGrid s;
  const int q = s.grid.q, m = 3 * q, V = 4 * q - 1;  // the last vocabulary block is padded
  const Matrix logits = global(14, m, V);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(m));
  for (int i = 0; i < m; ++i) targets[std::size_t(i)] = (5 * i + 3) % V;
  const float scale = 0.25f;
  model::CrossEntropy2d xent(*s.ops, s.grid, m, V);
  const int mb = m / q, vb = xent.vocab_per_block();
  ASSERT_EQ(vb, (V + q - 1) / q);
  const auto rc = s.grid.coord;
  // This rank's block, padding columns filled with garbage the kernels must ignore.
  std::vector<float> lb(std::size_t(mb) * vb, 1e3f), loss(static_cast<std::size_t>(mb));
  for (int i = 0; i < mb; ++i)
    for (int j = 0; j < vb && rc.col * vb + j < V; ++j)
      lb[std::size_t(i) * vb + j] = float(logits.at(rc.row * mb + i, rc.col * vb + j));
  const std::int32_t* my_targets = targets.data() + rc.row * mb;
  s.grid.row.reset_counters();
  xent.forward(loss.data(), lb.data(), my_targets);
  EXPECT_DOUBLE_EQ(s.grid.row.counters().bytes, model::xent2d_row_bytes(q, m));
  xent.backward(lb.data(), my_targets, scale);
  EXPECT_DOUBLE_EQ(s.grid.row.counters().bytes, model::xent2d_row_bytes(q, m));
  for (int i = 0; i < mb; ++i) {
    const int row = rc.row * mb + i;
    double mx = -1e30, se = 0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, logits.at(row, j));
    for (int j = 0; j < V; ++j) se += std::exp(logits.at(row, j) - mx);
    const int t = targets[std::size_t(row)];
    EXPECT_NEAR(loss[std::size_t(i)], std::log(se) + mx - logits.at(row, t), 1e-5) << row;
    for (int j = 0; j < vb; ++j) {
      const int col = rc.col * vb + j;
      const double want =
          col < V ? scale * (std::exp(logits.at(row, col) - mx) / se - (col == t ? 1.0 : 0.0))
                  : 0.0;
      EXPECT_NEAR(lb[std::size_t(i) * vb + j], want, 1e-6) << row << ", " << col;
    }
  }
  if (q > 1) EXPECT_DOUBLE_EQ(model::xent2d_row_bytes(q, m), 2.0 * (q - 1) / q * 4 * 3 * mb);
}

TEST(Embedding2d, LookupAndTiedHeadMatchTheSerialOnes) {
  WorldGrid s;
  const int q = s.grid.q, B = 2 * q, T = 3, V = 4 * q - 1, C = 3 * q;  // padded vocabulary
  const int m = B * T;
  model::Embedding2d emb(*s.ops, s.grid, {B, T, V, C});
  const int mb = emb.rows_per_block(), cb = emb.cols_per_block(), vp = emb.padded_vocab(),
            vb = emb.vocab_per_block();
  ASSERT_EQ(mb, m / q);
  ASSERT_EQ(vp, vb * q);
  const auto rc = s.grid.coord;
  Matrix wte(vp, C);  // rows >= V stay 0, as the model keeps its padding
  for (int i = 0; i < V; ++i)
    for (int j = 0; j < C; ++j) wte.at(i, j) = value(21, i, j);
  const Matrix wpe = global(22, T, C), xh = global(23, m, C), dxe = global(24, m, C);
  Matrix dlogits(m, V);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < V; ++j) dlogits.at(i, j) = value(25, i, j);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(m));
  for (int i = 0; i < m; ++i) tokens[std::size_t(i)] = (5 * i + 3) % V;
  // This grid column's slice of all the rows of a [rows, C] matrix.
  auto column_slice = [&](const Matrix& a) {
    std::vector<float> out;
    for (int i = 0; i < a.rows; ++i)
      for (int j = 0; j < cb; ++j) out.push_back(float(a.at(i, rc.col * cb + j)));
    return out;
  };
  const std::vector<float> wte_c = column_slice(wte), wpe_c = column_slice(wpe);
  const std::int32_t* my_tokens = tokens.data() + rc.row * mb;

  // Lookup: x = wte[token] + wpe[position], block (r, c).
  Matrix xe(m, C);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < C; ++j) xe.at(i, j) = wte.at(tokens[std::size_t(i)], j) + wpe.at(i % T, j);
  std::vector<float> x(std::size_t(mb) * cb, -1.0f);
  s.grid.row.reset_counters();
  s.grid.col.reset_counters();
  emb.forward(x.data(), my_tokens, wte_c.data(), wpe_c.data());
  expect_block(x, xe, rc, q, 0.0, "x = wte[tok] + wpe[t]");
  EXPECT_EQ(s.grid.row.counters().bytes + s.grid.col.counters().bytes, 0.0);

  // Head: logits block (r, c) of X wte^T; padding columns 0.
  const Matrix logits = product(xh, false, wte, true);  // [m, vp]
  std::vector<float> lb(std::size_t(mb) * vb, -1.0f);
  const std::vector<float> xhb = block(xh, rc, q);
  emb.head_forward(lb.data(), xhb.data(), wte_c.data());
  expect_block(lb, logits, rc, q, 0.0, "logits = X wte^T");
  const model::Embedding2dBytes bytes = model::embedding2d_head_bytes(q, {B, T, V, C});
  EXPECT_DOUBLE_EQ(s.grid.row.counters().bytes, bytes.head_forward_row);

  // Backward: dX = dlogits wte; dwte = dlogits^T X + the lookup's scatter of dx; dwpe.
  Matrix dl(m, vp);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < V; ++j) dl.at(i, j) = dlogits.at(i, j);
  const Matrix dxh = product(dl, false, wte, false);
  Matrix dwte = product(dl, true, xh, false), dwpe(T, C);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < C; ++j) {
      dwte.at(tokens[std::size_t(i)], j) += dxe.at(i, j);
      dwpe.at(i % T, j) += dxe.at(i, j);
    }
  std::vector<float> dx(std::size_t(mb) * cb, -1.0f), dwte_c(wte_c.size(), 0.0f),
      dwpe_c(wpe_c.size(), 0.0f);
  const std::vector<float> dlb = block(dl, rc, q), dxeb = block(dxe, rc, q);
  emb.head_backward(dx.data(), dwte_c.data(), dlb.data(), xhb.data(), wte_c.data());
  expect_block(dx, dxh, rc, q, 0.0, "dX = dlogits wte");
  EXPECT_DOUBLE_EQ(s.grid.row.counters().bytes, bytes.head_forward_row + bytes.head_backward_row);
  emb.backward(dwte_c.data(), dwpe_c.data(), dxeb.data(), my_tokens);
  s.grid.col.reset_counters();
  emb.reduce_param_grads(dwte_c.data(), dwpe_c.data());
  const std::vector<float> want_dwte = column_slice(dwte), want_dwpe = column_slice(dwpe);
  for (std::size_t i = 0; i < want_dwte.size(); ++i)
    EXPECT_NEAR(dwte_c[i], want_dwte[i], 1e-5) << "dwte element " << i;
  for (std::size_t i = 0; i < want_dwpe.size(); ++i)
    EXPECT_NEAR(dwpe_c[i], want_dwpe[i], 1e-5) << "dwpe element " << i;
  if (q > 1) {
    EXPECT_DOUBLE_EQ(bytes.head_forward_row, (q - 1) * 4.0 * mb * vb);
    EXPECT_DOUBLE_EQ(s.grid.col.counters().bytes, 2.0 * (q - 1) / q * 4 * (vp + T) * cb);
  }
}

// 2D ShardSpecs through parallel HDF5: the grid writes its blocks (a copy's poisoned values
// must not reach the file), rank 0 reads the file as the serial layout, and the grid reads it
// back with checksums verified; a checkpoint written in 2D resumes in 1D TP and back.
TEST(Checkpoint2d, GridBlocksWrittenReadSeriallyAndBack) {
  WorldGrid s;
  const int tp = s.world.size(), rank = s.world.rank();
  const trident::model::ModelConfig cfg{51, 8, 2, 4, 8};  // vocabulary odd: padding at q = 2
  auto value_of = [](const std::string& name, std::int64_t g) {
    const std::uint64_t h = trident::rng::uniform_u64(0, trident::rng::key_of(name), std::uint64_t(g));
    return float(std::int64_t(h % 20001) - 10000) * 1e-3f;
  };
  auto fill = [&](const std::vector<trident::model::ShardSpec>& specs, bool poison_copies) {
    std::int64_t n = 0;
    for (const auto& sp : specs) n = std::max(n, sp.offset + sp.local_numel());
    std::vector<float> flat(std::size_t(n), 0.0f);
    for (const auto& sp : specs)
      trident::model::for_each_local_element(sp, [&](std::int64_t l, std::int64_t g) {
        flat[std::size_t(sp.offset + l)] = poison_copies && sp.tp_copy != 0 ? -9.0f : value_of(sp.name, g);
      });
    return flat;
  };
  const trident::model::StageLayout all{0, cfg.n_layer, true, true};
  const auto specs = trident::model::gpt_param_specs(cfg, all, rank, tp, 0, true);
  const auto role = trident::io::ShardRole::for_rank(rank, 0, 0);
  long pid = long(getpid());
  s.world.broadcast(&pid, sizeof pid, 0);
  const char* base = std::getenv("TRIDENT_TEST_OUT");
  const std::string dir = std::string(base && *base ? base : "/tmp") + "/summa-io-" +
                          std::to_string(tp) + "-" + std::to_string(pid);
  if (rank == 0) std::filesystem::create_directories(dir);
  s.world.barrier();
  const std::string path = dir + "/w2d.h5";
  const auto flat = fill(specs, true);
  trident::io::write_weights(path, s.world.raw(), cfg, specs, flat.data(), role);
  if (rank == 0) {
    const auto serial = trident::model::gpt_param_specs(cfg, all, 0, 1);
    std::vector<float> back(fill(serial, false).size(), 0.0f);
    trident::io::read_weights(path, MPI_COMM_NULL, cfg, serial, back.data());
    std::int64_t bad = 0;
    for (const auto& sp : serial)
      trident::model::for_each_local_element(sp, [&](std::int64_t l, std::int64_t g) {
        bad += back[std::size_t(sp.offset + l)] != value_of(sp.name, g);
      });
    EXPECT_EQ(bad, 0);
  }
  std::vector<float> mine(flat.size(), 5.0f);
  trident::io::read_weights(path, s.world.raw(), cfg, specs, mine.data(), role);
  const auto want = fill(specs, false);  // padding rows read as 0, as fill leaves them
  EXPECT_EQ(mine, want) << "rank " << rank;

  // A checkpoint (weights and both AdamW moments) written in 2D resumes in 1D TP over the
  // same ranks, and one written in 1D resumes in 2D: every shard as its layout places it.
  const auto specs1d = trident::model::gpt_param_specs(cfg, all, rank, tp);
  const auto flat1d = fill(specs1d, false);
  std::vector<float> p1(flat1d.size(), 5.0f), m1(p1), v1(p1);
  trident::io::CheckpointState st;
  st.step = 3;
  st.config = "# test";
  const std::string ck2d = trident::io::write_checkpoint(dir + "/from2d", s.world.raw(), cfg,
                                                         specs, st, flat.data(), flat.data(),
                                                         flat.data(), role);
  trident::io::read_checkpoint(ck2d, s.world.raw(), cfg, specs1d, p1.data(), m1.data(),
                               v1.data(), role);
  EXPECT_EQ(p1, flat1d) << "1D weights from a 2D checkpoint, rank " << rank;
  EXPECT_EQ(v1, flat1d) << "1D exp_avg_sq from a 2D checkpoint, rank " << rank;
  const std::string ck1d = trident::io::write_checkpoint(dir + "/from1d", s.world.raw(), cfg,
                                                         specs1d, st, flat1d.data(),
                                                         flat1d.data(), flat1d.data(), role);
  std::vector<float> p2(flat.size(), 5.0f), m2(p2), v2(p2);
  trident::io::read_checkpoint(ck1d, s.world.raw(), cfg, specs, p2.data(), m2.data(), v2.data(),
                               role);
  EXPECT_EQ(p2, want) << "2D weights from a 1D checkpoint, rank " << rank;
  EXPECT_EQ(m2, want) << "2D exp_avg from a 1D checkpoint, rank " << rank;
  s.world.barrier();
  if (rank == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

// One GPT-2 block in 2D against the same block run serially with the same kernels: the
// output, dX and every parameter gradient (vectors after reduce_param_grads), and the
// activations a layer keeps per rank against serial's.
TEST(Block2d, ForwardAndBackwardMatchTheSerialBlock) {
  WorldGrid s;
  const int q = s.grid.q, B = 2 * q, T = 3, NH = 2 * q, C = 4 * NH, F = 4 * C, N = B * T;
  trident::ops::Ops& ops = *s.ops;
  auto vec = [](int tag, int n, double base) {  // a [n] parameter near `base`
    std::vector<float> v;
    for (int j = 0; j < n; ++j) v.push_back(float(base + value(tag, 0, j) / 4));
    return v;
  };
  const Matrix x = global(30, N, C), dout = global(31, N, C);
  Matrix wqkv = global(32, C, 3 * C), wp = global(33, C, C), wfc = global(34, C, F),
         wfp = global(35, F, C);
  for (Matrix* w : {&wqkv, &wp, &wfc, &wfp})
    for (double& e : w->v) e /= 4;  // keep the attention scores and GELU inputs moderate
  const std::vector<float> w1 = vec(36, C, 1.0), b1 = vec(37, C, 0.0), bqkv = vec(38, 3 * C, 0.0),
                           bp = vec(39, C, 0.0), w2 = vec(40, C, 1.0), b2 = vec(41, C, 0.0),
                           bfc = vec(42, F, 0.0), bfp = vec(43, C, 0.0);
  // Serial, as GptChunk runs a block at tp = 1.
  const std::size_t nc = std::size_t(N) * C;
  std::vector<float> fx = floats(x), fwqkv = floats(wqkv), fwp = floats(wp), fwfc = floats(wfc),
                     fwfp = floats(wfp), ln1(nc), m1(N), r1(N), qkv(3 * nc), atty(nc),
                     lse(std::size_t(B) * NH * T), res2(nc), ln2(nc), m2(N), r2(N), fch(4 * nc),
                     gel(4 * nc), out(nc);
  const auto shape = trident::ops::attention_shape_qkv(B, T, C, NH);
  ops.layernorm_forward(ln1.data(), m1.data(), r1.data(), fx.data(), w1.data(), b1.data(), N, C);
  ops.linear_forward(qkv.data(), ln1.data(), fwqkv.data(), bqkv.data(), N, C, 3 * C);
  ops.attention_forward(atty.data(), lse.data(), qkv.data(), qkv.data() + C, qkv.data() + 2 * C,
                        shape);
  ops.linear_forward(res2.data(), atty.data(), fwp.data(), bp.data(), N, C, C);
  ops.add(res2.data(), res2.data(), fx.data(), std::int64_t(nc));
  ops.layernorm_forward(ln2.data(), m2.data(), r2.data(), res2.data(), w2.data(), b2.data(), N, C);
  ops.linear_forward(fch.data(), ln2.data(), fwfc.data(), bfc.data(), N, C, F);
  ops.gelu_forward(gel.data(), fch.data(), std::int64_t(4 * nc));
  ops.linear_forward(out.data(), gel.data(), fwfp.data(), bfp.data(), N, F, C);
  ops.add(out.data(), out.data(), res2.data(), std::int64_t(nc));
  std::vector<float> fdout = floats(dout), dgel(4 * nc), dfch(4 * nc), dln2(nc), dres2 = fdout,
                     datty(nc), dqkv(3 * nc), dln1(nc), dwfp(fwfp.size()), dbfp(C), dwfc(fwfc.size()),
                     dbfc(F), dw2(C), db2(C), dwp(fwp.size()), dbp(C), dwqkv(fwqkv.size()),
                     dbqkv(3 * C), dw1(C), db1(C);
  ops.linear_backward(dgel.data(), dwfp.data(), dbfp.data(), fdout.data(), gel.data(),
                      fwfp.data(), N, F, C);
  ops.gelu_backward(dfch.data(), fch.data(), dgel.data(), std::int64_t(4 * nc));
  ops.linear_backward(dln2.data(), dwfc.data(), dbfc.data(), dfch.data(), ln2.data(),
                      fwfc.data(), N, C, F);
  ops.layernorm_backward(dres2.data(), dw2.data(), db2.data(), dln2.data(), res2.data(),
                         w2.data(), m2.data(), r2.data(), N, C);  // dres2 = dout + ...
  ops.linear_backward(datty.data(), dwp.data(), dbp.data(), dres2.data(), atty.data(),
                      fwp.data(), N, C, C);
  ops.attention_backward(dqkv.data(), dqkv.data() + C, dqkv.data() + 2 * C, datty.data(),
                         atty.data(), lse.data(), qkv.data(), qkv.data() + C, qkv.data() + 2 * C,
                         shape);
  ops.linear_backward(dln1.data(), dwqkv.data(), dbqkv.data(), dqkv.data(), ln1.data(),
                      fwqkv.data(), N, C, 3 * C);
  std::vector<float> dx = dres2;
  ops.layernorm_backward(dx.data(), dw1.data(), db1.data(), dln1.data(), fx.data(), w1.data(),
                         m1.data(), r1.data(), N, C);

  // 2D: c_attn's columns (weight, bias and their gradients) in attention2d.hpp's order.
  const auto rc = s.grid.coord;
  auto to2d = [&](const std::vector<float>& v, int rows) {  // [rows, 3C] columns reordered
    Matrix m(rows, 3 * C);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < 3 * C; ++j)
        m.at(i, j) = v[std::size_t(i) * 3 * C + std::size_t(model::qkv2d_global_column(j, C, q))];
    return m;
  };
  auto slice = [&](const std::vector<float>& v) {  // grid column c's part of a vector
    const std::size_t n = v.size() / std::size_t(q);
    return std::vector<float>(v.begin() + std::ptrdiff_t(n * std::size_t(rc.col)),
                              v.begin() + std::ptrdiff_t(n * std::size_t(rc.col + 1)));
  };
  const Matrix wqkv2d = to2d(fwqkv, C), bqkv2d = to2d(bqkv, 1);
  std::vector<float> pw1 = slice(w1), pb1 = slice(b1), pwqkv = block(wqkv2d, rc, q),
                     pbqkv = slice(floats(bqkv2d)), pwp = block(wp, rc, q), pbp = slice(bp),
                     pw2 = slice(w2), pb2 = slice(b2), pwfc = block(wfc, rc, q), pbfc = slice(bfc),
                     pwfp = block(wfp, rc, q), pbfp = slice(bfp);
  const model::Block2dParams p{pw1.data(), pb1.data(), pwqkv.data(), pbqkv.data(),
                               pwp.data(), pbp.data(), pw2.data(),   pb2.data(),
                               pwfc.data(), pbfc.data(), pwfp.data(), pbfp.data()};
  std::vector<std::vector<float>> gbuf;
  for (const auto* v : {&pw1, &pb1, &pwqkv, &pbqkv, &pwp, &pbp, &pw2, &pb2, &pwfc, &pbfc, &pwfp,
                        &pbfp})
    gbuf.emplace_back(v->size(), 0.0f);
  model::Block2dGrads g{gbuf[0].data(), gbuf[1].data(), gbuf[2].data(),  gbuf[3].data(),
                        gbuf[4].data(), gbuf[5].data(), gbuf[6].data(),  gbuf[7].data(),
                        gbuf[8].data(), gbuf[9].data(), gbuf[10].data(), gbuf[11].data()};
  model::Block2d blk(ops, s.grid, {B, T, C, NH});
  model::Block2dActivations acts = blk.make_activations();
  const std::vector<float> xb = block(x, rc, q), doutb = block(dout, rc, q);
  std::vector<float> outb(xb.size()), dxb(xb.size());
  blk.forward(outb.data(), xb.data(), p, acts);
  blk.backward(dxb.data(), doutb.data(), xb.data(), p, g, acts);
  blk.reduce_param_grads(g);
  auto near = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << what << " element " << i;
  };
  near(outb, block(from_floats(out, N, C), rc, q), "out");
  near(dxb, block(from_floats(dx, N, C), rc, q), "dX");
  near(gbuf[2], block(to2d(dwqkv, C), rc, q), "dW c_attn");
  near(gbuf[3], slice(floats(to2d(dbqkv, 1))), "db c_attn");
  near(gbuf[4], block(from_floats(dwp, C, C), rc, q), "dW attn c_proj");
  near(gbuf[5], slice(dbp), "db attn c_proj");
  near(gbuf[8], block(from_floats(dwfc, C, F), rc, q), "dW c_fc");
  near(gbuf[9], slice(dbfc), "db c_fc");
  near(gbuf[10], block(from_floats(dwfp, F, C), rc, q), "dW mlp c_proj");
  near(gbuf[11], slice(dbfp), "db mlp c_proj");
  near(gbuf[0], slice(dw1), "ln_1 weight");
  near(gbuf[1], slice(db1), "ln_1 bias");
  near(gbuf[6], slice(dw2), "ln_2 weight");
  near(gbuf[7], slice(db2), "ln_2 bias");
  // What a layer keeps per rank: every [tokens, features] activation and the LSE are 1/q^2 of
  // serial; the LayerNorms' row statistics (4 floats per token row) 1/q.
  const std::int64_t serial = std::int64_t(ln1.size() + m1.size() + r1.size() + qkv.size() +
                                           atty.size() + lse.size() + res2.size() + ln2.size() +
                                           m2.size() + r2.size() + fch.size() + gel.size());
  EXPECT_EQ(acts.floats(), (serial - 4 * N) / (q * q) + 4 * N / q);
  if (s.world.rank() == 0)
    std::printf("Block2d: activations kept per rank %lld floats, serial %lld (q = %d)\n",
                (long long)acts.floats(), (long long)serial, q);
}

// The serial GptChunk's weights, loss and gradients on this rank alone (a dp-only
// ParallelState over the world), the reference of the Gpt2d tests.
struct SerialRun {
  trident::model::ModelConfig cfg;
  std::vector<std::int32_t> inputs, targets;
  float scale = 0;
  double loss = 0;
  std::vector<trident::model::ShardSpec> specs;
  std::vector<float> params, grads;
};

SerialRun serial_run(int q, int world) {
  SerialRun r;
  r.cfg = trident::model::ModelConfig{51, 4, 2, 2 * q, 8 * q};  // V odd: padding at q = 2
  const int B = 2 * q, N = B * r.cfg.seq_len;
  for (int i = 0; i < N; ++i) {
    r.inputs.push_back((7 * i + 3) % r.cfg.vocab_size);
    r.targets.push_back((11 * i + 5) % r.cfg.vocab_size);
  }
  r.scale = 1.0f / float(N);
  trident::parallel::ParallelState ps =
      trident::parallel::make_parallel_state([&] {
        trident::parallel::GridShape s;
        s.dp = world;
        return s;
      }());
  static const auto ops_owner = trident::ops::make_cpu_ops(1);  // outlives every chunk
  trident::ops::Ops& ops = *ops_owner;
  trident::model::GptChunk serial(r.cfg, trident::model::StageLayout{0, r.cfg.n_layer, true, true},
                                  ps, ops, B);
  serial.init_weights(1234);
  serial.zero_grads();
  auto acts = serial.make_activations();
  r.loss = serial.forward(0, *acts, r.inputs.data(), r.targets.data(), r.scale);
  serial.backward(0, *acts, r.inputs.data());
  r.specs = serial.specs();
  r.params.resize(std::size_t(serial.num_params()));
  r.grads.resize(r.params.size());
  serial.read_params(r.params.data());
  serial.read_grads(r.grads.data());
  return r;
}

// Every element of a 2D rank's tensors against the serial run's, where the specs place it:
// the same weights, gradients within float rounding, padding rows of gradients zero.
void expect_like_serial(const SerialRun& r, const std::vector<trident::model::ShardSpec>& specs,
                        const float* params, const float* grads) {
  for (const auto& t : specs) {
    const trident::model::ShardSpec* ss = nullptr;
    for (const auto& x : r.specs)
      if (x.name == t.name) ss = &x;
    ASSERT_NE(ss, nullptr) << t.name;
    double scale_t = 0;
    for (std::int64_t i = 0; i < ss->numel(); ++i)
      scale_t = std::max(scale_t, double(std::fabs(r.grads[std::size_t(ss->offset + i)])));
    std::vector<char> seen(std::size_t(t.local_numel()), 0);
    int bad = 0;
    trident::model::for_each_local_element(t, [&](std::int64_t l, std::int64_t g) {
      seen[std::size_t(l)] = 1;
      const float p = params[t.offset + l], pw = r.params[std::size_t(ss->offset + g)];
      const float d = grads[t.offset + l], dw = r.grads[std::size_t(ss->offset + g)];
      if (p != pw || std::fabs(d - dw) > 1e-4 * scale_t + 1e-4 * std::fabs(dw)) {
        if (++bad <= 3)
          ADD_FAILURE() << t.name << " local " << l << " global " << g << ": param " << p
                        << " vs " << pw << ", grad " << d << " vs " << dw;
      }
    });
    for (std::int64_t l = 0; l < t.local_numel(); ++l)
      if (!seen[std::size_t(l)]) EXPECT_EQ(grads[t.offset + l], 0.0f) << t.name << " padding";
    EXPECT_EQ(bad, 0) << t.name;
  }
}

// The whole GPT-2 in 2D against the serial GptChunk: the same initial weights, the same loss,
// and every gradient element where the 2D ShardSpecs place it (padding rows of wte zero).
TEST(Gpt2d, LossAndEveryGradientMatchTheSerialChunk) {
  WorldGrid s;
  const int q = s.grid.q;
  const SerialRun r = serial_run(q, s.world.size());
  model::Gpt2d m(r.cfg, s.grid, *s.ops, 2 * q);
  m.init_weights(1234);
  const double loss = m.forward_backward(r.inputs.data(), r.targets.data(), r.scale);
  m.reduce_param_grads();
  EXPECT_NEAR(loss, r.loss, 1e-5 * std::fabs(r.loss)) << "loss";
  expect_like_serial(r, m.specs(), m.params(), m.grads());
  // The grad norm's rule (train/optimizer.cpp): each rank sums the squares of the shards it
  // is copy 0 of, one sum over TP: the serial norm, each element counted once.
  double mine = 0, serial = 0;
  for (const auto& t : m.specs())
    if (t.tp_copy == 0)
      for (std::int64_t i = 0; i < t.local_numel(); ++i)
        mine += double(m.grads()[t.offset + i]) * m.grads()[t.offset + i];
  s.world.allreduce_sum(&mine, 1);
  for (float g : r.grads) serial += double(g) * g;
  EXPECT_NEAR(std::sqrt(mine), std::sqrt(serial), 1e-5 * std::sqrt(serial)) << "grad norm";
}

// What training runs: make_stage_model with TpMode::two_d builds a Gpt2dStage around a Gpt2d
// (the executor's boundary blocks copied in and out); the serial loss and gradients through
// the StageModel interface, and predict_memory's 2D weights and per-microbatch activations
// equal to the buffers make_activations allocates.
TEST(Gpt2dChunk, TheSerialRunThroughTheStageModelAndItsPredictedMemory) {
  WorldGrid s;
  const int q = s.grid.q, world = s.world.size();
  const SerialRun r = serial_run(q, world);
  par::GridShape all_tp;
  all_tp.tp = world;
  par::ParallelState ps = par::make_parallel_state(all_tp);
  model::StageModelOptions two_d;
  two_d.micro_batch = 2 * q;
  two_d.tp_mode = model::TpMode::two_d;
  const std::unique_ptr<model::StageModel> chunk = model::make_stage_model(
      r.cfg, {model::StageLayout{0, r.cfg.n_layer, true, true}}, ps, *s.ops, two_d);
  ASSERT_NE(dynamic_cast<model::Gpt2dStage*>(chunk.get()), nullptr);
  chunk->init_weights(1234);
  chunk->zero_grads();
  auto a = chunk->make_activations();
  const double loss = chunk->forward(0, *a, r.inputs.data(), r.targets.data(), r.scale);
  chunk->backward(0, *a, r.inputs.data());
  chunk->reduce_param_grads();
  EXPECT_NEAR(loss, r.loss, 1e-5 * std::fabs(r.loss)) << "loss";
  expect_like_serial(r, chunk->specs(), chunk->params(), chunk->grads());

  model::MemoryLayout lay;
  lay.tp = world, lay.tp_rank = ps.coord.tp, lay.micro_batch = 2 * q, lay.tp_2d = true;
  const model::MemoryEstimate e = model::predict_memory(r.cfg, lay);
  EXPECT_EQ(e.weights, 4 * chunk->num_params());
  const auto& boundary = dynamic_cast<const model::Gpt2dStageActivations&>(*a);
  const model::Gpt2dActivations& t = *boundary.model;
  std::int64_t floats = std::int64_t(boundary.input.size() + boundary.doutput.size() +
                                     boundary.dinput.size() + t.xs.size() + t.lnf.size() +
                                     t.lnf_mean.size() + t.lnf_rstd.size() + t.logits.size() +
                                     t.loss.size() + t.doutput.size() + t.dinput.size());
  for (const auto& l : t.layers) floats += l.floats();
  EXPECT_EQ(e.activations_per_microbatch, 4 * floats);
  // PipeDream-2BW keeps a second weight version and the buffer they swap through
  // (Trainer: older_weights_, swap_buffer_): predicted as in 1D.
  lay.weight_versions = 2;
  const std::int64_t n = chunk->num_params();
  EXPECT_EQ(model::predict_memory(r.cfg, lay).weights,
            4 * (2 * n + std::min(n, model::kVersionSwapFloats)));
}

// 2D TP x PP: 8 ranks as two pipeline stages of a 2 x 2 grid each (world ranks 0-3 stage 0
// with the embedding and layer 0, 4-7 stage 1 with layer 1 and the head). A stage sends its
// [mb, cb] output block to the same grid position of the next; the tied wte's gradients
// are summed between the two stages (as GradSync does over the embedding group).
// Run with mpirun -np 8 --gtest_filter='Gpt2dPipeline.*' (skipped on other world sizes).
TEST(Gpt2dPipeline, TwoStagesMatchTheSerialChunk) {
  par::Comm world = par::Comm::world();
  if (world.size() != 8) GTEST_SKIP() << "needs 8 ranks (pp 2 x tp 4)";
  const int stage = world.rank() / 4, peer = world.rank() ^ 4;
  par::Comm tp = world.split(stage, world.rank() % 4, "tp");
  par::Comm pair = world.split(world.rank() % 4, stage, "embedding");
  par::Tp2dGrid grid = par::make_tp2d_grid(tp);
  auto ops = trident::ops::make_cpu_ops(1);
  const SerialRun r = serial_run(grid.q, world.size());
  const trident::model::StageLayout layout{stage, stage + 1, stage == 0, stage == 1};
  model::Gpt2d m(r.cfg, layout, grid, *ops, 2 * grid.q);
  m.init_weights(1234);
  auto a = m.make_activations();
  const std::int64_t n = m.boundary_numel();
  double loss = 0;
  if (stage == 0) {
    m.forward(*a, r.inputs.data(), r.targets.data(), r.scale);
    MPI_Send(m.output(*a), int(n), MPI_FLOAT, peer, 1, world.raw());
    MPI_Recv(a->doutput.data(), int(n), MPI_FLOAT, peer, 2, world.raw(), MPI_STATUS_IGNORE);
    m.backward(*a);
  } else {
    MPI_Recv(m.input(*a), int(n), MPI_FLOAT, peer, 1, world.raw(), MPI_STATUS_IGNORE);
    loss = m.forward(*a, r.inputs.data(), r.targets.data(), r.scale);
    m.backward(*a);
    MPI_Send(a->dinput.data(), int(n), MPI_FLOAT, peer, 2, world.raw());
  }
  m.reduce_param_grads();
  for (const auto& t : m.specs())
    if (t.tied_across_stages()) pair.allreduce_sum(m.grads() + t.offset, t.local_numel());
  if (stage == 1) EXPECT_NEAR(loss, r.loss, 1e-5 * std::fabs(r.loss)) << "loss";
  expect_like_serial(r, m.specs(), m.params(), m.grads());
}

// 2D TP x DP: 8 ranks as two data-parallel replicas of a 2 x 2 grid (world ranks 0-3 and 4-7),
// each with half of the serial run's sequences; gradients and losses summed over the replicas
// (each already scaled by 1 / the global tokens) give the serial ones. Same launch as
// Gpt2dPipeline.
TEST(Gpt2dDataParallel, TwoReplicasMatchTheSerialChunk) {
  par::Comm world = par::Comm::world();
  if (world.size() != 8) GTEST_SKIP() << "needs 8 ranks (dp 2 x tp 4)";
  const int replica = world.rank() / 4;
  par::Comm tp = world.split(replica, world.rank() % 4, "tp");
  par::Comm dp = world.split(world.rank() % 4, replica, "dp");
  par::Tp2dGrid grid = par::make_tp2d_grid(tp);
  auto ops = trident::ops::make_cpu_ops(1);
  const SerialRun r = serial_run(grid.q, world.size());
  const int half = grid.q;  // sequences per replica (the serial microbatch is 2q)
  model::Gpt2d m(r.cfg, grid, *ops, half);
  m.init_weights(1234);
  const std::int64_t first = std::int64_t(replica) * half * r.cfg.seq_len;
  double loss = m.forward_backward(r.inputs.data() + first, r.targets.data() + first, r.scale);
  m.reduce_param_grads();
  dp.allreduce_sum(m.grads(), m.num_params());
  dp.allreduce_sum(&loss, 1);
  EXPECT_NEAR(loss, r.loss, 1e-5 * std::fabs(r.loss)) << "loss";
  expect_like_serial(r, m.specs(), m.params(), m.grads());
}
