// trident/train/config.hpp — the input deck (FORMAT.md, "The input deck"): every section and
// key with its default, loading with `--set section.key=value` overrides, validation, and the
// resolved deck as TOML text (stored in every checkpoint).
// defines: trident::train::Config, load_config, parse_config, to_toml, resolve_world,
//          microbatches_per_rank, pipeline_stage_layers, memory_layout, kSchedules,
//          NonFinite, RuntimeDevice (the layout and Choice: train/layout.hpp)
//
// The deck is validated from its text alone (no files opened, no communication), so every
// rank reaches the same verdict. Every error is a trident::Error with one line that names
// the file (with line:column where the key was written) and the key, e.g.
//   deck.toml:3:1: unknown key 'model.d_modle' (did you mean 'model.d_model'?)
//   deck.toml:4:11: model.n_layer: expected an integer, got a string
//   deck.toml (--set): train.lr: must be > 0, got -1
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/model/memory.hpp"
#include "trident/model/spec.hpp"
#include "trident/ops/ops.hpp"
#include "trident/pipeline/schedule.hpp"
#include "trident/train/layout.hpp"

namespace trident::train {

// The pipeline schedules a deck may name (parallel.schedule): the registry's names.
inline const std::vector<std::string>& kSchedules = pipeline::schedule_names();

// train.on_nonfinite: a step whose loss or gradient norm is not finite.
enum class NonFinite { abort, skip };
// runtime.device
enum class RuntimeDevice { cpu, cuda, cpu_guarded };

// The words of the deck's own choices (the other modules' enums: train/layout.hpp and
// model/spec.hpp).
inline const ChoiceWords<NonFinite>& choice_words(NonFinite) {
  static const ChoiceWords<NonFinite> w = {{NonFinite::abort, "abort"}, {NonFinite::skip, "skip"}};
  return w;
}
inline const ChoiceWords<RuntimeDevice>& choice_words(RuntimeDevice) {
  static const ChoiceWords<RuntimeDevice> w = {{RuntimeDevice::cpu, "cpu"},
                                               {RuntimeDevice::cuda, "cuda"},
                                               {RuntimeDevice::cpu_guarded, "cpu-guarded"}};
  return w;
}

struct Config {
  model::ModelConfig model;  // [model]; vocab_size 0: take it from the token dataset

  // [parallel]: the layout (train/layout.hpp) and the keys that are not part of it.
  struct Parallel : Layout {
    double grad_bucket_mb = 25.0;  // DP gradient buckets (MiB), overlapped with the backward
    // "deck": the layout's keys as written; "auto": trident plan's fastest fitting layout for
    // the ranks the job was given, chosen at start-up (elastic restarts, FORMAT.md).
    std::string layout = "deck";
    std::string machine;  // layout = "auto": machine file; "": calibrated, cached in out_dir
  } parallel;

  struct Train {
    std::int64_t steps = 200;
    std::int64_t global_batch_size = 32;  // sequences per optimizer step
    double lr = 3e-4;
    double min_lr = 3e-5;
    std::int64_t warmup_steps = 20;  // linear warm-up, then cosine to min_lr at `steps`
    double weight_decay = 0.1;       // AdamW, decoupled, 2-D weights only
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double grad_clip = 1.0;  // global L2 norm; 0 disables
    std::int64_t seed = 1234;
    std::int64_t eval_every = 0;  // steps; 0: never
    std::int64_t eval_batches = 4;
    // A non-finite loss or gradient norm: "abort" (checkpoint the last good step, exit
    // non-zero) or "skip" (leave the weights as they are, count the step in the metrics).
    Choice<NonFinite> on_nonfinite = NonFinite::abort;
  } train;

  struct Data {
    std::string train;  // token dataset (HDF5)
    std::string valid;
  } data;

  struct IO {
    std::string out_dir = "output/run";
    std::int64_t checkpoint_every = 0;  // steps; 0: only at the end
    // false: no checkpoint at the last step (trial runs measuring memory or speed, whose
    // weights nobody reads); checkpoint_every's and a stop's are still written
    bool final_checkpoint = true;
    std::int64_t keep_checkpoints = 2;
    std::string resume = "auto";  // "auto" | "none" | path to a checkpoint
    // resume = "none" over an out_dir holding another run's metrics/checkpoints: refused
    // unless true, which deletes them first (issue 32)
    bool overwrite = false;
    std::string init_weights;     // weights file to start from ("" = fresh init)
    std::int64_t trace_step = 0;  // write <out_dir>/trace/rank-<r>.json of this step; 0: off
  } io;

  struct Runtime {
    // cpu | cuda | cpu-guarded (tests: see ops/cpu/guarded_ops.cpp)
    Choice<RuntimeDevice> device = RuntimeDevice::cpu;
    Choice<ops::Precision> precision = ops::Precision::fp32;  // tf32 and bf16 need cuda
    int threads = 0;                 // 0: cores / ranks on this node
    double watchdog_s = 0;           // a pipeline wait longer than this aborts the job; 0: off
    bool cuda_graphs = false;        // each microbatch's forward and backward as one CUDA graph
  } runtime;

  // Where the deck came from (a file path, or the name given to parse_config); used in the
  // messages of later checks (resolve_world). Not a deck key, not compared, not written.
  std::string source;

  bool operator==(const Config& o) const;  // every deck key (not `source`); [model] as a model
  bool operator!=(const Config& o) const { return !(*this == o); }
};

// Reads the deck at `path`, applies the overrides (each "section.key=value", as given to
// `--set`), and validates. The value of an override is read as a TOML value when it parses
// as one (`train.lr=1e-3`, `parallel.sequence_parallel=true`, `io.resume="none"`); for a
// string key, text that is not a TOML string is taken as it is (`io.out_dir=output/x`).
// allow_tp2d: accept parallel.tp_mode = "2d" (the commands that run the 2D model: train,
// step, grad, init); otherwise it is refused with one error (trident plan: no 2D memory
// prediction yet).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                   bool allow_tp2d = false);

// The same, from TOML text; `source_name` names it in messages (e.g. the checkpoint file).
Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {}, bool allow_tp2d = false);

// The full resolved deck: every section in FORMAT.md's order, every key, exact values
// (floats printed to round-trip). parse_config(to_toml(c), ...) == c.
std::string to_toml(const Config& cfg);

// Fills in parallel.dp when it is 0 (world / (tp*cp*pp)) and checks that the layout fits the
// world (tp*cp*dp*pp == world_size) and the batch (global_batch_size % (micro_batch_size*dp)
// == 0). Throws Error naming the keys and cfg.source.
void resolve_world(Config& cfg, int world_size);

// parallel.pipeline_layers resolved: each virtual stage's layer count, in virtual-stage
// order (pp * vpp entries), or empty for today's even split ("even" where n_layer divides).
// "auto" needs the model's vocab_size (the dataset's when the deck gives 0).
std::vector<int> pipeline_stage_layers(const Config& cfg);
std::vector<int> pipeline_stage_layers(const model::ModelConfig& model, const Layout& layout);

// The deck's layout as the memory model takes it, for pipeline rank pp_rank (and TP rank
// tp_rank): the grid, vpp, the split and the schedule's placement, the micro-batch, SP,
// recomputation, ZeRO-1 and the TP and CP modes. `trident train` (the deck's) and `trident
// plan` (each layout's) both start from it; they add what the deck does not say (the
// schedule's memory, pipeline::set_schedule_memory; host memory; open files; precision).
// Needs a resolved dp.
model::MemoryLayout memory_layout(const Config& cfg, int pp_rank, int tp_rank = 0);
model::MemoryLayout memory_layout(const model::ModelConfig& model, const Layout& layout,
                                  int pp_rank, int tp_rank = 0);

// Microbatches each DP rank runs per optimizer step: global_batch_size / (mbs * dp).
// Needs a resolved dp (resolve_world).
int microbatches_per_rank(const Config& cfg);

}  // namespace trident::train
