// The coarse GPT-2 block ops' default (see trident/ops/ops.hpp): THE sequence of GPT-2's block
// for one rank and for TP / SP (the collectives the shape names between the products; TP 1:
// the identity), so that a backend without a fused block gives the model's results bit for
// bit, the split backward's B and W (a W stash) included. Context parallelism: attention
// through the shape's hook (the model's ring or Ulysses attention). model/gpt2_block.cpp
// composes only the key-value-cache step itself.
// The same for Llama's block (model::LlamaBlock), RoPE at the positions of the shape's slice.
// defines: Ops::gpt2_block_forward, Ops::gpt2_block_backward, Ops::gpt2_block_backward_weights,
//          Ops::gpt2_block_recompute, Ops::llama_block_forward, Ops::llama_block_backward,
//          Ops::llama_block_backward_weights, Ops::llama_block_recompute
#include "trident/core/error.hpp"
#include "trident/ops/ops.hpp"

namespace trident::ops {

namespace {
// TP 1's collectives: one rank holds every row and column, so each mapping is the identity.
struct OneRank final : Ops::BlockCollectives {
  float* local_part(float* full, std::int64_t) override { return full; }
  void enter_forward(float*, std::int64_t) override {}
  float* partial_of(float* y) override { return y; }
  void leave_forward(float*, float*, std::int64_t) override {}
  const float* enter_backward(float* dfull, std::int64_t) override { return dfull; }
  const float* leave_backward(const float* dlocal, std::int64_t) override { return dlocal; }
};
Ops::BlockCollectives& collectives_of(Ops::BlockCollectives* tp) {
  static OneRank one_rank;
  return tp ? *tp : one_rank;
}
}  // namespace

void Ops::gpt2_block_forward(const Gpt2BlockShape& s, const Gpt2BlockParams& p, const float* x,
                             float* out, const Gpt2BlockStash& la) {
  TRIDENT_CHECK(!la.bf16, "gpt2_block_forward: ", name(), " keeps no bf16 stash");
  BlockCollectives& tp = collectives_of(s.tp);
  const int n = s.b * s.t, C = s.c, Ca = s.attn_c(), F = s.f, nr = s.rows();
  const std::int64_t local_n = std::int64_t(nr) * C;  // the residual stream's floats here
  // Row-parallel: y's local rows = the sum over TP of x @ w (+ the bias on TP rank 0 only, so
  // that the sum adds it once).
  auto row_parallel = [&](float* y, const float* in_x, const float* w, const float* bias,
                          int in) {
    float* partial = tp.partial_of(y);
    linear_forward(partial, in_x, w, s.tp_rank == 0 ? bias : nullptr, n, in, C);
    tp.leave_forward(partial, y, local_n);
  };
  // attention (x is not read after it: out may be x)
  layernorm_forward(tp.local_part(la.ln1, local_n), la.ln1_mean, la.ln1_rstd, x, p.ln1_w,
                    p.ln1_b, nr, C);
  tp.enter_forward(la.ln1, local_n);
  linear_forward(la.qkv, la.ln1, p.qkv_w, p.qkv_b, n, C, 3 * Ca);
  const AttentionShape att = attention_shape_qkv(s.b, s.t, Ca, s.nh);
  OwnAttention own(*this);
  BlockAttention& attention = s.attention ? *s.attention : own;
  attention.forward(la.atty, la.lse, la.qkv, la.qkv + Ca, la.qkv + 2 * Ca, att, false);
  row_parallel(la.res2, la.atty, p.attproj_w, p.attproj_b, Ca);
  add(la.res2, la.res2, x, local_n);
  // MLP
  layernorm_forward(tp.local_part(la.ln2, local_n), la.ln2_mean, la.ln2_rstd, la.res2, p.ln2_w,
                    p.ln2_b, nr, C);
  tp.enter_forward(la.ln2, local_n);
  linear_forward(la.fch, la.ln2, p.fc_w, p.fc_b, n, C, F);
  gelu_forward(la.fch_gelu, la.fch, std::int64_t(n) * F);
  row_parallel(out, la.fch_gelu, p.fcproj_w, p.fcproj_b, F);
  add(out, out, la.res2, local_n);
}

void Ops::gpt2_block_backward(const Gpt2BlockShape& s, const Gpt2BlockParams& p,
                              const Gpt2BlockParams& g, const float* x, float* dres,
                              const Gpt2BlockStash& la, const Gpt2BlockScratch& scratch,
                              const BlockWStash* w) {
  TRIDENT_CHECK(!la.bf16, "gpt2_block_backward: ", name(), " keeps no bf16 stash");
  BlockCollectives& tp = collectives_of(s.tp);
  const int n = s.b * s.t, C = s.c, Ca = s.attn_c(), F = s.f, nr = s.rows();
  const std::int64_t local_n = std::int64_t(nr) * C;
  float* dbuf = scratch.dbuf;  // [N,C] partial input gradients of column-parallel layers
  // c_fc and c_attn: the input and parameter gradients without a W stash; with one (the
  // zero-bubble B) the input gradient only, and the output gradient kept for W.
  auto linear = [&](float* dx, float* dw, float* db, const float* dy, const float* in_x,
                    const float* wt, int in, int out, float* keep) {
    if (!keep) return linear_backward(dx, dw, db, dy, in_x, wt, n, in, out);
    gemm(false, true, n, in, out, 1.0f, dy, out, wt, out, 0.0f, dx, in);
    copy(keep, dy, std::int64_t(n) * out);
  };
  // MLP: out = res2 + c_proj(gelu(c_fc(ln_2(res2))))   (dres: the local rows)
  const float* dout = tp.leave_backward(dres, local_n);
  linear_backward(scratch.dact, g.fcproj_w, g.fcproj_b, dout, la.fch_gelu, p.fcproj_w, n, F, C);
  gelu_backward(scratch.dfch, la.fch, scratch.dact, std::int64_t(n) * F);
  // la.fch is read for the last time above: w->dfch may be it.
  linear(dbuf, g.fc_w, g.fc_b, scratch.dfch, la.ln2, p.fc_w, C, F, w ? w->dfch : nullptr);
  const float* dln2 = tp.enter_backward(dbuf, local_n);
  layernorm_backward(dres, g.ln2_w, g.ln2_b, dln2, la.res2, p.ln2_w, la.ln2_mean, la.ln2_rstd,
                     nr, C);
  // Attention: res2 = x + c_proj(attention(c_attn(ln_1(x))))
  const float* dres2 = tp.leave_backward(dres, local_n);
  float* datty = dbuf;  // [N, Ca], free again once attention_backward has read it
  linear_backward(datty, g.attproj_w, g.attproj_b, dres2, la.atty, p.attproj_w, n, Ca, C);
  const AttentionShape att = attention_shape_qkv(s.b, s.t, Ca, s.nh);
  float* dqkv = scratch.dqkv;
  OwnAttention own(*this);
  BlockAttention& attention = s.attention ? *s.attention : own;
  attention.backward(dqkv, dqkv + Ca, dqkv + 2 * Ca, datty, la.atty, la.lse, la.qkv,
                     la.qkv + Ca, la.qkv + 2 * Ca, att, false);
  // la.qkv is read for the last time above: w->dqkv may be it.
  linear(dbuf, g.qkv_w, g.qkv_b, dqkv, la.ln1, p.qkv_w, C, 3 * Ca, w ? w->dqkv : nullptr);
  const float* dln1 = tp.enter_backward(dbuf, local_n);
  layernorm_backward(dres, g.ln1_w, g.ln1_b, dln1, x, p.ln1_w, la.ln1_mean, la.ln1_rstd, nr, C);
}

void Ops::gpt2_block_backward_weights(const Gpt2BlockShape& s, const Gpt2BlockParams& p,
                                      const Gpt2BlockParams& g, const Gpt2BlockStash& la,
                                      const BlockWStash& w) {
  TRIDENT_CHECK(!la.bf16, "gpt2_block_backward_weights: ", name(), " keeps no bf16 stash");
  const int n = s.b * s.t, C = s.c, Ca = s.attn_c(), F = s.f;
  linear_backward(nullptr, g.fc_w, g.fc_b, w.dfch, la.ln2, p.fc_w, n, C, F);
  linear_backward(nullptr, g.qkv_w, g.qkv_b, w.dqkv, la.ln1, p.qkv_w, n, C, 3 * Ca);
}

void Ops::gpt2_block_recompute(const Gpt2BlockShape& s, const Gpt2BlockStash& la) {
  TRIDENT_CHECK(!la.bf16, "gpt2_block_recompute: ", name(), " keeps no bf16 stash");
  const int n = s.b * s.t, Ca = s.attn_c();
  const AttentionShape att = attention_shape_qkv(s.b, s.t, Ca, s.nh);
  OwnAttention own(*this);
  BlockAttention& attention = s.attention ? *s.attention : own;
  attention.forward(la.atty, la.lse, la.qkv, la.qkv + Ca, la.qkv + 2 * Ca, att, false);
  gelu_forward(la.fch_gelu, la.fch, std::int64_t(n) * s.f);
}

void Ops::llama_block_forward(const LlamaBlockShape& s, const LlamaBlockParams& p,
                              const float* x, float* out, const LlamaBlockStash& la) {
  TRIDENT_CHECK(!la.bf16, "llama_block_forward: ", name(), " keeps no bf16 stash");
  BlockCollectives& tp = collectives_of(s.tp);
  const int n = s.b * s.t, C = s.c, Ca = s.ca ? s.ca : C, F = s.f, nr = s.nr ? s.nr : n;
  const AttentionShape att = attention_shape_llama(s);
  const int C3 = int(att.ld_q), kv = (C3 - Ca) / 2;  // this rank's k (and v) columns
  const std::int64_t k0 = Ca + std::int64_t(s.kv_head0) * att.hs;  // the k its heads read
  const std::int64_t local_n = std::int64_t(nr) * C;
  // Row-parallel (y = x @ W^T, W [C, in]): y's local rows = the sum over TP.
  auto row_parallel = [&](float* y, const float* in_x, const float* w, int in) {
    float* partial = tp.partial_of(y);
    gemm(false, true, n, C, in, 1.0f, in_x, in, w, in, 0.0f, partial, C);
    tp.leave_forward(partial, y, local_n);
  };
  // attention (x is not read after it: out may be x)
  rmsnorm_forward(tp.local_part(la.ln1, local_n), la.ln1_rstd, x, p.ln1_w, nr, C, s.eps);
  tp.enter_forward(la.ln1, local_n);
  gemm(false, true, n, C3, C, 1.0f, la.ln1, C, p.qkv_w, C, 0.0f, la.qkv, C3);
  // q and k heads, at the positions of the rows (cp 1: one call over every sequence)
  s.slice.for_each_run(s.b, s.t, 0, [&](std::int64_t row, int seqs, int rows, int pos0) {
    rope_forward(la.qkv + row * C3, seqs, rows, C3, s.nh + kv / att.hs, att.hs, pos0, s.theta);
  });
  OwnAttention own(*this);
  BlockAttention& attention = s.attention ? *s.attention : own;
  attention.forward(la.atty, la.lse, la.qkv, la.qkv + k0, la.qkv + k0 + kv, att, false);
  row_parallel(la.res2, la.atty, p.o_w, Ca);
  add(la.res2, la.res2, x, local_n);
  // MLP
  rmsnorm_forward(tp.local_part(la.ln2, local_n), la.ln2_rstd, la.res2, p.ln2_w, nr, C, s.eps);
  tp.enter_forward(la.ln2, local_n);
  gemm(false, true, n, 2 * F, C, 1.0f, la.ln2, C, p.gateup_w, C, 0.0f, la.fch, 2 * F);
  swiglu_forward(la.fch_gelu, la.fch, n, F);
  row_parallel(out, la.fch_gelu, p.down_w, F);
  add(out, out, la.res2, local_n);
}

void Ops::llama_block_backward(const LlamaBlockShape& s, const LlamaBlockParams& p,
                               const LlamaBlockParams& g, const float* x, float* dres,
                               const LlamaBlockStash& la, const Gpt2BlockScratch& scratch,
                               const BlockWStash* w) {
  TRIDENT_CHECK(!la.bf16, "llama_block_backward: ", name(), " keeps no bf16 stash");
  BlockCollectives& tp = collectives_of(s.tp);
  const int n = s.b * s.t, C = s.c, Ca = s.ca ? s.ca : C, F = s.f, nr = s.nr ? s.nr : n;
  const AttentionShape att = attention_shape_llama(s);
  const int C3 = int(att.ld_q), kv = (C3 - Ca) / 2;
  const std::int64_t k0 = Ca + std::int64_t(s.kv_head0) * att.hs;
  const std::int64_t local_n = std::int64_t(nr) * C;
  // y = x @ W^T: dx = dy @ W, and dW += dy^T x now (no keep) or, for [gate up] and [q k v]
  // under a W stash (the zero-bubble B), in the weight pass (keep holds dy).
  auto linear = [&](float* dx, float* dw, const float* dy, const float* in_x, const float* wt,
                    int in, int out, float* keep) {
    gemm(false, false, n, in, out, 1.0f, dy, out, wt, in, 0.0f, dx, in);
    if (keep)
      copy(keep, dy, std::int64_t(n) * out);
    else
      gemm(true, false, out, in, n, 1.0f, dy, out, in_x, in, 1.0f, dw, in);
  };
  // MLP: out = res2 + down(swiglu([gate up](rmsnorm(res2))))   (dres: the local rows)
  const float* dout = tp.leave_backward(dres, local_n);
  linear(scratch.dact, g.down_w, dout, la.fch_gelu, p.down_w, F, C, nullptr);
  swiglu_backward(scratch.dfch, la.fch, scratch.dact, n, F);
  // la.fch is read for the last time above: w->dfch may be it.
  linear(scratch.dbuf, g.gateup_w, scratch.dfch, la.ln2, p.gateup_w, C, 2 * F,
         w ? w->dfch : nullptr);
  rmsnorm_backward(dres, g.ln2_w, tp.enter_backward(scratch.dbuf, local_n), la.res2, p.ln2_w,
                   la.ln2_rstd, nr, C);
  // Attention: res2 = x + o(attention(rope([q k v](rmsnorm(x)))))
  const float* dres2 = tp.leave_backward(dres, local_n);
  float* datty = scratch.dbuf;  // [N, Ca], free again once attention_backward has read it
  linear(datty, g.o_w, dres2, la.atty, p.o_w, Ca, C, nullptr);
  float* dqkv = scratch.dqkv;
  // Replicated kv heads: attention writes the gradients of the one its heads read.
  if (std::int64_t(s.nkv) * att.hs != kv) fill(dqkv, 0.0f, std::int64_t(n) * C3);
  OwnAttention own(*this);
  BlockAttention& attention = s.attention ? *s.attention : own;
  attention.backward(dqkv, dqkv + k0, dqkv + k0 + kv, datty, la.atty, la.lse, la.qkv,
                     la.qkv + k0, la.qkv + k0 + kv, att, false);
  s.slice.for_each_run(s.b, s.t, 0, [&](std::int64_t row, int seqs, int rows, int pos0) {
    rope_backward(dqkv + row * C3, seqs, rows, C3, s.nh + kv / att.hs, att.hs, pos0, s.theta);
  });
  // la.qkv is read for the last time above: w->dqkv may be it.
  linear(scratch.dbuf, g.qkv_w, dqkv, la.ln1, p.qkv_w, C, C3, w ? w->dqkv : nullptr);
  rmsnorm_backward(dres, g.ln1_w, tp.enter_backward(scratch.dbuf, local_n), x, p.ln1_w,
                   la.ln1_rstd, nr, C);
}

void Ops::llama_block_backward_weights(const LlamaBlockShape& s, const LlamaBlockParams&,
                                       const LlamaBlockParams& g, const LlamaBlockStash& la,
                                       const BlockWStash& w) {
  TRIDENT_CHECK(!la.bf16, "llama_block_backward_weights: ", name(), " keeps no bf16 stash");
  const int n = s.b * s.t, C = s.c, F = s.f;
  const int C3 = int(attention_shape_llama(s).ld_q);
  auto weight = [&](float* dw, const float* dy, const float* in_x, int in, int out) {
    gemm(true, false, out, in, n, 1.0f, dy, out, in_x, in, 1.0f, dw, in);
  };
  weight(g.gateup_w, w.dfch, la.ln2, C, 2 * F);
  weight(g.qkv_w, w.dqkv, la.ln1, C, C3);
}

void Ops::llama_block_recompute(const LlamaBlockShape& s, const LlamaBlockStash& la) {
  TRIDENT_CHECK(!la.bf16, "llama_block_recompute: ", name(), " keeps no bf16 stash");
  const int n = s.b * s.t, Ca = s.ca ? s.ca : s.c;
  const AttentionShape att = attention_shape_llama(s);
  const int kv = (int(att.ld_q) - Ca) / 2;
  const std::int64_t k0 = Ca + std::int64_t(s.kv_head0) * att.hs;
  OwnAttention own(*this);
  BlockAttention& attention = s.attention ? *s.attention : own;
  attention.forward(la.atty, la.lse, la.qkv, la.qkv + k0, la.qkv + k0 + kv, att, false);
  swiglu_forward(la.fch_gelu, la.fch, n, s.f);
}

}  // namespace trident::ops
