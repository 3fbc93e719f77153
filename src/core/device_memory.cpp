// Host/device copy helpers (see trident/core/device_memory.hpp).
#include "trident/core/device_memory.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

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
