// ops/cpu/crossentropy.cpp — softmax cross-entropy in three passes (row max, sum of
// exponentials and target logit, loss) plus the fused backward, so that a caller can
// reduce the per-row statistics over a vocabulary split across ranks between passes.
// defines: CpuOps::xent_row_max, xent_sumexp, xent_rescale_sumexp, xent_loss, xent_backward
#include "cpu_ops.hpp"

#include <omp.h>

#include <cmath>
#include <limits>

namespace trident::ops::cpu {

namespace {

TRIDENT_SIMD_CLONES
void row_max_rows(float* row_max, const float* logits, int ld, int v_valid, std::int64_t lo,
                  std::int64_t hi) {
  for (std::int64_t i = lo; i < hi; i++) {
    const float* lr = logits + i * ld;
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < v_valid; j++) mx = lr[j] > mx ? lr[j] : mx;
    row_max[i] = mx;
  }
}

TRIDENT_SIMD_CLONES
void sumexp_rows(float* sumexp, float* target_logit, const float* logits, const float* row_max,
                 const std::int32_t* targets, int ld, int v_valid, int vocab_start,
                 std::int64_t lo, std::int64_t hi) {
  for (std::int64_t i = lo; i < hi; i++) {
    const float* lr = logits + i * ld;
    const float mx = row_max[i];
    double s = 0.0;  // double: a vocabulary's worth of terms
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < v_valid; j++) s += double(exp_approx(lr[j] - mx));
    sumexp[i] = static_cast<float>(s);
    const std::int64_t tg = std::int64_t(targets[i]) - vocab_start;
    target_logit[i] = (tg >= 0 && tg < v_valid) ? lr[tg] : 0.0f;
  }
}

TRIDENT_SIMD_CLONES
void backward_rows(float* logits, const float* row_max, const float* sumexp,
                   const std::int32_t* targets, int ld, int v_valid, int vocab_start, float scale,
                   std::int64_t lo, std::int64_t hi) {
  for (std::int64_t i = lo; i < hi; i++) {
    float* lr = logits + i * ld;
    const float mx = row_max[i];
    const float f = scale / sumexp[i];
#pragma omp simd
    for (int j = 0; j < v_valid; j++) lr[j] = f * exp_approx(lr[j] - mx);
    for (int j = v_valid; j < ld; j++) lr[j] = 0.0f;
    const std::int64_t tg = std::int64_t(targets[i]) - vocab_start;
    if (tg >= 0 && tg < v_valid) lr[tg] -= scale;
  }
}

}  // namespace

void CpuOps::xent_row_max(float* row_max, const float* logits, int n, int ld, int v_valid) {
  parallel_slabs(team(std::int64_t(n) * v_valid), n, 1, [&](std::int64_t lo, std::int64_t hi) {
    row_max_rows(row_max, logits, ld, v_valid, lo, hi);
  });
}

void CpuOps::xent_sumexp(float* sumexp, float* target_logit, const float* logits,
                         const float* row_max, const std::int32_t* targets, int n, int ld,
                         int v_valid, int vocab_start) {
  parallel_slabs(team(std::int64_t(n) * v_valid), n, 1, [&](std::int64_t lo, std::int64_t hi) {
    sumexp_rows(sumexp, target_logit, logits, row_max, targets, ld, v_valid, vocab_start, lo, hi);
  });
}

void CpuOps::xent_rescale_sumexp(float* sumexp, const float* shard_max, const float* row_max,
                                 int n) {
  for (int i = 0; i < n; i++)
    sumexp[i] = shard_max[i] == -std::numeric_limits<float>::infinity()
                    ? 0.0f
                    : static_cast<float>(double(sumexp[i]) *
                                         std::exp(double(shard_max[i]) - double(row_max[i])));
}

void CpuOps::xent_loss(float* loss, const float* row_max, const float* sumexp,
                       const float* target_logit, int n) {
  for (int i = 0; i < n; i++)
    loss[i] = static_cast<float>(std::log(double(sumexp[i])) + double(row_max[i]) -
                                 double(target_logit[i]));
}

void CpuOps::xent_backward(float* logits, const float* row_max, const float* sumexp,
                           const std::int32_t* targets, int n, int ld, int v_valid,
                           int vocab_start, float scale) {
  parallel_slabs(team(std::int64_t(n) * ld), n, 1, [&](std::int64_t lo, std::int64_t hi) {
    backward_rows(logits, row_max, sumexp, targets, ld, v_valid, vocab_start, scale, lo, hi);
  });
}

}  // namespace trident::ops::cpu
