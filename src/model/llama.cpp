// The Llama block of GptChunk (see trident/model/gpt.hpp): forward, backward (mirroring the
// forward in reverse) and the weight pass of a split backward, over the same activations,
// stash and TP layers as GPT-2's block.
//
// Legend as gpt.hpp: N = B*T rows (all rows: gathered under SP), Nr residual rows here,
// Ca = C/tp this rank's query columns (NH heads of hd), C3 = Ca + 2*kv (q | k | v columns),
// F = ffn_hidden/tp, F1 = 2F (gate | up). Weights are [out, in] (Hugging Face's orientation):
// y = x @ W^T is gemm(false, true), dx = dy @ W gemm(false, false), dW += dy^T x
// gemm(true, false).
//
// TP: [q k v] and [gate up] are column-parallel (enter), o and down row-parallel (leave), as
// GPT-2's c_attn/c_fc and c_proj. The kv heads are split over TP when n_kv_head >= tp; else
// every rank holds all of them, computes them all (one product with its q rows) and its
// query heads read one: the k/v weights' gradients are then partial on each rank (only its
// query heads' share) and reduce_sequence_parallel_grads sums them over TP once per step.
#include "trident/model/gpt.hpp"

namespace trident::model {

ops::Ops::AttentionShape GptChunk::llama_attention_shape(int b, int t) const {
  ops::Ops::AttentionShape s;
  s.b = b;
  s.t = t;
  s.nh = NH_;
  s.nkv = kv_heads_;
  s.hs = cfg_.head_dim();
  s.ld_q = s.ld_k = s.ld_v = C3_;
  s.ld_o = C_ / ps_.tp.size();
  return s;
}

void GptChunk::llama_block_forward(int l, const float* x, float* out, LayerActivations& la,
                                   int b, int t) {
  const LayerParams& p = p_layers_[l];
  const int n = b * t, Ca = C_ / ps_.tp.size(), hd = cfg_.head_dim();
  const int nr = int(tpm_.local_rows(n));
  const std::int64_t local_n = std::int64_t(nr) * C_;
  const float eps = float(cfg_.norm_eps), theta = float(cfg_.rope_theta);
  // attention: res2 = x + o(attention(rope([q k v](rmsnorm(x)))))
  ops_.rmsnorm_forward(tpm_.local_part(la.ln1, local_n), la.ln1_rstd, x, p.ln1_w, nr, C_, eps);
  tpm_.enter_forward(la.ln1, local_n);
  ops_.gemm(false, true, n, C3_, C_, 1.0f, la.ln1, C_, p.qkv_w, C_, 0.0f, la.qkv, C3_);
  ops_.rope_forward(la.qkv, b, t, C3_, NH_ + kv_cols_ / hd, hd, 0, theta);  // q and k heads
  const float* k = la.qkv + Ca + std::int64_t(kv_head0_) * hd;
  ops_.attention_forward(la.atty, la.lse, la.qkv, k, k + kv_cols_, llama_attention_shape(b, t));
  row_parallel_forward(la.res2, la.atty, p.attproj_w, nullptr, n, Ca, C_);
  ops_.add(la.res2, la.res2, x, local_n);
  // MLP: out = res2 + down(swiglu([gate up](rmsnorm(res2))))
  ops_.rmsnorm_forward(tpm_.local_part(la.ln2, local_n), la.ln2_rstd, la.res2, p.ln2_w, nr, C_,
                       eps);
  tpm_.enter_forward(la.ln2, local_n);
  ops_.gemm(false, true, n, F1_, C_, 1.0f, la.ln2, C_, p.fc_w, C_, 0.0f, la.fch, F1_);
  ops_.swiglu_forward(la.fch_gelu, la.fch, n, F_);
  row_parallel_forward(out, la.fch_gelu, p.fcproj_w, nullptr, n, F_, C_);
  ops_.add(out, out, la.res2, local_n);
}

void GptChunk::llama_block_backward(int l, const float* x, float* dres, LayerActivations& la,
                                    LayerGradStash* stash) {
  const LayerParams& p = p_layers_[l];
  const LayerParams& g = g_layers_[l];
  const int n = B_ * T_, Ca = C_ / ps_.tp.size(), hd = cfg_.head_dim();
  const std::int64_t local_n = boundary_numel();
  float* dbuf = dbuf_.data();             // [N,C] partial input gradients of column-parallel layers
  float* dfull = full_scratch_.data();    // SP: the gathered [N,C] residual gradient
  float* dlocal = local_scratch_.data();  // SP: [Nr,C] reduce-scattered norm gradient
  // A linear y = x @ W^T: dx = dy @ W, and dW += dy^T x now (no stash) or in the weight pass
  // (the stash keeps dy).
  auto linear = [&](float* dx, float* dw, const float* dy, const float* in_x, const float* w,
                    int in, int out, float* keep) {
    ops_.gemm(false, false, n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
    if (keep)
      ops_.copy(keep, dy, std::int64_t(n) * out);
    else
      ops_.gemm(true, false, out, in, n, 1.0f, dy, out, in_x, in, 1.0f, dw, in);
  };
  auto rmsnorm = [&](float* dw, const float* dy, const float* in_x, const float* w,
                     const float* rstd, float* keep) {
    if (keep) {
      ops_.copy(keep, dy, local_n);
      dw = ln_discard_.data();
    }
    ops_.rmsnorm_backward(dres, dw, dy, in_x, w, rstd, Nr_, C_);
  };
  // MLP
  const float* dout = tpm_.leave_backward(dres, dfull, local_n);
  linear(dgelu_.data(), g.fcproj_w, dout, la.fch_gelu, p.fcproj_w, F_, C_,
         stash ? stash->dmlp : nullptr);
  ops_.swiglu_backward(dfch_.data(), la.fch, dgelu_.data(), n, F_);
  linear(dbuf, g.fc_w, dfch_.data(), la.ln2, p.fc_w, C_, F1_, stash ? stash->dfch : nullptr);
  rmsnorm(g.ln2_w, tpm_.enter_backward(dbuf, dlocal, local_n), la.res2, p.ln2_w, la.ln2_rstd,
          stash ? stash->dln2 : nullptr);
  // attention
  const float* dres2 = tpm_.leave_backward(dres, dfull, local_n);
  float* datty = dbuf;  // [N, Ca], free again once attention_backward has read it
  linear(datty, g.attproj_w, dres2, la.atty, p.attproj_w, Ca, C_, stash ? stash->dattn : nullptr);
  float* dqkv = dqkv_.data();
  // Replicated kv heads: attention writes the gradients of the one its heads read.
  if (kv_heads_ * hd != kv_cols_) ops_.fill(dqkv, 0.0f, std::int64_t(n) * C3_);
  const std::int64_t kv0 = Ca + std::int64_t(kv_head0_) * hd;
  ops_.attention_backward(dqkv, dqkv + kv0, dqkv + kv0 + kv_cols_, datty, la.atty, la.lse,
                          la.qkv, la.qkv + kv0, la.qkv + kv0 + kv_cols_,
                          llama_attention_shape(B_, T_));
  ops_.rope_backward(dqkv, B_, T_, C3_, NH_ + kv_cols_ / hd, hd, 0, float(cfg_.rope_theta));
  linear(dbuf, g.qkv_w, dqkv, la.ln1, p.qkv_w, C_, C3_, stash ? stash->dqkv : nullptr);
  rmsnorm(g.ln1_w, tpm_.enter_backward(dbuf, dlocal, local_n), x, p.ln1_w, la.ln1_rstd,
          stash ? stash->dln1 : nullptr);
}

// The parameter half of llama_block_backward, from the output gradients it stashed.
void GptChunk::llama_block_backward_weights(int l, const float* x, LayerActivations& la,
                                            const LayerGradStash& st) {
  const LayerParams& p = p_layers_[l];
  const LayerParams& g = g_layers_[l];
  const int n = B_ * T_, Ca = C_ / ps_.tp.size();
  float* discard = dbuf_.data();  // [Nr,C] the norms' input gradients, not needed here
  auto weight = [&](float* dw, const float* dy, const float* in_x, int in, int out) {
    ops_.gemm(true, false, out, in, n, 1.0f, dy, out, in_x, in, 1.0f, dw, in);
  };
  weight(g.fcproj_w, st.dmlp, la.fch_gelu, F_, C_);
  weight(g.fc_w, st.dfch, la.ln2, C_, F1_);
  ops_.rmsnorm_backward(discard, g.ln2_w, st.dln2, la.res2, p.ln2_w, la.ln2_rstd, Nr_, C_);
  weight(g.attproj_w, st.dattn, la.atty, Ca, C_);
  weight(g.qkv_w, st.dqkv, la.ln1, C_, C3_);
  ops_.rmsnorm_backward(discard, g.ln1_w, st.dln1, x, p.ln1_w, la.ln1_rstd, Nr_, C_);
}

}  // namespace trident::model
