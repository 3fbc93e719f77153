// trident/plan/planner.hpp — every layout a deck's model may train in on nodes x ranks, each
// predicted (plan/cost.hpp) and ranked: fastest fitting layout first, then those that do not
// fit, smallest peak first; a tie goes to the smaller context-parallel size.
// defines: trident::plan::PlanOptions, schedule_candidates, enumerate_layouts, make_plan,
//          cp_candidates, with_layout, layout_keys, layout_deck_lines, layout_set_lines,
//          memory_dominant
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "trident/plan/cost.hpp"
#include "trident/plan/machine.hpp"
#include "trident/train/config.hpp"

namespace trident::plan {

struct PlanOptions {
  int nodes = 1;
  int ranks_per_node = 1;
  bool host_memory = true;  // CPU ranks (runtime.device = "cpu")
  ops::Precision precision = ops::Precision::fp32;  // runtime.precision
  int max_cp = 0;  // the largest cp planned (`plan --max-cp`); 0: every cp_candidates cp
  int min_cp = 1;  // the smallest cp planned (`plan --min-cp`)
};

// The (vpp, schedule) pairs planned for pp stages of an n_layer model: every schedule in
// the pipeline registry (pipeline::schedule_kinds), vpp = 1 for one-chunk ones, vpp = 2..8
// for those accepting several chunks where pp * vpp divides n_layer; only "1f1b" when pp = 1. Asynchronous schedules
// (PipeDream: they change the update rule) only when the deck names that schedule itself.
std::vector<std::pair<int, std::string>> schedule_candidates(
    int pp, int n_layer, const train::ScheduleChoice& deck_schedule);

// The layer splits planned for pp x vpp virtual stages (Layout::pipeline_layers): "even" where
// n_layer divides, plus "auto" (model::balanced_stage_layers: the embedding's and the head's
// cost moved off) where that split differs from the even one; only "auto" where n_layer
// does not divide (the deck's "even" is the balanced split there too). The schedule's
// placement decides what balanced means (zb-v's V balances ranks).
std::vector<std::string> split_candidates(const model::ModelConfig& cfg, int pp, int vpp,
                                          int tp, const train::ScheduleChoice& schedule = "1f1b");

// The context-parallel sizes planned on `ranks` ranks (what tp leaves): 1, and each power of
// two dividing ranks with seq_len divisible by 2 * cp (the load-balanced causal split).
std::vector<int> cp_candidates(int seq_len, int ranks);

// The layouts `trident train` accepts for the deck's model and global batch on
// nodes * ranks_per_node ranks (the deck's own validation decides): tp dividing the heads,
// each cp_candidates cp, every pp with a layer per stage, every schedule, each split_candidates split, micro-batch
// sizes that are powers of two (and the deck's), each recomputation, sequence parallelism
// where tp > 1, ZeRO-1 where dp * cp > 1.
std::vector<Layout> enumerate_layouts(const train::Config& deck, const PlanOptions& opt);

// Predicts every layout and ranks them (see above). cfg.model.vocab_size must be > 0.
std::vector<StepPrediction> make_plan(const train::Config& deck, const Machine& machine,
                                      const PlanOptions& opt);

// The deck with `layout` as its [parallel] layout keys (dp explicit; the planner's layouts
// keep the defaults parallel.tp_mode "1d" and parallel.cp_mode "ring": it models 1D TP and
// ring attention only).
train::Config with_layout(const train::Config& deck, const Layout& layout);
// The deck keys of `layout` ([parallel], dp explicit), each with its value as TOML: the one
// mapping from a layout to text, which the two below write (and with_layout's typed one
// agrees with: the planner's tests parse them back).
std::vector<std::pair<std::string, std::string>> layout_keys(const Layout& layout);
// The [parallel] lines of `layout`, as a deck would hold them.
std::string layout_deck_lines(const Layout& layout);
// `layout` as `--set` arguments ("parallel.tp=2", ...).
std::vector<std::string> layout_set_lines(const Layout& layout);
// "weights" | "gradients" | "optimizer" | "activations" | "scratch": the largest term (the
// ring attention's buffers count as scratch).
std::string memory_dominant(const model::MemoryEstimate& e);

}  // namespace trident::plan
