// ops/cpu/embedding.cpp — masked (vocab-parallel) token embedding and position embedding.
// defines: CpuOps::embedding_forward, embedding_backward, position_forward, position_backward
#include "cpu_ops.hpp"

#include <omp.h>

namespace trident::ops::cpu {

void CpuOps::embedding_forward(float* x, const std::int32_t* tokens, const float* wte, int n,
                               int c, int vocab_start, int v) {
#pragma omp parallel for schedule(static) num_threads(team(std::int64_t(n) * c))
  for (int i = 0; i < n; i++) {
    float* xr = x + std::int64_t(i) * c;
    const std::int64_t row = std::int64_t(tokens[i]) - vocab_start;
    if (row >= 0 && row < v) {
      const float* wr = wte + row * c;
#pragma omp simd
      for (int j = 0; j < c; j++) xr[j] = wr[j];
    } else {
#pragma omp simd
      for (int j = 0; j < c; j++) xr[j] = 0.0f;
    }
  }
}

void CpuOps::embedding_backward(float* dwte, const float* dx, const std::int32_t* tokens, int n,
                                int c, int vocab_start, int v) {
  // Repeated tokens hit the same row, so threads split the channels, not the tokens, and
  // each walks the tokens in order (race-free and deterministic).
#pragma omp parallel num_threads(team(std::int64_t(n) * c))
  {
    std::int64_t lo, hi;
    team_range(c, omp_get_thread_num(), omp_get_num_threads(), 16, lo, hi);
    for (int i = 0; i < n; i++) {
      const std::int64_t row = std::int64_t(tokens[i]) - vocab_start;
      if (row < 0 || row >= v) continue;
      float* dr = dwte + row * c;
      const float* gr = dx + std::int64_t(i) * c;
#pragma omp simd
      for (std::int64_t j = lo; j < hi; j++) dr[j] += gr[j];
    }
  }
}

void CpuOps::position_forward(float* x, const float* wpe, int b, int t, int c) {
#pragma omp parallel for schedule(static) num_threads(team(std::int64_t(b) * t * c))
  for (int r = 0; r < b * t; r++) {
    float* xr = x + std::int64_t(r) * c;
    const float* pr = wpe + std::int64_t(r % t) * c;
#pragma omp simd
    for (int j = 0; j < c; j++) xr[j] += pr[j];
  }
}

void CpuOps::position_backward(float* dwpe, const float* dx, int b, int t, int c) {
#pragma omp parallel for schedule(static) num_threads(team(std::int64_t(b) * t * c))
  for (int p = 0; p < t; p++) {
    float* dr = dwpe + std::int64_t(p) * c;
    for (int bb = 0; bb < b; bb++) {
      const float* gr = dx + (std::int64_t(bb) * t + p) * c;
#pragma omp simd
      for (int j = 0; j < c; j++) dr[j] += gr[j];
    }
  }
}

}  // namespace trident::ops::cpu
