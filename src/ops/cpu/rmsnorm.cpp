// ops/cpu/rmsnorm.cpp — RMSNorm over the last dimension (Llama), forward and backward.
// defines: CpuOps::rmsnorm_forward, CpuOps::rmsnorm_backward
#include "cpu_ops.hpp"

#include <omp.h>

#include <cmath>
#include <vector>

namespace trident::ops::cpu {

namespace {

// Rows [lo, hi) of the forward: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
TRIDENT_SIMD_CLONES
void rmsnorm_forward_rows(float* y, float* rstd, const float* x, const float* w, int c,
                          float eps, std::int64_t lo, std::int64_t hi) {
  for (std::int64_t i = lo; i < hi; i++) {
    const float* xr = x + i * c;
    float* yr = y + i * c;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < c; j++) ss += xr[j] * xr[j];
    const float rs = 1.0f / std::sqrt(ss / static_cast<float>(c) + eps);
#pragma omp simd
    for (int j = 0; j < c; j++) yr[j] = xr[j] * rs * w[j];
    if (rstd) rstd[i] = rs;
  }
}

// Rows [lo, hi) of the backward. With norm = x * rstd and dn = dy * w:
// dx += rstd * (dn - norm * mean(dn * norm)); dw (this thread's partial pdw) += dy * norm.
TRIDENT_SIMD_CLONES
void rmsnorm_backward_rows(float* dx, float* pdw, const float* dy, const float* x,
                           const float* w, const float* rstd, int c, std::int64_t lo,
                           std::int64_t hi) {
  for (std::int64_t i = lo; i < hi; i++) {
    const float* xr = x + i * c;
    const float* dyr = dy + i * c;
    float* dxr = dx + i * c;
    const float rs = rstd[i];
    float dnn = 0.0f;
#pragma omp simd reduction(+ : dnn)
    for (int j = 0; j < c; j++) dnn += w[j] * dyr[j] * (xr[j] * rs);
    const float dnn_mean = dnn / static_cast<float>(c);
#pragma omp simd
    for (int j = 0; j < c; j++) {
      const float norm = xr[j] * rs;
      pdw[j] += dyr[j] * norm;
      dxr[j] += (w[j] * dyr[j] - norm * dnn_mean) * rs;
    }
  }
}

}  // namespace

void CpuOps::rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int n,
                             int c, float eps) {
  parallel_slabs(team(std::int64_t(n) * c), n, 1, [&](std::int64_t lo, std::int64_t hi) {
    rmsnorm_forward_rows(y, rstd, x, w, c, eps, lo, hi);
  });
}

void CpuOps::rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x,
                              const float* w, const float* rstd, int n, int c) {
  const int nt = team(std::int64_t(n) * c);
  // dw: per-thread partials over contiguous row slabs, added in thread order (deterministic
  // for a given thread count), as layernorm_backward.
  std::vector<float> part(std::size_t(nt) * c, 0.0f);
#pragma omp parallel num_threads(nt)
  {
    const int tid = omp_get_thread_num();
    const int nteam = omp_get_num_threads();
    std::int64_t lo, hi;
    team_range(n, tid, nteam, 1, lo, hi);
    rmsnorm_backward_rows(dx, part.data() + std::size_t(tid) * c, dy, x, w, rstd, c, lo, hi);
#pragma omp barrier
    std::int64_t c0, c1;
    team_range(c, tid, nteam, 16, c0, c1);
    for (int p = 0; p < nteam; p++) {
      const float* q = part.data() + std::size_t(p) * c;
#pragma omp simd
      for (std::int64_t j = c0; j < c1; j++) dw[j] += q[j];
    }
  }
}

}  // namespace trident::ops::cpu
