// ops/cpu/pointwise.cpp — elementwise kernels (GELU, SwiGLU, add, scale, fill, copy), the sum of
// squares for the gradient norm, and AdamW.
// defines: CpuOps::gelu_forward, gelu_backward, swiglu_forward, swiglu_backward, add, scale,
//          sum_squares, fill, copy, adamw
#include "cpu_ops.hpp"

#include "trident/ops/adamw.hpp"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace trident::ops::cpu {

namespace {
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

// GELU (tanh form) written as y = x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3):
// 0.5 (1 + tanh u) = 1 / (1 + e^{-2u}). Same function, but 1 + tanh u never cancels for
// negative x, and it is one vectorizable exp.
TRIDENT_SIMD_CLONES
void gelu_forward_slab(float* y, const float* x, std::int64_t lo, std::int64_t hi) {
#pragma omp simd
  for (std::int64_t i = lo; i < hi; i++) {
    const float xi = x[i];
    const float u = kGeluS * (xi + kGeluC * xi * xi * xi);
    y[i] = xi / (1.0f + exp_approx(-2.0f * u));
  }
}

// d/dx x s(2u) = s + 2 x s (1 - s) u', with 1 - s = e s (e = e^{-2u}, no cancellation) and
// u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
TRIDENT_SIMD_CLONES
void gelu_backward_slab(float* dx, const float* x, const float* dy, std::int64_t lo,
                        std::int64_t hi) {
#pragma omp simd
  for (std::int64_t i = lo; i < hi; i++) {
    const float xi = x[i];
    const float u = kGeluS * (xi + kGeluC * xi * xi * xi);
    const float du = kGeluS * (1.0f + 3.0f * kGeluC * xi * xi);
    const float e = exp_approx(-2.0f * u);
    const float s = 1.0f / (1.0f + e);
    dx[i] = dy[i] * s * (1.0f + 2.0f * xi * e * s * du);
  }
}

// SwiGLU rows [lo, hi): y = silu(g) * u, silu(g) = g s, s = sigmoid(g) = 1 / (1 + e^-g).
TRIDENT_SIMD_CLONES
void swiglu_forward_rows(float* y, const float* gu, int f, std::int64_t lo, std::int64_t hi) {
  for (std::int64_t r = lo; r < hi; r++) {
    const float* g = gu + r * 2 * f;
    const float* u = g + f;
    float* yr = y + r * f;
#pragma omp simd
    for (int j = 0; j < f; j++) yr[j] = g[j] / (1.0f + exp_approx(-g[j])) * u[j];
  }
}

// dgate = dy u silu'(g), silu'(g) = s (1 + g (1 - s)) with 1 - s = e s (e = e^-g: no
// cancellation); dup = dy silu(g).
TRIDENT_SIMD_CLONES
void swiglu_backward_rows(float* dgu, const float* gu, const float* dy, int f, std::int64_t lo,
                          std::int64_t hi) {
  for (std::int64_t r = lo; r < hi; r++) {
    const float* g = gu + r * 2 * f;
    const float* u = g + f;
    const float* dyr = dy + r * f;
    float* dg = dgu + r * 2 * f;
    float* du = dg + f;
#pragma omp simd
    for (int j = 0; j < f; j++) {
      const float e = exp_approx(-g[j]);
      const float s = 1.0f / (1.0f + e);
      dg[j] = dyr[j] * u[j] * s * (1.0f + g[j] * e * s);
      du[j] = dyr[j] * g[j] * s;
    }
  }
}

}  // namespace

void CpuOps::swiglu_forward(float* y, const float* gu, int n, int f) {
  parallel_slabs(team(std::int64_t(n) * f), n, 1,
                 [&](std::int64_t lo, std::int64_t hi) { swiglu_forward_rows(y, gu, f, lo, hi); });
}

void CpuOps::swiglu_backward(float* dgu, const float* gu, const float* dy, int n, int f) {
  parallel_slabs(team(std::int64_t(n) * f), n, 1, [&](std::int64_t lo, std::int64_t hi) {
    swiglu_backward_rows(dgu, gu, dy, f, lo, hi);
  });
}

void CpuOps::gelu_forward(float* y, const float* x, std::int64_t n) {
  parallel_slabs(team(n), n, 16, [&](std::int64_t lo, std::int64_t hi) { gelu_forward_slab(y, x, lo, hi); });
}

void CpuOps::gelu_backward(float* dx, const float* x, const float* dy, std::int64_t n) {
  parallel_slabs(team(n), n, 16,
                 [&](std::int64_t lo, std::int64_t hi) { gelu_backward_slab(dx, x, dy, lo, hi); });
}

void CpuOps::add(float* y, const float* a, const float* b, std::int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(team(n))
  for (std::int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void CpuOps::scale(float* x, float alpha, std::int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(team(n))
  for (std::int64_t i = 0; i < n; i++) x[i] *= alpha;
}

void CpuOps::fill(float* x, float value, std::int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(team(n))
  for (std::int64_t i = 0; i < n; i++) x[i] = value;
}

// Round to nearest even on the bits (as __float2bfloat16_rn): add 0x7fff plus the lowest kept
// bit, truncate; a NaN keeps its sign and becomes a quiet NaN (rounding could make it inf).
void CpuOps::to_bf16(std::uint16_t* dst, const float* src, std::int64_t n) {
#pragma omp parallel for num_threads(team(n)) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, &src[i], sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
      dst[i] = std::uint16_t((u >> 16) | 0x0040u);
    else
      dst[i] = std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

void CpuOps::from_bf16(float* dst, const std::uint16_t* src, std::int64_t n) {
#pragma omp parallel for num_threads(team(n)) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t u = std::uint32_t(src[i]) << 16;
    std::memcpy(&dst[i], &u, sizeof u);
  }
}

void CpuOps::copy_rows(float* dst, std::int64_t ld_dst, const float* src, std::int64_t ld_src,
                       std::int64_t rows, std::int64_t width) {
  if (rows <= 0 || width <= 0) return;
#pragma omp parallel for schedule(static) num_threads(team(rows * width))
  for (std::int64_t r = 0; r < rows; r++)
    std::memcpy(dst + r * ld_dst, src + r * ld_src, std::size_t(width) * sizeof(float));
}

void CpuOps::copy(float* dst, const float* src, std::int64_t n) {
  if (n <= 0 || dst == src) return;
#pragma omp parallel num_threads(team(n))
  {
    std::int64_t lo, hi;
    team_range(n, omp_get_thread_num(), omp_get_num_threads(), 16, lo, hi);
    if (hi > lo) std::memcpy(dst + lo, src + lo, std::size_t(hi - lo) * sizeof(float));
  }
}

double CpuOps::sum_squares(const float* x, std::int64_t n) {
  // One partial per thread over a contiguous slab, added in thread order: the same result
  // on every call for a given thread count (the gradient norm feeds clipping).
  const int nt = team(n);
  std::vector<double> part(std::size_t(nt), 0.0);
#pragma omp parallel num_threads(nt)
  {
    std::int64_t lo, hi;
    team_range(n, omp_get_thread_num(), omp_get_num_threads(), 16, lo, hi);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (std::int64_t i = lo; i < hi; i++) s += double(x[i]) * double(x[i]);
    part[std::size_t(omp_get_thread_num())] = s;
  }
  double s = 0.0;
  for (double p : part) s += p;
  return s;
}

namespace {

TRIDENT_SIMD_CLONES
void adamw_slab(float* p, const float* g, float* m, float* v, float beta1, float beta2,
                float omb1, float omb2, float eps, float decay, float step, float bc2_sqrt,
                std::int64_t lo, std::int64_t hi) {
#pragma omp simd
  for (std::int64_t i = lo; i < hi; i++) {
    const float gi = g[i];
    const float mi = m[i] * beta1 + omb1 * gi;
    const float vi = v[i] * beta2 + omb2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step * (mi / denom);
  }
}

}  // namespace

// torch.optim.AdamW (single-tensor path) operation by operation, in float, with the
// scalar factors formed in double from the hyperparameters' decimals, as Python does:
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
void CpuOps::adamw(float* p, const float* g, float* m, float* v, std::int64_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, float bc1,
                   float bc2) {
  // torch forms 1 - beta2 in double from the decimal: 1 - double(0.999f) is 1.3e-5 away
  // from 1 - 0.999, which would put exp_avg_sq 1.3e-5 (relative) off torch's.
  const AdamWScalars s = adamw_scalars(lr, beta1, beta2, weight_decay, bc1, bc2);
  parallel_slabs(team(n), n, 16, [&](std::int64_t lo, std::int64_t hi) {
    adamw_slab(p, g, m, v, beta1, beta2, s.omb1, s.omb2, eps, s.decay, s.step, s.bc2_sqrt, lo,
               hi);
  });
}

}  // namespace trident::ops::cpu
