// trident/ops/cp_slice.hpp — which global positions a context-parallel rank's local rows hold
// (Megatron's load-balanced split, model/ring_attention.hpp): a sequence of T tokens cut into
// 2·cp chunks of T/(2·cp); CP rank r holds chunks r and 2·cp−1−r, in that order. In the ops
// layer because the coarse Llama block rotates its rows at these positions (RoPE).
// defines: trident::ops::cp_chunk, CpSlice
#pragma once

#include <cstdint>

namespace trident::ops {

// The global chunk index of local chunk `which` (0 or 1) of CP rank `rank` among 2·cp.
inline int cp_chunk(int cp, int rank, int which) { return which == 0 ? rank : 2 * cp - 1 - rank; }

// Which global positions a rank's local rows hold: runs of consecutive positions, each
// (row offset within the local sequence, rows, first position). cp == 1: one run of all t
// rows from pos0 over all b sequences at once; cp > 1: the two chunks of every sequence.
struct CpSlice {
  int cp = 1, rank = 0;
  // fn(first local row among the b*t, sequences it spans, rows per sequence, first position)
  template <class Fn>
  void for_each_run(int b, int t, int pos0, Fn&& fn) const {
    if (cp == 1) {
      fn(std::int64_t(0), b, t, pos0);
      return;
    }
    const int chunk = t / 2;  // t = T/cp local rows: two chunks of T/(2·cp)
    for (int s = 0; s < b; s++)
      for (int which = 0; which < 2; which++)
        fn(std::int64_t(s) * t + std::int64_t(which) * chunk, 1, chunk,
           pos0 + cp_chunk(cp, rank, which) * chunk);
  }
};

}  // namespace trident::ops
