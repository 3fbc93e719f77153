// trident/model/gpt2d.hpp — the whole GPT-2 (one pipeline stage holding every layer) on the
// q x q grid of 2D tensor parallelism: Embedding2d, a Block2d per layer, LayerNorm2d ln_f,
// the tied head and CrossEntropy2d, over one flat buffer laid out by the 2D ShardSpecs
// (gpt_param_specs(.., tp_2d = true)). The computation GptChunk is to run behind
// parallel.tp_mode = "2d" (docs/tp2d.md, "What remains"); for now the reference that the
// 2D pieces compose into the serial model's loss and gradients (parallel.summa).
// defines: trident::model::Gpt2d
//
// A microbatch of B sequences (q | B): rank (r, c) embeds, runs and scores the tokens of
// sequences [r*B/q, (r+1)*B/q) and holds column block c of every activation.
#pragma once

#include <cstdint>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/model/block2d.hpp"
#include "trident/model/embedding2d.hpp"
#include "trident/model/layernorm2d.hpp"
#include "trident/model/spec.hpp"
#include "trident/model/xent2d.hpp"

namespace trident::model {

class Gpt2d {
 public:
  // An Error unless cfg is GPT-2 and q divides micro_batch, n_head and d_model.
  Gpt2d(const ModelConfig& cfg, parallel::Tp2dGrid& grid, ops::Ops& ops, int micro_batch);

  const std::vector<ShardSpec>& specs() const { return specs_; }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  std::int64_t num_params() const { return num_params_; }

  // GptChunk::init_weights' rule (counter-based RNG by global name and logical index): the
  // same weights as every other layout.
  void init_weights(std::uint64_t seed);
  void zero_grads();

  // One microbatch forward and backward: inputs and targets [B*T] of the whole microbatch
  // (host memory; each rank reads its sequences). Gradients accumulate (+=), scaled by
  // loss_scale; returns the sum of the B*T token losses (the same on every rank).
  double forward_backward(const std::int32_t* inputs, const std::int32_t* targets,
                          float loss_scale);
  // The vectors', wte's and wpe's gradients summed along the grid column, once per step.
  void reduce_param_grads();

 private:
  float* at(float* base, Role role, int layer = -1) const;
  Block2dTensors<float> layer(float* base, int l) const;

  ModelConfig cfg_;
  parallel::Tp2dGrid& grid_;
  ops::Ops& ops_;
  int B_ = 0, T_ = 0, C_ = 0, q_ = 1, mb_ = 0, cb_ = 0;
  std::vector<ShardSpec> specs_;
  std::int64_t num_params_ = 0;
  FloatBuffer params_, grads_;
  Embedding2d emb_;
  Block2d block_;
  LayerNorm2d lnf_;
  CrossEntropy2d xent_;
  std::vector<Block2dActivations> acts_;
  FloatBuffer xs_;  // [L + 1, mb, cb] each layer's input, then the last output
  FloatBuffer lnf_out_, lnf_mean_, lnf_rstd_, logits_, loss_, dx_, dy_;
  std::vector<std::int32_t> tokens_, targets_;  // this rank's rows
};

}  // namespace trident::model
