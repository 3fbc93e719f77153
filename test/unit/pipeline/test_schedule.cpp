// Schedules against the simulator and the closed-form bubbles. Costs are the simulator's
// defaults per chunk: F = 1, B = 2, or B = 1 and W = 1 when a schedule splits them.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <string>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/pipeline/simulator.hpp"

using namespace trident::pipeline;

namespace {

struct Case {
  std::string name;
  int pp, vpp, m;
};

std::string label(const Case& c) {
  return c.name + " pp=" + std::to_string(c.pp) + " vpp=" + std::to_string(c.vpp) +
         " m=" + std::to_string(c.m);
}

// Every valid combination of the grid: pp in {2,4}, m in {1,2,4,8}, vpp in {1,2}
// for the schedules that take chunks, plus pp = 1; zb-v at vpp = 2 only.
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& name : schedule_names())
    for (int pp : {1, 2, 4})
      for (int vpp : {1, 2})
        for (int m : {1, 2, 4, 8}) {
          const bool chunks = name == "interleaved-1f1b" || name == "looped-bfs" || name == "zb-v";
          if (vpp > 1 && !chunks) continue;
          if (name == "zb-v" && vpp != 2) continue;
          if (name == "interleaved-1f1b" && vpp > 1 && m % pp != 0) continue;
          cases.push_back({name, pp, vpp, m});
        }
  return cases;
}

int max_of(const std::vector<int>& v) { return *std::max_element(v.begin(), v.end()); }

std::string error_of(const Schedule& s) {
  try {
    simulate(s);
  } catch (const trident::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Schedule, SingleStageRunsForwardThenBackwardPerMicrobatch) {
  auto s = make_schedule("1f1b", 1, 1, 3);
  ASSERT_EQ(s.stages.size(), 1u);
  EXPECT_EQ(format_actions(s.stages[0]), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(peak_activations(s.stages[0]), 1);
  auto sim = simulate(s);
  EXPECT_EQ(sim.makespan, 9);
  EXPECT_DOUBLE_EQ(sim.bubble_fraction, 0.0);
}

TEST(Schedule, EveryScheduleIsAcceptedWithConsistentMeasures) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(label(c));
    Schedule s;
    ASSERT_NO_THROW(s = make_schedule(c.name, c.pp, c.vpp, c.m));
    EXPECT_EQ(int(s.stages.size()), c.pp);
    EXPECT_EQ(splits_weight_grad(s), c.name == "zb-h1" || c.name == "zb-v");
    Simulation sim;
    ASSERT_NO_THROW(sim = simulate(s));
    // Every rank does the same work, so idle = makespan - work on each, and the bubble is
    // the mean of the per-stage idle fractions.
    const int work = c.m * c.vpp * 3;
    double idle = 0;
    for (int r = 0; r < c.pp; ++r) {
      EXPECT_NEAR(sim.idle_fraction[r], 1.0 - double(work) / sim.makespan, 1e-12);
      idle += sim.idle_fraction[r];
      EXPECT_EQ(sim.peak_activations[r], peak_activations(s.stages[r]));
    }
    EXPECT_NEAR(sim.bubble_fraction, idle / c.pp, 1e-12);
  }
}

TEST(Schedule, GPipeAndOneFOneBHaveTheClosedFormBubble) {
  // With F=1, B=2: bubble = (p-1) / (m + p - 1) for both; 1F1B holds at most p activations.
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 4, 5, 8}) {
      for (const char* name : {"gpipe", "1f1b", "interleaved-1f1b"}) {  // vpp = 1: 1F1B
        auto sim = simulate(make_schedule(name, p, 1, m));
        EXPECT_NEAR(sim.bubble_fraction, double(p - 1) / (m + p - 1), 1e-12)
            << name << " p=" << p << " m=" << m;
        EXPECT_EQ(sim.makespan, 3 * (m + p - 1));
      }
      auto one = simulate(make_schedule("1f1b", p, 1, m));
      for (int r = 0; r < p; ++r) EXPECT_EQ(one.peak_activations[r], std::min(m, p - r));
      auto gp = simulate(make_schedule("gpipe", p, 1, m));
      for (int r = 0; r < p; ++r) EXPECT_EQ(gp.peak_activations[r], m);
    }
}

// Costs::stage_weight: one microbatch crosses the stages one after the other, so the
// makespan is the sum of every stage's F + B (3 slots times its weight); with many
// microbatches the heaviest stage sets the pace (at least m * 3 * its weight) and the others
// wait, so the bubble grows; weights of 1 change nothing.
TEST(Schedule, StageWeightsMakeTheHeaviestStageSetThePace) {
  Costs weighted;
  weighted.stage_weight = {1.0, 2.0, 1.0};
  const Simulation one = simulate(make_schedule("1f1b", 3, 1, 1), weighted);
  EXPECT_EQ(one.makespan, 3 * (1 + 2 + 1));
  weighted.stage_weight = {1.0, 1.0, 2.0};
  const Simulation uniform = simulate(make_schedule("1f1b", 3, 1, 8));
  const Simulation heavy = simulate(make_schedule("1f1b", 3, 1, 8), weighted);
  EXPECT_GE(heavy.makespan, 8 * 3 * 2);
  EXPECT_GT(heavy.bubble_fraction, uniform.bubble_fraction + 0.1);
  EXPECT_LT(heavy.idle_fraction[2], heavy.idle_fraction[0]);
  Costs ones;
  ones.stage_weight = {1.0, 1.0, 1.0, 1.0};  // pp 2 x vpp 2
  const Schedule il = make_schedule("interleaved-1f1b", 2, 2, 4);
  EXPECT_EQ(simulate(il, ones).start, simulate(il).start);
  ones.stage_weight = {1.0, 1.0};
  EXPECT_THROW(simulate(il, ones), trident::Error);  // 2 weights for 4 virtual stages
}

// Costs::stage_slots: each virtual stage's own F / B / W slots. Scaled alike they are
// stage_weight; a last stage whose F carries its whole extra work (the LM head runs its
// backward inside its forward) costs the same busy time as one whose F and B scale alike,
// and one microbatch still crosses in the sum of every stage's slots.
TEST(Schedule, StageSlotsGiveEachStageItsOwnActionCosts) {
  Costs weighted;
  weighted.f = 10, weighted.b = 20;
  weighted.stage_weight = {1.0, 1.5, 2.0};
  Costs slots;
  slots.stage_slots = {{10, 20, 10, 10}, {15, 30, 15, 15}, {20, 40, 20, 20}};
  for (const char* name : {"1f1b", "gpipe"}) {
    const Schedule s = make_schedule(name, 3, 1, 6);
    EXPECT_EQ(simulate(s, slots).start, simulate(s, weighted).start) << name;
  }
  Costs head_in_f;  // the last stage's 30 extra slots all in its F
  head_in_f.stage_slots = {{10, 20, 10, 10}, {10, 20, 10, 10}, {40, 20, 10, 10}};
  EXPECT_EQ(simulate(make_schedule("1f1b", 3, 1, 1), head_in_f).makespan,
            10 + 10 + 40 + 20 + 20 + 20);
  const Simulation sim = simulate(make_schedule("1f1b", 3, 1, 8), head_in_f);
  EXPECT_DOUBLE_EQ(sim.idle_fraction[2], 1.0 - 8.0 * 60 / sim.makespan);
  EXPECT_GE(sim.makespan, 8 * 60);
  // zb-h1 splits B: b_split and w are used, b is not.
  Costs split;
  split.stage_slots = {{1, 99, 1, 1}, {1, 99, 1, 1}};
  EXPECT_EQ(simulate(make_schedule("zb-h1", 2, 1, 4), split).start,
            simulate(make_schedule("zb-h1", 2, 1, 4)).start);
  split.stage_slots.pop_back();
  EXPECT_THROW(simulate(make_schedule("zb-h1", 2, 1, 4), split), trident::Error);
}

TEST(Schedule, NaiveRunsOneStageAtATime) {
  for (int p : {1, 2, 4})
    for (int m : {1, 2, 4, 8}) {
      auto s = make_schedule("naive", p, 1, m);
      auto sim = simulate(s);
      EXPECT_EQ(sim.makespan, 3 * p * m) << "p=" << p << " m=" << m;
      EXPECT_NEAR(sim.bubble_fraction, double(p - 1) / p, 1e-12);
      for (int r = 0; r < p; ++r) EXPECT_EQ(sim.peak_activations[r], 1);
      // No two stages busy in the same slot.
      std::vector<int> busy_count(sim.makespan, 0);
      for (int r = 0; r < p; ++r)
        for (std::size_t i = 0; i < s.stages[r].size(); ++i) {
          const int cost = s.stages[r][i].type == ActionType::F ? 1 : 2;
          for (int t = 0; t < cost; ++t) ++busy_count[sim.start[r][i] + t];
        }
      EXPECT_EQ(max_of(busy_count), 1);
    }
}

TEST(Schedule, InterleavedMatchesMegatronsBubbleExactly) {
  // Per-chunk costs F=1, B=2: bubble (p-1)/(v*m+p-1), makespan 3(v*m+p-1), exactly (not
  // approximately) for every m that is a multiple of p.
  for (int p : {1, 2, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p, 8}) {
        if (m % p) continue;
        auto sim = simulate(make_schedule("interleaved-1f1b", p, v, m));
        EXPECT_EQ(sim.makespan, 3 * (v * m + p - 1)) << "p=" << p << " v=" << v << " m=" << m;
        EXPECT_NEAR(sim.bubble_fraction, double(p - 1) / (v * m + p - 1), 1e-12);
        // Megatron's warm-up (p-r-1)*2 + (v-1)*p, plus the F of the first 1F1B step.
        for (int r = 0; r < p; ++r)
          EXPECT_EQ(sim.peak_activations[r], std::min(v * m, (p - r - 1) * 2 + (v - 1) * p + 1));
      }
  // Chunk c of rank r is virtual stage c*p + r: rank 0's first chunk-1 forward comes after
  // the group of p chunk-0 forwards.
  auto s = make_schedule("interleaved-1f1b", 2, 2, 4);
  EXPECT_EQ(format_actions(s.stages[0]), "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 "
                                         "B2.1 B3.1 B2 B3");
  EXPECT_EQ(s.stage_map().virtual_stage(1, 1), 3);
}

TEST(Schedule, LoopedBfsHasTheBreadthFirstBubble) {
  // F of every microbatch through chunk 0, then chunk 1, ...: makespan
  // 3 (v max(m,p) + min(m,p) - 1), which is the interleaved bubble once m >= p; every
  // chunk activation of the step is live at the peak.
  for (int p : {1, 2, 4})
    for (int v : {1, 2, 3})
      for (int m : {1, 2, 3, 4, 8}) {
        auto sim = simulate(make_schedule("looped-bfs", p, v, m));
        const int span = v * std::max(m, p) + std::min(m, p) - 1;
        EXPECT_EQ(sim.makespan, 3 * span) << "p=" << p << " v=" << v << " m=" << m;
        if (m >= p) EXPECT_NEAR(sim.bubble_fraction, double(p - 1) / (v * m + p - 1), 1e-12);
        for (int r = 0; r < p; ++r) EXPECT_EQ(sim.peak_activations[r], v * m);
      }
}

TEST(Schedule, ZeroBubbleH1BeatsOneFOneBAtTheSamePeakMemory) {
  // Activations count as live from F until W (W needs the layer inputs). ZB-H1's stage r
  // defers r W's, so it holds up to p activations where 1F1B's stage r holds p - r: the
  // most loaded stage (stage 0, which decides the memory per device) holds the same as
  // under 1F1B, later stages more. Costs: 1F1B F=1 B=2; ZB-H1 F=1 B=1 W=1 (the same work).
  for (int p : {1, 2, 4})
    for (int m : {1, 2, 4, 8}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      auto zb = simulate(make_schedule("zb-h1", p, 1, m));
      auto one = simulate(make_schedule("1f1b", p, 1, m));
      EXPECT_EQ(max_of(zb.peak_activations), max_of(one.peak_activations));
      for (int r = 0; r < p; ++r) EXPECT_EQ(zb.peak_activations[r], std::min(m, p));
      if (p > 1)
        EXPECT_LT(zb.bubble_fraction, one.bubble_fraction);
      else
        EXPECT_DOUBLE_EQ(zb.bubble_fraction, 0.0);
      // Qi et al.: the bubble shrinks from (p-1)(F+B+W) to (p-1)(F+B-W) once m >= p.
      if (m >= p) {
        EXPECT_EQ(zb.makespan, 3 * m + (p - 1));
        EXPECT_NEAR(zb.bubble_fraction, double(p - 1) / (3 * m + p - 1), 1e-12);
      }
    }
  auto s = make_schedule("zb-h1", 2, 1, 3);
  EXPECT_EQ(format_actions(s.stages[0]), "F0 F1 B0 W0 F2 B1 W1 B2 W2");
  EXPECT_EQ(format_actions(s.stages[1]), "F0 B0 F1 B1 W0 F2 B2 W1 W2");
}

TEST(Schedule, PeakActivationsCountsUntilWWhenSplit) {
  EXPECT_EQ(peak_activations(parse_actions("F0 B0 F1 B1")), 1);
  EXPECT_EQ(peak_activations(parse_actions("F0 B0 F1 W0 B1 W1")), 2);  // F0 live until W0
  EXPECT_EQ(peak_activations(parse_actions("F0 F0.1 B0.1 B0")), 2);   // per chunk
}

// The head chunk's output gradient waits in a row of its own where its B is not the next
// compute action after its F; the rows a list holds at its peak.
TEST(Schedule, HeadGradientsWaitInARowUnlessTheirBFollows) {
  const auto list = parse_actions("F0 F1 B1 F2 B0 W1 B2");
  EXPECT_TRUE(head_gradient_waits(list, 0, 0));   // F0: F1 comes next
  EXPECT_FALSE(head_gradient_waits(list, 1, 0));  // F1: B1 comes next
  EXPECT_TRUE(head_gradient_waits(list, 3, 0));   // F2: B0 comes next
  EXPECT_FALSE(head_gradient_waits(list, 2, 0));  // not an F
  EXPECT_FALSE(head_gradient_waits(list, 0, 1));  // not the head chunk
  EXPECT_EQ(peak_head_gradients(list, 0), 2);     // F0's and F2's, until B0
  EXPECT_EQ(peak_head_gradients(list, -1), 0);    // no head on this rank
  EXPECT_EQ(peak_head_gradients(parse_actions("F0 B0 F1 B1"), 0), 0);
  EXPECT_EQ(peak_head_gradients(parse_actions("F0 F1 B0 B1"), 0), 2);
  EXPECT_EQ(peak_head_gradients(parse_actions("F0 F1 B1 B0"), 0), 1);
  EXPECT_EQ(peak_head_gradients(parse_actions("F0 F0.1 B0.1 B0"), 1), 0);
  EXPECT_EQ(peak_head_gradients(parse_actions("F0 F0.1 B0.1 B0"), 0), 1);
}

// Where the head is (the last virtual stage), and which registered schedules keep its
// gradient in rows: only those that run a later F between a head F and its B (all of gpipe's
// and looped-bfs's m forwards run first on the head rank).
TEST(Schedule, OnlyForwardFirstSchedulesKeepHeadGradientRows) {
  EXPECT_EQ(head_chunk_of(make_schedule("1f1b", 4, 1, 8), 3), 0);
  EXPECT_EQ(head_chunk_of(make_schedule("1f1b", 4, 1, 8), 0), -1);
  EXPECT_EQ(head_chunk_of(make_schedule("interleaved-1f1b", 2, 2, 4), 1), 1);
  EXPECT_EQ(head_chunk_of(make_schedule("zb-v", 2, 2, 4), 0), 1);  // the V ends on rank 0
  EXPECT_EQ(head_chunk_of(make_schedule("zb-v", 2, 2, 4), 1), -1);
  for (const std::string& name : schedule_names())
    for (int pp : {1, 2, 4}) {
      const ScheduleKind& kind = *find_schedule(name);
      const int vpp = kind.fixed_vpp ? kind.fixed_vpp : kind.multi_chunk ? 2 : 1;
      if (kind.misfit(pp, vpp, 8) != ScheduleMisfit::none) continue;
      const Schedule s = make_schedule(name, pp, vpp, 8);
      const bool forward_first = name == "gpipe" || name == "looped-bfs";
      for (int r = 0; r < pp; ++r) {
        const int rows = peak_head_gradients(s.stages[std::size_t(r)], head_chunk_of(s, r));
        const bool head = r == s.stage_map().head_rank();
        EXPECT_EQ(rows, head && forward_first ? 8 : 0) << name << " pp " << pp << " rank " << r;
      }
    }
}

TEST(Schedule, ActionsPrintAndParseBack) {
  const std::string text = "F0 F1.1 B12.1 W3";
  EXPECT_EQ(format_actions(parse_actions(text)), text);
  EXPECT_EQ(parse_actions("B2.1")[0], (Action{ActionType::B, 2, 1}));
  for (const char* bad : {"X1", "F", "F-1", "F1.", "F1.x", "F1x"})
    EXPECT_THROW(parse_actions(bad), trident::Error) << bad;
}

TEST(Schedule, SimulatorRejectsSwappedPairsNamingStageAndAction) {
  Schedule bad = make_schedule("1f1b", 2, 1, 2);
  std::swap(bad.stages[1][0], bad.stages[1][1]);  // B0 before F0 on the last stage
  const std::string msg = error_of(bad);
  EXPECT_NE(msg.find("stage 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("B0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("before its forward F0"), std::string::npos) << msg;

  Schedule w_first = make_schedule("zb-h1", 2, 1, 2);
  w_first.stages[0] = parse_actions("F0 F1 W0 B0 B1 W1");
  const std::string wmsg = error_of(w_first);
  EXPECT_NE(wmsg.find("stage 0 runs W0"), std::string::npos) << wmsg;
}

TEST(Schedule, SimulatorNamesEveryStuckStageOnDeadlock) {
  // Stage 0 waits for stage 1's B0 before sending F1; stage 1 waits for F1 before B0.
  Schedule s{"hand", 2, 1, 2, {parse_actions("F0 B0 F1 B1"), parse_actions("F0 F1 B0 B1")}};
  const std::string msg = error_of(s);
  EXPECT_NE(msg.find("deadlocks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stage 0 is stuck on B0 (action 1, waiting for B0 of stage 1)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("stage 1 is stuck on F1 (action 1, waiting for F1 of stage 0)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line";
}

TEST(Schedule, SimulatorRejectsMessagesOutOfMatchingOrder) {
  // No deadlock with buffered sends, but stage 1 sends B0's gradient first while stage 0
  // consumes B1's first: a single-tag MPI link would hand B1 the wrong gradient.
  Schedule s{"hand", 2, 1, 2, {parse_actions("F0 F1 B1 B0"), parse_actions("F0 F1 B0 B1")}};
  const std::string msg = error_of(s);
  EXPECT_NE(msg.find("stage 1 sends stage 0 the gradients of its B0 before those of its B1"),
            std::string::npos)
      << msg;
}

TEST(Schedule, SimulatorRejectsDuplicatesAndMissingActions) {
  Schedule dup = make_schedule("gpipe", 1, 1, 2);
  dup.stages[0][1] = dup.stages[0][0];
  EXPECT_NE(error_of(dup).find("stage 0 runs F0 twice"), std::string::npos) << error_of(dup);
  Schedule missing = make_schedule("zb-h1", 2, 1, 2);
  missing.stages[1].pop_back();
  EXPECT_NE(error_of(missing).find("stage 1 never runs W1"), std::string::npos)
      << error_of(missing);
  Schedule range = make_schedule("1f1b", 2, 1, 2);
  range.stages[0][0].chunk = 1;
  EXPECT_NE(error_of(range).find("out-of-range action F0.1"), std::string::npos);
  Schedule shape = make_schedule("1f1b", 2, 1, 2);
  shape.stages.pop_back();
  EXPECT_THROW(simulate(shape), trident::Error);
}

TEST(Schedule, GeneratorsRejectUnsupportedShapes) {
  EXPECT_THROW(make_schedule("nope", 1, 1, 1), trident::Error);
  try {
    make_schedule("interleaved-1f1b", 4, 2, 6);
    ADD_FAILURE() << "accepted m % pp != 0";
  } catch (const trident::Error& e) {
    EXPECT_NE(std::string(e.what()).find("divisible by pp"), std::string::npos) << e.what();
  }
  for (const char* name : {"naive", "gpipe", "1f1b", "zb-h1"})
    EXPECT_THROW(make_schedule(name, 2, 2, 4), trident::Error) << name;
  EXPECT_THROW(make_schedule("1f1b", 0, 1, 4), trident::Error);
}

TEST(Schedule, CommunicationCostDelaysOnlyCrossRankDependencies) {
  Costs c;
  c.comm = 1;
  // One rank, two chunks: the chunk 0 -> chunk 1 handoff stays on the rank, no latency.
  EXPECT_EQ(simulate(make_schedule("looped-bfs", 1, 2, 2), c).makespan, 12);
  // GPipe: the first microbatch's 2(p-1) hops are on the critical path, the rest overlap.
  EXPECT_EQ(simulate(make_schedule("gpipe", 4, 1, 8), c).makespan, 3 * (8 + 3) + 2 * 3);
  // Naive: every microbatch pays all 2(p-1) hops.
  EXPECT_EQ(simulate(make_schedule("naive", 4, 1, 8), c).makespan, 8 * (3 * 4 + 2 * 3));
}

TEST(Schedule, TimelineHasARowPerStageAndAColumnPerSlot) {
  auto s = make_schedule("1f1b", 2, 1, 2);
  auto sim = simulate(s);
  EXPECT_EQ(format_timeline(s, sim),
            "slot    | 0  1  2  3  4  5  6  7  8\n"
            "stage 0 | F0 F1       B0 B0    B1 B1\n"
            "stage 1 |    F0 B0 B0 F1 B1 B1\n");
  auto z = make_schedule("interleaved-1f1b", 1, 2, 1);
  EXPECT_NE(format_timeline(z, simulate(z)).find("F0.1"), std::string::npos);
}

// PipeDream-2BW: the 1F1B order within a window, but asynchronous with two weight versions per
// stage (the one the window computes with, and the one it updates); the synchronous schedules
// hold one. The simulator reports both.
TEST(Schedule, PipeDream2bwIsAsynchronous1f1bWithTwoWeightVersions) {
  for (int pp : {1, 2, 3, 4})
    for (int m : {1, 3, 8}) {
      const Schedule s = make_schedule("pipedream-2bw", pp, 1, m);
      const Schedule flush = make_schedule("1f1b", pp, 1, m);
      for (int r = 0; r < pp; ++r) EXPECT_EQ(s.stages[r], flush.stages[r]) << pp << " " << m;
      const Simulation sim = simulate(s), ref = simulate(flush);
      EXPECT_TRUE(sim.asynchronous);
      EXPECT_FALSE(ref.asynchronous);
      EXPECT_EQ(sim.weight_versions, std::vector<int>(std::size_t(pp), 2));
      EXPECT_EQ(ref.weight_versions, std::vector<int>(std::size_t(pp), 1));
      EXPECT_EQ(sim.makespan, ref.makespan);
      EXPECT_EQ(sim.peak_activations, ref.peak_activations);
    }
  EXPECT_EQ(weight_update_of("pipedream-2bw"), WeightUpdate::delayed);
  for (const char* name : {"naive", "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1"})
    EXPECT_EQ(weight_update_of(name), WeightUpdate::flush) << name;
  // One chunk per rank: vpp > 1 is refused with the multi-chunk schedules named.
  try {
    make_schedule("pipedream-2bw", 2, 2, 4);
    ADD_FAILURE() << "pipedream-2bw accepted vpp = 2";
  } catch (const trident::Error& e) {
    EXPECT_NE(std::string(e.what()).find("vpp must be 1"), std::string::npos) << e.what();
  }
}

// PipeDream: the 1F1B order with an update after every backward; a stage keeps the version of
// every microbatch between its F and B plus the live one: pp - r on stage r in the steady
// state (PipeDream's count), never more than its peak activations.
TEST(Schedule, PipeDreamStashesAVersionPerMicrobatchInFlight) {
  for (int pp : {1, 2, 3, 4})
    for (int m : {1, 2, 4, 8}) {
      const Schedule s = make_schedule("pipedream", pp, 1, m);
      const Simulation sim = simulate(s);
      EXPECT_TRUE(sim.asynchronous);
      for (int r = 0; r < pp; ++r) {
        EXPECT_EQ(s.stages[r], make_schedule("1f1b", pp, 1, m).stages[r]);
        // Steady state (m >= 2 pp): pp - r versions; fewer microbatches share version 0.
        if (m >= 2 * pp) EXPECT_EQ(sim.weight_versions[r], pp - r) << pp << " " << m << " " << r;
        EXPECT_LE(sim.weight_versions[r], sim.peak_activations[r]);
        EXPECT_GE(sim.weight_versions[r], 1);
      }
    }
  // By hand, stage 0 of pp = 3 (warm-up 2): F0 F1 F2 B0 -> F1, F2 on version 0, live 1: 2;
  // F3 (v1) B1 -> F2 (v0), F3 (v1), live 2: 3; B2 -> F3 (v1), live 3: 2; B3 -> 1.
  EXPECT_EQ(weight_versions(parse_actions("F0 F1 F2 B0 F3 B1 B2 B3"),
                            WeightUpdate::per_microbatch), 3);
  // GPipe's order: every forward on version 0, so that one and the live one.
  EXPECT_EQ(weight_versions(parse_actions("F0 F1 F2 F3 B0 B1 B2 B3"),
                            WeightUpdate::per_microbatch), 2);
  EXPECT_EQ(weight_update_of("pipedream"), WeightUpdate::per_microbatch);
}

// ---- placement and ZB-V ------------------------------------------------------------------

TEST(Placement, RoundRobinAndVShapeAnswerBothWays) {
  for (int pp : {1, 2, 3, 4})
    for (int vpp : {1, 2, 4})
      for (trident::Placement p : {trident::Placement::round_robin, trident::Placement::v_shape}) {
        const trident::StageMap map{p, pp, vpp};
        std::vector<int> seen(std::size_t(pp * vpp), 0);
        for (int r = 0; r < pp; ++r)
          for (int c = 0; c < vpp; ++c) {
            const int v = map.virtual_stage(r, c);
            ASSERT_GE(v, 0);
            ASSERT_LT(v, pp * vpp);
            ++seen[std::size_t(v)];
            EXPECT_EQ(map.slot(v).rank, r);
            EXPECT_EQ(map.slot(v).chunk, c);
            if (p == trident::Placement::round_robin) EXPECT_EQ(v, c * pp + r);  // Megatron's
          }
        EXPECT_EQ(seen, std::vector<int>(std::size_t(pp * vpp), 1));  // a bijection
      }
  const trident::StageMap v{trident::Placement::v_shape, 4, 2};
  EXPECT_EQ(v.virtual_stage(0, 1), 7);  // rank 0 holds the last virtual stage: the head
  EXPECT_EQ(v.virtual_stage(3, 1), 4);  // rank 3 turns the microbatches around
  EXPECT_EQ(v.embedding_rank(), 0);
  EXPECT_EQ(v.head_rank(), 0);
  EXPECT_EQ((trident::StageMap{trident::Placement::round_robin, 4, 2}.head_rank()), 3);
  for (const std::string& name : schedule_names())
    EXPECT_EQ(placement_of(name), name == "zb-v" ? trident::Placement::v_shape
                                                 : trident::Placement::round_robin)
        << name;
}

TEST(Schedule, ZeroBubbleVRunsEveryActionOnceInItsV) {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 5, 8, 12}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Schedule s = make_schedule("zb-v", p, 2, m);
      EXPECT_EQ(s.placement, trident::Placement::v_shape);
      ASSERT_EQ(int(s.stages.size()), p);
      for (int r = 0; r < p; ++r) {
        // F, B and W of every (microbatch, chunk), once each, F before B before W.
        std::map<std::tuple<int, int, int>, int> at;
        for (std::size_t i = 0; i < s.stages[r].size(); ++i) {
          const Action& a = s.stages[r][i];
          EXPECT_TRUE(at.emplace(std::make_tuple(int(a.type), a.chunk, a.mb), int(i)).second)
              << a.str() << " twice on stage " << r;
        }
        EXPECT_EQ(s.stages[r].size(), std::size_t(6 * m));
        for (int c = 0; c < 2; ++c)
          for (int mb = 0; mb < m; ++mb) {
            const int f = at.at({int(ActionType::F), c, mb}), b = at.at({int(ActionType::B), c, mb}),
                      w = at.at({int(ActionType::W), c, mb});
            EXPECT_LT(f, b);
            EXPECT_LT(b, w);
          }
      }
      // The simulator checks the cross-rank dependencies, deadlock and message order.
      ASSERT_NO_THROW(simulate(s)) << error_of(s);
    }
  EXPECT_EQ(format_actions(make_schedule("zb-v", 2, 2, 3).stages[1]),
            "F0 F0.1 F1 F1.1 B0.1 W0.1 F2 B0 W0 F2.1 B1.1 W1.1 B1 B2.1 B2 W1 W2.1 W2");
}

TEST(Schedule, ZeroBubbleVHasItsClosedFormBubbleBelowZbH1) {
  // Uniform costs F = B = W = 1 slot per chunk (a chunk is half a stage, so a whole stage's
  // F, B and W cost 2 each). Each rank has 6m slots of work. Once m >= 2p - 1 (PyTorch's
  // condition for a full steady phase) every rank idles exactly p - 1 slots: rank r's first
  // chunk-0 input arrives after r one-slot hops, and its last gradients after p - 1 - r, the
  // hops of the V between it and the turn; in between the W's fill every gap. So
  //   makespan = 6m + p - 1,  bubble = (p - 1) / (6m + p - 1).
  // ZB-H1 at the same p and m and the same work (a stage's F = B = W = 2 slots) waits
  // 2(p - 1): makespan 2(3m + p - 1), bubble (p - 1)/(3m + p - 1). The V halves the bubble
  // because a chunk's hop costs half a stage's.
  Costs uniform;
  uniform.f = 1, uniform.b_split = 1, uniform.w = 1;
  Costs whole_stage;  // zb-h1 with one chunk per rank: a stage is two of zb-v's chunks
  whole_stage.f = 2, whole_stage.b_split = 2, whole_stage.w = 2;
  for (int p : {2, 3, 4})
    for (int m : {2 * p - 1, 2 * p, 8, 12}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Simulation zbv = simulate(make_schedule("zb-v", p, 2, m), uniform);
      const Simulation zbh = simulate(make_schedule("zb-h1", p, 1, m), whole_stage);
      EXPECT_EQ(zbv.makespan, 6 * m + p - 1);
      EXPECT_NEAR(zbv.bubble_fraction, double(p - 1) / (6 * m + p - 1), 1e-12);
      for (int r = 0; r < p; ++r)
        EXPECT_NEAR(zbv.idle_fraction[r], double(p - 1) / (6 * m + p - 1), 1e-12) << r;
      EXPECT_EQ(zbh.makespan, 2 * (3 * m + p - 1));
      EXPECT_LT(zbv.bubble_fraction, zbh.bubble_fraction);
    }
  // Fewer microbatches: still valid, never worse than zb-h1.
  for (int p : {2, 4})
    for (int m : {1, 2, 3}) {
      const Simulation zbv = simulate(make_schedule("zb-v", p, 2, m), uniform);
      const Simulation zbh = simulate(make_schedule("zb-h1", p, 1, m), whole_stage);
      EXPECT_LE(zbv.bubble_fraction, zbh.bubble_fraction) << "p=" << p << " m=" << m;
    }
}

TEST(Schedule, ZeroBubbleVHoldsNoMoreActivationsThanOneFOneB) {
  // zb-v counts chunk activations (half a stage each, live F to W); 1F1B whole stages (F to
  // B). The most loaded rank decides the memory per device.
  for (int p : {2, 4})
    for (int m : {1, 2, 4, 7, 8, 16}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Schedule zbv = make_schedule("zb-v", p, 2, m);
      const Schedule one = make_schedule("1f1b", p, 1, m);
      int zbv_peak = 0, one_peak = 0;
      for (int r = 0; r < p; ++r) {
        zbv_peak = std::max(zbv_peak, peak_activations(zbv.stages[r]));
        one_peak = std::max(one_peak, peak_activations(one.stages[r]));
      }
      EXPECT_LE(zbv_peak, 2 * one_peak);  // in half stages
      if (m >= 2 * p) EXPECT_EQ(zbv_peak, 2 * p);
    }
}

TEST(Schedule, ZeroBubbleVNeedsTwoChunks) {
  for (int vpp : {1, 3, 4}) {
    try {
      make_schedule("zb-v", 2, vpp, 4);
      ADD_FAILURE() << "zb-v accepted vpp = " << vpp;
    } catch (const trident::Error& e) {
      EXPECT_NE(std::string(e.what()).find("parallel.vpp must be 2"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(find_schedule("zb-v")->misfit(4, 2, 5), ScheduleMisfit::none);  // any m
  EXPECT_EQ(find_schedule("zb-v")->misfit(4, 1, 0), ScheduleMisfit::chunk_count);
}
