// A discrete-event simulation of a pipeline schedule (see trident/pipeline/simulator.hpp).
#include "trident/pipeline/simulator.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "trident/core/error.hpp"

namespace trident::pipeline {

namespace {

using Key = std::tuple<int, int, int, int>;  // type, virtual stage, mb, 0

bool splits_w(const Schedule& s) {
  for (const auto& st : s.stages)
    for (const auto& a : st)
      if (a.type == ActionType::W) return true;
  return false;
}

int cost_of(const Action& a, const Costs& c, bool split) {
  if (a.type == ActionType::F) return c.f;
  if (a.type == ActionType::W) return c.w;
  return split ? c.b_split : c.b;
}

// Virtual stage of (rank, chunk): chunks are placed round-robin over the ranks.
int virtual_stage(const Schedule& s, int rank, int chunk) { return chunk * s.pp + rank; }

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

}  // namespace

Simulation simulate(const Schedule& s, const Costs& costs) {
  const bool split = splits_w(s);
  const int vstages = s.pp * s.vpp;
  // Each (type, virtual stage, mb) exactly once.
  std::map<Key, int> finish;  // when the action's result is available
  for (int r = 0; r < s.pp; ++r) {
    std::map<Key, int> seen;
    for (const auto& a : s.stages[r]) {
      TRIDENT_CHECK(a.mb >= 0 && a.mb < s.microbatches && a.chunk >= 0 && a.chunk < s.vpp,
                    "schedule ", s.name, ": stage ", r, " has out-of-range action ", a.str());
      Key k{int(a.type), virtual_stage(s, r, a.chunk), a.mb, 0};
      TRIDENT_CHECK(++seen[k] == 1, "schedule ", s.name, ": stage ", r, " runs ", a.str(),
                    " twice");
    }
    const std::size_t expected =
        std::size_t(s.microbatches) * std::size_t(s.vpp) * (split ? 3u : 2u);
    TRIDENT_CHECK(s.stages[r].size() == expected, "schedule ", s.name, ": stage ", r, " has ",
                  s.stages[r].size(), " actions, expected ", expected);
  }

  Simulation sim;
  sim.start.resize(s.pp);
  sim.peak_activations.assign(s.pp, 0);
  std::vector<std::size_t> next(s.pp, 0);
  std::vector<int> free_at(s.pp, 0), live(s.pp, 0);
  std::size_t remaining = 0;
  for (const auto& st : s.stages) remaining += st.size();
  int busy = 0;
  while (remaining > 0) {
    bool progress = false;
    for (int r = 0; r < s.pp; ++r) {
      if (next[r] == s.stages[r].size()) continue;
      const Action& a = s.stages[r][next[r]];
      const int v = virtual_stage(s, r, a.chunk);
      std::vector<Key> deps;
      if (a.type == ActionType::F && v > 0) deps.push_back({int(ActionType::F), v - 1, a.mb, 0});
      if (a.type == ActionType::B) {
        deps.push_back({int(ActionType::F), v, a.mb, 0});
        if (v + 1 < vstages) deps.push_back({int(ActionType::B), v + 1, a.mb, 0});
      }
      if (a.type == ActionType::W) deps.push_back({int(ActionType::B), v, a.mb, 0});
      int ready = free_at[r];
      bool ok = true;
      for (const auto& d : deps) {
        auto it = finish.find(d);
        if (it == finish.end()) {
          ok = false;
          break;
        }
        ready = std::max(ready, it->second);
      }
      if (!ok) continue;
      const int c = cost_of(a, costs, split);
      sim.start[r].push_back(ready);
      finish[{int(a.type), v, a.mb, 0}] = ready + c;
      free_at[r] = ready + c;
      busy += c;
      if (a.type == ActionType::F) sim.peak_activations[r] = std::max(sim.peak_activations[r], ++live[r]);
      if (a.type == (split ? ActionType::W : ActionType::B)) --live[r];
      ++next[r];
      --remaining;
      progress = true;
    }
    TRIDENT_CHECK(progress, "schedule ", s.name, " deadlocks; next actions in brackets: ",
                  grid_text(s, next));
  }
  sim.makespan = *std::max_element(free_at.begin(), free_at.end());
  sim.bubble_fraction = 1.0 - double(busy) / (double(s.pp) * sim.makespan);
  return sim;
}

std::string format_timeline(const Schedule& s, const Simulation& sim, const Costs& costs) {
  const bool split = splits_w(s);
  std::vector<std::vector<std::string>> cells(s.pp, std::vector<std::string>(sim.makespan));
  std::size_t width = 2;
  for (int r = 0; r < s.pp; ++r)
    for (std::size_t i = 0; i < s.stages[r].size(); ++i) {
      const Action& a = s.stages[r][i];
      const int c = cost_of(a, costs, split);
      for (int t = 0; t < c; ++t) cells[r][sim.start[r][i] + t] = a.str();
      width = std::max(width, a.str().size());
    }
  std::ostringstream os;
  for (int r = 0; r < s.pp; ++r) {
    os << "stage " << r << " |";
    for (const auto& cell : cells[r]) os << ' ' << cell << std::string(width - cell.size(), ' ');
    os << '\n';
  }
  return os.str();
}

}  // namespace trident::pipeline
