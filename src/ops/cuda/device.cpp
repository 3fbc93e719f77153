// ops/cuda/device.cpp — device discovery and selection (see trident/ops/cuda.hpp).
// defines: cuda_device_count, cuda_select_device
#include <cuda_runtime_api.h>

#include "check.hpp"
#include "trident/core/error.hpp"
#include "trident/core/log.hpp"
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

int cuda_select_device(int local_rank, int local_size) {
  const int count = cuda_device_count();
  TRIDENT_CHECK(count > 0, "cuda: no CUDA GPU is visible to this rank (local rank ", local_rank,
                ")");
  TRIDENT_CHECK(local_rank >= 0, "cuda: node-local rank must be >= 0, got ", local_rank);
  if (local_size > count && local_rank == 0)
    log::warn(local_size, " ranks on this node share ", count,
              " GPU(s): several ranks run on one device");
  const int device = local_rank % count;
  TRIDENT_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

}  // namespace trident::ops
