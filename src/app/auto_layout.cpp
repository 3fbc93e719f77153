// parallel.layout = "auto" (issue 32, elastic restarts): a job requeued on fewer or more
// nodes asks the planner at start-up for the fastest layout that fits the ranks it was given
// and resumes its checkpoint in it (checkpoints load into any layout).
#include <algorithm>
#include <filesystem>

#include "commands.hpp"
#include "trident/core/log.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/plan/machine.hpp"

namespace trident::app {

namespace {

// The planner places ranks tp fastest, then dp, then pp, node by node: it needs the same
// number of ranks on every node.
int ranks_per_node(const parallel::NodeRanks& node) {
  int most[2] = {-node.size, node.size};  // the largest of -size is the smallest size
  parallel::Comm::world().allreduce_max(most, 2);
  const int lo = -most[0], hi = most[1];
  TRIDENT_CHECK(lo == hi, "parallel.layout = \"auto\" needs the same number of ranks on every "
                "node, got between ", lo, " and ", hi);
  return lo;
}

// The deck's machine file, else one measured on this job's ranks and cached in the out_dir
// (a requeue on the same node count reuses it; another count measures its own).
plan::Machine auto_layout_machine(const train::Config& cfg, ops::Ops& ops, int world,
                                  int per_node) {
  namespace fs = std::filesystem;
  const std::string& named = cfg.parallel.machine;
  const std::string cached =
      str(cfg.io.out_dir, "/machine-", world / per_node, "x", per_node, ".toml");
  bool measure = false;
  parallel::agree([&] {
    std::error_code ec;
    measure = named.empty() && !fs::exists(cached, ec);
    if (!named.empty())
      TRIDENT_CHECK(fs::is_regular_file(named, ec), cfg.source, ": parallel.machine: '", named,
                    "' is not a file");
  });
  if (!measure) {
    plan::Machine m;
    parallel::agree([&] { m = plan::load_machine(named.empty() ? cached : named); });
    return m;
  }
  if (log::rank() == 0)
    log::info("parallel.layout = \"auto\": measuring this machine for the planner (",
              world, " ranks; cached in ", cached, ")");
  plan::Machine m = plan::calibrate(calibrate_options(cfg, world), ops);
  m.name = str("calibrated at start-up (", ops.name(), ", ", world, " ranks)");
  m.source = cached;
  parallel::agree([&] {
    if (log::rank() != 0) return;
    std::error_code ec;
    fs::create_directories(cfg.io.out_dir, ec);
    write_machine_file(cached, m,
                       str("# trident machine file: measured at the start of a run with "
                           "parallel.layout = \"auto\" on ", world, " ranks (", per_node,
                           " per node), backend ", ops.name(), ".\n\n"));
  });
  return m;
}

}  // namespace

void choose_auto_layout(train::Config& cfg, ops::Ops& ops, const parallel::NodeRanks& node,
                        int world) {
  const int per_node = ranks_per_node(node);
  const plan::Machine machine = auto_layout_machine(cfg, ops, world, per_node);
  parallel::agree([&] {
    // Every rank plans (the same inputs, the same answer): nothing to broadcast.
    train::Config deck = cfg;
    deck.parallel.layout = "deck";
    deck.parallel.machine.clear();
    plan::PlanOptions opt;
    opt.nodes = world / per_node;
    opt.ranks_per_node = per_node;
    opt.host_memory = cfg.runtime.device != train::RuntimeDevice::cuda;
    opt.precision = cfg.runtime.precision.get();
    const std::vector<plan::StepPrediction> ranked = plan::make_plan(deck, machine, opt);
    require_fitting_layout(deck, machine, opt, ranked);
    const plan::StepPrediction& best = ranked.front();
    // The resolved deck (config.toml, checkpoints) records the layout chosen, as written.
    cfg = plan::with_layout(deck, best.layout);
    if (log::rank() == 0)
      log::info("parallel.layout = \"auto\": ", best.layout.str(), " on ", opt.nodes, " x ",
                per_node, " ranks, the fastest of ",
                std::count_if(ranked.begin(), ranked.end(), [](const auto& p) { return p.fits; }),
                " fitting layouts (predicted step ", best.step_s, " s, peak ",
                model::format_bytes(best.memory.peak()), " per rank; machine \"", machine.name,
                "\", ", machine.source, ")");
  });
}

}  // namespace trident::app
