// ops/cuda/memory.hpp — the CUDA backend's device memory (private to src/ops/cuda): ONE
// cudaMalloc per rank, made when the backend is built, handed out by ArenaAllocator (first fit,
// merged on release, 256-byte aligned). Everything on the device comes from it: the model's
// Buffers (through Ops::memory()), and the backend's own cuBLAS workspace, sum_squares
// partials and op scratch. No cudaMalloc after start-up, never managed memory.
// defines: trident::ops::cuda::CudaMemory, BumpBlock, aligned_bytes, default_arena_bytes
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trident/core/arena.hpp"
#include "trident/core/device_memory.hpp"

namespace trident::ops::cuda {

// bytes rounded up to the arena's alignment (what one allocation of `bytes` takes).
inline std::size_t aligned_bytes(std::size_t bytes) {
  constexpr std::size_t a = ArenaAllocator::kAlign;
  return (bytes + a - 1) / a * a;
}

// The arena size make_cuda_ops takes when asked for 0 bytes, on the current device: 85% of
// its memory / ranks_per_device (clamped to >= 1), at most 90% of what is free now.
std::size_t default_arena_bytes(int ranks_per_device);

class CudaMemory final : public DeviceMemory {
 public:
  // `bytes` (0: default_arena_bytes(ranks_per_device)) on the current device; the copies are
  // queued on `stream` (the backend's). An Error naming the sizes when cudaMalloc fails.
  CudaMemory(std::size_t bytes, int ranks_per_device, cudaStream_t stream);
  ~CudaMemory() override;
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;

  const char* where() const override { return where_.c_str(); }
  void* allocate(std::size_t bytes) override;
  void release(void* p) noexcept override;
  bool holds(const void* p) const override;
  std::size_t capacity() const override { return arena_.capacity(); }
  std::size_t used() const override { return arena_.used(); }
  std::size_t peak() const override { return arena_.peak(); }
  std::size_t blocks() const { return arena_.blocks(); }
  const ArenaAllocator& arena() const { return arena_; }  // CUDA graphs' check of their pointers
  void* base() const { return base_; }
  // to_device notes a copy into [p, p + bytes) (the model's weights: CudaOps's weight cache);
  // take_watched_write() says whether one happened since it last asked.
  void watch(const void* p, std::size_t bytes) {
    watched_ = static_cast<const char*>(p);
    watched_bytes_ = p ? bytes : 0;
    watched_written_ = false;
  }
  bool take_watched_write() {
    const bool w = watched_written_;
    watched_written_ = false;
    return w;
  }

  // cudaMemcpyAsync on the stream, then cudaStreamSynchronize: ordered after every op queued
  // before, complete on return.
  void to_device(void* device_dst, const void* host_src, std::size_t bytes) override;
  void to_host(void* host_dst, const void* device_src, std::size_t bytes) override;
  void synchronize() override;
  // On a second stream (non-blocking), ordered after the compute stream's work by an event;
  // copy_done / wait_copy ask the event recorded after the copy.
  std::uint64_t to_host_async(void* host_dst, const void* device_src, std::size_t bytes) override;
  bool copy_done(std::uint64_t ticket) override;
  void wait_copy(std::uint64_t ticket) override;
  // Pinned (page-locked) host memory: cudaHostAlloc / cudaFreeHost.
  void* allocate_host(std::size_t bytes) override;
  void release_host(void* p) noexcept override;

 private:
  ArenaAllocator arena_;
  char* base_ = nullptr;
  cudaStream_t stream_ = nullptr;
  // Staging copies: their stream and a ring of event pairs (made on first use).
  static constexpr std::uint64_t kCopySlots = 256;
  struct Copy {
    cudaEvent_t queued = nullptr, landed = nullptr;
  };
  cudaStream_t staging_ = nullptr;
  std::vector<Copy> copies_;
  std::uint64_t tickets_ = 0;
  const char* watched_ = nullptr;
  std::size_t watched_bytes_ = 0;
  bool watched_written_ = false;
  std::string where_;  // "cuda:0 (NVIDIA H200)"
  std::string what_;   // "device arena of cuda:0 (NVIDIA H200)", for ArenaAllocator's errors
};

// A block of the arena handed out by bump allocation and taken back all at once (reset()):
// the backend's per-call scratch. Owns nothing; the block belongs to a CudaMemory.
class BumpBlock {
 public:
  BumpBlock() = default;
  BumpBlock(void* base, std::size_t capacity) : base_(static_cast<char*>(base)), capacity_(capacity) {}
  // `bytes` (256-byte aligned start); an Error naming the sizes when the block is full.
  void* alloc(std::size_t bytes);
  template <typename T>
  T* alloc_n(std::size_t n) {
    return static_cast<T*>(alloc(n * sizeof(T)));
  }
  void reset() { used_ = 0; }
  void* base() const { return base_; }
  std::size_t capacity() const { return capacity_; }
  std::size_t used() const { return used_; }

 private:
  char* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
};

}  // namespace trident::ops::cuda
