// emulate/shim/runtime.cpp — the CUDA runtime API of cuda_runtime_api.h on the CPU (see there
// for what is and is not modelled). Device memory: one mmap per cudaMalloc, recorded in a map
// from start to size, so that a pointer can be checked to be on the "device".
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "emu.hpp"

namespace {

std::mutex mu;                              // cudaMalloc and friends may come from any thread
std::map<const char*, std::size_t> device;  // start -> bytes
std::set<void*> pinned;                     // cudaHostAlloc'ed
std::size_t allocated = 0;
thread_local cudaError_t last_error = cudaSuccess;
int current_device = 0;

std::size_t env_mib(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  return (v && *v ? std::strtoull(v, nullptr, 10) : fallback) << 20;
}
std::size_t total_memory() {
  static const std::size_t total = env_mib("TRIDENT_EMU_GPU_MIB", 4096);
  return total;
}
std::size_t poison_bytes() {
  static const std::size_t poison = env_mib("TRIDENT_EMU_POISON_MIB", 128);
  return poison;
}

cudaError_t fail(cudaError_t e, const char* call, const char* why) {
  std::fprintf(stderr, "cuda emulation: %s: %s\n", call, why);
  last_error = e;
  return e;
}

bool in_device(const void* p, std::size_t bytes) {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(mu);
  auto it = device.upper_bound(c);
  if (it == device.begin()) return false;
  --it;
  return c >= it->first && bytes <= it->second && std::size_t(c - it->first) <= it->second - bytes;
}

// A copy's end must be where the kind says: the device when `dev`, else not the device.
bool where_ok(const void* p, std::size_t bytes, bool dev) {
  return dev ? in_device(p, bytes) : !in_device(p, 1);
}

}  // namespace

namespace emu {
bool is_device(const void* p, std::size_t bytes) { return in_device(p, bytes); }
void launch_error(const char* kernel, const char* why) {
  std::fprintf(stderr, "cuda emulation: launch of %s: %s\n", kernel, why);
  last_error = cudaErrorInvalidConfiguration;
}
}  // namespace emu

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
  if (d != 0) return fail(cudaErrorInvalidDevice, "cudaSetDevice", "one emulated device, 0");
  current_device = d;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* d) {
  *d = current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int d) {
  if (d != 0) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties", "one device, 0");
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "emulated GPU (trident CPU shim)");
  prop->totalGlobalMem = total_memory();
  prop->sharedMemPerBlock = 48 << 10;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->multiProcessorCount = 1;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMemGetInfo(std::size_t* free, std::size_t* total) {
  std::lock_guard<std::mutex> lock(mu);
  *total = total_memory();
  *free = total_memory() - allocated;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  }
  return "unknown error";
}

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (bytes > total_memory() - allocated) {
      last_error = cudaErrorMemoryAllocation;
      return cudaErrorMemoryAllocation;
    }
  }
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation, "cudaMalloc", "mmap failed");
  std::memset(m, 0xff, std::min(bytes, poison_bytes()));  // NaN floats: unwritten memory shows
  std::lock_guard<std::mutex> lock(mu);
  device[static_cast<const char*>(m)] = bytes;
  allocated += bytes;
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  std::size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = device.find(static_cast<const char*>(p));
    if (it == device.end()) {
      last_error = cudaErrorInvalidDevicePointer;
      return cudaErrorInvalidDevicePointer;
    }
    bytes = it->second;
    device.erase(it);
    allocated -= bytes;
  }
  munmap(p, bytes);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned flags) {
  *p = nullptr;
  if (flags != cudaHostAllocDefault)
    return fail(cudaErrorInvalidValue, "cudaHostAlloc", "only cudaHostAllocDefault is emulated");
  void* m = std::aligned_alloc(4096, (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096);
  if (!m) return fail(cudaErrorMemoryAllocation, "cudaHostAlloc", "out of host memory");
  std::memset(m, 0xff, bytes);
  std::lock_guard<std::mutex> lock(mu);
  pinned.insert(m);
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
  return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!pinned.erase(p))
      return fail(cudaErrorInvalidValue, "cudaFreeHost", "not memory of cudaHostAlloc");
  }
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToHost: ok = where_ok(dst, bytes, false) && where_ok(src, bytes, false); break;
    case cudaMemcpyHostToDevice: ok = where_ok(dst, bytes, true) && where_ok(src, bytes, false); break;
    case cudaMemcpyDeviceToHost: ok = where_ok(dst, bytes, false) && where_ok(src, bytes, true); break;
    case cudaMemcpyDeviceToDevice: ok = where_ok(dst, bytes, true) && where_ok(src, bytes, true); break;
    case cudaMemcpyDefault: break;
    default: ok = false;
  }
  if (!ok)
    return fail(cudaErrorInvalidValue, "cudaMemcpy",
                "a pointer is not where the copy's kind says (device: inside one cudaMalloc "
                "block, all of it; host: not device memory)");
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}

// Row by row through cudaMemcpy (its checks of where each row lies), as the real one
// requires: width <= both pitches.
cudaError_t cudaMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                              std::size_t width, std::size_t height, cudaMemcpyKind kind,
                              cudaStream_t) {
  if (width == 0 || height == 0) return cudaSuccess;
  if (width > dpitch || width > spitch)
    return fail(cudaErrorInvalidValue, "cudaMemcpy2DAsync", "width > pitch");
  for (std::size_t r = 0; r < height; r++) {
    const cudaError_t e = cudaMemcpy(static_cast<char*>(dst) + r * dpitch,
                                     static_cast<const char*>(src) + r * spitch, width, kind);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!in_device(p, bytes))
    return fail(cudaErrorInvalidValue, "cudaMemset", "not (all) device memory");
  std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t) {
  return cudaMemset(p, value, bytes);
}

cudaError_t cudaMemset2DAsync(void* p, std::size_t pitch, int value, std::size_t width,
                              std::size_t height, cudaStream_t) {
  if (width == 0 || height == 0) return cudaSuccess;
  if (width > pitch) return fail(cudaErrorInvalidValue, "cudaMemset2DAsync", "width > pitch");
  if (!in_device(p, pitch * (height - 1) + width))
    return fail(cudaErrorInvalidValue, "cudaMemset2DAsync", "not (all) device memory");
  for (std::size_t r = 0; r < height; r++) std::memset(static_cast<char*>(p) + r * pitch, value, width);
  return cudaSuccess;
}

// Streams and events are distinct non-null handles; every operation is complete on return.
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = reinterpret_cast<cudaStream_t>(new char);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<char*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
// An event holds the host clock at its last record (OpTimer's timing under the stand-in).
struct CUevent_st {
  std::chrono::steady_clock::time_point at{};
  bool recorded = false;
};
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (!e) return fail(cudaErrorInvalidValue, "cudaEventRecord", "null event");
  e->at = std::chrono::steady_clock::now();
  e->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms || !start || !end) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime", "null argument");
  if (!start->recorded || !end->recorded)
    return fail(cudaErrorInvalidValue, "cudaEventElapsedTime", "an event never recorded");
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
