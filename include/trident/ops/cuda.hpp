// trident/ops/cuda.hpp — host-callable entry points of the CUDA backend (ops/cuda): device
// discovery and selection, the backend's factory, device memory (DeviceArena) and copies
// between host and device ordered on a CUDA Ops object's stream. Only built when
// TRIDENT_CUDA is on. No CUDA header is needed to include this one.
// defines: trident::ops::cuda_device_count, cuda_select_device, make_cuda_ops, DeviceArena,
//          cuda_upload, cuda_download, cuda_synchronize
//
// Streams: a CUDA Ops object owns one stream; every op it runs is queued there, in call
// order, and returns before the GPU has finished (sum_squares, which returns a number, waits).
// Host code reads results through cuda_download (or after cuda_synchronize). A fault inside a
// kernel is reported by the next call that waits.
#pragma once

#include <cstddef>
#include <memory>

#include "trident/ops/ops.hpp"

namespace trident::ops {

// Number of CUDA devices visible to this process (0 when none or no driver).
int cuda_device_count();

// Makes device (local_rank % cuda_device_count()) current for the calling thread and returns
// it. local_rank is the rank within this node (the caller computes it, e.g. with
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)). When local_size (the ranks on this node; 0 =
// unknown) exceeds the devices, ranks share GPUs: allowed, with a warning. An Error when no
// device is visible or local_rank < 0.
int cuda_select_device(int local_rank, int local_size = 0);

// The CUDA backend on the calling thread's current device. Every pointer it is given must be
// device memory of that device (its memory(), a DeviceArena), including the token and target
// arrays. memory() is one arena of arena_bytes (0: 90% of the device's free memory divided by
// ranks_per_device, the ranks of this node sharing the GPU). An Error when no device is
// visible.
std::unique_ptr<Ops> make_cuda_ops(Precision precision = Precision::fp32,
                                   std::size_t arena_bytes = 0, int ranks_per_device = 1);

// DeviceArena: one cudaMalloc of `bytes` on the current device, handed out by bump
// allocation (each block aligned to 256 bytes); reset() takes everything back at once. Never
// managed memory. Move-only; frees its memory when destroyed.
class DeviceArena {
 public:
  DeviceArena() = default;
  explicit DeviceArena(std::size_t bytes);
  ~DeviceArena();
  DeviceArena(DeviceArena&& o) noexcept;
  DeviceArena& operator=(DeviceArena&& o) noexcept;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // `bytes` of device memory (a distinct, 256-byte aligned block; not initialized). An Error
  // that says how much is left when the arena is full.
  void* alloc(std::size_t bytes);
  template <typename T>
  T* alloc_n(std::size_t n) {
    return static_cast<T*>(alloc(n * sizeof(T)));
  }
  void reset() { used_ = 0; }
  std::size_t capacity() const { return capacity_; }
  std::size_t used() const { return used_; }
  void* base() const { return base_; }

  static constexpr std::size_t kAlign = 256;

 private:
  void* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
};

// Copies of `bytes` between host and device memory, queued on the stream of `ops` (which must
// be a CUDA Ops) after everything queued before; both return when the copy is complete, so
// the host buffer may be reused or read at once.
void cuda_upload(Ops& ops, void* device_dst, const void* host_src, std::size_t bytes);
void cuda_download(Ops& ops, void* host_dst, const void* device_src, std::size_t bytes);
// Waits for everything queued on the stream of `ops`; a kernel fault becomes an Error here.
void cuda_synchronize(Ops& ops);

}  // namespace trident::ops
