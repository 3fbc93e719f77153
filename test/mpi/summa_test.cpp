// 2D tensor parallelism's building blocks under mpirun, the whole world as one TP group of
// q*q ranks: the row and column communicators (parallel/tp_grid2d.hpp), the SUMMA linear
// layer (model/summa.hpp) and the 2D LayerNorm (model/layernorm2d.hpp) against the serial
// results computed in double on every rank, with the bytes each communicator counts against
// their closed forms; the attention sublayer (SUMMA c_attn, local attention with the
// model/attention2d.hpp layout, SUMMA c_proj) against the same ops run serially; the
// cross-entropy over 2D logits (model/xent2d.hpp) against a serial double log-sum-exp; the
// embeddings and tied LM head (model/embedding2d.hpp) against serial double lookups and products.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <vector>

#include "trident/model/attention2d.hpp"
#include "trident/model/embedding2d.hpp"
#include "trident/model/layernorm2d.hpp"
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

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) GTEST_FLAG_SET(brief, true);
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
