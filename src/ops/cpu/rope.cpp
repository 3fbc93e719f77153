// ops/cpu/rope.cpp — rotary position embedding (Llama, rotate_half layout), in place, forward
// (rotation by +a) and backward (by -a, the transpose).
// defines: CpuOps::rope_forward, CpuOps::rope_backward
#include "cpu_ops.hpp"

#include "trident/core/error.hpp"

#include <omp.h>

#include <cmath>
#include <vector>

namespace trident::ops::cpu {

namespace {

// Positions t in [lo, hi): the angles of position pos0 + t are formed once, in double, and
// applied to every batch row and head of that position. sign = +1 rotates by a, -1 by -a.
TRIDENT_SIMD_CLONES
void rope_positions(float* x, const double* inv_freq, float* cs, float* sn, int b, int t,
                    int ld, int heads, int hs, int pos0, float sign, std::int64_t lo,
                    std::int64_t hi) {
  const int half = hs / 2;
  for (std::int64_t p = lo; p < hi; p++) {
    const double pos = double(pos0 + p);
    for (int i = 0; i < half; i++) {
      const double a = pos * inv_freq[i];
      cs[i] = static_cast<float>(std::cos(a));
      sn[i] = sign * static_cast<float>(std::sin(a));
    }
    for (int bb = 0; bb < b; bb++) {
      float* row = x + (std::int64_t(bb) * t + p) * ld;
      for (int h = 0; h < heads; h++) {
        float* x1 = row + std::int64_t(h) * hs;
        float* x2 = x1 + half;
#pragma omp simd
        for (int i = 0; i < half; i++) {
          const float u = x1[i], v = x2[i];
          x1[i] = u * cs[i] - v * sn[i];
          x2[i] = v * cs[i] + u * sn[i];
        }
      }
    }
  }
}

void rope(int nt, float* x, int b, int t, int ld, int heads, int hs,
          int pos0, float theta, float sign) {
  TRIDENT_CHECK(hs % 2 == 0, "rope: head size must be even, got ", hs);
  if (b <= 0 || t <= 0 || heads <= 0 || hs <= 0) return;
  const int half = hs / 2;
  // theta^(-2i/hs) as Hugging Face's inv_freq, but in double: the angle p * inv_freq reaches
  // thousands of radians, where a float's rounding would move sin and cos by ~1e-4.
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  for (int i = 0; i < half; i++) inv_freq[std::size_t(i)] = std::pow(double(theta), -2.0 * i / hs);
  std::vector<float> tables(std::size_t(nt) * 2 * half);
  parallel_slabs(nt, t, 1, [&](std::int64_t lo, std::int64_t hi) {
    float* cs = tables.data() + std::size_t(nt > 1 ? omp_get_thread_num() : 0) * 2 * half;
    rope_positions(x, inv_freq.data(), cs, cs + half, b, t, ld, heads, hs, pos0, sign, lo, hi);
  });
}

}  // namespace

void CpuOps::rope_forward(float* x, int b, int t, int ld, int heads, int hs, int pos0,
                          float theta) {
  rope(team(std::int64_t(b) * t * heads * hs), x, b, t, ld, heads, hs, pos0, theta, 1.0f);
}

void CpuOps::rope_backward(float* dx, int b, int t, int ld, int heads, int hs, int pos0,
                           float theta) {
  rope(team(std::int64_t(b) * t * heads * hs), dx, b, t, ld, heads, hs, pos0, theta,
       -1.0f);
}

}  // namespace trident::ops::cpu
