// The schedule executor (see trident/pipeline/executor.hpp).
#include "trident/pipeline/executor.hpp"

#include "trident/core/error.hpp"

namespace trident::pipeline {

Executor::Executor(model::GptChunk& chunk, Schedule schedule, int stage)
    : chunk_(chunk), schedule_(std::move(schedule)), stage_(stage) {
  TRIDENT_CHECK(schedule_.pp == 1 && schedule_.vpp == 1,
                "the executor runs a single pipeline stage in this build");
  const int slots = peak_activations(schedule_.stages.at(stage_));
  for (int i = 0; i < slots; ++i) pool_.push_back(chunk_.make_activations());
}

double Executor::run(const std::function<MicrobatchTokens(int)>& tokens, float loss_scale) {
  std::vector<int> slot_of(schedule_.microbatches, -1);
  std::vector<int> free_slots;
  for (int i = int(pool_.size()) - 1; i >= 0; --i) free_slots.push_back(i);
  double loss = 0;
  for (const Action& a : schedule_.stages[stage_]) {
    const MicrobatchTokens t = tokens(a.mb);
    switch (a.type) {
      case ActionType::F: {
        TRIDENT_CHECK(slot_of[a.mb] < 0 && !free_slots.empty(), "executor: ", a.str(),
                      " has no free activation slot or ran twice");
        slot_of[a.mb] = free_slots.back();
        free_slots.pop_back();
        loss += chunk_.forward(*pool_[slot_of[a.mb]], t.inputs, t.targets, loss_scale);
        break;
      }
      case ActionType::B: {
        TRIDENT_CHECK(slot_of[a.mb] >= 0, "executor: ", a.str(), " before its forward");
        chunk_.backward(*pool_[slot_of[a.mb]], t.inputs);
        free_slots.push_back(slot_of[a.mb]);
        slot_of[a.mb] = -1;
        break;
      }
      case ActionType::W:
        fail("executor: split weight-gradient actions (", a.str(), ") are not available yet");
    }
  }
  return loss;
}

double Executor::forward_only(const std::function<MicrobatchTokens(int)>& tokens,
                              int microbatches) {
  double loss = 0;
  for (int mb = 0; mb < microbatches; ++mb) {
    const MicrobatchTokens t = tokens(mb);
    loss += chunk_.forward(*pool_.at(0), t.inputs, t.targets, 0.0f, false);
  }
  return loss;
}

}  // namespace trident::pipeline
