// trident/train/config.hpp — the input deck (FORMAT.md, "The input deck"): every section and
// key with its default, loading with `--set section.key=value` overrides, validation, and the
// resolved deck as TOML text (stored in every checkpoint).
// defines: trident::train::Config, load_config, parse_config, to_toml, resolve_world,
//          microbatches_per_rank, kSchedules, Choice, NonFinite, RuntimeDevice
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

namespace trident::train {

// The pipeline schedules a deck may name (parallel.schedule): the registry's names.
inline const std::vector<std::string>& kSchedules = pipeline::schedule_names();

// train.on_nonfinite: a step whose loss or gradient norm is not finite.
enum class NonFinite { abort, skip };
// runtime.device
enum class RuntimeDevice { cpu, cuda, cpu_guarded };

// The words of each choice a deck key makes, in FORMAT.md's order (one overload per enum).
using RecomputeWords = std::vector<std::pair<model::Recompute, const char*>>;
inline const RecomputeWords& choice_words(model::Recompute) {
  static const RecomputeWords w = {{model::Recompute::none, "none"},
                                   {model::Recompute::selective, "selective"},
                                   {model::Recompute::full, "full"}};
  return w;
}
inline const std::vector<std::pair<NonFinite, const char*>>& choice_words(NonFinite) {
  static const std::vector<std::pair<NonFinite, const char*>> w = {{NonFinite::abort, "abort"},
                                                                   {NonFinite::skip, "skip"}};
  return w;
}
inline const std::vector<std::pair<RuntimeDevice, const char*>>& choice_words(RuntimeDevice) {
  static const std::vector<std::pair<RuntimeDevice, const char*>> w = {
      {RuntimeDevice::cpu, "cpu"}, {RuntimeDevice::cuda, "cuda"},
      {RuntimeDevice::cpu_guarded, "cpu-guarded"}};
  return w;
}
inline const std::vector<std::pair<ops::Precision, const char*>>& choice_words(ops::Precision) {
  static const std::vector<std::pair<ops::Precision, const char*>> w = {
      {ops::Precision::fp32, "fp32"}, {ops::Precision::tf32, "tf32"},
      {ops::Precision::bf16, "bf16"}};
  return w;
}

// What the deck loader sees of any Choice<E>: its words.
class ChoiceKey {
 public:
  virtual ~ChoiceKey() = default;
  virtual std::vector<std::string> choices() const = 0;
  virtual std::string current() const = 0;
  virtual void choose(const std::string& word) = 0;  // one of choices()
};

// A deck key that names one of a few choices: its word is parsed once, when the deck is
// read (the loader refuses any other word, naming the key), and code uses the enum E
// (get(), or == E::x); the word comes back for files and messages (word(), <<).
template <class E>
class Choice : public ChoiceKey {
 public:
  Choice(E value) : value_(value) {}  // NOLINT: a default is written as its enum
  Choice(const std::string& word) : value_(parse(word)) {}  // NOLINT
  Choice(const char* word) : value_(parse(word)) {}         // NOLINT

  E get() const { return value_; }
  const char* word() const {
    for (const auto& [e, w] : choice_words(E{}))
      if (e == value_) return w;
    return "?";
  }
  static std::vector<std::string> words() {
    std::vector<std::string> out;
    for (const auto& [e, w] : choice_words(E{})) out.push_back(w);
    return out;
  }
  static std::optional<E> find(const std::string& word) {
    for (const auto& [e, w] : choice_words(E{}))
      if (word == w) return e;
    return std::nullopt;
  }

  std::vector<std::string> choices() const override { return words(); }
  std::string current() const override { return word(); }
  void choose(const std::string& word) override { value_ = parse(word); }

  bool operator==(const Choice& o) const { return value_ == o.value_; }
  bool operator!=(const Choice& o) const { return value_ != o.value_; }
  bool operator==(E e) const { return value_ == e; }
  bool operator!=(E e) const { return value_ != e; }
  // Against a word: for tests and tools that read decks as text, not for code paths.
  friend bool operator==(const Choice& c, const char* word) { return std::string(c.word()) == word; }
  friend std::ostream& operator<<(std::ostream& os, const Choice& c) { return os << c.word(); }

 private:
  static E parse(const std::string& word) {
    const std::optional<E> e = find(word);
    if (!e) fail("'", word, "' is not one of the expected words");
    return *e;
  }
  E value_;
};

struct Config {
  model::ModelConfig model;  // [model]; vocab_size 0: take it from the token dataset

  struct Parallel {
    int tp = 1;
    int pp = 1;
    int dp = 0;   // 0: world size / (tp * cp * pp), filled in by resolve_world
    // Context parallelism: each sequence split over cp ranks (the grid's CP axis, between TP
    // and DP; model.seq_len divisible by 2 * cp). Not wired into the model yet (issue 30):
    // the commands that run one refuse cp > 1 (app/session.cpp).
    int cp = 1;
    // How attention runs over the CP group: "ring" (ring attention) | "ulysses" (all-to-all
    // over heads; n_head / tp and the rank's kv heads divisible by cp).
    std::string cp_mode = "ring";
    int vpp = 1;  // model chunks per pipeline rank (interleaved-1f1b, looped-bfs)
    // Layers per virtual stage: "even" (n_layer / (pp * vpp); "auto" where that does not
    // divide), "auto" (balanced by predicted cost, model::balanced_stage_layers) or a TOML
    // list of pp * vpp counts in virtual-stage order, kept as its text ("[1, 2, 2]").
    std::string pipeline_layers = "even";
    std::string schedule = "1f1b";  // one of kSchedules
    int micro_batch_size = 4;
    bool sequence_parallel = false;
    std::string tp_mode = "1d";  // "1d" (Megatron) | "2d" (SUMMA, tp = q*q; docs/tp2d.md)
    int zero_stage = 0;             // 0 | 1
    double grad_bucket_mb = 25.0;   // DP gradient buckets (MiB), overlapped with the backward
    Choice<model::Recompute> recompute = model::Recompute::none;
    // "deck": the keys above as written; "auto": trident plan's fastest fitting layout for
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

// The deck's layout as the memory model takes it, for pipeline rank pp_rank (and TP rank
// tp_rank): the grid, vpp, the split and the schedule's placement, the micro-batch, SP,
// recomputation, ZeRO-1 and the TP mode. `trident train` and `trident plan` (with_layout)
// both start from it; they add what the deck does not say (the schedule's memory,
// pipeline::set_schedule_memory; host memory; open files; precision). Needs a resolved dp.
model::MemoryLayout memory_layout(const Config& cfg, int pp_rank, int tp_rank = 0);

// Microbatches each DP rank runs per optimizer step: global_batch_size / (mbs * dp).
// Needs a resolved dp (resolve_world).
int microbatches_per_rank(const Config& cfg);

}  // namespace trident::train
