// Host/device copy helpers (see trident/core/device_memory.hpp).
#include "trident/core/device_memory.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace trident {

void copy_to_host(DeviceMemory* mem, void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (holds_device(mem, src))
    mem->to_host(host_dst, src, bytes);
  else if (host_dst != src)
    std::memcpy(host_dst, src, bytes);
}

void copy_to_device(DeviceMemory* mem, void* dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  if (holds_device(mem, dst))
    mem->to_device(dst, host_src, bytes);
  else if (dst != host_src)
    std::memcpy(dst, host_src, bytes);
}

PinnedBuffer::PinnedBuffer(DeviceMemory* mem, std::size_t n) : mem_(mem), size_(n) {
  if (n == 0) return;
  void* p = mem_ ? mem_->allocate_host(n * sizeof(float)) : std::malloc(n * sizeof(float));
  if (!p) throw std::bad_alloc();
  data_ = static_cast<float*>(p);
}

PinnedBuffer::~PinnedBuffer() {
  if (!data_) return;
  if (mem_)
    mem_->release_host(data_);
  else
    std::free(data_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : mem_(o.mem_), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    PinnedBuffer gone(std::move(*this));
    mem_ = o.mem_;
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

HostMirror::HostMirror(DeviceMemory* mem, float* data, std::int64_t n, bool fill)
    : mem_(mem), device_(data), host_(data), bytes_(std::size_t(n) * sizeof(float)),
      owned_(holds_device(mem, data)) {
  if (!owned_) return;
  host_ = static_cast<float*>(std::malloc(bytes_ ? bytes_ : 1));
  if (!host_) throw std::bad_alloc();
  if (fill) mem_->to_host(host_, device_, bytes_);
}

HostMirror::~HostMirror() {
  if (owned_) std::free(host_);
}

void HostMirror::commit() {
  if (owned_) mem_->to_device(device_, host_, bytes_);
}

}  // namespace trident
