// GPT-2's transformer block (see trident/model/gpt2_block.hpp). The backward mirrors the
// forward line by line in reverse order.
//
// TP: c_attn and c_fc are column-parallel (enter), the c_projs row-parallel (leave), their
// biases added once (TP rank 0, before the reduction).
//
// Training's forward, backward (with a W stash: the split backward's B), weight pass (its
// W) and selective recompute are the coarse ops Ops::gpt2_block_forward / backward /
// backward_weights / recompute at any TP, with or without SP, and under context parallelism
// (the ring or Ulysses as the shape's attention, Block::CpAttention): their default
// (ops/fused_block.cpp) is THE block's sequence, the TP mappings passed as its collectives
// (Block::TpCollectives), and a backend may fuse it (CUDA under bf16: bf16 activations
// inside, la.bf16). The composition below stays only for what the op does not take: the
// key-value-cache step (decode); it must stay the op's sequence.
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
  ops_.gpt2_block_forward(block_shape(b, t), coarse(p), x, out, coarse(la));
}

// One token (b = t = 1) whose keys and values join the cache (one rank, TP 1).
void Gpt2Block::decode(const BlockParams& p, float* x, const KvCache& cache) {
  LayerActivations la = decode_views();
  const int n = 1;
  const int nr = int(tpm_.local_rows(n));  // residual-stream rows here
  const std::int64_t local_n = std::int64_t(nr) * C_;
  // attention (x is read by the residual add after it; out is x)
  float* ln1 = tpm_.local_part(la.ln1, local_n);
  ops_.layernorm_forward(ln1, la.ln1_mean, la.ln1_rstd, x, p.ln1_w, p.ln1_b, nr, C_);
  tpm_.enter_forward(la.ln1, local_n);
  ops_.linear_forward(la.qkv, la.ln1, p.qkv_w, p.qkv_b, n, C_, C3_);
  attend_cached(la, cache, NH_, Ca_);
  row_parallel(la.res2, la.atty, p.attproj_w, p.attproj_b, n, Ca_);
  ops_.add(la.res2, la.res2, x, local_n);
  // MLP
  float* ln2 = tpm_.local_part(la.ln2, local_n);
  ops_.layernorm_forward(ln2, la.ln2_mean, la.ln2_rstd, la.res2, p.ln2_w, p.ln2_b, nr, C_);
  tpm_.enter_forward(la.ln2, local_n);
  ops_.linear_forward(la.fch, la.ln2, p.fc_w, p.fc_b, n, C_, F_);
  ops_.gelu_forward(la.fch_gelu, la.fch, std::int64_t(n) * F_);
  row_parallel(x, la.fch_gelu, p.fcproj_w, p.fcproj_b, n, F_);
  ops_.add(x, x, la.res2, local_n);
}

void Gpt2Block::recompute(LayerActivations& la) {
  ops_.gpt2_block_recompute(block_shape(B_, T_), coarse(la));
}

void Gpt2Block::backward(const BlockParams& p, const BlockParams& g, const float* x, float* dres,
                         LayerActivations& la, LayerGradStash* stash) {
  const ops::Ops::BlockWStash w = stash ? coarse(*stash) : ops::Ops::BlockWStash{};
  ops_.gpt2_block_backward(block_shape(B_, T_), coarse(p), coarse(g), x, dres, coarse(la),
                           {ctx_.dbuf, ctx_.dqkv, ctx_.dfch, ctx_.dact}, stash ? &w : nullptr);
}

// The weight gradients backward left to the weight pass, from the output gradients it
// stashed.
void Gpt2Block::backward_weights(const BlockParams& p, const BlockParams& g,
                                 const LayerActivations& la, const LayerGradStash& st) {
  ops_.gpt2_block_backward_weights(block_shape(B_, T_), coarse(p), coarse(g), coarse(la),
                                   coarse(st));
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
