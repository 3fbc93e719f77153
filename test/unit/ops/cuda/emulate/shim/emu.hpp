// emulate/shim/emu.hpp — just enough of CUDA's device side to run trident's kernels on the
// CPU. One OS thread runs a launch: the blocks one after another, and the CUDA threads of a
// block as fibers (own stacks, switched by a few instructions of x86-64 assembly in emu.cpp)
// that run until they reach a __syncthreads or a warp shuffle and wait there until their
// block (or warp) has all arrived. A kernel whose first thread reaches no such point runs its
// other threads as plain calls, without fibers; should one of them then synchronize, the run
// stops with an error instead of guessing. __shared__ arrays are function statics (one block
// at a time), atomicAdd a plain add (one OS thread), __shfl_xor_sync and __all_sync an
// exchange through a slot array between two warp barriers, full masks only; __syncwarp a warp
// barrier. Threads leaving early drop out of the barriers (as exited threads do on the GPU).
// WMMA (nvcuda::wmma): mma.h.
// Checks indexing, masks, reductions, launch limits (block size, grid size: an invalid
// configuration is reported through cudaGetLastError, as a real launch) and, built with
// TRIDENT_EMU_DEVICE_POINTERS (train.sh), that every pointer argument of a kernel is null or
// device memory of the runtime shim (cuda_runtime_api.h). Says nothing of speed, of the
// memory model (threads never run concurrently, so data races cannot show) or of
// asynchrony: a launch has finished when emu_launch returns.
// Kernels are launched through emu_launch (run.sh and train.sh rewrite
// `k<<<grid, block, 0, s>>>(args)` into `emu_launch(k, "k", grid, block, args)`).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

#include "cuda_runtime_api.h"

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
// Plain globals: one OS thread runs every kernel, and the scheduler sets threadIdx before it
// resumes a fiber.
inline dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

namespace emu {
// emu.cpp
void sync_block();                              // __syncthreads
void sync_warp();                               // one warp barrier (of the calling thread)
std::uint64_t* shuffle_slots();                 // 1024 slots, one per thread of the block
unsigned thread_rank();                         // linear index of the thread in its block
unsigned block_threads();
[[noreturn]] void die(const char* what, const char* detail);
void run_grid(const char* kernel, dim3 grid, dim3 block, void (*body)(void*), void* ctx);
// cuda_runtime shim (runtime.cpp): is [p, p + bytes) inside one cudaMalloc block?
bool is_device(const void* p, std::size_t bytes);
void launch_error(const char* kernel, const char* why);  // sets cudaGetLastError
// Stream capture (runtime.cpp): whether this thread records what it queues on `stream`
// (nullptr: a kernel launch, which names no stream here: any stream this thread captures),
// and the record (true: it succeeded when replayed).
bool capturing(cudaStream_t stream = nullptr);
void record(const char* what, std::function<bool()> op);
// A call CUDA refuses during a capture: the capture is invalidated and `call` returns this.
cudaError_t refuse_in_capture(const char* call);

// false (and the launch's error set) for a pointer that is neither null nor device memory:
// the kernel is then not run (on a GPU it would fault).
template <class T>
bool check_arg(const char* kernel, const T& arg) {
  if constexpr (std::is_pointer_v<T>) {
    if (arg != nullptr && !is_device(arg, 1)) {
      launch_error(kernel, "a pointer argument is not device memory (not from cudaMalloc)");
      return false;
    }
  }
  return true;
}
}  // namespace emu

inline void __syncthreads() { emu::sync_block(); }
// Full mask only: a barrier of the calling thread's warp.
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) emu::die("__syncwarp", "only full masks are emulated");
  emu::sync_warp();
}

template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t), "emu: shuffles of at most 8 bytes");
  if (mask != 0xffffffffu) emu::die("__shfl_xor_sync", "only full masks are emulated");
  const unsigned tid = emu::thread_rank();
  const unsigned src = (tid & ~31u) | ((tid & 31u) ^ unsigned(lane_mask & 31));
  if (src >= emu::block_threads()) emu::die("__shfl_xor_sync", "source lane outside the block");
  std::uint64_t* slots = emu::shuffle_slots();
  std::memcpy(&slots[tid], &v, sizeof v);
  emu::sync_warp();
  T r;
  std::memcpy(&r, &slots[src], sizeof r);
  emu::sync_warp();  // nobody overwrites its slot before everyone has read
  return r;
}

// Full masks and whole warps only (an exited lane's slot would be stale).
inline int __all_sync(unsigned mask, int predicate) {
  if (mask != 0xffffffffu) emu::die("__all_sync", "only full masks are emulated");
  const unsigned tid = emu::thread_rank(), base = tid & ~31u;
  if (base + 32 > emu::block_threads()) emu::die("__all_sync", "a warp of fewer than 32 threads");
  std::uint64_t* slots = emu::shuffle_slots();
  slots[tid] = predicate != 0;
  emu::sync_warp();
  int all = 1;
  for (unsigned i = base; i < base + 32; i++) all &= int(slots[i]);
  emu::sync_warp();  // nobody overwrites its slot before everyone has read
  return all;
}

// nvcc's round-to-nearest intrinsics are there to stop contraction into FMAs; the shim's
// callers are built with -ffp-contract=off (train.sh, run.sh), so plain operators are exact.
// (nvcc contracts plain a * b + c in kernels by default: the emulation does not, so the
// other kernels' last bits may differ from a GPU's.)
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float atomicAdd(float* p, float v) {  // one OS thread: no other thread can interleave
  const float old = *p;
  *p = old + v;
  return old;
}
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p = old + v;
  return old;
}

template <class K, class... A>
void emu_launch(K kernel, const char* name, dim3 grid, dim3 block, A... args) {
#ifdef TRIDENT_EMU_DEVICE_POINTERS
  if (!(emu::check_arg(name, args) && ...)) return;
#endif
  if (emu::capturing()) {  // the arguments by value, run at each launch of the graph
    emu::record(name, [=] {
      emu_launch(kernel, name, grid, block, args...);
      return cudaGetLastError() == cudaSuccess;
    });
    return;
  }
  auto body = [&] { kernel(args...); };
  using Body = decltype(body);
  emu::run_grid(name, grid, block, [](void* ctx) { (*static_cast<Body*>(ctx))(); }, &body);
}
