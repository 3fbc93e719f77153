// ops/cuda/fused_block.cu — the kernels of the fused GPT-2 block (fused_block.cpp) on bf16
// activations: LayerNorm writing bf16, GELU on bf16, the GELU backward with the c_fc bias
// gradient in the same read, and the column sums of a bf16 gradient (c_attn's bias). bf16 is
// held as its 16 bits (unsigned short): rounded to nearest even as pointwise.cu's to_bf16, read
// back exactly. The arithmetic in fp32 is that of the fp32 kernels (layernorm.cu, pointwise.cu).
// The fused Llama block's: RMSNorm writing bf16, RoPE in place on bf16 q/k (or their
// gradients), SwiGLU and its backward on bf16. Where the pointers are 16-byte aligned and the
// widths allow, the elementwise kernels, the norms' output pass and the column sums move 16
// bytes per access (common.cuh's Packed128), each element's arithmetic (and each column's sum
// order) that of the scalar kernels, so the results are the same bits.
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
                                              int n, int c, bool packed) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= n) return;  // the whole warp leaves together
  const float* xr = x + row * c;
  const RowStats st = layernorm_row_stats(xr, c, lane, kEps);
  const float m = st.mean, rs = st.rstd;
  unsigned short* yr = y + row * c;
  if (packed) {  // the same per-element math, 8 columns per lane step (the sums stay scalar)
    for (int j = lane * 8; j < c; j += 32 * 8) {
      const Floatx4 x0 = Floatx4::load(xr + j), x1 = Floatx4::load(xr + j + 4);
      const Floatx4 w0 = Floatx4::load(w + j), w1 = Floatx4::load(w + j + 4);
      const Floatx4 b0 = Floatx4::load(b + j), b1 = Floatx4::load(b + j + 4);
      Bf16x8 out;
      for (int e = 0; e < 4; e++) {
        out[e] = bf16_bits((x0[e] - m) * rs * w0[e] + b0[e]);
        out[e + 4] = bf16_bits((x1[e] - m) * rs * w1[e] + b1[e]);
      }
      out.store(yr + j);
    }
  } else {
    for (int j = lane; j < c; j += 32) yr[j] = bf16_bits((xr[j] - m) * rs * w[j] + b[j]);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

__device__ __forceinline__ unsigned short gelu_bf16(unsigned short h) {
  const float xi = bf16_value(h);
  const float u = kGeluS * (xi + kGeluC * xi * xi * xi);
  return bf16_bits(xi / (1.0f + exp_clamped(-2.0f * u)));
}

__global__ void gelu_forward_bf16_kernel(unsigned short* y, const unsigned short* x,
                                         std::int64_t n) {
  TRIDENT_GRID_STRIDE(i, n) y[i] = gelu_bf16(x[i]);
}

// x and y 16-byte aligned: n / 8 packs, then the last n % 8 elements one by one.
__global__ void gelu_forward_bf16_packed_kernel(unsigned short* y, const unsigned short* x,
                                                std::int64_t n) {
  const std::int64_t packs = n / 8;
  TRIDENT_GRID_STRIDE(p, packs) {
    Bf16x8 v = Bf16x8::load(x + p * 8);
    for (int e = 0; e < 8; e++) v[e] = gelu_bf16(v[e]);
    v.store(y + p * 8);
  }
  TRIDENT_GRID_STRIDE(i, n - packs * 8) y[packs * 8 + i] = gelu_bf16(x[packs * 8 + i]);
}

// d/dx gelu(x) * dy on bf16 inputs (pointwise.cu's gelu_backward arithmetic).
__device__ __forceinline__ float gelu_backward_value(unsigned short xh, unsigned short dyh) {
  const float xi = bf16_value(xh);
  const float u = kGeluS * (xi + kGeluC * xi * xi * xi);
  const float du = kGeluS * (1.0f + 3.0f * kGeluC * xi * xi);
  const float e = exp_clamped(-2.0f * u);
  const float sg = 1.0f / (1.0f + e);
  return bf16_value(dyh) * sg * (1.0f + 2.0f * xi * e * sg * du);
}

// One thread per column, row blocks of kColsumRows in row order (to_bf16_colsum's order).
__global__ void gelu_backward_bf16_colsum_kernel(unsigned short* dx, float* partial,
                                                 const unsigned short* x,
                                                 const unsigned short* dy, int n, int cols) {
  column_sums(partial, n, cols, kColsumRows, [&](std::int64_t i) {
    const float v = gelu_backward_value(x[i], dy[i]);
    dx[i] = bf16_bits(v);
    return v;
  });
}

// The kernel above, 8 columns per thread (cols % 8 == 0, dx, x, dy, partial 16-byte aligned):
// each column's sum in the same row order, so the same partials bit for bit.
__global__ void gelu_backward_bf16_colsum_packed_kernel(unsigned short* dx, float* partial,
                                                        const unsigned short* x,
                                                        const unsigned short* dy, int n,
                                                        int cols) {
  column_sums8(partial, n, cols, kColsumRows, [&](std::int64_t i, float* v) {
    const Bf16x8 xv = Bf16x8::load(x + i), dyv = Bf16x8::load(dy + i);
    Bf16x8 out;
    for (int e = 0; e < 8; e++) {
      v[e] = gelu_backward_value(xv[e], dyv[e]);
      out[e] = bf16_bits(v[e]);
    }
    out.store(dx + i);
  });
}

__global__ void colsum_bf16_kernel(float* partial, const unsigned short* src, int n, int cols) {
  column_sums(partial, n, cols, kColsumRows, [&](std::int64_t i) { return bf16_value(src[i]); });
}

// The kernel above, 8 columns per thread (as gelu_backward_bf16_colsum_packed_kernel).
__global__ void colsum_bf16_packed_kernel(float* partial, const unsigned short* src, int n,
                                          int cols) {
  column_sums8(partial, n, cols, kColsumRows, [&](std::int64_t i, float* v) {
    const Bf16x8 b = Bf16x8::load(src + i);
    for (int e = 0; e < 8; e++) v[e] = bf16_value(b[e]);
  });
}

// layernorm.cu's rmsnorm_forward arithmetic, y written as bf16.
__global__ void rmsnorm_forward_bf16_kernel(unsigned short* y, float* rstd, const float* x,
                                            const float* w, int n, int c, float eps,
                                            bool packed) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= n) return;
  const float* xr = x + row * c;
  const float rs = rmsnorm_row_rstd(xr, c, lane, eps);
  unsigned short* yr = y + row * c;
  if (packed) {  // as layernorm_forward_bf16_kernel's
    for (int j = lane * 8; j < c; j += 32 * 8) {
      const Floatx4 x0 = Floatx4::load(xr + j), x1 = Floatx4::load(xr + j + 4);
      const Floatx4 w0 = Floatx4::load(w + j), w1 = Floatx4::load(w + j + 4);
      Bf16x8 out;
      for (int e = 0; e < 4; e++) {
        out[e] = bf16_bits(x0[e] * rs * w0[e]);
        out[e + 4] = bf16_bits(x1[e] * rs * w1[e]);
      }
      out.store(yr + j);
    }
  } else {
    for (int j = lane; j < c; j += 32) yr[j] = bf16_bits(xr[j] * rs * w[j]);
  }
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
__device__ __forceinline__ unsigned short swiglu_bf16(unsigned short gh, unsigned short uh) {
  const float g = bf16_value(gh), u = bf16_value(uh);
  return bf16_bits(g / (1.0f + exp_clamped(-g)) * u);
}

// dgate (returned) and dup (*dup) of one element.
__device__ __forceinline__ unsigned short swiglu_backward_bf16(unsigned short gh,
                                                               unsigned short uh,
                                                               unsigned short dyh,
                                                               unsigned short* dup) {
  const float g = bf16_value(gh), u = bf16_value(uh);
  const float e = exp_clamped(-g);
  const float s = 1.0f / (1.0f + e);
  const float d = bf16_value(dyh);
  *dup = bf16_bits(d * g * s);
  return bf16_bits(d * u * s * (1.0f + g * e * s));
}

__global__ void swiglu_forward_bf16_kernel(unsigned short* y, const unsigned short* gu,
                                           std::int64_t total, int f) {
  TRIDENT_GRID_STRIDE(i, total) {
    const std::int64_t r = i / f, j = i % f;
    y[i] = swiglu_bf16(gu[r * 2 * f + j], gu[r * 2 * f + f + j]);
  }
}

__global__ void swiglu_backward_bf16_kernel(unsigned short* dgu, const unsigned short* gu,
                                            const unsigned short* dy, std::int64_t total, int f) {
  TRIDENT_GRID_STRIDE(i, total) {
    const std::int64_t r = i / f, j = i % f;
    unsigned short dup;
    const unsigned short dgate =
        swiglu_backward_bf16(gu[r * 2 * f + j], gu[r * 2 * f + f + j], dy[i], &dup);
    dgu[r * 2 * f + j] = dgate;
    dgu[r * 2 * f + f + j] = dup;
  }
}

// The two kernels above in packs of 8 (f % 8 == 0, every pointer 16-byte aligned): pack p is
// elements [8p, 8p + 8) of y / dy, inside one row.
__global__ void swiglu_forward_bf16_packed_kernel(unsigned short* y, const unsigned short* gu,
                                                  std::int64_t total, int f) {
  TRIDENT_GRID_STRIDE(p, total / 8) {
    const std::int64_t i = p * 8, r = i / f, j = i % f;
    const Bf16x8 g = Bf16x8::load(gu + r * 2 * f + j), u = Bf16x8::load(gu + r * 2 * f + f + j);
    Bf16x8 out;
    for (int e = 0; e < 8; e++) out[e] = swiglu_bf16(g[e], u[e]);
    out.store(y + i);
  }
}

__global__ void swiglu_backward_bf16_packed_kernel(unsigned short* dgu, const unsigned short* gu,
                                                   const unsigned short* dy, std::int64_t total,
                                                   int f) {
  TRIDENT_GRID_STRIDE(p, total / 8) {
    const std::int64_t i = p * 8, r = i / f, j = i % f;
    const Bf16x8 g = Bf16x8::load(gu + r * 2 * f + j), u = Bf16x8::load(gu + r * 2 * f + f + j);
    const Bf16x8 d = Bf16x8::load(dy + i);
    Bf16x8 dg, du;
    for (int e = 0; e < 8; e++) dg[e] = swiglu_backward_bf16(g[e], u[e], d[e], &du[e]);
    dg.store(dgu + r * 2 * f + j);
    du.store(dgu + r * 2 * f + f + j);
  }
}

dim3 colsum_grid(int n, int cols) {
  const int blocks = colsum_row_blocks(n);
  return dim3(static_cast<unsigned>((cols + kBlock - 1) / kBlock),
              static_cast<unsigned>(blocks < 65535 ? blocks : 65535));
}

// The packed column-sum kernels: 8 columns per thread, kColsumPackThreads threads per block
// (fewer than kBlock: GPT-2's 768 columns are 96 threads; more blocks spread over the SMs).
constexpr int kColsumPackThreads = 64;

dim3 colsum_packed_grid(int n, int cols) {
  const int blocks = colsum_row_blocks(n);
  const int threads = cols / 8;
  return dim3(static_cast<unsigned>((threads + kColsumPackThreads - 1) / kColsumPackThreads),
              static_cast<unsigned>(blocks < 65535 ? blocks : 65535));
}

}  // namespace

void launch_layernorm_forward_bf16(cudaStream_t s, void* y, float* mean, float* rstd,
                                   const float* x, const float* w, const float* b, int n, int c) {
  if (n <= 0 || c <= 0) return;
  const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  const bool packed = packed_access() && c % 8 == 0 && aligned16(y) && aligned16(x) &&
                      aligned16(w) && aligned16(b);
  layernorm_forward_bf16_kernel<<<blocks, kRowsPerBlock * 32, 0, s>>>(
      static_cast<unsigned short*>(y), mean, rstd, x, w, b, n, c, packed);
  check_launch("layernorm_forward_bf16");
}

void launch_gelu_forward_bf16(cudaStream_t s, void* y, const void* x, std::int64_t n) {
  if (n <= 0) return;
  if (packed_access() && aligned16(y) && aligned16(x))
    gelu_forward_bf16_packed_kernel<<<grid_for((n + 7) / 8), kBlock, 0, s>>>(
        static_cast<unsigned short*>(y), static_cast<const unsigned short*>(x), n);
  else
    gelu_forward_bf16_kernel<<<grid_for(n), kBlock, 0, s>>>(
        static_cast<unsigned short*>(y), static_cast<const unsigned short*>(x), n);
  check_launch("gelu_forward_bf16");
}

void launch_gelu_backward_bf16_colsum(cudaStream_t s, void* dx, float* db, float* partial,
                                      const void* x, const void* dy, int n, int cols) {
  if (n <= 0 || cols <= 0) return;
  const dim3 packed_grid = colsum_packed_grid(n, cols);
  if (packed_access() && cols % 8 == 0 && aligned16(dx) && aligned16(partial) && aligned16(x) &&
      aligned16(dy))
    gelu_backward_bf16_colsum_packed_kernel<<<packed_grid, kColsumPackThreads, 0, s>>>(
        static_cast<unsigned short*>(dx), partial, static_cast<const unsigned short*>(x),
        static_cast<const unsigned short*>(dy), n, cols);
  else
    gelu_backward_bf16_colsum_kernel<<<colsum_grid(n, cols), kBlock, 0, s>>>(
        static_cast<unsigned short*>(dx), partial, static_cast<const unsigned short*>(x),
        static_cast<const unsigned short*>(dy), n, cols);
  check_launch("gelu_backward_bf16_colsum");
  launch_colsum_add(s, db, partial, n, cols);
}

void launch_colsum_bf16(cudaStream_t s, float* db, float* partial, const void* src, int n,
                        int cols) {
  if (n <= 0 || cols <= 0) return;
  if (packed_access() && cols % 8 == 0 && aligned16(partial) && aligned16(src))
    colsum_bf16_packed_kernel<<<colsum_packed_grid(n, cols), kColsumPackThreads, 0, s>>>(
        partial, static_cast<const unsigned short*>(src), n, cols);
  else
    colsum_bf16_kernel<<<colsum_grid(n, cols), kBlock, 0, s>>>(
        partial, static_cast<const unsigned short*>(src), n, cols);
  check_launch("colsum_bf16");
  launch_colsum_add(s, db, partial, n, cols);
}

void launch_rmsnorm_forward_bf16(cudaStream_t s, void* y, float* rstd, const float* x,
                                 const float* w, int n, int c, float eps) {
  if (n <= 0 || c <= 0) return;
  const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  const bool packed = packed_access() && c % 8 == 0 && aligned16(y) && aligned16(x) && aligned16(w);
  rmsnorm_forward_bf16_kernel<<<blocks, kRowsPerBlock * 32, 0, s>>>(
      static_cast<unsigned short*>(y), rstd, x, w, n, c, eps, packed);
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
  if (packed_access() && f % 8 == 0 && aligned16(y) && aligned16(gu))
    swiglu_forward_bf16_packed_kernel<<<grid_for(total / 8), kBlock, 0, s>>>(
        static_cast<unsigned short*>(y), static_cast<const unsigned short*>(gu), total, f);
  else
    swiglu_forward_bf16_kernel<<<grid_for(total), kBlock, 0, s>>>(
        static_cast<unsigned short*>(y), static_cast<const unsigned short*>(gu), total, f);
  check_launch("swiglu_forward_bf16");
}

void launch_swiglu_backward_bf16(cudaStream_t s, void* dgu, const void* gu, const void* dy, int n,
                                 int f) {
  const std::int64_t total = std::int64_t(n) * f;
  if (total <= 0) return;
  if (packed_access() && f % 8 == 0 && aligned16(dgu) && aligned16(gu) && aligned16(dy))
    swiglu_backward_bf16_packed_kernel<<<grid_for(total / 8), kBlock, 0, s>>>(
        static_cast<unsigned short*>(dgu), static_cast<const unsigned short*>(gu),
        static_cast<const unsigned short*>(dy), total, f);
  else
    swiglu_backward_bf16_kernel<<<grid_for(total), kBlock, 0, s>>>(
        static_cast<unsigned short*>(dgu), static_cast<const unsigned short*>(gu),
        static_cast<const unsigned short*>(dy), total, f);
  check_launch("swiglu_backward_bf16");
}

}  // namespace trident::ops::cuda
