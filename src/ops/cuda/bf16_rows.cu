// ops/cuda/bf16_rows.cu — strided rows between bf16 (16-bit words) and fp32: b blocks of t
// rows of `cols` values, each side with its own row and block strides (q, k, v, out and their
// gradients inside GPT's fused qkv, ring attention's blocks). attention_bf16.cpp's fallback
// (widen, run the fp32 kernels, narrow) uses them. One element per thread per step.
// defines: launch_bf16_rows_to_float, launch_float_rows_to_bf16
#include "check.hpp"
#include "common.cuh"
#include "kernels.hpp"

namespace trident::ops::cuda {

namespace {

struct RowBlocks {
  std::int64_t ld_dst, bs_dst, ld_src, bs_src, cols, rows;  // rows = t
  std::int64_t n;                                            // b * t * cols
};

__device__ __forceinline__ void offsets(const RowBlocks& g, std::int64_t i, std::int64_t& dst,
                                        std::int64_t& src) {
  const std::int64_t c = i % g.cols, r = i / g.cols, row = r % g.rows, block = r / g.rows;
  dst = block * g.bs_dst + row * g.ld_dst + c;
  src = block * g.bs_src + row * g.ld_src + c;
}

__global__ void bf16_rows_to_float_kernel(float* dst, const unsigned short* src, RowBlocks g) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < g.n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t d, s;
    offsets(g, i, d, s);
    dst[d] = bf16_value(src[s]);
  }
}

__global__ void float_rows_to_bf16_kernel(unsigned short* dst, const float* src, RowBlocks g) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < g.n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t d, s;
    offsets(g, i, d, s);
    dst[d] = bf16_bits(src[s]);
  }
}

}  // namespace

void launch_bf16_rows_to_float(cudaStream_t s, float* dst, std::int64_t ld_dst,
                               std::int64_t bs_dst, const std::uint16_t* src,
                               std::int64_t ld_src, std::int64_t bs_src, int b, int t,
                               std::int64_t cols) {
  if (b <= 0 || t <= 0 || cols <= 0) return;
  const RowBlocks g{ld_dst, bs_dst, ld_src, bs_src, cols, t, std::int64_t(b) * t * cols};
  bf16_rows_to_float_kernel<<<grid_for(g.n), kBlock, 0, s>>>(
      dst, reinterpret_cast<const unsigned short*>(src), g);
  check_launch("bf16_rows_to_float");
}

void launch_float_rows_to_bf16(cudaStream_t s, std::uint16_t* dst, std::int64_t ld_dst,
                               std::int64_t bs_dst, const float* src, std::int64_t ld_src,
                               std::int64_t bs_src, int b, int t, std::int64_t cols) {
  if (b <= 0 || t <= 0 || cols <= 0) return;
  const RowBlocks g{ld_dst, bs_dst, ld_src, bs_src, cols, t, std::int64_t(b) * t * cols};
  float_rows_to_bf16_kernel<<<grid_for(g.n), kBlock, 0, s>>>(
      reinterpret_cast<unsigned short*>(dst), src, g);
  check_launch("float_rows_to_bf16");
}

}  // namespace trident::ops::cuda
