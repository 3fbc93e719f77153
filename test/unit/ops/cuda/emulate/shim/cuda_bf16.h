// emulate/shim/cuda_bf16.h — bfloat16 as far as trident needs it: conversion from float with
// round to nearest even (NaN stays a quiet NaN with its payload; on a real GPU
// __float2bfloat16_rn returns one canonical NaN, so trident's kernels do not use it), and back.
#pragma once
#include <cstdint>
#include <cstring>
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
