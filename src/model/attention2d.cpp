// Attention's layout on the 2D TP grid (see trident/model/attention2d.hpp).
#include "trident/model/attention2d.hpp"

#include "trident/core/error.hpp"

namespace trident::model {

std::int64_t qkv2d_global_column(std::int64_t col, int c, int q) {
  TRIDENT_CHECK(q >= 1 && c % q == 0 && col >= 0 && col < 3 * std::int64_t(c), "qkv column ",
                col, " of 3 * ", c, " on a ", q, " x ", q, " grid");
  const std::int64_t cq = c / q;             // one of q, k, v's columns in a block
  const std::int64_t block = col / (3 * cq);  // grid column
  const std::int64_t part = (col % (3 * cq)) / cq;  // 0 q, 1 k, 2 v
  return part * c + block * cq + col % cq;
}

ops::Ops::AttentionShape attention2d_shape(int b, int t, int c, int n_head, int q) {
  TRIDENT_CHECK(q >= 1 && b % q == 0 && n_head % q == 0 && c % n_head == 0,
                "2D attention on a ", q, " x ", q, " grid needs the micro-batch (", b,
                ") and the heads (", n_head, ") divisible by ", q);
  ops::Ops::AttentionShape s = ops::attention_shape_qkv(b / q, t, c / q, n_head / q);
  s.hs = c / n_head;
  return s;
}

}  // namespace trident::model
