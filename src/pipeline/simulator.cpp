// A discrete-event simulation of a pipeline schedule (see trident/pipeline/simulator.hpp).
#include "trident/pipeline/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

#include "trident/core/error.hpp"
#include "trident/pipeline/lower.hpp"

namespace trident::pipeline {

namespace {

int cost_of(const Action& a, const Costs& c, bool split, int vstage) {
  if (!c.stage_slots.empty()) {
    const Costs::Slots& t = c.stage_slots[std::size_t(vstage)];
    return std::max(1, a.type == ActionType::F ? t.f : a.type == ActionType::W ? t.w
                       : split                 ? t.b_split
                                               : t.b);
  }
  const int base = a.type == ActionType::F ? c.f : a.type == ActionType::W ? c.w
                   : split                 ? c.b_split
                                           : c.b;
  if (c.stage_weight.empty()) return base;
  return std::max(1, int(std::lround(base * c.stage_weight[std::size_t(vstage)])));
}

// Index of (type, chunk, mb) in per-rank tables of 3 * vpp * m entries.
struct ActionIndex {
  int vpp, m;
  int operator()(ActionType t, int chunk, int mb) const {
    return (int(t) * vpp + chunk) * m + mb;
  }
  int operator()(const Action& a) const { return (*this)(a.type, a.chunk, a.mb); }
  int size() const { return 3 * vpp * m; }
};

// The action of type t on virtual stage v, as its rank's list names it.
Action action_on(const Schedule& s, ActionType t, int v, int mb) {
  return {t, mb, s.stage_map().slot(v).chunk};
}

// "stage 0: F0 [B0] F1 | stage 1: ..." with each stage's next action in brackets.
std::string grid_text(const Schedule& s, const std::vector<std::size_t>& next) {
  std::ostringstream os;
  for (int r = 0; r < s.pp; ++r) {
    os << "stage " << r << ":";
    for (std::size_t i = 0; i < s.stages[r].size(); ++i)
      os << (i == next[r] ? " [" : " ") << s.stages[r][i].str() << (i == next[r] ? "]" : "");
    os << (r + 1 < s.pp ? " | " : "");
  }
  return os.str();
}

// A dependency of an action: the action of type `type` on virtual stage `v`, same mb.
struct Dep {
  ActionType type;
  int v;
};

std::vector<Dep> deps_of(const Action& a, int v, int vstages) {
  std::vector<Dep> d;
  if (a.type == ActionType::F && v > 0) d.push_back({ActionType::F, v - 1});
  if (a.type == ActionType::B) {
    d.push_back({ActionType::F, v});
    if (v + 1 < vstages) d.push_back({ActionType::B, v + 1});
  }
  if (a.type == ActionType::W) d.push_back({ActionType::B, v});
  return d;
}

void check_counts_and_order(const Schedule& s, bool split) {
  const ActionIndex idx{s.vpp, s.microbatches};
  for (int r = 0; r < s.pp; ++r) {
    const auto& list = s.stages[r];
    std::vector<int> pos(idx.size(), -1);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      TRIDENT_CHECK(a.mb >= 0 && a.mb < s.microbatches && a.chunk >= 0 && a.chunk < s.vpp,
                    "schedule ", s.name, ": stage ", r, " has out-of-range action ", a.str(),
                    " (", s.microbatches, " microbatches, vpp = ", s.vpp, ")");
      TRIDENT_CHECK(pos[idx(a)] < 0, "schedule ", s.name, ": stage ", r, " runs ", a.str(),
                    " twice (actions ", pos[idx(a)], " and ", i, ")");
      pos[idx(a)] = int(i);
    }
    for (int c = 0; c < s.vpp; ++c)
      for (int mb = 0; mb < s.microbatches; ++mb) {
        for (ActionType t : {ActionType::F, ActionType::B, ActionType::W}) {
          if (t == ActionType::W && !split) continue;
          TRIDENT_CHECK(pos[idx(t, c, mb)] >= 0, "schedule ", s.name, ": stage ", r,
                        " never runs ", Action{t, mb, c}.str(),
                        t == ActionType::W ? " (the schedule splits B and W elsewhere)" : "");
        }
        const int f = pos[idx(ActionType::F, c, mb)], b = pos[idx(ActionType::B, c, mb)];
        TRIDENT_CHECK(f < b, "schedule ", s.name, ": stage ", r, " runs ", list[b].str(),
                      " (action ", b, ") before its forward ", list[f].str(), " (action ", f,
                      ")");
        if (split) {
          const int w = pos[idx(ActionType::W, c, mb)];
          TRIDENT_CHECK(b < w, "schedule ", s.name, ": stage ", r, " runs ", list[w].str(),
                        " (action ", w, ") before its backward ", list[b].str(), " (action ",
                        b, ")");
        }
      }
  }
}

// MPI matches messages between two ranks on one tag in send order. Checks that on every
// link (src rank, dst rank, activations or gradients) the sender produces the messages in
// the order the receiver consumes them.
void check_message_order(const Schedule& s) {
  const int vstages = s.pp * s.vpp;
  const StageMap map = s.stage_map();
  enum Kind { kActivation, kGradient };
  using Link = std::tuple<int, int, int>;         // src rank, dst rank, kind
  using Message = std::pair<int, int>;            // mb, producing virtual stage
  std::map<Link, std::vector<Message>> sent, received;
  for (int r = 0; r < s.pp; ++r)
    for (const Action& a : s.stages[r]) {
      const int v = map.virtual_stage(r, a.chunk);
      if (a.type == ActionType::F) {
        if (v + 1 < vstages) sent[{r, map.rank_of(v + 1), kActivation}].push_back({a.mb, v});
        if (v > 0) received[{map.rank_of(v - 1), r, kActivation}].push_back({a.mb, v - 1});
      } else if (a.type == ActionType::B) {
        if (v > 0) sent[{r, map.rank_of(v - 1), kGradient}].push_back({a.mb, v});
        if (v + 1 < vstages)
          received[{map.rank_of(v + 1), r, kGradient}].push_back({a.mb, v + 1});
      }
    }
  for (const auto& [link, out] : sent) {
    const auto& in = received[link];
    const auto [src, dst, kind] = link;
    const ActionType t = kind == kActivation ? ActionType::F : ActionType::B;
    const int step = kind == kActivation ? 1 : -1;  // consumer's virtual stage - producer's
    for (std::size_t i = 0; i < out.size() && i < in.size(); ++i) {
      if (out[i] == in[i]) continue;
      fail("schedule ", s.name, ": stage ", src, " sends stage ", dst, " the ",
           kind == kActivation ? "activations" : "gradients", " of its ",
           action_on(s, t, out[i].second, out[i].first).str(), " before those of its ",
           action_on(s, t, in[i].second, in[i].first).str(), ", but stage ", dst, " runs ",
           action_on(s, t, in[i].second + step, in[i].first).str(), " before ",
           action_on(s, t, out[i].second + step, out[i].first).str(),
           " (MPI matches a link's messages in send order)");
    }
  }
}

}  // namespace

Simulation simulate(const Schedule& s, const Costs& costs) {
  TRIDENT_CHECK(s.pp >= 1 && s.vpp >= 1 && s.microbatches >= 1, "schedule ", s.name,
                ": pp, vpp and microbatches must be positive (got ", s.pp, ", ", s.vpp, ", ",
                s.microbatches, ")");
  TRIDENT_CHECK(int(s.stages.size()) == s.pp, "schedule ", s.name, " has ", s.stages.size(),
                " stage lists for pp = ", s.pp);
  const bool split = splits_weight_grad(s);
  check_counts_and_order(s, split);

  const int vstages = s.pp * s.vpp;
  const StageMap map = s.stage_map();
  TRIDENT_CHECK(costs.stage_weight.empty() || int(costs.stage_weight.size()) == vstages,
                "schedule ", s.name, ": ", costs.stage_weight.size(),
                " stage weights for pp * vpp = ", vstages, " virtual stages");
  TRIDENT_CHECK(costs.stage_slots.empty() || int(costs.stage_slots.size()) == vstages,
                "schedule ", s.name, ": ", costs.stage_slots.size(),
                " stage slot sets for pp * vpp = ", vstages, " virtual stages");
  // finish[type][virtual stage][mb]: when the action's result is available, -1 until then.
  const ActionIndex vidx{vstages, s.microbatches};
  std::vector<int> finish(vidx.size(), -1);

  // The lowered lists (lower.hpp): a compute action waits for its receive, whose message
  // leaves when the sender's send op runs (buffered sends, blocking receives).
  const LoweredSchedule low = lower(s);
  std::vector<int> sent(std::size_t(2 * s.microbatches * vstages), -1);  // [tag] -> slot
  const ActionIndex idx{s.vpp, s.microbatches};
  std::vector<std::vector<int>> recv_tag(s.pp, std::vector<int>(idx.size(), -1));

  Simulation sim;
  sim.start.resize(s.pp);
  std::vector<std::size_t> next(s.pp, 0), next_op(s.pp, 0);
  std::vector<int> free_at(s.pp, 0), busy(s.pp, 0);
  std::size_t remaining = 0;
  for (const auto& ops : low.ranks) remaining += ops.size();
  // Start times depend only on each rank's previous action and its receives, so the order
  // in which ranks are visited does not change the result.
  while (remaining > 0) {
    bool progress = false;
    for (int r = 0; r < s.pp; ++r) {
      if (next_op[r] == low.ranks[r].size()) continue;
      const Op& op = low.ranks[r][next_op[r]];
      if (op.kind == OpKind::recv) {
        recv_tag[r][idx(op.action)] = op.tag;
      } else if (op.kind == OpKind::send) {
        sent[std::size_t(op.tag)] = free_at[r];  // right after the action that produced it
      } else {
        const Action& a = op.action;
        int ready = free_at[r];
        if (const int tag = recv_tag[r][idx(a)]; tag >= 0) {
          const int at = sent[std::size_t(tag)];
          if (at < 0) continue;  // not sent yet
          const int producer = (a.type == ActionType::F ? -1 : 1) + map.virtual_stage(r, a.chunk);
          ready = std::max(ready, at + (map.rank_of(producer) == r ? 0 : costs.comm));
        }
        const int c = cost_of(a, costs, split, map.virtual_stage(r, a.chunk));
        sim.start[r].push_back(ready);
        finish[vidx(a.type, map.virtual_stage(r, a.chunk), a.mb)] = ready + c;
        free_at[r] = ready + c;
        busy[r] += c;
        ++next[r];
      }
      ++next_op[r];
      --remaining;
      progress = true;
    }
    if (!progress) {
      std::ostringstream stuck;
      for (int r = 0; r < s.pp; ++r) {
        if (next[r] == s.stages[r].size()) continue;
        const Action& a = s.stages[r][next[r]];
        const int v = map.virtual_stage(r, a.chunk);
        for (const Dep& d : deps_of(a, v, vstages))
          if (finish[vidx(d.type, d.v, a.mb)] < 0) {
            stuck << (stuck.tellp() > 0 ? ", " : "") << "stage " << r << " is stuck on "
                  << a.str() << " (action " << next[r] << ", waiting for "
                  << action_on(s, d.type, d.v, a.mb).str() << " of stage " << map.rank_of(d.v)
                  << ")";
            break;
          }
      }
      fail("schedule ", s.name, " deadlocks: ", stuck.str(), "; next actions in brackets: ",
           grid_text(s, next));
    }
  }
  check_message_order(s);

  sim.makespan = *std::max_element(free_at.begin(), free_at.end());
  sim.asynchronous = weight_update_of(s.name) != WeightUpdate::flush;
  long total_busy = 0;
  for (int r = 0; r < s.pp; ++r) {
    total_busy += busy[r];
    sim.peak_activations.push_back(peak_activations(s.stages[r]));
    sim.weight_versions.push_back(weight_versions(s.stages[r], weight_update_of(s.name)));
    sim.idle_fraction.push_back(sim.makespan > 0 ? 1.0 - double(busy[r]) / sim.makespan : 0);
  }
  sim.bubble_fraction =
      sim.makespan > 0 ? 1.0 - double(total_busy) / (double(s.pp) * sim.makespan) : 0;
  return sim;
}

std::string format_timeline(const Schedule& s, const Simulation& sim, const Costs& costs) {
  const bool split = splits_weight_grad(s);
  std::vector<std::vector<std::string>> cells(s.pp, std::vector<std::string>(sim.makespan));
  std::size_t width = std::to_string(std::max(0, sim.makespan - 1)).size();
  for (int r = 0; r < s.pp; ++r)
    for (std::size_t i = 0; i < s.stages[r].size(); ++i) {
      const Action& a = s.stages[r][i];
      const int c = cost_of(a, costs, split, s.stage_map().virtual_stage(r, a.chunk));
      for (int t = 0; t < c; ++t) cells[r][sim.start[r][i] + t] = a.str();
      width = std::max(width, a.str().size());
    }
  const std::string last_label = "stage " + std::to_string(s.pp - 1);
  auto pad = [](const std::string& text, std::size_t w) {
    return text + std::string(w > text.size() ? w - text.size() : 0, ' ');
  };
  auto row = [&](const std::string& label, const std::vector<std::string>& row_cells) {
    std::string line = pad(label, last_label.size()) + " |";
    for (const auto& cell : row_cells) line += ' ' + pad(cell, width);
    return line.erase(line.find_last_not_of(' ') + 1) + '\n';  // no trailing blanks
  };
  std::vector<std::string> slots;
  for (int t = 0; t < sim.makespan; ++t) slots.push_back(std::to_string(t));
  std::string out = row("slot", slots);
  for (int r = 0; r < s.pp; ++r) out += row("stage " + std::to_string(r), cells[r]);
  return out;
}

}  // namespace trident::pipeline
