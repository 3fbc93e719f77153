// ops/cpu/attention.cpp — causal multi-head self-attention, forward and backward.
// Per (batch, head): scores = q k^T / sqrt(hs) (sgemm), causal softmax, out = att v
// (sgemm); the backward is four more sgemms and the softmax Jacobian. q, k, v are read in
// place from qkv[B,T,3C] with leading dimension 3C (no copies).
// defines: CpuOps::attention_forward, CpuOps::attention_backward
#include "cpu_ops.hpp"

#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "trident/core/error.hpp"

namespace trident::ops::cpu {

namespace {

// Causal structure: the rows are cut into blocks of kRowBlock queries, and block
// [r0, r1) only multiplies keys [0, r1), which skips most of the upper triangle (the
// products that only produce masked zeros) while keeping each sgemm large enough. At
// T = 128, hs = 64 (2 threads): 64 beat 32, 16 and one full T x T product (fwd 1.0 ms vs
// 1.1 / 1.2 / 1.3 ms for B = 8, NH = 4).
constexpr int kRowBlock = 64;

void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
           const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// a[T,T] (scaled scores): row i becomes the softmax over keys 0..i (max subtracted), the
// rest of the row 0.
TRIDENT_SIMD_CLONES
void causal_softmax(float* a, int t) {
  for (int i = 0; i < t; i++) {
    float* ar = a + std::int64_t(i) * t;
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int j = 0; j <= i; j++) mx = ar[j] > mx ? ar[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j <= i; j++) {
      const float e = exp_approx(ar[j] - mx);
      ar[j] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j <= i; j++) ar[j] *= inv;
    for (int j = i + 1; j < t; j++) ar[j] = 0.0f;
  }
}

// Softmax backward in place on da[T,T] (= d att), with the score scale folded in:
// ds[i,j] = scale * att[i,j] (datt[i,j] - sum_k att[i,k] datt[i,k]) for j <= i, else 0.
TRIDENT_SIMD_CLONES
void causal_softmax_backward(float* da, const float* a, int t, float scale) {
  for (int i = 0; i < t; i++) {
    const float* ar = a + std::int64_t(i) * t;
    float* dr = da + std::int64_t(i) * t;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j <= i; j++) dot += ar[j] * dr[j];
#pragma omp simd
    for (int j = 0; j <= i; j++) dr[j] = scale * ar[j] * (dr[j] - dot);
    for (int j = i + 1; j < t; j++) dr[j] = 0.0f;
  }
}

}  // namespace

void CpuOps::attention_naive_forward(float* out, float* att, const float* qkv, int b, int t, int c,
                               int nh) {
  TRIDENT_CHECK(nh > 0 && c % nh == 0, "attention_forward: C = ", c,
                " is not a multiple of NH = ", nh);
  const int hs = c / nh;
  const int c3 = 3 * c;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // One (batch, head) per iteration, each with single-threaded sgemm: these products
  // (T x T x hs) are too small for OpenBLAS's own threads.
  BlasThreads one(1);
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int bh = 0; bh < b * nh; bh++) {
    const int bb = bh / nh, h = bh % nh;
    const float* q = qkv + std::int64_t(bb) * t * c3 + std::int64_t(h) * hs;  // [T,hs] ld 3C
    const float* k = q + c;
    const float* v = q + 2 * c;
    float* a = att + std::int64_t(bh) * t * t;                                // [T,T]
    float* o = out + std::int64_t(bb) * t * c + std::int64_t(h) * hs;        // [T,hs] ld C

    // scores[r0:r1, 0:r1] = scale * q[r0:r1] k[0:r1]^T
    for (int r0 = 0; r0 < t; r0 += kRowBlock) {
      const int r1 = r0 + kRowBlock < t ? r0 + kRowBlock : t;
      sgemm(CblasNoTrans, CblasTrans, r1 - r0, r1, hs, scale, q + std::int64_t(r0) * c3, c3, k,
            c3, 0.0f, a + std::int64_t(r0) * t, t);
    }
    causal_softmax(a, t);
    // out[r0:r1] = att[r0:r1, 0:r1] v[0:r1]
    for (int r0 = 0; r0 < t; r0 += kRowBlock) {
      const int r1 = r0 + kRowBlock < t ? r0 + kRowBlock : t;
      sgemm(CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f, a + std::int64_t(r0) * t, t, v,
            c3, 0.0f, o + std::int64_t(r0) * c, c);
    }
  }
}

void CpuOps::attention_naive_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                                const float* att, int b, int t, int c, int nh) {
  TRIDENT_CHECK(nh > 0 && c % nh == 0, "attention_backward: C = ", c,
                " is not a multiple of NH = ", nh);
  const int hs = c / nh;
  const int c3 = 3 * c;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  BlasThreads one(1);
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int bh = 0; bh < b * nh; bh++) {
    const int bb = bh / nh, h = bh % nh;
    const std::int64_t qoff = std::int64_t(bb) * t * c3 + std::int64_t(h) * hs;
    const float* q = qkv + qoff;
    const float* k = q + c;
    const float* v = q + 2 * c;
    float* dq = dqkv + qoff;
    float* dk = dq + c;
    float* dv = dq + 2 * c;
    const float* a = att + std::int64_t(bh) * t * t;
    float* da = datt + std::int64_t(bh) * t * t;
    const float* dout_bh = dout + std::int64_t(bb) * t * c + std::int64_t(h) * hs;  // ld C

    // datt[r0:r1, 0:r1] = dout[r0:r1] v[0:r1]^T
    for (int r0 = 0; r0 < t; r0 += kRowBlock) {
      const int r1 = r0 + kRowBlock < t ? r0 + kRowBlock : t;
      sgemm(CblasNoTrans, CblasTrans, r1 - r0, r1, hs, 1.0f, dout_bh + std::int64_t(r0) * c, c,
            v, c3, 0.0f, da + std::int64_t(r0) * t, t);
    }
    // dv[j0:j1] = att[j0:T, j0:j1]^T dout[j0:T]   (att is 0 above the diagonal)
    for (int j0 = 0; j0 < t; j0 += kRowBlock) {
      const int j1 = j0 + kRowBlock < t ? j0 + kRowBlock : t;
      sgemm(CblasTrans, CblasNoTrans, j1 - j0, hs, t - j0, 1.0f,
            a + std::int64_t(j0) * t + j0, t, dout_bh + std::int64_t(j0) * c, c, 0.0f,
            dv + std::int64_t(j0) * c3, c3);
    }
    causal_softmax_backward(da, a, t, scale);
    // dq[r0:r1] = ds[r0:r1, 0:r1] k[0:r1]
    for (int r0 = 0; r0 < t; r0 += kRowBlock) {
      const int r1 = r0 + kRowBlock < t ? r0 + kRowBlock : t;
      sgemm(CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f, da + std::int64_t(r0) * t, t, k,
            c3, 0.0f, dq + std::int64_t(r0) * c3, c3);
    }
    // dk[j0:j1] = ds[j0:T, j0:j1]^T q[j0:T]
    for (int j0 = 0; j0 < t; j0 += kRowBlock) {
      const int j1 = j0 + kRowBlock < t ? j0 + kRowBlock : t;
      sgemm(CblasTrans, CblasNoTrans, j1 - j0, hs, t - j0, 1.0f,
            da + std::int64_t(j0) * t + j0, t, q + std::int64_t(j0) * c3, c3, 0.0f,
            dk + std::int64_t(j0) * c3, c3);
    }
  }
}

}  // namespace trident::ops::cpu
