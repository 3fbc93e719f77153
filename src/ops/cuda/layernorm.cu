// ops/cuda/layernorm.cu — LayerNorm (eps 1e-5) and RMSNorm (Llama) over the last dimension,
// forward and backward. One warp per row for everything per-row; the parameter gradients are
// column sums taken in a fixed order (per-chunk partials, then the chunks in order), so they do
// not depend on timing. Where the pointers are 16-byte aligned and C % 4 == 0, the backward's
// element passes (dx, the column partials) move 4 floats per access (common.cuh's Packed128)
// with the scalar kernels' per-element arithmetic and sum order: the same bits.
// defines: launch_layernorm_forward, launch_layernorm_backward, layernorm_partial_floats,
//          launch_rmsnorm_forward, launch_rmsnorm_backward, rmsnorm_partial_floats
#include "check.hpp"
#include "common.cuh"
#include "kernels.hpp"

namespace trident::ops::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr float kEps = 1e-5f;

// y[N,C] = (x - mean) * rstd * w + b; mean[N], rstd[N] (either may be null).
__global__ void layernorm_forward_kernel(float* y, float* mean, float* rstd, const float* x,
                                         const float* w, const float* b, int n, int c) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= n) return;  // the whole warp leaves together
  const float* xr = x + row * c;
  const RowStats st = layernorm_row_stats(xr, c, lane, kEps);
  const float m = st.mean, rs = st.rstd;
  float* yr = y + row * c;
  for (int j = lane; j < c; j += 32) yr[j] = (xr[j] - m) * rs * w[j] + b[j];
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = rs;
  }
}

// dx[N,C] += rstd * (dn - mean(dn) - norm * mean(dn * norm)), dn = w * dy.
__global__ void layernorm_backward_dx_kernel(float* dx, const float* dy, const float* x,
                                             const float* w, const float* mean,
                                             const float* rstd, int n, int c, bool packed) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= n) return;
  const float* xr = x + row * c;
  const float* dyr = dy + row * c;
  const float m = mean[row], rs = rstd[row];
  float dn_sum = 0.0f, dnn_sum = 0.0f;
  for (int j = lane; j < c; j += 32) {
    const float norm = (xr[j] - m) * rs;
    const float dn = w[j] * dyr[j];
    dn_sum += dn;
    dnn_sum += dn * norm;
  }
  const float dn_mean = warp_sum(dn_sum) / static_cast<float>(c);
  const float dnn_mean = warp_sum(dnn_sum) / static_cast<float>(c);
  float* dxr = dx + row * c;
  if (packed) {  // the same per-element math, 4 columns per lane step (the sums stay scalar)
    for (int j = lane * 4; j < c; j += 32 * 4) {
      const Floatx4 xv = Floatx4::load(xr + j), dyv = Floatx4::load(dyr + j);
      const Floatx4 wv = Floatx4::load(w + j);
      Floatx4 dxv = Floatx4::load(dxr + j);
      for (int e = 0; e < 4; e++) {
        const float norm = (xv[e] - m) * rs;
        const float dn = wv[e] * dyv[e];
        dxv[e] += (dn - dn_mean - norm * dnn_mean) * rs;
      }
      dxv.store(dxr + j);
    }
    return;
  }
  for (int j = lane; j < c; j += 32) {
    const float norm = (xr[j] - m) * rs;
    const float dn = w[j] * dyr[j];
    dxr[j] += (dn - dn_mean - norm * dnn_mean) * rs;
  }
}

// Column partials: block (32 columns x 8 row lanes), grid (column tiles, chunks). Chunk k
// sums rows k*8 + ty, stepping by chunks*8; the 8 row lanes are then added in order.
// partial[2][chunks][C]: dw terms (dy * norm), then db terms (dy).
constexpr int kColTile = 32, kRowLanes = 8, kMaxChunks = 64;

int chunks_for(int n) {
  const int want = (n + 63) / 64;  // about 64 rows per chunk
  return want < 1 ? 1 : (want < kMaxChunks ? want : kMaxChunks);
}

__global__ void layernorm_dwdb_partial_kernel(float* partial, const float* dy, const float* x,
                                              const float* mean, const float* rstd, int n,
                                              int c) {
  __shared__ float sdw[kRowLanes][kColTile];
  __shared__ float sdb[kRowLanes][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int col = blockIdx.x * kColTile + tx;
  const int chunks = gridDim.y;
  float dw = 0.0f, db = 0.0f;
  if (col < c) {
    for (std::int64_t i = std::int64_t(blockIdx.y) * kRowLanes + ty; i < n;
         i += std::int64_t(chunks) * kRowLanes) {
      const float g = dy[i * c + col];
      dw += g * ((x[i * c + col] - mean[i]) * rstd[i]);
      db += g;
    }
  }
  sdw[ty][tx] = dw;
  sdb[ty][tx] = db;
  __syncthreads();
  if (ty == 0 && col < c) {
    float sw = 0.0f, sb = 0.0f;
    for (int r = 0; r < kRowLanes; r++) {
      sw += sdw[r][tx];
      sb += sdb[r][tx];
    }
    partial[std::int64_t(blockIdx.y) * c + col] = sw;
    partial[(std::int64_t(chunks) + blockIdx.y) * c + col] = sb;
  }
}

// The kernel above with 4 columns per thread (c % 4 == 0, dy and x 16-byte aligned): a block
// covers 4 * kColTile columns; each column's rows, row lanes and chunks are summed in the
// same order, so the partials are the same bits.
__global__ void layernorm_dwdb_partial_packed_kernel(float* partial, const float* dy,
                                                     const float* x, const float* mean,
                                                     const float* rstd, int n, int c) {
  __shared__ Floatx4 sdw[kRowLanes][kColTile];
  __shared__ Floatx4 sdb[kRowLanes][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int col = (blockIdx.x * kColTile + tx) * 4;
  const int chunks = gridDim.y;
  Floatx4 dw{}, db{};
  if (col < c) {
    for (std::int64_t i = std::int64_t(blockIdx.y) * kRowLanes + ty; i < n;
         i += std::int64_t(chunks) * kRowLanes) {
      const Floatx4 g = Floatx4::load(dy + i * c + col), xv = Floatx4::load(x + i * c + col);
      const float m = mean[i], rs = rstd[i];
      for (int e = 0; e < 4; e++) {
        dw[e] += g[e] * ((xv[e] - m) * rs);
        db[e] += g[e];
      }
    }
  }
  sdw[ty][tx] = dw;
  sdb[ty][tx] = db;
  __syncthreads();
  if (ty == 0 && col < c) {
    Floatx4 sw{}, sb{};
    for (int r = 0; r < kRowLanes; r++)
      for (int e = 0; e < 4; e++) {
        sw[e] += sdw[r][tx][e];
        sb[e] += sdb[r][tx][e];
      }
    for (int e = 0; e < 4; e++) {  // a few bytes per column: partial's alignment unchecked
      partial[std::int64_t(blockIdx.y) * c + col + e] = sw[e];
      partial[(std::int64_t(chunks) + blockIdx.y) * c + col + e] = sb[e];
    }
  }
}

// dw[C] += sum over chunks of partial[0][k], db[C] += of partial[1][k], chunks in order.
__global__ void layernorm_dwdb_finish_kernel(float* dw, float* db, const float* partial,
                                             int chunks, int c) {
  for (int col = blockIdx.x * blockDim.x + threadIdx.x; col < c; col += gridDim.x * blockDim.x) {
    float sw = 0.0f, sb = 0.0f;
    for (int k = 0; k < chunks; k++) {
      sw += partial[std::int64_t(k) * c + col];
      sb += partial[(std::int64_t(chunks) + k) * c + col];
    }
    dw[col] += sw;
    db[col] += sb;
  }
}

// y[N,C] = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps); rstd[N] may be null.
__global__ void rmsnorm_forward_kernel(float* y, float* rstd, const float* x, const float* w,
                                       int n, int c, float eps) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= n) return;
  const float* xr = x + row * c;
  const float rs = rmsnorm_row_rstd(xr, c, lane, eps);
  float* yr = y + row * c;
  for (int j = lane; j < c; j += 32) yr[j] = xr[j] * rs * w[j];
  if (lane == 0 && rstd) rstd[row] = rs;
}

// dx[N,C] += rstd * (dn - norm * mean(dn * norm)), norm = x * rstd, dn = w * dy.
__global__ void rmsnorm_backward_dx_kernel(float* dx, const float* dy, const float* x,
                                           const float* w, const float* rstd, int n, int c,
                                           bool packed) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= n) return;
  const float* xr = x + row * c;
  const float* dyr = dy + row * c;
  const float rs = rstd[row];
  float dnn = 0.0f;
  for (int j = lane; j < c; j += 32) dnn += w[j] * dyr[j] * (xr[j] * rs);
  const float dnn_mean = warp_sum(dnn) / static_cast<float>(c);
  float* dxr = dx + row * c;
  if (packed) {  // as layernorm_backward_dx_kernel's
    for (int j = lane * 4; j < c; j += 32 * 4) {
      const Floatx4 xv = Floatx4::load(xr + j), dyv = Floatx4::load(dyr + j);
      const Floatx4 wv = Floatx4::load(w + j);
      Floatx4 dxv = Floatx4::load(dxr + j);
      for (int e = 0; e < 4; e++) dxv[e] += (wv[e] * dyv[e] - xv[e] * rs * dnn_mean) * rs;
      dxv.store(dxr + j);
    }
    return;
  }
  for (int j = lane; j < c; j += 32) dxr[j] += (w[j] * dyr[j] - xr[j] * rs * dnn_mean) * rs;
}

// partial[chunks][C] of dw (dy * norm), the layout and order of layernorm's.
__global__ void rmsnorm_dw_partial_kernel(float* partial, const float* dy, const float* x,
                                          const float* rstd, int n, int c) {
  __shared__ float sdw[kRowLanes][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int col = blockIdx.x * kColTile + tx;
  const int chunks = gridDim.y;
  float dw = 0.0f;
  if (col < c) {
    for (std::int64_t i = std::int64_t(blockIdx.y) * kRowLanes + ty; i < n;
         i += std::int64_t(chunks) * kRowLanes)
      dw += dy[i * c + col] * (x[i * c + col] * rstd[i]);
  }
  sdw[ty][tx] = dw;
  __syncthreads();
  if (ty == 0 && col < c) {
    float sw = 0.0f;
    for (int r = 0; r < kRowLanes; r++) sw += sdw[r][tx];
    partial[std::int64_t(blockIdx.y) * c + col] = sw;
  }
}

__global__ void rmsnorm_dw_finish_kernel(float* dw, const float* partial, int chunks, int c) {
  for (int col = blockIdx.x * blockDim.x + threadIdx.x; col < c; col += gridDim.x * blockDim.x) {
    float sw = 0.0f;
    for (int k = 0; k < chunks; k++) sw += partial[std::int64_t(k) * c + col];
    dw[col] += sw;
  }
}

}  // namespace

void launch_rmsnorm_forward(cudaStream_t s, float* y, float* rstd, const float* x, const float* w,
                            int n, int c, float eps) {
  if (n <= 0 || c <= 0) return;
  const unsigned grid = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  rmsnorm_forward_kernel<<<grid, kRowsPerBlock * 32, 0, s>>>(y, rstd, x, w, n, c, eps);
  check_launch("rmsnorm_forward");
}

std::int64_t rmsnorm_partial_floats(int n, int c) { return std::int64_t(chunks_for(n)) * c; }

void launch_rmsnorm_backward(cudaStream_t s, float* dx, float* dw, const float* dy, const float* x,
                             const float* w, const float* rstd, int n, int c, float* partial) {
  if (n <= 0 || c <= 0) return;
  const unsigned grid = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  const bool packed = packed_access() && c % 4 == 0 && aligned16(dx) && aligned16(dy) &&
                      aligned16(x) && aligned16(w);
  rmsnorm_backward_dx_kernel<<<grid, kRowsPerBlock * 32, 0, s>>>(dx, dy, x, w, rstd, n, c, packed);
  check_launch("rmsnorm_backward_dx");
  const int chunks = chunks_for(n);
  const dim3 pgrid(static_cast<unsigned>((c + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  rmsnorm_dw_partial_kernel<<<pgrid, dim3(kColTile, kRowLanes), 0, s>>>(partial, dy, x, rstd, n, c);
  check_launch("rmsnorm_dw_partial");
  rmsnorm_dw_finish_kernel<<<grid_for(c), kBlock, 0, s>>>(dw, partial, chunks, c);
  check_launch("rmsnorm_dw_finish");
}

void launch_layernorm_forward(cudaStream_t s, float* y, float* mean, float* rstd, const float* x,
                              const float* w, const float* b, int n, int c) {
  if (n <= 0 || c <= 0) return;
  const unsigned grid = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  layernorm_forward_kernel<<<grid, kRowsPerBlock * 32, 0, s>>>(y, mean, rstd, x, w, b, n, c);
  check_launch("layernorm_forward");
}

std::int64_t layernorm_partial_floats(int n, int c) {
  return 2 * std::int64_t(chunks_for(n)) * c;
}

void launch_layernorm_backward(cudaStream_t s, float* dx, float* dw, float* db, const float* dy,
                               const float* x, const float* w, const float* mean,
                               const float* rstd, int n, int c, float* partial) {
  if (n <= 0 || c <= 0) return;
  const unsigned grid = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  const bool packed = packed_access() && c % 4 == 0 && aligned16(dx) && aligned16(dy) &&
                      aligned16(x) && aligned16(w);
  layernorm_backward_dx_kernel<<<grid, kRowsPerBlock * 32, 0, s>>>(dx, dy, x, w, mean, rstd, n, c,
                                                                   packed);
  check_launch("layernorm_backward_dx");
  const int chunks = chunks_for(n);
  if (packed) {  // 4 columns per thread
    const int col_packs = c / 4;
    const dim3 pgrid(static_cast<unsigned>((col_packs + kColTile - 1) / kColTile),
                     static_cast<unsigned>(chunks));
    layernorm_dwdb_partial_packed_kernel<<<pgrid, dim3(kColTile, kRowLanes), 0, s>>>(
        partial, dy, x, mean, rstd, n, c);
  } else {
    const dim3 pgrid(static_cast<unsigned>((c + kColTile - 1) / kColTile),
                     static_cast<unsigned>(chunks));
    layernorm_dwdb_partial_kernel<<<pgrid, dim3(kColTile, kRowLanes), 0, s>>>(partial, dy, x,
                                                                              mean, rstd, n, c);
  }
  check_launch("layernorm_dwdb_partial");
  layernorm_dwdb_finish_kernel<<<grid_for(c), kBlock, 0, s>>>(dw, db, partial, chunks, c);
  check_launch("layernorm_dwdb_finish");
}

}  // namespace trident::ops::cuda
