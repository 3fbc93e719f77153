// Llama's transformer block (see trident/model/llama_block.hpp): forward, backward
// (mirroring the forward in reverse), the weight pass of a split backward and the
// key-value-cache step, over the same activations, stash and TP layers as GPT-2's block.
//
// Legend as block.hpp: Ca = C/tp this rank's query columns (NH heads of hd), C3 = Ca + 2*kv
// (q | k | v columns), F = ffn_hidden/tp, F1 = 2F (gate | up). Weights are [out, in] (Hugging
// Face's orientation): y = x @ W^T is gemm(false, true), dx = dy @ W gemm(false, false),
// dW += dy^T x gemm(true, false).
//
// TP: [q k v] and [gate up] are column-parallel (enter), o and down row-parallel (leave), as
// GPT-2's c_attn/c_fc and c_proj. The kv heads are split over TP when n_kv_head >= tp; else
// every rank holds all of them, computes them all (one product with its q rows) and its
// query heads read one: the k/v weights' gradients are then partial on each rank (only its
// query heads' share) and GptChunk::reduce_param_grads sums them over TP once per step.
//
// Training's forward, backward (with a W stash: the split backward's B), weight pass (its
// W) and selective recompute are the coarse ops Ops::llama_block_forward / backward /
// backward_weights / recompute at any TP, with or without SP, the TP mappings passed as their
// collectives, and under context parallelism (the ring or Ulysses as the shape's attention,
// Block::CpAttention; RoPE at the positions of the shape's slice): their default
// (ops/fused_block.cpp) is THE block's sequence, which a backend may fuse (CUDA under bf16:
// bf16 activations inside, la.bf16). The composition here stays only for decode (the
// key-value cache); it must stay the op's sequence.
#include "trident/model/llama_block.hpp"

#include "trident/core/error.hpp"
#include "trident/model/gpt.hpp"

namespace trident::model {

void LlamaBlock::size(const ModelConfig& cfg, int tp, ChunkDims& d) {
  // [q | k | v] columns of this rank: its query heads, then its kv heads (split over TP),
  // or every kv head (n_kv_head < tp: replicated).
  const int kv = cfg.kv_heads();
  d.kv_cols = std::int64_t(kv >= tp ? kv / tp : kv) * cfg.head_dim();
  d.C3 = d.Ca + 2 * d.kv_cols;
  d.F1 = 2 * d.F;  // gate | up
}

LlamaBlock::LlamaBlock(const BlockContext& ctx) : Block(ctx), hd_(ctx.cfg.head_dim()) {
  // Its query heads read one kv head each: its own (split over TP), or one of all of them
  // (n_kv_head < tp: replicated), the first at kv_head0_.
  const int kv = cfg_.kv_heads();
  const bool kv_split = kv >= ctx.tp_size;
  kv_cols_ = int(d_.kv_cols);
  kv_heads_ = rank_kv_heads(cfg_, ctx.tp_size);
  kv_head0_ = kv_split ? 0 : ctx.tp_rank * NH_ / (cfg_.n_head / kv);  // its first query head's
  make_ring(attention_shape(B_, T_));
}

void LlamaBlock::check_layer(const std::function<const ShardSpec*(Role)>& spec) const {
  const ShardSpec &q = *spec(Role::qkv_weight), &k = *spec(Role::k_weight),
                  &v = *spec(Role::v_weight), &gate = *spec(Role::fc_weight),
                  &up = *spec(Role::up_weight);
  TRIDENT_CHECK(k.offset == q.offset + q.local_numel() && v.offset == k.offset + k.local_numel() &&
                    up.offset == gate.offset + gate.local_numel(),
                "internal: Llama's q, k, v (gate, up) shards are not adjacent");
}

ops::Ops::AttentionShape LlamaBlock::attention_shape(int b, int t) const {
  ops::Ops::AttentionShape s;
  s.b = b;
  s.t = t;
  s.nh = NH_;
  s.nkv = kv_heads_;
  s.hs = hd_;
  s.ld_q = s.ld_k = s.ld_v = C3_;
  s.ld_o = Ca_;
  return s;
}

void LlamaBlock::row_parallel(float* y, const float* x, const float* w, int n, int in) {
  float* partial = partial_of(y);
  ops_.gemm(false, true, n, C_, in, 1.0f, x, in, w, in, 0.0f, partial, C_);
  leave(partial, y, n, C_);
}

ops::Ops::LlamaBlockShape LlamaBlock::block_shape(int b, int t) {
  ops::Ops::LlamaBlockShape s;
  s.b = b;
  s.t = t;
  s.c = C_;
  s.nh = NH_;
  s.nkv = kv_heads_;
  s.f = F_;
  s.eps = float(cfg_.norm_eps);
  s.theta = float(cfg_.rope_theta);
  s.ca = Ca_;
  s.kv_cols = kv_cols_;
  s.kv_head0 = kv_head0_;
  s.tp_rank = tp_rank_;
  s.nr = int(tpm_.local_rows(std::int64_t(b) * t));
  s.tp = ctx_.tp_size > 1 ? &collectives_ : nullptr;
  s.attention = cp_attention();
  s.slice = slice_;
  return s;
}

namespace {
ops::Ops::LlamaBlockParams coarse(const BlockParams& p) {
  return {p.ln1_w, p.qkv_w, p.attproj_w, p.ln2_w, p.fc_w, p.fcproj_w};
}
ops::Ops::LlamaBlockStash coarse(const LayerActivations& la) {
  return {la.ln1,      la.ln1_rstd, la.qkv, la.atty,      la.lse, la.res2,
          la.ln2,      la.ln2_rstd, la.fch, la.fch_gelu, la.bf16};
}
ops::Ops::BlockWStash coarse(const LayerGradStash& st) { return {st.dfch, st.dqkv}; }
}  // namespace

void LlamaBlock::forward(const BlockParams& p, const float* x, float* out, LayerActivations& la,
                         int b, int t) {
  ops_.llama_block_forward(block_shape(b, t), coarse(p), x, out, coarse(la));
}

// One token (b = t = 1) at cache.pos whose keys and values join the cache (one rank, TP 1).
void LlamaBlock::decode(const BlockParams& p, float* x, const KvCache& cache) {
  LayerActivations la = decode_views();
  const int n = 1;
  const int nr = int(tpm_.local_rows(n));
  const std::int64_t local_n = std::int64_t(nr) * C_;
  const float eps = float(cfg_.norm_eps), theta = float(cfg_.rope_theta);
  // attention: res2 = x + o(attention(rope([q k v](rmsnorm(x)))))
  ops_.rmsnorm_forward(tpm_.local_part(la.ln1, local_n), la.ln1_rstd, x, p.ln1_w, nr, C_, eps);
  tpm_.enter_forward(la.ln1, local_n);
  ops_.gemm(false, true, n, C3_, C_, 1.0f, la.ln1, C_, p.qkv_w, C_, 0.0f, la.qkv, C3_);
  // q and k heads, at the token's position
  ops_.rope_forward(la.qkv, 1, 1, C3_, NH_ + kv_cols_ / hd_, hd_, cache.pos, theta);
  attend_cached(la, cache, kv_heads_, Ca_ + std::int64_t(kv_head0_) * hd_);
  row_parallel(la.res2, la.atty, p.attproj_w, n, Ca_);
  ops_.add(la.res2, la.res2, x, local_n);
  // MLP: out = res2 + down(swiglu([gate up](rmsnorm(res2))))
  ops_.rmsnorm_forward(tpm_.local_part(la.ln2, local_n), la.ln2_rstd, la.res2, p.ln2_w, nr, C_,
                       eps);
  tpm_.enter_forward(la.ln2, local_n);
  ops_.gemm(false, true, n, F1_, C_, 1.0f, la.ln2, C_, p.fc_w, C_, 0.0f, la.fch, F1_);
  ops_.swiglu_forward(la.fch_gelu, la.fch, n, F_);
  row_parallel(x, la.fch_gelu, p.fcproj_w, n, F_);
  ops_.add(x, x, la.res2, local_n);
}

// From the kept qkv, already rotated, and [gate up] output.
void LlamaBlock::recompute(LayerActivations& la) {
  ops_.llama_block_recompute(block_shape(B_, T_), coarse(la));
}

void LlamaBlock::backward(const BlockParams& p, const BlockParams& g, const float* x, float* dres,
                          LayerActivations& la, LayerGradStash* stash) {
  const ops::Ops::BlockWStash w = stash ? coarse(*stash) : ops::Ops::BlockWStash{};
  ops_.llama_block_backward(block_shape(B_, T_), coarse(p), coarse(g), x, dres, coarse(la),
                            {ctx_.dbuf, ctx_.dqkv, ctx_.dfch, ctx_.dact}, stash ? &w : nullptr);
}

// The weight gradients backward left to the weight pass, from the output gradients it
// stashed.
void LlamaBlock::backward_weights(const BlockParams& p, const BlockParams& g,
                                  const LayerActivations& la, const LayerGradStash& st) {
  ops_.llama_block_backward_weights(block_shape(B_, T_), coarse(p), coarse(g), coarse(la),
                                    coarse(st));
}

void LlamaBlock::norm_forward(float* y, float*, float* rstd, const float* x, const float* w,
                              const float*, int rows) {
  ops_.rmsnorm_forward(y, rstd, x, w, rows, C_, float(cfg_.norm_eps));
}

void LlamaBlock::norm_backward(float* dx, float* dw, float*, const float* dy, const float* x,
                               const float* w, const float*, const float* rstd, int rows) {
  ops_.rmsnorm_backward(dx, dw, dy, x, w, rstd, rows, C_);
}

}  // namespace trident::model
