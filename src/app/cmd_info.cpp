// `trident grid` and `trident schedule`: the process grid and pipeline schedules, printed
// without running a model (rank 0 prints; no communication). The schedule's JSON line
// (FORMAT.md) carries bubble_fraction and peak_activations (per stage, in chunk
// activations; live until W for zb-h1), plus makespan, per-stage idle_fraction and
// splits_weight_grad.
#include <cstdio>
#include <sstream>

#include "commands.hpp"
#include "trident/core/error.hpp"
#include "trident/core/log.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/parallel/process.hpp"
#include "trident/parallel/grid.hpp"
#include "trident/pipeline/lower.hpp"
#include "trident/pipeline/simulator.hpp"
#include "trident/train/trainer.hpp"

namespace trident::app {

int run_grid(int tp, int cp, int dp, int pp) {
  // Run alone it prints any shape; under mpirun the world must be that shape. The product is
  // taken in 64 bits and bounded: --tp 65536 --pp 65536 overflowed int and printed empty groups.
  constexpr long long kMaxRanks = 1 << 20;
  parallel::agree([&] {
    const long long ranks = static_cast<long long>(tp) * cp * dp * pp;
    TRIDENT_CHECK(ranks <= kMaxRanks, "trident grid: --tp * --cp * --dp * --pp = ", tp, " * ",
                  cp, " * ", dp, " * ", pp, " = ", ranks, " ranks, more than the ", kMaxRanks,
                  " a grid may have");
    const int world = parallel::world_size();
    TRIDENT_CHECK(world == 1 || world == ranks, "trident grid: the world has ", world,
                  " ranks, --tp * --cp * --dp * --pp = ", tp, " * ", cp, " * ", dp, " * ", pp,
                  " = ", ranks);
  });
  parallel::GridShape shape;
  shape.tp = tp, shape.cp = cp, shape.dp = dp, shape.pp = pp;
  log::info(parallel::groups_json(shape));
  return 0;
}

int run_schedule(const std::string& name, int pp, int microbatches, int vpp,
                 const DeckArgs& deck) {
  pipeline::Schedule s;
  pipeline::Simulation sim;
  pipeline::Costs costs;  // uniform stages, unless a deck gives its own
  pipeline::Costs shown_costs;  // the timeline printed: a deck's stages in fewer slots
  pipeline::Simulation shown;
  parallel::agree([&] {
    s = pipeline::make_schedule(name, pp, vpp, microbatches);
    if (!deck.deck.empty()) {
      DeckArgs with_pipeline = deck;  // the command line's pipeline, checked as the deck's
      for (const std::string& kv : {str("parallel.pp=", pp), str("parallel.vpp=", vpp),
                                    str("parallel.schedule=", name)})
        with_pipeline.overrides.push_back(kv);
      const train::Config c = load_deck_with_vocab(with_pipeline);
      costs = train::expected_stage_costs(c);  // the start-up line's: 100 slots a forward
      shown_costs = train::expected_stage_costs(c, 4);
      shown = pipeline::simulate(s, shown_costs);
    }
    sim = pipeline::simulate(s, costs);
    if (deck.deck.empty()) shown = sim;
  });
  std::ostringstream json;
  json << "{\"schedule\": \"" << name << "\", \"pp\": " << pp << ", \"vpp\": " << vpp
       << ", \"placement\": \"" << placement_name(s.placement) << "\""
       << ", \"microbatches\": " << microbatches << ", \"makespan\": " << sim.makespan
       << ", \"bubble_fraction\": " << sim.bubble_fraction << ", \"peak_activations\": [";
  for (std::size_t i = 0; i < sim.peak_activations.size(); ++i)
    json << (i ? ", " : "") << sim.peak_activations[i];
  json << "], \"idle_fraction\": [";
  for (std::size_t i = 0; i < sim.idle_fraction.size(); ++i)
    json << (i ? ", " : "") << sim.idle_fraction[i];
  json << "], \"stage_weight\": [";  // each virtual stage's cost, relative to the heaviest
  for (std::size_t v = 0; v < std::size_t(pp * vpp); ++v)
    json << (v ? ", " : "") << (costs.stage_weight.empty() ? 1.0 : costs.stage_weight[v]);
  json << "], \"asynchronous\": " << (sim.asynchronous ? "true" : "false")
       << ", \"weight_versions\": [";
  for (std::size_t i = 0; i < sim.weight_versions.size(); ++i)
    json << (i ? ", " : "") << sim.weight_versions[i];
  json << "], \"splits_weight_grad\": " << (pipeline::splits_weight_grad(s) ? "true" : "false")
       << ", \"actions\": [";
  for (std::size_t i = 0; i < s.stages.size(); ++i)
    json << (i ? ", " : "") << "\"" << pipeline::format_actions(s.stages[i]) << "\"";
  json << "], \"lowered\": [";  // what each rank runs: its actions, sends and receives
  const pipeline::LoweredSchedule low = pipeline::lower(s);
  for (std::size_t r = 0; r < low.ranks.size(); ++r) {
    json << (r ? ", " : "") << "\"";
    for (std::size_t i = 0; i < low.ranks[r].size(); ++i)
      json << (i ? " | " : "") << low.ranks[r][i].str();
    json << "\"";
  }
  json << "]}";
  if (log::rank() == 0) std::fputs(pipeline::format_timeline(s, shown, shown_costs).c_str(), stdout);
  log::info(json.str());
  return 0;
}

}  // namespace trident::app
