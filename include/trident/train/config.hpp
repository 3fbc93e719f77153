// trident/train/config.hpp — the input deck (FORMAT.md, "The input deck"): every section and
// key with its default, loading with `--set section.key=value` overrides, validation, and the
// resolved deck as TOML text (stored in every checkpoint).
// defines: trident::train::Config, load_config, parse_config, to_toml, resolve_world,
//          microbatches_per_rank, kSchedules
//
// The deck is validated from its text alone (no files opened, no communication), so every
// rank reaches the same verdict. Every error is a trident::Error with one line that names
// the file (with line:column where the key was written) and the key, e.g.
//   deck.toml:3:1: unknown key 'model.d_modle' (did you mean 'model.d_model'?)
//   deck.toml:4:11: model.n_layer: expected an integer, got a string
//   deck.toml (--set): train.lr: must be > 0, got -1
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trident/model/spec.hpp"

namespace trident::train {

// The pipeline schedules a deck may name (parallel.schedule).
inline const std::vector<std::string> kSchedules = {
    "naive", "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1"};

struct Config {
  model::ModelConfig model;  // [model]; vocab_size 0: take it from the token dataset

  struct Parallel {
    int tp = 1;
    int pp = 1;
    int dp = 0;   // 0: world size / (tp * pp), filled in by resolve_world
    int vpp = 1;  // model chunks per pipeline rank (interleaved-1f1b, looped-bfs)
    std::string schedule = "1f1b";  // one of kSchedules
    int micro_batch_size = 4;
    bool sequence_parallel = false;
    int zero_stage = 0;             // 0 | 1
    double grad_bucket_mb = 25.0;   // DP gradient buckets (MiB), overlapped with the backward
    std::string recompute = "none";  // none | selective | full
    bool operator==(const Parallel& o) const;
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
    std::string on_nonfinite = "abort";
    bool operator==(const Train& o) const;
  } train;

  struct Data {
    std::string train;  // token dataset (HDF5)
    std::string valid;
    bool operator==(const Data& o) const;
  } data;

  struct IO {
    std::string out_dir = "output/run";
    std::int64_t checkpoint_every = 0;  // steps; 0: only at the end
    std::int64_t keep_checkpoints = 2;
    std::string resume = "auto";  // "auto" | "none" | path to a checkpoint
    std::string init_weights;     // weights file to start from ("" = fresh init)
    std::int64_t trace_step = 0;  // write <out_dir>/trace/rank-<r>.json of this step; 0: off
    bool operator==(const IO& o) const;
  } io;

  struct Runtime {
    std::string device = "cpu";      // cpu | cuda | cpu-guarded (tests: see ops/cpu/guarded_ops.cpp)
    std::string precision = "fp32";  // fp32 | tf32 | bf16 (the last two need cuda)
    int threads = 0;                 // 0: cores / ranks on this node
    double watchdog_s = 0;           // a pipeline wait longer than this aborts the job; 0: off
    bool operator==(const Runtime& o) const;
  } runtime;

  // Where the deck came from (a file path, or the name given to parse_config); used in the
  // messages of later checks (resolve_world). Not a deck key, not compared, not written.
  std::string source;

  bool operator==(const Config& o) const;  // every deck key (not `source`)
  bool operator!=(const Config& o) const { return !(*this == o); }
};

// Reads the deck at `path`, applies the overrides (each "section.key=value", as given to
// `--set`), and validates. The value of an override is read as a TOML value when it parses
// as one (`train.lr=1e-3`, `parallel.sequence_parallel=true`, `io.resume="none"`); for a
// string key, text that is not a TOML string is taken as it is (`io.out_dir=output/x`).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The same, from TOML text; `source_name` names it in messages (e.g. the checkpoint file).
Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});

// The full resolved deck: every section in FORMAT.md's order, every key, exact values
// (floats printed to round-trip). parse_config(to_toml(c), ...) == c.
std::string to_toml(const Config& cfg);

// Fills in parallel.dp when it is 0 (world / (tp*pp)) and checks that the layout fits the
// world (tp*pp*dp == world_size) and the batch (global_batch_size % (micro_batch_size*dp)
// == 0). Throws Error naming the keys and cfg.source.
void resolve_world(Config& cfg, int world_size);

// Microbatches each DP rank runs per optimizer step: global_batch_size / (mbs * dp).
// Needs a resolved dp (resolve_world).
int microbatches_per_rank(const Config& cfg);

}  // namespace trident::train
