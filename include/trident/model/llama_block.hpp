// trident/model/llama_block.hpp — Llama's transformer block (model.arch = "llama"):
//   res2 = x + o(attention(rope([q k v](rmsnorm(x)))))     grouped-query attention
//   out  = res2 + down(swiglu([gate up](rmsnorm(res2))))
// RMSNorms, linears without biases with Hugging Face's [out, in] weights, rotary positions
// (no position embedding). LayerActivations' ln*_mean and BlockParams' biases are unused.
// defines: trident::model::LlamaBlock
#pragma once

#include "trident/model/block.hpp"

namespace trident::model {

class LlamaBlock final : public Block {
 public:
  explicit LlamaBlock(const BlockContext& ctx);
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
  // q, k, v (and gate, up) adjacent in the buffer: one [q; k; v] ([gate; up]) matrix.
  void check_layer(const std::function<const ShardSpec*(Role)>& spec) const override;

 private:
  // Attention's view of this rank's qkv rows (row stride C3): q at column 0, k and v at the
  // kv head its query heads read first.
  ops::Ops::AttentionShape attention_shape(int b, int t) const;
  // The coarse ops' shape: any TP and SP (collectives), CP through the ring / Ulysses
  // (cp_attention()) and the rows' positions (slice_).
  ops::Ops::LlamaBlockShape block_shape(int b, int t);
  // Row-parallel linear y = x @ W^T over n full rows (no bias), summed over TP into y.
  void row_parallel(float* y, const float* x, const float* w, int n, int in);

  const int hd_;  // head_dim
  // kv columns of this rank's qkv rows (its kv heads, or all of them when replicated over
  // TP), the kv heads its query heads read, and the first of them within those columns.
  int kv_cols_ = 0, kv_heads_ = 0, kv_head0_ = 0;
};

}  // namespace trident::model
