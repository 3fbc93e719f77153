// trident/pipeline/executor.hpp — runs one rank's Actions of a Schedule on its model
// chunk. It only dispatches and checks invariants; schedules decide the order.
// Stages exchange activations and their gradients with non-blocking point-to-point MPI
// over the pp communicator (host buffers: the CPU backend's).
// defines: trident::pipeline::MicrobatchTokens, Executor
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <mpi.h>

#include "trident/model/gpt.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/pipeline/schedule.hpp"

namespace trident::pipeline {

struct MicrobatchTokens {
  const std::int32_t* inputs;   // [B,T]
  const std::int32_t* targets;  // [B,T]
};

class Executor {
 public:
  // Activation slots: as many as the schedule ever holds at once on this stage.
  Executor(model::GptChunk& chunk, parallel::ParallelState& ps, Schedule schedule);

  // One optimizer step's forwards and backwards; returns the sum of token losses on the
  // last stage (0 elsewhere). Gradients accumulate into the chunk.
  double run(const std::function<MicrobatchTokens(int mb)>& tokens, float loss_scale);

  // Forwards only (evaluation): the loss sum of every microbatch, no gradients.
  double forward_only(const std::function<MicrobatchTokens(int mb)>& tokens, int microbatches);

  const Schedule& schedule() const { return schedule_; }
  int activation_slots() const { return int(pool_.size()); }
  // Most microbatches whose activations the last run() held at once (counted at run time).
  int peak_live() const { return peak_live_; }

 private:
  void receive(float* data, int from_stage, int tag);
  void forward_one(int slot, const MicrobatchTokens& t, int mb, float loss_scale,
                   bool with_backward, double& loss);

  model::GptChunk& chunk_;
  parallel::ParallelState& ps_;
  Schedule schedule_;
  int stage_;
  int peak_live_ = 0;
  std::vector<std::unique_ptr<model::ChunkActivations>> pool_;
  std::vector<std::vector<MPI_Request>> pending_;  // per slot: sends still reading it
};

}  // namespace trident::pipeline
