// The schedule executor (see trident/pipeline/executor.hpp).
//
// Point-to-point protocol between neighbouring stages of the pp communicator (rank in it
// = pipeline stage): F(mb) sends the chunk's output forward with tag 2*mb, B(mb) sends the
// input gradient backward with tag 2*mb + 1. Receives are posted when the action that
// needs them starts; sends are non-blocking and waited for only before their buffer (an
// activation slot) is written again, or at the end of the step. Any schedule whose
// per-stage orders are consistent (checked by the simulator) therefore cannot deadlock.
#include "trident/pipeline/executor.hpp"

#include <algorithm>

#include "trident/core/error.hpp"

namespace trident::pipeline {

namespace {
int act_tag(int mb) { return 2 * mb; }
int grad_tag(int mb) { return 2 * mb + 1; }

void wait_all(std::vector<MPI_Request>& reqs) {
  if (reqs.empty()) return;
  MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  reqs.clear();
}
}  // namespace

Executor::Executor(model::GptChunk& chunk, parallel::ParallelState& ps, Schedule schedule)
    : chunk_(chunk), ps_(ps), schedule_(std::move(schedule)), stage_(ps.coord.pp) {
  TRIDENT_CHECK(schedule_.vpp == 1, "the executor runs one model chunk per pipeline rank in "
                                    "this build (parallel.vpp = ", schedule_.vpp, ")");
  TRIDENT_CHECK(schedule_.pp == ps.shape.pp, "schedule for pp = ", schedule_.pp,
                " on a grid with pp = ", ps.shape.pp);
  const int slots = std::max(1, peak_activations(schedule_.stages.at(stage_)));
  for (int i = 0; i < slots; ++i) pool_.push_back(chunk_.make_activations());
  pending_.resize(pool_.size());
}

void Executor::receive(float* data, int from_stage, int tag) {
  MPI_Request r = ps_.pp.irecv(data, chunk_.boundary_numel(), from_stage, tag);
  MPI_Wait(&r, MPI_STATUS_IGNORE);
}

void Executor::forward_one(int slot, const MicrobatchTokens& t, int mb, float loss_scale,
                           bool with_backward, double& loss) {
  wait_all(pending_[slot]);  // the slot's previous sends read its buffers
  model::ChunkActivations& a = *pool_[slot];
  if (!ps_.first_stage()) receive(a.input.data(), stage_ - 1, act_tag(mb));
  loss += chunk_.forward(a, t.inputs, t.targets, loss_scale, with_backward);
  if (!ps_.last_stage())
    pending_[slot].push_back(
        ps_.pp.isend(chunk_.output(a), chunk_.boundary_numel(), stage_ + 1, act_tag(mb)));
}

double Executor::run(const std::function<MicrobatchTokens(int)>& tokens, float loss_scale) {
  std::vector<int> slot_of(schedule_.microbatches, -1);
  std::vector<int> free_slots;
  for (int i = int(pool_.size()) - 1; i >= 0; --i) free_slots.push_back(i);
  double loss = 0;
  peak_live_ = 0;
  int live = 0;
  const bool split = splits_weight_grad(schedule_);
  auto release = [&](int mb) {
    free_slots.push_back(slot_of[mb]);
    slot_of[mb] = -1;
    --live;
  };
  for (const Action& a : schedule_.stages[stage_]) {
    const MicrobatchTokens t = tokens(a.mb);
    switch (a.type) {
      case ActionType::F: {
        TRIDENT_CHECK(slot_of[a.mb] < 0 && !free_slots.empty(), "executor: stage ", stage_,
                      " action ", a.str(), " has no free activation slot or ran twice");
        slot_of[a.mb] = free_slots.back();
        free_slots.pop_back();
        peak_live_ = std::max(peak_live_, ++live);
        forward_one(slot_of[a.mb], t, a.mb, loss_scale, true, loss);
        break;
      }
      case ActionType::B: {
        TRIDENT_CHECK(slot_of[a.mb] >= 0, "executor: stage ", stage_, " action ", a.str(),
                      " before its forward");
        const int slot = slot_of[a.mb];
        model::ChunkActivations& act = *pool_[slot];
        if (!ps_.last_stage()) receive(act.doutput.data(), stage_ + 1, grad_tag(a.mb));
        chunk_.backward(act, t.inputs);
        if (!ps_.first_stage())
          pending_[slot].push_back(ps_.pp.isend(act.dinput.data(), chunk_.boundary_numel(),
                                                stage_ - 1, grad_tag(a.mb)));
        if (!split) release(a.mb);
        break;
      }
      case ActionType::W:
        // This build's B computes the weight gradient too (the split into an input-gradient
        // B and a W is data flow the schedule already honours); W frees the stash, as the
        // schedule's memory count assumes.
        TRIDENT_CHECK(slot_of[a.mb] >= 0, "executor: stage ", stage_, " action ", a.str(),
                      " without its forward");
        release(a.mb);
        break;
    }
  }
  for (auto& p : pending_) wait_all(p);
  // The tied embedding: wte's gradient from the first stage's lookup and the last stage's
  // LM head, summed so that both copies take the same optimizer step.
  if (ps_.shape.pp > 1 && ps_.embedding.size() > 1) {
    const model::ShardSpec& wte = chunk_.spec("wte");
    ps_.embedding.allreduce_sum(chunk_.grads() + wte.offset, wte.local_numel());
  }
  return loss;
}

double Executor::forward_only(const std::function<MicrobatchTokens(int)>& tokens,
                              int microbatches) {
  double loss = 0;
  for (int mb = 0; mb < microbatches; ++mb) forward_one(0, tokens(mb), mb, 0.0f, false, loss);
  for (auto& p : pending_) wait_all(p);
  return loss;
}

}  // namespace trident::pipeline
