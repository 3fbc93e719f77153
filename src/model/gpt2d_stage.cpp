// parallel.tp_mode = "2d" behind the StageModel interface (see trident/model/gpt2d_stage.hpp).
#include "trident/model/gpt2d_stage.hpp"

#include "trident/core/error.hpp"

namespace trident::model {

namespace {
Gpt2dStageActivations& own(StageActivations& a) {
  return dynamic_cast<Gpt2dStageActivations&>(a);
}
}  // namespace

Gpt2dStage::Gpt2dStage(const ModelConfig& cfg, const StageLayout& stage,
                       parallel::ParallelState& ps, ops::Ops& ops, int micro_batch)
    : StageModel(ops),
      cfg_(cfg),
      stage_(stage),
      grid_(std::make_unique<parallel::Tp2dGrid>(parallel::make_tp2d_grid(ps.tp))),
      model_(std::make_unique<Gpt2d>(cfg, stage, *grid_, ops, micro_batch)) {
  num_params_ = model_->num_params();
}

const StageLayout& Gpt2dStage::chunk(int c) const {
  TRIDENT_CHECK(c == 0, "internal: 2D tensor parallelism runs one chunk per rank, asked for ", c);
  return stage_;
}

std::unique_ptr<StageActivations> Gpt2dStage::make_activations(int, bool split_backward) const {
  TRIDENT_CHECK(!split_backward, "internal: 2D tensor parallelism has no split backward");
  auto zeroed = [this](std::int64_t n) {
    FloatBuffer b(std::size_t(n), memory());
    if (n > 0) ops().fill(b.data(), 0.0f, n);
    return b;
  };
  const std::int64_t n = boundary_numel();
  auto a = std::make_unique<Gpt2dStageActivations>();
  a->input = zeroed(n);
  a->doutput = zeroed(n);
  a->dinput = zeroed(n);
  a->model = model_->make_activations();
  a->output = model_->output(*a->model);
  return a;
}

double Gpt2dStage::forward(int chunk, StageActivations& activations, const std::int32_t* inputs,
                           const std::int32_t* targets, float loss_scale, bool with_backward) {
  Gpt2dStageActivations& a = own(activations);
  if (!this->chunk(chunk).has_embedding)
    ops().copy(model_->input(*a.model), a.input.data(), boundary_numel());
  return model_->forward(*a.model, inputs, targets, loss_scale, with_backward);
}

void Gpt2dStage::backward(int chunk, StageActivations& activations, const std::int32_t*,
                          bool weight_grads) {
  TRIDENT_CHECK(weight_grads, "internal: 2D tensor parallelism has no split backward");
  Gpt2dStageActivations& a = own(activations);
  const StageLayout& st = this->chunk(chunk);
  const std::int64_t n = boundary_numel();
  if (!st.has_head) ops().copy(a.model->doutput.data(), a.doutput.data(), n);
  model_->backward(*a.model);
  if (!st.has_embedding) ops().copy(a.dinput.data(), a.model->dinput.data(), n);
}

void Gpt2dStage::backward_weights(int, StageActivations&) {
  throw Error("internal: 2D tensor parallelism has no split backward (no W pass)");
}

std::vector<parallel::Comm*> Gpt2dStage::tensor_parallel_parts() const {
  return {&grid_->row, &grid_->col};
}

}  // namespace trident::model
