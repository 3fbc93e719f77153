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
// defines: fused_head
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::ops::cuda {

class OpTimer;

void fused_head(cublasHandle_t cublas, cudaStream_t stream, OpTimer* timer, float* loss,
                float* dlnf, float* dwte, void* logits16, const void* lnf16, const void* wte16,
                const std::int32_t* targets, int n, int c, int v, int v_valid, float loss_scale,
                bool with_backward);

}  // namespace trident::ops::cuda
