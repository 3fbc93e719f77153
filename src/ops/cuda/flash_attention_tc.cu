// ops/cuda/flash_attention_tc.cu — flash attention (FlashAttention-2) on tensor cores: the
// products in bf16 with fp32 accumulation through the warp matrix API (nvcuda::wmma,
// m16n16k16, sm_80+), softmax and outputs in fp32. The algorithm and the contract of
// flash_attention.cu (causal or full, grouped-query heads, row and batch strides,
// accumulate). The global element type is a template parameter: fp32 (q, k, v, dout, out in
// fp32, rounded to bf16 (nearest even) as their tiles are staged in shared memory; out, dq,
// dk, dv written in fp32) or bf16 bits (the bf16-I/O entry points, attention_bf16.cpp: the
// same tiles read without rounding, so the products are those of the fp32 instantiation on
// bf16-rounded inputs; out, dq, dk, dv rounded to bf16 as they are written). Head sizes
// multiples of 16 up to 128 (flash_tc_supported); kernels are built for head-size bounds D of 32, 64 and 128 and skip
// the 16-column slices beyond hs.
// Every warp owns 16 rows of its block's tile. WMMA's fragment layout is unspecified, so
// whatever is done per row (masking, the online softmax, rescaling the output accumulator,
// the final division) goes through shared memory: store_matrix_sync, __syncwarp, two lanes
// per row (each half of the columns), __syncwarp, load_matrix_sync.
//   forward   grid (query tiles of 64, B*NH), 4 warps: S = Q K^T per key tile (64 keys for
//             D <= 64, 32 for D = 128), online softmax, O = O corr + P V with O in
//             fragments; out = O / l, lse = m + log l.
//   dq        grid (query tiles of 64, B*NH), 4 warps, key tiles of 32: P = exp(S - lse),
//             dP = dO V^T, dS = scale P (dP - D), dq += dS K (D = rowsum(dout * out)).
//   dk, dv    grid (key tiles, B*NKV), one warp per 16 keys (64 keys for D <= 64, 32 for
//             D = 128), query tiles of 16 for each query head of the group: S^T = K Q^T,
//             dP^T = V dO^T, dv += P^T dO, dk += dS^T Q.
// Causal: key tiles past the query tile's last row (forward, dq) and query tiles before the
// key tile's first row (dk, dv) are skipped. No atomics; no device scratch.
// defines: flash_tc_supported, launch_flash_attention_tc_forward,
//          launch_flash_attention_tc_backward, launch_flash_attention_tc_forward_bf16,
//          launch_flash_attention_tc_backward_bf16
#include <cuda_bf16.h>
#include <mma.h>

#include "check.hpp"
#include "common.cuh"
#include "kernels.hpp"

namespace trident::ops::cuda {

namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

constexpr int kRowsPerWarp = 16;
constexpr int kQueryRows = 64;  // forward and dq: 4 warps
constexpr int kRowThreads = kQueryRows / kRowsPerWarp * 32;
constexpr int kDkvQueryRows = 16;  // dk, dv: the query tile
constexpr int kH = int(sizeof(bf16));
// Static shared memory per block (nvcc's limit); twice that where the CPU emulation stands a
// float in for bf16 (test/unit/ops/cuda/emulate, TRIDENT_EMU_BF16_EXACT).
constexpr int kSmemLimit = 48 * 1024 * kH / 2;

struct Dims {
  int t, nh, group, hs;
  long long ldq, ldk, ldv, ldo;
  long long bsq, bsk, bsv, bso, bslse;
  float scale;
  bool causal, accumulate;
};

Dims dims_of(const FlashShape& s) {
  return Dims{s.t,    s.nh,   s.nh / s.nkv, s.hs,   s.ld_q,  s.ld_k,
              s.ld_v, s.ld_o, s.bs_q,       s.bs_k, s.bs_v,  s.bs_o,
              s.bs_lse, 1.0f / sqrtf(float(s.hs)), s.causal, s.accumulate};
}

// The global element types: float, or Bf16Bits (bf16 stored as its 16 bits, what the
// bf16-I/O entry points take: std::uint16_t on the host). Read through float (a bf16 value
// widens exactly; rounding it to bf16 again is exact too), written rounded to nearest even
// (NaN stays a quiet NaN, as pointwise.cu's conversion). Going through float and the bits
// keeps the emulation's exact build (a float standing in for __nv_bfloat16) reading and
// writing real 16-bit storage.
using Bf16Bits = unsigned short;
__device__ __forceinline__ float load_elem(const float* p) { return *p; }
__device__ __forceinline__ float load_elem(const Bf16Bits* p) { return bf16_value(*p); }
__device__ __forceinline__ void store_elem(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_elem(Bf16Bits* p, float v) { *p = bf16_bits(v); }

// dst[r * ldd + c] = bf16(src[(row0 + r) * ld + c]) for r < rows, c < hs <= D (rows from t
// on: 0). All threads of the block, consecutive threads on consecutive columns.
template <int D, typename T>
__device__ __forceinline__ void stage_bf16(bf16* dst, int ldd, const T* src, long long ld,
                                           int row0, int rows, int t, int hs) {
  for (int x = threadIdx.x; x < rows * D; x += blockDim.x) {
    const int r = x / D, c = x % D;
    if (c >= hs) continue;
    const float v = row0 + r < t ? load_elem(src + (long long)(row0 + r) * ld + c) : 0.0f;
    dst[r * ldd + c] = __float2bfloat16_rn(v);
  }
}

// acc[n] += A B[:, 16n, 16n + 16) for the 16-column slices n below hs: A the warp's 16 rows
// of BC columns (row-major, ld lda), B BC rows of D columns (row-major, ld ldb). O += P V in
// the forward, dQ += dS K in the backward.
template <int D, int BC>
__device__ __forceinline__ void accumulate_product(FragAcc* acc, const bf16* a, int lda,
                                                   const bf16* b, int ldb, int hs) {
  FragA af[BC / 16];
#pragma unroll
  for (int c = 0; c < BC / 16; c++) wmma::load_matrix_sync(af[c], a + c * 16, lda);
#pragma unroll
  for (int n = 0; n < D / 16; n++) {
    if (n * 16 >= hs) break;
#pragma unroll
    for (int c = 0; c < BC / 16; c++) {
      FragBRow bf;
      wmma::load_matrix_sync(bf, b + c * 16 * ldb + n * 16, ldb);
      wmma::mma_sync(acc[n], af[c], bf, acc[n]);
    }
  }
}

// f[n] = columns [16n, 16n + 16) of the warp's 16 rows at `rows` (bf16, row-major, ld) for
// the slices n below hs: its query rows (q, dout) as the A operand of S = Q K^T, dP = dO V^T.
template <int D>
__device__ __forceinline__ void load_row_fragments(FragA (&f)[D / 16], const bf16* rows, int ld,
                                                   int hs) {
#pragma unroll
  for (int n = 0; n < D / 16; n++) {
    if (n * 16 >= hs) break;
    wmma::load_matrix_sync(f[n], rows + n * 16, ld);
  }
}

// The lane's row of its warp's 16, and which half of a row's columns it handles.
__device__ __forceinline__ int lane_row() { return (threadIdx.x % 32) >> 1; }
__device__ __forceinline__ int lane_half() { return threadIdx.x & 1; }

// f's row lane_row() multiplied by `factor` (each lane of a row pair passes the same factor),
// through the warp's 16 x 16 float staging tile at `stage` (leading dimension ld).
__device__ __forceinline__ void scale_rows(FragAcc& f, float* stage, int ld, float factor) {
  wmma::store_matrix_sync(stage, f, ld, wmma::mem_row_major);
  __syncwarp();
  float* r = stage + lane_row() * ld + lane_half() * 8;
#pragma unroll
  for (int c = 0; c < 8; c++) r[c] *= factor;
  __syncwarp();
  wmma::load_matrix_sync(f, stage, ld, wmma::mem_row_major);
  __syncwarp();  // every lane has read the staging tile before it is written again
}

// Row lane_row() of the fragments f[0 .. hs/16) (a warp's 16 x hs result) times `factor` to
// dst[c] (c < hs; added to it with `accumulate`), through the staging tile; `write` false for
// rows beyond t (the lane then only takes part in the warp's stores and barriers).
template <int D, typename T>
__device__ __forceinline__ void write_rows(T* dst, const FragAcc (&f)[D / 16], float* stage,
                                           int ld, int hs, float factor, bool write,
                                           bool accumulate) {
#pragma unroll
  for (int n = 0; n < D / 16; n++) {
    if (n * 16 >= hs) break;
    wmma::store_matrix_sync(stage, f[n], ld, wmma::mem_row_major);
    __syncwarp();
    if (write) {
      const float* r = stage + lane_row() * ld + lane_half() * 8;
      T* o = dst + n * 16 + lane_half() * 8;
#pragma unroll
      for (int c = 0; c < 8; c++)
        store_elem(o + c, accumulate ? load_elem(o + c) + r[c] * factor : r[c] * factor);
    }
    __syncwarp();
  }
}

// Shared memory of the forward: k, v tiles [BC][D + 8] bf16, then the work area: the scores
// [64][BC + 4] fp32 and P [64][BC + 8] bf16, or (before the loop) the q tile [64][D + 8] bf16.
// Rows padded 16 bytes (bank conflicts); every fragment pointer 32-byte aligned.
template <int D, int BC>
struct ForwardSmem {
  static constexpr int kLdH = D + 8, kLdS = BC + 4, kLdP = BC + 8;
  static constexpr int kKV = BC * kLdH * kH;
  static constexpr int kS = kQueryRows * kLdS * 4, kP = kQueryRows * kLdP * kH;
  static constexpr int kQ = kQueryRows * kLdH * kH;
  static constexpr int kWork = kS + kP > kQ ? kS + kP : kQ;
  static constexpr int kBytes = 2 * kKV + kWork;
  static_assert(kBytes <= kSmemLimit, "static shared memory over 48 KB");
  static_assert(kKV % 32 == 0 && kS % 32 == 0, "fragment alignment");
};

template <int D, int BC, typename T>
__global__ void __launch_bounds__(kRowThreads)
    flash_tc_forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v, Dims d) {
  using L = ForwardSmem<D, BC>;
  __shared__ __align__(32) unsigned char smem[L::kBytes];
  bf16* sk = reinterpret_cast<bf16*>(smem);
  bf16* sv = reinterpret_cast<bf16*>(smem + L::kKV);
  float* ss = reinterpret_cast<float*>(smem + 2 * L::kKV);
  bf16* sp = reinterpret_cast<bf16*>(smem + 2 * L::kKV + L::kS);
  bf16* sq = reinterpret_cast<bf16*>(smem + 2 * L::kKV);
  const int warp = threadIdx.x / 32, row = lane_row(), half = lane_half();
  const int bh = blockIdx.y, b = bh / d.nh, h = bh % d.nh, kvh = h / d.group;
  const int i0 = blockIdx.x * kQueryRows, i = i0 + warp * kRowsPerWarp + row;
  const T* kh = k + b * d.bsk + (long long)kvh * d.hs;
  const T* vh = v + b * d.bsv + (long long)kvh * d.hs;
  stage_bf16<D>(sq, L::kLdH, q + b * d.bsq + (long long)h * d.hs, d.ldq, i0, kQueryRows, d.t, d.hs);
  __syncthreads();
  FragA qf[D / 16];
  load_row_fragments<D>(qf, sq + warp * kRowsPerWarp * L::kLdH, L::kLdH, d.hs);
  FragAcc of[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; n++) wmma::fill_fragment(of[n], 0.0f);
  float* sw = ss + warp * kRowsPerWarp * L::kLdS;  // this warp's rows of the scores
  bf16* pw = sp + warp * kRowsPerWarp * L::kLdP;
  float m = -INFINITY, l = 0.0f;
  const int kend = !d.causal || d.t < i0 + kQueryRows ? d.t : i0 + kQueryRows;
  for (int j0 = 0; j0 < kend; j0 += BC) {
    __syncthreads();  // q's staging (first pass) and the previous tile's k, v, P are read
    stage_bf16<D>(sk, L::kLdH, kh, d.ldk, j0, BC, d.t, d.hs);
    stage_bf16<D>(sv, L::kLdH, vh, d.ldv, j0, BC, d.t, d.hs);
    __syncthreads();
    // S = Q K^T for the warp's 16 rows (K^T: k's rows read column-major)
#pragma unroll
    for (int n = 0; n < BC / 16; n++) {
      FragAcc s;
      wmma::fill_fragment(s, 0.0f);
#pragma unroll
      for (int c = 0; c < D / 16; c++) {
        if (c * 16 >= d.hs) break;
        FragBCol kf;
        wmma::load_matrix_sync(kf, sk + n * 16 * L::kLdH + c * 16, L::kLdH);
        wmma::mma_sync(s, qf[c], kf, s);
      }
      wmma::store_matrix_sync(sw + n * 16, s, L::kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax of row i over this lane's half of the tile's keys.
    constexpr int kHalf = BC / 2;
    float* srow = sw + row * L::kLdS + half * kHalf;
    bf16* prow = pw + row * L::kLdP + half * kHalf;
    const int jh = j0 + half * kHalf;
    float mx = -INFINITY;
#pragma unroll 8
    for (int c = 0; c < kHalf; c++) {
      const bool visible = (!d.causal || jh + c <= i) && jh + c < d.t;
      const float s = visible ? srow[c] * d.scale : -INFINITY;
      srow[c] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    const float m_new = fmaxf(m, mx);
    float sum = 0.0f;
#pragma unroll 8
    for (int c = 0; c < kHalf; c++) {
      const float p = srow[c] == -INFINITY ? 0.0f : expf(srow[c] - m_new);
      prow[c] = __float2bfloat16_rn(p);
      sum += p;
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
    l = l * corr + sum;
    m = m_new;
    __syncwarp();  // P complete; the scores' rows are free for staging
    // O *= corr row by row, unless O is still 0 (the first tile) or no row's max moved
    if (j0 > 0 && !__all_sync(kFullMask, corr == 1.0f)) {
#pragma unroll
      for (int n = 0; n < D / 16; n++) {
        if (n * 16 >= d.hs) break;
        scale_rows(of[n], sw, L::kLdS, corr);
      }
    }
    accumulate_product<D, BC>(of, pw, L::kLdP, sv, L::kLdH, d.hs);  // O += P V
  }
  const bool live = i < d.t;
  T* orow = out + b * d.bso + (long long)(live ? i : 0) * d.ldo + (long long)h * d.hs;
  write_rows<D>(orow, of, sw, L::kLdS, d.hs, 1.0f / l, live, false);
  if (live && half == 0) lse[(long long)bh * d.bslse + i] = m + logf(l);
}

// D = rowsum(dout * out) of query row i (0 from t on), over the `lanes` consecutive lanes
// of the row, each summing columns part, part + lanes, ... dout rounded to bf16 as in the
// products: sum_j P_ij dP_ij = D then holds up to P's rounding (out = P V with the same bf16
// v), so that dS = P (dP - D) does not carry dout's rounding (halves the gradients' error).
template <typename T>
__device__ __forceinline__ float row_delta(const T* dout, const T* out, const Dims& d, int b,
                                           int h, int i, int part, int lanes) {
  float s = 0.0f;
  if (i < d.t) {
    const long long o = b * d.bso + (long long)i * d.ldo + (long long)h * d.hs;
    for (int c = part; c < d.hs; c += lanes)
      s += __bfloat162float(__float2bfloat16_rn(load_elem(dout + o + c))) * load_elem(out + o + c);
  }
  for (int x = 1; x < lanes; x <<= 1) s += __shfl_xor_sync(kFullMask, s, x);
  return s;
}

// Shared memory of dq: k, v tiles [BC][D + 8] bf16; the work area: S and dP [64][BC + 4] fp32,
// dS [64][BC + 8] bf16, or (before the loop) the q or dout tile [64][D + 8] bf16.
template <int D, int BC>
struct DqSmem {
  static constexpr int kLdH = D + 8, kLdS = BC + 4, kLdP = BC + 8;
  static constexpr int kKV = BC * kLdH * kH;
  static constexpr int kS = kQueryRows * kLdS * 4, kP = kQueryRows * kLdP * kH;
  static constexpr int kQ = kQueryRows * kLdH * kH;
  static constexpr int kWork = 2 * kS + kP > kQ ? 2 * kS + kP : kQ;
  static constexpr int kBytes = 2 * kKV + kWork;
  static_assert(kBytes <= kSmemLimit, "static shared memory over 48 KB");
  static_assert(kKV % 32 == 0 && kS % 32 == 0, "fragment alignment");
};

template <int D, int BC, typename T>
__global__ void __launch_bounds__(kRowThreads)
    flash_tc_backward_dq_kernel(T* dq, const T* dout, const T* out, const float* lse,
                                const T* q, const T* k, const T* v, Dims d) {
  using L = DqSmem<D, BC>;
  __shared__ __align__(32) unsigned char smem[L::kBytes];
  bf16* sk = reinterpret_cast<bf16*>(smem);
  bf16* sv = reinterpret_cast<bf16*>(smem + L::kKV);
  float* ss = reinterpret_cast<float*>(smem + 2 * L::kKV);
  float* sdp = reinterpret_cast<float*>(smem + 2 * L::kKV + L::kS);
  bf16* sds = reinterpret_cast<bf16*>(smem + 2 * L::kKV + 2 * L::kS);
  bf16* stage = reinterpret_cast<bf16*>(smem + 2 * L::kKV);
  const int warp = threadIdx.x / 32, row = lane_row(), half = lane_half();
  const int bh = blockIdx.y, b = bh / d.nh, h = bh % d.nh, kvh = h / d.group;
  const int i0 = blockIdx.x * kQueryRows, i = i0 + warp * kRowsPerWarp + row;
  const T* kh = k + b * d.bsk + (long long)kvh * d.hs;
  const T* vh = v + b * d.bsv + (long long)kvh * d.hs;
  // q and dout tiles into fragments, one after the other through the work area
  FragA qf[D / 16], dof[D / 16];
  stage_bf16<D>(stage, L::kLdH, q + b * d.bsq + (long long)h * d.hs, d.ldq, i0, kQueryRows, d.t,
             d.hs);
  __syncthreads();
  load_row_fragments<D>(qf, stage + warp * kRowsPerWarp * L::kLdH, L::kLdH, d.hs);
  __syncthreads();
  stage_bf16<D>(stage, L::kLdH, dout + b * d.bso + (long long)h * d.hs, d.ldo, i0, kQueryRows, d.t,
             d.hs);
  __syncthreads();
  load_row_fragments<D>(dof, stage + warp * kRowsPerWarp * L::kLdH, L::kLdH, d.hs);
  const float delta = row_delta(dout, out, d, b, h, i, half, 2);
  const float lse_i = i < d.t ? lse[(long long)bh * d.bslse + i] : 0.0f;
  FragAcc acc[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; n++) wmma::fill_fragment(acc[n], 0.0f);
  float* sw = ss + warp * kRowsPerWarp * L::kLdS;
  float* dpw = sdp + warp * kRowsPerWarp * L::kLdS;
  bf16* dsw = sds + warp * kRowsPerWarp * L::kLdP;
  const int kend = !d.causal || d.t < i0 + kQueryRows ? d.t : i0 + kQueryRows;
  for (int j0 = 0; j0 < kend; j0 += BC) {
    __syncthreads();  // the staging (first pass) and the previous tile's k, dS are read
    stage_bf16<D>(sk, L::kLdH, kh, d.ldk, j0, BC, d.t, d.hs);
    stage_bf16<D>(sv, L::kLdH, vh, d.ldv, j0, BC, d.t, d.hs);
    __syncthreads();
    // S = Q K^T and dP = dO V^T for the warp's 16 rows
#pragma unroll
    for (int n = 0; n < BC / 16; n++) {
      FragAcc s, dp;
      wmma::fill_fragment(s, 0.0f);
      wmma::fill_fragment(dp, 0.0f);
#pragma unroll
      for (int c = 0; c < D / 16; c++) {
        if (c * 16 >= d.hs) break;
        FragBCol kf, vf;
        wmma::load_matrix_sync(kf, sk + n * 16 * L::kLdH + c * 16, L::kLdH);
        wmma::load_matrix_sync(vf, sv + n * 16 * L::kLdH + c * 16, L::kLdH);
        wmma::mma_sync(s, qf[c], kf, s);
        wmma::mma_sync(dp, dof[c], vf, dp);
      }
      wmma::store_matrix_sync(sw + n * 16, s, L::kLdS, wmma::mem_row_major);
      wmma::store_matrix_sync(dpw + n * 16, dp, L::kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    constexpr int kHalf = BC / 2;
    const float* srow = sw + row * L::kLdS + half * kHalf;
    const float* dprow = dpw + row * L::kLdS + half * kHalf;
    bf16* dsrow = dsw + row * L::kLdP + half * kHalf;
    const int jh = j0 + half * kHalf;
#pragma unroll 8
    for (int c = 0; c < kHalf; c++) {
      const bool visible = (!d.causal || jh + c <= i) && jh + c < d.t && i < d.t;
      const float p = visible ? expf(srow[c] * d.scale - lse_i) : 0.0f;
      dsrow[c] = __float2bfloat16_rn(d.scale * p * (dprow[c] - delta));
    }
    __syncwarp();
    accumulate_product<D, BC>(acc, dsw, L::kLdP, sk, L::kLdH, d.hs);  // dQ += dS K
  }
  __syncthreads();  // the work area is free (a block without key tiles never entered the loop)
  const bool live = i < d.t;
  T* dqr = dq + b * d.bsq + (long long)(live ? i : 0) * d.ldq + (long long)h * d.hs;
  write_rows<D>(dqr, acc, sw, L::kLdS, d.hs, 1.0f, live, d.accumulate);
}

// Shared memory of dk, dv (BK keys, BK / 16 warps, query tiles of 16): k, v [BK][D + 8] bf16
// for the whole kernel; per query tile q, dout [16][D + 8] bf16, S^T and dP^T [BK][20] fp32,
// P^T and dS^T [BK][24] bf16, lse and D of the 16 queries.
template <int D, int BK>
struct DkvSmem {
  static constexpr int kQ = kDkvQueryRows;
  static constexpr int kLdH = D + 8, kLdS = kQ + 4, kLdP = kQ + 8;
  static constexpr int kKV = BK * kLdH * kH, kQT = kQ * kLdH * kH;
  static constexpr int kS = BK * kLdS * 4, kP = BK * kLdP * kH;
  static constexpr int kBytes = 2 * kKV + 2 * kQT + 2 * kS + 2 * kP + 2 * kQ * 4;
  static_assert(kBytes <= kSmemLimit, "static shared memory over 48 KB");
  static_assert(kKV % 32 == 0 && kQT % 32 == 0 && kS % 32 == 0 && kP % 32 == 0,
                "fragment alignment");
};

template <int D, int BK, typename T>
__global__ void __launch_bounds__(BK * 2)
    flash_tc_backward_dkv_kernel(T* dk, T* dv, const T* dout, const T* out, const float* lse,
                                 const T* q, const T* k, const T* v, Dims d) {
  using L = DkvSmem<D, BK>;
  constexpr int kQ = L::kQ, kThreads = BK * 2, kLanes = kThreads / kQ;  // lanes per query row
  static_assert(kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "lanes of a row in one warp");
  __shared__ __align__(32) unsigned char smem[L::kBytes];
  unsigned char* p = smem;
  bf16* sk = reinterpret_cast<bf16*>(p);
  bf16* sv = reinterpret_cast<bf16*>(p += L::kKV);
  bf16* sq = reinterpret_cast<bf16*>(p += L::kKV);
  bf16* sdo = reinterpret_cast<bf16*>(p += L::kQT);
  float* ss = reinterpret_cast<float*>(p += L::kQT);
  float* sdp = reinterpret_cast<float*>(p += L::kS);
  bf16* sp = reinterpret_cast<bf16*>(p += L::kS);
  bf16* sds = reinterpret_cast<bf16*>(p += L::kP);
  float* slse = reinterpret_cast<float*>(p += L::kP);
  float* sdelta = slse + kQ;
  const int nkv = d.nh / d.group;
  const int bkv = blockIdx.y, b = bkv / nkv, kvh = bkv % nkv;
  const int warp = threadIdx.x / 32, row = lane_row(), half = lane_half();
  const int j0 = blockIdx.x * BK, j = j0 + warp * kRowsPerWarp + row;  // the lane's key
  stage_bf16<D>(sk, L::kLdH, k + b * d.bsk + (long long)kvh * d.hs, d.ldk, j0, BK, d.t, d.hs);
  stage_bf16<D>(sv, L::kLdH, v + b * d.bsv + (long long)kvh * d.hs, d.ldv, j0, BK, d.t, d.hs);
  FragAcc dkf[D / 16], dvf[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; n++) {
    wmma::fill_fragment(dkf[n], 0.0f);
    wmma::fill_fragment(dvf[n], 0.0f);
  }
  const bf16* kw = sk + warp * kRowsPerWarp * L::kLdH;
  const bf16* vw = sv + warp * kRowsPerWarp * L::kLdH;
  float* sw = ss + warp * kRowsPerWarp * L::kLdS;
  float* dpw = sdp + warp * kRowsPerWarp * L::kLdS;
  bf16* pw = sp + warp * kRowsPerWarp * L::kLdP;
  bf16* dsw = sds + warp * kRowsPerWarp * L::kLdP;
  for (int h = kvh * d.group; h < (kvh + 1) * d.group; h++) {
    const int bh = b * d.nh + h;
    const T* qh = q + b * d.bsq + (long long)h * d.hs;
    const T* doh = dout + b * d.bso + (long long)h * d.hs;
    // causal: the query tiles from the key tile's first row on
    for (int i0 = d.causal ? j0 : 0; i0 < d.t; i0 += kQ) {
      __syncthreads();  // the previous tile's q, dout, lse, D are read
      stage_bf16<D>(sq, L::kLdH, qh, d.ldq, i0, kQ, d.t, d.hs);
      stage_bf16<D>(sdo, L::kLdH, doh, d.ldo, i0, kQ, d.t, d.hs);
      {
        const int r = threadIdx.x / kLanes, part = threadIdx.x % kLanes;
        const float delta = row_delta(dout, out, d, b, h, i0 + r, part, kLanes);
        if (part == 0) {
          sdelta[r] = delta;
          slse[r] = i0 + r < d.t ? lse[(long long)bh * d.bslse + i0 + r] : 0.0f;
        }
      }
      __syncthreads();
      // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys (Q^T, dO^T: rows read
      // column-major)
      FragAcc s, dp;
      wmma::fill_fragment(s, 0.0f);
      wmma::fill_fragment(dp, 0.0f);
#pragma unroll
      for (int c = 0; c < D / 16; c++) {
        if (c * 16 >= d.hs) break;
        FragA kf, vf;
        FragBCol qf, dof;
        wmma::load_matrix_sync(kf, kw + c * 16, L::kLdH);
        wmma::load_matrix_sync(vf, vw + c * 16, L::kLdH);
        wmma::load_matrix_sync(qf, sq + c * 16, L::kLdH);
        wmma::load_matrix_sync(dof, sdo + c * 16, L::kLdH);
        wmma::mma_sync(s, kf, qf, s);
        wmma::mma_sync(dp, vf, dof, dp);
      }
      wmma::store_matrix_sync(sw, s, L::kLdS, wmma::mem_row_major);
      wmma::store_matrix_sync(dpw, dp, L::kLdS, wmma::mem_row_major);
      __syncwarp();
      {
        constexpr int kHalf = kQ / 2;
        const float* srow = sw + row * L::kLdS + half * kHalf;
        const float* dprow = dpw + row * L::kLdS + half * kHalf;
        bf16* prow = pw + row * L::kLdP + half * kHalf;
        bf16* dsrow = dsw + row * L::kLdP + half * kHalf;
#pragma unroll
        for (int c = 0; c < kHalf; c++) {
          const int qi = half * kHalf + c, i = i0 + qi;
          const bool visible = (!d.causal || j <= i) && i < d.t && j < d.t;
          const float pv = visible ? expf(srow[c] * d.scale - slse[qi]) : 0.0f;
          prow[c] = __float2bfloat16_rn(pv);
          dsrow[c] = __float2bfloat16_rn(d.scale * pv * (dprow[c] - sdelta[qi]));
        }
      }
      __syncwarp();
      // dV += P^T dO, dK += dS^T Q
      FragA pf, dsf;
      wmma::load_matrix_sync(pf, pw, L::kLdP);
      wmma::load_matrix_sync(dsf, dsw, L::kLdP);
#pragma unroll
      for (int n = 0; n < D / 16; n++) {
        if (n * 16 >= d.hs) break;
        FragBRow dof, qf;
        wmma::load_matrix_sync(dof, sdo + n * 16, L::kLdH);
        wmma::load_matrix_sync(qf, sq + n * 16, L::kLdH);
        wmma::mma_sync(dvf[n], pf, dof, dvf[n]);
        wmma::mma_sync(dkf[n], dsf, qf, dkf[n]);
      }
    }
  }
  const bool live = j < d.t;
  const long long jr = live ? j : 0;
  write_rows<D>(dk + b * d.bsk + jr * d.ldk + (long long)kvh * d.hs, dkf, sw, L::kLdS, d.hs,
                1.0f, live, d.accumulate);
  write_rows<D>(dv + b * d.bsv + jr * d.ldv + (long long)kvh * d.hs, dvf, sw, L::kLdS, d.hs,
                1.0f, live, d.accumulate);
}

// Key tiles: the forward's as large as 48 KB allow; dq's 32; dk, dv's 64 keys (4 warps) for
// D <= 64, 32 keys (2 warps) for D = 128.
template <int D>
struct Tiles {
  static constexpr int kForwardKeys = D <= 64 ? 64 : 32;
  static constexpr int kDqKeys = 32;
  static constexpr int kDkvKeys = D <= 64 ? 64 : 32;
};

template <int D, typename T>
void forward_for(cudaStream_t s, T* out, float* lse, const T* q, const T* k, const T* v,
                 const FlashShape& sh) {
  const dim3 grid((sh.t + kQueryRows - 1) / kQueryRows, sh.b * sh.nh);
  // through a pointer: the emulation's rewrite of launches (test/unit/ops/cuda/emulate) takes
  // a plain name before the launch brackets
  const auto tc_forward_kernel = &flash_tc_forward_kernel<D, Tiles<D>::kForwardKeys, T>;
  tc_forward_kernel<<<grid, kRowThreads, 0, s>>>(out, lse, q, k, v, dims_of(sh));
  check_launch("flash_tc_forward");
}

template <int D, typename T>
void backward_for(cudaStream_t s, T* dq, T* dk, T* dv, const T* dout, const T* out,
                  const float* lse, const T* q, const T* k, const T* v, const FlashShape& sh) {
  const Dims d = dims_of(sh);
  constexpr int kBk = Tiles<D>::kDkvKeys;
  const dim3 dq_grid((sh.t + kQueryRows - 1) / kQueryRows, sh.b * sh.nh);
  const auto tc_dq_kernel = &flash_tc_backward_dq_kernel<D, Tiles<D>::kDqKeys, T>;
  tc_dq_kernel<<<dq_grid, kRowThreads, 0, s>>>(dq, dout, out, lse, q, k, v, d);
  check_launch("flash_tc_backward_dq");
  const dim3 kv_grid((sh.t + kBk - 1) / kBk, sh.b * sh.nkv);
  const auto tc_dkv_kernel = &flash_tc_backward_dkv_kernel<D, kBk, T>;
  tc_dkv_kernel<<<kv_grid, kBk * 2, 0, s>>>(dk, dv, dout, out, lse, q, k, v, d);
  check_launch("flash_tc_backward_dkv");
}

// The head-size bound's instantiation for sh.hs (flash_tc_supported shapes).
template <typename T>
void forward_any(cudaStream_t s, T* out, float* lse, const T* q, const T* k, const T* v,
                 const FlashShape& sh) {
  if (sh.b <= 0 || sh.t <= 0) return;
  if (sh.hs <= 32)
    forward_for<32>(s, out, lse, q, k, v, sh);
  else if (sh.hs <= 64)
    forward_for<64>(s, out, lse, q, k, v, sh);
  else
    forward_for<128>(s, out, lse, q, k, v, sh);
}

template <typename T>
void backward_any(cudaStream_t s, T* dq, T* dk, T* dv, const T* dout, const T* out,
                  const float* lse, const T* q, const T* k, const T* v, const FlashShape& sh) {
  if (sh.b <= 0 || sh.t <= 0) return;
  if (sh.hs <= 32)
    backward_for<32>(s, dq, dk, dv, dout, out, lse, q, k, v, sh);
  else if (sh.hs <= 64)
    backward_for<64>(s, dq, dk, dv, dout, out, lse, q, k, v, sh);
  else
    backward_for<128>(s, dq, dk, dv, dout, out, lse, q, k, v, sh);
}

}  // namespace

bool flash_tc_supported(const FlashShape& s) {
  return s.hs > 0 && s.hs % 16 == 0 && s.hs <= 128;
}

void launch_flash_attention_tc_forward(cudaStream_t s, float* out, float* lse, const float* q,
                                       const float* k, const float* v, const FlashShape& sh) {
  forward_any(s, out, lse, q, k, v, sh);
}

void launch_flash_attention_tc_backward(cudaStream_t s, float* dq, float* dk, float* dv,
                                        const float* dout, const float* out, const float* lse,
                                        const float* q, const float* k, const float* v,
                                        const FlashShape& sh) {
  backward_any(s, dq, dk, dv, dout, out, lse, q, k, v, sh);
}

void launch_flash_attention_tc_forward_bf16(cudaStream_t s, std::uint16_t* out, float* lse,
                                            const std::uint16_t* q, const std::uint16_t* k,
                                            const std::uint16_t* v, const FlashShape& sh) {
  static_assert(sizeof(Bf16Bits) == sizeof(std::uint16_t), "bf16 storage is 16 bits");
  forward_any(s, reinterpret_cast<Bf16Bits*>(out), lse, reinterpret_cast<const Bf16Bits*>(q),
              reinterpret_cast<const Bf16Bits*>(k), reinterpret_cast<const Bf16Bits*>(v), sh);
}

void launch_flash_attention_tc_backward_bf16(cudaStream_t s, std::uint16_t* dq, std::uint16_t* dk,
                                             std::uint16_t* dv, const std::uint16_t* dout,
                                             const std::uint16_t* out, const float* lse,
                                             const std::uint16_t* q, const std::uint16_t* k,
                                             const std::uint16_t* v, const FlashShape& sh) {
  using B = Bf16Bits;
  backward_any(s, reinterpret_cast<B*>(dq), reinterpret_cast<B*>(dk), reinterpret_cast<B*>(dv),
               reinterpret_cast<const B*>(dout), reinterpret_cast<const B*>(out), lse,
               reinterpret_cast<const B*>(q), reinterpret_cast<const B*>(k),
               reinterpret_cast<const B*>(v), sh);
}

}  // namespace trident::ops::cuda
