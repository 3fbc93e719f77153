// One optimizer step of one rank (see trident/train/trainer.hpp).
#include "trident/train/trainer.hpp"


#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <tuple>

#include "trident/core/error.hpp"
#include "trident/core/fault.hpp"
#include "trident/core/log.hpp"
#include "trident/core/memory_usage.hpp"
#include "trident/model/ring_attention.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/parallel/cuda_aware.hpp"
#include "trident/pipeline/simulator.hpp"
#include "trident/pipeline/stage_memory.hpp"
#include "trident/io/trace.hpp"
#include "trident/train/data_loader.hpp"
#include "trident/train/lr_schedule.hpp"

namespace trident::train {

std::vector<model::StageLayout> stage_layout(const Config& cfg,
                                             const parallel::ParallelState& ps) {
  return model::chunk_layouts(cfg.model, ps.shape.pp, cfg.parallel.vpp, ps.coord.pp,
                              pipeline_stage_layers(cfg),
                              cfg.parallel.schedule->placement);
}

namespace {

// Refused before the first large allocation (issue 32): a model that cannot fit would end
// in std::bad_alloc or the OOM killer after seconds of allocating. The prediction counts
// trident's buffers only, so it refuses what surely does not fit, never what might.
const char* kShrink = "; spread the model over more ranks (parallel.tp, parallel.pp, "
                      "zero_stage), recompute activations (parallel.recompute), lower "
                      "parallel.micro_batch_size, or shrink the model";

// A lower bound of a rank's bytes in floating point (weights and gradients, one stashed
// layer input per layer): absurd shapes are refused by it before predict_memory's int64
// sums could overflow.
void refuse_absurd_shapes(const model::ModelConfig& m, const Config::Parallel& p,
                          std::int64_t available) {
  const double d = double(m.d_model), layers = double(m.n_layer) / p.pp;
  const double params = (12.0 * d * d * m.n_layer + double(m.vocab_size + m.seq_len) * d) /
                        (double(p.tp) * p.pp);
  const double bound = 8.0 * params + 4.0 * double(m.seq_len) * p.micro_batch_size * d * layers;
  const double limit = available > 0 ? double(available) : std::ldexp(1.0, 56);
  parallel::agree([&] {
    TRIDENT_CHECK(bound <= limit, "memory: a rank needs at least ",
                  model::format_bytes(std::int64_t(std::min(bound, std::ldexp(1.0, 62)))),
                  " (model.n_layer = ", m.n_layer, ", model.d_model = ", m.d_model,
                  ", model.seq_len = ", m.seq_len, "), more than the ",
                  model::format_bytes(std::int64_t(limit)), available > 0 ?
                  " the node has available (MemAvailable, cgroup limit)" : " any node has",
                  kShrink);
  });
}

void refuse_what_cannot_fit(const model::MemoryEstimate& rank, bool host_memory,
                            std::int64_t available) {
  if (!host_memory) return;  // a device's memory is the backend's to refuse
  const std::int64_t node = parallel::node_sum(rank.peak());
  parallel::agree([&] {
    TRIDENT_CHECK(available < 0 || node <= available, "memory: this node's ranks need ",
                  model::format_bytes(node), " by the start-up prediction (this rank ",
                  rank.describe(), "), more than the ", model::format_bytes(available),
                  " the node has available (MemAvailable, cgroup limit)", kShrink);
  });
}

// runtime.cuda_graphs covers a stage that runs alone, one synchronous update a step, each
// microbatch's backward right after its forward (the executor records the pair as one
// graph). Every rank reaches the same verdict (the layout is the job's).
void refuse_graphs_where_they_cannot_apply(const Config& cfg, const parallel::ParallelState& ps,
                                           pipeline::WeightUpdate update) {
  parallel::agree([&] {
    const char* what = "runtime.cuda_graphs = true";
    TRIDENT_CHECK(ps.shape.tp == 1 && ps.shape.pp == 1 && ps.shape.cp == 1, what,
                  " covers a stage that runs alone: expected parallel.tp = 1, parallel.pp = 1 "
                  "and parallel.cp = 1, got tp ", ps.shape.tp, ", pp ", ps.shape.pp, ", cp ",
                  ps.shape.cp, " (parallel.dp may be any)");
    TRIDENT_CHECK(update == pipeline::WeightUpdate::flush, what, " needs one synchronous "
                  "weight update a step: parallel.schedule = ", cfg.parallel.schedule.word(),
                  " updates per microbatch or with delayed weights");
    const pipeline::Schedule s =
        pipeline::make_schedule(cfg.parallel.schedule.kind(), 1, cfg.parallel.vpp, 2);
    const std::vector<pipeline::Action>& list = s.stages.at(0);
    bool pairs = list.size() == 4;
    for (std::size_t i = 0; pairs && i < list.size(); i += 2)
      pairs = list[i].type == pipeline::ActionType::F &&
              list[i + 1].type == pipeline::ActionType::B && list[i].mb == list[i + 1].mb;
    TRIDENT_CHECK(pairs, what, " needs each microbatch's backward right after its forward: "
                  "parallel.schedule = ", cfg.parallel.schedule.word(), " on one stage runs ",
                  pipeline::format_actions(list), "; expected 1f1b or naive");
  });
}

}  // namespace

int files_held_open(const Config& cfg, bool writes_metrics) {
  return loader_files_held_open(cfg.data.train, "data.train") +
         loader_files_held_open(cfg.data.valid, "data.valid") + (writes_metrics ? 1 : 0) + 1;
}

Trainer::Trainer(const Config& cfg, parallel::ParallelState& ps, ops::Ops& ops)
    : cfg_(cfg), ps_(ps), ops_(ops), rss_at_start_(resident_bytes()) {
  TRIDENT_CHECK(cfg.model.vocab_size > 0, "model.vocab_size is 0 and no dataset gave one");
  // On a device the arena already holds the backend's own blocks (the cuBLAS workspace): its
  // measured high-water mark counts them, so the prediction does too.
  const std::int64_t backend_bytes = ops.memory() ? std::int64_t(ops.memory()->used()) : 0;
  model::StageModelOptions options;
  options.micro_batch = cfg.parallel.micro_batch_size;
  options.recompute = cfg.parallel.recompute.get();
  options.sequence_parallel = cfg.parallel.sequence_parallel;
  options.tp_mode = cfg.parallel.tp_mode.get();
  options.cp_mode = cfg.parallel.cp_mode.get();
  update_ = cfg.parallel.schedule->update;
  model::MemoryLayout lay = memory_layout(cfg, ps.coord.pp, ps.coord.tp);
  lay.host_memory = ops.memory() == nullptr;
  lay.open_files = files_held_open(cfg, ps.world_rank == 0);
  lay.set_precision(ops.precision());  // the chunk's rule: bf16_activations == bf16_storage()
  lay.fused_head = lay.bf16_products && ops.fused_lm_head();  // knobs may turn it off
  lay.block_stash_bf16 = ops.gpt2_block_stash_bf16();
  lay.cp_bf16 = ops.cp_attention_bf16();
  if (!lay.host_memory)  // the backend's exact scratch for attention through cuDNN (or 0)
    lay.fused_attention_bytes = [&ops](int b, int t, int nh, int nkv, int hs, bool qkv_rows) {
      ops::Ops::AttentionShape s;  // packed rows: the bytes do not depend on the strides
      s.b = b, s.t = t, s.nh = nh, s.nkv = nkv, s.hs = hs;
      s.ld_q = s.ld_o = std::int64_t(nh) * hs;
      s.ld_k = s.ld_v = std::int64_t(nkv) * hs;
      // The fused block's: bf16 I/O on its [q k v] rows (attention_shape_qkv / _llama)
      if (qkv_rows) s.ld_q = s.ld_k = s.ld_v = std::int64_t(nh + 2 * nkv) * hs;
      return ops.fused_attention_bytes(s, qkv_rows);
    };
  const std::int64_t per_step = std::int64_t(cfg.parallel.micro_batch_size) * ps.shape.dp;
  if (cfg.train.global_batch_size > 0 && cfg.train.global_batch_size % per_step == 0) {
    try {
      const auto sched = pipeline::make_schedule(cfg.parallel.schedule.kind(), ps.shape.pp,
                                                 cfg.parallel.vpp,
                                                 int(cfg.train.global_batch_size / per_step));
      pipeline::set_schedule_memory(lay, sched, ps.coord.pp);
    } catch (const std::exception&) {
      // A schedule that cannot be made is reported by the first step, with its context.
    }
  }
  const std::int64_t available = available_memory_bytes();
  refuse_absurd_shapes(cfg.model, cfg.parallel, lay.host_memory ? available : -1);
  memory_estimate_ = model::predict_memory(cfg.model, lay);
  memory_estimate_.libraries = backend_bytes;
  refuse_what_cannot_fit(memory_estimate_, lay.host_memory, available);

  if (cfg.runtime.cuda_graphs) {
    refuse_graphs_where_they_cannot_apply(cfg, ps, update_);
    const std::string no = ops.graphs_unsupported();
    if (no.empty())
      graphs_ = std::make_unique<pipeline::GraphState>();
    else
      log::info("trident: runtime.cuda_graphs: ", no, ": microbatches run eagerly");
  }

  model_ = model::make_stage_model(cfg.model, stage_layout(cfg, ps), ps, ops, options);
  sync_ = std::make_unique<GradSync>(*model_, ps.replicas(), cfg.parallel.grad_bucket_mb,
                                     cfg.parallel.zero_stage == 1);
  // Under graphs the backward's host code does not run again: the DP buckets all start after
  // the last microbatch (GradSync::finish), not overlapped with the backward.
  if (sync_->active() && !graphs_)
    model_->set_grad_ready_hook([sync = sync_.get()](std::int64_t offset, std::int64_t count) {
      sync->ready(offset, count);
    });
  optimizer_ = std::make_unique<AdamW>(*model_, ops, cfg.train, *sync_);
  // The backend may cache a converted copy of the weights for its products (CUDA, bf16).
  ops.set_weights(model_->params(), model_->num_params());
  if (update_ == pipeline::WeightUpdate::delayed) {  // PipeDream's stash grows in its first step
    const std::int64_t n = model_->num_params();
    older_weights_ = FloatBuffer(std::size_t(n), ops.memory());
    swap_buffer_ = FloatBuffer(std::size_t(std::min(n, model::kVersionSwapFloats)), ops.memory());
  }

  // Every command that builds a trainer says so (train, step, grad), rank 0 only.
  if (update_ == pipeline::WeightUpdate::delayed)
    log::info("trident: schedule ", cfg.parallel.schedule, " is asynchronous, not equivalent "
              "to the serial run: step t computes its gradient with the weights of step t-1 "
              "(W(t+1) = W(t) - lr * grad(W(t-1))), 2 weight versions per stage");
  if (update_ == pipeline::WeightUpdate::per_microbatch)
    log::info("trident: schedule ", cfg.parallel.schedule, " is asynchronous, not equivalent "
              "to the serial run: each stage updates its weights after every microbatch's "
              "backward, which computes with the weights its forward used (weight stashing); "
              "this stage holds up to ", lay.weight_versions, " weight versions");
  log::info("memory: rank 0 predicted ", memory_estimate_.describe(), " (activations: ",
            lay.peak_stash, " microbatch-chunks of ",
            model::format_bytes(memory_estimate_.activations_per_microbatch),
            lay.head_gradients > 0 ? str(" + ", lay.head_gradients, " head gradients") : "",
            lay.bf16_activations ? ", the layers' stash in bf16)" : ")");
}

Trainer::~Trainer() {
  if (graphs_)
    log::info("trident: CUDA graphs: ", graphs_->captures, " captured, ", graphs_->launches,
              " microbatches launched as graphs, ", graphs_->eager, " eager",
              graphs_->failed ? " (graphs failed: eager since)" : "");
  executors_.clear();  // their graphs, before the backend's weights go
  ops_.set_weights(nullptr, 0);
}

std::int64_t Trainer::measured_peak_bytes() const {
  if (step_peak_ < 0) return 0;
  return ops_.memory() ? step_peak_ : step_peak_ - rss_at_start_;
}

std::int64_t Trainer::measured_activation_bytes() const {
  if (in_use_before_stash_ < 0 || step_peak_ < 0) return 0;
  return step_peak_ - in_use_before_stash_;
}

std::int64_t Trainer::local_batch(std::int64_t global_batch) const {
  return global_batch / ps_.shape.dp;
}

std::int64_t Trainer::local_first(std::int64_t global_batch) const {
  return local_batch(global_batch) * ps_.coord.dp;
}

int Trainer::microbatches_for(std::int64_t global_batch) const {
  const std::int64_t per_mb = std::int64_t(cfg_.parallel.micro_batch_size) * ps_.shape.dp;
  TRIDENT_CHECK(global_batch % per_mb == 0, "a batch of ", global_batch,
                " sequences does not split into microbatches of parallel.micro_batch_size = ",
                cfg_.parallel.micro_batch_size, " on ", ps_.shape.dp, " data-parallel ranks");
  return int(global_batch / per_mb);
}

pipeline::Executor& Trainer::executor_for(int microbatches) {
  auto it = executors_.find(microbatches);
  if (it == executors_.end()) {
    if (executors_.empty())
      in_use_before_stash_ = ops_.memory() ? std::int64_t(ops_.memory()->used()) : resident_bytes();
    auto sched = pipeline::make_schedule(cfg_.parallel.schedule.kind(), ps_.shape.pp,
                                         cfg_.parallel.vpp, microbatches);
    it = executors_
             .emplace(microbatches, std::make_unique<pipeline::Executor>(*model_, ps_, std::move(sched)))
             .first;
    it->second->set_graphs(graphs_.get());
  }
  it->second->set_step(step_);
  it->second->set_tracing(cfg_.io.trace_step > 0 && cfg_.io.trace_step == step_);
  last_executor_ = it->second.get();
  return *it->second;
}

std::string Trainer::write_trace() const {
  const pipeline::Executor* ex = last_executor_;
  if (!ex || cfg_.io.trace_step <= 0 || cfg_.io.trace_step != step_) return "";
  const pipeline::Schedule& s = ex->schedule();
  const std::string path =
      cfg_.io.out_dir + "/trace/rank-" + std::to_string(ps_.world_rank) + ".json";
  io::write_chrome_trace(
      path, ex->trace(), ps_.world_rank,
      str("rank ", ps_.world_rank, " (tp ", ps_.coord.tp, ", dp ", ps_.coord.dp, ", pp ",
          ps_.coord.pp, ")"),
      {{"rank", std::to_string(ps_.world_rank)},
       {"pp_rank", std::to_string(ps_.coord.pp)},
       {"tp_rank", std::to_string(ps_.coord.tp)},
       {"dp_rank", std::to_string(ps_.coord.dp)},
       {"step", std::to_string(step_)},
       {"schedule", "\"" + s.name + "\""},
       {"pp", std::to_string(s.pp)},
       {"vpp", std::to_string(s.vpp)},
       {"microbatches", std::to_string(s.microbatches)},
       {"executed", "\"" + pipeline::format_actions(ex->executed()) + "\""},
       {"peak_live", std::to_string(ex->peak_live())},
       {"activation_slots", std::to_string(ex->activation_slots())}});
  return path;
}

double Trainer::reduce_loss(double local_sum, std::int64_t global_batch) {
  double sum = local_sum;  // non-zero on the last stage only
  ps_.pp.allreduce_sum(&sum, 1);
  ps_.replicas().allreduce_sum(&sum, 1);  // every token once: DP (× CP) ranks hold disjoint ones
  return sum / double(global_batch * cfg_.model.seq_len);
}

std::int64_t Trainer::microbatch_tokens() const {
  return std::int64_t(cfg_.parallel.micro_batch_size) * cfg_.model.seq_len / ps_.shape.cp;
}

std::pair<const std::int32_t*, const std::int32_t*> Trainer::cp_rows(
    const std::int32_t* inputs, const std::int32_t* targets, std::int64_t sequences) {
  if (ps_.shape.cp == 1) return {inputs, targets};
  const std::int64_t T = cfg_.model.seq_len;
  if (cp_positions_.empty())
    cp_positions_ = model::cp_local_positions(int(T), ps_.shape.cp, ps_.coord.cp);
  const std::int64_t t = std::int64_t(cp_positions_.size());
  cp_inputs_.resize(std::size_t(sequences * t));
  cp_targets_.resize(cp_inputs_.size());
  for (std::int64_t s = 0; s < sequences; ++s)
    for (std::int64_t i = 0; i < t; ++i) {
      const std::int64_t from = s * T + cp_positions_[std::size_t(i)];
      cp_inputs_[std::size_t(s * t + i)] = inputs[from];
      cp_targets_[std::size_t(s * t + i)] = targets[from];
    }
  return {cp_inputs_.data(), cp_targets_.data()};
}

double Trainer::forward_backward(const std::int32_t* inputs, const std::int32_t* targets,
                                 std::int64_t global_batch) {
  const int m = microbatches_for(global_batch);
  const std::int64_t mb_tokens = microbatch_tokens();
  std::tie(inputs, targets) = cp_rows(inputs, targets, local_batch(global_batch));
  // Every rank's gradients are scaled by 1/(global tokens): their sum over DP × CP is the mean.
  const float loss_scale = float(1.0 / double(global_batch * cfg_.model.seq_len));
  model_->zero_grads();
  // Tests (TRIDENT_FAULT nan): this rank's gradients start as NaN, so the sums of the
  // backward, the DP reduction and the norm carry it to every rank alike.
  if (fault::armed(fault::Kind::nan))
    ops_.fill(model_->grads(), std::numeric_limits<float>::quiet_NaN(), model_->num_params());
  const bool per_mb = update_ == pipeline::WeightUpdate::per_microbatch;
  if (sync_->active() && !per_mb) sync_->begin(m);  // buckets start as the last backward finishes them
  const bool delayed = update_ == pipeline::WeightUpdate::delayed;
  if (delayed) {  // compute with W(t-1); older_weights_ keeps W(t)
    const std::int64_t n = model_->num_params();
    if (!older_valid_) ops_.copy(older_weights_.data(), model_->params(), n);
    older_valid_ = true;
    swap_weight_versions();
  }
  pipeline::Executor& ex = executor_for(m);
  if (per_mb) {  // each update the mean gradient of one microbatch (per DP replica: summed)
    async_lr_ = learning_rate(cfg_.train, long(step_));
    weight_versions_ = pipeline::weight_versions(ex.schedule().stages.at(std::size_t(ps_.coord.pp)),
                                                 update_);
    ex.set_hooks({[this](const pipeline::Action& a) { before_action(a); },
                  [this](const pipeline::Action& a) { after_backward(a); }});
  }
  // The head adds each microbatch's loss sum on the device; one copy after the last (the
  // executor's sum is then 0: forward returns 0, and 0 + total is the total).
  model_->set_loss_on_device(true);
  struct LossOff {
    model::StageModel& m;
    ~LossOff() { m.set_loss_on_device(false); }
  } loss_off{*model_};
  const double local = ex.run(
      [&](int mb) {
        return pipeline::MicrobatchTokens{inputs + mb * mb_tokens, targets + mb * mb_tokens};
      },
      per_mb ? loss_scale * float(m) : loss_scale) + ops_.take_loss();
  if (per_mb) return reduce_loss(local, global_batch);  // every update is done
  // W(t) back for the optimizer; older_weights_ stays W(t), the next step's W(t-1).
  if (delayed) ops_.copy(model_->params(), older_weights_.data(), model_->num_params());
  GradSync::reduce_tied_embedding(*model_, ps_);
  model_->reduce_param_grads();
  // Each replica's gradients are already scaled by 1/(global tokens): the sum is the mean.
  if (sync_->active()) sync_->finish();
  return reduce_loss(local, global_batch);
}

void Trainer::swap_weight_versions() { swap_params_with(older_weights_.data()); }

void Trainer::before_action(const pipeline::Action& a) {
  if (a.type == pipeline::ActionType::F) {
    version_of_mb_[a.mb] = live_version_;
    return;
  }
  // B: the version its forward used; the live params swap with its stash slot meanwhile.
  const std::int64_t v = version_of_mb_.at(a.mb);
  if (v != live_version_) {
    swapped_in_ = stash_of_version_.at(v);
    swap_params_with(stash_[std::size_t(swapped_in_)].data());
  }
  // The gradients are zero here (forward_backward, then after each update): not zeroed
  // before B, as the last stage's F already put the head's gradients in (GptChunk::forward).
  if (sync_->active()) sync_->begin(1);
}

void Trainer::after_backward(const pipeline::Action& a) {
  if (swapped_in_ >= 0) swap_params_with(stash_[std::size_t(swapped_in_)].data());
  swapped_in_ = -1;
  GradSync::reduce_tied_embedding(*model_, ps_);  // pp = 1 only (config): a no-op
  model_->reduce_param_grads();
  if (sync_->active()) sync_->finish();
  version_of_mb_.erase(a.mb);
  // Versions no microbatch in flight computes with any more go back to the pool first, so
  // the stash never holds more than the simulator's weight_versions.
  for (auto it = stash_of_version_.begin(); it != stash_of_version_.end();) {
    bool used = false;
    for (const auto& [mb, v] : version_of_mb_) used = used || v == it->first;
    if (used) {
      ++it;
      continue;
    }
    free_stash_.push_back(it->second);
    it = stash_of_version_.erase(it);
  }
  // A microbatch in flight computes with the live version: keep a copy before updating it.
  bool needed = false;
  for (const auto& [mb, v] : version_of_mb_) needed = needed || v == live_version_;
  if (needed) {
    if (free_stash_.empty()) {  // the first step grows the stash to the schedule's peak
      // The simulator's count (weight_versions, which the memory prediction uses) bounds it.
      TRIDENT_CHECK(int(stash_.size()) + 2 <= std::max(1, weight_versions_), "pipedream: stage ",
                    ps_.coord.pp, " needs more weight versions than the schedule's ",
                    weight_versions_);
      stash_.emplace_back(std::size_t(model_->num_params()), ops_.memory());
      free_stash_.push_back(int(stash_.size()) - 1);
    }
    const int slot = free_stash_.back();
    free_stash_.pop_back();
    ops_.copy(stash_[std::size_t(slot)].data(), model_->params(), model_->num_params());
    stash_of_version_[live_version_] = slot;
  }
  optimizer_->step(async_lr_, 0.0);  // train.grad_clip is 0 (config): no norm needed
  model_->zero_grads();               // for the next microbatch (its F may add the head's)
  ++live_version_;
}

void Trainer::swap_params_with(float* other) {
  if (swap_buffer_.empty())  // PipeDream: the first swap (a stage with stashed versions)
    swap_buffer_ = FloatBuffer(
        std::size_t(std::min(model_->num_params(), model::kVersionSwapFloats)), ops_.memory());
  float* a = model_->params();
  float* b = other;
  float* tmp = swap_buffer_.data();
  const std::int64_t n = model_->num_params(), chunk = std::int64_t(swap_buffer_.size());
  for (std::int64_t i = 0; i < n; i += chunk) {
    const std::int64_t k = std::min(chunk, n - i);
    ops_.copy(tmp, a + i, k);
    ops_.copy(a + i, b + i, k);
    ops_.copy(b + i, tmp, k);
  }
}

void Trainer::gather_gradients() {
  if (sync_->zero()) sync_->gather_full(sync_->grad_base(), model_->grads());
}

pipeline::Costs expected_stage_costs(const Config& cfg, int forward_slots) {
  const int stages = cfg.parallel.pp * cfg.parallel.vpp;
  std::vector<int> split = pipeline_stage_layers(cfg);
  if (split.empty()) split.assign(std::size_t(stages), cfg.model.n_layer / stages);
  pipeline::Costs costs;
  const model::EndCosts ends = model::stage_end_costs(cfg.model, cfg.parallel.tp);
  for (std::size_t v = 0; v < split.size(); ++v)
    costs.stage_weight.push_back(split[v] + (v == 0 ? ends.embedding : 0.0) +
                                 (v + 1 == split.size() ? ends.head : 0.0));
  const double heaviest = *std::max_element(costs.stage_weight.begin(), costs.stage_weight.end());
  for (double& w : costs.stage_weight) w = w / heaviest;
  costs.f = forward_slots, costs.b = 2 * forward_slots;  // the heaviest stage's
  // A split backward: W the c_attn and c_fc weight gradients, B the rest.
  costs.w = std::max(1, int(std::lround(forward_slots * model::weight_pass_share(cfg.model))));
  costs.b_split = costs.b - costs.w;
  return costs;
}

void Trainer::report_startup() {
  // Rank 0 reports the maximum over ranks (stages and TP ranks differ).
  const std::int64_t mine[2] = {model_->num_params(), optimizer_->state_bytes()};
  double most[2] = {double(mine[0]), double(mine[1])};  // below 2^53: exact as doubles
  ps_.world.allreduce_max(most, 2);
  const int m = microbatches_per_rank(cfg_);
  const auto sched = pipeline::make_schedule(cfg_.parallel.schedule.kind(), ps_.shape.pp,
                                             cfg_.parallel.vpp, m);
  const std::vector<int> split = pipeline_stage_layers(cfg_);
  const double bubble = pipeline::simulate(sched, expected_stage_costs(cfg_)).bubble_fraction;
  char line[512];
  // cp only when set: the line's form at cp = 1 is what scripts read (FORMAT.md).
  const std::string cp = ps_.shape.cp > 1 ? str(" x cp=", ps_.shape.cp) : "";
  std::snprintf(line, sizeof line,
                "trident: layout tp=%d x pp=%d x dp=%d%s, vpp=%d, schedule %s, %d microbatches "
                "of %d per step, %lld tokens per step, expected bubble %.3f",
                ps_.shape.tp, ps_.shape.pp, ps_.shape.dp, cp.c_str(), cfg_.parallel.vpp,
                cfg_.parallel.schedule.word(), m, cfg_.parallel.micro_batch_size,
                static_cast<long long>(cfg_.train.global_batch_size) * cfg_.model.seq_len,
                bubble);
  log::info(line);
  // A split other than today's even one (named, "auto", or n_layer not dividing pp * vpp).
  if (!split.empty()) {
    std::string counts;
    for (int n : split) counts += str(counts.empty() ? "" : ", ", n);
    log::info(str("trident: layers per virtual stage [", counts, "] (parallel.pipeline_layers = ",
                  cfg_.parallel.pipeline_layers.rfind("[", 0) == 0
                      ? cfg_.parallel.pipeline_layers
                      : "\"" + cfg_.parallel.pipeline_layers + "\"",
                  ")"));
  }
  std::snprintf(line, sizeof line,
                "trident: %lld parameters on rank 0 (at most %lld on a rank), optimizer state "
                "%lld bytes on rank 0 (at most %lld on a rank), zero_stage=%d, %d DP bucket%s "
                "of <= %g MiB%s",
                static_cast<long long>(mine[0]), static_cast<long long>(most[0]),
                static_cast<long long>(mine[1]), static_cast<long long>(most[1]),
                cfg_.parallel.zero_stage, sync_->num_buckets(),
                sync_->num_buckets() == 1 ? "" : "s", cfg_.parallel.grad_bucket_mb,
                cfg_.parallel.zero_stage == 1 && ps_.shape.dp == 1
                    ? " (ZeRO-1 is a no-op at dp = 1)"
                    : "");
  log::info(line);
  const DeviceMemory* mem = ops_.memory();
  const parallel::DeviceStaging* staging = ps_.world.staging();
  if (!mem) {
    log::info("trident: kernels on ", ops_.name(), " (host memory), MPI ",
              parallel::mpi_cuda_aware_library() ? "CUDA-aware" : "not CUDA-aware");
    return;
  }
  std::snprintf(line, sizeof line, "%.1f of %.1f MiB", double(mem->used()) / 1048576.0,
                double(mem->capacity()) / 1048576.0);
  log::info("trident: kernels on ", ops_.name(), ", device memory ", mem->where(), ": ", line,
            " of its arena in use; MPI ",
            staging && staging->mpi_takes_device()
                ? "CUDA-aware: device buffers are passed to MPI as they are"
                : (parallel::mpi_cuda_aware_library() ? "CUDA-aware but told not to "
                                                        "(TRIDENT_MPI_CUDA_AWARE=0 or a test "
                                                        "device): device buffers are staged "
                                                        "through host memory"
                                                      : "not CUDA-aware: device buffers are "
                                                        "staged through host memory"));
}

StepStats Trainer::optimizer_step(std::int64_t step, double loss) {
  StepStats st;
  st.loss = loss;
  st.lr = learning_rate(cfg_.train, long(step));
  if (update_ == pipeline::WeightUpdate::per_microbatch) {
    // PipeDream updated every stage after each backward, at this step's lr; there is no
    // global gradient to take a norm of (reported as 0).
    st.grad_norm = 0;
    st.applied = std::isfinite(st.loss);
  } else {
    st.grad_norm = optimizer_->grad_norm(ps_);
    st.applied = std::isfinite(st.loss) && std::isfinite(st.grad_norm);
    if (st.applied) optimizer_->step(st.lr, st.grad_norm);
  }
  // The high-water mark of the steps themselves (checkpoints and evaluation come after).
  step_peak_ = ops_.memory() ? std::int64_t(ops_.memory()->peak()) : peak_resident_bytes();
  return st;
}

double Trainer::evaluate(const std::int32_t* inputs, const std::int32_t* targets,
                         std::int64_t global_batch) {
  const int m = microbatches_for(global_batch);
  const std::int64_t mb_tokens = microbatch_tokens();
  std::tie(inputs, targets) = cp_rows(inputs, targets, local_batch(global_batch));
  const double local = executor_for(m).forward_only(
      [&](int mb) {
        return pipeline::MicrobatchTokens{inputs + mb * mb_tokens, targets + mb * mb_tokens};
      },
      m);
  return reduce_loss(local, global_batch);
}

}  // namespace trident::train
