// Unit tests of the learning-rate schedule (trident/train/lr_schedule.hpp): warm-up, cosine
// decay, the end points and the edge cases W = 0, W = S, lr = min_lr.
#include <gtest/gtest.h>

#include <cmath>

#include "trident/train/lr_schedule.hpp"

namespace trident::train {
namespace {

Config::Train schedule(double lr, double min_lr, long warmup, long steps) {
  Config::Train t;
  t.lr = lr;
  t.min_lr = min_lr;
  t.warmup_steps = warmup;
  t.steps = steps;
  return t;
}

TEST(LearningRate, WarmupIsLinearAndReachesLr) {
  const Config::Train t = schedule(1e-3, 1e-4, 10, 110);
  EXPECT_DOUBLE_EQ(learning_rate(t, 1), 1e-4);  // lr * 1/10
  EXPECT_DOUBLE_EQ(learning_rate(t, 5), 5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(t, 10), 1e-3);  // s = W gives lr exactly
  for (long s = 1; s < 10; ++s) EXPECT_LT(learning_rate(t, s), learning_rate(t, s + 1));
}

TEST(LearningRate, CosineValuesAndEndPoint) {
  const Config::Train t = schedule(1e-3, 1e-4, 10, 110);
  // s = 35: progress 0.25, 1e-4 + 0.5 * 9e-4 * (1 + cos(pi/4)).
  EXPECT_NEAR(learning_rate(t, 35), 8.681980515339464e-4, 1e-15);
  // s = 60: progress 0.5, the midpoint of lr and min_lr.
  EXPECT_NEAR(learning_rate(t, 60), 5.5e-4, 1e-15);
  EXPECT_DOUBLE_EQ(learning_rate(t, 110), 1e-4);  // s = steps gives min_lr
  EXPECT_DOUBLE_EQ(learning_rate(t, 111), 1e-4);  // past the end: held at min_lr
  EXPECT_DOUBLE_EQ(learning_rate(t, 1000), 1e-4);
}

TEST(LearningRate, DecaysMonotonicallyAfterWarmup) {
  const Config::Train t = schedule(3e-4, 3e-5, 20, 200);
  for (long s = 20; s < 200; ++s) {
    EXPECT_GT(learning_rate(t, s), learning_rate(t, s + 1)) << "step " << s;
    EXPECT_GE(learning_rate(t, s + 1), 3e-5);
    EXPECT_LE(learning_rate(t, s + 1), 3e-4);
  }
}

TEST(LearningRate, NoWarmupStartsTheCosineAtStepZero) {
  const Config::Train t = schedule(1e-3, 0.0, 0, 4);
  EXPECT_DOUBLE_EQ(learning_rate(t, 0), 1e-3);
  // progress s/4: 0.5e-3 * (1 + cos(pi/4)), (1 + cos(pi/2)), (1 + cos(3pi/4)), then 0.
  EXPECT_NEAR(learning_rate(t, 1), 0.5e-3 * (1.0 + std::sqrt(0.5)), 1e-15);
  EXPECT_NEAR(learning_rate(t, 2), 0.5e-3, 1e-15);
  EXPECT_NEAR(learning_rate(t, 3), 0.5e-3 * (1.0 - std::sqrt(0.5)), 1e-15);
  EXPECT_DOUBLE_EQ(learning_rate(t, 4), 0.0);
}

TEST(LearningRate, EdgeCases) {
  // Warm-up over the whole run: no decay at all.
  const Config::Train all_warm = schedule(2e-3, 1e-4, 8, 8);
  EXPECT_DOUBLE_EQ(learning_rate(all_warm, 4), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(all_warm, 8), 2e-3);
  // min_lr == lr: constant after warm-up.
  const Config::Train flat = schedule(1e-3, 1e-3, 2, 10);
  for (long s = 2; s <= 10; ++s) EXPECT_DOUBLE_EQ(learning_rate(flat, s), 1e-3);
  // Before the first update with warm-up: 0.
  EXPECT_DOUBLE_EQ(learning_rate(schedule(1e-3, 1e-4, 5, 10), 0), 0.0);
  // A single step with no warm-up ends at min_lr.
  EXPECT_DOUBLE_EQ(learning_rate(schedule(1e-3, 1e-4, 0, 1), 1), 1e-4);
}

TEST(LearningRate, DefaultDeck) {
  const Config::Train t;  // lr 3e-4, min_lr 3e-5, warm-up 20 of 200
  EXPECT_DOUBLE_EQ(learning_rate(t, 1), 3e-4 / 20);
  EXPECT_DOUBLE_EQ(learning_rate(t, 20), 3e-4);
  EXPECT_NEAR(learning_rate(t, 110), 0.5 * (3e-4 + 3e-5), 1e-15);
  EXPECT_DOUBLE_EQ(learning_rate(t, 200), 3e-5);
}

}  // namespace
}  // namespace trident::train
