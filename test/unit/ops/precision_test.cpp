// test/unit/ops/precision_test.cpp — the precision names and the factory's checks that need
// no GPU: parse_precision round-trips, a bad word and a non-fp32 CPU backend fail clearly;
// the CPU backend's bf16 conversion (the reference the CUDA one is tested against).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/ops/ops.hpp"

namespace trident::test {
namespace {

using ops::Precision;

TEST(Precision, NamesRoundTrip) {
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16})
    EXPECT_EQ(ops::parse_precision(ops::precision_name(p)), p);
}

TEST(Precision, UnknownWordIsAnError) {
  try {
    ops::parse_precision("fp16");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"fp16\""), std::string::npos) << e.what();
  }
}

TEST(Precision, CpuBackendIsFp32Only) {
  EXPECT_NO_THROW(ops::make_ops("cpu", 1, Precision::fp32));
  EXPECT_THROW(ops::make_ops("cpu", 1, Precision::tf32), Error);
  EXPECT_THROW(ops::make_ops("cpu", 1, Precision::bf16), Error);
}

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest, ties to the even bf16 (7 stored mantissa bits: at 1 the spacing is
// 2^-7), overflow to infinity, NaN kept; back to float exactly.
TEST(Precision, Bf16ConversionRoundsToNearestEven) {
  auto cpu = ops::make_ops("cpu", 2);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f,
                                -2.5f, 0.0f, -0.0f, inf, -inf, 3.4028235e38f,
                                from_bits(0x7fc00001u), from_bits(0x00000001u)};
  const std::vector<std::uint16_t> want = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xc020, 0x0000, 0x8000,
                                           0x7f80, 0xff80, 0x7f80, 0x7fc0, 0x0000};
  std::vector<std::uint16_t> got(x.size());
  cpu->to_bf16(got.data(), x.data(), std::int64_t(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(got[i], want[i]) << "x[" << i << "] " << x[i];
  std::vector<float> back(x.size());
  cpu->from_bf16(back.data(), got.data(), std::int64_t(x.size()));
  EXPECT_EQ(back[2], 1.0f + 0x1p-6f);
  EXPECT_EQ(back[4], -2.5f);
  EXPECT_TRUE(std::isnan(back[10]));
  // Random values: relative error at most 2^-8 (half a unit in the last of 8 significant bits).
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.0f, 100.0f);
  std::vector<float> r(10001);
  for (float& v : r) v = d(g);
  std::vector<std::uint16_t> rb(r.size());
  std::vector<float> rr(r.size());
  cpu->to_bf16(rb.data(), r.data(), std::int64_t(r.size()));
  cpu->from_bf16(rr.data(), rb.data(), std::int64_t(r.size()));
  for (std::size_t i = 0; i < r.size(); ++i)
    ASSERT_LE(std::abs(rr[i] - r[i]), 0x1p-8f * std::abs(r[i])) << r[i];
}

}  // namespace
}  // namespace trident::test
