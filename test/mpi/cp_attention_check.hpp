// test/mpi/cp_attention_check.hpp — what the context-parallel attention tests
// (ring_attention_test.cpp, ulysses_attention_test.cpp) share: the whole-sequence inputs they
// draw and the reference's rows at a rank's global positions, and the error measure.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace cp_attention_check {

using FVec = std::vector<float>;

inline FVec normal(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  FVec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// The rows of a [B, T, ld] tensor at `pos` of every sequence: [B, pos.size(), ld].
inline FVec gather_rows(const FVec& x, int b, int t, std::int64_t ld, const std::vector<int>& pos) {
  FVec r;
  for (int bb = 0; bb < b; bb++)
    for (int p : pos) {
      const float* row = x.data() + (std::int64_t(bb) * t + p) * ld;
      r.insert(r.end(), row, row + ld);
    }
  return r;
}
// lse [B, NH, T] at `pos`: [B, NH, pos.size()].
inline FVec gather_lse(const FVec& x, int b, int nh, int t, const std::vector<int>& pos) {
  FVec r;
  for (int bh = 0; bh < b * nh; bh++)
    for (int p : pos) r.push_back(x[std::size_t(bh) * t + p]);
  return r;
}

// max |got - want| over the head columns (width) of rows of stride ld; *scale: max |want|.
inline double max_err(const FVec& got, const FVec& want, std::int64_t ld, std::int64_t width,
                      double* scale = nullptr) {
  double e = 0, m = 0;
  for (std::size_t row = 0; row < want.size() / std::size_t(ld); row++)
    for (std::int64_t c = 0; c < width; c++) {
      const std::size_t i = row * ld + c;
      e = std::max(e, double(std::fabs(got[i] - want[i])));
      m = std::max(m, double(std::fabs(want[i])));
    }
  if (scale) *scale = m;
  return e;
}

}  // namespace cp_attention_check
