// ops/cuda/fused_head.cpp — see fused_head.hpp.
// defines: fused_head
#include "fused_head.hpp"

#include "check.hpp"
#include "kernels.hpp"
#include "op_timer.hpp"
#include "plans.hpp"
#include "trident/core/error.hpp"

namespace trident::ops::cuda {

namespace {

cublasOperation_t op_of(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

// Row-major C[m,n] = alpha op(A) op(B) + beta C on packed bf16 A and B (col_major's mapping,
// as CudaOps::gemm_rm16), C of type ctype (bf16 only with beta 0), fp32 accumulation.
void gemm16(cublasHandle_t h, bool ta, bool tb, int m, int n, int k, const void* a16, int lda,
            const void* b16, int ldb, float beta, void* c, cudaDataType ctype, int ldc) {
  const float alpha = 1.0f;
  const ColMajor g = col_major(ta, tb, m, n, k, nullptr, lda, 0, nullptr, ldb, 0);
  TRIDENT_CUBLAS_CHECK(cublasGemmEx(h, op_of(g.trans1), op_of(g.trans2), g.m, g.n, g.k, &alpha,
                                    b16, CUDA_R_16BF, g.ld1, a16, CUDA_R_16BF, g.ld2, &beta, c,
                                    ctype, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void fused_head(cublasHandle_t cublas, cudaStream_t stream, OpTimer* timer, float* loss,
                float* dlnf, float* dwte, void* logits16, const void* lnf16, const void* wte16,
                const std::int32_t* targets, int n, int c, int v, int v_valid, float loss_scale,
                bool with_backward, const HeadShard* shard) {
  if (n <= 0 || v <= 0) return;
  // a shard may hold padding only (a vocabulary not divisible by the TP group)
  TRIDENT_CHECK(c > 0 && v_valid >= (shard ? 0 : 1) && v_valid <= v, "fused_head: c ", c,
                ", v_valid ", v_valid, " of ", v);
  TRIDENT_CHECK(!shard || (shard->tp && shard->row_max && shard->stats),
                "internal: fused_head: a shard without its collectives or scratch");
  {
    OpScope timed(timer, [&] { return str("lm_head logits m=", n, " n=", v, " k=", c); }, 0);
    gemm16(cublas, false, true, n, v, c, lnf16, c, wte16, c, 0.0f, logits16, CUDA_R_16BF, v);
  }
  if (!shard) {
    OpScope timed(timer, [&] { return str("lm_head classifier n=", n, " v=", v); }, 0);
    launch_fused_classifier(stream, logits16, loss, targets, n, v, v_valid, loss_scale,
                            with_backward);
  } else {
    float* shard_max = loss;  // loss[n] is written last: it holds the shard's max meanwhile
    float* row_max = shard->row_max;
    float* sumexp = shard->stats;
    float* target_logit = shard->stats + n;
    {
      OpScope timed(timer, [&] { return str("lm_head classifier stats n=", n, " v=", v); }, 0);
      launch_classifier_shard_stats(stream, logits16, shard_max, sumexp, target_logit, targets,
                                    n, v, v_valid, shard->vocab_start);
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(row_max, shard_max, std::size_t(n) * sizeof(float),
                                         cudaMemcpyDeviceToDevice, stream));
    }
    shard->tp->allreduce_max(row_max, n);
    launch_xent_rescale_sumexp(stream, sumexp, shard_max, row_max, n);
    shard->tp->allreduce_sum(shard->stats, 2 * std::int64_t(n));  // both in one call
    launch_xent_loss(stream, loss, row_max, sumexp, target_logit, n);
    if (with_backward) {
      OpScope timed(timer, [&] { return str("lm_head classifier backward n=", n, " v=", v); },
                    0);
      launch_classifier_backward(stream, logits16, row_max, sumexp, targets, n, v, v_valid,
                                 shard->vocab_start, loss_scale);
    }
  }
  if (!with_backward) return;
  {
    OpScope timed(timer, [&] { return str("lm_head dlnf m=", n, " n=", c, " k=", v); }, 0);
    gemm16(cublas, false, false, n, c, v, logits16, v, wte16, c, 0.0f, dlnf, CUDA_R_32F, c);
  }
  {
    OpScope timed(timer, [&] { return str("lm_head dwte m=", v, " n=", c, " k=", n); }, 0);
    gemm16(cublas, true, false, v, c, n, logits16, v, lnf16, c, 1.0f, dwte, CUDA_R_32F, c);
  }
}

}  // namespace trident::ops::cuda
