// The parts of the step loop (see trident/train/run_parts.hpp).
#include "trident/train/run_parts.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "trident/core/log.hpp"
#include "trident/parallel/agree.hpp"

namespace trident::train {

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

}  // namespace

// ---- MetricsLog ----------------------------------------------------------------------------

MetricsLog::MetricsLog(Trainer& trainer, std::int64_t resume_step) : trainer_(trainer) {
  parallel::ParallelState& ps = trainer.state();
  counted_ = {&ps.tp, &ps.dp, &ps.pp, &ps.embedding};
  if (ps.shape.cp > 1) {  // the ring's traffic and the gradient sums over DP × CP
    counted_.push_back(&ps.cp);
    counted_.push_back(&ps.dp_cp);
  }
  tp_parts_ = trainer.model().tensor_parallel_parts();
  // skipped: 1 for a non-finite step left undone; epoch: passes over the data so far.
  // data_s: seconds this step spent reading its batch (rank 0's share).
  // memory/peak_bytes: rank 0's measured high-water mark of the steps so far (the figure of
  // the end-of-run "measured peak" line), which `trident plan --validate` reads.
  std::vector<std::string> extra_columns{"skipped", "epoch", "consumed_tokens", "data_s",
                                         "memory/peak_bytes"};
  for (parallel::Comm* c : counted_)
    for (const char* what : {"bytes", "calls"})
      extra_columns.push_back("comm/" + c->name() + "/" + what);
  if (ps.world_rank == 0) writer_.emplace(trainer.config().io.out_dir, resume_step, extra_columns);
}

void MetricsLog::begin_step() {
  for (parallel::Comm* c : counted_) c->reset_counters();
  for (parallel::Comm* c : tp_parts_) c->reset_counters();
}

void MetricsLog::record(std::int64_t step, const StepStats& st, double step_s,
                        double tokens_per_s, const DataProgress& data) {
  if (!writer_) return;
  for (parallel::Comm* c : counted_) {
    double bytes = c->counters().bytes, calls = double(c->counters().calls);
    if (c == counted_.front())  // the TP group's: in 2D also its grid rows' and columns'
      for (parallel::Comm* p : tp_parts_) {
        bytes += p->counters().bytes;
        calls += double(p->counters().calls);
      }
    writer_->set("comm/" + c->name() + "/bytes", bytes);
    writer_->set("comm/" + c->name() + "/calls", calls);
  }
  writer_->set("skipped", st.applied ? 0.0 : 1.0);
  writer_->set("epoch", data.epoch);
  writer_->set("consumed_tokens", data.consumed_tokens);
  writer_->set("data_s", data.data_s);
  writer_->set("memory/peak_bytes", double(trainer_.measured_peak_bytes()));
  writer_->append({step, st.loss, st.lr, st.grad_norm, step_s, tokens_per_s});
}

void MetricsLog::record_eval(std::int64_t step, double loss) {
  if (writer_) writer_->append_eval(step, loss);
}

void MetricsLog::close() {
  if (writer_) writer_->close();
}

// ---- Evaluator -----------------------------------------------------------------------------

Evaluator::Evaluator(Trainer& trainer, std::optional<DataLoader> valid, IntBuffer& inputs,
                     IntBuffer& targets)
    : tr_(trainer), valid_(std::move(valid)), inputs_(inputs), targets_(targets) {}

bool Evaluator::due(std::int64_t step) const {
  const Config::Train& t = tr_.config().train;
  return valid_ && t.eval_every > 0 && (step % t.eval_every == 0 || step == t.steps);
}

double Evaluator::run(std::int64_t step) {
  const Config::Train& t = tr_.config().train;
  const std::int64_t G = t.global_batch_size;
  const std::int64_t local = tr_.local_batch(G), first = tr_.local_first(G);
  double sum = 0;
  for (std::int64_t e = 0; e < t.eval_batches; ++e) {
    valid_->fill(e, G, first, local, inputs_.data(), targets_.data());
    sum += tr_.evaluate(inputs_.data(), targets_.data(), G);
  }
  const double loss = sum / double(t.eval_batches);
  log::info("eval step ", step, " | loss ", loss);
  return loss;
}

// ---- ProgressLine --------------------------------------------------------------------------

void ProgressLine::print(std::int64_t step, const StepStats& st, double tokens_per_s,
                         double step_s) {
  elapsed_ += step_s;
  ++timed_;
  char line[200];
  std::snprintf(line, sizeof line,
                "step %6lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | ETA %s",
                static_cast<long long>(step), static_cast<long long>(steps_), st.loss, st.lr,
                st.grad_norm, tokens_per_s,
                format_duration(elapsed_ / double(timed_) * double(steps_ - step)).c_str());
  log::info(line);
}

// ---- StopPolicy ----------------------------------------------------------------------------

StopPolicy::StopPolicy(const Config& cfg)
    : non_finite_(cfg.train.on_nonfinite.get()), steps_(cfg.train.steps) {}

void StopPolicy::on_non_finite(std::int64_t step, const StepStats& st, Checkpointer& checkpoints,
                               MetricsLog& metrics) const {
  const std::string what = str("step ", step, ": the loss (", st.loss, ") or the gradient norm (",
                               st.grad_norm, ") is not finite");
  if (non_finite_ == NonFinite::skip) {
    log::warn(what, "; skipped, the weights are those of step ", step - 1,
              " (train.on_nonfinite = \"skip\")");
    return;
  }
  checkpoints.ensure_saved(step - 1);  // the weights are still step - 1's
  metrics.close();
  throw parallel::AgreedError(
      str(what, "; stopped with the checkpoint of step ", step - 1, " (",
          checkpoints.path_of(step - 1),
          "); lower train.lr or set train.on_nonfinite = \"skip\" to step over it"));
}

int StopPolicy::signal_after(std::int64_t step, parallel::Comm& world) const {
  return step == steps_ ? 0 : signals_.agree(world);
}

// ---- DpOverlapReport -----------------------------------------------------------------------

void DpOverlapReport::print() {
  if (!sync_.active() || waits_.empty()) return;
  // The final wait against the same buckets reduced alone (blocking, after the loop: not
  // part of any step's metrics).
  std::sort(waits_.begin(), waits_.end());
  const double wait = waits_[waits_.size() / 2], alone = sync_.time_alone();
  char line[240];
  std::snprintf(line, sizeof line,
                "dp sync: %d of %d buckets started during the backward; final wait %.3f ms "
                "(median step), the same buckets alone %.3f ms: %.0f%% hidden",
                sync_.last_early(), sync_.num_buckets(), wait * 1e3, alone * 1e3,
                alone > 0 ? 100.0 * std::max(0.0, 1.0 - wait / alone) : 0.0);
  log::info(line);
}

}  // namespace trident::train
