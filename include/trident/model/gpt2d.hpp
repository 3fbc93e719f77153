// trident/model/gpt2d.hpp — GPT-2 on the q x q grid of 2D tensor parallelism, one pipeline
// stage (StageLayout: its layers, the embedding on the first stage, ln_f and the tied head on
// the last): Embedding2d, a Block2d per layer, LayerNorm2d ln_f, the tied head and
// CrossEntropy2d, over one flat buffer laid out by the 2D ShardSpecs
// (gpt_param_specs(.., tp_2d = true)). What training runs under parallel.tp_mode = "2d"
// (behind the StageModel interface: model::Gpt2dStage, model/gpt2d_stage.hpp); checked
// against the serial model's loss and gradients, alone and in a pipeline (parallel.summa).
// defines: trident::model::Gpt2dActivations, Gpt2d
//
// A microbatch of B sequences (q | B): rank (r, c) embeds, runs and scores the tokens of
// sequences [r*B/q, (r+1)*B/q) and holds column block c of every activation; what a stage
// sends the next (and gets back) is that [mb, cb] block, boundary_numel() floats.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/model/block2d.hpp"
#include "trident/model/embedding2d.hpp"
#include "trident/model/layernorm2d.hpp"
#include "trident/model/spec.hpp"
#include "trident/model/xent2d.hpp"

namespace trident::model {

// One microbatch through one stage, this rank's blocks.
struct Gpt2dActivations {
  FloatBuffer xs;        // [layers + 1, mb, cb] each layer's input, then the stage's output
  std::vector<Block2dActivations> layers;
  FloatBuffer lnf, lnf_mean, lnf_rstd, logits, loss;  // the head's (last stage)
  FloatBuffer doutput;   // [mb, cb] the gradient at the stage's output (set by the head or received)
  FloatBuffer dinput;    // [mb, cb] the gradient at the stage's input (what backward sends back)
  std::vector<std::int32_t> tokens;  // this rank's rows' inputs (first stage)
  double loss_sum = 0;
};

class Gpt2d {
 public:
  // An Error unless cfg is GPT-2 and q divides micro_batch, n_head and d_model.
  Gpt2d(const ModelConfig& cfg, const StageLayout& stage, parallel::Tp2dGrid& grid,
        ops::Ops& ops, int micro_batch);
  // The whole model as one stage.
  Gpt2d(const ModelConfig& cfg, parallel::Tp2dGrid& grid, ops::Ops& ops, int micro_batch);

  const std::vector<ShardSpec>& specs() const { return specs_; }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* params() const { return params_.data(); }
  const float* grads() const { return grads_.data(); }
  std::int64_t num_params() const { return num_params_; }
  std::int64_t boundary_numel() const { return std::int64_t(mb_) * cb_; }
  const StageLayout& stage() const { return stage_; }

  // GptChunk::init_weights' rule (counter-based RNG by global name and logical index): the
  // same weights as every other layout.
  void init_weights(std::uint64_t seed);
  void zero_grads();

  std::unique_ptr<Gpt2dActivations> make_activations() const;
  // One microbatch forward (GptChunk::forward's contract): the first stage embeds inputs
  // [B*T] (host memory, the whole microbatch), the others read a.xs' first block; the last
  // stage also scores targets [B*T], runs the head's backward (scaled by loss_scale) into
  // a.doutput and returns the sum of the B*T token losses (the same on every rank; 0 on
  // other stages). with_backward = false (evaluation): the loss only.
  double forward(Gpt2dActivations& a, const std::int32_t* inputs, const std::int32_t* targets,
                 float loss_scale, bool with_backward = true);
  // One microbatch backward from a.doutput: the blocks, then the embedding's gradients
  // (first stage) or a.dinput (others). Gradients accumulate (+=).
  void backward(Gpt2dActivations& a);
  float* input(Gpt2dActivations& a) const { return a.xs.data(); }
  float* output(Gpt2dActivations& a) const;
  // forward then backward of one microbatch through a single-stage model.
  double forward_backward(const std::int32_t* inputs, const std::int32_t* targets,
                          float loss_scale);
  // The vectors', wte's and wpe's gradients summed along the grid column, once per step.
  void reduce_param_grads();

 private:
  float* at(float* base, Role role, int layer = -1) const;
  Block2dTensors<float> layer(float* base, int l) const;

  ModelConfig cfg_;
  StageLayout stage_;
  parallel::Tp2dGrid& grid_;
  ops::Ops& ops_;
  int L_ = 0, q_ = 1, mb_ = 0, cb_ = 0;
  std::vector<ShardSpec> specs_;
  std::int64_t num_params_ = 0;
  FloatBuffer params_, grads_;
  Embedding2d emb_;
  Block2d block_;
  LayerNorm2d lnf_;
  CrossEntropy2d xent_;
  FloatBuffer dx_, dy_;  // backward scratch
  std::vector<std::int32_t> targets_;
  std::unique_ptr<Gpt2dActivations> single_;  // forward_backward's
};

}  // namespace trident::model
