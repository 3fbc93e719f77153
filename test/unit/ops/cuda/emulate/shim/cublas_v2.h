// emulate/shim/cublas_v2.h — the cuBLAS calls trident's src/ops/cuda makes, on the CPU
// (cublas.cpp), with cuBLAS's enum values, its argument checks (dimensions, leading
// dimensions, supported type combinations: CUBLAS_STATUS_INVALID_VALUE / NOT_SUPPORTED) and a
// check that every matrix lies in device memory of the runtime shim (else, as a kernel
// reading a host pointer would, CUBLAS_STATUS_EXECUTION_FAILED with a line on stderr).
// Arithmetic: inputs as stored (bf16 widened to float exactly), products summed in double and
// rounded once, then alpha * sum + beta * C in float; beta == 0 reads no C (NaN there does not
// propagate), as cuBLAS. CUBLAS_COMPUTE_32F_FAST_TF32 rounds each fp32 input to TF32 (10
// mantissa bits, round to nearest even) and CUBLAS_COMPUTE_32F_FAST_16BF to bf16 (round to
// nearest even) before the product, as tensor cores would see them (real cuBLAS may pick
// other kernels, split inputs or truncate: the emulation is one faithful reading, not the
// bits of a GPU). The summation order of a GPU (fp32 partial sums in a blocked order) is not
// modelled: sums here are closer to exact. A bf16 C (bf16 A and B, CUBLAS_COMPUTE_32F, beta 0:
// the LM head's logits) gets alpha * sum rounded to bf16 (nearest even). Pointer mode device
// is not supported; the math mode and workspace are recorded (the workspace must be device
// memory) and change nothing.
#pragma once

#include <cstdint>

#include "cuda_runtime_api.h"

enum cudaDataType { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
typedef cudaDataType cudaDataType_t;

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cublasPointerMode_t { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 };
enum cublasMath_t {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_PEDANTIC_MATH = 2,
  CUBLAS_TF32_TENSOR_OP_MATH = 3,
};
enum cublasComputeType_t {
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
};
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };

struct cublasContext;
typedef cublasContext* cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, std::size_t bytes);
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* a, cudaDataType atype, int lda, const void* b,
                            cudaDataType btype, int ldb, const void* beta, void* c,
                            cudaDataType ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
    int k, const void* alpha, const void* a, cudaDataType atype, int lda, long long stride_a,
    const void* b, cudaDataType btype, int ldb, long long stride_b, const void* beta, void* c,
    cudaDataType ctype, int ldc, long long stride_c, int batch, cublasComputeType_t compute,
    cublasGemmAlgo_t algo);
cublasStatus_t cublasSgeam(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, const float* alpha,
                           const float* a, int lda, const float* beta, const float* b, int ldb,
                           float* c, int ldc);
cublasStatus_t cublasSgemv(cublasHandle_t handle, cublasOperation_t trans, int m, int n,
                           const float* alpha, const float* a, int lda, const float* x, int incx,
                           const float* beta, float* y, int incy);
