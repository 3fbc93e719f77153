// emulate/shim/cublasLt.h — the cuBLASLt calls trident's src/ops/cuda makes (the forward linear
// with its bias in the GEMM's epilogue), on the CPU (cublas.cpp), with cuBLASLt's names; the
// values of the enums are the shim's own. Modelled: one matmul D = alpha op(A) op(B) + beta C
// (+ bias[m] per row of D under CUBLASLT_EPILOGUE_BIAS), compute CUBLAS_COMPUTE_32F with fp32
// scale, A and B both fp32 or both bf16, C and D fp32 (or bf16 with bf16 A, B) with the same
// layout, C in place or not (D = alpha AB + beta C + bias in float, rounded once); the layouts'
// shapes checked against the operations (CUBLAS_STATUS_INVALID_VALUE otherwise), every matrix
// and the bias in device memory of the runtime shim (else EXECUTION_FAILED, as a GPU would
// fault). The bias is of D's type unless CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE says otherwise (as
// cuBLASLt: fp32 or bf16 here). The heuristic's algorithms (below) need no workspace and are
// chosen for the bias alignment (up to 16 bytes) of the bias pointer set
// at that time (as cuBLASLt reads it; unset: any): a matmul with a less aligned bias is
// EXECUTION_FAILED (a GPU's misaligned load).
// Algorithms (TRIDENT_CUDA_LT_TUNE's candidates): the heuristic offers three for any valid
// problem, in the order of their ids 11, 12, 13 (as many as requested), with identical math and
// their own CUBLASLT_ALGO_CONFIG_TILE_ID (100 + id) and STAGES_ID (200 + id). An algorithm
// rebuilt with cublasLtMatmulAlgoInit + cublasLtMatmulAlgoConfigSetAttribute is valid
// (cublasLtMatmulAlgoCheck, cublasLtMatmul) when its tile and stages are its id's, split-K 1,
// the other attributes 0; it carries no bias or aux alignment (runs with any). Every algorithm
// carries the A, B, C, D types it was made for (the heuristic's layouts, AlgoInit's arguments):
// AlgoCheck and the matmul refuse one made for other types (INVALID_VALUE). Knobs, read at
// each call: TRIDENT_EMU_LT_SLOW_ALGO=ID[,ID...]: a matmul with such an algorithm sleeps 20 ms
// first (a slow candidate, so that a test sees the fastest chosen); TRIDENT_EMU_LT_INVALID_ALGO=ID:
// that algorithm does not exist (the heuristic omits it; AlgoCheck and matmul: NOT_SUPPORTED),
// as on another card or cuBLASLt version. cublasLtGetVersion: the shim's own number, 1.
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

enum cublasLtMatmulAlgoConfigAttributes_t {
  CUBLASLT_ALGO_CONFIG_ID = 0,                // int32_t, read-only (cublasLtMatmulAlgoInit's)
  CUBLASLT_ALGO_CONFIG_TILE_ID = 1,           // uint32_t
  CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 2,        // int32_t
  CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME = 3,  // uint32_t
  CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING = 4,     // uint32_t
  CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION = 5,     // uint32_t
  CUBLASLT_ALGO_CONFIG_STAGES_ID = 6,         // uint32_t
  CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID = 7,    // uint16_t
  CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID = 8,  // uint16_t
};

std::size_t cublasLtGetVersion();
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

cublasStatus_t cublasLtMatmulAlgoInit(cublasLtHandle_t handle, cublasComputeType_t compute,
                                      cudaDataType_t scale, cudaDataType_t a_type,
                                      cudaDataType_t b_type, cudaDataType_t c_type,
                                      cudaDataType_t d_type, int algo_id,
                                      cublasLtMatmulAlgo_t* algo);
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                       cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                       const cublasLtMatmulAlgo_t* algo,
                                       cublasLtMatmulHeuristicResult_t* result);
cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    const void* buf, std::size_t size);
cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    void* buf, std::size_t size,
                                                    std::size_t* written);

namespace emu {
// The algorithm id of the last cublasLtMatmul that ran (0: none yet; the tests' evidence of
// which candidate a plan kept), and how many matmuls ran with algorithm id so far.
int lt_last_algo();
std::uint64_t lt_matmuls_with(int algo_id);
// Matmuls run so far with a bias (BIAS or GELU_AUX_BIAS) read as bf16: the tests' evidence that
// a caller's bf16-bias path ran.
std::uint64_t lt_bias16_matmuls();
}  // namespace emu
