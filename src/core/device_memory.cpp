// Host/device copy helpers (see trident/core/device_memory.hpp).
#include "trident/core/device_memory.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace trident {

namespace {

// One copy between host memory and `dst` (to_device) or `src`: the backend's transfer when
// that side is device memory `mem` holds, else a plain memcpy.
void copy_across(DeviceMemory* mem, void* dst, const void* src, std::size_t bytes,
                 bool to_device) {
  if (bytes == 0) return;
  if (!holds_device(mem, to_device ? static_cast<const void*>(dst) : src)) {
    if (dst != src) std::memcpy(dst, src, bytes);
  } else if (to_device) {
    mem->to_device(dst, src, bytes);
  } else {
    mem->to_host(dst, src, bytes);
  }
}

}  // namespace

void copy_to_host(DeviceMemory* mem, void* host_dst, const void* src, std::size_t bytes) {
  copy_across(mem, host_dst, src, bytes, false);
}

void copy_to_device(DeviceMemory* mem, void* dst, const void* host_src, std::size_t bytes) {
  copy_across(mem, dst, host_src, bytes, true);
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
