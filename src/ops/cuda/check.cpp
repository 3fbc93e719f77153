// ops/cuda/check.cpp — see check.hpp.
// defines: cuda_check, cublas_check, check_launch
#include "check.hpp"

#include <cstring>

#include "trident/core/error.hpp"

namespace trident::ops::cuda {

namespace {
const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  fail("CUDA error in ", call, " (", base_name(file), ":", line, "): ", cudaGetErrorName(status),
       ": ", cudaGetErrorString(status));
}

void cublas_check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail("cuBLAS error in ", call, " (", base_name(file), ":", line, "): ",
       cublasGetStatusName(status), ": ", cublasGetStatusString(status));
}

void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return;
  fail("CUDA kernel ", kernel, " failed to launch: ", cudaGetErrorName(status), ": ",
       cudaGetErrorString(status));
}

}  // namespace trident::ops::cuda
