// `trident grid` and `trident schedule`: the process grid and pipeline schedules, printed
// without running a model (rank 0 prints; no communication).
#include <cstdio>
#include <sstream>

#include "commands.hpp"
#include "trident/core/log.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/parallel/grid.hpp"
#include "trident/pipeline/simulator.hpp"

namespace trident::app {

int run_grid(int tp, int pp, int dp) {
  log::info(parallel::groups_json(parallel::GridShape{tp, pp, dp}));
  return 0;
}

int run_schedule(const std::string& name, int pp, int microbatches, int vpp) {
  pipeline::Schedule s;
  pipeline::Simulation sim;
  parallel::agree(MPI_COMM_WORLD, [&] {
    s = pipeline::make_schedule(name, pp, vpp, microbatches);
    sim = pipeline::simulate(s);
  });
  std::ostringstream json;
  json << "{\"schedule\": \"" << name << "\", \"pp\": " << pp << ", \"vpp\": " << vpp
       << ", \"microbatches\": " << microbatches << ", \"makespan\": " << sim.makespan
       << ", \"bubble_fraction\": " << sim.bubble_fraction << ", \"peak_activations\": [";
  for (std::size_t i = 0; i < sim.peak_activations.size(); ++i)
    json << (i ? ", " : "") << sim.peak_activations[i];
  json << "]}";
  if (log::rank() == 0) std::fputs(pipeline::format_timeline(s, sim).c_str(), stdout);
  log::info(json.str());
  return 0;
}

}  // namespace trident::app
