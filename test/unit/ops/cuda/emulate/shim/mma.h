// emulate/shim/mma.h — CUDA's warp matrix API (nvcuda::wmma) as far as trident's kernels use
// it: m16n16k16 with __nv_bfloat16 operands (matrix_a, matrix_b; row_major or col_major) and a
// float accumulator. A fragment holds the whole 16 x 16 tile in every thread (on a GPU each
// lane holds a few elements in an unspecified layout), so load_matrix_sync and
// store_matrix_sync read and write the whole tile from each thread; the kernels must put a
// __syncwarp between a store and other lanes' reads (without it a later lane's store here
// overwrites an earlier lane's edit, so the omission shows). mma_sync: products of bf16 values
// are exact in fp32 and summed in fp32 in k order (the tensor cores' order and rounding of the
// sum are not modelled). Checked as the hardware requires: pointers 32-byte aligned, ldm a
// multiple of 16 bytes. Uniform element-wise ops on .x[i] (scaling every element) behave as on
// a GPU; reading .x[i] for a particular (row, column) does not, and kernels must not.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda_bf16.h"
#include "emu.hpp"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

// Element [r][c] of the tile at x[r * 16 + c] (the logical tile, row-major here).
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "emu wmma: m16n16k16 only");
  static constexpr int num_elements = 256;
  T x[num_elements];
};

namespace detail {
inline void check_pointer(const void* p, unsigned ldm, unsigned elem_bytes, const char* op) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0)
    emu::die(op, "pointer not 256-bit (32-byte) aligned");
  if ((ldm * elem_bytes) % 16 != 0) emu::die(op, "ldm is not a multiple of 16 bytes");
}
template <class L>
constexpr bool is_col_major() {
  return std::is_same_v<L, col_major>;
}
}  // namespace detail

// matrix_a is 16 x 16 (M x K), matrix_b 16 x 16 (K x N): element [r][c] at p[r * ldm + c]
// (row_major) or p[c * ldm + r] (col_major).
template <class Use, class L>
void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, L>& f, const __nv_bfloat16* p,
                      unsigned ldm) {
  detail::check_pointer(p, ldm, 2, "wmma::load_matrix_sync");
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      f.x[r * 16 + c] = detail::is_col_major<L>() ? p[c * ldm + r] : p[r * ldm + c];
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  detail::check_pointer(p, ldm, 4, "wmma::load_matrix_sync");
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      f.x[r * 16 + c] = layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  detail::check_pointer(p, ldm, 4, "wmma::store_matrix_sync");
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      (layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[r * 16 + c];
}

template <class Use, class T, class L>
void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, float v) {
  for (auto& e : f.x) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      e = __float2bfloat16_rn(v);
    else
      e = v;
  }
}

// d = a b + c (d may be c).
template <class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[256];
  for (int r = 0; r < 16; r++)
    for (int n = 0; n < 16; n++) {
      float s = c.x[r * 16 + n];
      for (int k = 0; k < 16; k++)
        s += __bfloat162float(a.x[r * 16 + k]) * __bfloat162float(b.x[k * 16 + n]);
      out[r * 16 + n] = s;
    }
  for (int i = 0; i < 256; i++) d.x[i] = out[i];
}

}  // namespace wmma
}  // namespace nvcuda
