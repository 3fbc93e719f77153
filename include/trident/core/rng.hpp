// trident/core/rng.hpp — counter-based random numbers (Philox4x32-10, Salmon et al. 2011).
// A value depends only on (seed, stream key, index), never on which rank asks or in which
// order: weight init keyed by the global parameter name and element index, and the data
// loader keyed by step and sequence index, are therefore identical in every layout.
// defines: trident::rng::philox, key_of, uniform01, normal, uniform_u64
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace trident::rng {

// Philox4x32-10: 4×32-bit counter and 2×32-bit key -> 4×32 random bits.
inline std::array<std::uint32_t, 4> philox(std::array<std::uint32_t, 4> ctr,
                                           std::array<std::uint32_t, 2> key) {
  constexpr std::uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  constexpr std::uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    std::uint64_t p0 = std::uint64_t(M0) * ctr[0];
    std::uint64_t p1 = std::uint64_t(M1) * ctr[2];
    ctr = {std::uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], std::uint32_t(p1),
           std::uint32_t(p0 >> 32) ^ ctr[3] ^ key[1], std::uint32_t(p0)};
    key[0] += W0;
    key[1] += W1;
  }
  return ctr;
}

// A 64-bit stream key from a name (FNV-1a), e.g. a global parameter name.
inline std::uint64_t key_of(std::string_view name) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

inline std::array<std::uint32_t, 4> bits(std::uint64_t seed, std::uint64_t stream,
                                         std::uint64_t index) {
  std::uint64_t k = seed * 0x9E3779B97F4A7C15ull ^ stream;
  return philox({std::uint32_t(index), std::uint32_t(index >> 32), std::uint32_t(stream),
                 std::uint32_t(stream >> 32)},
                {std::uint32_t(k), std::uint32_t(k >> 32)});
}

// Uniform in (0, 1], from 32 bits.
inline double to_unit(std::uint32_t x) { return (double(x) + 1.0) / 4294967296.0; }

inline double uniform01(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return to_unit(bits(seed, stream, index)[0]);
}

// Standard normal (Box-Muller on the first two words).
inline double normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  auto r = bits(seed, stream, index);
  double u1 = to_unit(r[0]), u2 = to_unit(r[1]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// 64 uniform random bits.
inline std::uint64_t uniform_u64(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  auto r = bits(seed, stream, index);
  return (std::uint64_t(r[0]) << 32) | r[1];
}

}  // namespace trident::rng
