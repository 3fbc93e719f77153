// Flash attention on one GPU through trident's CUDA backend: the scalar fp32 kernels
// (flash_attention.cu) against the tensor-core ones (flash_attention_tc.cu), chosen with
// TRIDENT_CUDA_ATTENTION when each backend is made, bf16 precision, causal, on GPT's fused
// qkv[B, T, 3C] (the model's call exactly). Each timed with CUDA events (median of the
// repetitions). One JSON object per (kernels, shape) line:
//   {"kernels": "scalar"|"tc", "b", "t", "nh", "hs", "fwd_ms", "bwd_ms", "fwd_tflops",
//    "bwd_tflops"}
// FLOPs as FlashAttention counts them: forward 4 B NH T^2 HS / 2 (causal: half the scores),
// backward 2.5 times the forward.
// Usage: trident_bench_cuda_attention [repetitions (10)] [B (8)] [T (1024)] [NH (12)] [HS (64)]
// defines: main
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/ops/cuda.hpp"
#include "trident/ops/ops.hpp"

namespace {

using trident::ops::Ops;
using trident::ops::Precision;

double median_ms(Ops& ops, int reps, const std::function<void()>& f) {
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  f();  // warm-up
  trident::ops::cuda_synchronize(ops);
  std::vector<double> ms;
  for (int i = 0; i < reps; i++) {
    // the backend's stream is blocking: events on the legacy default stream order with it
    cudaEventRecord(t0, nullptr);
    f();
    cudaEventRecord(t1, nullptr);
    cudaEventSynchronize(t1);
    float e = 0.0f;
    cudaEventElapsedTime(&e, t0, t1);
    ms.push_back(e);
  }
  trident::ops::cuda_synchronize(ops);  // surfaces a kernel fault as an Error
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void run(const char* kernels, int reps, int b, int t, int nh, int hs) {
  setenv("TRIDENT_CUDA_ATTENTION", kernels, 1);
  auto ops = trident::ops::make_cuda_ops(Precision::bf16, std::size_t(4) << 30);
  const int c = nh * hs;
  const std::size_t rows = std::size_t(b) * t;
  std::vector<float> h(rows * 3 * c);
  std::mt19937 gen(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (float& x : h) x = d(gen);
  trident::FloatBuffer qkv(h.size(), ops->memory()), dqkv(h.size(), ops->memory()),
      out(rows * c, ops->memory()), dout(rows * c, ops->memory()),
      lse(std::size_t(b) * nh * t, ops->memory());
  ops->memory()->to_device(qkv.data(), h.data(), h.size() * sizeof(float));
  ops->memory()->to_device(dout.data(), h.data(), rows * c * sizeof(float));
  const Ops::AttentionShape s = trident::ops::attention_shape_qkv(b, t, c, nh);
  float* q = qkv.data();
  float* g = dqkv.data();
  const double fwd = median_ms(*ops, reps, [&] {
    ops->attention_forward(out.data(), lse.data(), q, q + c, q + 2 * c, s);
  });
  const double bwd = median_ms(*ops, reps, [&] {
    ops->attention_backward(g, g + c, g + 2 * c, dout.data(), out.data(), lse.data(), q, q + c,
                            q + 2 * c, s);
  });
  const double flops = 4.0 * b * nh * double(t) * t * hs / 2;
  std::printf("{\"kernels\": \"%s\", \"b\": %d, \"t\": %d, \"nh\": %d, \"hs\": %d, "
              "\"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"fwd_tflops\": %.2f, \"bwd_tflops\": %.2f}\n",
              kernels, b, t, nh, hs, fwd, bwd, flops / fwd * 1e-9, 2.5 * flops / bwd * 1e-9);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int b = argc > 2 ? std::atoi(argv[2]) : 8, t = argc > 3 ? std::atoi(argv[3]) : 1024;
  const int nh = argc > 4 ? std::atoi(argv[4]) : 12, hs = argc > 5 ? std::atoi(argv[5]) : 64;
  if (reps < 1 || b < 1 || t < 1 || nh < 1 || hs < 1) {
    std::fprintf(stderr, "usage: trident_bench_cuda_attention [reps] [B] [T] [NH] [HS]\n");
    return 2;
  }
  try {
    for (const char* k : {"scalar", "tc"}) run(k, reps, b, t, nh, hs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trident_bench_cuda_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
