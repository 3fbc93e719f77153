// ops/cuda/bf16_rows.cu — strided rows between bf16 (16-bit words) and fp32: b blocks of t
// rows of `cols` values, each side with its own row and block strides (q, k, v, out and their
// gradients inside GPT's fused qkv, ring attention's blocks). attention_bf16.cpp's fallback
// (widen, run the fp32 kernels, narrow) uses them. One element per thread per step, or 8 (two
// 16-byte fp32 accesses, one bf16) where every row of both sides starts 16-byte aligned.
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

// The kernels above in packs of 8 columns (rows_packed: every row of either side starts
// 16-byte aligned and cols % 8 == 0): pack p is elements [8p, 8p + 8), inside one row.
__global__ void bf16_rows_to_float_packed_kernel(float* dst, const unsigned short* src,
                                                 RowBlocks g) {
  for (std::int64_t p = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; p < g.n / 8;
       p += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t d, s;
    offsets(g, p * 8, d, s);
    const Bf16x8 v = Bf16x8::load(src + s);
    Floatx4 lo, hi;
    for (int e = 0; e < 4; e++) lo[e] = bf16_value(v[e]), hi[e] = bf16_value(v[e + 4]);
    lo.store(dst + d);
    hi.store(dst + d + 4);
  }
}

__global__ void float_rows_to_bf16_packed_kernel(unsigned short* dst, const float* src,
                                                 RowBlocks g) {
  for (std::int64_t p = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; p < g.n / 8;
       p += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t d, s;
    offsets(g, p * 8, d, s);
    const Floatx4 lo = Floatx4::load(src + s), hi = Floatx4::load(src + s + 4);
    Bf16x8 out;
    for (int e = 0; e < 4; e++) out[e] = bf16_bits(lo[e]), out[e + 4] = bf16_bits(hi[e]);
    out.store(dst + d);
  }
}

// Every row start of both sides 16-byte aligned, whole packs per row: bf16 strides in 8s,
// fp32 strides in 4s.
bool rows_packed(const RowBlocks& g, const void* bf16_side, std::int64_t ld16, std::int64_t bs16,
                 const void* fp32_side, std::int64_t ld32, std::int64_t bs32) {
  return packed_access() && g.cols % 8 == 0 && aligned16(bf16_side) && aligned16(fp32_side) &&
         ld16 % 8 == 0 && bs16 % 8 == 0 && ld32 % 4 == 0 && bs32 % 4 == 0;
}

}  // namespace

void launch_bf16_rows_to_float(cudaStream_t s, float* dst, std::int64_t ld_dst,
                               std::int64_t bs_dst, const std::uint16_t* src,
                               std::int64_t ld_src, std::int64_t bs_src, int b, int t,
                               std::int64_t cols) {
  if (b <= 0 || t <= 0 || cols <= 0) return;
  const RowBlocks g{ld_dst, bs_dst, ld_src, bs_src, cols, t, std::int64_t(b) * t * cols};
  if (rows_packed(g, src, ld_src, bs_src, dst, ld_dst, bs_dst))
    bf16_rows_to_float_packed_kernel<<<grid_for(g.n / 8), kBlock, 0, s>>>(
        dst, reinterpret_cast<const unsigned short*>(src), g);
  else
    bf16_rows_to_float_kernel<<<grid_for(g.n), kBlock, 0, s>>>(
        dst, reinterpret_cast<const unsigned short*>(src), g);
  check_launch("bf16_rows_to_float");
}

void launch_float_rows_to_bf16(cudaStream_t s, std::uint16_t* dst, std::int64_t ld_dst,
                               std::int64_t bs_dst, const float* src, std::int64_t ld_src,
                               std::int64_t bs_src, int b, int t, std::int64_t cols) {
  if (b <= 0 || t <= 0 || cols <= 0) return;
  const RowBlocks g{ld_dst, bs_dst, ld_src, bs_src, cols, t, std::int64_t(b) * t * cols};
  if (rows_packed(g, dst, ld_dst, bs_dst, src, ld_src, bs_src))
    float_rows_to_bf16_packed_kernel<<<grid_for(g.n / 8), kBlock, 0, s>>>(
        reinterpret_cast<unsigned short*>(dst), src, g);
  else
    float_rows_to_bf16_kernel<<<grid_for(g.n), kBlock, 0, s>>>(
        reinterpret_cast<unsigned short*>(dst), src, g);
  check_launch("float_rows_to_bf16");
}

}  // namespace trident::ops::cuda
