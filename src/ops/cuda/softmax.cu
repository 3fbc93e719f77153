// ops/cuda/softmax.cu — the causal softmax of attention and its backward, one warp per row of
// att[B*NH*T, T]. The scores arrive already scaled by 1/sqrt(hs) (the GEMM's alpha).
// defines: launch_causal_softmax, launch_causal_softmax_backward
#include "check.hpp"
#include "common.cuh"
#include "kernels.hpp"

namespace trident::ops::cuda {

namespace {

constexpr int kRowsPerBlock = 8;

// Row r (query i = r % T): att[j] = exp(s_j - max) / sum over j <= i; 0 for j > i.
__global__ void causal_softmax_kernel(float* att, std::int64_t rows, int t) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int i = static_cast<int>(row % t);
  float* a = att + row * t;
  float mx = -INFINITY;
  for (int j = lane; j <= i; j += 32) mx = fmaxf(mx, a[j]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int j = lane; j <= i; j += 32) sum += expf(a[j] - mx);
  const float inv = 1.0f / warp_sum(sum);
  for (int j = lane; j < t; j += 32) a[j] = j <= i ? expf(a[j] - mx) * inv : 0.0f;
}

// In place: d[j] = scale * att[j] * (d[j] - sum_k att[k] d[k]) for j <= i, 0 above.
__global__ void causal_softmax_backward_kernel(float* datt, const float* att, std::int64_t rows,
                                               int t, float scale) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int i = static_cast<int>(row % t);
  const float* a = att + row * t;
  float* d = datt + row * t;
  float dot = 0.0f;
  for (int j = lane; j <= i; j += 32) dot += a[j] * d[j];
  dot = warp_sum(dot);  // every lane has read its entries before any is written
  for (int j = lane; j < t; j += 32) d[j] = j <= i ? scale * a[j] * (d[j] - dot) : 0.0f;
}

unsigned grid_rows(std::int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

void launch_causal_softmax(cudaStream_t s, float* att, std::int64_t rows, int t) {
  if (rows <= 0 || t <= 0) return;
  causal_softmax_kernel<<<grid_rows(rows), kRowsPerBlock * 32, 0, s>>>(att, rows, t);
  check_launch("causal_softmax");
}

void launch_causal_softmax_backward(cudaStream_t s, float* datt, const float* att,
                                    std::int64_t rows, int t, float scale) {
  if (rows <= 0 || t <= 0) return;
  causal_softmax_backward_kernel<<<grid_rows(rows), kRowsPerBlock * 32, 0, s>>>(datt, att, rows,
                                                                               t, scale);
  check_launch("causal_softmax_backward");
}

}  // namespace trident::ops::cuda
