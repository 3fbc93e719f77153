// ops/cuda/check.hpp — one-line errors for failed CUDA runtime and cuBLAS calls (private to
// src/ops/cuda). Every call into CUDA or cuBLAS goes through one of these macros, so a
// failure names the call, the file and line, and the library's own words.
// defines: TRIDENT_CUDA_CHECK, TRIDENT_CUBLAS_CHECK, check_launch, cuda_check, cublas_check
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace trident::ops::cuda {

// Throw trident::Error("CUDA error in <call> (<file>:<line>): <cudaGetErrorString>").
void cuda_check(cudaError_t status, const char* call, const char* file, int line);
void cublas_check(cublasStatus_t status, const char* call, const char* file, int line);
// After a kernel launch: a bad launch configuration surfaces here, naming the kernel (faults
// inside a kernel surface at the next synchronization: sum_squares, cuda_download,
// cuda_synchronize).
void check_launch(const char* kernel);

}  // namespace trident::ops::cuda

#define TRIDENT_CUDA_CHECK(call) ::trident::ops::cuda::cuda_check((call), #call, __FILE__, __LINE__)
#define TRIDENT_CUBLAS_CHECK(call) \
  ::trident::ops::cuda::cublas_check((call), #call, __FILE__, __LINE__)
