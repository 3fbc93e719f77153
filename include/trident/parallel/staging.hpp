// trident/parallel/staging.hpp — how MPI reaches buffers in a backend's device memory: given
// as they are when the MPI library is CUDA-aware (after the device has finished writing
// them), else copied through host memory around each call ("host staging"). One object per
// rank, shared by its communicators (ParallelState::use_device_memory); without one, or for
// host pointers, MPI gets the pointer unchanged.
// defines: trident::parallel::DeviceStaging, HostStage, HostLease
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "trident/core/device_memory.hpp"

namespace trident::parallel {

class HostLease;

// Made with std::make_shared (its leases keep it alive).
class DeviceStaging : public std::enable_shared_from_this<DeviceStaging> {
 public:
  // memory: the backend's device memory (null: all host). mpi_takes_device: pass device
  // pointers to MPI (a CUDA-aware MPI); false: stage through host memory.
  DeviceStaging(DeviceMemory* memory, bool mpi_takes_device);
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  DeviceMemory* memory() const { return memory_; }
  bool mpi_takes_device() const { return direct_; }
  bool on_device(const void* p) const { return holds_device(memory_, p); }
  // p is device memory MPI cannot take: it must go through host memory.
  bool staged(const void* p) const { return !direct_ && on_device(p); }
  // Before MPI reads or writes device memory directly: wait for the device work queued on it.
  void sync_for_mpi(const void* p) const {
    if (direct_ && on_device(p)) memory_->synchronize();
  }
  // Host memory for staging (pinned where the backend has it), at least `bytes`, kept and
  // grown on demand; `slot` keeps the two sides of one call (e.g. reduce-scatter's input and
  // output) apart.
  void* host(std::size_t bytes, int slot = 0);
  // Host memory for one non-blocking call (a Request), at least `bytes`, until the lease
  // ends; leased blocks come from a pool that grows to the most in flight at once, so that
  // a steady step loop allocates nothing.
  HostLease lease(std::size_t bytes);

 private:
  friend class HostLease;
  void give_back(void* p, std::size_t bytes);
  DeviceMemory* memory_;
  bool direct_;
  struct Block {
    void* p = nullptr;
    std::size_t bytes = 0;
  };
  std::vector<Block> blocks_;
  std::vector<Block> pool_;  // free leasable blocks
};

// A block of host memory leased from a DeviceStaging's pool (see lease()); returned on
// destruction. Move-only; a default one holds nothing.
class HostLease {
 public:
  HostLease() = default;
  ~HostLease() { reset(); }
  HostLease(HostLease&& o) noexcept { *this = std::move(o); }
  HostLease& operator=(HostLease&& o) noexcept;
  HostLease(const HostLease&) = delete;
  HostLease& operator=(const HostLease&) = delete;
  void* get() const { return p_; }
  void reset();
  // Lets go of the block without returning it to the pool (something may still write it).
  void abandon() noexcept {
    p_ = nullptr;
    bytes_ = 0;
    owner_.reset();
  }

 private:
  friend class DeviceStaging;
  std::shared_ptr<DeviceStaging> owner_;
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

// One buffer's way to MPI and back: ptr() is what MPI gets (the buffer itself, or its staged
// host copy, filled when copy_in); finish() copies the host copy back when copy_out.
// Use: HostStage s(staging, data, bytes, true, true); MPI_...(s.ptr(), ...); s.finish();
class HostStage {
 public:
  HostStage(DeviceStaging* staging, void* data, std::size_t bytes, bool copy_in, bool copy_out,
            int slot = 0);
  void* ptr() const { return mpi_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(mpi_);
  }
  void finish();

 private:
  DeviceStaging* staging_;
  void* data_;
  void* mpi_;
  std::size_t bytes_;
  bool copy_out_;
};

}  // namespace trident::parallel
