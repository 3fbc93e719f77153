// ops/cuda/common.cuh — device helpers the kernels share (private to src/ops/cuda): warp and
// block reductions with full masks in a fixed order (so results do not depend on timing),
// grid sizes for grid-stride loops, bf16's rounding.
// defines: kFullMask, kBlock, warp_sum, warp_max, block_sum, block_max, grid_for, bf16_bits,
//          bf16_value
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

}  // namespace trident::ops::cuda
