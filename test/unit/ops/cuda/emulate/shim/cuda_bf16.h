// emulate/shim: bfloat16 as far as the kernels need it (round to nearest even).
#pragma once
#include "emu.hpp"
struct __nv_bfloat16 {
  std::uint16_t x;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return __nv_bfloat16{std::uint16_t(u >> 16)};
}
