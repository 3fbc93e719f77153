// test/unit/ops/reference.hpp — naive double-precision references for every op of
// trident::ops::Ops, plus the helpers the op tests share: random inputs, element-wise
// comparison with a tolerance, central finite differences.
// defines: trident::test::{OpCase, name_of, Rng, to_double, to_float, close, pick, spread,
//          fd_grad, dot, ref_*} (ref_rmsnorm, ref_rope, ref_swiglu: the Llama ops)
//
// Legend as in ops.hpp: B batch, T time, C channels, NH heads, hs = C/NH, N = B*T rows,
// V vocabulary columns (ld = row stride of the logits, v_valid of them real).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "trident/ops/ops.hpp"

namespace trident::test {

using Vec = std::vector<double>;
using FVec = std::vector<float>;

// One row of an op test table: a printable name and a check run against a backend.
struct OpCase {
  std::string name;
  std::function<void(ops::Ops&)> check;
};
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

template <typename... Args>
std::string name_of(const char* fmt, Args... args) {
  char buf[128];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

// Deterministic random inputs (std::mt19937, so the same on every machine).
class Rng {
 public:
  explicit Rng(std::uint32_t seed) : g_(seed) {}
  FVec normal(std::size_t n, double sd = 1.0, double mean = 0.0) {
    std::normal_distribution<double> d(mean, sd);
    FVec v(n);
    for (auto& x : v) x = static_cast<float>(d(g_));
    return v;
  }
  FVec uniform(std::size_t n, double lo, double hi) {
    std::uniform_real_distribution<double> d(lo, hi);
    FVec v(n);
    for (auto& x : v) x = static_cast<float>(d(g_));
    return v;
  }
  int integer(int lo, int hi) {  // [lo, hi]
    return std::uniform_int_distribution<int>(lo, hi)(g_);
  }

 private:
  std::mt19937 g_;
};

inline Vec to_double(const FVec& v) { return Vec(v.begin(), v.end()); }
inline FVec to_float(const Vec& v) {
  FVec f(v.size());
  for (std::size_t i = 0; i < v.size(); i++) f[i] = static_cast<float>(v[i]);
  return f;
}

// Every |got - want| <= rtol |want| + atol; on failure names the worst element.
inline ::testing::AssertionResult close(const FVec& got, const Vec& want, double rtol,
                                        double atol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  std::size_t bad = 0, worst = 0;
  double worst_excess = -1.0;
  for (std::size_t i = 0; i < got.size(); i++) {
    const double err = std::abs(double(got[i]) - want[i]);
    const double lim = rtol * std::abs(want[i]) + atol;
    if (!(err <= lim)) {  // also catches NaN
      bad++;
      const double excess = std::isnan(err) ? std::numeric_limits<double>::infinity() : err / lim;
      if (excess > worst_excess) worst_excess = excess, worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements off; worst [" << worst
         << "]: got " << got[worst] << ", want " << want[worst] << " (rtol " << rtol
         << ", atol " << atol << ")";
}
inline ::testing::AssertionResult close(const FVec& got, const FVec& want, double rtol,
                                        double atol) {
  return close(got, to_double(want), rtol, atol);
}

// The entries of v at the indices idx (to compare a sampled finite-difference gradient).
template <typename T>
std::vector<T> pick(const std::vector<T>& v, const std::vector<std::size_t>& idx) {
  std::vector<T> r;
  r.reserve(idx.size());
  for (std::size_t i : idx) r.push_back(v[i]);
  return r;
}

// About k indices spread over [0, n) (all of them when n <= k).
inline std::vector<std::size_t> spread(std::size_t n, std::size_t k) {
  std::vector<std::size_t> idx;
  if (n <= k) {
    for (std::size_t i = 0; i < n; i++) idx.push_back(i);
    return idx;
  }
  // a stride coprime-ish with the row lengths, so every column and row gets visited
  const std::size_t stride = n / k;
  for (std::size_t i = 0; i < k; i++) idx.push_back((i * stride + (i * 7919) % stride) % n);
  return idx;
}

inline double max_abs(const Vec& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// d loss / d x[i] by central differences in double, for the indices in `which` (all when
// empty); the other entries are 0.
inline Vec fd_grad(Vec x, const std::function<double(const Vec&)>& loss, double h,
                   std::vector<std::size_t> which = {}) {
  if (which.empty())
    for (std::size_t i = 0; i < x.size(); i++) which.push_back(i);
  Vec g(x.size(), 0.0);
  for (std::size_t i : which) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss(x);
    x[i] = x0 - h;
    const double lm = loss(x);
    x[i] = x0;
    g[i] = (lp - lm) / (2.0 * h);
  }
  return g;
}

// sum(dy * y): the scalar whose gradient an op's backward computes from dy.
inline double dot(const Vec& dy, const Vec& y) {
  double s = 0.0;
  for (std::size_t i = 0; i < y.size(); i++) s += dy[i] * y[i];
  return s;
}

// ---- references (double) --------------------------------------------------------------

// C[m,n] = alpha op(A) op(B) + beta C (row-major, leading dimensions)
inline void ref_gemm(bool ta, bool tb, int m, int n, int k, double alpha, const Vec& a, int lda,
                     const Vec& b, int ldb, double beta, Vec& c, int ldc) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double s = 0.0;
      for (int p = 0; p < k; p++) {
        const double av = ta ? a[std::size_t(p) * lda + i] : a[std::size_t(i) * lda + p];
        const double bv = tb ? b[std::size_t(j) * ldb + p] : b[std::size_t(p) * ldb + j];
        s += av * bv;
      }
      c[std::size_t(i) * ldc + j] = alpha * s + beta * c[std::size_t(i) * ldc + j];
    }
}

// y[N,out] = x[N,in] w[in,out] + b[out] (b empty: no bias)
inline Vec ref_linear(const Vec& x, const Vec& w, const Vec& b, int n, int in, int out) {
  Vec y(std::size_t(n) * out);
  for (int i = 0; i < n; i++)
    for (int o = 0; o < out; o++) {
      double s = b.empty() ? 0.0 : b[o];
      for (int k = 0; k < in; k++) s += x[std::size_t(i) * in + k] * w[std::size_t(k) * out + o];
      y[std::size_t(i) * out + o] = s;
    }
  return y;
}

struct LnOut {
  Vec y, mean, rstd;
};
inline LnOut ref_layernorm(const Vec& x, const Vec& w, const Vec& b, int n, int c) {
  LnOut r{Vec(std::size_t(n) * c), Vec(n), Vec(n)};
  for (int i = 0; i < n; i++) {
    const double* xr = x.data() + std::size_t(i) * c;
    double m = 0.0;
    for (int j = 0; j < c; j++) m += xr[j];
    m /= c;
    double v = 0.0;
    for (int j = 0; j < c; j++) v += (xr[j] - m) * (xr[j] - m);
    v /= c;
    const double rs = 1.0 / std::sqrt(v + 1e-5);
    for (int j = 0; j < c; j++) r.y[std::size_t(i) * c + j] = (xr[j] - m) * rs * w[j] + b[j];
    r.mean[i] = m;
    r.rstd[i] = rs;
  }
  return r;
}

struct RmsOut {
  Vec y, rstd;
};
// y = x / sqrt(mean(x^2) + eps) * w per row
inline RmsOut ref_rmsnorm(const Vec& x, const Vec& w, int n, int c, double eps) {
  RmsOut r{Vec(std::size_t(n) * c), Vec(n)};
  for (int i = 0; i < n; i++) {
    const double* xr = x.data() + std::size_t(i) * c;
    double ms = 0.0;
    for (int j = 0; j < c; j++) ms += xr[j] * xr[j];
    r.rstd[i] = 1.0 / std::sqrt(ms / c + eps);
    for (int j = 0; j < c; j++) r.y[std::size_t(i) * c + j] = xr[j] * r.rstd[i] * w[j];
  }
  return r;
}

// Hugging Face Llama's apply_rotary_pos_emb, written as it is there: per head,
// x * cos + rotate_half(x) * sin, with cos = cat(cos(f), cos(f)), f_i = p * theta^(-2i/hs),
// rotate_half(x) = cat(-x[hs/2:], x[:hs/2]). Rows of x[B,T,ld]; position p = pos0 + t.
inline Vec ref_rope(const Vec& x, int b, int t, int ld, int heads, int hs, int pos0, double theta) {
  Vec y = x;
  const int half = hs / 2;
  for (int bb = 0; bb < b; bb++)
    for (int p = 0; p < t; p++)
      for (int h = 0; h < heads; h++) {
        const std::size_t base = (std::size_t(bb) * t + p) * ld + std::size_t(h) * hs;
        Vec cosv(hs), sinv(hs), rot(hs);
        for (int i = 0; i < hs; i++) {
          const double f = double(pos0 + p) / std::pow(theta, double(2 * (i % half)) / hs);
          cosv[i] = std::cos(f);
          sinv[i] = std::sin(f);
          rot[i] = i < half ? -x[base + i + half] : x[base + i - half];
        }
        for (int i = 0; i < hs; i++) y[base + i] = x[base + i] * cosv[i] + rot[i] * sinv[i];
      }
  return y;
}

// gu[N, 2F] = [gate | up] -> silu(gate) * up
inline Vec ref_swiglu(const Vec& gu, int n, int f) {
  Vec y(std::size_t(n) * f);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < f; j++) {
      const double g = gu[std::size_t(i) * 2 * f + j], u = gu[std::size_t(i) * 2 * f + f + j];
      y[std::size_t(i) * f + j] = g / (1.0 + std::exp(-g)) * u;
    }
  return y;
}

inline Vec ref_gelu(const Vec& x) {
  const double s = std::sqrt(2.0 / 3.14159265358979323846);
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); i++)
    y[i] = 0.5 * x[i] * (1.0 + std::tanh(s * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return y;
}

struct AttOut {
  Vec out, att;
};
// qkv[B,T,3C] -> out[B,T,C], att[B,NH,T,T] (causal softmax of q k^T / sqrt(hs))
inline AttOut ref_attention(const Vec& qkv, int b, int t, int c, int nh) {
  const int hs = c / nh;
  const double scale = 1.0 / std::sqrt(double(hs));
  AttOut r{Vec(std::size_t(b) * t * c, 0.0), Vec(std::size_t(b) * nh * t * t, 0.0)};
  for (int bb = 0; bb < b; bb++)
    for (int h = 0; h < nh; h++)
      for (int i = 0; i < t; i++) {
        const double* q = qkv.data() + (std::size_t(bb) * t + i) * 3 * c + h * hs;
        double* a = r.att.data() + ((std::size_t(bb) * nh + h) * t + i) * t;
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j <= i; j++) {
          const double* k = qkv.data() + (std::size_t(bb) * t + j) * 3 * c + c + h * hs;
          double s = 0.0;
          for (int d = 0; d < hs; d++) s += q[d] * k[d];
          a[j] = s * scale;
          mx = std::max(mx, a[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= i; j++) sum += (a[j] = std::exp(a[j] - mx));
        for (int j = 0; j <= i; j++) a[j] /= sum;
        double* o = r.out.data() + (std::size_t(bb) * t + i) * c + h * hs;
        for (int j = 0; j <= i; j++) {
          const double* v = qkv.data() + (std::size_t(bb) * t + j) * 3 * c + 2 * c + h * hs;
          for (int d = 0; d < hs; d++) o[d] += a[j] * v[d];
        }
      }
  return r;
}

inline Vec ref_embedding(const std::vector<std::int32_t>& tok, const Vec& wte, int n, int c,
                         int vocab_start, int v) {
  Vec x(std::size_t(n) * c, 0.0);
  for (int i = 0; i < n; i++) {
    const int row = tok[i] - vocab_start;
    if (row < 0 || row >= v) continue;
    for (int j = 0; j < c; j++) x[std::size_t(i) * c + j] = wte[std::size_t(row) * c + j];
  }
  return x;
}

// x[B,T,C] + wpe[t]
inline Vec ref_position(const Vec& x, const Vec& wpe, int b, int t, int c) {
  Vec y = x;
  for (int bb = 0; bb < b; bb++)
    for (int p = 0; p < t; p++)
      for (int j = 0; j < c; j++) y[(std::size_t(bb) * t + p) * c + j] += wpe[std::size_t(p) * c + j];
  return y;
}

// Per-row cross-entropy over columns [0, v_valid) of logits[N, ld]:
// log sum_j exp(l_j) - l[target - vocab_start] (the target term is 0 when out of range).
inline Vec ref_xent(const Vec& logits, const std::vector<std::int32_t>& targets, int n, int ld,
                    int v_valid, int vocab_start) {
  Vec loss(n);
  for (int i = 0; i < n; i++) {
    const double* l = logits.data() + std::size_t(i) * ld;
    double mx = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < v_valid; j++) mx = std::max(mx, l[j]);
    double s = 0.0;
    for (int j = 0; j < v_valid; j++) s += std::exp(l[j] - mx);
    const int tg = targets[i] - vocab_start;
    loss[i] = std::log(s) + mx - ((tg >= 0 && tg < v_valid) ? l[tg] : 0.0);
  }
  return loss;
}

}  // namespace trident::test
