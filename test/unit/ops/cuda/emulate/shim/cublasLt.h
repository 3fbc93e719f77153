// emulate/shim/cublasLt.h — the cuBLASLt calls trident's src/ops/cuda makes (the forward linear
// with its bias in the GEMM's epilogue), on the CPU (cublas.cpp), with cuBLASLt's names; the
// values of the enums are the shim's own. Modelled: one matmul D = alpha op(A) op(B) + beta C
// (+ bias[m] per row of D under CUBLASLT_EPILOGUE_BIAS), compute CUBLAS_COMPUTE_32F with fp32
// scale, A and B both fp32 or both bf16, C and D fp32 (or bf16 with bf16 A, B) with the same
// layout, C in place or not (D = alpha AB + beta C + bias in float, rounded once); the layouts'
// shapes checked against the operations (CUBLAS_STATUS_INVALID_VALUE otherwise), every matrix
// and the bias in device memory of the runtime shim (else EXECUTION_FAILED, as a GPU would
// fault). The bias is of D's type unless CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE says otherwise (as
// cuBLASLt: fp32 or bf16 here). The heuristic offers one algorithm for any valid problem,
// needing no workspace, chosen for the bias alignment (up to 16 bytes) of the bias pointer set
// at that time (as cuBLASLt reads it; unset: any): a matmul with a less aligned bias is
// EXECUTION_FAILED (a GPU's misaligned load).
// Arithmetic as cublas_v2.h's GEMMs; the bias is added in float after alpha * product.
// The GELU epilogues of cublasLt.h (GELU in its tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x +
// 0.044715 x^3))), as cuBLASLt computes it on a card): GELU_AUX_BIAS: v = alpha AB + beta C +
// bias, aux = v (rounded to aux's type), D = gelu(v) (from v unrounded); DGELU_BGRAD: g = alpha
// AB + beta C, D = g gelu'(aux), and the bias pointer *written* (not accumulated) with D's row
// sums (of the unrounded values, over the n columns) in the bias type (BIAS_DATA_TYPE, default
// D's). aux: D's shape, type D's (EPILOGUE_AUX_DATA_TYPE unset, or set to D's; another type is
// INVALID_VALUE), leading dimension EPILOGUE_AUX_LD >= rows and a multiple of 8 (else
// INVALID_VALUE, at the heuristic and the matmul), device memory; its pointer's alignment (up
// to 16 bytes) at the heuristic chooses the algorithm, as the bias's: a matmul with a less
// aligned aux is EXECUTION_FAILED. No aux pointer at the matmul: GELU_AUX_BIAS NOT_SUPPORTED,
// DGELU_BGRAD INVALID_VALUE; no bias pointer: INVALID_VALUE (what a card's cuBLASLt 13
// answers). Both need D bf16 or fp32 with A and B of the same type (as the bias epilogue).
// Whether a card takes an fp32 bias gradient with bf16 D is not documented: the shim does;
// with TRIDENT_EMU_LT_BGRAD32=0 in the environment it refuses it (NOT_SUPPORTED, heuristic and
// matmul), as such a cuBLASLt would, so that the caller's bf16 bias-gradient path runs.
// Likewise TRIDENT_EMU_LT_BIAS32=0 refuses an fp32 bias with bf16 D (BIAS, GELU_AUX_BIAS:
// cublasLt.h describes the bias as D's type), so that the caller's bf16-bias path runs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cublas_v2.h"

struct cublasLtContext;
typedef cublasLtContext* cublasLtHandle_t;
struct cublasLtMatmulDescOpaque_t;
typedef cublasLtMatmulDescOpaque_t* cublasLtMatmulDesc_t;
struct cublasLtMatrixLayoutOpaque_t;
typedef cublasLtMatrixLayoutOpaque_t* cublasLtMatrixLayout_t;
struct cublasLtMatmulPreferenceOpaque_t;
typedef cublasLtMatmulPreferenceOpaque_t* cublasLtMatmulPreference_t;
typedef struct {
  std::uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
  cublasLtMatmulAlgo_t algo;
  std::size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22,
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
};
enum cublasLtEpilogue_t {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164,
  CUBLASLT_EPILOGUE_DGELU_BGRAD = 208,
};
enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, std::size_t size);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          std::uint64_t rows, std::uint64_t cols,
                                          std::int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, std::size_t size);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void* alpha, const void* a, cublasLtMatrixLayout_t adesc,
                              const void* b, cublasLtMatrixLayout_t bdesc, const void* beta,
                              const void* c, cublasLtMatrixLayout_t cdesc, void* d,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, std::size_t workspace_bytes, cudaStream_t stream);

namespace emu {
// Matmuls run so far with a bias (BIAS or GELU_AUX_BIAS) read as bf16: the tests' evidence that
// a caller's bf16-bias path ran.
std::uint64_t lt_bias16_matmuls();
}  // namespace emu
