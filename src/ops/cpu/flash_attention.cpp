// ops/cpu/flash_attention.cpp — causal attention without a T x T buffer (FlashAttention-2's
// algorithm on the CPU). Forward: per (batch, head, query block), walk the key blocks up to
// the diagonal, S = scale q k^T, online softmax (running max m and sum l per row,
// the partial output rescaled when m grows), acc += P v; out = acc / l and
// lse = m + log l. Backward: per (batch, key/value head), for each of its query heads and
// query blocks, recompute P = exp(S - lse) tile by tile; with D = rowsum(dout * out):
//   dv += P^T dout,  dP = dout v^T,  dS = scale P (dP - D),  dq += dS k,  dk += dS^T q
// (five tile products, tile_gemm: a register-blocked loop the compiler vectorises). One task owns a key/value head's dk and dv, so nothing is shared
// between threads. Tiles above the diagonal are skipped; q, k, v are read in place. Without
// the causal mask (ring attention's blocks against earlier keys) every tile is whole; with
// shape.accumulate the backward adds to dq, dk, dv.
// defines: CpuOps::attention_forward, CpuOps::attention_backward, CpuOps::attention_merge
#include "cpu_ops.hpp"

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

// c[m, n] = alpha * a[m, k] b[k, n] + (accumulate ? c : 0), for the tile products. a's element
// (i, p) is a[i * a_row + p * a_col] (so a may be read transposed in place), b and c are
// row-major. Four rows by 64 columns of c stay in registers (16 AVX-512 registers) while p
// runs; at hs = 64 this beat OpenBLAS's sgemm on the same 64 x 64 tiles (which packs both
// operands on every call). Other widths take the one-row loop.
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));

TRIDENT_SIMD_CLONES
void tile_gemm(int m, int n, int k, float alpha, const float* __restrict a, std::int64_t a_row,
               std::int64_t a_col, const float* __restrict b, std::int64_t ldb, bool accumulate,
               float* __restrict c, std::int64_t ldc) {
  constexpr int kW = 64;
  for (int j0 = 0; j0 < n; j0 += kW) {
    const int w = std::min(kW, n - j0);
    int i = 0;
    if (w == kW)
      for (; i + 4 <= m; i += 4) {
        // 16-float vectors (GCC vector extension; one AVX-512 register, two AVX2 ones):
        // written out because GCC spilled a float[4][64] accumulator to the stack
        v16 acc[4][4] = {};
        const float* a0 = a + std::int64_t(i) * a_row;
        for (int p = 0; p < k; p++) {
          const v16u* bp = reinterpret_cast<const v16u*>(b + std::int64_t(p) * ldb + j0);
          const v16 b0 = bp[0], b1 = bp[1], b2 = bp[2], b3 = bp[3];
          const float* ap = a0 + p * a_col;
          for (int r = 0; r < 4; r++) {
            const float x = ap[r * a_row];
            acc[r][0] += x * b0;
            acc[r][1] += x * b1;
            acc[r][2] += x * b2;
            acc[r][3] += x * b3;
          }
        }
        for (int r = 0; r < 4; r++) {
          v16u* cr = reinterpret_cast<v16u*>(c + std::int64_t(i + r) * ldc + j0);
          for (int q = 0; q < 4; q++) cr[q] = accumulate ? cr[q] + alpha * acc[r][q] : alpha * acc[r][q];
        }
      }
    for (; i < m; i++) {
      float acc[kW] = {};
      const float* ai = a + std::int64_t(i) * a_row;
      for (int p = 0; p < k; p++) {
        const float* bp = b + std::int64_t(p) * ldb + j0;
        const float x = ai[p * a_col];
        for (int j = 0; j < w; j++) acc[j] += x * bp[j];
      }
      float* cr = c + std::int64_t(i) * ldc + j0;
      if (accumulate)
        for (int j = 0; j < w; j++) cr[j] += alpha * acc[j];
      else
        for (int j = 0; j < w; j++) cr[j] = alpha * acc[j];
    }
  }
}

// dst[c, j] = src row j0 + j, column c (j < n; 0 for n <= j < width): kK keys of a head
// transposed, so that q k^T is a product with b read row by row.
void pack_transposed(float* dst, std::int64_t width, const float* src, std::int64_t ld, int n,
                     int hs) {
  for (int c = 0; c < hs; c++) {
    float* d = dst + c * width;
    for (int j = 0; j < n; j++) d[j] = src[j * ld + c];
    for (std::int64_t j = n; j < width; j++) d[j] = 0.0f;
  }
}

// Keys of a tile that row r (query i0 + r) sees: those j <= i0 + r when causal, else all nk.
inline int visible_keys(bool causal, int nk, int i0, int r, int j0) {
  return causal ? std::max(0, std::min(nk, i0 + r - j0 + 1)) : nk;
}

// One tile of the forward's online softmax. s[nq, ld] holds scaled scores of queries
// i0.. against keys j0..j0+nk; row r may see keys visible_keys(..). In place s becomes
// P = exp(s - m_new) (0 where masked); m, l are updated and corr[r] = exp(m_old - m_new)
// is what the row's accumulator must be multiplied by.
TRIDENT_SIMD_CLONES
void online_softmax_tile(float* s, int ld, int nq, int nk, int i0, int j0, bool causal, float* m,
                         float* l, float* corr) {
  for (int r = 0; r < nq; r++) {
    float* sr = s + std::int64_t(r) * ld;
    const int n = visible_keys(causal, nk, i0, r, j0);
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
void backward_tile(float* s, float* dp, int ld, int nq, int nk, int i0, int j0, bool causal,
                   const float* lse, const float* delta, float scale) {
  for (int r = 0; r < nq; r++) {
    float* sr = s + std::int64_t(r) * ld;
    float* dr = dp + std::int64_t(r) * ld;
    const int n = visible_keys(causal, nk, i0, r, j0);
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
  std::vector<float> s, dp, acc, m, l, corr, kt, vt;
  void reserve(int hs) {
    if (s.size() < std::size_t(kQ) * kK) {
      s.resize(std::size_t(kQ) * kK);
      dp.resize(std::size_t(kQ) * kK);
      m.resize(kQ);
      l.resize(kQ);
      corr.resize(kQ);
    }
    if (acc.size() < std::size_t(kQ) * hs) acc.resize(std::size_t(kQ) * hs);
    if (kt.size() < std::size_t(kK) * hs) kt.resize(std::size_t(kK) * hs);
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
  // Later query blocks see more keys: dynamic scheduling evens the causal triangle out.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_)
  for (std::int64_t task = 0; task < tasks; task++) {
    // the longest blocks first (task order: last query block of every head first)
    const int qb = nqb - 1 - int(task / (std::int64_t(sh.b) * nh));
    const int bh = int(task % (std::int64_t(sh.b) * nh));
    const int bb = bh / nh, h = bh % nh, kvh = h / group;
    const float* qh = q + bb * sh.batch_q() + std::int64_t(h) * hs;  // [T,hs] ld_q
    const float* kh = k + bb * sh.batch_k() + std::int64_t(kvh) * hs;
    const float* vh = v + bb * sh.batch_v() + std::int64_t(kvh) * hs;
    float* oh = out + bb * sh.batch_o() + std::int64_t(h) * hs;
    float* lh = lse + std::int64_t(bh) * sh.lse_row();
    Scratch& sc = scratch(hs);
    const int i0 = qb * kQ, nq = std::min(kQ, t - i0);
    std::fill(sc.m.begin(), sc.m.begin() + nq, -std::numeric_limits<float>::infinity());
    std::fill(sc.l.begin(), sc.l.begin() + nq, 0.0f);
    std::fill(sc.acc.begin(), sc.acc.begin() + std::int64_t(nq) * hs, 0.0f);
    const int kend = sh.causal ? i0 + nq : t;  // causal: keys [0, last query of the block]
    for (int j0 = 0; j0 < kend; j0 += kK) {
      const int nk = std::min(kK, kend - j0);
      pack_transposed(sc.kt.data(), kK, kh + j0 * sh.ld_k, sh.ld_k, nk, hs);
      tile_gemm(nq, kK, hs, scale, qh + i0 * sh.ld_q, sh.ld_q, 1, sc.kt.data(), kK, false,
                sc.s.data(), kK);
      online_softmax_tile(sc.s.data(), kK, nq, nk, i0, j0, sh.causal, sc.m.data(), sc.l.data(),
                          sc.corr.data());
      if (j0 > 0)
        for (int r = 0; r < nq; r++) {
          const float c = sc.corr[r];
          if (c == 1.0f) continue;
          float* ar = sc.acc.data() + std::int64_t(r) * hs;
#pragma omp simd
          for (int d = 0; d < hs; d++) ar[d] *= c;
        }
      tile_gemm(nq, hs, nk, 1.0f, sc.s.data(), kK, 1, vh + j0 * sh.ld_v, sh.ld_v, true,
                sc.acc.data(), hs);
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
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_)
  for (int task = 0; task < tasks; task++) {
    const int bb = task / nkv, kvh = task % nkv;
    const float* kh = k + bb * sh.batch_k() + std::int64_t(kvh) * hs;
    const float* vh = v + bb * sh.batch_v() + std::int64_t(kvh) * hs;
    float* dkh = dk + bb * sh.batch_k() + std::int64_t(kvh) * hs;
    float* dvh = dv + bb * sh.batch_v() + std::int64_t(kvh) * hs;
    if (!sh.accumulate)
      for (int i = 0; i < t; i++) {
        std::fill(dkh + i * sh.ld_k, dkh + i * sh.ld_k + hs, 0.0f);
        std::fill(dvh + i * sh.ld_v, dvh + i * sh.ld_v + hs, 0.0f);
      }
    Scratch& sc = scratch(hs);
    // k and v of this head transposed once ([hs, tp], zero past t), read by every query block
    const std::int64_t tp = (std::int64_t(t) + kK - 1) / kK * kK;
    if (sc.kt.size() < std::size_t(tp * hs)) sc.kt.resize(std::size_t(tp * hs));
    if (sc.vt.size() < std::size_t(tp * hs)) sc.vt.resize(std::size_t(tp * hs));
    pack_transposed(sc.kt.data(), tp, kh, sh.ld_k, t, hs);
    pack_transposed(sc.vt.data(), tp, vh, sh.ld_v, t, hs);
    float* delta = sc.m.data();  // D per row of the query block
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
      const float* qh = q + bb * sh.batch_q() + std::int64_t(h) * hs;
      float* dqh = dq + bb * sh.batch_q() + std::int64_t(h) * hs;
      const float* doh = dout + bb * sh.batch_o() + std::int64_t(h) * hs;
      const float* oh = out + bb * sh.batch_o() + std::int64_t(h) * hs;
      const float* lh = lse + (std::int64_t(bb) * nh + h) * sh.lse_row();
      for (int i0 = 0; i0 < t; i0 += kQ) {
        const int nq = std::min(kQ, t - i0);
        for (int r = 0; r < nq; r++) {
          const float* dor = doh + (i0 + r) * sh.ld_o;
          const float* orow = oh + (i0 + r) * sh.ld_o;
          float d = 0.0f;
#pragma omp simd reduction(+ : d)
          for (int c = 0; c < hs; c++) d += dor[c] * orow[c];
          delta[r] = d;
          if (!sh.accumulate)
            std::fill(dqh + (i0 + r) * sh.ld_q, dqh + (i0 + r) * sh.ld_q + hs, 0.0f);
        }
        const int kend = sh.causal ? i0 + nq : t;
        for (int j0 = 0; j0 < kend; j0 += kK) {
          const int nk = std::min(kK, kend - j0);
          const float* qi = qh + i0 * sh.ld_q;
          const float* doi = doh + i0 * sh.ld_o;
          tile_gemm(nq, kK, hs, scale, qi, sh.ld_q, 1, sc.kt.data() + j0, tp, false,
                    sc.s.data(), kK);
          tile_gemm(nq, kK, hs, 1.0f, doi, sh.ld_o, 1, sc.vt.data() + j0, tp, false,
                    sc.dp.data(), kK);
          backward_tile(sc.s.data(), sc.dp.data(), kK, nq, nk, i0, j0, sh.causal, lh + i0, delta,
                        scale);
          // dv[j] += P^T dout_i;  dk[j] += dS^T q_i (P and dS read transposed in place);
          // dq_i += dS k_j
          tile_gemm(nk, hs, nq, 1.0f, sc.s.data(), 1, kK, doi, sh.ld_o, true,
                    dvh + j0 * sh.ld_v, sh.ld_v);
          tile_gemm(nk, hs, nq, 1.0f, sc.dp.data(), 1, kK, qi, sh.ld_q, true,
                    dkh + j0 * sh.ld_k, sh.ld_k);
          tile_gemm(nq, hs, nk, 1.0f, sc.dp.data(), kK, 1, kh + j0 * sh.ld_k, sh.ld_k, true,
                    dqh + i0 * sh.ld_q, sh.ld_q);
        }
      }
    }
  }
}

void CpuOps::attention_merge(float* out, float* lse, const float* out_part,
                             const float* lse_part, const AttentionShape& sh) {
  check_shape(sh, "attention_merge");
  const int t = sh.t, hs = sh.hs, nh = sh.nh;
  const std::int64_t rows = std::int64_t(sh.b) * nh;
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (std::int64_t bh = 0; bh < rows; bh++) {
    const std::int64_t bb = bh / nh, h = bh % nh;
    float* lh = lse + bh * sh.lse_row();
    const float* lp = lse_part + bh * sh.lse_row();
    for (int i = 0; i < t; i++) {
      const std::int64_t o = bb * sh.batch_o() + i * sh.ld_o + h * hs;
      const float a = lh[i], b = lp[i];
      constexpr float kNone = -std::numeric_limits<float>::infinity();
      float* orow = out + o;
      const float* prow = out_part + o;
      if (b == kNone) continue;
      if (a == kNone) {  // no keys yet: out may hold anything
        std::copy(prow, prow + hs, orow);
        lh[i] = b;
        continue;
      }
      const float mx = std::max(a, b);
      const float wa = std::exp(a - mx), wb = std::exp(b - mx);
      const float sum = wa + wb, ca = wa / sum, cb = wb / sum;
      for (int d = 0; d < hs; d++) orow[d] = ca * orow[d] + cb * prow[d];
      lh[i] = mx + std::log(sum);
    }
  }
}

}  // namespace trident::ops::cpu
