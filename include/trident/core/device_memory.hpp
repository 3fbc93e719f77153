// trident/core/device_memory.hpp — memory of an accelerator, which host code may not read or
// write directly, and the copies in and out of it. A backend with such memory (ops/cuda; the
// test backend "cpu-guarded") hands out a DeviceMemory; the model's Buffers are carved from it
// and every host <-> device crossing (initial weights, tokens, the loss, checkpoints, MPI
// without CUDA support) goes through to_host / to_device. The CPU backend has none (nullptr):
// its buffers are host memory and every copy helper below is a memcpy.
// defines: trident::DeviceMemory, copy_to_host, copy_to_device, holds_device, HostMirror
#pragma once

#include <cstddef>
#include <cstdint>

namespace trident {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Where the memory is, for messages ("cuda:0 (NVIDIA H200)", "cpu-guarded").
  virtual const char* where() const = 0;

  // `bytes` of device memory from the arena made at start-up (never a new cudaMalloc): a
  // distinct block aligned to 256 bytes, not initialized. An Error naming the sizes when the
  // arena is full. release(nullptr) does nothing.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  // Whether p points into this device memory.
  virtual bool holds(const void* p) const = 0;
  virtual std::size_t capacity() const = 0;
  virtual std::size_t used() const = 0;
  // The most that was ever in use (the high-water mark): used() where not tracked.
  virtual std::size_t peak() const { return used(); }

  // Copies between host and device memory, after all device work queued before them; they
  // return when the copy is complete (the host side may be reused or read at once).
  virtual void to_device(void* device_dst, const void* host_src, std::size_t bytes) = 0;
  virtual void to_host(void* host_dst, const void* device_src, std::size_t bytes) = 0;
  // Waits for all queued device work: before MPI reads device memory directly.
  virtual void synchronize() = 0;

  // A copy to host memory (pinned: allocate_host) on the backend's staging stream: it starts
  // after the device work queued so far and holds up neither the host nor the compute
  // stream. Returns a ticket at once; copy_done(ticket) says whether the copy has landed (the
  // host side must not be read before), wait_copy(ticket) waits for it. Tickets complete in
  // the order they were issued. Without a staging stream: a plain to_host, done on return.
  virtual std::uint64_t to_host_async(void* host_dst, const void* device_src, std::size_t bytes) {
    to_host(host_dst, device_src, bytes);
    return 0;
  }
  virtual bool copy_done(std::uint64_t /*ticket*/) { return true; }
  virtual void wait_copy(std::uint64_t /*ticket*/) {}

  // Host memory the device copies to and from fastest (pinned, page-locked on CUDA).
  virtual void* allocate_host(std::size_t bytes) = 0;
  virtual void release_host(void* p) noexcept = 0;
};

// True when `mem` is set and p is its memory.
inline bool holds_device(const DeviceMemory* mem, const void* p) {
  return mem != nullptr && p != nullptr && mem->holds(p);
}
// Copies that take any mix of host memory and mem's memory (mem may be null: all host).
void copy_to_host(DeviceMemory* mem, void* host_dst, const void* src, std::size_t bytes);
void copy_to_device(DeviceMemory* mem, void* dst, const void* host_src, std::size_t bytes);

}  // namespace trident

namespace trident {

// n floats of `data` (mem's device memory, or host memory) seen from the host: `data` itself
// when that is host memory, else a host copy, read from the device when `fill`; commit()
// writes the copy back (nothing to do for host memory). For checkpoints and dumps.
class HostMirror {
 public:
  HostMirror(DeviceMemory* mem, float* data, std::int64_t n, bool fill);
  ~HostMirror();
  HostMirror(const HostMirror&) = delete;
  HostMirror& operator=(const HostMirror&) = delete;
  float* data() { return host_; }
  void commit();

 private:
  DeviceMemory* mem_;
  float* device_;
  float* host_;
  std::size_t bytes_;
  bool owned_;
};

}  // namespace trident
