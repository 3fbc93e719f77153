// What a schedule makes one pipeline rank hold (see trident/pipeline/stage_memory.hpp).
#include "trident/pipeline/stage_memory.hpp"

#include <algorithm>
#include <map>

#include "trident/pipeline/lower.hpp"
#include "trident/pipeline/simulator.hpp"

namespace trident::pipeline {

namespace {

// When compute action i of rank r ends on the simulated timeline: the start of its next one
// (the makespan for the last).
int end_of(const Simulation& sim, int r, int i) {
  const auto& start = sim.start[std::size_t(r)];
  return std::size_t(i) + 1 < start.size() ? start[std::size_t(i) + 1] : sim.makespan;
}

// One rank's peak, given the whole schedule's simulation, lowering and message timeline.
MessageBuffers rank_peak(const Schedule& s, const Simulation& sim, const LoweredSchedule& low,
                         const std::map<int, int>& moved, int rank) {
  MessageBuffers peak;
  // Receives: walk the list; a receive holds its buffer from its post to its consumer.
  int posted = 0;
  for (const Op& op : low.ranks[std::size_t(rank)]) {
    if (op.kind == OpKind::recv) peak.receives = std::max(peak.receives, ++posted);
    if (op.kind != OpKind::compute) continue;
    for (const Op& other : low.ranks[std::size_t(rank)])  // did it consume a posted one?
      if (other.kind == OpKind::recv && other.action == op.action) --posted;
  }

  // Sends (see message_moves for the timeline): a send's buffer is held from the end of
  // the compute action before it until the sender reaps it at the end of its first compute
  // action after the message could move.
  std::vector<std::pair<int, int>> held;  // [sent, reaped) of each send of `rank`
  int last_compute = -1;
  for (const Op& op : low.ranks[std::size_t(rank)]) {
    if (op.kind == OpKind::compute) last_compute = op.index;
    if (op.kind != OpKind::send) continue;
    const int sent = end_of(sim, rank, last_compute);
    const auto at = moved.find(op.tag);
    const int ready = std::max(sent, at == moved.end() ? sent : at->second);
    int reaped = sim.makespan + 1;  // waited for at the end of the step
    for (std::size_t j = 0; j < s.stages[std::size_t(rank)].size(); ++j)
      if (int(j) > last_compute && end_of(sim, rank, int(j)) > ready) {
        reaped = end_of(sim, rank, int(j));
        break;
      }
    held.push_back({sent, reaped});
  }
  for (const auto& [at, unused] : held) {
    int n = 0;
    for (const auto& [from, to] : held) n += from <= at && at < to;
    peak.sends = std::max(peak.sends, n);
  }
  return peak;
}

}  // namespace

std::vector<MessageBuffers> peak_message_buffers(const Schedule& s) {
  std::vector<MessageBuffers> peaks(std::size_t(s.pp));
  if (s.pp == 1) return peaks;
  const Simulation sim = simulate(s);
  const LoweredSchedule low = lower(s);
  // The timeline: the end of compute action i of rank r is taken as the start of the next
  // one (the makespan for the last). A message moves once its receiver has posted the
  // receive (when it reaches it in its list) and made progress in MPI after its next
  // compute action (Executor::progress).
  std::map<int, int> moved;  // tag -> when its receiver lets the message move
  for (int r = 0; r < s.pp; ++r) {
    const auto& ops = low.ranks[std::size_t(r)];
    for (std::size_t k = 0; k < ops.size(); ++k) {
      if (ops[k].kind != OpKind::recv) continue;
      std::size_t next = k;
      while (ops[next].kind != OpKind::compute) ++next;  // a receive precedes its consumer
      moved[ops[k].tag] = end_of(sim, r, ops[next].index);
    }
  }
  for (int r = 0; r < s.pp; ++r) peaks[std::size_t(r)] = rank_peak(s, sim, low, moved, r);
  return peaks;
}

std::vector<RankScheduleMemory> schedule_memory(const Schedule& s) {
  const std::vector<MessageBuffers> messages = peak_message_buffers(s);
  const bool split = splits_weight_grad(s);
  const WeightUpdate update = weight_update_of(s.name);
  std::vector<RankScheduleMemory> ranks(std::size_t(s.pp));
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    ranks[r].peak_stash = peak_activations(s.stages[r]);
    ranks[r].split_backward = split;
    ranks[r].weight_versions = weight_versions(s.stages[r], update);
    ranks[r].message_buffers = messages[r].total();
    ranks[r].head_gradients = peak_head_gradients(s.stages[r], head_chunk_of(s, int(r)));
  }
  return ranks;
}

void set_schedule_memory(model::MemoryLayout& layout, const Schedule& s,
                         const RankScheduleMemory& rank) {
  layout.placement = s.placement;
  layout.peak_stash = rank.peak_stash;
  layout.split_backward = rank.split_backward;
  layout.weight_versions = rank.weight_versions;
  layout.message_buffers = rank.message_buffers;
  layout.head_gradients = rank.head_gradients;
}

void set_schedule_memory(model::MemoryLayout& layout, const Schedule& s, int rank) {
  set_schedule_memory(layout, s, schedule_memory(s).at(std::size_t(rank)));
}

}  // namespace trident::pipeline
