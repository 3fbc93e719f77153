// emulate/shim/cuda_bf16.h — bfloat16 as far as trident needs it: conversion from float with
// round to nearest even (NaN stays a quiet NaN with its payload; on a real GPU
// __float2bfloat16_rn returns one canonical NaN, so trident's kernels do not use it), and back.
// Built with TRIDENT_EMU_BF16_EXACT (run.sh's second build of the tensor-core kernels),
// __nv_bfloat16 is a float under another name and the conversions are exact: the kernels'
// logic can then be checked against fp32 to fp32's accuracy, apart from their bf16 rounding.
#pragma once
#include <cstdint>
#include <cstring>
#ifdef TRIDENT_EMU_BF16_EXACT
#define __nv_bfloat16 emu_exact_bfloat16
#define __float2bfloat16_rn emu_exact_float2bfloat16
#define __bfloat162float emu_exact_bfloat162float
struct __nv_bfloat16 {
  float x;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{f}; }
inline float __bfloat162float(__nv_bfloat16 b) { return b.x; }
#else
struct __nv_bfloat16 {
  std::uint16_t x;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{std::uint16_t((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return __nv_bfloat16{std::uint16_t(u >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 b) {
  const std::uint32_t u = std::uint32_t(b.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
#endif
