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
#include <string>
#include <vector>

#include "emu.hpp"

namespace {

std::mutex mu;                              // cudaMalloc and friends may come from any thread
std::map<const char*, std::size_t> device;  // start -> bytes
std::map<const char*, std::size_t> pinned;  // cudaHostAlloc'ed: start -> bytes
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

// The capture this thread runs (cuda_runtime_api.h: stream capture).
struct Record {
  const char* what;
  std::function<bool()> op;
};
struct Capture {
  cudaStream_t stream = nullptr;
  bool invalidated = false;
  std::vector<Record> ops;
};
thread_local Capture* capture = nullptr;

bool capture_knob(const char* what) {
  const char* v = std::getenv("TRIDENT_EMU_CAPTURE_FAIL");
  return v && std::strcmp(v, what) == 0;
}

}  // namespace

struct CUgraph_st {
  std::vector<Record> ops;
};
struct CUgraphExec_st {
  std::vector<Record> ops;
};

namespace emu {
bool capturing(cudaStream_t stream) {
  return capture != nullptr && (stream == nullptr || stream == capture->stream);
}
void record(const char* what, std::function<bool()> op) {
  capture->ops.push_back({what, std::move(op)});
}
cudaError_t refuse_in_capture(const char* call) {
  std::fprintf(stderr, "cuda emulation: %s is not allowed while a stream is being captured "
               "(the capture is invalidated)\n", call);
  capture->invalidated = true;
  last_error = cudaErrorStreamCaptureUnsupported;
  return cudaErrorStreamCaptureUnsupported;
}
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

cudaError_t cudaDeviceSynchronize() {
  if (capture) return emu::refuse_in_capture("cudaDeviceSynchronize");
  return cudaSuccess;
}

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
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
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
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
  }
  return "unknown error";
}

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  if (capture) return emu::refuse_in_capture("cudaMalloc");
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
  if (capture) return emu::refuse_in_capture("cudaFree");
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
  if (capture) return emu::refuse_in_capture("cudaHostAlloc");
  *p = nullptr;
  if (flags != cudaHostAllocDefault)
    return fail(cudaErrorInvalidValue, "cudaHostAlloc", "only cudaHostAllocDefault is emulated");
  void* m = std::aligned_alloc(4096, (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096);
  if (!m) return fail(cudaErrorMemoryAllocation, "cudaHostAlloc", "out of host memory");
  std::memset(m, 0xff, bytes);
  std::lock_guard<std::mutex> lock(mu);
  pinned[static_cast<const char*>(m)] = std::max<std::size_t>(bytes, 1);
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
  return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void* p) {
  if (capture) return emu::refuse_in_capture("cudaFreeHost");
  if (!p) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!pinned.erase(static_cast<const char*>(p)))
      return fail(cudaErrorInvalidValue, "cudaFreeHost", "not memory of cudaHostAlloc");
  }
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (capture) return emu::refuse_in_capture("cudaMemcpy");
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

namespace {
// The checks of an async call queued on `s` during this thread's capture: false (the
// capture invalidated) where CUDA refuses it. Pinned host memory only, as a graph's copy
// node reads or writes the host at each launch.
bool pinned_host(const void* p) {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(mu);
  auto it = pinned.upper_bound(c);
  if (it == pinned.begin()) return false;
  --it;
  return c < it->first + it->second;
}
cudaError_t capture_copy(const char* call, cudaStream_t s, const void* dst, const void* src,
                         cudaMemcpyKind kind) {
  if (s == nullptr) return emu::refuse_in_capture("an async call on the legacy stream");
  const bool host_dst = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost;
  const bool host_src = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost;
  if ((host_dst && !pinned_host(dst)) || (host_src && !pinned_host(src)))
    return emu::refuse_in_capture(call);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  if (capture && (s == nullptr || emu::capturing(s))) {
    const cudaError_t e = capture_copy("cudaMemcpyAsync", s, dst, src, kind);
    if (e != cudaSuccess) return e;
    emu::record("cudaMemcpyAsync", [=] { return cudaMemcpyAsync(dst, src, bytes, kind, s) == cudaSuccess; });
    return cudaSuccess;
  }
  Capture* held = capture;  // another stream: runs now (the checks of cudaMemcpy)
  capture = nullptr;
  const cudaError_t e = cudaMemcpy(dst, src, bytes, kind);
  capture = held;
  return e;
}

// Row by row through cudaMemcpy (its checks of where each row lies), as the real one
// requires: width <= both pitches.
cudaError_t cudaMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                              std::size_t width, std::size_t height, cudaMemcpyKind kind,
                              cudaStream_t s) {
  if (capture && (s == nullptr || emu::capturing(s))) {
    const cudaError_t e = capture_copy("cudaMemcpy2DAsync", s, dst, src, kind);
    if (e != cudaSuccess) return e;
    emu::record("cudaMemcpy2DAsync", [=] {
      return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, s) == cudaSuccess;
    });
    return cudaSuccess;
  }
  Capture* held = capture;
  capture = nullptr;
  struct Restore {
    Capture* c;
    ~Restore() { capture = c; }
  } restore{held};
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
  if (capture) return emu::refuse_in_capture("cudaMemset");
  if (bytes == 0) return cudaSuccess;
  if (!in_device(p, bytes))
    return fail(cudaErrorInvalidValue, "cudaMemset", "not (all) device memory");
  std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t s) {
  if (capture && s == nullptr) return emu::refuse_in_capture("an async call on the legacy stream");
  if (emu::capturing(s) && s) {
    emu::record("cudaMemsetAsync", [=] { return cudaMemsetAsync(p, value, bytes, s) == cudaSuccess; });
    return cudaSuccess;
  }
  Capture* held = capture;
  capture = nullptr;
  const cudaError_t e = cudaMemset(p, value, bytes);
  capture = held;
  return e;
}

cudaError_t cudaMemset2DAsync(void* p, std::size_t pitch, int value, std::size_t width,
                              std::size_t height, cudaStream_t s) {
  if (capture && s == nullptr) return emu::refuse_in_capture("an async call on the legacy stream");
  if (emu::capturing(s) && s) {
    emu::record("cudaMemset2DAsync", [=] {
      return cudaMemset2DAsync(p, pitch, value, width, height, s) == cudaSuccess;
    });
    return cudaSuccess;
  }
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
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  if (capture) return emu::refuse_in_capture("cudaStreamSynchronize");
  return cudaSuccess;
}
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
cudaError_t cudaEventQuery(cudaEvent_t) {
  if (capture) return emu::refuse_in_capture("cudaEventQuery");
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return fail(cudaErrorInvalidValue, "cudaEventRecord", "null event");
  if (capture && s == nullptr) return emu::refuse_in_capture("an event record on the legacy stream");
  if (emu::capturing(s) && s) {
    emu::record("cudaEventRecord", [=] { return cudaEventRecord(e, s) == cudaSuccess; });
    return cudaSuccess;
  }
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
cudaError_t cudaEventSynchronize(cudaEvent_t) {
  if (capture) return emu::refuse_in_capture("cudaEventSynchronize");
  return cudaSuccess;
}

// ---- stream capture and graphs -------------------------------------------------------

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  if (!s) return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture", "the legacy stream");
  if (capture) return fail(cudaErrorInvalidValue, "cudaStreamBeginCapture", "already capturing");
  if (capture_knob("begin"))
    return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture",
                "refused (TRIDENT_EMU_CAPTURE_FAIL=begin)");
  capture = new Capture;
  capture->stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  *graph = nullptr;
  if (!capture || capture->stream != s)
    return fail(cudaErrorInvalidValue, "cudaStreamEndCapture", "the stream is not being captured");
  Capture* c = capture;
  capture = nullptr;
  const bool invalid = c->invalidated || capture_knob("end");
  if (!invalid) *graph = new CUgraph_st{std::move(c->ops)};
  delete c;
  if (invalid) {
    last_error = cudaErrorStreamCaptureInvalidated;
    return cudaErrorStreamCaptureInvalidated;
  }
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  *status = !emu::capturing(s) || !s ? cudaStreamCaptureStatusNone
            : capture->invalidated   ? cudaStreamCaptureStatusInvalidated
                                     : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph,
                                          unsigned long long) {
  *exec = nullptr;
  if (!graph) return fail(cudaErrorInvalidValue, "cudaGraphInstantiateWithFlags", "null graph");
  if (capture_knob("instantiate"))
    return fail(cudaErrorInvalidValue, "cudaGraphInstantiateWithFlags",
                "refused (TRIDENT_EMU_CAPTURE_FAIL=instantiate)");
  *exec = new CUgraphExec_st{graph->ops};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  if (capture) return emu::refuse_in_capture("cudaGraphLaunch (into a capture)");
  if (!exec) return fail(cudaErrorInvalidValue, "cudaGraphLaunch", "null graph");
  for (const Record& r : exec->ops)
    if (!r.op()) {
      std::fprintf(stderr, "cuda emulation: cudaGraphLaunch: the recorded %s failed when "
                   "replayed (a GPU graph would fault)\n", r.what);
      std::abort();
    }
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
