// The subcommands of `trident` (FORMAT.md, "The command line"). Each returns the exit
// status; errors are trident::Error (see main.cpp for how they end the job).
// defines: trident::app::{TrainArgs, GradArgs, ...}, run_* and Session helpers
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/plan/calibrate.hpp"
#include "trident/plan/planner.hpp"
#include "trident/train/config.hpp"

namespace trident::app {

struct DeckArgs {
  std::string deck;
  std::vector<std::string> overrides;  // --set section.key=value
};

// What every deck-driven subcommand sets up: the validated deck (dp resolved against the
// world), the process grid and the kernel backend.
struct Session {
  train::Config cfg;
  std::unique_ptr<ops::Ops> ops;  // before ps: its staging buffers are the backend's memory
  parallel::ParallelState ps;
};

// Loads and checks the deck on every rank (agreeing on failure), builds the grid and the
// backend. `vocab_from` is a token dataset that supplies model.vocab_size when the deck
// leaves it 0 ("" when there is none).
// allow_tp2d: the command runs parallel.tp_mode = "2d" (train, step, grad, init; load_config).
Session open_session(const DeckArgs& args, const std::string& vocab_from,
                     bool allow_tp2d = false);

// parallel.layout = "auto" (auto_layout.cpp): the planner's fastest fitting layout for this
// world, put into cfg's [parallel] (collective: may calibrate the machine first).
void choose_auto_layout(train::Config& cfg, ops::Ops& ops, const parallel::NodeRanks& node,
                        int world);
// What plan and the auto layout share (cmd_plan.cpp): one clear error when no layout is
// valid or none fits; the measurements calibrate takes for a deck on `world` ranks; a
// machine file written whole (tmp + rename).
void require_fitting_layout(const train::Config& deck, const plan::Machine& machine,
                            const plan::PlanOptions& opt,
                            const std::vector<plan::StepPrediction>& ranked);
plan::CalibrateOptions calibrate_options(const train::Config& deck, int world);
void write_machine_file(const std::string& path, const plan::Machine& m,
                        const std::string& header);

// The kernel backend a deck asks for on this node (runtime.device, threads, precision).
ops::BackendOptions backend_options(const train::Config& c, const parallel::NodeRanks& node);

int run_train(const DeckArgs& args);
int run_grad(const DeckArgs& args, const std::string& weights, const std::string& batch,
             const std::string& out);
int run_step(const DeckArgs& args, const std::string& weights, const std::string& batch,
             int steps, const std::string& out);
int run_init(const DeckArgs& args, const std::string& out);
// `trident prepare-data`: text in (streamed), token datasets out; under mpirun the ranks
// tokenize disjoint blocks and write one file together.
struct PrepareOptions {
  std::vector<std::string> inputs;  // files, directories, globs, "-" (stdin)
  std::string output, tokenizer = "byte", tokenizer_model, format = "auto", valid_output;
  int vocab_size = 0, valid_every = 0;
  double block_mb = 16;
};
int run_prepare_data(const PrepareOptions& opt);
int run_sample(const std::string& checkpoint, const std::string& prompt, int tokens,
               double temperature, int top_k, std::uint64_t seed,
               const std::string& tokenizer_data);
int run_export(const std::string& checkpoint, const std::string& out);
// `trident convert` (FORMAT.md, "Hugging Face models"): `from` a folder imports it into the
// weights file `to`; `from` a trident file exports it into the folder `to`.
struct ConvertArgs {
  std::string from, to;
  std::string dtype = "f32";     // export: f32 | bf16
  bool dtype_given = false;
  std::string max_shard_size;    // export: "" (one file) or a size ("5GB")
  int seq_len = 0;               // import: 0: the config's positions
};
int run_convert(const ConvertArgs& args);
int run_grid(int tp, int cp, int dp, int pp);
// `deck` (may be empty): simulate with its model's stage costs (train::expected_stage_costs,
// its parallel.pipeline_layers at this pp and vpp) instead of uniform stages.
int run_schedule(const std::string& name, int pp, int microbatches, int vpp,
                 const DeckArgs& deck);

// The deck with model.vocab_size resolved from data.train's header where it is 0 (commands
// that size the model without opening a session: plan, calibrate, schedule --deck).
train::Config load_deck_with_vocab(const DeckArgs& args);

// `trident plan` (plan/planner.hpp) and `trident calibrate` (plan/calibrate.hpp).
struct PlanArgs {
  DeckArgs deck;
  int nodes = 1, ranks_per_node = 0;  // 0: the machine file's
  std::string machine = "machine.toml";
  bool json = false;
  int top = 10;                       // rows shown; 0: all
  int max_cp = 0;                     // the largest cp planned; 0: every cp
  int min_cp = 1;                     // the smallest cp planned
  int validate = 0;                   // layouts to run through `trident train`
  bool spread = false;                // validate layouts spread over the ranking, not the top
  int validate_steps = 4;
  bool cpu_time = false;              // measure CPU seconds per step per rank (shared machines)
  std::string launcher = "mpirun --oversubscribe -np {np}";
};
int run_plan(const PlanArgs& args);
struct CalibrateArgs {
  DeckArgs deck;  // optional: the model whose shapes to measure
  std::string out, name;
  double min_seconds = 0.05;
  bool best = false;  // fastest round of each figure, not the mean
  bool cpu_time = false;  // one rank: time in its CPU seconds
};
int run_calibrate(const CalibrateArgs& args);
// Threads per rank when runtime.threads = 0: the cores this rank may use, shared with the
// node's other ranks.
int default_threads(int local_ranks);
// Refuses an output that is one of the command's inputs (the same file by inode, whatever the
// path says): writing it would destroy the input. Either may not exist yet.
void refuse_output_over_input(const std::string& out_key, const std::string& out,
                              const std::string& in_key, const std::string& in);

}  // namespace trident::app
