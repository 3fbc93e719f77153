// trident/train/trainer.hpp — one rank's share of training: the model chunk, its
// optimizer and the executor, and what one optimizer step does with a global batch.
// The step loop with its files (metrics, checkpoints) is in train/run.hpp.
// defines: trident::train::Trainer, StepStats, stage_layout, files_held_open,
//          expected_stage_costs
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trident/model/stage_model.hpp"
#include "trident/model/memory.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/pipeline/executor.hpp"
#include "trident/pipeline/simulator.hpp"
#include "trident/train/config.hpp"
#include "trident/train/grad_sync.hpp"
#include "trident/train/optimizer.hpp"

namespace trident::train {

struct StepStats {
  double loss = 0;       // mean over the global batch's target tokens
  double grad_norm = 0;  // before clipping
  double lr = 0;
  bool applied = true;   // false: the loss or the norm was not finite, weights untouched
};

// The model's placement for this rank: its chunks (parallel.vpp virtual stages, each a run
// of layers; model::chunk_layouts), in chunk order.
std::vector<model::StageLayout> stage_layout(const Config& cfg,
                                             const parallel::ParallelState& ps);

// The HDF5 files a rank of this deck holds open at its peak (model::MemoryLayout::
// open_files): the data loaders' (loader_files_held_open), metrics.h5 on the rank that
// writes it, and the checkpoint being written between two steps.
int files_held_open(const Config& cfg, bool writes_metrics);

// What the simulator charges each virtual stage of this deck's pipeline: its layers plus the
// embedding's or the head's predicted share (model::stage_end_costs), relative to the
// heaviest stage. Even splits are unequal stages too, the first and last carrying the ends.
// The start-up line's expected bubble and `trident schedule --deck` simulate with these.
// forward_slots: the heaviest stage's forward in simulator slots (B 2x; split, W
// model::weight_pass_share of a forward and B the rest); the others' are rounded to slots,
// so more slots, less rounding.
pipeline::Costs expected_stage_costs(const Config& cfg, int forward_slots = 100);

class Trainer {
 public:
  // cfg must be resolved (resolve_world) and have model.vocab_size > 0.
  Trainer(const Config& cfg, parallel::ParallelState& ps, ops::Ops& ops);
  ~Trainer();  // tells the backend the weights are gone (Ops::set_weights)
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  model::StageModel& model() { return *model_; }
  AdamW& optimizer() { return *optimizer_; }
  GradSync& grad_sync() { return *sync_; }
  const Config& config() const { return cfg_; }
  parallel::ParallelState& state() { return ps_; }

  // This rank's predicted peak memory (model::predict_memory for its layout and the training
  // schedule's peak stash), and what it measured over the steps (checkpoints and evaluation
  // excluded): on the CPU the RSS high-water mark minus the RSS before the trainer was built;
  // on a device backend the arena's high-water mark.
  const model::MemoryEstimate& memory_estimate() const { return memory_estimate_; }
  std::int64_t measured_peak_bytes() const;
  // The part of it above what was in use just before the first step built its activation
  // stash (the pipeline executor's pool): the measured counterpart of the estimate's
  // activations (plus whatever a step allocates for itself).
  std::int64_t measured_activation_bytes() const;

  // Sequences of a global batch of `global_batch` that this DP rank processes, and the
  // first of them.
  std::int64_t local_batch(std::int64_t global_batch) const;
  std::int64_t local_first(std::int64_t global_batch) const;

  // Zeroes the gradients, then runs the forwards and backwards of this rank's slice
  // inputs/targets [local_batch, T] in microbatches of parallel.micro_batch_size, and
  // averages the gradients over DP (in buckets during the backward, GradSync; under
  // ZeRO-1 each DP rank is left with its shard only). Under context parallelism every CP
  // rank is given the whole sequences and keeps its own rows (cp_local_positions), and
  // the gradients are summed over DP × CP. Returns the mean loss of the global batch (all
  // ranks).
  double forward_backward(const std::int32_t* inputs, const std::int32_t* targets,
                          std::int64_t global_batch);

  // After forward_backward: the grad norm, clipping and one AdamW step at step s's lr.
  // When the loss or the norm is not finite nothing is changed (StepStats::applied false):
  // every rank sees the same loss and norm, so every rank decides alike.
  StepStats optimizer_step(std::int64_t step, double loss);

  // After forward_backward: the DP-averaged gradients of every element in
  // model().grads() (under ZeRO-1 the shards are all-gathered over DP first).
  void gather_gradients();

  // The rank-0 start-up report: layout, schedule, parameters and optimizer-state bytes
  // per rank, the simulator's bubble fraction. Collective over the world (every rank
  // calls it); rank 0 prints.
  void report_startup();
  // The optimizer step the next forward_backward belongs to (the executor's fault
  // injection and io.trace_step); 1 until set.
  void set_step(std::int64_t step) { step_ = step; }
  // When the last forward_backward was step io.trace_step: writes its pipeline trace to
  // <out_dir>/trace/rank-<world rank>.json and returns the path; otherwise "".
  std::string write_trace() const;

  // The schedule's weight update (pipeline::WeightUpdate). Under `delayed` (PipeDream-2BW)
  // forward_backward computes with the previous weight version W(t-1) and leaves the live
  // one W(t) in model().params() for optimizer_step: W(t+1) = W(t) - lr * grad(W(t-1)).
  // The first step has no older version: W(0) = W(1). A checkpoint keeps the older version
  // (previous_weights), so a resumed run goes on as the uninterrupted one.
  pipeline::WeightUpdate weight_update() const { return update_; }
  // Under `delayed`, after a step: the version the next step computes with, W(t-1) (the
  // model's memory; null before the first step and under other schedules). A checkpoint's
  // copy is written into previous_weights_slot() and kept with keep_previous_weights().
  const float* previous_weights() const {
    return older_valid_ ? older_weights_.data() : nullptr;
  }
  float* previous_weights_slot() {
    return update_ == pipeline::WeightUpdate::delayed ? older_weights_.data() : nullptr;
  }
  void keep_previous_weights() { older_valid_ = true; }

  // Mean loss of a global batch, forwards only.
  double evaluate(const std::int32_t* inputs, const std::int32_t* targets,
                  std::int64_t global_batch);

 private:
  pipeline::Executor& executor_for(int microbatches);
  // Context parallelism: this CP rank's rows of [sequences, T] inputs and targets, in
  // cp_inputs_ / cp_targets_ ([sequences, T / cp]); the arguments themselves when cp == 1.
  std::pair<const std::int32_t*, const std::int32_t*> cp_rows(const std::int32_t* inputs,
                                                              const std::int32_t* targets,
                                                              std::int64_t sequences);
  // Tokens of one microbatch on this rank (micro_batch_size * seq_len / cp).
  std::int64_t microbatch_tokens() const;
  double reduce_loss(double local_sum, std::int64_t global_batch);
  int microbatches_for(std::int64_t global_batch) const;
  void swap_weight_versions();  // model params <-> older_weights_, through swap_buffer_
  void swap_params_with(float* other);  // model params <-> other, through swap_buffer_
  // PipeDream (WeightUpdate::per_microbatch): the executor's hooks around each action.
  void before_action(const pipeline::Action& a);
  void after_backward(const pipeline::Action& a);

  Config cfg_;
  parallel::ParallelState& ps_;
  ops::Ops& ops_;
  std::unique_ptr<model::StageModel> model_;
  std::unique_ptr<GradSync> sync_;
  std::unique_ptr<AdamW> optimizer_;
  // runtime.cuda_graphs where the backend records graphs (else nullptr); before executors_,
  // which point to it.
  std::unique_ptr<pipeline::GraphState> graphs_;
  std::map<int, std::unique_ptr<pipeline::Executor>> executors_;  // by microbatch count
  std::int64_t step_ = 1;
  const pipeline::Executor* last_executor_ = nullptr;
  std::int64_t rss_at_start_ = 0;  // resident bytes before the model was built
  std::int64_t in_use_before_stash_ = -1;  // bytes in use before the first executor
  std::int64_t step_peak_ = -1;            // high-water mark at the end of the last step
  model::MemoryEstimate memory_estimate_;
  pipeline::WeightUpdate update_ = pipeline::WeightUpdate::flush;
  FloatBuffer older_weights_, swap_buffer_;  // delayed: the other weight version
  bool older_valid_ = false;                 // false until the first step copies it
  // per_microbatch: the live version's number (updates so far), the version each microbatch
  // between its F and B computes with, the stashed older versions (version -> slot of
  // stash_, recycled) and the step's learning rate.
  std::int64_t live_version_ = 0;
  std::map<int, std::int64_t> version_of_mb_;
  std::map<std::int64_t, int> stash_of_version_;
  std::vector<FloatBuffer> stash_;
  std::vector<int> free_stash_;
  int weight_versions_ = 1;  // the simulator's count for this stage and step's schedule
  std::vector<int> cp_positions_;  // cp > 1: the global positions of this rank's rows
  std::vector<std::int32_t> cp_inputs_, cp_targets_;
  int swapped_in_ = -1;  // the stash slot swapped into the params for the running B
  double async_lr_ = 0;
};

}  // namespace trident::train
