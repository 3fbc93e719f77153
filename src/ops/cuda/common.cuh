// ops/cuda/common.cuh — device helpers the kernels share (private to src/ops/cuda): warp and
// block reductions with full masks in a fixed order (so results do not depend on timing),
// grid sizes for grid-stride loops, bf16's rounding, 16-byte accesses (Packed128).
// defines: kFullMask, kBlock, warp_sum, warp_max, block_sum, block_max, grid_for, bf16_bits,
//          bf16_value, Packed128 (Bf16x8, Floatx4), aligned16, for_row_blocks, column_sums,
//          column_sums8, RowStats, layernorm_row_stats, rmsnorm_row_rstd
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace trident::ops::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// The bits of float v as bf16, rounded to nearest even in integer arithmetic: the CPU
// backend's rule bit for bit. Not __float2bfloat16_rn: on the H200 it turns every NaN into one
// canonical 0x7fff, where the CPU keeps the sign and payload (quieted), and ops.cuda's
// bf16_convert failed on that.
__device__ __forceinline__ unsigned short bf16_bits(float v) {
  unsigned int u;
  memcpy(&u, &v, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The float a bf16's bits stand for (exact).
__device__ __forceinline__ float bf16_value(unsigned short h) {
  const unsigned int u = (unsigned int)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
// 16 bytes in one access (llm.c's x128): 8 bf16 (as unsigned short) or 4 floats. The memory-
// bound kernels move their bytes this way where every pointer is 16-byte aligned (aligned16,
// checked on the host or per block) and the sizes allow, with a scalar tail or the scalar
// kernel otherwise. Loads and stores go through __ldca / __stwb: the default cache policies
// (a plain dereference's), spelled as intrinsics so that the CPU stand-in can check the
// alignment of each access (a misaligned 16-byte access faults on a GPU).
template <typename T>
struct alignas(16) Packed128 {
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  T v[kSize];

  __device__ __forceinline__ static Packed128 load(const T* p) {
    const int4 bits = __ldca(reinterpret_cast<const int4*>(p));
    Packed128 r;
    memcpy(r.v, &bits, sizeof bits);
    return r;
  }
  __device__ __forceinline__ void store(T* p) const {
    int4 bits;
    memcpy(&bits, v, sizeof bits);
    __stwb(reinterpret_cast<int4*>(p), bits);
  }
  __device__ __forceinline__ T& operator[](int i) { return v[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return v[i]; }
};
using Bf16x8 = Packed128<unsigned short>;
using Floatx4 = Packed128<float>;

__host__ __device__ __forceinline__ bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// The column sums' row blocks: body(rb, r0, r1) for each block rb of `rows` rows ([r0, r1) of
// n) that falls to this thread block along y, in row-block order (gridDim.y is capped at
// 65535, so a block may take several).
template <typename Body>
__device__ __forceinline__ void for_row_blocks(int n, int rows, Body body) {
  const int blocks = (n + rows - 1) / rows;
  for (int rb = blockIdx.y; rb < blocks; rb += gridDim.y) {
    const int r0 = rb * rows;
    body(rb, r0, r0 + rows < n ? r0 + rows : n);
  }
}

// The column sums by row blocks of `rows` rows: thread column c = blockIdx.x * blockDim.x +
// threadIdx.x (of cols; beyond it the thread has nothing to do) and partial[rb, c] = the sum of
// value(i), i = r * cols + c the element index, over the block's rows r in row order. value
// may write its own output of element i (one read for a conversion and the sums).
template <typename Value>
__device__ __forceinline__ void column_sums(float* partial, int n, int cols, int rows,
                                            Value value) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for_row_blocks(n, rows, [&](int rb, int r0, int r1) {
    float sum = 0.0f;
    for (int r = r0; r < r1; r++) sum += value(std::int64_t(r) * cols + c);
    partial[std::int64_t(rb) * cols + c] = sum;
  });
}

// column_sums 8 columns per thread (cols % 8 == 0, partial 16-byte aligned): columns
// [c, c + 8), c = 8 * (blockIdx.x * blockDim.x + threadIdx.x); values(i, v) sets v[e] to the
// value of element i + e. Each column's sum in the same row order: the same partials, bit for
// bit, as column_sums.
template <typename Values>
__device__ __forceinline__ void column_sums8(float* partial, int n, int cols, int rows,
                                             Values values) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (c >= cols) return;
  for_row_blocks(n, rows, [&](int rb, int r0, int r1) {
    Floatx4 lo{}, hi{};
    for (int r = r0; r < r1; r++) {
      float v[8];
      values(std::int64_t(r) * cols + c, v);
      for (int e = 0; e < 4; e++) lo[e] += v[e], hi[e] += v[e + 4];
    }
    lo.store(partial + std::int64_t(rb) * cols + c);
    hi.store(partial + std::int64_t(rb) * cols + c + 4);
  });
}

constexpr int kBlock = 256;  // threads of a 1-D block unless a kernel says otherwise

// Blocks for a grid-stride loop over n elements, kBlock threads each (capped: each thread
// then takes several elements).
inline unsigned grid_for(std::int64_t n, int threads = kBlock) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  constexpr std::int64_t kMaxBlocks = 1 << 16;
  return static_cast<unsigned>(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `shared` holds 32 T. Contains __syncthreads: call from all threads of the block.
template <typename T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T r = lane < warps ? shared[lane] : T(0);
  return warp_sum(r);
}

__device__ inline float block_max(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(r);
}

// The norms' per-row statistics, taken by one warp (lane: the thread's lane) over xr[0, c):
// the fp32 kernels' (layernorm.cu) and the bf16-output ones' (fused_block.cu), one place so
// that both keep the same operations in the same order (the same bits).
struct RowStats {
  float mean, rstd;
};

// LayerNorm: mean, then rstd = 1 / sqrt(mean((x - mean)^2) + eps); every lane gets both.
__device__ __forceinline__ RowStats layernorm_row_stats(const float* xr, int c, int lane,
                                                        float eps) {
  float s = 0.0f;
  for (int j = lane; j < c; j += 32) s += xr[j];
  const float m = warp_sum(s) / static_cast<float>(c);
  float ss = 0.0f;
  for (int j = lane; j < c; j += 32) {
    const float d = xr[j] - m;
    ss += d * d;
  }
  return {m, 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(c) + eps)};
}

// RMSNorm: rstd = 1 / sqrt(mean(x^2) + eps); every lane gets it.
__device__ __forceinline__ float rmsnorm_row_rstd(const float* xr, int c, int lane, float eps) {
  float ss = 0.0f;
  for (int j = lane; j < c; j += 32) ss += xr[j] * xr[j];
  return 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(c) + eps);
}

}  // namespace trident::ops::cuda
