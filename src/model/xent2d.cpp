// Cross-entropy over 2D-sharded logits (see trident/model/xent2d.hpp).
#include "trident/model/xent2d.hpp"
#include "trident/model/vocab_parallel_xent.hpp"

#include <algorithm>

#include "trident/core/error.hpp"

namespace trident::model {

double xent2d_row_bytes(int q, int m) {
  if (q <= 1) return 0;
  return 2.0 * double(q - 1) / double(q) * 4.0 * 3.0 * double(m / q);
}

CrossEntropy2d::CrossEntropy2d(ops::Ops& ops, parallel::Tp2dGrid& grid, int m, int vocab)
    : ops_(ops), grid_(grid) {
  const int q = grid.q;
  TRIDENT_CHECK(q >= 1 && m > 0 && vocab > 0 && m % q == 0, "cross-entropy on a ", q, " x ",
                q, " grid needs the rows (", m, ") divisible by ", q);
  mb_ = m / q;
  vb_ = (vocab + q - 1) / q;
  vocab_start_ = grid.coord.col * vb_;
  v_valid_ = std::clamp(vocab - vocab_start_, 0, vb_);
  row_max_ = FloatBuffer(std::size_t(mb_), ops.memory());
  stats_ = FloatBuffer(std::size_t(2) * std::size_t(mb_), ops.memory());
}

void CrossEntropy2d::forward(float* loss, const float* logits, const std::int32_t* targets) {
  vocab_parallel_xent_forward(ops_, grid_.row, loss, row_max_.data(), stats_.data(), logits,
                              targets, mb_, vb_, v_valid_, vocab_start_);
}

void CrossEntropy2d::backward(float* logits, const std::int32_t* targets, float scale) {
  ops_.xent_backward(logits, row_max_.data(), stats_.data(), targets, mb_, vb_, v_valid_,
                     vocab_start_, scale);
}

}  // namespace trident::model
