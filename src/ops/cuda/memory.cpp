// ops/cuda/memory.cpp — see memory.hpp.
// defines: CudaMemory, BumpBlock, default_arena_bytes
#include "memory.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "check.hpp"
#include "trident/core/error.hpp"

namespace trident::ops::cuda {

namespace {
// "123456789 bytes (117.7 MiB)"
std::string sized(std::size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%zu bytes (%.1f MiB)", bytes, double(bytes) / (1 << 20));
  return buf;
}
}  // namespace

std::size_t default_arena_bytes(int ranks_per_device) {
  std::size_t free = 0, total = 0;
  TRIDENT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  // Ranks sharing a GPU make their arenas one after the other, each seeing what the earlier
  // ones left: an equal share of the whole (85%: the CUDA contexts and cuBLAS take some)
  // keeps them even, 90% of what is free keeps the last one possible.
  const std::size_t ranks = std::size_t(std::max(1, ranks_per_device));
  const std::size_t share =
      std::min(std::size_t(double(total) * 0.85) / ranks, std::size_t(double(free) * 0.9));
  return share / ArenaAllocator::kAlign * ArenaAllocator::kAlign;
}

CudaMemory::CudaMemory(std::size_t bytes, int ranks_per_device, cudaStream_t stream)
    : stream_(stream) {
  int device = 0;
  TRIDENT_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  TRIDENT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  where_ = str("cuda:", device, " (", prop.name, ")");
  what_ = str("device arena of ", where_);
  const int rpd = std::max(1, ranks_per_device);
  const std::size_t want = bytes ? aligned_bytes(bytes) : default_arena_bytes(rpd);
  std::size_t free = 0, total = 0;
  TRIDENT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  TRIDENT_CHECK(want > 0, where_, ": no device memory for the arena (", sized(free), " free of ",
                sized(total), ", ", rpd, " rank(s) per device)");
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, want);
  if (status != cudaSuccess) {
    cudaGetLastError();  // an out-of-memory cudaMalloc is not sticky; clear it all the same
    fail(where_, ": cannot allocate the device arena of ", sized(want),
         bytes ? " (runtime arena size asked for)"
               : " (the default: 85% of the GPU / ranks per device, at most 90% of free)",
         ": ", sized(free), " free of ", sized(total), ", ", rpd,
         " rank(s) per device; cudaMalloc: ", cudaGetErrorString(status));
  }
  base_ = static_cast<char*>(p);
  arena_ = ArenaAllocator(want);
}

CudaMemory::~CudaMemory() {
  // No throw from a destructor; a fault was reported earlier.
  for (Copy& c : copies_) {
    if (c.queued) cudaEventDestroy(c.queued);
    if (c.landed) cudaEventDestroy(c.landed);
  }
  if (staging_) cudaStreamDestroy(staging_);
  if (base_) cudaFree(base_);
}

// The staging stream and its events are made on first use (a run without host staging
// never needs them). Copy `ticket` uses slot ticket % kCopySlots: issuing it first waits for
// the copy that used the slot before (kCopySlots tickets earlier), so no event is re-recorded
// while a caller may still ask about it.
std::uint64_t CudaMemory::to_host_async(void* host_dst, const void* device_src, std::size_t bytes) {
  if (!staging_) {
    TRIDENT_CUDA_CHECK(cudaStreamCreateWithFlags(&staging_, cudaStreamNonBlocking));
    copies_.resize(kCopySlots);
    for (Copy& c : copies_) {
      TRIDENT_CUDA_CHECK(cudaEventCreateWithFlags(&c.queued, cudaEventDisableTiming));
      TRIDENT_CUDA_CHECK(cudaEventCreateWithFlags(&c.landed, cudaEventDisableTiming));
    }
  }
  const std::uint64_t ticket = ++tickets_;
  Copy& c = copies_[ticket % kCopySlots];
  if (ticket > kCopySlots) TRIDENT_CUDA_CHECK(cudaEventSynchronize(c.landed));
  // After the kernels queued so far on the compute stream, on the staging stream.
  TRIDENT_CUDA_CHECK(cudaEventRecord(c.queued, stream_));
  TRIDENT_CUDA_CHECK(cudaStreamWaitEvent(staging_, c.queued, 0));
  if (bytes > 0)
    TRIDENT_CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, staging_));
  TRIDENT_CUDA_CHECK(cudaEventRecord(c.landed, staging_));
  return ticket;
}

bool CudaMemory::copy_done(std::uint64_t ticket) {
  if (ticket == 0 || ticket + kCopySlots <= tickets_) return true;  // its slot moved on
  const cudaError_t status = cudaEventQuery(copies_[ticket % kCopySlots].landed);
  if (status == cudaErrorNotReady) return false;
  TRIDENT_CUDA_CHECK(status);
  return true;
}

void CudaMemory::wait_copy(std::uint64_t ticket) {
  if (ticket == 0 || ticket + kCopySlots <= tickets_) return;
  TRIDENT_CUDA_CHECK(cudaEventSynchronize(copies_[ticket % kCopySlots].landed));
}

void* CudaMemory::allocate(std::size_t bytes) {
  return base_ + arena_.allocate(bytes, what_.c_str());
}

void CudaMemory::release(void* p) noexcept {
  if (!p) return;
  const char* c = static_cast<const char*>(p);
  try {
    TRIDENT_CHECK(holds(p), where_, ": release of ", p, ", which is not in the device arena");
    arena_.release(std::size_t(c - base_));
  } catch (const std::exception& e) {
    // A release of memory this arena never handed out is a bug in the caller; there is no
    // way to report it from a destructor but to stop here.
    std::fprintf(stderr, "trident: error: %s\n", e.what());
    std::abort();
  }
}

bool CudaMemory::holds(const void* p) const {
  const char* c = static_cast<const char*>(p);
  return base_ != nullptr && c >= base_ && c < base_ + arena_.capacity();
}

void CudaMemory::to_device(void* device_dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  const char* d = static_cast<const char*>(device_dst);
  if (watched_bytes_ && d < watched_ + watched_bytes_ && d + bytes > watched_)
    watched_written_ = true;
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaMemory::to_host(void* host_dst, const void* device_src, std::size_t bytes) {
  if (bytes == 0) return;
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream_));
  TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaMemory::synchronize() { TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void* CudaMemory::allocate_host(std::size_t bytes) {
  void* p = nullptr;
  const cudaError_t status = cudaHostAlloc(&p, std::max<std::size_t>(bytes, 1), cudaHostAllocDefault);
  if (status != cudaSuccess) {
    cudaGetLastError();
    fail(where_, ": cannot allocate ", sized(bytes), " of pinned host memory: ",
         cudaGetErrorString(status));
  }
  return p;
}

void CudaMemory::release_host(void* p) noexcept {
  if (p) cudaFreeHost(p);
}

void* BumpBlock::alloc(std::size_t bytes) {
  const std::size_t start = aligned_bytes(used_);
  TRIDENT_CHECK(start <= capacity_ && bytes <= capacity_ - start, "cuda scratch: ", bytes,
                " bytes asked for, ", capacity_ - std::min(start, capacity_), " of ", capacity_,
                " left");
  used_ = start + bytes;
  return base_ + start;
}

}  // namespace trident::ops::cuda
