// Where a run starts and when it saves (see trident/train/checkpointer.hpp).
#include "trident/train/checkpointer.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "trident/core/log.hpp"
#include "trident/io/checkpoint.hpp"
#include "trident/io/format.hpp"
#include "trident/io/h5.hpp"
#include "trident/io/weights.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/train/run.hpp"

namespace trident::train {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The checkpoint to resume from (same answer on every rank), or none.
std::optional<std::string> resume_path(const Config& cfg, parallel::ParallelState& ps) {
  const std::string& r = cfg.io.resume;
  if (r == "none") return std::nullopt;
  if (r != "auto") {
    TRIDENT_CHECK(fs::exists(r), "io.resume: checkpoint '", r, "' not found");
    return r;
  }
  std::string found;
  if (ps.world_rank == 0) {
    auto latest = io::find_latest_checkpoint(cfg.io.out_dir + "/checkpoints", true);
    if (latest) found = *latest;
  }
  std::int64_t n = std::int64_t(found.size());
  ps.world.broadcast(&n, sizeof n, 0);
  found.resize(std::size_t(n));
  ps.world.broadcast(found.data(), n, 0);
  if (found.empty()) return std::nullopt;
  return found;
}

// What the deck must share with a checkpoint (the model's shape, the seed), checked before
// its tensors are read: a mismatch is the deck's error, never damage to fall back past.
void check_resumable(const std::string& path, const Config& cfg) {
  const io::CheckpointState st = io::read_checkpoint_state(path);
  io::check_model_attrs(io::h5::open_file(path, io::h5::Mode::read), cfg.model);
  TRIDENT_CHECK(st.seed == std::uint64_t(cfg.train.seed), path, ": written with seed ", st.seed,
                ", the deck has train.seed = ", cfg.train.seed, " (the data order would differ)");
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

Checkpointer::Checkpointer(Trainer& trainer)
    : tr_(trainer),
      cfg_(trainer.config()),
      role_(shard_role(trainer.state())),
      dir_(trainer.config().io.out_dir + "/checkpoints") {}

std::string Checkpointer::path_of(std::int64_t step) const {
  return io::checkpoint_path(dir_, step);
}

std::int64_t Checkpointer::start() {
  parallel::ParallelState& ps = tr_.state();
  model::StageModel& model = tr_.model();
  std::int64_t start = 0;
  double read_s = 0;  // the checkpoint's read, for the log line (make bench reads it)
  // io.resume = "auto" falls back past damaged checkpoints (issue 32): a requeue chain goes
  // on from the newest good one; each damaged one is kept aside, renamed, for a human.
  for (;;) {
    parallel::agree([&] { resume_ = resume_path(cfg_, ps); });
    if (!resume_) break;
    parallel::agree([&] { check_resumable(*resume_, cfg_); });
    try {
      parallel::agree([&] {
        const auto t0 = std::chrono::steady_clock::now();
        start = load(*resume_);
        read_s = seconds_since(t0);
      });
      break;
    } catch (const parallel::AgreedError& damage) {
      if (cfg_.io.resume != "auto") throw;
      if (ps.world_rank == 0) io::set_damaged_aside(*resume_, damage.what());
    }
  }
  if (resume_) {
    last_saved_ = start;
    log::info("resuming from ", *resume_, " at step ", start, " (", rate(*resume_, read_s), ")");
    return start;
  }
  parallel::agree([&] {
    if (!cfg_.io.init_weights.empty()) {
      HostMirror params(model.memory(), model.params(), model.num_params(), false);
      io::read_weights(cfg_.io.init_weights, tr_.state().world.raw(), cfg_.model,
                       model.specs(), params.data(), role_);
      params.commit();
    } else {
      model.init_weights(std::uint64_t(cfg_.train.seed));
    }
  });
  return 0;
}

std::int64_t Checkpointer::load(const std::string& path) {
  model::StageModel& model = tr_.model();
  // Parameters and moments come through host memory (HostMirror, HostMoments).
  HostMirror params(model.memory(), model.params(), model.num_params(), false);
  HostMoments moments(model.memory(), tr_.optimizer(), tr_.grad_sync(), model.num_params(),
                      false);
  std::optional<HostMirror> previous;  // PipeDream-2BW's W(t-1)
  if (float* slot = tr_.previous_weights_slot())
    previous.emplace(model.memory(), slot, model.num_params(), false);
  io::CheckpointState st = io::read_checkpoint(
      path, tr_.state().world.raw(), cfg_.model, model.specs(), params.data(), moments.m(),
      moments.v(), role_, previous ? previous->data() : nullptr);
  params.commit();
  moments.commit();
  if (previous && st.has_previous_params) {
    previous->commit();
    tr_.keep_previous_weights();
  } else if (previous) {
    log::info(path, " holds no previous weight version (not written by a pipedream-2bw "
              "run): the first step computes with the loaded weights");
  }
  tr_.optimizer().set_steps_taken(st.optimizer_steps);
  return st.step;
}

bool Checkpointer::due(std::int64_t step) const {
  return (step == cfg_.train.steps && cfg_.io.final_checkpoint) ||
         (cfg_.io.checkpoint_every > 0 && step % cfg_.io.checkpoint_every == 0);
}

void Checkpointer::ensure_saved(std::int64_t step) {
  if (last_saved_ != step) save(step);
}

void Checkpointer::save(std::int64_t step) {
  model::StageModel& model = tr_.model();
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t G = cfg_.train.global_batch_size;
  io::CheckpointState st{step, step * G, std::uint64_t(cfg_.train.seed), to_toml(cfg_),
                         tr_.optimizer().steps_taken()};
  last_saved_ = step;
  // The file is layout-independent: ZeRO-1 shards are gathered (HostMoments).
  HostMirror params(model.memory(), model.params(), model.num_params(), true);
  HostMoments moments(model.memory(), tr_.optimizer(), tr_.grad_sync(), model.num_params(), true);
  std::optional<HostMirror> previous;  // PipeDream-2BW's W(t-1)
  if (const float* w = tr_.previous_weights())
    previous.emplace(model.memory(), const_cast<float*>(w), model.num_params(), true);
  const std::string path =
      io::write_checkpoint(dir_, tr_.state().world.raw(), cfg_.model, model.specs(), st,
                           params.data(), moments.m(), moments.v(), role_,
                           previous ? previous->data() : nullptr);
  if (tr_.state().world_rank == 0) {
    log::info("checkpoint ", path, " (", rate(path, seconds_since(t0)), ")");
    io::prune_checkpoints(dir_, int(cfg_.io.keep_checkpoints));
  }
}

}  // namespace trident::train
