// A schedule lowered to per-rank compute and communication (see trident/pipeline/lower.hpp).
#include "trident/pipeline/lower.hpp"

#include <algorithm>
#include <map>
#include <tuple>

namespace trident::pipeline {

std::string Op::str() const {
  if (kind == OpKind::compute) return action.str();
  const char* what = payload == Payload::activation ? " act" : " grad";
  return std::string(kind == OpKind::send ? "send " : "recv ") + action.str() + what +
         (kind == OpKind::send ? ">" : "<") + std::to_string(peer);
}

int message_tag(const Schedule& s, int mb, int receiver_vstage, Payload payload) {
  return 2 * (mb * s.pp * s.vpp + receiver_vstage) + (payload == Payload::gradient ? 1 : 0);
}

LoweredSchedule lower(const Schedule& s) {
  const int vstages = s.pp * s.vpp;
  const StageMap map = s.stage_map();
  // Where each action stands in its rank's list: (rank, type, chunk, mb) -> index.
  std::map<std::tuple<int, int, int, int>, int> index;
  for (int r = 0; r < int(s.stages.size()); ++r)
    for (std::size_t i = 0; i < s.stages[r].size(); ++i) {
      const Action& a = s.stages[r][i];
      index.emplace(std::make_tuple(r, int(a.type), a.chunk, a.mb), int(i));
    }
  // Per rank and compute index: the sends after it, and the receives posted before it
  // (with their consumer's index, to post them in the order they are consumed).
  std::vector<std::vector<std::vector<Op>>> sends(s.stages.size());
  std::vector<std::vector<std::vector<std::pair<int, Op>>>> receives(s.stages.size());
  for (std::size_t r = 0; r < s.stages.size(); ++r) {
    sends[r].resize(s.stages[r].size());
    receives[r].resize(s.stages[r].size());
  }
  for (int r = 0; r < int(s.stages.size()); ++r)
    for (std::size_t i = 0; i < s.stages[r].size(); ++i) {
      const Action& a = s.stages[r][i];
      const int v = map.virtual_stage(r, a.chunk);
      int to = -1;  // the virtual stage the message goes to
      Payload payload = Payload::activation;
      if (a.type == ActionType::F && v + 1 < vstages) {
        to = v + 1;
      } else if (a.type == ActionType::B && v > 0) {
        to = v - 1;
        payload = Payload::gradient;
      }
      if (to < 0) continue;
      const StageSlot dest = map.slot(to);
      const int peer = dest.rank, tag = message_tag(s, a.mb, to, payload);
      sends[r][i].push_back(Op{OpKind::send, a, payload, peer, tag});
      // The sender inserts its peer's receive (a consumer the peer's list lacks is the
      // simulator's to report).
      const Action consumer{a.type, a.mb, dest.chunk};
      auto it = index.find(std::make_tuple(peer, int(a.type), consumer.chunk, consumer.mb));
      if (it == index.end()) continue;
      const int at = std::max(0, it->second - kReceiveLead);
      receives[peer][at].push_back({it->second, Op{OpKind::recv, consumer, payload, r, tag}});
    }
  LoweredSchedule l{s, std::vector<std::vector<Op>>(s.stages.size())};
  for (std::size_t r = 0; r < s.stages.size(); ++r)
    for (std::size_t i = 0; i < s.stages[r].size(); ++i) {
      auto& recv = receives[r][i];
      std::sort(recv.begin(), recv.end(),
                [](const auto& x, const auto& y) { return x.first < y.first; });
      for (const auto& [consumer, op] : recv) l.ranks[r].push_back(op);
      Op compute{OpKind::compute, s.stages[r][i]};
      compute.index = int(i);
      l.ranks[r].push_back(compute);
      for (const Op& op : sends[r][i]) l.ranks[r].push_back(op);
    }
  return l;
}

std::string format_lowered(const LoweredSchedule& l) {
  std::string out;
  for (std::size_t r = 0; r < l.ranks.size(); ++r) {
    out += "stage " + std::to_string(r) + ":";
    for (std::size_t i = 0; i < l.ranks[r].size(); ++i)
      out += (i ? " | " : " ") + l.ranks[r][i].str();
    out += "\n";
  }
  return out;
}

}  // namespace trident::pipeline
