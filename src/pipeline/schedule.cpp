// Schedule generators (see trident/pipeline/schedule.hpp). The multi-stage generators
// (interleaved-1f1b, looped-bfs, zb-h1 across stages) belong to the pipeline issue; on a
// single stage every schedule reduces to "forward then backward, one microbatch at a time"
// or, for gpipe, "all forwards then all backwards".
#include "trident/pipeline/schedule.hpp"

#include <algorithm>

#include "trident/core/error.hpp"

namespace trident::pipeline {

std::string Action::str() const {
  const char* t = type == ActionType::F ? "F" : type == ActionType::B ? "B" : "W";
  std::string s = t + std::to_string(mb);
  if (chunk != 0) s += "." + std::to_string(chunk);
  return s;
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names{"naive", "gpipe", "1f1b",
                                              "interleaved-1f1b", "looped-bfs", "zb-h1"};
  return names;
}

namespace {

// GPipe: all forwards, then all backwards (in the same microbatch order).
std::vector<Action> gpipe_stage(int m) {
  std::vector<Action> a;
  for (int i = 0; i < m; ++i) a.push_back({ActionType::F, i, 0});
  for (int i = 0; i < m; ++i) a.push_back({ActionType::B, i, 0});
  return a;
}

// PipeDream-Flush 1F1B: (pp - stage - 1) warm-up forwards, then one forward one backward,
// then the cool-down backwards.
std::vector<Action> one_f_one_b_stage(int pp, int stage, int m) {
  std::vector<Action> a;
  const int warmup = std::min(m, pp - stage - 1);
  int f = 0, b = 0;
  for (; f < warmup; ++f) a.push_back({ActionType::F, f, 0});
  while (f < m) {
    a.push_back({ActionType::F, f++, 0});
    a.push_back({ActionType::B, b++, 0});
  }
  while (b < m) a.push_back({ActionType::B, b++, 0});
  return a;
}

}  // namespace

Schedule make_schedule(const std::string& name, int pp, int vpp, int m) {
  TRIDENT_CHECK(std::find(schedule_names().begin(), schedule_names().end(), name) !=
                    schedule_names().end(),
                "unknown schedule '", name,
                "' (expected naive, gpipe, 1f1b, interleaved-1f1b, looped-bfs or zb-h1)");
  TRIDENT_CHECK(pp >= 1 && vpp >= 1 && m >= 1, "schedule ", name, ": pp, vpp and microbatches "
                "must be positive (got ", pp, ", ", vpp, ", ", m, ")");
  Schedule s{name, pp, vpp, m, {}};
  if (name == "gpipe") {
    for (int r = 0; r < pp; ++r) s.stages.push_back(gpipe_stage(m));
  } else if (vpp == 1 && (pp == 1 || name == "1f1b" || name == "naive")) {
    // naive over one stage is 1F1B's order; multi-stage naive and the rest come with the
    // pipeline executor.
    TRIDENT_CHECK(name != "naive" || pp == 1, "schedule naive with pp > 1 is not available yet");
    for (int r = 0; r < pp; ++r) s.stages.push_back(one_f_one_b_stage(pp, r, m));
  } else {
    fail("schedule ", name, " with pp = ", pp, ", vpp = ", vpp,
         " is not available yet (this build runs one pipeline stage)");
  }
  return s;
}

int peak_activations(const std::vector<Action>& actions) {
  int live = 0, peak = 0;
  for (const auto& a : actions) {
    if (a.type == ActionType::F) peak = std::max(peak, ++live);
    if (a.type == ActionType::B) --live;
  }
  return peak;
}

}  // namespace trident::pipeline
