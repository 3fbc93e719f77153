// The schedule executor (see trident/pipeline/executor.hpp).
//
// Point-to-point protocol over the pp communicator: an activation of microbatch mb entering
// virtual stage v carries tag 2 * (mb * V + v), the gradient leaving v + 1 for v carries
// 2 * (mb * V + v) + 1 (V = pp * vpp virtual stages), so every (microbatch, chunk,
// direction) has its own tag on every link, including the wrap from the last rank to the
// first between chunks. Receives are posted when the action that needs them starts; sends
// are non-blocking from a buffer of their own (a copy of the slot's output or input
// gradient; buffers are recycled as sends complete) and waited for only at the end of the
// step. That is the simulator's model (blocking receives, buffered sends), so any schedule
// it accepts cannot deadlock here. Every wait goes through
// parallel::wait, so the watchdog (runtime.watchdog_s) names the action that hangs.
#include "trident/pipeline/executor.hpp"

#include <algorithm>
#include <chrono>

#include "trident/core/error.hpp"
#include "trident/parallel/wait.hpp"

namespace trident::pipeline {

Executor::Executor(model::GptChunk& chunk, parallel::ParallelState& ps, Schedule schedule)
    : chunk_(chunk),
      ps_(ps),
      schedule_(std::move(schedule)),
      stage_(ps.coord.pp),
      pp_(ps.shape.pp) {
  TRIDENT_CHECK(schedule_.pp == ps.shape.pp, "schedule for pp = ", schedule_.pp,
                " on a grid with pp = ", ps.shape.pp);
  TRIDENT_CHECK(schedule_.vpp == chunk_.num_chunks(), "schedule for vpp = ", schedule_.vpp,
                " on a model with ", chunk_.num_chunks(), " chunks per pipeline rank");
  const int slots = std::max(1, peak_activations(schedule_.stages.at(stage_)));
  const bool split = splits_weight_grad(schedule_);  // B: input gradients; W: the weights'
  for (int i = 0; i < slots; ++i) pool_.push_back(chunk_.make_activations(-1, split));
  const parallel::DeviceStaging* staging = ps_.pp.staging();
  if (staging && chunk_.memory()) {
    if (staging->mpi_takes_device())
      send_memory_ = chunk_.memory();
    else
      recv_stage_ = PinnedBuffer(chunk_.memory(), std::size_t(chunk_.boundary_numel()));
  }
}

int Executor::tag(int mb, int receiver_vstage, int dir) const {
  return 2 * (mb * pp_ * schedule_.vpp + receiver_vstage) + dir;
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

void Executor::receive(float* data, int from, int tag, const Action& a, const char* what) {
  const double t0 = tracing_ ? trace_now_us() : 0;
  const std::int64_t n = chunk_.boundary_numel();
  float* landing = recv_stage_.empty() ? data : recv_stage_.data();
  MPI_Request r = ps_.pp.irecv(landing, n, from, tag);
  parallel::wait(r, [&] {
    return str("rank ", ps_.world_rank, " (pp rank ", stage_, ") in ", a.str(), " waits for the ",
               what, " from pp rank ", from, " on communicator ", ps_.pp.name());
  });
  if (landing != data)
    copy_to_device(chunk_.memory(), data, landing, std::size_t(n) * sizeof(float));
  record(a, "wait", "wait " + a.str(), t0, from, what);
}

void Executor::reap_sends() {
  for (std::size_t i = 0; i < sends_.size();) {
    int done = 0;
    MPI_Test(&sends_[i].request, &done, MPI_STATUS_IGNORE);
    if (!done) {
      ++i;
      continue;
    }
    free_send_buffers_.push_back(sends_[i].buffer);
    sends_.erase(sends_.begin() + std::ptrdiff_t(i));
  }
}

void Executor::send(const float* data, int to, int tag, const Action& a) {
  reap_sends();
  const std::int64_t n = chunk_.boundary_numel();
  if (free_send_buffers_.empty()) {  // only while the first steps find the peak in flight
    if (send_memory_)
      send_device_.emplace_back(std::size_t(n), send_memory_);
    else
      send_host_.emplace_back(chunk_.memory(), std::size_t(n));
    free_send_buffers_.push_back(int(send_memory_ ? send_device_.size() : send_host_.size()) - 1);
  }
  const int b = free_send_buffers_.back();
  free_send_buffers_.pop_back();
  float* buf = send_memory_ ? send_device_[std::size_t(b)].data() : send_host_[std::size_t(b)].data();
  if (send_memory_)
    chunk_.ops().copy(buf, data, n);  // device to device (isend waits for the copy)
  else
    copy_to_host(chunk_.memory(), buf, data, std::size_t(n) * sizeof(float));
  sends_.push_back({ps_.pp.isend(buf, n, to, tag), a, to, b});
}

void Executor::wait_sends() {
  if (sends_.empty()) return;
  const double t0 = tracing_ ? trace_now_us() : 0;
  std::vector<MPI_Request> reqs;
  for (const Pending& p : sends_) reqs.push_back(p.request);
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

void Executor::forward_one(int slot, const MicrobatchTokens& t, const Action& a,
                           float loss_scale, bool with_backward, double& loss) {
  model::ChunkActivations& act = *pool_[slot];
  const int v = vstage(a.chunk);
  if (!first_vstage(a.chunk))
    receive(act.input.data(), (stage_ - 1 + pp_) % pp_, tag(a.mb, v, 0), a, "activation");
  const double t0 = tracing_ ? trace_now_us() : 0;
  loss += chunk_.forward(a.chunk, act, t.inputs, t.targets, loss_scale, with_backward);
  record(a, "F", a.str(), t0, -1, "");  // ends before the send: a receiver starts after it
  if (!last_vstage(a.chunk)) send(chunk_.output(act), (stage_ + 1) % pp_, tag(a.mb, v + 1, 0), a);
}

double Executor::run(const std::function<MicrobatchTokens(int)>& tokens, float loss_scale) {
  const int vpp = schedule_.vpp;
  std::vector<int> slot_of(std::size_t(schedule_.microbatches) * vpp, -1);  // [mb * vpp + chunk]
  std::vector<int> free_slots;
  for (int i = int(pool_.size()) - 1; i >= 0; --i) free_slots.push_back(i);
  double loss = 0;
  peak_live_ = 0;
  int live = 0;
  trace_.clear();
  executed_.clear();
  const bool split = splits_weight_grad(schedule_);
  auto key = [vpp](const Action& a) { return std::size_t(a.mb) * vpp + a.chunk; };
  auto release = [&](const Action& a) {
    free_slots.push_back(slot_of[key(a)]);
    slot_of[key(a)] = -1;
    --live;
  };
  for (const Action& a : schedule_.stages[stage_]) {
    const MicrobatchTokens t = tokens(a.mb);
    executed_.push_back(a);
    switch (a.type) {
      case ActionType::F: {
        TRIDENT_CHECK(slot_of[key(a)] < 0 && !free_slots.empty(), "executor: stage ", stage_,
                      " action ", a.str(), " has no free activation slot or ran twice");
        slot_of[key(a)] = free_slots.back();
        free_slots.pop_back();
        peak_live_ = std::max(peak_live_, ++live);
        forward_one(slot_of[key(a)], t, a, loss_scale, true, loss);
        break;
      }
      case ActionType::B: {
        TRIDENT_CHECK(slot_of[key(a)] >= 0, "executor: stage ", stage_, " action ", a.str(),
                      " before its forward");
        const int slot = slot_of[key(a)];
        const int v = vstage(a.chunk);
        model::ChunkActivations& act = *pool_[slot];
        if (!last_vstage(a.chunk))
          receive(act.doutput.data(), (stage_ + 1) % pp_, tag(a.mb, v, 1), a, "gradient");
        const double t0 = tracing_ ? trace_now_us() : 0;
        chunk_.backward(a.chunk, act, t.inputs, !split);
        record(a, "B", a.str(), t0, -1, "");
        if (!first_vstage(a.chunk))
          send(act.dinput.data(), (stage_ - 1 + pp_) % pp_, tag(a.mb, v - 1, 1), a);
        if (!split) release(a);
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
  }
  wait_sends();
  return loss;
}

double Executor::forward_only(const std::function<MicrobatchTokens(int)>& tokens,
                              int microbatches) {
  // Each microbatch through the chunks in order (a topological order of the virtual stages
  // on every rank, so blocking receives cannot deadlock).
  double loss = 0;
  const bool tracing = tracing_;
  tracing_ = false;  // a trace shows the training step
  for (int mb = 0; mb < microbatches; ++mb)
    for (int c = 0; c < schedule_.vpp; ++c)
      forward_one(0, tokens(mb), Action{ActionType::F, mb, c}, 0.0f, false, loss);
  wait_sends();
  tracing_ = tracing;
  return loss;
}

}  // namespace trident::pipeline
