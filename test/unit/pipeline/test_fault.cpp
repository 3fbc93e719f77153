// TRIDENT_FAULT's grammar (pipeline/executor.hpp): <kind>:<rank>:<step>, kind stall | exit |
// abort; empty means no fault; anything else is an Error that quotes the value.
#include <gtest/gtest.h>

#include <string>

#include "trident/core/error.hpp"
#include "trident/pipeline/executor.hpp"

using trident::pipeline::Fault;
using trident::pipeline::parse_fault;

TEST(Fault, ParsesTheThreeKinds) {
  EXPECT_EQ(parse_fault("").kind, Fault::Kind::none);
  const Fault s = parse_fault("stall:1:2");
  EXPECT_EQ(s.kind, Fault::Kind::stall);
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.step, 2);
  EXPECT_EQ(parse_fault("exit:0:10").kind, Fault::Kind::exit);
  const Fault a = parse_fault("abort:12:345");
  EXPECT_EQ(a.kind, Fault::Kind::abort);
  EXPECT_EQ(a.rank, 12);
  EXPECT_EQ(a.step, 345);
}

TEST(Fault, RejectsAnythingElseNamingTheValue) {
  for (const std::string bad : {"stall", "stall:1", "stall:1:", "hang:1:2", "stall:-1:2",
                                "stall:one:2", "stall:1:2:3", ":1:2", "stall:1:2x"}) {
    try {
      parse_fault(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const trident::Error& e) {
      EXPECT_NE(std::string(e.what()).find("TRIDENT_FAULT = '" + bad + "'"), std::string::npos)
          << e.what();
    }
  }
}
