// Host/device copy helpers (see trident/core/device_memory.hpp).
#include "trident/core/device_memory.hpp"

#include <cstring>

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

}  // namespace trident
