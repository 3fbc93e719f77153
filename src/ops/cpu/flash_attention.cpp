// ops/cpu/flash_attention.cpp — causal attention without a T x T buffer (FlashAttention-2's
// algorithm on the CPU). Forward: per (batch, head, query block), walk the key blocks up to
// the diagonal, S = scale q k^T (sgemm), online softmax (running max m and sum l per row,
// the partial output rescaled when m grows), acc += P v (sgemm); out = acc / l and
// lse = m + log l. Backward: per (batch, key/value head), for each of its query heads and
// query blocks, recompute P = exp(S - lse) tile by tile; with D = rowsum(dout * out):
//   dv += P^T dout,  dP = dout v^T,  dS = scale P (dP - D),  dq += dS k,  dk += dS^T q
// (five sgemms a tile). One task owns a key/value head's dk and dv, so nothing is shared
// between threads. Tiles above the diagonal are skipped; q, k, v are read in place.
// defines: CpuOps::attention_forward, CpuOps::attention_backward
#include "cpu_ops.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "trident/core/error.hpp"

namespace trident::ops::cpu {

namespace {

// Tile sizes: a [kQ, hs] query block against [kK, hs] key blocks; at hs = 64 the tiles of q,
// k, v, S and the accumulator (16 KiB each) stay in L2. At T = 2048, hs = 64, 2 threads
// (bench/trident_bench_attention) 64 x 64, 64 x 128, 128 x 64 and 128 x 128 came within the
// noise of a shared 2-core machine (0.7-1.1 s forward + backward, B = 1, 12 heads).
constexpr int kQ = 64;
constexpr int kK = 64;

void check_shape(const Ops::AttentionShape& s, const char* op) {
  TRIDENT_CHECK(s.b >= 0 && s.t >= 0 && s.hs > 0 && s.nh > 0 && s.nkv > 0 && s.nh % s.nkv == 0,
                op, ": bad shape (b ", s.b, ", t ", s.t, ", nh ", s.nh, ", nkv ", s.nkv, ", hs ",
                s.hs, "): nh must be a multiple of nkv");
}

void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
           float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, int(lda), b, int(ldb), beta, c,
              int(ldc));
}

// One tile of the forward's online softmax. s[nq, ld] holds scaled scores of queries
// i0.. against keys j0..j0+nk; row r may see keys j <= i0 + r. In place s becomes
// P = exp(s - m_new) (0 where masked); m, l are updated and corr[r] = exp(m_old - m_new)
// is what the row's accumulator must be multiplied by.
TRIDENT_SIMD_CLONES
void online_softmax_tile(float* s, int ld, int nq, int nk, int i0, int j0, float* m, float* l,
                         float* corr) {
  for (int r = 0; r < nq; r++) {
    float* sr = s + std::int64_t(r) * ld;
    const int n = std::min(nk, i0 + r - j0 + 1);  // visible keys of this row in the tile
    if (n <= 0) {
      for (int j = 0; j < nk; j++) sr[j] = 0.0f;
      corr[r] = 1.0f;
      continue;
    }
    float mx = m[r];
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < n; j++) mx = sr[j] > mx ? sr[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
      const float e = exp_approx(sr[j] - mx);
      sr[j] = e;
      sum += e;
    }
    for (int j = n; j < nk; j++) sr[j] = 0.0f;
    const float c = m[r] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m[r] - mx);
    corr[r] = c;
    l[r] = l[r] * c + sum;
    m[r] = mx;
  }
}

// Backward tile: s[nq, ld] (scaled scores) becomes P = exp(s - lse) (0 where masked), and
// dp[nq, ld] (= dout v^T) becomes dS = scale * P * (dp - D).
TRIDENT_SIMD_CLONES
void backward_tile(float* s, float* dp, int ld, int nq, int nk, int i0, int j0,
                   const float* lse, const float* delta, float scale) {
  for (int r = 0; r < nq; r++) {
    float* sr = s + std::int64_t(r) * ld;
    float* dr = dp + std::int64_t(r) * ld;
    const int n = std::max(0, std::min(nk, i0 + r - j0 + 1));
    const float lr = lse[r], dl = delta[r];
#pragma omp simd
    for (int j = 0; j < n; j++) {
      const float p = exp_approx(sr[j] - lr);
      sr[j] = p;
      dr[j] = scale * p * (dr[j] - dl);
    }
    for (int j = n; j < nk; j++) sr[j] = dr[j] = 0.0f;
  }
}

// Per-thread tiles, grown once and then reused (no allocation per call after the first).
struct Scratch {
  std::vector<float> s, dp, acc, m, l, corr;
  void reserve(int hs) {
    if (s.size() < std::size_t(kQ) * kK) {
      s.resize(std::size_t(kQ) * kK);
      dp.resize(std::size_t(kQ) * kK);
      m.resize(kQ);
      l.resize(kQ);
      corr.resize(kQ);
    }
    if (acc.size() < std::size_t(kQ) * hs) acc.resize(std::size_t(kQ) * hs);
  }
};
Scratch& scratch(int hs) {
  thread_local Scratch sc;
  sc.reserve(hs);
  return sc;
}

}  // namespace

void CpuOps::attention_forward(float* out, float* lse, const float* q, const float* k,
                               const float* v, const AttentionShape& sh) {
  check_shape(sh, "attention_forward");
  const int t = sh.t, hs = sh.hs, nh = sh.nh, group = sh.nh / sh.nkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int nqb = (t + kQ - 1) / kQ;
  const std::int64_t tasks = std::int64_t(sh.b) * nh * nqb;
  BlasThreads one(1);
  // Later query blocks see more keys: dynamic scheduling evens the causal triangle out.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_)
  for (std::int64_t task = 0; task < tasks; task++) {
    // the longest blocks first (task order: last query block of every head first)
    const int qb = nqb - 1 - int(task / (std::int64_t(sh.b) * nh));
    const int bh = int(task % (std::int64_t(sh.b) * nh));
    const int bb = bh / nh, h = bh % nh, kvh = h / group;
    const std::int64_t row0 = std::int64_t(bb) * t;
    const float* qh = q + row0 * sh.ld_q + std::int64_t(h) * hs;  // [T,hs] ld_q
    const float* kh = k + row0 * sh.ld_k + std::int64_t(kvh) * hs;
    const float* vh = v + row0 * sh.ld_v + std::int64_t(kvh) * hs;
    float* oh = out + row0 * sh.ld_o + std::int64_t(h) * hs;
    float* lh = lse + std::int64_t(bh) * t;
    Scratch& sc = scratch(hs);
    const int i0 = qb * kQ, nq = std::min(kQ, t - i0);
    std::fill(sc.m.begin(), sc.m.begin() + nq, -std::numeric_limits<float>::infinity());
    std::fill(sc.l.begin(), sc.l.begin() + nq, 0.0f);
    std::fill(sc.acc.begin(), sc.acc.begin() + std::int64_t(nq) * hs, 0.0f);
    const int kend = i0 + nq;  // causal: keys [0, last query of the block]
    for (int j0 = 0; j0 < kend; j0 += kK) {
      const int nk = std::min(kK, kend - j0);
      sgemm(CblasNoTrans, CblasTrans, nq, nk, hs, scale, qh + i0 * sh.ld_q, sh.ld_q,
            kh + j0 * sh.ld_k, sh.ld_k, 0.0f, sc.s.data(), kK);
      online_softmax_tile(sc.s.data(), kK, nq, nk, i0, j0, sc.m.data(), sc.l.data(),
                          sc.corr.data());
      if (j0 > 0)
        for (int r = 0; r < nq; r++) {
          const float c = sc.corr[r];
          if (c == 1.0f) continue;
          float* ar = sc.acc.data() + std::int64_t(r) * hs;
#pragma omp simd
          for (int d = 0; d < hs; d++) ar[d] *= c;
        }
      sgemm(CblasNoTrans, CblasNoTrans, nq, hs, nk, 1.0f, sc.s.data(), kK, vh + j0 * sh.ld_v,
            sh.ld_v, 1.0f, sc.acc.data(), hs);
    }
    for (int r = 0; r < nq; r++) {
      const float inv = 1.0f / sc.l[r];
      const float* ar = sc.acc.data() + std::int64_t(r) * hs;
      float* orow = oh + (i0 + r) * sh.ld_o;
#pragma omp simd
      for (int d = 0; d < hs; d++) orow[d] = ar[d] * inv;
      lh[i0 + r] = sc.m[r] + std::log(sc.l[r]);
    }
  }
}

void CpuOps::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* lse, const float* q,
                                const float* k, const float* v, const AttentionShape& sh) {
  check_shape(sh, "attention_backward");
  const int t = sh.t, hs = sh.hs, nh = sh.nh, nkv = sh.nkv, group = sh.nh / sh.nkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int tasks = sh.b * nkv;
  BlasThreads one(1);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_)
  for (int task = 0; task < tasks; task++) {
    const int bb = task / nkv, kvh = task % nkv;
    const std::int64_t row0 = std::int64_t(bb) * t;
    const float* kh = k + row0 * sh.ld_k + std::int64_t(kvh) * hs;
    const float* vh = v + row0 * sh.ld_v + std::int64_t(kvh) * hs;
    float* dkh = dk + row0 * sh.ld_k + std::int64_t(kvh) * hs;
    float* dvh = dv + row0 * sh.ld_v + std::int64_t(kvh) * hs;
    for (int i = 0; i < t; i++) {
      std::fill(dkh + i * sh.ld_k, dkh + i * sh.ld_k + hs, 0.0f);
      std::fill(dvh + i * sh.ld_v, dvh + i * sh.ld_v + hs, 0.0f);
    }
    Scratch& sc = scratch(hs);
    float* delta = sc.m.data();  // D per row of the query block
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
      const float* qh = q + row0 * sh.ld_q + std::int64_t(h) * hs;
      float* dqh = dq + row0 * sh.ld_q + std::int64_t(h) * hs;
      const float* doh = dout + row0 * sh.ld_o + std::int64_t(h) * hs;
      const float* oh = out + row0 * sh.ld_o + std::int64_t(h) * hs;
      const float* lh = lse + (std::int64_t(bb) * nh + h) * t;
      for (int i0 = 0; i0 < t; i0 += kQ) {
        const int nq = std::min(kQ, t - i0);
        for (int r = 0; r < nq; r++) {
          const float* dor = doh + (i0 + r) * sh.ld_o;
          const float* orow = oh + (i0 + r) * sh.ld_o;
          float d = 0.0f;
#pragma omp simd reduction(+ : d)
          for (int c = 0; c < hs; c++) d += dor[c] * orow[c];
          delta[r] = d;
          std::fill(dqh + (i0 + r) * sh.ld_q, dqh + (i0 + r) * sh.ld_q + hs, 0.0f);
        }
        const int kend = i0 + nq;
        for (int j0 = 0; j0 < kend; j0 += kK) {
          const int nk = std::min(kK, kend - j0);
          const float* qi = qh + i0 * sh.ld_q;
          const float* doi = doh + i0 * sh.ld_o;
          sgemm(CblasNoTrans, CblasTrans, nq, nk, hs, scale, qi, sh.ld_q, kh + j0 * sh.ld_k,
                sh.ld_k, 0.0f, sc.s.data(), kK);
          sgemm(CblasNoTrans, CblasTrans, nq, nk, hs, 1.0f, doi, sh.ld_o, vh + j0 * sh.ld_v,
                sh.ld_v, 0.0f, sc.dp.data(), kK);
          backward_tile(sc.s.data(), sc.dp.data(), kK, nq, nk, i0, j0, lh + i0, delta, scale);
          // dv[j] += P^T dout_i;  dq_i += dS k_j;  dk[j] += dS^T q_i
          sgemm(CblasTrans, CblasNoTrans, nk, hs, nq, 1.0f, sc.s.data(), kK, doi, sh.ld_o, 1.0f,
                dvh + j0 * sh.ld_v, sh.ld_v);
          sgemm(CblasNoTrans, CblasNoTrans, nq, hs, nk, 1.0f, sc.dp.data(), kK,
                kh + j0 * sh.ld_k, sh.ld_k, 1.0f, dqh + i0 * sh.ld_q, sh.ld_q);
          sgemm(CblasTrans, CblasNoTrans, nk, hs, nq, 1.0f, sc.dp.data(), kK, qi, sh.ld_q, 1.0f,
                dkh + j0 * sh.ld_k, sh.ld_k);
        }
      }
    }
  }
}

}  // namespace trident::ops::cpu
