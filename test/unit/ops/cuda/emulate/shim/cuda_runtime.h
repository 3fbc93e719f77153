// emulate/shim/cuda_runtime.h — the CUDA runtime header: the API (cuda_runtime_api.h) and the
// device side the kernels need (emu.hpp), with the 16-byte vector types and the cache-policy
// loads and stores that common.cuh's Packed128 uses (__ldca, __stwb): each such access of 16
// bytes is checked for 16-byte alignment, as the hardware requires (a misaligned vector access
// faults on a GPU; here the run stops naming it, as mma.h's WMMA checks do).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cuda_runtime_api.h"
#include "emu.hpp"

struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};

namespace emu {
// 16-byte accesses so far (the driver's check that a packed path was taken); with
// TRIDENT_EMU_VECTOR_STATS=1 the process prints the count at exit (which paths a run took).
inline std::uint64_t vector_accesses = 0;
inline struct VectorStats {
  ~VectorStats() {
    const char* on = std::getenv("TRIDENT_EMU_VECTOR_STATS");
    if (on && on[0] == '1')
      std::fprintf(stderr, "cuda emulation: %llu 16-byte accesses\n",
                   static_cast<unsigned long long>(vector_accesses));
  }
} vector_stats;

template <class V>
void check_access(const V* p, const char* op) {
  if (sizeof(V) == 16) vector_accesses++;
  if (reinterpret_cast<std::uintptr_t>(p) % alignof(V) != 0)
    die(op, sizeof(V) == 16 ? "pointer not 16-byte aligned (a 128-bit access)"
                            : "pointer not aligned to its type");
}
}  // namespace emu

template <class V>
V __ldca(const V* p) {
  emu::check_access(p, "__ldca");
  return *p;
}
template <class V>
void __stwb(V* p, V value) {
  emu::check_access(p, "__stwb");
  *p = value;
}
