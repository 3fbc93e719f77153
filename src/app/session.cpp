// Start-up shared by the deck-driven subcommands (see commands.hpp).
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "commands.hpp"
#include "trident/core/fault.hpp"
#include "trident/io/dataset.hpp"
#include "trident/train/data_loader.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/parallel/process.hpp"
#include "trident/parallel/cuda_aware.hpp"
#include "trident/parallel/wait.hpp"
#include "trident/pipeline/schedule.hpp"

namespace trident::app {

// Threads per rank: the cores this rank may run on, shared with the node's other ranks
// when they are not bound apart (ranks x threads never exceed the cores).
int default_threads(int local_ranks) {
  cpu_set_t set;
  int allowed = 1;
  if (sched_getaffinity(0, sizeof set, &set) == 0) allowed = CPU_COUNT(&set);
  const int online = int(sysconf(_SC_NPROCESSORS_ONLN));
  return std::max(1, std::min(allowed, online / std::max(1, local_ranks)));
}

ops::BackendOptions backend_options(const train::Config& c, const parallel::NodeRanks& node) {
  ops::BackendOptions backend;
  backend.device = c.runtime.device.word();  // ops names its backends by word
  backend.threads = c.runtime.threads > 0 ? c.runtime.threads : default_threads(node.size);
  backend.precision = c.runtime.precision.get();
  backend.local_rank = node.rank;
  backend.local_size = node.size;
  return backend;
}

void refuse_output_over_input(const std::string& out_key, const std::string& out,
                              const std::string& in_key, const std::string& in) {
  std::error_code ec;
  if (out.empty() || in.empty() || in == "-") return;
  TRIDENT_CHECK(!std::filesystem::equivalent(out, in, ec) || ec, out_key, " '", out,
                "' is the same file as ", in_key, " '", in, "'; writing it would destroy the input");
}

Session open_session(const DeckArgs& args, const std::string& vocab_from, bool allow_tp2d) {
  Session s;
  const parallel::NodeRanks node = parallel::node_ranks();
  const int world = parallel::world_size();
  parallel::agree([&] {
    s.cfg = train::load_config(args.deck, args.overrides, allow_tp2d);
    train::Config& c = s.cfg;
    const std::string data = vocab_from.empty() ? c.data.train : vocab_from;
    if (c.model.vocab_size == 0) {
      TRIDENT_CHECK(!data.empty(), c.source,
                    ": model.vocab_size = 0 takes the vocabulary from data.train, which is empty");
      c.model.vocab_size =
          io::read_token_dataset_header(train::first_token_file(data, "data.train")).vocab_size;
    }
    if (c.parallel.layout != "auto") train::resolve_world(c, world);
    // A malformed test fault (TRIDENT_FAULT, core/fault.hpp) fails here, agreed.
    fault::validate();
    s.ops = ops::make_ops(backend_options(c, node));
  });
  if (s.cfg.parallel.layout == "auto") {
    choose_auto_layout(s.cfg, *s.ops, node, world);
    parallel::agree([&] { train::resolve_world(s.cfg, world); });
  }
  parallel::set_watchdog_seconds(s.cfg.runtime.watchdog_s);
  s.ps = parallel::make_parallel_state(s.cfg.parallel.grid(), s.cfg.parallel.schedule->placement,
                                       s.cfg.parallel.vpp);
  // Device buffers reach MPI directly when it is CUDA-aware ("cuda" only: the guarded test
  // backend always stages), else through host memory.
  const bool gpu = s.cfg.runtime.device == train::RuntimeDevice::cuda;
  s.ps.use_device_memory(s.ops->memory(), gpu && parallel::mpi_cuda_aware());
  return s;
}

}  // namespace trident::app
