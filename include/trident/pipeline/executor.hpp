// trident/pipeline/executor.hpp — runs one rank's Actions of a Schedule on its model
// chunk. It only dispatches and checks invariants; schedules decide the order.
// (Point-to-point exchange between stages arrives with the pipeline issue; today the
// executor drives a single stage.)
// defines: trident::pipeline::MicrobatchTokens, Executor
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "trident/model/gpt.hpp"
#include "trident/pipeline/schedule.hpp"

namespace trident::pipeline {

struct MicrobatchTokens {
  const std::int32_t* inputs;   // [B,T]
  const std::int32_t* targets;  // [B,T]
};

class Executor {
 public:
  // Activation slots: as many as the schedule ever holds at once on this stage.
  Executor(model::GptChunk& chunk, Schedule schedule, int stage);

  // One optimizer step's forwards and backwards; returns the sum of token losses on the
  // last stage (0 elsewhere). Gradients accumulate into the chunk.
  double run(const std::function<MicrobatchTokens(int mb)>& tokens, float loss_scale);

  // Forwards only (evaluation): the loss sum of every microbatch, no gradients.
  double forward_only(const std::function<MicrobatchTokens(int mb)>& tokens, int microbatches);

  const Schedule& schedule() const { return schedule_; }
  int activation_slots() const { return int(pool_.size()); }

 private:
  model::GptChunk& chunk_;
  Schedule schedule_;
  int stage_;
  std::vector<std::unique_ptr<model::ChunkActivations>> pool_;
};

}  // namespace trident::pipeline
