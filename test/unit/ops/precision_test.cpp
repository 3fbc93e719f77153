// test/unit/ops/precision_test.cpp — the precision names and the factory's checks that need
// no GPU: parse_precision round-trips, a bad word and a non-fp32 CPU backend fail clearly.
#include <gtest/gtest.h>

#include <string>

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

}  // namespace
}  // namespace trident::test
