// GPT-2's transformer block (see trident/model/gpt2_block.hpp). The backward mirrors the
// forward line by line in reverse order.
//
// TP: c_attn and c_fc are column-parallel (enter), the c_projs row-parallel (leave), their
// biases added once (TP rank 0, before the reduction).
//
// Training's forward, backward (with a W stash: the split backward's B), weight pass (its
// W) and selective recompute are the coarse ops Ops::gpt2_block_forward / backward /
// backward_weights / recompute at any TP, with
// or without SP (coarse_op(): no context parallelism): their default (ops/fused_block.cpp) is
// THE block's sequence, the TP mappings passed as its collectives (Block::TpCollectives), and
// a backend may fuse it (CUDA under bf16: bf16 activations inside, la.bf16). The composition
// below stays only for what the op does not take: the key-value-cache step (decode) and
// context parallelism (ring / Ulysses attention); it must stay the op's sequence.
#include "trident/model/gpt2_block.hpp"

#include "trident/core/error.hpp"

namespace trident::model {

void Gpt2Block::size(const ModelConfig&, int, ChunkDims& d) {
  d.kv_cols = d.Ca;
  d.C3 = 3 * d.Ca;
  d.F1 = d.F;
}

void Gpt2Block::row_parallel(float* y, const float* x, const float* w, const float* bias, int n,
                             int in) {
  // The bias joins on TP rank 0 only, so that the reduction adds it exactly once.
  float* partial = partial_of(y);
  ops_.linear_forward(partial, x, w, tp_rank_ == 0 ? bias : nullptr, n, in, C_);
  leave(partial, y, n, C_);
}

void Gpt2Block::attend(LayerActivations& la, int b, int t) {
  const ops::Ops::AttentionShape att = ops::attention_shape_qkv(b, t, Ca_, NH_);
  attention_forward(la.atty, la.lse, la.qkv, la.qkv + Ca_, la.qkv + 2 * Ca_, att);
}

namespace {
ops::Ops::Gpt2BlockParams coarse(const BlockParams& p) {
  return {p.ln1_w, p.ln1_b, p.qkv_w, p.qkv_b, p.attproj_w, p.attproj_b,
          p.ln2_w, p.ln2_b, p.fc_w,  p.fc_b,  p.fcproj_w,  p.fcproj_b};
}
ops::Ops::Gpt2BlockStash coarse(const LayerActivations& la) {
  return {la.ln1, la.ln1_mean, la.ln1_rstd, la.qkv, la.atty, la.lse, la.res2,
          la.ln2, la.ln2_mean, la.ln2_rstd, la.fch, la.fch_gelu, la.bf16, la.recomputed};
}
ops::Ops::BlockWStash coarse(const LayerGradStash& st) { return {st.dfch, st.dqkv}; }
}  // namespace

void Gpt2Block::forward(const BlockParams& p, const float* x, float* out, LayerActivations& la,
                        int b, int t) {
  if (coarse_op()) return ops_.gpt2_block_forward(block_shape(b, t), coarse(p), x, out, coarse(la));
  TRIDENT_CHECK(!la.bf16, "internal: a bf16 block stash outside the coarse block op");
  run(p, x, out, la, b, t, nullptr);
}

void Gpt2Block::decode(const BlockParams& p, float* x, const KvCache& cache) {
  LayerActivations la = decode_views();
  run(p, x, x, la, 1, 1, &cache);
}

void Gpt2Block::run(const BlockParams& p, const float* x, float* out, LayerActivations& la, int b,
                    int t, const KvCache* cache) {
  const int n = b * t;
  const int nr = int(tpm_.local_rows(n));  // residual-stream rows here
  const std::int64_t local_n = std::int64_t(nr) * C_;
  // attention (x is not read after it: out may be x)
  float* ln1 = tpm_.local_part(la.ln1, local_n);
  ops_.layernorm_forward(ln1, la.ln1_mean, la.ln1_rstd, x, p.ln1_w, p.ln1_b, nr, C_);
  tpm_.enter_forward(la.ln1, local_n);
  ops_.linear_forward(la.qkv, la.ln1, p.qkv_w, p.qkv_b, n, C_, C3_);
  if (cache)
    attend_cached(la, *cache, NH_, Ca_);
  else
    attend(la, b, t);
  row_parallel(la.res2, la.atty, p.attproj_w, p.attproj_b, n, Ca_);
  ops_.add(la.res2, la.res2, x, local_n);
  // MLP
  float* ln2 = tpm_.local_part(la.ln2, local_n);
  ops_.layernorm_forward(ln2, la.ln2_mean, la.ln2_rstd, la.res2, p.ln2_w, p.ln2_b, nr, C_);
  tpm_.enter_forward(la.ln2, local_n);
  ops_.linear_forward(la.fch, la.ln2, p.fc_w, p.fc_b, n, C_, F_);
  ops_.gelu_forward(la.fch_gelu, la.fch, std::int64_t(n) * F_);
  row_parallel(out, la.fch_gelu, p.fcproj_w, p.fcproj_b, n, F_);
  ops_.add(out, out, la.res2, local_n);
}

void Gpt2Block::recompute(LayerActivations& la) {
  if (coarse_op()) return ops_.gpt2_block_recompute(block_shape(B_, T_), coarse(la));
  TRIDENT_CHECK(!la.bf16, "internal: a bf16 block stash outside the coarse block op");
  attend(la, B_, T_);
  ops_.gelu_forward(la.fch_gelu, la.fch, std::int64_t(B_) * T_ * F_);
}

void Gpt2Block::backward(const BlockParams& p, const BlockParams& g, const float* x, float* dres,
                         LayerActivations& la, LayerGradStash* stash) {
  if (coarse_op()) {
    const ops::Ops::BlockWStash w = stash ? coarse(*stash) : ops::Ops::BlockWStash{};
    return ops_.gpt2_block_backward(block_shape(B_, T_), coarse(p), coarse(g), x, dres,
                                    coarse(la), {ctx_.dbuf, ctx_.dqkv, ctx_.dfch, ctx_.dact},
                                    stash ? &w : nullptr);
  }
  TRIDENT_CHECK(!la.bf16, "internal: a bf16 block stash outside the coarse block op");
  const int n = B_ * T_;
  const std::int64_t local_n = std::int64_t(Nr_) * C_;
  float* dbuf = ctx_.dbuf;      // [N,C] partial input gradients of column-parallel layers
  float* dfull = ctx_.full;     // SP: the gathered [N,C] residual gradient
  float* dlocal = ctx_.local;   // SP: [Nr,C] reduce-scattered LayerNorm gradient
  // c_fc and c_attn: ops' fused backward (input and parameter gradients) without a stash;
  // with one (the zero-bubble B) the input gradient only, and the output gradient kept for W.
  // The c_projs and the LayerNorms always take both here: W keeps only the two largest.
  auto linear = [&](float* dx, float* dw, float* db, const float* dy, const float* in_x,
                    const float* w, int in, int out, float* keep) {
    if (!keep) return ops_.linear_backward(dx, dw, db, dy, in_x, w, n, in, out);
    ops_.gemm(false, true, n, in, out, 1.0f, dy, out, w, out, 0.0f, dx, in);
    ops_.copy(keep, dy, std::int64_t(n) * out);
  };
  // MLP: out = res2 + c_proj(gelu(c_fc(ln_2(res2))))   (dres: [Nr,C])
  const float* dout = tpm_.leave_backward(dres, dfull, local_n);
  ops_.linear_backward(ctx_.dact, g.fcproj_w, g.fcproj_b, dout, la.fch_gelu, p.fcproj_w, n, F_,
                       C_);
  ops_.gelu_backward(ctx_.dfch, la.fch, ctx_.dact, std::int64_t(n) * F_);
  // la.fch is read for the last time above: the stash may be it.
  linear(dbuf, g.fc_w, g.fc_b, ctx_.dfch, la.ln2, p.fc_w, C_, F_, stash ? stash->dfch : nullptr);
  const float* dln2 = tpm_.enter_backward(dbuf, dlocal, local_n);
  ops_.layernorm_backward(dres, g.ln2_w, g.ln2_b, dln2, la.res2, p.ln2_w, la.ln2_mean,
                          la.ln2_rstd, Nr_, C_);
  // Attention: res2 = x + c_proj(attention(c_attn(ln_1(x))))
  const float* dres2 = tpm_.leave_backward(dres, dfull, local_n);
  float* datty = dbuf;  // [N, Ca], free again once attention_backward has read it
  ops_.linear_backward(datty, g.attproj_w, g.attproj_b, dres2, la.atty, p.attproj_w, n, Ca_, C_);
  const ops::Ops::AttentionShape att = ops::attention_shape_qkv(B_, T_, Ca_, NH_);
  float* dqkv = ctx_.dqkv;
  attention_backward(dqkv, dqkv + Ca_, dqkv + 2 * Ca_, datty, la.atty, la.lse, la.qkv,
                          la.qkv + Ca_, la.qkv + 2 * Ca_, att);
  // la.qkv is read for the last time above: the stash may be it.
  linear(dbuf, g.qkv_w, g.qkv_b, dqkv, la.ln1, p.qkv_w, C_, C3_, stash ? stash->dqkv : nullptr);
  const float* dln1 = tpm_.enter_backward(dbuf, dlocal, local_n);
  ops_.layernorm_backward(dres, g.ln1_w, g.ln1_b, dln1, x, p.ln1_w, la.ln1_mean, la.ln1_rstd,
                          Nr_, C_);
}

// The weight gradients backward left to the weight pass, from the output gradients it
// stashed.
void Gpt2Block::backward_weights(const BlockParams& p, const BlockParams& g,
                                 const LayerActivations& la, const LayerGradStash& st) {
  if (coarse_op())
    return ops_.gpt2_block_backward_weights(block_shape(B_, T_), coarse(p), coarse(g),
                                            coarse(la), coarse(st));
  TRIDENT_CHECK(!la.bf16, "internal: a bf16 block stash outside the coarse block op");
  const int n = B_ * T_;
  ops_.linear_backward(nullptr, g.fc_w, g.fc_b, st.dfch, la.ln2, p.fc_w, n, C_, F_);
  ops_.linear_backward(nullptr, g.qkv_w, g.qkv_b, st.dqkv, la.ln1, p.qkv_w, n, C_, C3_);
}

void Gpt2Block::norm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                             const float* b, int rows) {
  ops_.layernorm_forward(y, mean, rstd, x, w, b, rows, C_);
}

void Gpt2Block::norm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                              const float* w, const float* mean, const float* rstd, int rows) {
  ops_.layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, rows, C_);
}

}  // namespace trident::model
