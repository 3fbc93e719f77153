// ops/cuda/flash_attention.cu — causal attention without a T x T buffer, the algorithm of
// ops/cpu/flash_attention.cpp (FlashAttention-2) as CUDA kernels, fp32 throughout.
// A block of kThreads threads works on kRows rows (queries, or keys in dk/dv), kLanes threads
// per row; each lane holds hs / kLanes columns of the row's accumulator in registers. Tiles of
// q, k, v and dout are staged in shared memory, padded one column against bank conflicts.
//   forward      grid (query tiles, B*NH): online softmax over the key tiles up to the
//                diagonal; out = acc / l, lse = m + log l.
//   backward dq  grid (query tiles, B*NH): P = exp(S - lse), dS = scale P (dout v^T - D),
//                dq = dS k, with D = rowsum(dout * out) computed per row.
//   backward dkv grid (key tiles, B*NKV): for each query head of the group and each query
//                tile from the diagonal on, dv += P^T dout, dk += dS^T q.
// No atomics: each output row belongs to one block, so results do not depend on timing.
// Without the causal mask (ring attention's blocks against earlier keys) every key tile is
// visited; with shape.accumulate the backward adds to dq, dk, dv. attention_merge folds a
// partial (out, lse) into a running one, one thread per row.
// defines: launch_flash_attention_forward, launch_flash_attention_backward,
//          launch_attention_merge
#include "check.hpp"
#include "common.cuh"
#include "kernels.hpp"

namespace trident::ops::cuda {

namespace {

constexpr int kRows = 16;                 // rows of a tile
constexpr int kLanes = 8;                 // threads per row
constexpr int kThreads = kRows * kLanes;  // 128
constexpr int kPad = kFlashMaxHeadSize + 1;
constexpr int kCols = kFlashMaxHeadSize / kLanes;  // accumulator columns per thread
constexpr int kPerRow = kRows / kLanes;            // tile entries per thread and row

struct Dims {
  int t, nh, group, hs;
  long long ldq, ldk, ldv, ldo;
  long long bsq, bsk, bsv, bso, bslse;  // batch strides; lse's (batch, head) row stride
  float scale;
  bool causal, accumulate;
};

// Sum over the kLanes threads of a row (consecutive lanes of one warp).
__device__ __forceinline__ float row_sum(float v) {
  for (int o = 1; o < kLanes; o <<= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float row_max(float v) {
  for (int o = 1; o < kLanes; o <<= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// tile[r][c] = src[(row0 + r) * ld + c] for rows below t, else 0.
__device__ __forceinline__ void load_tile(float (*tile)[kPad], const float* src, long long ld,
                                          int row0, int t, int hs) {
  for (int x = threadIdx.x; x < kRows * hs; x += kThreads) {
    const int r = x / hs, c = x % hs;
    tile[r][c] = row0 + r < t ? src[(long long)(row0 + r) * ld + c] : 0.0f;
  }
}

__device__ __forceinline__ float dot_rows(const float* a, const float* b, int hs) {
  float s = 0.0f;
  for (int c = 0; c < hs; c++) s += a[c] * b[c];
  return s;
}

// acc[cc] += sum over j < kRows, in order, of w[j] * tile[j][c] for the row's columns c = lane
// + kLanes * cc below hs: the row of a tile product (P V, dS K, P^T dO, dS^T Q); with
// kRescale, acc[cc] times corr first (the forward's online softmax).
template <bool kRescale = false>
__device__ __forceinline__ void accumulate_row(float (&acc)[kCols], const float* w,
                                               const float (*tile)[kPad], int lane, int hs,
                                               float corr = 1.0f) {
#pragma unroll
  for (int cc = 0; cc < kCols; cc++) {
    const int c = lane + kLanes * cc;
    if (c < hs) {
      float a = kRescale ? acc[cc] * corr : acc[cc];
      for (int j = 0; j < kRows; j++) a += w[j] * tile[j][c];
      acc[cc] = a;
    }
  }
}

__global__ void flash_forward_kernel(float* out, float* lse, const float* q, const float* k,
                                     const float* v, Dims d) {
  __shared__ float sq[kRows][kPad];
  __shared__ float sk[kRows][kPad];
  __shared__ float sv[kRows][kPad];
  __shared__ float sp[kRows][kRows + 1];
  const int bh = blockIdx.y, b = bh / d.nh, h = bh % d.nh, kvh = h / d.group;
  const int i0 = blockIdx.x * kRows, r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int i = i0 + r;
  const float* qh = q + b * d.bsq + (long long)h * d.hs;
  const float* kh = k + b * d.bsk + (long long)kvh * d.hs;
  const float* vh = v + b * d.bsv + (long long)kvh * d.hs;
  load_tile(sq, qh, d.ldq, i0, d.t, d.hs);
  float acc[kCols];
#pragma unroll
  for (int cc = 0; cc < kCols; cc++) acc[cc] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  // causal: keys up to the tile's last query
  const int kend = !d.causal || d.t < i0 + kRows ? d.t : i0 + kRows;
  for (int j0 = 0; j0 < kend; j0 += kRows) {
    __syncthreads();  // the previous tile's reads of sk, sv, sp are done
    load_tile(sk, kh, d.ldk, j0, d.t, d.hs);
    load_tile(sv, vh, d.ldv, j0, d.t, d.hs);
    __syncthreads();
    float s[kPerRow];
    float mx = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < kPerRow; jj++) {
      const int j = lane + kLanes * jj;
      const bool visible = (!d.causal || j0 + j <= i) && j0 + j < d.t;
      s[jj] = visible ? d.scale * dot_rows(sq[r], sk[j], d.hs) : -INFINITY;
      mx = fmaxf(mx, s[jj]);
    }
    mx = row_max(mx);
    const float m_new = fmaxf(m, mx);
    float sum = 0.0f;
#pragma unroll
    for (int jj = 0; jj < kPerRow; jj++) {
      const float p = s[jj] == -INFINITY ? 0.0f : expf(s[jj] - m_new);
      sp[r][lane + kLanes * jj] = p;
      sum += p;
    }
    sum = row_sum(sum);
    const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
    l = l * corr + sum;
    m = m_new;
    __syncthreads();  // sp complete
    accumulate_row<true>(acc, sp[r], sv, lane, d.hs, corr);
  }
  if (i < d.t) {
    float* orow = out + b * d.bso + i * d.ldo + (long long)h * d.hs;
    const float inv = 1.0f / l;
#pragma unroll
    for (int cc = 0; cc < kCols; cc++) {
      const int c = lane + kLanes * cc;
      if (c < d.hs) orow[c] = acc[cc] * inv;
    }
    if (lane == 0) lse[(long long)bh * d.bslse + i] = m + logf(l);
  }
}

// D = rowsum(dout * out) of query row i (0 beyond t), summed over the row's lanes.
__device__ __forceinline__ float row_delta(const float* dout, const float* out, Dims d, int b,
                                           int h, int i, int lane) {
  float part = 0.0f;
  if (i < d.t) {
    const long long o = b * d.bso + i * d.ldo + (long long)h * d.hs;
    const float* dor = dout + o;
    const float* orow = out + o;
    for (int c = lane; c < d.hs; c += kLanes) part += dor[c] * orow[c];
  }
  return row_sum(part);
}

__global__ void flash_backward_dq_kernel(float* dq, const float* dout, const float* out,
                                         const float* lse, const float* q, const float* k,
                                         const float* v, Dims d) {
  __shared__ float sq[kRows][kPad];
  __shared__ float sdo[kRows][kPad];
  __shared__ float sk[kRows][kPad];
  __shared__ float sv[kRows][kPad];
  __shared__ float sds[kRows][kRows + 1];
  const int bh = blockIdx.y, b = bh / d.nh, h = bh % d.nh, kvh = h / d.group;
  const int i0 = blockIdx.x * kRows, r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int i = i0 + r;
  const float* kh = k + b * d.bsk + (long long)kvh * d.hs;
  const float* vh = v + b * d.bsv + (long long)kvh * d.hs;
  load_tile(sq, q + b * d.bsq + (long long)h * d.hs, d.ldq, i0, d.t, d.hs);
  load_tile(sdo, dout + b * d.bso + (long long)h * d.hs, d.ldo, i0, d.t, d.hs);
  const float delta = row_delta(dout, out, d, b, h, i, lane);
  const float lse_i = i < d.t ? lse[(long long)bh * d.bslse + i] : 0.0f;
  float acc[kCols];
#pragma unroll
  for (int cc = 0; cc < kCols; cc++) acc[cc] = 0.0f;
  const int kend = !d.causal || d.t < i0 + kRows ? d.t : i0 + kRows;
  for (int j0 = 0; j0 < kend; j0 += kRows) {
    __syncthreads();
    load_tile(sk, kh, d.ldk, j0, d.t, d.hs);
    load_tile(sv, vh, d.ldv, j0, d.t, d.hs);
    __syncthreads();
#pragma unroll
    for (int jj = 0; jj < kPerRow; jj++) {
      const int j = lane + kLanes * jj;
      float ds = 0.0f;
      if ((!d.causal || j0 + j <= i) && j0 + j < d.t && i < d.t) {
        const float p = expf(d.scale * dot_rows(sq[r], sk[j], d.hs) - lse_i);
        ds = d.scale * p * (dot_rows(sdo[r], sv[j], d.hs) - delta);
      }
      sds[r][j] = ds;
    }
    __syncthreads();
    accumulate_row(acc, sds[r], sk, lane, d.hs);
  }
  if (i < d.t) {
    float* dqr = dq + b * d.bsq + i * d.ldq + (long long)h * d.hs;
#pragma unroll
    for (int cc = 0; cc < kCols; cc++) {
      const int c = lane + kLanes * cc;
      if (c < d.hs) dqr[c] = d.accumulate ? dqr[c] + acc[cc] : acc[cc];
    }
  }
}

__global__ void flash_backward_dkv_kernel(float* dk, float* dv, const float* dout,
                                          const float* out, const float* lse, const float* q,
                                          const float* k, const float* v, Dims d) {
  __shared__ float sk[kRows][kPad];
  __shared__ float sv[kRows][kPad];
  __shared__ float sq[kRows][kPad];
  __shared__ float sdo[kRows][kPad];
  __shared__ float sp[kRows][kRows + 1];
  __shared__ float sds[kRows][kRows + 1];
  __shared__ float sdelta[kRows];
  __shared__ float slse[kRows];
  const int nkv = d.nh / d.group;
  const int bkv = blockIdx.y, b = bkv / nkv, kvh = bkv % nkv;
  const int j0 = blockIdx.x * kRows, r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int j = j0 + r;  // this thread's key row
  load_tile(sk, k + b * d.bsk + (long long)kvh * d.hs, d.ldk, j0, d.t, d.hs);
  load_tile(sv, v + b * d.bsv + (long long)kvh * d.hs, d.ldv, j0, d.t, d.hs);
  float dk_acc[kCols], dv_acc[kCols];
#pragma unroll
  for (int cc = 0; cc < kCols; cc++) dk_acc[cc] = dv_acc[cc] = 0.0f;
  for (int h = kvh * d.group; h < (kvh + 1) * d.group; h++) {
    const int bh = b * d.nh + h;
    // causal: the query tiles on and below the diagonal
    for (int i0 = d.causal ? j0 : 0; i0 < d.t; i0 += kRows) {
      __syncthreads();
      load_tile(sq, q + b * d.bsq + (long long)h * d.hs, d.ldq, i0, d.t, d.hs);
      load_tile(sdo, dout + b * d.bso + (long long)h * d.hs, d.ldo, i0, d.t, d.hs);
      const float delta = row_delta(dout, out, d, b, h, i0 + r, lane);  // row r as a query
      if (lane == 0) {
        sdelta[r] = delta;
        slse[r] = i0 + r < d.t ? lse[(long long)bh * d.bslse + i0 + r] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int ii = 0; ii < kPerRow; ii++) {
        const int qi = lane + kLanes * ii, i = i0 + qi;
        float p = 0.0f, ds = 0.0f;
        if ((!d.causal || j <= i) && i < d.t) {
          p = expf(d.scale * dot_rows(sk[r], sq[qi], d.hs) - slse[qi]);
          ds = d.scale * p * (dot_rows(sv[r], sdo[qi], d.hs) - sdelta[qi]);
        }
        sp[r][qi] = p;
        sds[r][qi] = ds;
      }
      __syncthreads();
      accumulate_row(dv_acc, sp[r], sdo, lane, d.hs);
      accumulate_row(dk_acc, sds[r], sq, lane, d.hs);
    }
  }
  if (j < d.t) {
    float* dkr = dk + b * d.bsk + j * d.ldk + (long long)kvh * d.hs;
    float* dvr = dv + b * d.bsv + j * d.ldv + (long long)kvh * d.hs;
#pragma unroll
    for (int cc = 0; cc < kCols; cc++) {
      const int c = lane + kLanes * cc;
      if (c < d.hs) {
        dkr[c] = d.accumulate ? dkr[c] + dk_acc[cc] : dk_acc[cc];
        dvr[c] = d.accumulate ? dvr[c] + dv_acc[cc] : dv_acc[cc];
      }
    }
  }
}

Dims dims_of(const FlashShape& s) {
  return Dims{s.t,    s.nh,   s.nh / s.nkv, s.hs,   s.ld_q,  s.ld_k,
              s.ld_v, s.ld_o, s.bs_q,       s.bs_k, s.bs_v,  s.bs_o,
              s.bs_lse, 1.0f / sqrtf(float(s.hs)), s.causal, s.accumulate};
}

// One thread per (batch, head, row): lse' = log(e^lse + e^lse_part), out' = the weighted sum.
__global__ void attention_merge_kernel(float* out, float* lse, const float* out_part,
                                       const float* lse_part, Dims d, long long rows) {
  const long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (x >= rows) return;
  const long long bh = x / d.t;
  const int i = int(x % d.t), b = int(bh / d.nh), h = int(bh % d.nh);
  const long long li = bh * d.bslse + i;
  const float a = lse[li], p = lse_part[li];
  if (p == -INFINITY) return;
  const long long o = b * d.bso + i * d.ldo + (long long)h * d.hs;
  if (a == -INFINITY) {  // no keys yet: out may hold anything
    for (int c = 0; c < d.hs; c++) out[o + c] = out_part[o + c];
    lse[li] = p;
    return;
  }
  const float mx = fmaxf(a, p), wa = expf(a - mx), wp = expf(p - mx), sum = wa + wp;
  const float ca = wa / sum, cp = wp / sum;
  for (int c = 0; c < d.hs; c++) out[o + c] = ca * out[o + c] + cp * out_part[o + c];
  lse[li] = mx + logf(sum);
}

}  // namespace

void launch_flash_attention_forward(cudaStream_t s, float* out, float* lse, const float* q,
                                    const float* k, const float* v, const FlashShape& sh) {
  if (sh.b <= 0 || sh.t <= 0) return;
  const dim3 grid((sh.t + kRows - 1) / kRows, sh.b * sh.nh);
  flash_forward_kernel<<<grid, kThreads, 0, s>>>(out, lse, q, k, v, dims_of(sh));
  check_launch("flash_forward");
}

void launch_flash_attention_backward(cudaStream_t s, float* dq, float* dk, float* dv,
                                     const float* dout, const float* out, const float* lse,
                                     const float* q, const float* k, const float* v,
                                     const FlashShape& sh) {
  if (sh.b <= 0 || sh.t <= 0) return;
  const unsigned tiles = (sh.t + kRows - 1) / kRows;
  const Dims d = dims_of(sh);
  flash_backward_dq_kernel<<<dim3(tiles, sh.b * sh.nh), kThreads, 0, s>>>(dq, dout, out, lse, q,
                                                                         k, v, d);
  check_launch("flash_backward_dq");
  flash_backward_dkv_kernel<<<dim3(tiles, sh.b * sh.nkv), kThreads, 0, s>>>(dk, dv, dout, out,
                                                                           lse, q, k, v, d);
  check_launch("flash_backward_dkv");
}

void launch_attention_merge(cudaStream_t s, float* out, float* lse, const float* out_part,
                            const float* lse_part, const FlashShape& sh) {
  const long long rows = (long long)sh.b * sh.nh * sh.t;
  if (rows <= 0) return;
  constexpr int kBlock = 256;
  attention_merge_kernel<<<unsigned((rows + kBlock - 1) / kBlock), kBlock, 0, s>>>(
      out, lse, out_part, lse_part, dims_of(sh), rows);
  check_launch("attention_merge");
}

}  // namespace trident::ops::cuda
