// The training loop (see trident/train/run.hpp).
#include "trident/train/run.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "trident/core/fault.hpp"
#include "trident/core/log.hpp"
#include "trident/io/checkpoint.hpp"
#include "trident/io/dataset.hpp"
#include "trident/io/metrics.hpp"
#include "trident/io/weights.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/train/data_loader.hpp"
#include "trident/train/signals.hpp"

namespace trident::train {

namespace fs = std::filesystem;

io::ShardRole shard_role(const parallel::ParallelState& ps) {
  return io::ShardRole::for_rank(ps.coord.tp, ps.coord.dp, ps.coord.pp);
}

namespace {

std::string format_duration(double seconds) {
  const long s = long(std::lround(std::max(0.0, seconds)));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  return buf;
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

// The checkpoint to resume from (same answer on every rank), or none.
std::optional<std::string> resume_path(const Config& cfg, const parallel::ParallelState& ps) {
  const std::string& r = cfg.io.resume;
  if (r == "none") return std::nullopt;
  if (r != "auto") {
    TRIDENT_CHECK(fs::exists(r), "io.resume: checkpoint '", r, "' not found");
    return r;
  }
  std::string found;
  if (ps.world_rank == 0) {
    auto latest = io::find_latest_checkpoint(cfg.io.out_dir + "/checkpoints");
    if (latest) found = *latest;
  }
  int n = int(found.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  found.resize(std::size_t(n));
  MPI_Bcast(found.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (found.empty()) return std::nullopt;
  return found;
}

// "52.1 MB in 0.41 s, 127 MB/s": a file's size over the time its read or write took.
std::string rate(const std::string& path, double seconds) {
  std::error_code ec;
  const double mb = double(fs::file_size(path, ec)) / 1e6;
  if (ec) return str(seconds, " s");
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.1f MB in %.2f s, %.0f MB/s", mb, seconds,
                mb / std::max(seconds, 1e-9));
  return buf;
}

// The rank's AdamW moments in host memory as checkpoints hold them (the full local layout):
// a ZeRO-1 rank's shards gathered into host buffers (fill) and scattered back (commit);
// otherwise host mirrors of the moments (no copy on a host backend).
class HostMoments {
 public:
  HostMoments(DeviceMemory* mem, AdamW& opt, GradSync& sync, std::int64_t n, bool fill)
      : opt_(opt), sync_(sync) {
    if (sync.zero()) {
      m_full_ = FloatBuffer(std::size_t(n));
      v_full_ = FloatBuffer(std::size_t(n));
      if (fill) {
        sync.gather_full(opt.exp_avg(), m_full_.data());
        sync.gather_full(opt.exp_avg_sq(), v_full_.data());
      }
      return;
    }
    m_own_.emplace(mem, opt.exp_avg(), n, fill);
    v_own_.emplace(mem, opt.exp_avg_sq(), n, fill);
  }
  float* m() { return m_own_ ? m_own_->data() : m_full_.data(); }
  float* v() { return v_own_ ? v_own_->data() : v_full_.data(); }
  void commit() {
    if (!sync_.zero()) {
      m_own_->commit();
      v_own_->commit();
      return;
    }
    sync_.scatter_full(m_full_.data(), opt_.exp_avg());
    sync_.scatter_full(v_full_.data(), opt_.exp_avg_sq());
  }

 private:
  AdamW& opt_;
  GradSync& sync_;
  FloatBuffer m_full_, v_full_;               // ZeRO-1
  std::optional<HostMirror> m_own_, v_own_;  // otherwise
};

}  // namespace

void run_training(Trainer& tr) {
  const StopSignals stop;  // SIGUSR1/SIGTERM: checkpoint the current step, return (exit 0)
  const Config& cfg = tr.config();
  parallel::ParallelState& ps = tr.state();
  model::GptChunk& model = tr.model();
  AdamW& opt = tr.optimizer();
  GradSync& sync = tr.grad_sync();
  const std::int64_t G = cfg.train.global_batch_size, T = cfg.model.seq_len;
  const io::ShardRole role = shard_role(ps);
  const std::string ck_dir = cfg.io.out_dir + "/checkpoints";

  // ---- start-up: every failure here is agreed on by all ranks --------------------------
  std::optional<DataLoader> train_data, valid_data;
  const LoaderOptions train_opt = loader_options(cfg, "data.train", "train", cfg.train.steps * G);
  const LoaderOptions valid_opt =
      loader_options(cfg, "data.valid", "valid", cfg.train.eval_batches * G);
  std::vector<DataSource> train_sources, valid_sources;
  parallel::agree(MPI_COMM_WORLD, [&] {
    fault::validate();
    TRIDENT_CHECK(!cfg.data.train.empty(), cfg.source,
                  ": data.train is empty; name a token dataset (trident prepare-data makes one)");
    train_sources = parse_data_sources(cfg.data.train, cfg.source + ": data.train");
    valid_sources = parse_data_sources(cfg.data.valid, cfg.source + ": data.valid");
    if (ps.world_rank == 0) {
      std::error_code ec;
      fs::create_directories(cfg.io.out_dir, ec);
      TRIDENT_CHECK(!ec, "io.out_dir: cannot create '", cfg.io.out_dir, "': ", ec.message());
      // Rank 0 checks the files and builds (or checks) the sample indexes; then all open them.
      log::info(build_sample_index(train_sources, train_opt));
      if (!valid_sources.empty()) log::info(build_sample_index(valid_sources, valid_opt));
    }
  });
  parallel::agree(MPI_COMM_WORLD, [&] {
    train_data.emplace(train_sources, train_opt);
    if (!valid_sources.empty()) valid_data.emplace(valid_sources, valid_opt);
  });

  std::int64_t start = 0;
  std::optional<std::string> resume;
  parallel::agree(MPI_COMM_WORLD, [&] { resume = resume_path(cfg, ps); });
  double read_s = 0;  // the checkpoint's read, for the log line (make bench reads it)
  parallel::agree(MPI_COMM_WORLD, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    if (resume) {
      // Parameters and moments come through host memory (HostMirror, HostMoments).
      HostMirror params(model.memory(), model.params(), model.num_params(), false);
      HostMoments moments(model.memory(), opt, sync, model.num_params(), false);
      io::CheckpointState st =
          io::read_checkpoint(*resume, MPI_COMM_WORLD, cfg.model, model.specs(), params.data(),
                              moments.m(), moments.v(), role);
      params.commit();
      moments.commit();
      TRIDENT_CHECK(st.seed == std::uint64_t(cfg.train.seed), *resume, ": written with seed ",
                    st.seed, ", the deck has train.seed = ", cfg.train.seed,
                    " (the data order would differ)");
      start = st.step;
      opt.set_steps_taken(st.optimizer_steps);
      read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else if (!cfg.io.init_weights.empty()) {
      HostMirror params(model.memory(), model.params(), model.num_params(), false);
      io::read_weights(cfg.io.init_weights, MPI_COMM_WORLD, cfg.model, model.specs(),
                       params.data(), role);
      params.commit();
    } else {
      model.init_weights(std::uint64_t(cfg.train.seed));
    }
  });
  // The resolved deck, once the weights it describes are known to load: a deck that is
  // refused leaves the out_dir's config.toml (that of its checkpoints) as it was.
  parallel::agree(MPI_COMM_WORLD, [&] {
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
  if (resume)
    log::info("resuming from ", *resume, " at step ", start, " (", rate(*resume, read_s), ")");
  if (start >= cfg.train.steps) {
    log::info("nothing to do: the run already has ", start, " of ", cfg.train.steps, " steps");
    return;
  }

  std::optional<io::MetricsWriter> metrics;
  // Rank 0's traffic per step and communicator (every collective is counted in parallel/).
  std::vector<parallel::Comm*> counted{&ps.tp, &ps.dp, &ps.pp, &ps.embedding};
  // skipped: 1 for a non-finite step left undone; epoch: passes over the data so far.
  // data_s: seconds this step spent reading its batch (rank 0's share).
  std::vector<std::string> extra_columns{"skipped", "epoch", "consumed_tokens", "data_s"};
  for (parallel::Comm* c : counted)
    for (const char* what : {"bytes", "calls"})
      extra_columns.push_back("comm/" + c->name() + "/" + what);
  if (ps.world_rank == 0) metrics.emplace(cfg.io.out_dir, resume ? start : -1, extra_columns);
  tr.report_startup();

  // ---- the step loop ----------------------------------------------------------------------
  const std::int64_t local = tr.local_batch(G), first = tr.local_first(G);
  IntBuffer inputs(std::size_t(local * T)), targets(std::size_t(local * T));
  auto evaluate = [&](std::int64_t step) {
    double sum = 0;
    for (std::int64_t e = 0; e < cfg.train.eval_batches; ++e) {
      valid_data->fill(e, G, first, local, inputs.data(), targets.data());
      sum += tr.evaluate(inputs.data(), targets.data(), G);
    }
    const double loss = sum / double(cfg.train.eval_batches);
    log::info("eval step ", step, " | loss ", loss);
    if (metrics) metrics->append_eval(step, loss);
  };
  std::int64_t last_saved = resume ? start : -1;
  auto save = [&](std::int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    io::CheckpointState st{step, step * G, std::uint64_t(cfg.train.seed), to_toml(cfg),
                           opt.steps_taken()};
    last_saved = step;
    // The file is layout-independent: ZeRO-1 shards are gathered (HostMoments).
    HostMirror params(model.memory(), model.params(), model.num_params(), true);
    HostMoments moments(model.memory(), opt, sync, model.num_params(), true);
    const std::string path =
        io::write_checkpoint(ck_dir, MPI_COMM_WORLD, cfg.model, model.specs(), st, params.data(),
                             moments.m(), moments.v(), role);
    if (ps.world_rank == 0) {
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      log::info("checkpoint ", path, " (", rate(path, dt), ")");
      io::prune_checkpoints(ck_dir, int(cfg.io.keep_checkpoints));
    }
  };

  double elapsed = 0;
  std::int64_t timed = 0;
  std::vector<double> dp_waits;  // seconds each step waited for its DP buckets
  for (std::int64_t step = start + 1; step <= cfg.train.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    fault::set_step(step);
    fault::at_step_start();  // tests only (TRIDENT_FAULT): exit, abort or stall here
    for (parallel::Comm* c : counted) c->reset_counters();
    train_data->fill(step - 1, G, first, local, inputs.data(), targets.data());
    const double data_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tr.set_step(step);
    const double loss = tr.forward_backward(inputs.data(), targets.data(), G);
    const StepStats st = tr.optimizer_step(step, loss);
    if (!st.applied) {  // every rank has the same loss and norm: the same verdict everywhere
      const std::string what = str("step ", step, ": the loss (", st.loss, ") or the gradient norm (",
                                   st.grad_norm, ") is not finite");
      if (cfg.train.on_nonfinite == "skip") {
        log::warn(what, "; skipped, the weights are those of step ", step - 1,
                  " (train.on_nonfinite = \"skip\")");
      } else {
        if (last_saved != step - 1) save(step - 1);  // the weights are still step - 1's
        if (metrics) metrics->close();
        throw parallel::AgreedError(str(
            what, "; stopped with the checkpoint of step ", step - 1, " (",
            io::checkpoint_path(ck_dir, step - 1),
            "); lower train.lr or set train.on_nonfinite = \"skip\" to step over it"));
      }
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    dp_waits.push_back(sync.last_wait_s());
    if (step == cfg.io.trace_step) {
      const std::string trace = tr.write_trace();
      if (ps.world_rank == 0) log::info("pipeline trace of step ", step, ": ", trace);
    }
    elapsed += dt;
    ++timed;
    const double tok_s = double(G * T) / dt;
    if (metrics) {
      for (parallel::Comm* c : counted) {
        metrics->set("comm/" + c->name() + "/bytes", c->counters().bytes);
        metrics->set("comm/" + c->name() + "/calls", double(c->counters().calls));
      }
      metrics->set("skipped", st.applied ? 0.0 : 1.0);
      metrics->set("epoch", train_data->epoch(step * G));
      metrics->set("consumed_tokens", double(step * G * T));
      metrics->set("data_s", data_s);
      metrics->append({step, st.loss, st.lr, st.grad_norm, dt, tok_s});
    }
    char line[200];
    std::snprintf(line, sizeof line,
                  "step %6lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | ETA %s",
                  static_cast<long long>(step), static_cast<long long>(cfg.train.steps), st.loss,
                  st.lr, st.grad_norm, tok_s,
                  format_duration(elapsed / double(timed) * double(cfg.train.steps - step)).c_str());
    log::info(line);
    const bool last = step == cfg.train.steps;
    if (valid_data && cfg.train.eval_every > 0 && (step % cfg.train.eval_every == 0 || last))
      evaluate(step);
    const bool due = last || (cfg.io.checkpoint_every > 0 && step % cfg.io.checkpoint_every == 0);
    if (due) save(step);
    // A stop signal on any rank (signals.hpp): every rank checkpoints this step and returns.
    if (const int sig = last ? 0 : stop.agree(MPI_COMM_WORLD)) {
      if (!due) save(step);
      log::info(StopSignals::name(sig), ": stopped after step ", step, " of ", cfg.train.steps,
                " with its checkpoint; run again (io.resume = \"auto\") to continue");
      return;
    }
  }
  log::info("memory: rank 0 measured peak ", model::format_bytes(tr.measured_peak_bytes()),
            " (predicted ", model::format_bytes(tr.memory_estimate().peak()),
            "); activations ", model::format_bytes(tr.measured_activation_bytes()),
            " (predicted ", model::format_bytes(tr.memory_estimate().activations), ")");
  if (sync.active()) {
    // How much of the DP reduction the backward hid: the final wait against the same
    // buckets reduced alone (blocking, after the loop: not part of any step's metrics).
    std::sort(dp_waits.begin(), dp_waits.end());
    const double wait = dp_waits[dp_waits.size() / 2], alone = sync.time_alone();
    char line[240];
    std::snprintf(line, sizeof line,
                  "dp sync: %d of %d buckets started during the backward; final wait %.3f ms "
                  "(median step), the same buckets alone %.3f ms: %.0f%% hidden",
                  sync.last_early(), sync.num_buckets(), wait * 1e3, alone * 1e3,
                  alone > 0 ? 100.0 * std::max(0.0, 1.0 - wait / alone) : 0.0);
    log::info(line);
  }
}

}  // namespace trident::train
