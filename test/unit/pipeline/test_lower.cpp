// The lowering of schedules into per-rank compute, send and receive lists (lower.hpp):
// golden files of the lowered schedules, and the rules every lowering keeps.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>

#include "trident/pipeline/lower.hpp"
#include "trident/pipeline/simulator.hpp"

using namespace trident::pipeline;

namespace {

struct Case {
  const char* name;
  int pp, vpp, m;
};

const Case kCases[] = {
    {"gpipe", 2, 1, 4},      {"1f1b", 2, 1, 4},       {"zb-h1", 2, 1, 4},
    {"interleaved-1f1b", 2, 2, 4}, {"looped-bfs", 2, 2, 2}, {"1f1b", 4, 1, 8},
    {"pipedream-2bw", 3, 1, 4}, {"pipedream", 3, 1, 4}, {"zb-v", 2, 2, 4},
};

std::string lowered_text() {
  std::string out;
  for (const Case& c : kCases) {
    out += "# " + std::string(c.name) + " pp=" + std::to_string(c.pp) + " vpp=" +
           std::to_string(c.vpp) + " m=" + std::to_string(c.m) + "\n";
    out += format_lowered(lower(make_schedule(c.name, c.pp, c.vpp, c.m)));
  }
  return out;
}

}  // namespace

// test/unit/pipeline/golden/lowered.txt holds the lowered lists; TRIDENT_UPDATE_GOLDEN=1
// rewrites it (then review the diff).
TEST(Lower, LoweredSchedulesMatchTheGoldenFile) {
  const std::string path = std::string(TRIDENT_SOURCE_DIR) + "/test/unit/pipeline/golden/lowered.txt";
  const std::string text = lowered_text();
  if (const char* u = std::getenv("TRIDENT_UPDATE_GOLDEN"); u && std::string(u) == "1") {
    std::ofstream(path) << text;
    GTEST_SKIP() << "rewrote " << path;
  }
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  std::stringstream golden;
  golden << f.rdbuf();
  EXPECT_EQ(text, golden.str());
}

// Every schedule at several shapes: the computes are the schedule's list; each send has one
// receive on its peer with the same tag, posted before its consumer and kReceiveLead compute
// actions ahead of it where there are that many.
TEST(Lower, EverySendHasItsReceivePostedAhead) {
  for (const std::string& name : schedule_names())
    for (int pp : {1, 2, 4})
      for (int vpp : {1, 2}) {
        if (vpp > 1 && (pp < 2 || (name != "interleaved-1f1b" && name != "looped-bfs" &&
                                   name != "zb-v")))
          continue;
        if (name == "zb-v" && vpp != 2) continue;
        const Schedule s = make_schedule(name, pp, vpp, 4);
        const LoweredSchedule l = lower(s);
        const std::string at = name + " pp=" + std::to_string(pp) + " vpp=" + std::to_string(vpp);
        ASSERT_EQ(l.ranks.size(), std::size_t(pp)) << at;
        std::map<int, std::tuple<int, int, Action>> sends;  // tag -> from, to, producer
        std::map<int, int> receives;                        // tag -> rank
        for (int r = 0; r < pp; ++r) {
          std::vector<Action> computes;
          std::map<int, int> posted_at;  // tag -> computes seen before the receive
          for (const Op& op : l.ranks[r]) {
            if (op.kind == OpKind::compute) {
              EXPECT_EQ(op.index, int(computes.size())) << at;
              computes.push_back(op.action);
            } else if (op.kind == OpKind::send) {
              EXPECT_EQ(op.action, computes.back()) << at << ": a send follows its action";
              EXPECT_TRUE(sends.emplace(op.tag, std::make_tuple(r, op.peer, op.action)).second)
                  << at << ": tag " << op.tag << " sent twice";
            } else {
              EXPECT_TRUE(receives.emplace(op.tag, r).second) << at << ": tag " << op.tag;
              posted_at[op.tag] = int(computes.size());
              // Its consumer comes later in this list, kReceiveLead computes ahead at most.
              const auto& list = s.stages[r];
              int consumer = -1;
              for (std::size_t i = 0; i < list.size(); ++i)
                if (list[i] == op.action) consumer = int(i);
              ASSERT_GE(consumer, int(computes.size())) << at << ": " << op.str();
              EXPECT_EQ(int(computes.size()), std::max(0, consumer - kReceiveLead))
                  << at << ": " << op.str();
            }
          }
          EXPECT_EQ(computes, s.stages[r]) << at;
        }
        ASSERT_EQ(sends.size(), receives.size()) << at;
        for (const auto& [tag, send] : sends) {
          ASSERT_TRUE(receives.count(tag)) << at << ": tag " << tag << " never received";
          EXPECT_EQ(receives[tag], std::get<1>(send)) << at << ": tag " << tag;
        }
        EXPECT_NO_THROW(simulate(s)) << at;
      }
}
