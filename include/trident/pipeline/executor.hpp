// trident/pipeline/executor.hpp — runs one rank's list of a lowered Schedule (lower.hpp:
// compute actions, sends and early-posted receives) on its model chunks. It only
// dispatches and checks invariants; schedules decide the order and the lowering the
// messages (peers, tags, where each receive is posted). Virtual stages exchange
// activations and their gradients with non-blocking point-to-point MPI over the pp
// communicator (host buffers: the CPU backend's).
// defines: trident::pipeline::MicrobatchTokens, Executor
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trident/core/trace.hpp"
#include "trident/model/stage_model.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/pipeline/lower.hpp"
#include "trident/pipeline/schedule.hpp"

namespace trident::pipeline {

struct MicrobatchTokens {
  const std::int32_t* inputs;   // [B,T]
  const std::int32_t* targets;  // [B,T]
};


// Graphs (runtime.cuda_graphs): what the trainer shares with its executors. A run of an
// executor after its first records each microbatch's F and B (a B right after its F, on
// one rank: pp 1) as one graph of the backend per activation slot, captured once and
// launched for every later microbatch in that slot. Any failure (capture, or a launch whose
// memory moved) prints one line and leaves every later microbatch eager.
struct GraphState {
  bool failed = false;
  std::int64_t captures = 0, launches = 0, eager = 0;  // microbatches (F and B)
};

class Executor {
 public:
  // Activation slots: as many as the schedule ever holds at once on this stage (shared by
  // the chunks: each slot fits any of them).
  Executor(model::StageModel& chunk, parallel::ParallelState& ps, Schedule schedule);

  // The optimizer step the next run() belongs to (tracing); 1 by default.
  void set_step(std::int64_t step) { step_ = step; }
  // Record a trace of the next run() calls (trace()); off by default.
  void set_tracing(bool on) { tracing_ = on; }
  // The events of the last traced run(): one per action (its compute) and one per MPI wait,
  // in the order they happened; none overlap.
  const std::vector<TraceEvent>& trace() const { return trace_; }

  // One optimizer step's forwards and backwards; returns the sum of token losses on the
  // last stage (0 elsewhere). Gradients accumulate into the chunk.
  double run(const std::function<MicrobatchTokens(int mb)>& tokens, float loss_scale);
  // Called just before each F and B computes and after each B with its sends (asynchronous
  // schedules: the trainer's weight versions and per-microbatch updates); unset: not called.
  struct Hooks {
    std::function<void(const Action&)> before, after_backward;
  };
  void set_hooks(Hooks hooks) { hooks_ = std::move(hooks); }
  // Graphs from this executor's second run() on (nullptr: off); see GraphState.
  void set_graphs(GraphState* graphs) { graphs_ = graphs; }
  ~Executor();

  // Forwards only (evaluation): the loss sum of every microbatch, no gradients.
  double forward_only(const std::function<MicrobatchTokens(int mb)>& tokens, int microbatches);

  const Schedule& schedule() const { return lowered_.schedule; }
  const LoweredSchedule& lowered() const { return lowered_; }
  int activation_slots() const { return int(pool_.size()); }
  // Most (microbatch, chunk) activations the last run() held at once (counted at run time,
  // to hold against the simulator's peak_activations).
  int peak_live() const { return peak_live_; }
  // Actions the last run() executed, in order (to hold against the schedule).
  const std::vector<Action>& executed() const { return executed_; }

 private:
  struct Pending {  // a send in flight
    parallel::Request request;
    Action action;
    int peer;
    int buffer;  // index into send_buffers_
  };
  struct Posted {  // a receive in flight, for the compute action that consumes it
    parallel::Request request;
    Op op;
    int buffer;  // index into recv_buffers_
  };
  // A buffer of one boundary message (the backend's memory): a free one, or a new one.
  int take_buffer(std::vector<FloatBuffer>& buffers, std::vector<int>& free);
  void post_receive(const Op& op);
  // Waits for the receive `a` consumes, if one was posted for it, and moves it into `data`.
  void take_receive(const Action& a, float* data);
  void send(const Op& op, const float* data);
  // Tests the receives and sends in flight: MPI moves a message (a large one's rendezvous)
  // only inside MPI calls, so each action's end lets the transfers behind it proceed.
  void progress();
  void reap_sends();
  void wait_sends();
  void record(const Action& a, const char* cat, std::string name, double t0, int peer,
              const char* what);
  // F then B of microbatch a.mb in slot `slot`: through its graph where it can.
  double forward_backward(const Action& a, int slot, const MicrobatchTokens& t, float loss_scale);
  void graphs_failed(const std::string& why);

  model::StageModel& chunk_;
  parallel::ParallelState& ps_;
  LoweredSchedule lowered_;
  int stage_;
  int peak_live_ = 0;
  std::int64_t step_ = 1;
  bool tracing_ = false;
  std::vector<TraceEvent> trace_;
  std::vector<Action> executed_;
  Hooks hooks_;
  std::vector<std::unique_ptr<model::StageActivations>> pool_;
  GraphState* graphs_ = nullptr;
  int runs_ = 0;
  std::vector<int> graph_of_slot_;      // the backend's handle, -1: none yet
  std::vector<float> graph_scale_;      // the loss scale each graph recorded
  // The head chunk's output gradients that wait for a later B (head_gradient_waits): a row
  // each from the F to its B, as many as peak_head_gradients. Empty where every head F is
  // followed by its B or where the model keeps them itself (StageModel::shares_boundary).
  int head_chunk_ = -1;  // this rank's chunk holding the head (head_chunk_of), or -1
  std::vector<FloatBuffer> head_rows_;
  // Sends copy their message into a buffer of their own, so that an activation slot is free
  // again as soon as its action is done: waiting for a send to complete before reusing its
  // slot would make a rank wait on its peer's progress, a dependency the schedules (and
  // the simulator, which treats sends as buffered) do not have, and can deadlock.
  // Receives land in buffers of their own too (posted before their action has a slot) and
  // are moved into the slot when the action starts. Buffers are recycled as messages
  // complete. They are the backend's memory; a request stages through host memory where
  // MPI cannot take it.
  std::vector<FloatBuffer> send_buffers_, recv_buffers_;
  std::vector<int> free_send_buffers_, free_recv_buffers_;
  std::vector<Pending> sends_;
  std::vector<Posted> receives_;
};

}  // namespace trident::pipeline
