// The training loop (see trident/train/run.hpp).
#include "trident/train/run.hpp"

#include <mpi.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "trident/core/fault.hpp"
#include "trident/core/log.hpp"
#include "trident/io/dataset.hpp"
#include "trident/io/out_dir_lock.hpp"
#include "trident/model/ring_attention.hpp"
#include "trident/model/ulysses_attention.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/train/checkpointer.hpp"
#include "trident/train/data_loader.hpp"
#include "trident/train/run_parts.hpp"

namespace trident::train {

namespace fs = std::filesystem;

io::ShardRole shard_role(const parallel::ParallelState& ps) {
  // One replica writes: DP rank 0's, and of its CP ranks the first (each holds every weight).
  const bool first_replica = ps.coord.dp == 0 && ps.coord.cp == 0;
  return io::ShardRole::for_rank(ps.coord.tp, first_replica ? 0 : 1, ps.coord.pp);
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The options of data.train's or data.valid's loader: `sequences` drawn in all, the sample
// index under <out_dir>/data_index/.
LoaderOptions loader_options(const Config& cfg, const std::string& key, const std::string& stream,
                             std::int64_t sequences) {
  LoaderOptions o;
  o.key = key;
  o.stream = stream;
  o.seq_len = cfg.model.seq_len;
  o.seed = std::uint64_t(cfg.train.seed);
  o.vocab_limit = cfg.model.vocab_size;
  o.sequences = sequences;
  o.index_path = cfg.io.out_dir + "/data_index/" + stream + ".h5";
  return o;
}

// The datasets and the out_dir, checked on every rank before anything else (agreed): rank 0
// checks the files and builds (or checks) the sample indexes; then all open them.
void open_data(const Config& cfg, const parallel::ParallelState& ps,
               std::optional<DataLoader>& train, std::optional<DataLoader>& valid) {
  const std::int64_t G = cfg.train.global_batch_size;
  const LoaderOptions train_opt = loader_options(cfg, "data.train", "train", cfg.train.steps * G);
  const LoaderOptions valid_opt =
      loader_options(cfg, "data.valid", "valid", cfg.train.eval_batches * G);
  std::vector<DataSource> train_sources, valid_sources;
  parallel::agree([&] {
    fault::validate();
    TRIDENT_CHECK(!cfg.data.train.empty(), cfg.source,
                  ": data.train is empty; name a token dataset (trident prepare-data makes one)");
    train_sources = parse_data_sources(cfg.data.train, cfg.source + ": data.train");
    valid_sources = parse_data_sources(cfg.data.valid, cfg.source + ": data.valid");
    if (ps.world_rank == 0) {
      std::error_code ec;
      fs::create_directories(cfg.io.out_dir, ec);
      TRIDENT_CHECK(!ec, "io.out_dir: cannot create '", cfg.io.out_dir, "': ", ec.message());
      log::info(build_sample_index(train_sources, train_opt));
      if (!valid_sources.empty()) log::info(build_sample_index(valid_sources, valid_opt));
    }
  });
  parallel::agree([&] {
    train.emplace(train_sources, train_opt);
    if (!valid_sources.empty()) valid.emplace(valid_sources, valid_opt);
  });
}

// The resolved deck, once the weights it describes are known to load: a deck that is
// refused leaves the out_dir's config.toml (that of its checkpoints) as it was.
void write_resolved_deck(const Config& cfg, const parallel::ParallelState& ps) {
  parallel::agree([&] {
    if (ps.world_rank != 0) return;
    const std::string tmp = cfg.io.out_dir + "/config.toml.tmp";
    std::ofstream f(tmp);
    f << to_toml(cfg);
    f.close();
    TRIDENT_CHECK(f.good(), "io.out_dir: cannot write '", tmp, "': ", std::strerror(errno));
    std::error_code ec;
    fs::rename(tmp, cfg.io.out_dir + "/config.toml", ec);
    TRIDENT_CHECK(!ec, "io.out_dir: cannot write config.toml: ", ec.message());
  });
}

// io.resume = "none" starts afresh: over another run's metrics.h5 and checkpoints it would
// overwrite some and leave the rest for a later "auto" to resume (issue 32). Refused unless
// io.overwrite = true. Rank 0, under the out_dir lock.
std::vector<fs::path> previous_run_files(const Config& cfg) {
  std::vector<fs::path> old;
  if (cfg.io.resume != "none") return old;
  const fs::path dir(cfg.io.out_dir);
  std::error_code ec;
  // Regular files only: anything else where a run's file should be is an error at its write.
  if (fs::is_regular_file(dir / "metrics.h5", ec)) old.push_back(dir / "metrics.h5");
  if (fs::is_directory(dir / "checkpoints", ec))
    for (const auto& e : fs::directory_iterator(dir / "checkpoints", ec))
      if (e.path().extension() == ".h5" && e.is_regular_file(ec)) old.push_back(e.path());
  return old;
}

void refuse_fresh_run_over_another(const Config& cfg) {
  const auto old = previous_run_files(cfg);
  TRIDENT_CHECK(old.empty() || cfg.io.overwrite, "io.resume = \"none\": io.out_dir '",
                cfg.io.out_dir, "' holds another run's files (", old.size(), ", e.g. ",
                old.empty() ? std::string() : old.front().string(),
                "); set io.overwrite = true to delete them, io.resume = \"auto\" to continue "
                "that run, or use another io.out_dir");
}

// io.overwrite = true deletes them only once the data and the initial weights have been
// read: a run that fails on its inputs leaves the previous run whole.
void delete_previous_run(const Config& cfg) {
  const auto old = previous_run_files(cfg);
  if (old.empty()) return;
  std::error_code ec;
  for (const auto& p : old) {
    fs::remove(p, ec);
    TRIDENT_CHECK(!ec, "io.overwrite: cannot delete '", p.string(), "': ", ec.message());
  }
  log::warn("io.overwrite = true: deleted the previous run's metrics.h5 and checkpoints in '",
            cfg.io.out_dir, "' (", old.size(), " files)");
}

}  // namespace

void run_training(Trainer& tr) {
  const Config& cfg = tr.config();
  parallel::ParallelState& ps = tr.state();
  const StopPolicy stop(cfg);  // from here SIGUSR1/SIGTERM stop the run after a checkpoint
  // One run per out_dir: rank 0 takes its lock before anything is written there; every rank
  // learns the verdict (agree), so a refused run exits whole and touches nothing.
  io::OutDirLock lock;
  parallel::agree([&] {
    if (ps.world_rank != 0) return;
    lock = io::OutDirLock::acquire(cfg.io.out_dir, io::OutDirLock::default_wait_seconds());
    refuse_fresh_run_over_another(cfg);
  });
  std::optional<DataLoader> train_data, valid_data;
  open_data(cfg, ps, train_data, valid_data);
  Checkpointer checkpoints(tr);
  const std::int64_t start = checkpoints.start();
  parallel::agree([&] {
    if (ps.world_rank == 0) delete_previous_run(cfg);
  });
  write_resolved_deck(cfg, ps);
  if (start >= cfg.train.steps) {
    log::info("nothing to do: the run already has ", start, " of ", cfg.train.steps, " steps");
    return;
  }
  MetricsLog metrics(tr, checkpoints.resumed() ? start : -1);
  tr.report_startup();

  const std::int64_t G = cfg.train.global_batch_size, T = cfg.model.seq_len;
  const std::int64_t local = tr.local_batch(G), first = tr.local_first(G);
  IntBuffer inputs(std::size_t(local * T)), targets(std::size_t(local * T));
  Evaluator evaluator(tr, std::move(valid_data), inputs, targets);
  ProgressLine progress(cfg.train.steps);
  DpOverlapReport overlap(tr.grad_sync());
  for (std::int64_t step = start + 1; step <= cfg.train.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    fault::set_step(step);
    fault::at_step_start();  // tests only (TRIDENT_FAULT): exit, abort or stall here
    metrics.begin_step();
    train_data->fill(step - 1, G, first, local, inputs.data(), targets.data());
    const double data_s = seconds_since(t0);
    tr.set_step(step);
    const double loss = tr.forward_backward(inputs.data(), targets.data(), G);
    const StepStats st = tr.optimizer_step(step, loss);
    if (!st.applied) stop.on_non_finite(step, st, checkpoints, metrics);
    const double dt = seconds_since(t0);
    overlap.record_step();
    if (step == cfg.io.trace_step) {
      const std::string trace = tr.write_trace();
      if (ps.world_rank == 0) log::info("pipeline trace of step ", step, ": ", trace);
    }
    metrics.record(step, st, dt, double(G * T) / dt,
                   {train_data->epoch(step * G), double(step * G * T), data_s});
    progress.print(step, st, double(G * T) / dt, dt);
    if (evaluator.due(step)) metrics.record_eval(step, evaluator.run(step));
    if (checkpoints.due(step)) checkpoints.save(step);
    // A stop signal on any rank (signals.hpp): every rank checkpoints this step and returns.
    if (const int sig = stop.signal_after(step, ps.world)) {
      checkpoints.ensure_saved(step);
      log::info(StopSignals::name(sig), ": stopped after step ", step, " of ", cfg.train.steps,
                " with its checkpoint; run again (io.resume = \"auto\") to continue");
      return;
    }
  }
  log::info("memory: rank 0 measured peak ", model::format_bytes(tr.measured_peak_bytes()),
            " (predicted ", model::format_bytes(tr.memory_estimate().peak()),
            "); activations ", model::format_bytes(tr.measured_activation_bytes()),
            " (predicted ", model::format_bytes(tr.memory_estimate().activations), ")");
  overlap.print();
  // cp > 1: rank 0's ring figures over the run (time blocked waiting for the ring's messages;
  // Ulysses' all-to-alls are in the metrics' comm/cp columns).
  if (ps.shape.cp > 1 && cfg.parallel.cp_mode == model::CpMode::ring)
    log::info(model::RingAttention::process_stats().describe(ps.shape.cp));
}

}  // namespace trident::train
