// trident/model/gpt2_block.hpp — GPT-2's transformer block (model.arch = "gpt2"):
//   res2 = x + c_proj(attention(c_attn(ln_1(x))))
//   out  = res2 + c_proj(gelu(c_fc(ln_2(res2))))
// LayerNorms, linears with biases (w [in, out]), multi-head attention; positions are the
// embedding's (learned wpe), not the block's.
// defines: trident::model::Gpt2Block
#pragma once

#include "trident/model/block.hpp"

namespace trident::model {

class Gpt2Block final : public Block {
 public:
  explicit Gpt2Block(const BlockContext& ctx) : Block(ctx) {
    make_ring(ops::attention_shape_qkv(B_, T_, Ca_, NH_));
  }
  static void size(const ModelConfig& cfg, int tp, ChunkDims& dims);

  void forward(const BlockParams& p, const float* x, float* out, LayerActivations& la, int b,
               int t) override;
  void backward(const BlockParams& p, const BlockParams& g, const float* x, float* dres,
                LayerActivations& la, LayerGradStash* stash) override;
  void backward_weights(const BlockParams& p, const BlockParams& g, const LayerActivations& la,
                        const LayerGradStash& stash) override;
  void recompute(LayerActivations& la) override;
  void decode(const BlockParams& p, float* x, const KvCache& cache) override;
  void norm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                    const float* b, int rows) override;
  void norm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, const float* mean, const float* rstd, int rows) override;

 private:
  // The coarse ops' shape: any TP and SP (collectives), CP through the ring / Ulysses
  // (cp_attention()).
  ops::Ops::Gpt2BlockShape block_shape(int b, int t) {
    return {b,   t, C_, NH_, F_, Ca_, tp_rank_, int(tpm_.local_rows(std::int64_t(b) * t)),
            ctx_.tp_size > 1 ? &collectives_ : nullptr, cp_attention()};
  }
  // Row-parallel linear over n full rows: y[local rows] = leave(x @ w + bias on TP rank 0).
  void row_parallel(float* y, const float* x, const float* w, const float* bias, int n, int in);
};

}  // namespace trident::model
