// trident/train/run_parts.hpp — the objects run_training (train/run.hpp) is made of, one job
// each: the metrics log (metrics.h5 rows with the step's traffic), the evaluator, the
// progress line, the stop policy (non-finite steps, stop signals) and the DP overlap report.
// defines: trident::train::MetricsLog, Evaluator, ProgressLine, StopPolicy,
//          DpOverlapReport
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trident/io/metrics.hpp"
#include "trident/train/checkpointer.hpp"
#include "trident/train/data_loader.hpp"
#include "trident/train/signals.hpp"
#include "trident/train/trainer.hpp"

namespace trident::train {

// Rank 0's metrics.h5 (other ranks hold none and do nothing), with the traffic of each
// communicator per step (every collective is counted in parallel/).
class MetricsLog {
 public:
  // resume_step < 0: a new file; otherwise the rows after resume_step are dropped.
  MetricsLog(Trainer& trainer, std::int64_t resume_step);
  void begin_step();  // zeroes the communicators' counters
  // The data side of a step: passes over the data so far, tokens consumed, and the seconds
  // the step spent reading its batch.
  struct DataProgress {
    double epoch = 0, consumed_tokens = 0, data_s = 0;
  };
  void record(std::int64_t step, const StepStats& st, double step_s, double tokens_per_s,
              const DataProgress& data);
  void record_eval(std::int64_t step, double loss);
  void close();

 private:
  Trainer& trainer_;
  std::vector<parallel::Comm*> counted_;
  // parallel.tp_mode = "2d": the grid's row and column communicators, counted as comm/tp.
  std::vector<parallel::Comm*> tp_parts_;
  std::optional<io::MetricsWriter> writer_;
};

// The validation loss (data.valid) every train.eval_every steps and after the last one.
class Evaluator {
 public:
  // valid: none when the deck names no validation set. inputs/targets: the local batch's
  // buffers, shared with the training steps.
  Evaluator(Trainer& trainer, std::optional<DataLoader> valid, IntBuffer& inputs,
            IntBuffer& targets);
  bool due(std::int64_t step) const;
  double run(std::int64_t step);  // logs "eval step ..." and returns the mean loss

 private:
  Trainer& tr_;
  std::optional<DataLoader> valid_;
  IntBuffer& inputs_;
  IntBuffer& targets_;
};

// "step 12/100 | loss ... | ETA 1m05s", from the mean time of the steps so far.
class ProgressLine {
 public:
  explicit ProgressLine(std::int64_t steps) : steps_(steps) {}
  void print(std::int64_t step, const StepStats& st, double tokens_per_s, double step_s);

 private:
  std::int64_t steps_;
  double elapsed_ = 0;
  std::int64_t timed_ = 0;
};

// When a run stops early: a non-finite step (skipped, or the run stops with the checkpoint
// of the step before) and SIGUSR1/SIGTERM (signals.hpp: every rank checkpoints the same
// step and returns). Installs the signal handlers for its lifetime.
class StopPolicy {
 public:
  explicit StopPolicy(const Config& cfg);
  // A step whose loss or norm is not finite (the same verdict on every rank): returns to
  // go on (skip), or saves step - 1 and throws AgreedError (abort).
  void on_non_finite(std::int64_t step, const StepStats& st, Checkpointer& checkpoints,
                     MetricsLog& metrics) const;
  // Collective over the world: the signal any rank has received (0: none; never after the
  // last step).
  int signal_after(std::int64_t step, parallel::Comm& world) const;

 private:
  StopSignals signals_;
  NonFinite non_finite_;
  std::int64_t steps_;
};

// How much of the DP gradient reduction the backward hid (logged after the run).
class DpOverlapReport {
 public:
  explicit DpOverlapReport(GradSync& sync) : sync_(sync) {}
  void record_step() { waits_.push_back(sync_.last_wait_s()); }
  void print();

 private:
  GradSync& sync_;
  std::vector<double> waits_;  // seconds each step waited for its DP buckets
};

}  // namespace trident::train
