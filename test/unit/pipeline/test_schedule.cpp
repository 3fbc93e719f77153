// Schedules against the simulator and the closed-form bubbles.
#include <gtest/gtest.h>

#include "trident/core/error.hpp"
#include "trident/pipeline/simulator.hpp"

using namespace trident::pipeline;

TEST(Schedule, SingleStageRunsForwardThenBackwardPerMicrobatch) {
  auto s = make_schedule("1f1b", 1, 1, 3);
  ASSERT_EQ(s.stages.size(), 1u);
  std::string order;
  for (const auto& a : s.stages[0]) order += a.str() + " ";
  EXPECT_EQ(order, "F0 B0 F1 B1 F2 B2 ");
  EXPECT_EQ(peak_activations(s.stages[0]), 1);
  auto sim = simulate(s);
  EXPECT_EQ(sim.makespan, 9);
  EXPECT_DOUBLE_EQ(sim.bubble_fraction, 0.0);
}

TEST(Schedule, GPipeAndOneFOneBHaveTheClosedFormBubble) {
  // With F=1, B=2: bubble = (p-1) / (m + p - 1) for both; 1F1B holds at most p activations.
  for (int p : {2, 3, 4})
    for (int m : {1, 2, 5, 8}) {
      for (const char* name : {"gpipe", "1f1b"}) {
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

TEST(Schedule, SimulatorRejectsDeadlocksAndDuplicates) {
  Schedule bad = make_schedule("1f1b", 2, 1, 2);
  std::swap(bad.stages[1][0], bad.stages[1][1]);  // B0 before F0 on the last stage
  EXPECT_THROW(simulate(bad), trident::Error);
  Schedule dup = make_schedule("gpipe", 1, 1, 2);
  dup.stages[0][1] = dup.stages[0][0];
  EXPECT_THROW(simulate(dup), trident::Error);
  EXPECT_THROW(make_schedule("nope", 1, 1, 1), trident::Error);
}
