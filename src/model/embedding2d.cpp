// GPT embeddings and tied LM head on the 2D TP grid (see trident/model/embedding2d.hpp).
#include "trident/model/embedding2d.hpp"

#include "trident/core/error.hpp"

namespace trident::model {

namespace {
int padded(int vocab, int q) { return (vocab + q - 1) / q * q; }
}  // namespace

Embedding2dBytes embedding2d_head_bytes(int q, const Embedding2dShape& s) {
  if (q <= 1) return {};
  const double block = 4.0 * double(s.batch * s.seq / q) * double(padded(s.vocab, q) / q);
  return {(q - 1) * block, (q - 1) * block};
}

Embedding2d::Embedding2d(ops::Ops& ops, parallel::Tp2dGrid& grid, const Embedding2dShape& shape)
    : ops_(ops), grid_(grid), shape_(shape) {
  const int q = grid.q;
  TRIDENT_CHECK(q >= 1 && shape.batch > 0 && shape.seq > 0 && shape.vocab > 0 &&
                    shape.d_model > 0 && shape.batch % q == 0 && shape.d_model % q == 0,
                "the 2D embedding on a ", q, " x ", q, " grid needs the batch and d_model ",
                "divisible by ", q, ", got ", shape.batch, " and ", shape.d_model);
  mb_ = shape.batch / q * shape.seq;
  cb_ = shape.d_model / q;
  vp_ = padded(shape.vocab, q);
  vb_ = vp_ / q;
  stack_ = FloatBuffer(std::size_t(q) * std::size_t(mb_) * std::size_t(vb_), ops.memory());
}

void Embedding2d::forward(float* x, const std::int32_t* tokens, const float* wte,
                          const float* wpe) {
  ops_.embedding_forward(x, tokens, wte, mb_, cb_, 0, vp_);
  ops_.position_forward(x, wpe, shape_.batch / grid_.q, shape_.seq, cb_);
}

void Embedding2d::backward(float* dwte, float* dwpe, const float* dx,
                           const std::int32_t* tokens) {
  ops_.embedding_backward(dwte, dx, tokens, mb_, cb_, 0, vp_);
  ops_.position_backward(dwpe, dx, shape_.batch / grid_.q, shape_.seq, cb_);
}

void Embedding2d::reduce_param_grads(float* dwte, float* dwpe) {
  grid_.col.allreduce_sum(dwte, std::int64_t(vp_) * cb_);
  grid_.col.allreduce_sum(dwpe, std::int64_t(shape_.seq) * cb_);
}

void Embedding2d::head_forward(float* logits, const float* x, const float* wte) {
  const std::int64_t blk = std::int64_t(mb_) * vb_;
  float* stack = stack_.data();
  // stack[j] = x_rc (wte_c rows block j)^T [mb, vb]; summed along the row, j lands on (r, j)
  for (int j = 0; j < grid_.q; ++j)
    ops_.gemm(false, true, mb_, vb_, cb_, 1.0f, x, cb_, wte + std::int64_t(j) * vb_ * cb_, cb_,
              0.0f, stack + j * blk, vb_);
  grid_.row.reduce_scatter_sum(stack, logits, blk);
}

void Embedding2d::head_backward(float* dx, float* dwte, const float* dlogits, const float* x,
                                const float* wte) {
  const std::int64_t blk = std::int64_t(mb_) * vb_;
  // stack[j] = dlogits_rj (Comm refuses an all-gather on one rank: read dlogits there)
  const float* stack = dlogits;
  if (grid_.q > 1) {
    grid_.row.all_gather(dlogits, stack_.data(), blk);
    stack = stack_.data();
  }
  for (int j = 0; j < grid_.q; ++j) {
    const float* wj = wte + std::int64_t(j) * vb_ * cb_;
    // dx_rc += dlogits_rj [mb, vb] @ wte_c[j] [vb, cb]
    ops_.gemm(false, false, mb_, cb_, vb_, 1.0f, stack + j * blk, vb_, wj, cb_,
              j == 0 ? 0.0f : 1.0f, dx, cb_);
    // dwte_c[j] [vb, cb] += dlogits_rj^T @ x_rc
    ops_.gemm(true, false, vb_, cb_, mb_, 1.0f, stack + j * blk, vb_, x, cb_, 1.0f,
              dwte + std::int64_t(j) * vb_ * cb_, cb_);
  }
}

}  // namespace trident::model
