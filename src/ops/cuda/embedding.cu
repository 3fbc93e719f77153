// ops/cuda/embedding.cu — masked (vocab-parallel) token embedding and position embedding,
// one thread per element in grid-stride loops; the token embedding's backward grouped by row
// so that it adds in the tokens' order (deterministic, the CPU's bits).
// defines: launch_embedding_forward, launch_embedding_backward, embedding_backward_scratch_ints,
//          launch_position_forward, launch_position_backward
#include "check.hpp"
#include "common.cuh"
#include "kernels.hpp"

namespace trident::ops::cuda {

namespace {

// x[N,C] = wte[tok - vocab_start] when in [0, v), else 0.
__global__ void embedding_forward_kernel(float* x, const std::int32_t* tokens, const float* wte,
                                         int n, int c, int vocab_start, int v) {
  const std::int64_t total = std::int64_t(n) * c;
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t i = e / c, j = e % c;
    const std::int64_t row = std::int64_t(tokens[i]) - vocab_start;
    x[e] = (row >= 0 && row < v) ? wte[row * c + j] : 0.0f;
  }
}

// dwte[row] += dx[i] for the tokens in range (atomicAdd: tokens repeat).
__global__ void embedding_backward_kernel(float* dwte, const float* dx,
                                          const std::int32_t* tokens, int n, int c,
                                          int vocab_start, int v) {
  const std::int64_t total = std::int64_t(n) * c;
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t i = e / c, j = e % c;
    const std::int64_t row = std::int64_t(tokens[i]) - vocab_start;
    if (row >= 0 && row < v) atomicAdd(dwte + row * c + j, dx[e]);
  }
}

// ---- the deterministic backward: a counting sort of the tokens by row, then one block per
// row adds its tokens' gradients in token order, as the CPU does (the same bits, run to run).

__global__ void fill_ints_kernel(int* p, int value, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = value;
}

// counts[row] = how many tokens fall in row (in range only).
__global__ void embedding_count_kernel(int* counts, const std::int32_t* tokens, int n,
                                       int vocab_start, int v) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const std::int64_t row = std::int64_t(tokens[i]) - vocab_start;
    if (row >= 0 && row < v) atomicAdd(counts + row, 1);
  }
}

// start[row] = counts[0] + ... + counts[row - 1] for row in [0, v] (start[v]: the tokens in
// range), and fill = start. One block: each thread scans a contiguous range after thread 0 has
// summed the ranges' totals.
__global__ void embedding_scan_kernel(int* start, int* fill, const int* counts, int v) {
  __shared__ int totals[kBlock + 1];
  const int per = (v + kBlock - 1) / kBlock;
  const int lo = int(threadIdx.x) * per < v ? int(threadIdx.x) * per : v;
  const int hi = lo + per < v ? lo + per : v;
  int sum = 0;
  for (int r = lo; r < hi; r++) sum += counts[r];
  totals[threadIdx.x + 1] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    totals[0] = 0;
    for (int t = 1; t <= kBlock; t++) totals[t] += totals[t - 1];
  }
  __syncthreads();
  int run = totals[threadIdx.x];
  for (int r = lo; r < hi; r++) {
    start[r] = run;
    fill[r] = run;
    run += counts[r];
  }
  if (threadIdx.x == kBlock - 1) start[v] = totals[kBlock];
}

// placed[start[row] ...]: the positions of row's tokens, in whatever order the atomics give.
// (Walked from the last position: where blocks run one after another, as on the stand-in, each
// row's positions land in descending order, so the ranking below is exercised.)
__global__ void embedding_place_kernel(int* placed, int* fill, const std::int32_t* tokens, int n,
                                       int vocab_start, int v) {
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
    const int i = n - 1 - e;
    const std::int64_t row = std::int64_t(tokens[i]) - vocab_start;
    if (row >= 0 && row < v) placed[atomicAdd(fill + row, 1)] = i;
  }
}

// One block per row with tokens (the block whose k is the row's first slot): its positions in
// ascending order into sorted (each by its rank among the row's), then dwte[row] += dx[i] for
// them in that order, one thread per channel.
__global__ void embedding_rows_kernel(float* dwte, int* sorted, const int* placed,
                                      const int* start, const std::int32_t* tokens,
                                      const float* dx, int c, int vocab_start, int v) {
  const int in_range = start[v];
  for (int k = blockIdx.x; k < in_range; k += gridDim.x) {  // uniform in the block
    const int row = int(std::int64_t(tokens[placed[k]]) - vocab_start);
    const int first = start[row];
    if (k != first) continue;
    const int count = start[row + 1] - first;
    for (int e = threadIdx.x; e < count; e += blockDim.x) {
      const int pos = placed[first + e];
      int rank = 0;
      for (int f = 0; f < count; f++) rank += placed[first + f] < pos;
      sorted[first + rank] = pos;
    }
    __syncthreads();
    float* dr = dwte + std::int64_t(row) * c;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
      float acc = dr[j];
      for (int e = 0; e < count; e++) acc += dx[std::int64_t(sorted[first + e]) * c + j];
      dr[j] = acc;
    }
  }
}

// x[B,T,C] += wpe[t]
__global__ void position_forward_kernel(float* x, const float* wpe, int b, int t, int c) {
  const std::int64_t total = std::int64_t(b) * t * c;
  const std::int64_t tc = std::int64_t(t) * c;
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x)
    x[e] += wpe[e % tc];
}

// dwpe[T,C] += dx[0,t], then += dx[1,t], ... (the CPU's order)
__global__ void position_backward_kernel(float* dwpe, const float* dx, int b, int t, int c) {
  const std::int64_t tc = std::int64_t(t) * c;
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < tc;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    float acc = dwpe[e];
    for (int bb = 0; bb < b; bb++) acc += dx[bb * tc + e];
    dwpe[e] = acc;
  }
}

}  // namespace

void launch_embedding_forward(cudaStream_t s, float* x, const std::int32_t* tokens,
                              const float* wte, int n, int c, int vocab_start, int v) {
  if (n <= 0 || c <= 0) return;
  embedding_forward_kernel<<<grid_for(std::int64_t(n) * c), kBlock, 0, s>>>(x, tokens, wte, n, c,
                                                                            vocab_start, v);
  check_launch("embedding_forward");
}

std::int64_t embedding_backward_scratch_ints(int n, int v) {
  return 3 * std::int64_t(v) + 1 + 2 * std::int64_t(n);  // counts, start, fill; placed, sorted
}

void launch_embedding_backward(cudaStream_t s, float* dwte, const float* dx,
                               const std::int32_t* tokens, int n, int c, int vocab_start, int v,
                               int* scratch) {
  if (n <= 0 || c <= 0 || v <= 0) return;
  if (!scratch) {
    embedding_backward_kernel<<<grid_for(std::int64_t(n) * c), kBlock, 0, s>>>(
        dwte, dx, tokens, n, c, vocab_start, v);
    check_launch("embedding_backward");
    return;
  }
  int *counts = scratch, *start = counts + v, *fill = start + v + 1, *placed = fill + v;
  int* sorted = placed + n;
  fill_ints_kernel<<<grid_for(v), kBlock, 0, s>>>(counts, 0, v);
  embedding_count_kernel<<<grid_for(n), kBlock, 0, s>>>(counts, tokens, n, vocab_start, v);
  embedding_scan_kernel<<<1, kBlock, 0, s>>>(start, fill, counts, v);
  embedding_place_kernel<<<grid_for(n), kBlock, 0, s>>>(placed, fill, tokens, n, vocab_start, v);
  const int blocks = n < (1 << 16) ? n : (1 << 16);
  embedding_rows_kernel<<<blocks, kBlock, 0, s>>>(dwte, sorted, placed, start, tokens, dx, c,
                                                  vocab_start, v);
  check_launch("embedding_backward (by row)");
}

void launch_position_forward(cudaStream_t s, float* x, const float* wpe, int b, int t, int c) {
  if (b <= 0 || t <= 0 || c <= 0) return;
  position_forward_kernel<<<grid_for(std::int64_t(b) * t * c), kBlock, 0, s>>>(x, wpe, b, t, c);
  check_launch("position_forward");
}

void launch_position_backward(cudaStream_t s, float* dwpe, const float* dx, int b, int t, int c) {
  if (b <= 0 || t <= 0 || c <= 0) return;
  position_backward_kernel<<<grid_for(std::int64_t(t) * c), kBlock, 0, s>>>(dwpe, dx, b, t, c);
  check_launch("position_backward");
}

}  // namespace trident::ops::cuda
