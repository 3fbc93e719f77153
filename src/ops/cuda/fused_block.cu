// ops/cuda/fused_block.cu — the kernels of the fused GPT-2 block (fused_block.cpp) on bf16
// activations: LayerNorm writing bf16, GELU on bf16, the GELU backward with the c_fc bias
// gradient in the same read, and the column sums of a bf16 gradient (c_attn's bias). bf16 is
// held as its 16 bits (unsigned short): rounded to nearest even as pointwise.cu's to_bf16, read
// back exactly. The arithmetic in fp32 is that of the fp32 kernels (layernorm.cu, pointwise.cu).
// The fused Llama block's: RMSNorm writing bf16, RoPE in place on bf16 q/k (or their
// gradients), SwiGLU and its backward on bf16.
// defines: launch_layernorm_forward_bf16, launch_gelu_forward_bf16,
//          launch_gelu_backward_bf16_colsum, launch_colsum_bf16, launch_rmsnorm_forward_bf16,
//          launch_rope_bf16, launch_swiglu_forward_bf16, launch_swiglu_backward_bf16
#include <cstring>

#include "check.hpp"
#include "common.cuh"
#include "kernels.hpp"

namespace trident::ops::cuda {

namespace {

#define TRIDENT_GRID_STRIDE(i, n)                                                     \
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += std::int64_t(gridDim.x) * blockDim.x)

constexpr int kRowsPerBlock = 8;  // LayerNorm: warps per block, one row each
constexpr float kEps = 1e-5f;
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float exp_clamped(float x) {
  return expf(fminf(fmaxf(x, -80.0f), 80.0f));
}

__global__ void layernorm_forward_bf16_kernel(unsigned short* y, float* mean, float* rstd,
                                              const float* x, const float* w, const float* b,
                                              int n, int c) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= n) return;  // the whole warp leaves together
  const float* xr = x + row * c;
  float s = 0.0f;
  for (int j = lane; j < c; j += 32) s += xr[j];
  const float m = warp_sum(s) / static_cast<float>(c);
  float ss = 0.0f;
  for (int j = lane; j < c; j += 32) {
    const float d = xr[j] - m;
    ss += d * d;
  }
  const float rs = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(c) + kEps);
  unsigned short* yr = y + row * c;
  for (int j = lane; j < c; j += 32) yr[j] = bf16_bits((xr[j] - m) * rs * w[j] + b[j]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

__global__ void gelu_forward_bf16_kernel(unsigned short* y, const unsigned short* x,
                                         std::int64_t n) {
  TRIDENT_GRID_STRIDE(i, n) {
    const float xi = bf16_value(x[i]);
    const float u = kGeluS * (xi + kGeluC * xi * xi * xi);
    y[i] = bf16_bits(xi / (1.0f + exp_clamped(-2.0f * u)));
  }
}

// One thread per column, row blocks of kColsumRows in row order (to_bf16_colsum's order).
__global__ void gelu_backward_bf16_colsum_kernel(unsigned short* dx, float* partial,
                                                 const unsigned short* x,
                                                 const unsigned short* dy, int n, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int blocks = (n + kColsumRows - 1) / kColsumRows;
  for (int rb = blockIdx.y; rb < blocks; rb += gridDim.y) {
    const int r0 = rb * kColsumRows;
    const int r1 = r0 + kColsumRows < n ? r0 + kColsumRows : n;
    float sum = 0.0f;
    for (int r = r0; r < r1; r++) {
      const std::int64_t i = std::int64_t(r) * cols + c;
      const float xi = bf16_value(x[i]);
      const float u = kGeluS * (xi + kGeluC * xi * xi * xi);
      const float du = kGeluS * (1.0f + 3.0f * kGeluC * xi * xi);
      const float e = exp_clamped(-2.0f * u);
      const float sg = 1.0f / (1.0f + e);
      const float v = bf16_value(dy[i]) * sg * (1.0f + 2.0f * xi * e * sg * du);
      dx[i] = bf16_bits(v);
      sum += v;
    }
    partial[std::int64_t(rb) * cols + c] = sum;
  }
}

__global__ void colsum_bf16_kernel(float* partial, const unsigned short* src, int n, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int blocks = (n + kColsumRows - 1) / kColsumRows;
  for (int rb = blockIdx.y; rb < blocks; rb += gridDim.y) {
    const int r0 = rb * kColsumRows;
    const int r1 = r0 + kColsumRows < n ? r0 + kColsumRows : n;
    float sum = 0.0f;
    for (int r = r0; r < r1; r++) sum += bf16_value(src[std::int64_t(r) * cols + c]);
    partial[std::int64_t(rb) * cols + c] = sum;
  }
}

// db[c] += the row blocks' partial sums, in block order (pointwise.cu's colsum_add).
__global__ void block_colsum_add_kernel(float* db, const float* partial, int blocks, int cols) {
  TRIDENT_GRID_STRIDE(c, cols) {
    float sum = 0.0f;
    for (int b = 0; b < blocks; b++) sum += partial[std::int64_t(b) * cols + c];
    db[c] += sum;
  }
}

// layernorm.cu's rmsnorm_forward arithmetic, y written as bf16.
__global__ void rmsnorm_forward_bf16_kernel(unsigned short* y, float* rstd, const float* x,
                                            const float* w, int n, int c, float eps) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= n) return;
  const float* xr = x + row * c;
  float ss = 0.0f;
  for (int j = lane; j < c; j += 32) ss += xr[j] * xr[j];
  const float rs = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(c) + eps);
  unsigned short* yr = y + row * c;
  for (int j = lane; j < c; j += 32) yr[j] = bf16_bits(xr[j] * rs * w[j]);
  if (lane == 0) rstd[row] = rs;
}

// rope.cu's rotation (angle in double) on bf16 values, rounded once after it.
__global__ void rope_bf16_kernel(unsigned short* x, int b, int t, int ld, int heads, int hs,
                                 int pos0, double theta, float sign) {
  const int half = hs / 2;
  const std::int64_t total = std::int64_t(b) * t * half;
  TRIDENT_GRID_STRIDE(k, total) {
    const int i = static_cast<int>(k % half);
    const std::int64_t row = k / half;
    const int p = static_cast<int>(row % t);
    const double a = double(pos0 + p) * pow(theta, -2.0 * i / hs);
    const float cs = static_cast<float>(cos(a)), sn = sign * static_cast<float>(sin(a));
    unsigned short* x1 = x + row * ld + i;
    for (int h = 0; h < heads; h++, x1 += hs) {
      const float u = bf16_value(x1[0]), v = bf16_value(x1[half]);
      x1[0] = bf16_bits(u * cs - v * sn);
      x1[half] = bf16_bits(v * cs + u * sn);
    }
  }
}

// pointwise.cu's swiglu kernels on bf16 gu[N, 2F] (gate, up), y / dy [N, F].
__global__ void swiglu_forward_bf16_kernel(unsigned short* y, const unsigned short* gu,
                                           std::int64_t total, int f) {
  TRIDENT_GRID_STRIDE(i, total) {
    const std::int64_t r = i / f, j = i % f;
    const float g = bf16_value(gu[r * 2 * f + j]), u = bf16_value(gu[r * 2 * f + f + j]);
    y[i] = bf16_bits(g / (1.0f + exp_clamped(-g)) * u);
  }
}

__global__ void swiglu_backward_bf16_kernel(unsigned short* dgu, const unsigned short* gu,
                                            const unsigned short* dy, std::int64_t total, int f) {
  TRIDENT_GRID_STRIDE(i, total) {
    const std::int64_t r = i / f, j = i % f;
    const float g = bf16_value(gu[r * 2 * f + j]), u = bf16_value(gu[r * 2 * f + f + j]);
    const float e = exp_clamped(-g);
    const float s = 1.0f / (1.0f + e);
    const float d = bf16_value(dy[i]);
    dgu[r * 2 * f + j] = bf16_bits(d * u * s * (1.0f + g * e * s));
    dgu[r * 2 * f + f + j] = bf16_bits(d * g * s);
  }
}

dim3 colsum_grid(int n, int cols) {
  const int blocks = colsum_row_blocks(n);
  return dim3(static_cast<unsigned>((cols + kBlock - 1) / kBlock),
              static_cast<unsigned>(blocks < 65535 ? blocks : 65535));
}

void colsum_add(cudaStream_t s, float* db, const float* partial, int n, int cols) {
  const int blocks = colsum_row_blocks(n);
  block_colsum_add_kernel<<<grid_for(cols), kBlock, 0, s>>>(db, partial, blocks, cols);
  check_launch("block_colsum_add");
}

}  // namespace

void launch_layernorm_forward_bf16(cudaStream_t s, void* y, float* mean, float* rstd,
                                   const float* x, const float* w, const float* b, int n, int c) {
  if (n <= 0 || c <= 0) return;
  const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  layernorm_forward_bf16_kernel<<<blocks, kRowsPerBlock * 32, 0, s>>>(
      static_cast<unsigned short*>(y), mean, rstd, x, w, b, n, c);
  check_launch("layernorm_forward_bf16");
}

void launch_gelu_forward_bf16(cudaStream_t s, void* y, const void* x, std::int64_t n) {
  if (n <= 0) return;
  gelu_forward_bf16_kernel<<<grid_for(n), kBlock, 0, s>>>(static_cast<unsigned short*>(y),
                                                          static_cast<const unsigned short*>(x), n);
  check_launch("gelu_forward_bf16");
}

void launch_gelu_backward_bf16_colsum(cudaStream_t s, void* dx, float* db, float* partial,
                                      const void* x, const void* dy, int n, int cols) {
  if (n <= 0 || cols <= 0) return;
  gelu_backward_bf16_colsum_kernel<<<colsum_grid(n, cols), kBlock, 0, s>>>(
      static_cast<unsigned short*>(dx), partial, static_cast<const unsigned short*>(x),
      static_cast<const unsigned short*>(dy), n, cols);
  check_launch("gelu_backward_bf16_colsum");
  colsum_add(s, db, partial, n, cols);
}

void launch_colsum_bf16(cudaStream_t s, float* db, float* partial, const void* src, int n,
                        int cols) {
  if (n <= 0 || cols <= 0) return;
  colsum_bf16_kernel<<<colsum_grid(n, cols), kBlock, 0, s>>>(
      partial, static_cast<const unsigned short*>(src), n, cols);
  check_launch("colsum_bf16");
  colsum_add(s, db, partial, n, cols);
}

void launch_rmsnorm_forward_bf16(cudaStream_t s, void* y, float* rstd, const float* x,
                                 const float* w, int n, int c, float eps) {
  if (n <= 0 || c <= 0) return;
  const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  rmsnorm_forward_bf16_kernel<<<blocks, kRowsPerBlock * 32, 0, s>>>(
      static_cast<unsigned short*>(y), rstd, x, w, n, c, eps);
  check_launch("rmsnorm_forward_bf16");
}

void launch_rope_bf16(cudaStream_t s, void* x, int b, int t, int ld, int heads, int hs, int pos0,
                      float theta, float sign) {
  if (b <= 0 || t <= 0 || heads <= 0 || hs <= 1) return;
  const std::int64_t total = std::int64_t(b) * t * (hs / 2);
  rope_bf16_kernel<<<grid_for(total), kBlock, 0, s>>>(static_cast<unsigned short*>(x), b, t, ld,
                                                      heads, hs, pos0, double(theta), sign);
  check_launch("rope_bf16");
}

void launch_swiglu_forward_bf16(cudaStream_t s, void* y, const void* gu, int n, int f) {
  const std::int64_t total = std::int64_t(n) * f;
  if (total <= 0) return;
  swiglu_forward_bf16_kernel<<<grid_for(total), kBlock, 0, s>>>(
      static_cast<unsigned short*>(y), static_cast<const unsigned short*>(gu), total, f);
  check_launch("swiglu_forward_bf16");
}

void launch_swiglu_backward_bf16(cudaStream_t s, void* dgu, const void* gu, const void* dy, int n,
                                 int f) {
  const std::int64_t total = std::int64_t(n) * f;
  if (total <= 0) return;
  swiglu_backward_bf16_kernel<<<grid_for(total), kBlock, 0, s>>>(
      static_cast<unsigned short*>(dgu), static_cast<const unsigned short*>(gu),
      static_cast<const unsigned short*>(dy), total, f);
  check_launch("swiglu_backward_bf16");
}

}  // namespace trident::ops::cuda
