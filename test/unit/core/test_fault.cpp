// TRIDENT_FAULT's grammar (core/fault.hpp): <kind>:<rank>:<step>[,...]; empty means no
// fault; anything else is an Error that quotes the value.
#include <gtest/gtest.h>

#include <string>

#include "trident/core/error.hpp"
#include "trident/core/fault.hpp"

using trident::fault::Kind;
using trident::fault::parse;

TEST(Fault, ParsesEveryKind) {
  EXPECT_TRUE(parse("").empty());
  const auto s = parse("stall:1:2");
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].kind, Kind::stall);
  EXPECT_EQ(s[0].rank, 1);
  EXPECT_EQ(s[0].step, 2);
  EXPECT_EQ(parse("exit:0:10")[0].kind, Kind::exit);
  EXPECT_EQ(parse("nan:3:4")[0].kind, Kind::nan);
  EXPECT_EQ(parse("kill-in-checkpoint:0:8")[0].kind, Kind::kill_in_checkpoint);
  EXPECT_EQ(parse("no-room-check:0:3")[0].kind, Kind::no_room_check);
  EXPECT_EQ(parse("pause-in-checkpoint:1:8")[0].kind, Kind::pause_in_checkpoint);
  EXPECT_EQ(parse("disk-full-in-metrics:0:6")[0].kind, Kind::disk_full_in_metrics);
  const auto a = parse("abort:12:345");
  EXPECT_EQ(a[0].kind, Kind::abort);
  EXPECT_EQ(a[0].rank, 12);
  EXPECT_EQ(a[0].step, 345);
}

TEST(Fault, ParsesAList) {
  const auto f = parse("exit:1:6,nan:0:3");
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].kind, Kind::exit);
  EXPECT_EQ(f[1].kind, Kind::nan);
  EXPECT_EQ(f[1].step, 3);
}

TEST(Fault, RejectsAnythingElseNamingTheValue) {
  for (const std::string bad :
       {"stall", "stall:1", "stall:1:", "hang:1:2", "stall:-1:2", "stall:one:2", "stall:1:2:3",
        ":1:2", "stall:1:2x", "stall:1:2,", "stall:1:2:", "exit:99999999999:1", ","}) {
    try {
      parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const trident::Error& e) {
      EXPECT_NE(std::string(e.what()).find("TRIDENT_FAULT = '" + bad + "'"), std::string::npos)
          << e.what();
    }
  }
}
