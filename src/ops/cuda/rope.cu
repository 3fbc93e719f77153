// ops/cuda/rope.cu — rotary position embedding (Llama, rotate_half layout), in place, forward
// (rotation by +a) and backward (by -a). One thread per (batch row, position, frequency i),
// looping over the heads: the angle is formed once, in double, as the CPU backend forms it.
// defines: launch_rope
#include "check.hpp"
#include "common.cuh"
#include "kernels.hpp"

namespace trident::ops::cuda {

namespace {

__global__ void rope_kernel(float* x, int b, int t, int ld, int heads, int hs, int pos0,
                            double theta, float sign) {
  const int half = hs / 2;
  const std::int64_t total = std::int64_t(b) * t * half;
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < total;
       k += std::int64_t(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(k % half);
    const std::int64_t row = k / half;  // b * t + position
    const int p = static_cast<int>(row % t);
    // theta^(-2i/hs) and the angle in double, as the CPU backend (rope.cpp) forms them
    const double a = double(pos0 + p) * pow(theta, -2.0 * i / hs);
    const float cs = static_cast<float>(cos(a)), sn = sign * static_cast<float>(sin(a));
    float* x1 = x + row * ld + i;
    for (int h = 0; h < heads; h++, x1 += hs) {
      const float u = x1[0], v = x1[half];
      x1[0] = u * cs - v * sn;
      x1[half] = v * cs + u * sn;
    }
  }
}

}  // namespace

void launch_rope(cudaStream_t s, float* x, int b, int t, int ld, int heads, int hs, int pos0,
                 float theta, float sign) {
  if (b <= 0 || t <= 0 || heads <= 0 || hs <= 1) return;
  const std::int64_t total = std::int64_t(b) * t * (hs / 2);
  rope_kernel<<<grid_for(total), kBlock, 0, s>>>(x, b, t, ld, heads, hs, pos0, double(theta), sign);
  check_launch("rope");
}

}  // namespace trident::ops::cuda
