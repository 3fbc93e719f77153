// The schedule executor (see trident/pipeline/executor.hpp).
//
// It walks its rank's lowered list (lower.hpp): a receive is posted (irecv into a buffer of
// its own) where the lowering put it, ahead of its consumer, and waited for when the
// consumer starts; each tag belongs to one (microbatch, chunk, direction) on its link, so
// posting order does not matter to MPI's matching. Sends are non-blocking from a buffer of
// their own (a copy of the slot's output or input gradient; buffers are recycled as sends
// complete) and waited for only at the end of the step. Buffers are the backend's memory;
// where MPI cannot take device memory, each request stages its message through host memory
// itself (parallel/request.hpp). That is the simulator's model
// (blocking receives, buffered sends), so any schedule it accepts cannot deadlock here.
// Every wait goes through parallel::wait, so the watchdog (runtime.watchdog_s) names the
// action that hangs.
// A model may keep a chunk's output and its output gradient in one shared buffer
// (StageModel::shares_boundary): each send follows its F and each receive is copied in just
// before its B, so that holds; the head chunk's output gradient, which its F computes, waits
// there only where its B comes next (head_gradient_waits), else in a row of the executor's.
// Graphs (runtime.cuda_graphs, GraphState in executor.hpp): on one rank, an F followed by its
// B runs as one backend graph per activation slot (forward_backward), from the second run on.
#include "trident/pipeline/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "trident/core/error.hpp"
#include "trident/parallel/wait.hpp"

namespace trident::pipeline {

Executor::Executor(model::StageModel& chunk, parallel::ParallelState& ps, Schedule schedule)
    : chunk_(chunk), ps_(ps), lowered_(lower(schedule)), stage_(ps.coord.pp) {
  TRIDENT_CHECK(schedule.pp == ps.shape.pp, "schedule for pp = ", schedule.pp,
                " on a grid with pp = ", ps.shape.pp);
  TRIDENT_CHECK(schedule.vpp == chunk_.num_chunks(), "schedule for vpp = ", schedule.vpp,
                " on a model with ", chunk_.num_chunks(), " chunks per pipeline rank");
  const int slots = std::max(1, peak_activations(schedule.stages.at(stage_)));
  const bool split = splits_weight_grad(schedule);  // B: input gradients; W: the weights'
  for (int i = 0; i < slots; ++i) pool_.push_back(chunk_.make_activations(-1, split));
  head_chunk_ = head_chunk_of(schedule, stage_);
  const int rows =
      chunk_.shares_boundary() ? peak_head_gradients(schedule.stages.at(stage_), head_chunk_) : 0;
  for (int i = 0; i < rows; ++i)
    head_rows_.emplace_back(std::size_t(chunk_.boundary_numel()), chunk_.memory());
}

Executor::~Executor() {
  for (int g : graph_of_slot_)
    if (g >= 0) chunk_.ops().release_graph(g);
}

void Executor::graphs_failed(const std::string& why) {
  if (!graphs_->failed)  // one line per process
    std::fprintf(stderr, "CUDA graphs: %s: microbatches run eagerly\n", why.c_str());
  graphs_->failed = true;
  for (int& g : graph_of_slot_) {
    if (g >= 0) chunk_.ops().release_graph(g);
    g = -1;
  }
}

double Executor::forward_backward(const Action& a, int slot, const MicrobatchTokens& t,
                                  float loss_scale) {
  ops::Ops& ops = chunk_.ops();
  // The tokens go to the slot's device buffers first, outside any graph (a host copy).
  const auto [inputs, targets] = chunk_.upload_tokens(a.chunk, *pool_[std::size_t(slot)],
                                                      t.inputs, t.targets);
  auto work = [&, inputs = inputs, targets = targets] {
    const double loss = chunk_.forward(a.chunk, *pool_[std::size_t(slot)], inputs, targets,
                                       loss_scale, true);
    chunk_.backward(a.chunk, *pool_[std::size_t(slot)], inputs, true);
    return loss;
  };
  auto eager = [&] {
    ++graphs_->eager;
    return work();
  };
  if (graphs_->failed) return eager();
  if (graph_of_slot_.empty()) {
    graph_of_slot_.assign(pool_.size(), -1);
    graph_scale_.assign(pool_.size(), 0.0f);
  }
  int& graph = graph_of_slot_[std::size_t(slot)];
  if (graph >= 0 && graph_scale_[std::size_t(slot)] != loss_scale) {  // a scalar it baked in
    ops.release_graph(graph);
    graph = -1;
  }
  ops.before_graph();
  std::string why;
  if (graph < 0) {
    if (!ops.begin_capture(&why)) {
      graphs_failed(str("capture failed (", why, ")"));
      return eager();
    }
    double loss = 0;
    try {
      loss = work();  // recorded, not run
    } catch (const Error& e) {
      std::string ignored;
      const int partial = ops.end_capture(&ignored);
      if (partial >= 0) ops.release_graph(partial);
      chunk_.abandon_microbatch();  // its host state, half way through
      graphs_failed(str("capture failed (", e.what(), ")"));
      return eager();
    }
    graph = ops.end_capture(&why);
    if (graph < 0) {
      graphs_failed(str("capture failed (", why, ")"));
      return eager();
    }
    if (loss != 0) {  // the head read its loss on the host: a launch would not
      graphs_failed("capture failed (the loss was read on the host)");
      return eager();
    }
    graph_scale_[std::size_t(slot)] = loss_scale;
    ++graphs_->captures;
  }
  if (!ops.launch_graph(graph, &why)) {
    graphs_failed(str("launch refused (", why, ")"));
    return eager();
  }
  ++graphs_->launches;
  return 0;
}

void Executor::record(const Action& a, const char* cat, std::string name, double t0, int peer,
                      const char* what) {
  if (!tracing_) return;
  TraceEvent e;
  e.name = std::move(name);
  e.cat = cat;
  e.ts_us = t0;
  e.dur_us = trace_now_us() - t0;
  e.mb = a.mb;
  e.chunk = a.chunk;
  e.peer = peer;
  e.what = what;
  trace_.push_back(std::move(e));
}

int Executor::take_buffer(std::vector<FloatBuffer>& buffers, std::vector<int>& free) {
  if (free.empty()) {  // only while the first steps find the peak in flight
    buffers.emplace_back(std::size_t(chunk_.boundary_numel()), chunk_.memory());
    free.push_back(int(buffers.size()) - 1);
  }
  const int b = free.back();
  free.pop_back();
  return b;
}

void Executor::post_receive(const Op& op) {
  const int b = take_buffer(recv_buffers_, free_recv_buffers_);
  float* landing = recv_buffers_[std::size_t(b)].data();
  receives_.push_back({ps_.pp.irecv(landing, chunk_.boundary_numel(), op.peer, op.tag), op, b});
}

void Executor::take_receive(const Action& a, float* data) {
  auto it = std::find_if(receives_.begin(), receives_.end(),
                         [&](const Posted& p) { return p.op.action == a; });
  if (it == receives_.end()) return;  // the first virtual stage's F, the last one's B
  Posted posted = std::move(*it);
  receives_.erase(it);
  const char* what = posted.op.payload == Payload::activation ? "activation" : "gradient";
  const double t0 = tracing_ ? trace_now_us() : 0;
  posted.request.wait([&] {
    return str("rank ", ps_.world_rank, " (pp rank ", stage_, ") in ", a.str(), " waits for the ",
               what, " from pp rank ", posted.op.peer, " on communicator ", ps_.pp.name());
  });
  const float* landing = recv_buffers_[std::size_t(posted.buffer)].data();
  chunk_.ops().copy(data, landing, chunk_.boundary_numel());  // in the backend's memory
  free_recv_buffers_.push_back(posted.buffer);
  record(a, "wait", "wait " + a.str(), t0, posted.op.peer, what);
}

void Executor::progress() {
  for (Posted& p : receives_) p.request.test();
  reap_sends();
}

void Executor::reap_sends() {
  for (std::size_t i = 0; i < sends_.size();) {
    if (!sends_[i].request.test()) {
      ++i;
      continue;
    }
    free_send_buffers_.push_back(sends_[i].buffer);
    sends_.erase(sends_.begin() + std::ptrdiff_t(i));
  }
}

void Executor::send(const Op& op, const float* data) {
  reap_sends();
  const std::int64_t n = chunk_.boundary_numel();
  const int b = take_buffer(send_buffers_, free_send_buffers_);
  float* buf = send_buffers_[std::size_t(b)].data();
  chunk_.ops().copy(buf, data, n);  // in the backend's memory (isend waits for the copy)
  sends_.push_back({ps_.pp.isend(buf, n, op.peer, op.tag), op.action, op.peer, b});
}

void Executor::wait_sends() {
  if (sends_.empty()) return;
  const double t0 = tracing_ ? trace_now_us() : 0;
  std::vector<parallel::Request> reqs;
  for (Pending& p : sends_) reqs.push_back(std::move(p.request));
  parallel::wait_all(reqs, [&] {
    std::string s = str("rank ", ps_.world_rank, " (pp rank ", stage_,
                        ") at the end of the step waits for its send");
    for (const Pending& p : sends_) s += str(" of ", p.action.str(), " to pp rank ", p.peer);
    return s + str(" on communicator ", ps_.pp.name());
  });
  if (tracing_) {
    TraceEvent e{"wait sends", "wait", t0, trace_now_us() - t0, -1, -1, sends_.front().peer,
                 "send"};
    trace_.push_back(std::move(e));
  }
  for (const Pending& p : sends_) free_send_buffers_.push_back(p.buffer);
  sends_.clear();
}

double Executor::run(const std::function<MicrobatchTokens(int)>& tokens, float loss_scale) {
  const Schedule& schedule = lowered_.schedule;
  const int vpp = schedule.vpp;
  std::vector<int> slot_of(std::size_t(schedule.microbatches) * vpp, -1);  // [mb * vpp + chunk]
  std::vector<int> free_slots;
  for (int i = int(pool_.size()) - 1; i >= 0; --i) free_slots.push_back(i);
  double loss = 0;
  peak_live_ = 0;
  int live = 0;
  trace_.clear();
  executed_.clear();
  const bool split = splits_weight_grad(schedule);
  const std::vector<Action>& list = schedule.stages.at(stage_);
  std::vector<int> free_rows, row_of(std::size_t(schedule.microbatches), -1);  // [mb]
  for (int i = int(head_rows_.size()) - 1; i >= 0; --i) free_rows.push_back(i);
  auto key = [vpp](const Action& a) { return std::size_t(a.mb) * vpp + a.chunk; };
  auto release = [&](const Action& a) {
    free_slots.push_back(slot_of[key(a)]);
    slot_of[key(a)] = -1;
    --live;
  };
  const std::vector<Op>& ops = lowered_.ranks[stage_];
  // Graphs from the second run on: the first grows what grows (scratch, plans, buffers).
  const bool graphed = graphs_ && runs_ > 0 && ps_.shape.pp == 1 && !split;
  ++runs_;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const Action& a = op.action;
    if (op.kind == OpKind::recv) {
      post_receive(op);
      continue;
    }
    if (op.kind == OpKind::send) {
      model::StageActivations& act = *pool_[slot_of[key(a)]];
      send(op, a.type == ActionType::F ? act.forward_output() : act.backward_output());
      if (a.type == ActionType::B && !split) release(a);  // the message is copied: done
      if (a.type == ActionType::B && hooks_.after_backward) hooks_.after_backward(a);
      continue;
    }
    const MicrobatchTokens t = tokens(a.mb);
    executed_.push_back(a);
    if (hooks_.before && a.type != ActionType::W) hooks_.before(a);
    switch (a.type) {
      case ActionType::F: {
        TRIDENT_CHECK(slot_of[key(a)] < 0 && !free_slots.empty(), "executor: stage ", stage_,
                      " action ", a.str(), " has no free activation slot or ran twice");
        slot_of[key(a)] = free_slots.back();
        free_slots.pop_back();
        peak_live_ = std::max(peak_live_, ++live);
        model::StageActivations& act = *pool_[slot_of[key(a)]];
        // The head's output gradient waits for a later B in a row of its own, else in the
        // model's shared scratch.
        float* row = nullptr;
        if (!head_rows_.empty() && head_gradient_waits(list, std::size_t(op.index), head_chunk_)) {
          TRIDENT_CHECK(!free_rows.empty(), "executor: stage ", stage_, " action ", a.str(),
                        " finds no free head gradient row");
          row_of[std::size_t(a.mb)] = free_rows.back();
          free_rows.pop_back();
          row = head_rows_[std::size_t(row_of[std::size_t(a.mb)])].data();
        }
        act.keep_head_gradient(row);
        take_receive(a, act.forward_input());
        const double t0 = tracing_ ? trace_now_us() : 0;
        const bool pair = graphed && row == nullptr && i + 1 < ops.size() &&
                          ops[i + 1].kind == OpKind::compute &&
                          ops[i + 1].action.type == ActionType::B && ops[i + 1].action.mb == a.mb &&
                          ops[i + 1].action.chunk == a.chunk;
        if (pair) {  // F and its B together (nothing between them on one rank)
          const Action& b = ops[i + 1].action;
          loss += forward_backward(a, slot_of[key(a)], t, loss_scale);
          record(a, "F", a.str() + "+" + b.str(), t0, -1, "");
          executed_.push_back(b);
          release(b);
          ++i;
          break;
        }
        loss += chunk_.forward(a.chunk, act, t.inputs, t.targets, loss_scale, true);
        record(a, "F", a.str(), t0, -1, "");  // ends before the send: a receiver starts after it
        break;
      }
      case ActionType::B: {
        TRIDENT_CHECK(slot_of[key(a)] >= 0, "executor: stage ", stage_, " action ", a.str(),
                      " before its forward");
        model::StageActivations& act = *pool_[slot_of[key(a)]];
        take_receive(a, act.backward_input());
        const double t0 = tracing_ ? trace_now_us() : 0;
        chunk_.backward(a.chunk, act, t.inputs, !split);
        record(a, "B", a.str(), t0, -1, "");
        if (a.chunk == head_chunk_ && row_of[std::size_t(a.mb)] >= 0) {  // read: free again
          free_rows.push_back(row_of[std::size_t(a.mb)]);
          row_of[std::size_t(a.mb)] = -1;
        }
        const bool sends = i + 1 < ops.size() && ops[i + 1].kind == OpKind::send;
        if (!split && !sends) release(a);  // else after its send
        if (!sends && hooks_.after_backward) hooks_.after_backward(a);  // else after it
        break;
      }
      case ActionType::W: {
        // The weight gradients of the blocks, from what B stashed; then the slot is free.
        TRIDENT_CHECK(slot_of[key(a)] >= 0, "executor: stage ", stage_, " action ", a.str(),
                      " without its forward");
        const double t0 = tracing_ ? trace_now_us() : 0;
        chunk_.backward_weights(a.chunk, *pool_[slot_of[key(a)]]);
        release(a);
        record(a, "W", a.str(), t0, -1, "");
        break;
      }
    }
    progress();
  }
  wait_sends();
  return loss;
}

double Executor::forward_only(const std::function<MicrobatchTokens(int)>& tokens,
                              int microbatches) {
  // Each microbatch through the chunks in order (a topological order of the virtual stages
  // on every rank in either placement, so blocking receives cannot deadlock), lowered as a
  // training step is.
  const Schedule& train = lowered_.schedule;
  Schedule eval{"forward-only", train.pp, train.vpp, microbatches, {}, train.placement};
  for (int r = 0; r < train.pp; ++r) {
    eval.stages.emplace_back();
    for (int mb = 0; mb < microbatches; ++mb)
      for (int c = 0; c < train.vpp; ++c) eval.stages.back().push_back({ActionType::F, mb, c});
  }
  double loss = 0;
  const bool tracing = tracing_;
  tracing_ = false;  // a trace shows the training step
  model::StageActivations& act = *pool_[0];  // one microbatch at a time
  const LoweredSchedule lowered = lower(eval);
  for (const Op& op : lowered.ranks[stage_]) {
    const Action& a = op.action;
    if (op.kind == OpKind::recv) {
      post_receive(op);
    } else if (op.kind == OpKind::send) {
      send(op, act.forward_output());
    } else {
      const MicrobatchTokens t = tokens(a.mb);
      act.keep_head_gradient(nullptr);  // none: the head runs no backward
      take_receive(a, act.forward_input());
      loss += chunk_.forward(a.chunk, act, t.inputs, t.targets, 0.0f, false);
    }
  }
  wait_sends();
  tracing_ = tracing;
  return loss;
}

}  // namespace trident::pipeline
