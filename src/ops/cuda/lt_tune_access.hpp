// ops/cuda/lt_tune_access.hpp — TRIDENT_CUDA_LT_TUNE's products (private CudaOps members,
// cuda_ops.hpp's friend LtTuneAccess) for the GPU op test and the stand-in's check
// (emulate/lt_tune.cpp), which call them on a CudaOps made by make_ops: bias_lt, the bf16
// products without a bias (gemm_rm16: fp32 D; gemm_rm16_to16: bf16 D) and the plans' algorithms.
// defines: trident::ops::cuda::LtTuneAccess
#pragma once

#include <cstdint>
#include <vector>

#include "cuda_ops.hpp"

namespace trident::ops::cuda {

struct LtTuneAccess {
  static bool bias_lt(Ops& o, void* d, bool d16, const float* residual, const void* x16,
                      const void* w16, const void* bias, int n, int in, int out, int gelu,
                      const void* aux, void* bias_grad) {
    return dynamic_cast<CudaOps&>(o).bias_lt(d, d16, residual, x16, w16, false, bias, n, in, out,
                                             static_cast<CudaOps::LtGelu>(gelu), aux, bias_grad);
  }
  // Row-major C[m,n] = alpha op(A16) op(B16) + beta C, fp32 C (gemm_rm16).
  static void gemm_rm16(Ops& o, bool ta, bool tb, int m, int n, int k, float alpha,
                        const void* a16, int lda, const void* b16, int ldb, float beta, float* c,
                        int ldc) {
    dynamic_cast<CudaOps&>(o).gemm_rm16(ta, tb, m, n, k, alpha, a16, lda, b16, ldb, beta, c, ldc);
  }
  // Row-major C16[m,n] = op(A16) op(B16), bf16 C (gemm_rm16_to16: the fused blocks').
  static void gemm_rm16_to16(Ops& o, bool ta, bool tb, int m, int n, int k, const void* a16,
                             int lda, const void* b16, int ldb, void* c16, int ldc) {
    dynamic_cast<CudaOps&>(o).gemm_rm16_to16(ta, tb, m, n, k, a16, lda, b16, ldb, c16, ldc);
  }
  // CUBLASLT_ALGO_CONFIG_ID of each plan's algorithm (0 for a declined plan), in key order
  static std::vector<int> algos(Ops& o) {
    std::vector<int> ids;
    for (const auto& [key, plan] : dynamic_cast<CudaOps&>(o).lt_plans_) {
      (void)key;
      std::int32_t id = 0;
      std::size_t written = 0;
      if (plan.ok)
        cublasLtMatmulAlgoConfigGetAttribute(&plan.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id),
                                             &written);
      ids.push_back(id);
    }
    return ids;
  }
};

}  // namespace trident::ops::cuda
