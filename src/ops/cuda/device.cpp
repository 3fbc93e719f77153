// ops/cuda/device.cpp — device discovery, selection and the device arena (see
// trident/ops/cuda.hpp).
// defines: cuda_device_count, cuda_select_device, DeviceArena
#include <cuda_runtime_api.h>

#include <utility>

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

DeviceArena::DeviceArena(std::size_t bytes) {
  if (bytes == 0) return;
  TRIDENT_CUDA_CHECK(cudaMalloc(&base_, bytes));
  capacity_ = bytes;
}

DeviceArena::~DeviceArena() {
  if (base_) cudaFree(base_);  // no throw from a destructor; a fault was reported earlier
}

DeviceArena::DeviceArena(DeviceArena&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      capacity_(std::exchange(o.capacity_, 0)),
      used_(std::exchange(o.used_, 0)) {}

DeviceArena& DeviceArena::operator=(DeviceArena&& o) noexcept {
  if (this != &o) {
    if (base_) cudaFree(base_);
    base_ = std::exchange(o.base_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
    used_ = std::exchange(o.used_, 0);
  }
  return *this;
}

void* DeviceArena::alloc(std::size_t bytes) {
  const std::size_t start = (used_ + kAlign - 1) / kAlign * kAlign;
  TRIDENT_CHECK(start <= capacity_ && bytes <= capacity_ - start, "DeviceArena: ", bytes,
                " bytes asked for, ", capacity_ - (start < capacity_ ? start : capacity_),
                " of ", capacity_, " left");
  used_ = start + bytes;
  return static_cast<char*>(base_) + start;
}

}  // namespace trident::ops
