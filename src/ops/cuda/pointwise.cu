// ops/cuda/pointwise.cu — elementwise kernels (GELU, SwiGLU, add, scale, fill, bias rows, the bf16
// conversion of GEMM inputs), the sum of squares for the gradient norm, and AdamW (also over
// many tensors in one launch: the optimizer step). Grid-stride loops, one element per thread
// per step, or one 16-byte pack (common.cuh's Packed128: 4 floats, 8 bf16) where every pointer
// is 16-byte aligned and the widths allow (add, the bf16 conversions, AdamW's segments): the
// same per-element arithmetic and per-column sum order, so the same bits.
// defines: launch_gelu_forward, launch_gelu_backward, launch_swiglu_forward,
//          launch_swiglu_backward, launch_add, launch_scale, launch_fill,
//          launch_bias_rows, launch_to_bf16, launch_to_bf16_colsum, launch_colsum_add,
//          launch_from_bf16,
//          launch_from_bf16_rows, launch_sum_squares, sum_squares_blocks,
//          launch_adamw, sum_squares_span_blocks, launch_sum_squares_spans,
//          launch_adamw_segments, packed_access
#include <cuda_bf16.h>

#include <cstdlib>
#include <cstring>

#include "check.hpp"
#include "common.cuh"
#include "kernels.hpp"

namespace trident::ops::cuda {

namespace {

#define TRIDENT_GRID_STRIDE(i, n)                                                     \
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += std::int64_t(gridDim.x) * blockDim.x)

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

// e^x with x clamped to [-80, 80], as the CPU backend's exp_approx: the GELU backward's
// e * s stays finite (no inf * 0) for large |x|.
__device__ __forceinline__ float exp_clamped(float x) { return expf(fminf(fmaxf(x, -80.0f), 80.0f)); }

// GELU (tanh form) as y = x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3), as the CPU.
__global__ void gelu_forward_kernel(float* y, const float* x, std::int64_t n) {
  TRIDENT_GRID_STRIDE(i, n) {
    const float xi = x[i];
    const float u = kGeluS * (xi + kGeluC * xi * xi * xi);
    y[i] = xi / (1.0f + exp_clamped(-2.0f * u));
  }
}

// d/dx x s(2u) = s + 2 x s (1 - s) u', 1 - s = e s, u' = sqrt(2/pi)(1 + 3 * 0.044715 x^2).
__global__ void gelu_backward_kernel(float* dx, const float* x, const float* dy, std::int64_t n) {
  TRIDENT_GRID_STRIDE(i, n) {
    const float xi = x[i];
    const float u = kGeluS * (xi + kGeluC * xi * xi * xi);
    const float du = kGeluS * (1.0f + 3.0f * kGeluC * xi * xi);
    const float e = exp_clamped(-2.0f * u);
    const float s = 1.0f / (1.0f + e);
    dx[i] = dy[i] * s * (1.0f + 2.0f * xi * e * s * du);
  }
}

// SwiGLU: gu[N, 2F] (gate, then up) -> y[N,F] = silu(g) u, silu(g) = g / (1 + e^-g).
__global__ void swiglu_forward_kernel(float* y, const float* gu, std::int64_t total, int f) {
  TRIDENT_GRID_STRIDE(i, total) {
    const std::int64_t r = i / f, j = i % f;
    const float g = gu[r * 2 * f + j], u = gu[r * 2 * f + f + j];
    y[i] = g / (1.0f + exp_clamped(-g)) * u;
  }
}

// dgate = dy u s (1 + g e s), e = e^-g, s = 1 / (1 + e); dup = dy g s (as the CPU).
__global__ void swiglu_backward_kernel(float* dgu, const float* gu, const float* dy,
                                       std::int64_t total, int f) {
  TRIDENT_GRID_STRIDE(i, total) {
    const std::int64_t r = i / f, j = i % f;
    const float g = gu[r * 2 * f + j], u = gu[r * 2 * f + f + j];
    const float e = exp_clamped(-g);
    const float s = 1.0f / (1.0f + e);
    dgu[r * 2 * f + j] = dy[i] * u * s * (1.0f + g * e * s);
    dgu[r * 2 * f + f + j] = dy[i] * g * s;
  }
}

__global__ void add_kernel(float* y, const float* a, const float* b, std::int64_t n) {
  TRIDENT_GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}

// y, a, b 16-byte aligned: n / 4 packs, then the last n % 4 one by one.
__global__ void add_packed_kernel(float* y, const float* a, const float* b, std::int64_t n) {
  const std::int64_t packs = n / 4;
  TRIDENT_GRID_STRIDE(p, packs) {
    const Floatx4 x = Floatx4::load(a + p * 4), z = Floatx4::load(b + p * 4);
    Floatx4 out;
    for (int e = 0; e < 4; e++) out[e] = x[e] + z[e];
    out.store(y + p * 4);
  }
  TRIDENT_GRID_STRIDE(i, n - packs * 4) y[packs * 4 + i] = a[packs * 4 + i] + b[packs * 4 + i];
}

__global__ void scale_kernel(float* x, float alpha, std::int64_t n) {
  TRIDENT_GRID_STRIDE(i, n) x[i] *= alpha;
}

__global__ void fill_kernel(float* x, float value, std::int64_t n) {
  TRIDENT_GRID_STRIDE(i, n) x[i] = value;
}

__global__ void bias_rows_kernel(float* y, const float* bias, std::int64_t total, int out) {
  TRIDENT_GRID_STRIDE(i, total) y[i] = bias[i % out];
}

__global__ void to_bf16_kernel(unsigned short* dst, const float* src, std::int64_t rows,
                               std::int64_t cols, std::int64_t ld) {
  TRIDENT_GRID_STRIDE(i, rows * cols) dst[i] = bf16_bits(src[(i / cols) * ld + i % cols]);
}

// to_bf16_kernel in packs of 8: rows of cols % 8 == 0 (ld % 4 == 0), or one row (rows == 1)
// with its last cols % 8 one by one; dst and src 16-byte aligned.
__global__ void to_bf16_packed_kernel(unsigned short* dst, const float* src, std::int64_t rows,
                                      std::int64_t cols, std::int64_t ld) {
  const std::int64_t row_packs = cols / 8;
  TRIDENT_GRID_STRIDE(p, rows * row_packs) {
    const std::int64_t r = p / row_packs, c = p % row_packs * 8;
    const Floatx4 lo = Floatx4::load(src + r * ld + c), hi = Floatx4::load(src + r * ld + c + 4);
    Bf16x8 out;
    for (int e = 0; e < 4; e++) out[e] = bf16_bits(lo[e]), out[e + 4] = bf16_bits(hi[e]);
    out.store(dst + r * cols + c);
  }
  if (rows != 1) return;
  const std::int64_t tail = row_packs * 8;
  TRIDENT_GRID_STRIDE(i, cols - tail) dst[tail + i] = bf16_bits(src[tail + i]);
}

// dst[n, cols] = bf16(src[n, cols]) and partial[rb, cols] = the column sums of row block rb
// (kColsumRows rows, in row order): one read of src for linear_backward's dy under bf16.
__global__ void to_bf16_colsum_kernel(unsigned short* dst, float* partial, const float* src,
                                      int n, int cols) {
  column_sums(partial, n, cols, kColsumRows, [&](std::int64_t i) {
    const float v = src[i];
    dst[i] = bf16_bits(v);
    return v;
  });
}

// The kernel above, 8 columns per thread (cols % 8 == 0, dst, partial, src 16-byte aligned):
// each column's sum in the same row order, the same partials bit for bit.
__global__ void to_bf16_colsum_packed_kernel(unsigned short* dst, float* partial,
                                             const float* src, int n, int cols) {
  column_sums8(partial, n, cols, kColsumRows, [&](std::int64_t i, float* v) {
    const Floatx4 lo = Floatx4::load(src + i), hi = Floatx4::load(src + i + 4);
    Bf16x8 out;
    for (int e = 0; e < 4; e++) {
      out[e] = bf16_bits(lo[e]), out[e + 4] = bf16_bits(hi[e]);
      v[e] = lo[e], v[e + 4] = hi[e];
    }
    out.store(dst + i);
  });
}

// db[c] += the row blocks' partial sums, in block order (deterministic).
__global__ void colsum_add_kernel(float* db, const float* partial, int blocks, int cols) {
  TRIDENT_GRID_STRIDE(c, cols) {
    float sum = 0.0f;
    for (int b = 0; b < blocks; b++) sum += partial[std::int64_t(b) * cols + c];
    db[c] += sum;
  }
}

__global__ void from_bf16_kernel(float* dst, const __nv_bfloat16* src, std::int64_t n) {
  TRIDENT_GRID_STRIDE(i, n) dst[i] = __bfloat162float(src[i]);
}

// from_bf16_kernel in packs of 8 (dst, src 16-byte aligned), the last n % 8 one by one.
__global__ void from_bf16_packed_kernel(float* dst, const unsigned short* src, std::int64_t n) {
  const std::int64_t packs = n / 8;
  TRIDENT_GRID_STRIDE(p, packs) {
    const Bf16x8 v = Bf16x8::load(src + p * 8);
    Floatx4 lo, hi;
    for (int e = 0; e < 4; e++) lo[e] = bf16_value(v[e]), hi[e] = bf16_value(v[e + 4]);
    lo.store(dst + p * 8);
    hi.store(dst + p * 8 + 4);
  }
  TRIDENT_GRID_STRIDE(i, n - packs * 8) dst[packs * 8 + i] = bf16_value(src[packs * 8 + i]);
}

// from_bf16_rows_kernel in packs of 8 (cols % 8 == 0, ld % 4 == 0, dst, src 16-byte aligned).
__global__ void from_bf16_rows_packed_kernel(float* dst, std::int64_t ld, const unsigned short* src,
                                             std::int64_t rows, std::int64_t cols,
                                             bool accumulate) {
  const std::int64_t row_packs = cols / 8;
  TRIDENT_GRID_STRIDE(p, rows * row_packs) {
    const std::int64_t r = p / row_packs, c = p % row_packs * 8;
    const Bf16x8 v = Bf16x8::load(src + r * cols + c);
    float* d = dst + r * ld + c;
    Floatx4 lo, hi;
    if (accumulate) lo = Floatx4::load(d), hi = Floatx4::load(d + 4);
    for (int e = 0; e < 4; e++) {
      const float a = bf16_value(v[e]), b = bf16_value(v[e + 4]);
      lo[e] = accumulate ? lo[e] + a : a;
      hi[e] = accumulate ? hi[e] + b : b;
    }
    lo.store(d);
    hi.store(d + 4);
  }
}

__global__ void from_bf16_rows_kernel(float* dst, std::int64_t ld, const __nv_bfloat16* src,
                                      std::int64_t rows, std::int64_t cols, bool accumulate) {
  TRIDENT_GRID_STRIDE(i, rows * cols) {
    float& d = dst[(i / cols) * ld + i % cols];
    const float v = __bfloat162float(src[i]);
    d = accumulate ? d + v : v;
  }
}

// Fixed grid and fixed reduction tree: the same sum on every call for a given n.
constexpr int kSumBlocks = 1024;

// Block `block` of a `blocks`-block grid-stride pass over x[0, n): its sum of squares in double
// (thread 0's value), the one order both partial kernels keep.
__device__ __forceinline__ double block_sum_squares(const float* x, std::int64_t n,
                                                    std::int64_t block, std::int64_t blocks,
                                                    double* shared) {
  double s = 0.0;
  for (std::int64_t i = block * blockDim.x + threadIdx.x; i < n;
       i += blocks * std::int64_t(blockDim.x)) {
    const double v = x[i];
    s += v * v;
  }
  return block_sum(s, shared);
}

__global__ void sum_squares_partial_kernel(double* partial, const float* x, std::int64_t n) {
  __shared__ double shared[32];
  const double s = block_sum_squares(x, n, blockIdx.x, gridDim.x, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block of kSumBlocks threads: thread k takes partial k (k < blocks).
__global__ void sum_squares_finish_kernel(double* result, const double* partial, int blocks) {
  __shared__ double shared[32];
  double s = threadIdx.x < blocks ? partial[threadIdx.x] : 0.0;
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *result = s;
}

// *total += sum of loss[0, n): one block, thread k sums k, k + kBlock, ... in double, then the
// block's fixed tree (deterministic; not a host loop's order, the same value up to double
// rounding).
__global__ void loss_add_kernel(double* total, const float* loss, int n) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) s += loss[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *total += s;
}

// torch's AdamW step in float, operation by operation as the CPU backend, with explicit
// round-to-nearest intrinsics so that nvcc does not fuse a multiply and an add. (GCC does
// fuse some in the CPU build on FMA machines: the backends then agree to an ulp or two, as
// test/unit/ops/cuda/emulate measured, not to the bit.)
// One element of it: updates m and v, returns the new p (the one formula both kernels use).
__device__ __forceinline__ float adamw_element(float p, float gi, float& m, float& v, float beta1,
                                               float beta2, float omb1, float omb2, float eps,
                                               float decay, float step, float bc2_sqrt) {
  const float mi = __fadd_rn(__fmul_rn(m, beta1), __fmul_rn(omb1, gi));
  const float vi = __fadd_rn(__fmul_rn(v, beta2), __fmul_rn(__fmul_rn(omb2, gi), gi));
  m = mi;
  v = vi;
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
  return __fsub_rn(__fmul_rn(p, decay), __fmul_rn(step, __fdiv_rn(mi, denom)));
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, std::int64_t n,
                             float beta1, float beta2, float omb1, float omb2, float eps,
                             float decay, float step, float bc2_sqrt) {
  TRIDENT_GRID_STRIDE(i, n) {
    float mi = m[i], vi = v[i];
    p[i] = adamw_element(p[i], g[i], mi, vi, beta1, beta2, omb1, omb2, eps, decay, step,
                         bc2_sqrt);
    m[i] = mi;
    v[i] = vi;
  }
}

// The entry of `table` (count, sorted by .first, first entry at 0) whose blocks hold block b:
// the last one with first <= b.
template <typename Entry>
__device__ __forceinline__ int entry_of_block(const Entry* table, int count, std::int64_t b) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table[mid].first <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// sum_squares_partial_kernel for every span at once: block b is block b - first of its span's
// launch (same grid-stride order over the same blocks), its partial at partial[b].
__global__ void sum_squares_spans_partial_kernel(double* partial, const SumSquaresSpan* spans,
                                                 int count) {
  __shared__ double shared[32];
  const SumSquaresSpan sp = spans[entry_of_block(spans, count, blockIdx.x)];
  const double s =
      block_sum_squares(sp.x, sp.n, std::int64_t(blockIdx.x) - sp.first, sp.blocks, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// sum_squares_finish_kernel per span: block i (kSumBlocks threads) sums span i's partials.
__global__ void sum_squares_spans_finish_kernel(double* sums, const double* partial,
                                                const SumSquaresSpan* spans) {
  __shared__ double shared[32];
  const SumSquaresSpan sp = spans[blockIdx.x];
  double s = threadIdx.x < sp.blocks ? partial[sp.first + threadIdx.x] : 0.0;
  s = block_sum(s, shared);
  if (threadIdx.x == 0) sums[blockIdx.x] = s;
}

// AdamW over many segments: block b updates chunk b - first of its segment (kAdamWChunk
// elements), with the clip's g * grad_scale first, and writes the bf16 copy when p16 is set.
__global__ void adamw_segments_kernel(const AdamWSegmentEntry* segments, int count,
                                      float grad_scale, float beta1, float beta2, float omb1,
                                      float omb2, float eps, float decay_on, float decay_off,
                                      float step, float bc2_sqrt, bool packed) {
  const AdamWSegmentEntry e = segments[entry_of_block(segments, count, blockIdx.x)];
  const std::int64_t begin = (std::int64_t(blockIdx.x) - e.first) * kAdamWChunk;
  const std::int64_t end = begin + kAdamWChunk < e.n ? begin + kAdamWChunk : e.n;
  const float decay = e.decay ? decay_on : decay_off;
  // 4 elements per access where every array is 16-byte aligned (the bf16 copy: 8-byte
  // aligned suffices, its 4 values are written one by one), the chunk's rest one by one.
  std::int64_t packed_end = begin;
  if (packed && aligned16(e.p) && aligned16(e.g) && aligned16(e.m) && aligned16(e.v)) {
    packed_end = begin + (end - begin) / 4 * 4;
    for (std::int64_t i = begin + threadIdx.x * 4; i < packed_end; i += blockDim.x * 4) {
      Floatx4 gv = Floatx4::load(e.g + i), mv = Floatx4::load(e.m + i), vv = Floatx4::load(e.v + i);
      Floatx4 pv = Floatx4::load(e.p + i);
      for (int k = 0; k < 4; k++) {
        float gi = gv[k];
        if (grad_scale != 1.0f) gi = __fmul_rn(gi, grad_scale);
        pv[k] = adamw_element(pv[k], gi, mv[k], vv[k], beta1, beta2, omb1, omb2, eps, decay,
                              step, bc2_sqrt);
      }
      mv.store(e.m + i);
      vv.store(e.v + i);
      pv.store(e.p + i);
      if (e.p16)
        for (int k = 0; k < 4; k++) e.p16[i + k] = bf16_bits(pv[k]);
    }
  }
  for (std::int64_t i = packed_end + threadIdx.x; i < end; i += blockDim.x) {
    float gi = e.g[i];
    if (grad_scale != 1.0f) gi = __fmul_rn(gi, grad_scale);
    float mi = e.m[i], vi = e.v[i];
    const float p = adamw_element(e.p[i], gi, mi, vi, beta1, beta2, omb1, omb2, eps, decay,
                                  step, bc2_sqrt);
    e.m[i] = mi;
    e.v[i] = vi;
    e.p[i] = p;
    if (e.p16) e.p16[i] = bf16_bits(p);
  }
}

}  // namespace

void launch_gelu_forward(cudaStream_t s, float* y, const float* x, std::int64_t n) {
  if (n <= 0) return;
  gelu_forward_kernel<<<grid_for(n), kBlock, 0, s>>>(y, x, n);
  check_launch("gelu_forward");
}

void launch_gelu_backward(cudaStream_t s, float* dx, const float* x, const float* dy,
                          std::int64_t n) {
  if (n <= 0) return;
  gelu_backward_kernel<<<grid_for(n), kBlock, 0, s>>>(dx, x, dy, n);
  check_launch("gelu_backward");
}

void launch_swiglu_forward(cudaStream_t s, float* y, const float* gu, int n, int f) {
  const std::int64_t total = std::int64_t(n) * f;
  if (total <= 0) return;
  swiglu_forward_kernel<<<grid_for(total), kBlock, 0, s>>>(y, gu, total, f);
  check_launch("swiglu_forward");
}

void launch_swiglu_backward(cudaStream_t s, float* dgu, const float* gu, const float* dy, int n,
                            int f) {
  const std::int64_t total = std::int64_t(n) * f;
  if (total <= 0) return;
  swiglu_backward_kernel<<<grid_for(total), kBlock, 0, s>>>(dgu, gu, dy, total, f);
  check_launch("swiglu_backward");
}

void launch_add(cudaStream_t s, float* y, const float* a, const float* b, std::int64_t n) {
  if (n <= 0) return;
  if (packed_access() && aligned16(y) && aligned16(a) && aligned16(b))
    add_packed_kernel<<<grid_for((n + 3) / 4), kBlock, 0, s>>>(y, a, b, n);
  else
    add_kernel<<<grid_for(n), kBlock, 0, s>>>(y, a, b, n);
  check_launch("add");
}

void launch_scale(cudaStream_t s, float* x, float alpha, std::int64_t n) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), kBlock, 0, s>>>(x, alpha, n);
  check_launch("scale");
}

void launch_fill(cudaStream_t s, float* x, float value, std::int64_t n) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n), kBlock, 0, s>>>(x, value, n);
  check_launch("fill");
}

void launch_bias_rows(cudaStream_t s, float* y, const float* bias, int n, int out) {
  const std::int64_t total = std::int64_t(n) * out;
  if (total <= 0) return;
  bias_rows_kernel<<<grid_for(total), kBlock, 0, s>>>(y, bias, total, out);
  check_launch("bias_rows");
}

void launch_to_bf16(cudaStream_t s, void* dst, const float* src, std::int64_t rows,
                    std::int64_t cols, std::int64_t ld) {
  if (rows <= 0 || cols <= 0) return;
  if (ld == cols) cols *= rows, rows = 1;  // contiguous: one row (the same elements in order)
  const bool whole_packs = rows == 1 || (cols % 8 == 0 && ld % 4 == 0);
  if (packed_access() && aligned16(dst) && aligned16(src) && whole_packs)
    to_bf16_packed_kernel<<<grid_for(rows * cols / 8 + 1), kBlock, 0, s>>>(
        static_cast<unsigned short*>(dst), src, rows, cols, ld);
  else
    to_bf16_kernel<<<grid_for(rows * cols), kBlock, 0, s>>>(static_cast<unsigned short*>(dst),
                                                            src, rows, cols, ld);
  check_launch("to_bf16");
}

void launch_to_bf16_colsum(cudaStream_t s, void* dst, float* db, float* partial,
                           const float* src, int n, int cols) {
  if (n <= 0 || cols <= 0) return;
  const int blocks = colsum_row_blocks(n);
  const unsigned row_blocks = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  if (packed_access() && cols % 8 == 0 && aligned16(dst) && aligned16(partial) && aligned16(src)) {
    // 8 columns per thread, 64 threads per block (fused_block.cu's packed column sums)
    constexpr int kThreads = 64;
    const dim3 grid(static_cast<unsigned>((cols / 8 + kThreads - 1) / kThreads), row_blocks);
    to_bf16_colsum_packed_kernel<<<grid, kThreads, 0, s>>>(static_cast<unsigned short*>(dst),
                                                           partial, src, n, cols);
  } else {
    const dim3 grid(static_cast<unsigned>((cols + kBlock - 1) / kBlock), row_blocks);
    to_bf16_colsum_kernel<<<grid, kBlock, 0, s>>>(static_cast<unsigned short*>(dst), partial,
                                                  src, n, cols);
  }
  check_launch("to_bf16_colsum");
  launch_colsum_add(s, db, partial, n, cols);
}

void launch_colsum_add(cudaStream_t s, float* db, const float* partial, int n, int cols) {
  colsum_add_kernel<<<grid_for(cols), kBlock, 0, s>>>(db, partial, colsum_row_blocks(n), cols);
  check_launch("colsum_add");
}

void launch_from_bf16(cudaStream_t s, float* dst, const void* src, std::int64_t n) {
  if (n <= 0) return;
  if (packed_access() && aligned16(dst) && aligned16(src))
    from_bf16_packed_kernel<<<grid_for((n + 7) / 8), kBlock, 0, s>>>(
        dst, static_cast<const unsigned short*>(src), n);
  else
    from_bf16_kernel<<<grid_for(n), kBlock, 0, s>>>(dst, static_cast<const __nv_bfloat16*>(src),
                                                    n);
  check_launch("from_bf16");
}

void launch_from_bf16_rows(cudaStream_t s, float* dst, std::int64_t ld, const void* src,
                           std::int64_t rows, std::int64_t cols, bool accumulate) {
  if (rows <= 0 || cols <= 0) return;
  if (packed_access() && cols % 8 == 0 && ld % 4 == 0 && aligned16(dst) && aligned16(src))
    from_bf16_rows_packed_kernel<<<grid_for(rows * cols / 8), kBlock, 0, s>>>(
        dst, ld, static_cast<const unsigned short*>(src), rows, cols, accumulate);
  else
    from_bf16_rows_kernel<<<grid_for(rows * cols), kBlock, 0, s>>>(
        dst, ld, static_cast<const __nv_bfloat16*>(src), rows, cols, accumulate);
  check_launch("from_bf16_rows");
}

int sum_squares_blocks() { return kSumBlocks; }

bool packed_access() {
  static const bool on = [] {
    const char* baseline = std::getenv("TRIDENT_CUDA_BASELINE");
    return !(baseline && std::strcmp(baseline, "1") == 0);
  }();
  return on;
}

void launch_sum_squares(cudaStream_t s, double* result, double* partial, const float* x,
                        std::int64_t n) {
  const unsigned blocks = grid_for(n) < unsigned(kSumBlocks) ? grid_for(n) : unsigned(kSumBlocks);
  sum_squares_partial_kernel<<<blocks, kBlock, 0, s>>>(partial, x, n);
  check_launch("sum_squares_partial");
  sum_squares_finish_kernel<<<1, kSumBlocks, 0, s>>>(result, partial, static_cast<int>(blocks));
  check_launch("sum_squares_finish");
}

void launch_loss_add(cudaStream_t s, double* total, const float* loss, int n) {
  if (n <= 0) return;
  loss_add_kernel<<<1, kBlock, 0, s>>>(total, loss, n);
  check_launch("loss_add");
}

void launch_adamw(cudaStream_t s, float* p, const float* g, float* m, float* v, std::int64_t n,
                  float beta1, float beta2, float omb1, float omb2, float eps, float decay,
                  float step, float bc2_sqrt) {
  if (n <= 0) return;
  adamw_kernel<<<grid_for(n), kBlock, 0, s>>>(p, g, m, v, n, beta1, beta2, omb1, omb2, eps, decay,
                                              step, bc2_sqrt);
  check_launch("adamw");
}

std::int64_t sum_squares_span_blocks(std::int64_t n) {
  return grid_for(n) < unsigned(kSumBlocks) ? grid_for(n) : kSumBlocks;
}

void launch_sum_squares_spans(cudaStream_t s, double* sums, double* partial,
                              const SumSquaresSpan* spans, int count, std::int64_t total_blocks) {
  if (count <= 0) return;
  sum_squares_spans_partial_kernel<<<unsigned(total_blocks), kBlock, 0, s>>>(partial, spans, count);
  check_launch("sum_squares_spans_partial");
  sum_squares_spans_finish_kernel<<<unsigned(count), kSumBlocks, 0, s>>>(sums, partial, spans);
  check_launch("sum_squares_spans_finish");
}

void launch_adamw_segments(cudaStream_t s, const AdamWSegmentEntry* segments, int count,
                           std::int64_t total_chunks, float grad_scale, float beta1, float beta2,
                           float omb1, float omb2, float eps, float decay_on, float decay_off,
                           float step, float bc2_sqrt) {
  if (count <= 0 || total_chunks <= 0) return;
  adamw_segments_kernel<<<unsigned(total_chunks), kBlock, 0, s>>>(
      segments, count, grad_scale, beta1, beta2, omb1, omb2, eps, decay_on, decay_off, step,
      bc2_sqrt, packed_access());
  check_launch("adamw_segments");
}

}  // namespace trident::ops::cuda
