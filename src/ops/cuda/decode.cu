// ops/cuda/decode.cu — attention of one new query row against a key-value cache (generation),
// as the CPU backend's decode.cpp: one block per (sequence, head), the scores in scratch.
// defines: launch_attention_decode
#include "check.hpp"
#include "common.cuh"
#include "kernels.hpp"

namespace trident::ops::cuda {

namespace {

constexpr int kDecodeThreads = 128;

__global__ void attention_decode_kernel(float* out, float* scratch, const float* q,
                                        const float* k, const float* v, int s, int nh, int rep,
                                        int hs, std::int64_t ld_q, std::int64_t ld_kv,
                                        std::int64_t kv_batch, std::int64_t ld_o, float scale) {
  __shared__ float red[32];
  const int bb = blockIdx.x / nh, h = blockIdx.x % nh;
  const float* qh = q + bb * ld_q + std::int64_t(h) * hs;
  const std::int64_t col = std::int64_t(h / rep) * hs;
  const float* kb = k + bb * kv_batch + col;
  const float* vb = v + bb * kv_batch + col;
  float* p = scratch + std::int64_t(blockIdx.x) * s;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < s; j += blockDim.x) {
    const float* kj = kb + j * ld_kv;
    float dot = 0.0f;
    for (int d = 0; d < hs; d++) dot += qh[d] * kj[d];
    p[j] = dot * scale;
    mx = fmaxf(mx, p[j]);
  }
  mx = block_max(mx, red);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < s; j += blockDim.x) {
    const float e = expf(p[j] - mx);
    p[j] = e;
    sum += e;
  }
  sum = block_sum(sum, red);  // its __syncthreads also publish every p[j]
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < s; j++) acc += p[j] * vb[j * ld_kv + d];
    out[bb * ld_o + std::int64_t(h) * hs + d] = acc / sum;
  }
}

}  // namespace

void launch_attention_decode(cudaStream_t s, float* out, float* scratch, const float* q,
                             const float* k, const float* v, int b, int n_keys, int nh, int nkv,
                             int hs, std::int64_t ld_q, std::int64_t ld_kv, std::int64_t kv_batch,
                             std::int64_t ld_o) {
  if (b <= 0 || nh <= 0 || n_keys <= 0) return;
  const float scale = 1.0f / sqrtf(float(hs));
  attention_decode_kernel<<<unsigned(b * nh), kDecodeThreads, 0, s>>>(out, scratch, q, k, v, n_keys, nh, nh / nkv, hs, ld_q, ld_kv, kv_batch, ld_o, scale);
  check_launch("attention_decode");
}

}  // namespace trident::ops::cuda
