// ops/cuda/classifier.cu — the fused classifier of the LM head under bf16 (CudaOps::lm_head,
// fused_head.cpp): one block per row of bf16 logits[N, ld] (a whole vocabulary), in one read
// the row's max and sum of exponentials (online: each thread rescales its sum when its max
// grows) and the target logit, then the loss, then (with the backward) a second read of the
// row, in L2 while the block still works on it, that overwrites it with the bf16 dlogits =
// scale * (softmax - onehot). Columns [v_valid, ld) are padding: ignored, gradient 0. Rows
// are read and written 8 bf16 (16 bytes) at a time where ld and the base allow it. llm.c's
// fused_classifier is the model (one block per row, 1024 threads, the second read from L2).
// defines: launch_fused_classifier
#include <cstring>

#include "check.hpp"
#include "common.cuh"
#include "kernels.hpp"

namespace trident::ops::cuda {

namespace {

constexpr int kClassifierThreads = 1024;  // few rows in flight: their second read hits L2
constexpr int kPack = Bf16x8::kSize;      // bf16 per 16-byte access (common.cuh)

// loss[i] = log(sum_j exp(l_j - max)) + max - l_target over j < v_valid; with backward,
// row i becomes dlogits in place. packed: ld % 8 == 0 and a 16-byte aligned base.
__global__ void __launch_bounds__(kClassifierThreads)
    fused_classifier_kernel(unsigned short* logits, float* loss, const std::int32_t* targets,
                            int ld, int v_valid, float scale, int backward, int packed) {
  __shared__ float shared_max[32];
  __shared__ float shared_sum[32];
  const int i = blockIdx.x;
  unsigned short* row = logits + std::int64_t(i) * ld;
  const int target = targets[i];
  const bool has_target = target >= 0 && target < v_valid;
  // read before any thread writes the row (the reductions below are barriers)
  const float target_logit = has_target ? bf16_value(row[target]) : 0.0f;

  float m = -INFINITY, s = 0.0f;  // this thread's running max and sum of exp(x - m)
  if (packed) {
    const int npacks = (v_valid + kPack - 1) / kPack;
    for (int p = threadIdx.x; p < npacks; p += blockDim.x) {
      const Bf16x8 pk = Bf16x8::load(row + p * kPack);
      float x[kPack];
      float pm = -INFINITY;
      for (int e = 0; e < kPack; e++) {
        x[e] = p * kPack + e < v_valid ? bf16_value(pk[e]) : -INFINITY;
        pm = fmaxf(pm, x[e]);
      }
      if (pm > m) {
        s *= expf(m - pm);  // 0 while m is -inf (s is 0 then anyway)
        m = pm;
      }
      for (int e = 0; e < kPack; e++)
        if (p * kPack + e < v_valid) s += expf(x[e] - m);
    }
  } else {
    for (int j = threadIdx.x; j < v_valid; j += blockDim.x) {
      const float x = bf16_value(row[j]);
      if (x > m) {
        s *= expf(m - x);
        m = x;
      }
      s += expf(x - m);
    }
  }
  const float mx = block_max(m, shared_max);
  if (m != -INFINITY) s *= expf(m - mx);
  const float sum = block_sum(s, shared_sum);
  if (threadIdx.x == 0) loss[i] = logf(sum) + mx - target_logit;
  if (!backward) return;

  // dlogits = f * exp(x - max) - scale at the target, f = scale / sum (the CPU's two roundings)
  const float f = scale / sum;
  if (packed) {
    for (int p = threadIdx.x; p < ld / kPack; p += blockDim.x) {
      Bf16x8 pk = Bf16x8::load(row + p * kPack);
      for (int e = 0; e < kPack; e++) {
        const int j = p * kPack + e;
        float g = 0.0f;
        if (j < v_valid) {
          g = f * expf(bf16_value(pk[e]) - mx);
          if (j == target) g -= scale;
        }
        pk[e] = bf16_bits(g);
      }
      pk.store(row + p * kPack);
    }
  } else {
    for (int j = threadIdx.x; j < ld; j += blockDim.x) {
      float g = 0.0f;
      if (j < v_valid) {
        g = f * expf(bf16_value(row[j]) - mx);
        if (j == target) g -= scale;
      }
      row[j] = bf16_bits(g);
    }
  }
}

}  // namespace

void launch_fused_classifier(cudaStream_t s, void* logits16, float* loss,
                             const std::int32_t* targets, int n, int ld, int v_valid, float scale,
                             bool backward) {
  if (n <= 0) return;
  const int packed = ld % kPack == 0 && aligned16(logits16);
  fused_classifier_kernel<<<static_cast<unsigned>(n), kClassifierThreads, 0, s>>>(
      static_cast<unsigned short*>(logits16), loss, targets, ld, v_valid, scale, backward ? 1 : 0,
      packed);
  check_launch("fused_classifier");
}

}  // namespace trident::ops::cuda
