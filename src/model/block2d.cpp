// One GPT-2 block on the 2D TP grid (see trident/model/block2d.hpp).
#include "trident/model/block2d.hpp"

#include "trident/core/error.hpp"
#include "trident/model/attention2d.hpp"

namespace trident::model {

namespace {
constexpr float kLayerNormEps = 1e-5f;  // GPT-2's (ops::layernorm_forward's)
}

std::int64_t Block2dActivations::floats() const {
  std::int64_t n = 0;
  for (const FloatBuffer* b : {&ln1, &ln1_mean, &ln1_rstd, &qkv, &atty, &lse, &res2, &ln2,
                               &ln2_mean, &ln2_rstd, &fch, &fch_gelu})
    n += std::int64_t(b->size());
  return n;
}

Block2d::Block2d(ops::Ops& ops, parallel::Tp2dGrid& grid, const Block2dShape& s)
    : ops_(ops),
      grid_(grid),
      shape_(s),
      q_(grid.q),
      mb_(s.batch * s.seq / grid.q),
      cb_(s.d_model / grid.q),
      fb_(4 * s.d_model / grid.q),
      ln1_(ops, grid, s.batch * s.seq, s.d_model, kLayerNormEps),
      ln2_(ops, grid, s.batch * s.seq, s.d_model, kLayerNormEps),
      c_attn_(ops, grid, {s.batch * s.seq, s.d_model, 3 * s.d_model}),
      c_proj_(ops, grid, {s.batch * s.seq, s.d_model, s.d_model}),
      c_fc_(ops, grid, {s.batch * s.seq, s.d_model, 4 * s.d_model}),
      mlp_proj_(ops, grid, {s.batch * s.seq, 4 * s.d_model, s.d_model}),
      att_(attention2d_shape(s.batch, s.seq, s.d_model, s.n_head, grid.q)) {
  const std::size_t x = std::size_t(mb_) * std::size_t(cb_);
  d_small_ = FloatBuffer(x, ops.memory());
  d_res2_ = FloatBuffer(x, ops.memory());
  d_tmp_ = FloatBuffer(x, ops.memory());
  d_qkv_ = FloatBuffer(3 * x, ops.memory());
  d_fch_ = FloatBuffer(std::size_t(mb_) * std::size_t(fb_), ops.memory());
  d_gelu_ = FloatBuffer(std::size_t(mb_) * std::size_t(fb_), ops.memory());
}

Block2dActivations Block2d::make_activations() const {
  auto* mem = ops_.memory();
  const std::size_t x = std::size_t(mb_) * std::size_t(cb_), rows = std::size_t(mb_),
                    f = std::size_t(mb_) * std::size_t(fb_);
  const std::size_t lse = std::size_t(att_.b) * std::size_t(att_.nh) * std::size_t(att_.t);
  Block2dActivations a;
  a.ln1 = FloatBuffer(x, mem);
  a.ln1_mean = FloatBuffer(rows, mem);
  a.ln1_rstd = FloatBuffer(rows, mem);
  a.qkv = FloatBuffer(3 * x, mem);
  a.atty = FloatBuffer(x, mem);
  a.lse = FloatBuffer(lse, mem);
  a.res2 = FloatBuffer(x, mem);
  a.ln2 = FloatBuffer(x, mem);
  a.ln2_mean = FloatBuffer(rows, mem);
  a.ln2_rstd = FloatBuffer(rows, mem);
  a.fch = FloatBuffer(f, mem);
  a.fch_gelu = FloatBuffer(f, mem);
  return a;
}

void Block2d::forward(float* out, const float* x, const Block2dParams& p,
                      Block2dActivations& a) {
  const std::int64_t n = std::int64_t(mb_) * cb_;
  ln1_.forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, p.ln1_w, p.ln1_b);
  c_attn_.forward(a.qkv.data(), a.ln1.data(), p.qkv_w, p.qkv_b);
  ops_.attention_forward(a.atty.data(), a.lse.data(), a.qkv.data(), a.qkv.data() + cb_,
                         a.qkv.data() + 2 * cb_, att_);
  c_proj_.forward(a.res2.data(), a.atty.data(), p.proj_w, p.proj_b);
  ops_.add(a.res2.data(), a.res2.data(), x, n);
  ln2_.forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), p.ln2_w,
               p.ln2_b);
  c_fc_.forward(a.fch.data(), a.ln2.data(), p.fc_w, p.fc_b);
  ops_.gelu_forward(a.fch_gelu.data(), a.fch.data(), std::int64_t(mb_) * fb_);
  mlp_proj_.forward(out, a.fch_gelu.data(), p.fcproj_w, p.fcproj_b);
  ops_.add(out, out, a.res2.data(), n);
}

void Block2d::backward(float* dx, const float* dout, const float* x, const Block2dParams& p,
                       Block2dGrads& g, Block2dActivations& a) {
  const std::int64_t n = std::int64_t(mb_) * cb_, nf = std::int64_t(mb_) * fb_;
  float* dfch = d_fch_.data();
  float* dres2 = d_res2_.data();
  float* dsmall = d_small_.data();
  float* dtmp = d_tmp_.data();
  // MLP: out = res2 + c_proj(gelu(c_fc(ln2(res2))))
  float* dgelu = d_gelu_.data();
  mlp_proj_.backward(dgelu, g.fcproj_w, dout, a.fch_gelu.data(), p.fcproj_w);
  mlp_proj_.bias_backward(g.fcproj_b, dout);
  ops_.gelu_backward(dfch, a.fch.data(), dgelu, nf);
  c_fc_.backward(dsmall, g.fc_w, dfch, a.ln2.data(), p.fc_w);
  c_fc_.bias_backward(g.fc_b, dfch);
  ln2_.backward(dtmp, g.ln2_w, g.ln2_b, dsmall, a.res2.data(), a.ln2_mean.data(),
                a.ln2_rstd.data(), p.ln2_w);
  ops_.add(dres2, dout, dtmp, n);
  // Attention: res2 = x + c_proj(attention(c_attn(ln1(x))))
  c_proj_.backward(dsmall, g.proj_w, dres2, a.atty.data(), p.proj_w);
  c_proj_.bias_backward(g.proj_b, dres2);
  float* dqkv = d_qkv_.data();
  ops_.attention_backward(dqkv, dqkv + cb_, dqkv + 2 * cb_, dsmall, a.atty.data(), a.lse.data(),
                          a.qkv.data(), a.qkv.data() + cb_, a.qkv.data() + 2 * cb_, att_);
  c_attn_.backward(dsmall, g.qkv_w, dqkv, a.ln1.data(), p.qkv_w);
  c_attn_.bias_backward(g.qkv_b, dqkv);
  ln1_.backward(dtmp, g.ln1_w, g.ln1_b, dsmall, x, a.ln1_mean.data(), a.ln1_rstd.data(),
                p.ln1_w);
  ops_.add(dx, dres2, dtmp, n);
}

void Block2d::reduce_param_grads(Block2dGrads& g) {
  ln1_.reduce_param_grads(g.ln1_w, g.ln1_b);
  ln2_.reduce_param_grads(g.ln2_w, g.ln2_b);
  c_attn_.reduce_bias_grad(g.qkv_b);
  c_proj_.reduce_bias_grad(g.proj_b);
  c_fc_.reduce_bias_grad(g.fc_b);
  mlp_proj_.reduce_bias_grad(g.fcproj_b);
}

}  // namespace trident::model
