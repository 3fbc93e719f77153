// The coarse GPT-2 block ops' default (see trident/ops/ops.hpp): the fine ops in the order
// model::Gpt2Block composes them on one rank (TP 1: its enter/leave mappings are the
// identity), so that a backend without a fused block gives the composition's results bit for
// bit. model/gpt2_block.cpp keeps its own composition for the TP / SP / context-parallel /
// cached / split-backward cases this op does not take; a change to one must be made to both.
// defines: Ops::gpt2_block_forward, Ops::gpt2_block_backward
#include "trident/core/error.hpp"
#include "trident/ops/ops.hpp"

namespace trident::ops {

void Ops::gpt2_block_forward(const Gpt2BlockShape& s, const Gpt2BlockParams& p, const float* x,
                             float* out, const Gpt2BlockStash& la) {
  TRIDENT_CHECK(!la.bf16, "gpt2_block_forward: ", name(), " keeps no bf16 stash");
  const int n = s.b * s.t, C = s.c, F = s.f;
  const std::int64_t nc = std::int64_t(n) * C;
  // attention (x is not read after it: out may be x)
  layernorm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, x, p.ln1_w, p.ln1_b, n, C);
  linear_forward(la.qkv, la.ln1, p.qkv_w, p.qkv_b, n, C, 3 * C);
  const AttentionShape att = attention_shape_qkv(s.b, s.t, C, s.nh);
  attention_forward(la.atty, la.lse, la.qkv, la.qkv + C, la.qkv + 2 * C, att);
  linear_forward(la.res2, la.atty, p.attproj_w, p.attproj_b, n, C, C);
  add(la.res2, la.res2, x, nc);
  // MLP
  layernorm_forward(la.ln2, la.ln2_mean, la.ln2_rstd, la.res2, p.ln2_w, p.ln2_b, n, C);
  linear_forward(la.fch, la.ln2, p.fc_w, p.fc_b, n, C, F);
  gelu_forward(la.fch_gelu, la.fch, std::int64_t(n) * F);
  linear_forward(out, la.fch_gelu, p.fcproj_w, p.fcproj_b, n, F, C);
  add(out, out, la.res2, nc);
}

void Ops::gpt2_block_backward(const Gpt2BlockShape& s, const Gpt2BlockParams& p,
                              const Gpt2BlockParams& g, const float* x, float* dres,
                              const Gpt2BlockStash& la, const Gpt2BlockScratch& scratch) {
  TRIDENT_CHECK(!la.bf16, "gpt2_block_backward: ", name(), " keeps no bf16 stash");
  const int n = s.b * s.t, C = s.c, F = s.f;
  // MLP: out = res2 + c_proj(gelu(c_fc(ln_2(res2))))
  linear_backward(scratch.dact, g.fcproj_w, g.fcproj_b, dres, la.fch_gelu, p.fcproj_w, n, F, C);
  gelu_backward(scratch.dfch, la.fch, scratch.dact, std::int64_t(n) * F);
  linear_backward(scratch.dbuf, g.fc_w, g.fc_b, scratch.dfch, la.ln2, p.fc_w, n, C, F);
  layernorm_backward(dres, g.ln2_w, g.ln2_b, scratch.dbuf, la.res2, p.ln2_w, la.ln2_mean,
                     la.ln2_rstd, n, C);
  // Attention: res2 = x + c_proj(attention(c_attn(ln_1(x))))
  float* datty = scratch.dbuf;  // [N, C], free again once attention_backward has read it
  linear_backward(datty, g.attproj_w, g.attproj_b, dres, la.atty, p.attproj_w, n, C, C);
  const AttentionShape att = attention_shape_qkv(s.b, s.t, C, s.nh);
  float* dqkv = scratch.dqkv;
  attention_backward(dqkv, dqkv + C, dqkv + 2 * C, datty, la.atty, la.lse, la.qkv, la.qkv + C,
                     la.qkv + 2 * C, att);
  linear_backward(scratch.dbuf, g.qkv_w, g.qkv_b, dqkv, la.ln1, p.qkv_w, n, C, 3 * C);
  layernorm_backward(dres, g.ln1_w, g.ln1_b, scratch.dbuf, x, p.ln1_w, la.ln1_mean, la.ln1_rstd,
                     n, C);
}

}  // namespace trident::ops
