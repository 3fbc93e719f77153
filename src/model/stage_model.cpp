// The runtime's view of a rank's model and the factory of its implementations (see
// trident/model/stage_model.hpp).
#include "trident/model/stage_model.hpp"

#include "trident/core/error.hpp"
#include "trident/model/gpt.hpp"
#include "trident/model/gpt2d_stage.hpp"

namespace trident::model {

const ShardSpec* StageModel::tied_embedding() const {
  for (const auto& s : specs())
    if (s.tied_across_stages()) return &s;
  return nullptr;
}

void StageModel::read_params(float* host) const {
  copy_to_host(memory(), host, params(), std::size_t(num_params_) * sizeof(float));
}
void StageModel::write_params(const float* host) {
  copy_to_device(memory(), params(), host, std::size_t(num_params_) * sizeof(float));
}
void StageModel::read_grads(float* host) const {
  copy_to_host(memory(), host, grads(), std::size_t(num_params_) * sizeof(float));
}

std::unique_ptr<StageModel> make_stage_model(const ModelConfig& cfg,
                                             const std::vector<StageLayout>& chunks,
                                             parallel::ParallelState& ps, ops::Ops& ops,
                                             const StageModelOptions& o) {
  switch (o.tp_mode) {
    case TpMode::one_d:
      return std::make_unique<GptChunk>(cfg, chunks, ps, ops, o.micro_batch, o.recompute,
                                        o.sequence_parallel, o.cp_mode);
    case TpMode::two_d:
      TRIDENT_CHECK(chunks.size() == 1 && o.recompute == Recompute::none && !o.sequence_parallel,
                    "internal: 2D tensor parallelism runs one chunk per rank, no recompute, no "
                    "sequence parallelism (the deck refuses the others)");
      return std::make_unique<Gpt2dStage>(cfg, chunks[0], ps, ops, o.micro_batch);
  }
  throw Error("internal: unknown parallel.tp_mode");
}

}  // namespace trident::model
