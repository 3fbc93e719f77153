// ops/cuda/embedding.cu — masked (vocab-parallel) token embedding and position embedding,
// one thread per element in grid-stride loops.
// defines: launch_embedding_forward, launch_embedding_backward, launch_position_forward,
//          launch_position_backward
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

void launch_embedding_backward(cudaStream_t s, float* dwte, const float* dx,
                               const std::int32_t* tokens, int n, int c, int vocab_start, int v) {
  if (n <= 0 || c <= 0) return;
  embedding_backward_kernel<<<grid_for(std::int64_t(n) * c), kBlock, 0, s>>>(dwte, dx, tokens, n,
                                                                             c, vocab_start, v);
  check_launch("embedding_backward");
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
