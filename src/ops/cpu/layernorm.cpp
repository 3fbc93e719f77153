// ops/cpu/layernorm.cpp — LayerNorm over the last dimension (eps 1e-5), forward and backward.
// defines: CpuOps::layernorm_forward, CpuOps::layernorm_backward
#include "cpu_ops.hpp"

#include <omp.h>

#include <cmath>
#include <vector>

namespace trident::ops::cpu {

namespace {

// Rows [lo, hi) of the forward.
TRIDENT_SIMD_CLONES
void layernorm_forward_rows(float* y, float* mean, float* rstd, const float* x, const float* w,
                            const float* b, int c, std::int64_t lo, std::int64_t hi) {
  constexpr float kEps = 1e-5f;
  for (std::int64_t i = lo; i < hi; i++) {
    const float* xr = x + i * c;
    float* yr = y + i * c;
    // Two passes (mean, then the centred variance): no cancellation for rows with a large
    // mean, and the row is in L1 for the second pass anyway.
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < c; j++) s += xr[j];
    const float m = s / static_cast<float>(c);
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < c; j++) {
      const float d = xr[j] - m;
      ss += d * d;
    }
    const float rs = 1.0f / std::sqrt(ss / static_cast<float>(c) + kEps);
#pragma omp simd
    for (int j = 0; j < c; j++) yr[j] = (xr[j] - m) * rs * w[j] + b[j];
    if (mean) mean[i] = m;
    if (rstd) rstd[i] = rs;
  }
}

// Rows [lo, hi) of the backward: dx += (the residual stream); dw, db += into this thread's
// partials pdw, pdb.
TRIDENT_SIMD_CLONES
void layernorm_backward_rows(float* dx, float* pdw, float* pdb, const float* dy, const float* x,
                             const float* w, const float* mean, const float* rstd, int c,
                             std::int64_t lo, std::int64_t hi) {
  for (std::int64_t i = lo; i < hi; i++) {
    const float* xr = x + i * c;
    const float* dyr = dy + i * c;
    float* dxr = dx + i * c;
    const float m = mean[i], rs = rstd[i];
    // dnorm = dy * w; dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
    float dn_mean = 0.0f, dnn_mean = 0.0f;
#pragma omp simd reduction(+ : dn_mean, dnn_mean)
    for (int j = 0; j < c; j++) {
      const float norm = (xr[j] - m) * rs;
      const float dn = w[j] * dyr[j];
      dn_mean += dn;
      dnn_mean += dn * norm;
    }
    dn_mean /= static_cast<float>(c);
    dnn_mean /= static_cast<float>(c);
#pragma omp simd
    for (int j = 0; j < c; j++) {
      const float norm = (xr[j] - m) * rs;
      const float dn = w[j] * dyr[j];
      pdw[j] += dyr[j] * norm;
      pdb[j] += dyr[j];
      dxr[j] += (dn - dn_mean - norm * dnn_mean) * rs;
    }
  }
}

}  // namespace

void CpuOps::layernorm_forward(float* y, float* mean, float* rstd, const float* x,
                               const float* w, const float* b, int n, int c) {
  parallel_slabs(team(std::int64_t(n) * c), n, 1, [&](std::int64_t lo, std::int64_t hi) {
    layernorm_forward_rows(y, mean, rstd, x, w, b, c, lo, hi);
  });
}

void CpuOps::layernorm_backward(float* dx, float* dw, float* db, const float* dy,
                                const float* x, const float* w, const float* mean,
                                const float* rstd, int n, int c) {
  const int nt = team(std::int64_t(n) * c);
  // dw/db: each thread sums its rows into its own partial, then the partials are added in
  // thread order (deterministic for a given thread count).
  std::vector<float> part(std::size_t(nt) * 2 * c, 0.0f);
#pragma omp parallel num_threads(nt)
  {
    const int tid = omp_get_thread_num();
    const int nteam = omp_get_num_threads();
    std::int64_t lo, hi;
    team_range(n, tid, nteam, 1, lo, hi);
    float* pdw = part.data() + std::size_t(tid) * 2 * c;
    layernorm_backward_rows(dx, pdw, pdw + c, dy, x, w, mean, rstd, c, lo, hi);
#pragma omp barrier
    std::int64_t c0, c1;
    team_range(c, tid, nteam, 16, c0, c1);
    for (int p = 0; p < nteam; p++) {
      const float* q = part.data() + std::size_t(p) * 2 * c;
#pragma omp simd
      for (std::int64_t j = c0; j < c1; j++) {
        dw[j] += q[j];
        db[j] += q[c + j];
      }
    }
  }
}

}  // namespace trident::ops::cpu
