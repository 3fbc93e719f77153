// trident's entry point: MPI, the command line (CLI11), and how errors end the job.
//
// An error every rank agrees on (a bad deck, a missing file: see parallel/agree.hpp) is
// printed once by rank 0 as "trident: error: ..." and every rank exits 1 after
// MPI_Finalize. An error on one rank only, once ranks communicate, prints from that rank
// and aborts the whole job (MPI_Abort) so that no rank is left waiting.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include <unistd.h>

#include <cstdlib>

#include "commands.hpp"
#include "trident/ops/blas_core.hpp"
#include "trident/core/log.hpp"
#include "trident/io/h5.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/parallel/process.hpp"
#include "trident/train/signals.hpp"

namespace {

// CLI11's own PositiveNumber prints its range up to DBL_MAX; these say what is expected.
const CLI::Validator kPositive(
    [](std::string& v) -> std::string {
      try {
        if (std::stod(v) > 0) return {};
      } catch (const std::exception&) {
      }
      return "expected a positive number, got '" + v + "'";
    },
    "POSITIVE");
const CLI::Validator kNonNegative(
    [](std::string& v) -> std::string {
      try {
        if (std::stod(v) >= 0) return {};
      } catch (const std::exception&) {
      }
      return "expected a number >= 0, got '" + v + "'";
    },
    "NONNEGATIVE");

void print_error(const char* what, bool only_rank0) {
  if (only_rank0 && trident::log::rank() != 0) return;
  if (trident::log::rank() == 0 || only_rank0)
    std::fprintf(stderr, "trident: error: %s\n", what);
  else
    std::fprintf(stderr, "trident: error: [rank %d] %s\n", trident::log::rank(), what);
  std::fflush(stderr);
}

int run(int argc, char** argv) {
  using namespace trident::app;
  CLI::App app{"trident: 3D-parallel GPT training with MPI (see README.md)", "trident"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "trident 0.1.0");

  DeckArgs deck;
  auto add_deck = [&deck](CLI::App* sub) {
    sub->add_option("deck", deck.deck, "input deck (TOML)")->required();
    sub->add_option("--set", deck.overrides, "override a deck key: section.key=value")
        ->take_all();
  };

  auto* train = app.add_subcommand("train", "train a model on the deck");
  add_deck(train);

  std::string weights, batch, out;
  int steps = 1;
  auto* grad = app.add_subcommand("grad", "loss and full gradients of one batch");
  add_deck(grad);
  grad->add_option("--weights", weights, "weights file (HDF5)")->required();
  grad->add_option("--batch", batch, "batch file with /inputs and /targets")->required();
  grad->add_option("--out", out, "gradient dump to write")->required();

  auto* step = app.add_subcommand("step", "optimizer steps on one batch (for oracles)");
  add_deck(step);
  step->add_option("--weights", weights, "weights file (HDF5)")->required();
  step->add_option("--batch", batch, "batch file with /inputs and /targets")->required();
  step->add_option("--steps", steps, "optimizer steps")->check(kPositive);
  step->add_option("--out", out, "weights file to write")->required();

  auto* init = app.add_subcommand("init", "write freshly initialized weights");
  add_deck(init);
  init->add_option("--out", out, "weights file to write")->required();

  PrepareOptions prep_opt;
  auto* prep = app.add_subcommand("prepare-data", "tokenize a text corpus into a token dataset");
  prep->add_option("--input", prep_opt.inputs,
                   "text or JSON Lines: files, directories, globs, - for stdin (repeatable)")
      ->required();
  prep->add_option("--output", prep_opt.output, "token dataset to write (HDF5)")->required();
  prep->add_option("--tokenizer", prep_opt.tokenizer, "byte | sentencepiece | gpt2")
      ->check(CLI::IsMember({"byte", "sentencepiece", "gpt2"}));
  prep->add_option("--vocab-size", prep_opt.vocab_size, "vocabulary of the BPE (sentencepiece)");
  prep->add_option("--tokenizer-model", prep_opt.tokenizer_model,
                   "an existing SentencePiece model (.model) to encode with, instead of training; "
                   "gpt2: a folder with encoder.json + vocab.bpe or vocab.json + merges.txt, "
                   "or a tokenizer.json");
  prep->add_option("--format", prep_opt.format,
                   "auto (by extension: .jsonl/.json are JSON Lines) | text | jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}));
  prep->add_option("--valid-output", prep_opt.valid_output,
                   "also write a validation dataset from held-out blocks of lines");
  prep->add_option("--valid-every", prep_opt.valid_every,
                   "hold out every N-th block of 100 lines (JSON Lines: records) (default 20)");
  prep->add_option("--block-mb", prep_opt.block_mb,
                   "text per rank per round, in MB (default 16)")->check(CLI::PositiveNumber);

  std::string checkpoint, prompt, tokenizer_data;
  int n_tokens = 200, top_k = 0;
  double temperature = 0.0;
  std::uint64_t seed = 1234;
  auto* sample = app.add_subcommand("sample", "generate text from a checkpoint");
  sample->add_option("--checkpoint", checkpoint, "checkpoint or weights file")->required();
  sample->add_option("--prompt", prompt, "text to continue");
  sample->add_option("--tokens", n_tokens, "tokens to generate")->check(kPositive);
  sample->add_option("--temperature", temperature, "0: greedy; > 0: sample")
      ->check(kNonNegative);
  sample->add_option("--top-k", top_k, "sample among the k most likely (0: all)")
      ->check(kNonNegative);
  sample->add_option("--seed", seed, "random seed for sampling");
  sample->add_option("--data", tokenizer_data,
                     "token dataset whose tokenizer to use (default: the deck's data.train)");

  std::string export_checkpoint, export_out;
  auto* exp = app.add_subcommand("export", "write a checkpoint's weights as a weights file");
  exp->add_option("--checkpoint", export_checkpoint, "checkpoint to read")->required();
  exp->add_option("--out", export_out, "weights file to write (FORMAT.md)")->required();

  ConvertArgs conv;
  auto* convert = app.add_subcommand(
      "convert", "a trident weights file or checkpoint <-> a Hugging Face model folder");
  convert->add_option("--from", conv.from,
                      "trident weights file or checkpoint (export), or Hugging Face folder (import)")
      ->required();
  convert->add_option("--to", conv.to, "Hugging Face folder (export) or weights file (import)")
      ->required();
  auto* conv_dtype = convert->add_option("--dtype", conv.dtype, "export: f32 | bf16 (default f32)")
                         ->check(CLI::IsMember({"f32", "bf16"}));
  convert->add_option("--max-shard-size", conv.max_shard_size,
                      "export: shard above this size (5GB, 500MiB, bytes); default one file");
  convert->add_option("--seq-len", conv.seq_len,
                      "import: the model's seq_len (default n_positions / max_position_embeddings)")
      ->check(kPositive);

  int tp = 1, cp = 1, pp = 1, dp = 1, microbatches = 1, vpp = 1;
  std::string schedule_name;
  auto* grid = app.add_subcommand("grid", "print the TP, CP, DP and PP groups as JSON");
  grid->add_option("--tp", tp)->check(kPositive);
  grid->add_option("--cp", cp, "context-parallel size")->check(kPositive);
  grid->add_option("--pp", pp)->check(kPositive);
  grid->add_option("--dp", dp)->check(kPositive);

  auto* schedule = app.add_subcommand("schedule", "print a pipeline schedule's timeline");
  schedule->add_option("--schedule", schedule_name)->required();
  schedule->add_option("--pp", pp)->check(kPositive);
  schedule->add_option("--microbatches", microbatches)->check(kPositive);
  schedule->add_option("--vpp", vpp)->check(kPositive);
  DeckArgs schedule_deck;
  schedule->add_option("--deck", schedule_deck.deck,
                       "simulate with this deck's stage costs (its model, head and split)");
  schedule->add_option("--set", schedule_deck.overrides, "override a deck key: section.key=value")
      ->take_all();

  PlanArgs plan_args;
  auto* plan = app.add_subcommand("plan", "rank every layout of the deck by predicted step time");
  plan->add_option("deck", plan_args.deck.deck, "input deck (TOML)")->required();
  plan->add_option("--set", plan_args.deck.overrides, "override a deck key")->take_all();
  plan->add_option("--nodes", plan_args.nodes, "nodes (default 1)")->check(kPositive);
  plan->add_option("--ranks-per-node", plan_args.ranks_per_node,
                   "ranks per node (default: the machine file's)")->check(kPositive);
  plan->add_option("--machine", plan_args.machine, "machine file (default machine.toml)");
  plan->add_flag("--json", plan_args.json, "print JSON");
  plan->add_option("--top", plan_args.top, "layouts shown (0: all; default 10)")
      ->check(kNonNegative);
  plan->add_option("--max-cp", plan_args.max_cp,
                   "plan context parallelism up to this cp only (default: every cp)")
      ->check(kPositive);
  plan->add_option("--min-cp", plan_args.min_cp,
                   "plan context parallelism from this cp on only (default 1)")
      ->check(kPositive);
  plan->add_option("--validate", plan_args.validate,
                   "run this many layouts through `trident train` and compare")
      ->check(kNonNegative);
  plan->add_flag("--spread", plan_args.spread,
                 "validate layouts spread over the ranking instead of the best");
  plan->add_option("--validate-steps", plan_args.validate_steps, "steps per validation run (1: peak memory only; default 4)")
      ->check(kPositive);
  plan->add_flag("--cpu-time", plan_args.cpu_time,
                 "validate in CPU seconds per step per rank (a shared machine; calibrate --cpu-time)");
  plan->add_option("--launcher", plan_args.launcher,
                   "command that starts N ranks, {np} replaced (default mpirun --oversubscribe -np {np})");

  CalibrateArgs cal_args;
  auto* cal = app.add_subcommand("calibrate", "measure this machine into a machine file");
  cal->add_option("deck", cal_args.deck.deck, "input deck whose model shapes to measure");
  cal->add_option("--set", cal_args.deck.overrides, "override a deck key")->take_all();
  cal->add_option("--out", cal_args.out, "machine file to write")->required();
  cal->add_option("--name", cal_args.name, "machine.name to write");
  cal->add_option("--min-seconds", cal_args.min_seconds, "time per measurement (default 0.05)")
      ->check(kPositive);
  cal->add_flag("--best", cal_args.best,
                "each figure from its fastest round (an undisturbed machine), not the mean");
  cal->add_flag("--cpu-time", cal_args.cpu_time,
                "one rank: time in the process's CPU seconds (a machine shared with other work)");

  // CLI11 would report "a subcommand is required" for a misspelt one; name it instead.
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      known = known || sub->get_name() == argv[1];
    }
    if (!known)
      throw trident::parallel::AgreedError(std::string("unknown subcommand '") + argv[1] +
                                           "' (expected one of: " + names + ")");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return trident::log::rank() == 0 ? app.exit(e) : 0;
  } catch (const CLI::CallForAllHelp& e) {
    return trident::log::rank() == 0 ? app.exit(e) : 0;
  } catch (const CLI::CallForVersion& e) {
    return trident::log::rank() == 0 ? app.exit(e) : 0;
  } catch (const CLI::ParseError& e) {
    throw trident::parallel::AgreedError(std::string(e.what()) + " (see trident --help)");
  }

  if (*train) return run_train(deck);
  if (*grad) return run_grad(deck, weights, batch, out);
  if (*step) return run_step(deck, weights, batch, steps, out);
  if (*init) return run_init(deck, out);
  if (*prep)
    return run_prepare_data(prep_opt);
  if (*sample) return run_sample(checkpoint, prompt, n_tokens, temperature, top_k, seed, tokenizer_data);
  if (*exp) return run_export(export_checkpoint, export_out);
  if (*convert) {
    conv.dtype_given = conv_dtype->count() > 0;
    return run_convert(conv);
  }
  if (*grid) return run_grid(tp, cp, dp, pp);
  if (*schedule) return run_schedule(schedule_name, pp, microbatches, vpp, schedule_deck);
  if (*plan) return run_plan(plan_args);
  if (*cal) return run_calibrate(cal_args);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // OpenBLAS reads OPENBLAS_CORETYPE when it loads, so a better core type (see
  // ops/blas_core.hpp) takes a re-exec, before MPI starts. A user's setting is kept.
  if (!std::getenv("OPENBLAS_CORETYPE")) {
    const std::string core = trident::ops::blas_core_override();
    if (!core.empty()) {
      setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
      setenv(trident::ops::kBlasCoreAutoEnv, core.c_str(), 1);  // ours, not the user's
      execv("/proc/self/exe", argv);  // returns only on failure: carry on as we are
    }
  }
  // `train` stops gracefully on SIGUSR1/SIGTERM; catch them before the (slow) start-up.
  if (argc > 1 && std::string(argv[1]) == "train") trident::train::StopSignals::catch_early();
  trident::io::h5::start_library();  // before MPI: see io/h5.hpp
  trident::parallel::init(argc, argv);
  trident::log::set_rank(trident::parallel::world_rank());
  int status = 0;
  try {
    status = run(argc, argv);
  } catch (const trident::parallel::AgreedError& e) {
    print_error(e.what(), true);
    status = 1;
  } catch (const std::exception& e) {
    // Only this rank failed (or we cannot know): stop everyone.
    const bool alone = trident::parallel::world_size() == 1;
    print_error(e.what(), alone);
    if (!alone) trident::parallel::abort_job(1);
    status = 1;
  }
  trident::io::h5::stop_library();
  trident::parallel::finalize();
  return status;
}
