// emulate/shim/emu.hpp — just enough of CUDA to run trident's kernels on the CPU: every CUDA
// thread of a block is a std::thread, blocks run one after another; __syncthreads is a
// block-wide barrier, __shfl_xor_sync an exchange through a slot array between two
// warp-wide barriers, __shared__ arrays are function statics (one block at a time), atomicAdd
// an atomic_ref. Checks indexing, masks and reductions; says nothing of speed, of the memory
// model or of launch limits. Kernels are launched through emu_launch (run.sh rewrites
// `k<<<grid, block, 0, s>>>(args)` into `emu_launch(k, grid, block, args)`).
#pragma once

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
using cudaStream_t = void*;

struct EmuBlock {
  std::unique_ptr<std::barrier<>> block;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::uint64_t slots[1024];
};
inline EmuBlock* emu_block;

inline void __syncthreads() { emu_block->block->arrive_and_wait(); }

template <class T>
T __shfl_xor_sync(unsigned, T v, int o) {
  const int tid = int(threadIdx.x + threadIdx.y * blockDim.x), warp = tid / 32, lane = tid % 32;
  std::memcpy(&emu_block->slots[tid], &v, sizeof v);
  emu_block->warps[warp]->arrive_and_wait();
  T r;
  std::memcpy(&r, &emu_block->slots[warp * 32 + (lane ^ o)], sizeof r);
  emu_block->warps[warp]->arrive_and_wait();
  return r;
}

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }

template <class K, class... A>
void emu_launch(K kernel, dim3 grid, dim3 block, A... args) {
  gridDim = grid;
  blockDim = block;
  const int nt = int(block.x * block.y * block.z);
  for (unsigned by = 0; by < grid.y; by++)
    for (unsigned bx = 0; bx < grid.x; bx++) {
      EmuBlock e;
      e.block = std::make_unique<std::barrier<>>(nt);
      for (int w = 0; w < (nt + 31) / 32; w++) e.warps.push_back(std::make_unique<std::barrier<>>(32));
      emu_block = &e;
      std::vector<std::thread> threads;
      for (int t = 0; t < nt; t++)
        threads.emplace_back([&, t] {
          threadIdx = dim3(unsigned(t) % block.x, unsigned(t) / block.x);
          blockIdx = dim3(bx, by);
          kernel(args...);
        });
      for (auto& th : threads) th.join();
    }
}
