// What a schedule makes one pipeline rank hold (see trident/pipeline/stage_memory.hpp).
#include "trident/pipeline/stage_memory.hpp"

#include <algorithm>
#include <map>

#include "trident/pipeline/lower.hpp"
#include "trident/pipeline/simulator.hpp"

namespace trident::pipeline {

MessageBuffers peak_message_buffers(const Schedule& s, int rank) {
  const Simulation sim = simulate(s);
  const LoweredSchedule low = lower(s);
  MessageBuffers peak;
  if (rank < 0 || rank >= s.pp || s.pp == 1) return peak;

  // Receives: walk the list; a receive holds its buffer from its post to its consumer.
  int posted = 0;
  for (const Op& op : low.ranks[std::size_t(rank)]) {
    if (op.kind == OpKind::recv) peak.receives = std::max(peak.receives, ++posted);
    if (op.kind != OpKind::compute) continue;
    for (const Op& other : low.ranks[std::size_t(rank)])  // did it consume a posted one?
      if (other.kind == OpKind::recv && other.action == op.action) --posted;
  }

  // Sends, on the timeline: the end of compute action i of rank r is taken as the start of
  // the next one (the makespan for the last). The sender sends then; the message moves once
  // the receiver has posted the receive (when it reaches it in its list) and made progress
  // in MPI after its next compute action (Executor::progress); the sender reaps the buffer
  // at the end of its first compute action after that.
  auto end_of = [&](int r, int i) {
    const auto& start = sim.start[std::size_t(r)];
    return std::size_t(i) + 1 < start.size() ? start[std::size_t(i) + 1] : sim.makespan;
  };
  std::map<int, int> moved;  // tag -> when its receiver lets the message move
  for (int r = 0; r < s.pp; ++r) {
    const auto& ops = low.ranks[std::size_t(r)];
    for (std::size_t k = 0; k < ops.size(); ++k) {
      if (ops[k].kind != OpKind::recv) continue;
      std::size_t next = k;
      while (ops[next].kind != OpKind::compute) ++next;  // a receive precedes its consumer
      moved[ops[k].tag] = end_of(r, ops[next].index);
    }
  }
  std::vector<std::pair<int, int>> held;  // [sent, reaped) of each send of `rank`
  int last_compute = -1;
  for (const Op& op : low.ranks[std::size_t(rank)]) {
    if (op.kind == OpKind::compute) last_compute = op.index;
    if (op.kind != OpKind::send) continue;
    const int sent = end_of(rank, last_compute);
    const auto at = moved.find(op.tag);
    const int ready = std::max(sent, at == moved.end() ? sent : at->second);
    int reaped = sim.makespan + 1;  // waited for at the end of the step
    for (std::size_t j = 0; j < s.stages[std::size_t(rank)].size(); ++j)
      if (int(j) > last_compute && end_of(rank, int(j)) > ready) {
        reaped = end_of(rank, int(j));
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

void set_schedule_memory(model::MemoryLayout& layout, const Schedule& s, int rank) {
  const std::vector<Action>& actions = s.stages.at(std::size_t(rank));
  layout.peak_stash = peak_activations(actions);
  layout.split_backward = splits_weight_grad(s);
  layout.weight_versions = weight_versions(actions, weight_update_of(s.name));
  layout.message_buffers = peak_message_buffers(s, rank).total();
}

}  // namespace trident::pipeline
