// ops/cuda/common.cuh — device helpers the kernels share (private to src/ops/cuda): warp and
// block reductions with full masks in a fixed order (so results do not depend on timing),
// grid sizes for grid-stride loops.
// defines: kFullMask, kBlock, warp_sum, warp_max, block_sum, block_max, grid_for
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace trident::ops::cuda {

constexpr unsigned kFullMask = 0xffffffffu;
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
