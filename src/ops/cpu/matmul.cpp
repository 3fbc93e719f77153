// ops/cpu/matmul.cpp — matrix products: gemm, linear forward/backward, all through
// OpenBLAS cblas_sgemm (row-major).
// defines: CpuOps::gemm, CpuOps::gemm_split, CpuOps::linear_forward, CpuOps::linear_backward
#include "cpu_ops.hpp"

#include <cblas.h>
#include <omp.h>

namespace trident::ops::cpu {

namespace {

// One row-major sgemm on the calling thread's share of the work.
void sgemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, lda, b,
              ldb, beta, c, ldc);
}

// Below this many flops a product is not worth splitting over threads.
constexpr double kSplitFlops = 2.0e6;

}  // namespace

void CpuOps::gemm_split(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
                        int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  BlasThreads one(1);
  const double flops = 2.0 * m * n * k;
  const int nt = (threads_ > 1 && flops >= kSplitFlops) ? threads_ : 1;
  if (nt == 1) {
    sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Split the longer side of C into one contiguous slab per thread. A row slab of C needs
  // the matching rows of op(A) (columns of A when transposed); a column slab needs the
  // matching columns of op(B).
  const bool split_rows = m >= n;
#pragma omp parallel num_threads(nt)
  {
    std::int64_t lo, hi;
    team_range(split_rows ? m : n, omp_get_thread_num(), omp_get_num_threads(), 16, lo, hi);
    if (hi > lo) {
      if (split_rows) {
        const float* as = ta ? a + lo : a + lo * lda;
        sgemm(ta, tb, hi - lo, n, k, alpha, as, lda, b, ldb, beta, c + lo * ldc, ldc);
      } else {
        const float* bs = tb ? b + lo * ldb : b + lo;
        sgemm(ta, tb, m, hi - lo, k, alpha, a, lda, bs, ldb, beta, c + lo, ldc);
      }
    }
  }
}

void CpuOps::gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                  int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  gemm_split(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void CpuOps::linear_forward(float* y, const float* x, const float* w, const float* b, int n,
                            int in, int out) {
  // y starts as the bias rows and the product is added (beta = 1): no second pass.
  if (b) {
#pragma omp parallel for num_threads(team(std::int64_t(n) * out))
    for (int i = 0; i < n; i++) {
      float* yr = y + std::int64_t(i) * out;
#pragma omp simd
      for (int j = 0; j < out; j++) yr[j] = b[j];
    }
  }
  gemm_split(false, false, n, out, in, 1.0f, x, in, w, out, b ? 1.0f : 0.0f, y, out);
}

void CpuOps::linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                             const float* w, int n, int in, int out) {
  // dx[N,in] = dy[N,out] @ w[in,out]^T
  if (dx) gemm_split(false, true, n, in, out, 1.0f, dy, out, w, out, 0.0f, dx, in);
  // dw[in,out] += x[N,in]^T @ dy[N,out]
  gemm_split(true, false, in, out, n, 1.0f, x, in, dy, out, 1.0f, dw, out);
  if (db) {
    // db[out] += column sums of dy: each thread owns a slab of columns and walks the rows
    // in order, so the sum does not depend on scheduling.
#pragma omp parallel num_threads(team(std::int64_t(n) * out))
    {
      std::int64_t lo, hi;
      team_range(out, omp_get_thread_num(), omp_get_num_threads(), 16, lo, hi);
      for (std::int64_t i = 0; i < n; i++) {
        const float* dyr = dy + i * out;
#pragma omp simd
        for (std::int64_t j = lo; j < hi; j++) db[j] += dyr[j];
      }
    }
  }
}

}  // namespace trident::ops::cpu
