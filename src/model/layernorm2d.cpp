// LayerNorm on 2D-sharded activations (see trident/model/layernorm2d.hpp).
#include "trident/model/layernorm2d.hpp"

#include <algorithm>
#include <cmath>

#include "trident/core/error.hpp"

namespace trident::model {

double layernorm2d_row_bytes(int q, int m) {
  if (q <= 1) return 0;
  return 2.0 * double(q - 1) / double(q) * 16.0 * double(m / q);
}

double layernorm2d_param_bytes(int q, int c) {
  if (q <= 1) return 0;
  return 2.0 * (2.0 * double(q - 1) / double(q) * 4.0 * double(c / q));
}

LayerNorm2d::LayerNorm2d(ops::Ops& ops, parallel::Tp2dGrid& grid, int m, int c, float eps)
    : grid_(grid), c_(c), eps_(eps) {
  const int q = grid.q;
  TRIDENT_CHECK(q >= 1 && m > 0 && c > 0 && m % q == 0 && c % q == 0, "LayerNorm on a ", q,
                " x ", q, " grid needs rows and columns divisible by ", q, ", got ", m, " x ", c);
  TRIDENT_CHECK(ops.memory() == nullptr, "2D LayerNorm runs on host memory only (backend ",
                ops.name(), ")");
  mb_ = m / q;
  cb_ = c / q;
  sums_.assign(std::size_t(2) * std::size_t(mb_), 0.0);
}

void LayerNorm2d::forward(float* y, float* mean, float* rstd, const float* x, const float* g,
                          const float* b) {
  double* s1 = sums_.data();
  double* s2 = s1 + mb_;
  for (int i = 0; i < mb_; ++i) {  // this block's share of each row's sum and sum of squares
    const float* xi = x + std::size_t(i) * cb_;
    double a = 0, a2 = 0;
    for (int j = 0; j < cb_; ++j) {
      a += xi[j];
      a2 += double(xi[j]) * xi[j];
    }
    s1[i] = a;
    s2[i] = a2;
  }
  grid_.row.allreduce_sum(sums_.data(), 2 * std::int64_t(mb_));
  for (int i = 0; i < mb_; ++i) {
    const double mu = s1[i] / c_;
    const double var = std::max(0.0, s2[i] / c_ - mu * mu);
    const double rs = 1.0 / std::sqrt(var + double(eps_));
    mean[i] = float(mu);
    rstd[i] = float(rs);
    const float* xi = x + std::size_t(i) * cb_;
    float* yi = y + std::size_t(i) * cb_;
    for (int j = 0; j < cb_; ++j) yi[j] = float((xi[j] - mu) * rs * g[j] + b[j]);
  }
}

void LayerNorm2d::backward(float* dx, float* dg, float* db, const float* dy, const float* x,
                           const float* mean, const float* rstd, const float* g) {
  double* s1 = sums_.data();  // sum_j dxhat, sum_j dxhat * xhat over the whole row
  double* s2 = s1 + mb_;
  for (int i = 0; i < mb_; ++i) {
    const float* xi = x + std::size_t(i) * cb_;
    const float* dyi = dy + std::size_t(i) * cb_;
    double a = 0, a2 = 0;
    for (int j = 0; j < cb_; ++j) {
      const double xhat = (double(xi[j]) - mean[i]) * rstd[i];
      const double dxhat = double(dyi[j]) * g[j];
      a += dxhat;
      a2 += dxhat * xhat;
      dg[j] += float(dyi[j] * xhat);
      db[j] += dyi[j];
    }
    s1[i] = a;
    s2[i] = a2;
  }
  grid_.row.allreduce_sum(sums_.data(), 2 * std::int64_t(mb_));
  for (int i = 0; i < mb_; ++i) {
    const float* xi = x + std::size_t(i) * cb_;
    const float* dyi = dy + std::size_t(i) * cb_;
    float* dxi = dx + std::size_t(i) * cb_;
    const double m1 = s1[i] / c_, m2 = s2[i] / c_;
    for (int j = 0; j < cb_; ++j) {
      const double xhat = (double(xi[j]) - mean[i]) * rstd[i];
      dxi[j] = float(rstd[i] * (double(dyi[j]) * g[j] - m1 - xhat * m2));
    }
  }
}

void LayerNorm2d::reduce_param_grads(float* dg, float* db) {
  grid_.col.allreduce_sum(dg, cb_);
  grid_.col.allreduce_sum(db, cb_);
}

}  // namespace trident::model
