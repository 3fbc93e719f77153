// ops/cuda/classifier.cu — the fused classifier of the LM head under bf16 (CudaOps::lm_head,
// fused_head.cpp): one block per row of bf16 logits[N, ld] (a whole vocabulary), in one read
// the row's max and sum of exponentials (online: each thread rescales its sum when its max
// grows) and the target logit, then the loss, then (with the backward) a second read of the
// row, in L2 while the block still works on it, that overwrites it with the bf16 dlogits =
// scale * (softmax - onehot). Columns [v_valid, ld) are padding: ignored, gradient 0. Rows
// are read and written 8 bf16 (16 bytes) at a time where ld and the base allow it. llm.c's
// fused_classifier is the model (one block per row, 1024 threads, the second read from L2).
// defines: launch_fused_classifier, launch_classifier_shard_stats, launch_classifier_backward
#include <cstring>

#include "check.hpp"
#include "common.cuh"
#include "kernels.hpp"

namespace trident::ops::cuda {

namespace {

constexpr int kClassifierThreads = 1024;  // few rows in flight: their second read hits L2
constexpr int kPack = Bf16x8::kSize;      // bf16 per 16-byte access (common.cuh)

// This thread's running max m and sum s of exp(x - m) over its columns of row[0, v_valid)
// (online: the sum rescaled when the max grows). packed: 8 bf16 a read.
__device__ __forceinline__ void thread_row_stats(const unsigned short* row, int v_valid,
                                                 int packed, float& m, float& s) {
  m = -INFINITY, s = 0.0f;
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
}

// The row's max and its sum of exponentials at that max, from every thread's (a barrier).
__device__ __forceinline__ void block_row_stats(float m, float s, float& mx, float& sum) {
  __shared__ float shared_max[32];
  __shared__ float shared_sum[32];
  mx = block_max(m, shared_max);
  if (m != -INFINITY) s *= expf(m - mx);
  sum = block_sum(s, shared_sum);
}

// The row in place: dlogits = f * exp(x - max) - scale at the target, f = scale / sum (the
// CPU's two roundings); padding columns [v_valid, ld) 0. target: the row's column, any value
// outside [0, v_valid) for none.
__device__ __forceinline__ void write_dlogits(unsigned short* row, int ld, int v_valid,
                                              int target, float mx, float f, float scale,
                                              int packed) {
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

// loss[i] = log(sum_j exp(l_j - max)) + max - l_target over j < v_valid; with backward,
// row i becomes dlogits in place. packed: ld % 8 == 0 and a 16-byte aligned base.
__global__ void __launch_bounds__(kClassifierThreads)
    fused_classifier_kernel(unsigned short* logits, float* loss, const std::int32_t* targets,
                            int ld, int v_valid, float scale, int backward, int packed) {
  const int i = blockIdx.x;
  unsigned short* row = logits + std::int64_t(i) * ld;
  const int target = targets[i];
  const bool has_target = target >= 0 && target < v_valid;
  // read before any thread writes the row (the reductions below are barriers)
  const float target_logit = has_target ? bf16_value(row[target]) : 0.0f;

  float m, s;  // this thread's running max and sum of exp(x - m)
  thread_row_stats(row, v_valid, packed, m, s);
  float mx, sum;
  block_row_stats(m, s, mx, sum);
  if (threadIdx.x == 0) loss[i] = logf(sum) + mx - target_logit;
  if (!backward) return;
  write_dlogits(row, ld, v_valid, target, mx, scale / sum, scale, packed);
}

// A vocabulary shard's first pass (launch_classifier_shard_stats): row i's max, sum of
// exponentials at it, and the target logit where the target is this shard's (else 0).
__global__ void __launch_bounds__(kClassifierThreads)
    classifier_shard_stats_kernel(const unsigned short* logits, float* shard_max,
                                  float* sumexp, float* target_logit,
                                  const std::int32_t* targets, int ld, int v_valid,
                                  int vocab_start, int packed) {
  const int i = blockIdx.x;
  const unsigned short* row = logits + std::int64_t(i) * ld;
  float m, s;
  thread_row_stats(row, v_valid, packed, m, s);
  float mx, sum;
  block_row_stats(m, s, mx, sum);
  if (threadIdx.x == 0) {
    const int local = targets[i] - vocab_start;
    shard_max[i] = mx;
    sumexp[i] = sum;
    target_logit[i] = local >= 0 && local < v_valid ? bf16_value(row[local]) : 0.0f;
  }
}

// A vocabulary shard's second pass: row i's dlogits at the whole vocabulary's statistics.
__global__ void __launch_bounds__(kClassifierThreads)
    classifier_backward_kernel(unsigned short* logits, const float* row_max,
                               const float* sumexp, const std::int32_t* targets, int ld,
                               int v_valid, int vocab_start, float scale, int packed) {
  const int i = blockIdx.x;
  write_dlogits(logits + std::int64_t(i) * ld, ld, v_valid, targets[i] - vocab_start,
                row_max[i], scale / sumexp[i], scale, packed);
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

namespace trident::ops::cuda {

void launch_classifier_shard_stats(cudaStream_t s, const void* logits16, float* shard_max,
                                   float* sumexp, float* target_logit,
                                   const std::int32_t* targets, int n, int ld, int v_valid,
                                   int vocab_start) {
  if (n <= 0) return;
  const int packed = ld % kPack == 0 && aligned16(logits16);
  classifier_shard_stats_kernel<<<static_cast<unsigned>(n), kClassifierThreads, 0, s>>>(
      static_cast<const unsigned short*>(logits16), shard_max, sumexp, target_logit, targets, ld,
      v_valid, vocab_start, packed);
  check_launch("classifier_shard_stats");
}

void launch_classifier_backward(cudaStream_t s, void* logits16, const float* row_max,
                                const float* sumexp, const std::int32_t* targets, int n, int ld,
                                int v_valid, int vocab_start, float scale) {
  if (n <= 0) return;
  const int packed = ld % kPack == 0 && aligned16(logits16);
  classifier_backward_kernel<<<static_cast<unsigned>(n), kClassifierThreads, 0, s>>>(
      static_cast<unsigned short*>(logits16), row_max, sumexp, targets, ld, v_valid,
      vocab_start, scale, packed);
  check_launch("classifier_backward");
}

}  // namespace trident::ops::cuda
