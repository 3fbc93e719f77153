// ArenaAllocator: first fit, alignment, merging of freed neighbours, a clear error when full.
#include <gtest/gtest.h>

#include "trident/core/arena.hpp"
#include "trident/core/error.hpp"

namespace trident {
namespace {

TEST(Arena, AlignsAndFitsFirst) {
  ArenaAllocator a(4096);
  EXPECT_EQ(a.capacity(), 4096u);
  const std::size_t x = a.allocate(1), y = a.allocate(300), z = a.allocate(0);
  EXPECT_EQ(x, 0u);
  EXPECT_EQ(y, 256u);  // 1 byte takes one 256-byte block
  EXPECT_EQ(z, 768u);  // 300 bytes take two
  EXPECT_EQ(a.used(), 1024u);
  a.release(y);
  EXPECT_EQ(a.allocate(200), 256u) << "first fit reuses the hole";
  EXPECT_EQ(a.blocks(), 3u);
}

TEST(Arena, MergesNeighboursOnRelease) {
  ArenaAllocator a(1024);
  const std::size_t b0 = a.allocate(256), b1 = a.allocate(256), b2 = a.allocate(256),
                    b3 = a.allocate(256);
  EXPECT_THROW(a.allocate(1), Error);
  a.release(b1);
  a.release(b3);
  EXPECT_THROW(a.allocate(512), Error) << "two 256-byte holes are not one 512-byte block";
  a.release(b2);  // joins b1 and b3
  EXPECT_EQ(a.allocate(768), b1);
  a.release(b0);
  EXPECT_EQ(a.used(), 768u);
  EXPECT_EQ(a.peak(), 1024u);
}

TEST(Arena, FullArenaSaysWhatIsLeft) {
  ArenaAllocator a(1024);
  a.allocate(512);
  try {
    a.allocate(1000, "cuda:0 arena");
    FAIL() << "allocate past the end did not throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cuda:0 arena: 1000 bytes asked for, 512 free"), std::string::npos) << m;
  }
}

TEST(Arena, RejectsAForeignRelease) {
  ArenaAllocator a(1024);
  a.allocate(256);
  EXPECT_THROW(a.release(128), Error);
}

}  // namespace
}  // namespace trident
