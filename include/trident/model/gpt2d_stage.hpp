// trident/model/gpt2d_stage.hpp — parallel.tp_mode = "2d" as a StageModel: the q x q grid's
// row and column communicators and the 2D GPT-2 (model::Gpt2d, docs/tp2d.md) of one pipeline
// stage, behind the interface the executor, GradSync, AdamW and the checkpoints bind to.
// One chunk per rank, fp32, no recompute, no split backward, no inference (the deck refuses
// those); no grad-ready reports (GradSync's end-of-step flush reduces every bucket).
// defines: trident::model::Gpt2dStageActivations, Gpt2dStage
#pragma once

#include <memory>
#include <vector>

#include "trident/model/gpt2d.hpp"
#include "trident/model/stage_model.hpp"
#include "trident/parallel/tp_grid2d.hpp"

namespace trident::model {

// The executor's [B*T/q, C/q] boundary blocks, copied into and out of the 2D model's own.
struct Gpt2dStageActivations final : StageActivations {
  FloatBuffer input, doutput, dinput;
  std::unique_ptr<Gpt2dActivations> model;
  const float* output = nullptr;  // the 2D model's stage output (in `model`)

  float* forward_input() override { return input.data(); }
  const float* forward_output() override { return output; }
  float* backward_input() override { return doutput.data(); }
  const float* backward_output() override { return dinput.data(); }
};

class Gpt2dStage final : public StageModel {
 public:
  // stage: this rank's one chunk; ps.tp (size q*q) is split into the grid's communicators.
  Gpt2dStage(const ModelConfig& cfg, const StageLayout& stage, parallel::ParallelState& ps,
             ops::Ops& ops, int micro_batch);

  const ModelConfig& config() const override { return cfg_; }
  int num_chunks() const override { return 1; }
  const StageLayout& chunk(int c) const override;
  const std::vector<ShardSpec>& specs() const override { return model_->specs(); }
  using StageModel::params;
  using StageModel::grads;
  float* params() override { return model_->params(); }
  float* grads() override { return model_->grads(); }
  std::int64_t boundary_numel() const override { return model_->boundary_numel(); }
  void init_weights(std::uint64_t seed) override { model_->init_weights(seed); }
  void zero_grads() override { model_->zero_grads(); }
  std::unique_ptr<StageActivations> make_activations(int chunk = -1,
                                                     bool split_backward = false) const override;
  double forward(int chunk, StageActivations& a, const std::int32_t* inputs,
                 const std::int32_t* targets, float loss_scale, bool with_backward = true) override;
  void backward(int chunk, StageActivations& a, const std::int32_t* inputs,
                bool weight_grads = true) override;
  void backward_weights(int chunk, StageActivations& a) override;
  // The vectors', wte's and wpe's gradients summed along the grid column.
  void reduce_param_grads() override { model_->reduce_param_grads(); }
  void set_grad_ready_hook(GradReadyHook) override {}  // never reports
  std::vector<parallel::Comm*> tensor_parallel_parts() const override;

  Gpt2d& model() { return *model_; }
  parallel::Tp2dGrid& grid() const { return *grid_; }

 private:
  ModelConfig cfg_;
  StageLayout stage_;
  std::unique_ptr<parallel::Tp2dGrid> grid_;  // before model_, which keeps a reference
  std::unique_ptr<Gpt2d> model_;
};

}  // namespace trident::model
