// ops/cuda/crossentropy.cu — softmax cross-entropy in three passes (row max; sum of
// exponentials and target logit; loss) and the fused backward, one block per row of
// logits[N, ld] (a row is a vocabulary shard: tens of thousands of columns). Columns
// [v_valid, ld) are padding: ignored, and given gradient 0.
// The unsharded forward (launch_xent_forward) is one pass: each thread keeps an online max and
// sum of exponentials over its columns (rescaling its sum when its max grows), the block
// combines them, and the loss follows: the logits are read once instead of twice.
// defines: launch_xent_row_max, launch_xent_sumexp, launch_xent_loss, launch_xent_backward,
//          launch_xent_forward (loss null: xent_shard_stats), launch_xent_rescale_sumexp
#include "check.hpp"
#include "common.cuh"
#include "kernels.hpp"

namespace trident::ops::cuda {

namespace {

__global__ void xent_row_max_kernel(float* row_max, const float* logits, int ld, int v_valid) {
  __shared__ float shared[32];
  const float* l = logits + std::int64_t(blockIdx.x) * ld;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < v_valid; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = block_max(mx, shared);
  if (threadIdx.x == 0) row_max[blockIdx.x] = mx;
}

// sumexp in double (a vocabulary's worth of terms), as the CPU backend.
__global__ void xent_sumexp_kernel(float* sumexp, float* target_logit, const float* logits,
                                   const float* row_max, const std::int32_t* targets, int ld,
                                   int v_valid, int vocab_start) {
  __shared__ double shared[32];
  const int i = blockIdx.x;
  const float* l = logits + std::int64_t(i) * ld;
  const float mx = row_max[i];
  double s = 0.0;
  for (int j = threadIdx.x; j < v_valid; j += blockDim.x) s += double(expf(l[j] - mx));
  s = block_sum(s, shared);
  if (threadIdx.x == 0) {
    sumexp[i] = static_cast<float>(s);
    const std::int64_t tg = std::int64_t(targets[i]) - vocab_start;
    target_logit[i] = (tg >= 0 && tg < v_valid) ? l[tg] : 0.0f;
  }
}

__global__ void xent_loss_kernel(float* loss, const float* row_max, const float* sumexp,
                                 const float* target_logit, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    loss[i] = static_cast<float>(log(double(sumexp[i])) + double(row_max[i]) -
                                 double(target_logit[i]));
}

// One row per block, one pass over it: row_max, sumexp (in double, as xent_sumexp_kernel),
// target_logit and loss (none when loss is null: a shard's first pass), the values of the
// three kernels above up to the rounding of the rescaled partial sums.
__global__ void xent_forward_kernel(float* loss, float* row_max, float* sumexp,
                                    float* target_logit, const float* logits,
                                    const std::int32_t* targets, int ld, int v_valid,
                                    int vocab_start) {
  __shared__ float shared_max[32];
  __shared__ double shared_sum[32];
  const int i = blockIdx.x;
  const float* l = logits + std::int64_t(i) * ld;
  float m = -INFINITY;  // this thread's running max, s its sum of exp(l[j] - m)
  double s = 0.0;
  for (int j = threadIdx.x; j < v_valid; j += blockDim.x) {
    const float x = l[j];
    if (x > m) {
      s *= double(expf(m - x));  // 0 while m is -inf (s is 0 then anyway)
      m = x;
    }
    s += double(expf(x - m));
  }
  const float mx = block_max(m, shared_max);
  if (m != -INFINITY) s *= double(expf(m - mx));
  s = block_sum(s, shared_sum);
  if (threadIdx.x == 0) {
    const std::int64_t tg = std::int64_t(targets[i]) - vocab_start;
    const float t = (tg >= 0 && tg < v_valid) ? l[tg] : 0.0f;
    const float se = static_cast<float>(s);
    row_max[i] = mx;
    sumexp[i] = se;
    target_logit[i] = t;
    if (loss)  // as xent_loss
      loss[i] = static_cast<float>(log(double(se)) + double(mx) - double(t));
  }
}

__global__ void xent_rescale_sumexp_kernel(float* sumexp, const float* shard_max,
                                           const float* row_max, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    sumexp[i] = shard_max[i] == -INFINITY
                    ? 0.0f
                    : static_cast<float>(double(sumexp[i]) *
                                         exp(double(shard_max[i]) - double(row_max[i])));
}

// In place: l[j] = scale * (softmax_j - onehot_j) for j < v_valid; padding 0.
__global__ void xent_backward_kernel(float* logits, const float* row_max, const float* sumexp,
                                     const std::int32_t* targets, int ld, int v_valid,
                                     int vocab_start, float scale) {
  const int i = blockIdx.x;
  float* l = logits + std::int64_t(i) * ld;
  const float mx = row_max[i];
  const float f = scale / sumexp[i];
  const std::int64_t tg = std::int64_t(targets[i]) - vocab_start;
  for (int j = threadIdx.x; j < ld; j += blockDim.x) {
    float g = 0.0f;
    if (j < v_valid) {
      g = f * expf(l[j] - mx);
      if (j == tg) g -= scale;  // the CPU's two roundings: f * e, then - scale
    }
    l[j] = g;
  }
}

}  // namespace

void launch_xent_row_max(cudaStream_t s, float* row_max, const float* logits, int n, int ld,
                         int v_valid) {
  if (n <= 0) return;
  xent_row_max_kernel<<<static_cast<unsigned>(n), kBlock, 0, s>>>(row_max, logits, ld, v_valid);
  check_launch("xent_row_max");
}

void launch_xent_sumexp(cudaStream_t s, float* sumexp, float* target_logit, const float* logits,
                        const float* row_max, const std::int32_t* targets, int n, int ld,
                        int v_valid, int vocab_start) {
  if (n <= 0) return;
  xent_sumexp_kernel<<<static_cast<unsigned>(n), kBlock, 0, s>>>(
      sumexp, target_logit, logits, row_max, targets, ld, v_valid, vocab_start);
  check_launch("xent_sumexp");
}

void launch_xent_loss(cudaStream_t s, float* loss, const float* row_max, const float* sumexp,
                      const float* target_logit, int n) {
  if (n <= 0) return;
  xent_loss_kernel<<<grid_for(n), kBlock, 0, s>>>(loss, row_max, sumexp, target_logit, n);
  check_launch("xent_loss");
}

void launch_xent_backward(cudaStream_t s, float* logits, const float* row_max,
                          const float* sumexp, const std::int32_t* targets, int n, int ld,
                          int v_valid, int vocab_start, float scale) {
  if (n <= 0) return;
  xent_backward_kernel<<<static_cast<unsigned>(n), kBlock, 0, s>>>(
      logits, row_max, sumexp, targets, ld, v_valid, vocab_start, scale);
  check_launch("xent_backward");
}

void launch_xent_forward(cudaStream_t s, float* loss, float* row_max, float* sumexp,
                         float* target_logit, const float* logits, const std::int32_t* targets,
                         int n, int ld, int v_valid, int vocab_start) {
  if (n <= 0) return;
  xent_forward_kernel<<<static_cast<unsigned>(n), kBlock, 0, s>>>(
      loss, row_max, sumexp, target_logit, logits, targets, ld, v_valid, vocab_start);
  check_launch("xent_forward");
}

void launch_xent_rescale_sumexp(cudaStream_t s, float* sumexp, const float* shard_max,
                                const float* row_max, int n) {
  if (n <= 0) return;
  xent_rescale_sumexp_kernel<<<grid_for(n), kBlock, 0, s>>>(sumexp, shard_max, row_max, n);
  check_launch("xent_rescale_sumexp");
}

}  // namespace trident::ops::cuda
