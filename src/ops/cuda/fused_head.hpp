// ops/cuda/fused_head.hpp — the LM head on bf16 operands (CudaOps::lm_head under bf16; free of
// CudaOps so that test/unit/ops/cuda/emulate/driver.cpp runs it with the cuBLAS stand-in):
//   logits16[N,V] = lnf16[N,C] @ wte16[V,C]^T    (cublasGemmEx, bf16 in, fp32 accumulation,
//                                                 bf16 out: 2 bytes a logit written)
//   the fused classifier (classifier.cu): loss[N]; with the backward, dlogits16 in place
//   dlnf[N,C] = dlogits16 @ wte16                (fp32 out, written)
//   dwte[V,C] += dlogits16^T @ lnf16             (fp32 out, accumulated)
// The products read the bf16 operands directly: no conversion pass over the logits. Each
// step is timed (OpScope) as "lm_head logits ...", "lm_head classifier ...", "lm_head dlnf
// ...", "lm_head dwte ...". lnf16 and wte16 are packed (leading dimension C).
// A vocabulary shard (TP > 1, shard non-null): the classifier in two passes around the
// collectives, as Ops::vocab_parallel_xent_forward composes them on fp32 logits: the shard's
// max, sum of exponentials and target logit from one read ("lm_head classifier stats"), the
// max allreduced, the sums rescaled to it and allreduced with the target logits, the loss;
// then the dlogits from a second read ("lm_head classifier backward").
// defines: HeadShard, fused_head
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "trident/ops/ops.hpp"

namespace trident::ops::cuda {

class OpTimer;

// This rank's share of the vocabulary (Ops::lm_head's vocab_start and tp) and the row
// statistics' scratch (row_max[N], stats[2N]: sums of exponentials, then target logits).
struct HeadShard {
  int vocab_start = 0;
  float* row_max = nullptr;
  float* stats = nullptr;
  Ops::HeadCollectives* tp = nullptr;
};

void fused_head(cublasHandle_t cublas, cudaStream_t stream, OpTimer* timer, float* loss,
                float* dlnf, float* dwte, void* logits16, const void* lnf16, const void* wte16,
                const std::int32_t* targets, int n, int c, int v, int v_valid, float loss_scale,
                bool with_backward, const HeadShard* shard = nullptr);

}  // namespace trident::ops::cuda
