// trident/core/buffer.hpp — owning storage in host memory or in a backend's device memory
// (trident/core/device_memory.hpp), and the device tag every kernel interface speaks in.
// defines: trident::Device, trident::Buffer<T>, FloatBuffer, IntBuffer
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "trident/core/device_memory.hpp"
#include "trident/core/error.hpp"

namespace trident {

enum class Device { cpu, cuda };

// Buffer<T>: n elements of T, not initialized unless zero() is called. Host memory (64-byte
// aligned: a cache line and an AVX-512 vector) when `memory` is null, else a block of that
// device memory, which host code must not touch (data() is a device pointer there; fill it
// through the backend's ops or copy_to_device). Move-only: flat buffers are allocated once at
// start-up and never copied in the step loop.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::size_t n, DeviceMemory* memory = nullptr) : size_(n), memory_(memory) {
    if (n == 0) return;
    if (memory_) {
      data_ = static_cast<T*>(memory_->allocate(n * sizeof(T)));
      return;
    }
    std::size_t bytes = ((n * sizeof(T) + 63) / 64) * 64;
    data_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!data_) throw std::bad_alloc();
  }
  ~Buffer() {
    if (memory_)
      memory_->release(data_);
    else
      std::free(data_);
  }
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Device device() const { return memory_ ? Device::cuda : Device::cpu; }
  bool on_device() const { return memory_ != nullptr; }
  DeviceMemory* memory() const { return memory_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  void zero() {  // host buffers only (a device buffer is zeroed by its backend's ops)
    TRIDENT_CHECK(!memory_, "Buffer::zero on device memory");
    if (size_) std::memset(static_cast<void*>(data_), 0, size_ * sizeof(T));
  }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(memory_, o.memory_);
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
  DeviceMemory* memory_ = nullptr;
};

using FloatBuffer = Buffer<float>;
using IntBuffer = Buffer<std::int32_t>;

}  // namespace trident
