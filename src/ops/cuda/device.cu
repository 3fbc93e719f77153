// Device discovery for the CUDA backend (see trident/ops/cuda.hpp).
#include <cuda_runtime.h>

#include "trident/ops/cuda.hpp"

namespace trident::ops {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

}  // namespace trident::ops
