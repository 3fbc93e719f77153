// The cpu-guarded test backend: it must fail where the CUDA backend would (host code touching
// device memory, host memory handed to a kernel) and compute what "cpu" computes.
#include <gtest/gtest.h>

#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/ops/ops.hpp"

namespace trident {
namespace {

std::unique_ptr<ops::Ops> guarded() { return ops::make_ops("cpu-guarded", 1); }

TEST(Guarded, CopiesInAndOutAndComputesAsTheCpu) {
  auto g = guarded();
  auto cpu = ops::make_ops("cpu", 1);
  ASSERT_NE(g->memory(), nullptr);
  EXPECT_EQ(cpu->memory(), nullptr);
  const int n = 4, c = 8;
  std::vector<float> x(n * c), w(c, 1.5f), b(c, 0.25f), y(n * c), mean(n), rstd(n);
  for (int i = 0; i < n * c; ++i) x[std::size_t(i)] = float(i % 7) - 2.5f;
  FloatBuffer dx(n * c, g->memory()), dw(c, g->memory()), db(c, g->memory()),
      dy(n * c, g->memory()), dm(n, g->memory()), dr(n, g->memory());
  EXPECT_TRUE(dx.on_device());
  EXPECT_TRUE(g->memory()->holds(dx.data()));
  EXPECT_FALSE(g->memory()->holds(x.data()));
  copy_to_device(g->memory(), dx.data(), x.data(), x.size() * 4);
  copy_to_device(g->memory(), dw.data(), w.data(), w.size() * 4);
  copy_to_device(g->memory(), db.data(), b.data(), b.size() * 4);
  g->layernorm_forward(dy.data(), dm.data(), dr.data(), dx.data(), dw.data(), db.data(), n, c);
  std::vector<float> from_device(n * c);
  copy_to_host(g->memory(), from_device.data(), dy.data(), from_device.size() * 4);
  cpu->layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
  EXPECT_EQ(from_device, y);
  EXPECT_GT(g->memory()->used(), 0u);
}

TEST(Guarded, RefusesHostMemoryInAKernel) {
  auto g = guarded();
  FloatBuffer d(16, g->memory());
  std::vector<float> host(16, 1.0f);
  EXPECT_THROW(g->add(d.data(), d.data(), host.data(), 16), Error);
  EXPECT_THROW(g->fill(host.data(), 0.0f, 16), Error);
  EXPECT_NO_THROW(g->fill(d.data(), 0.0f, 16));
}

TEST(GuardedDeathTest, HostCodeCannotTouchDeviceMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto g = guarded();
  FloatBuffer d(16, g->memory());
  g->fill(d.data(), 2.0f, 16);
  float* p = d.data();
  EXPECT_DEATH({ volatile float v = p[3]; (void)v; }, "");
  EXPECT_DEATH({ p[0] = 1.0f; }, "");
  std::vector<float> host(16);
  copy_to_host(g->memory(), host.data(), p, 64);  // the sanctioned way
  EXPECT_EQ(host[3], 2.0f);
}

TEST(Guarded, MirrorsAndBuffersReleaseTheirBlocks) {
  auto g = guarded();
  DeviceMemory* mem = g->memory();
  const std::size_t before = mem->used();
  {
    FloatBuffer d(1000, mem);
    g->fill(d.data(), 3.0f, 1000);
    HostMirror m(mem, d.data(), 1000, true);
    EXPECT_FALSE(mem->holds(m.data()));
    EXPECT_EQ(m.data()[999], 3.0f);
    m.data()[0] = -1.0f;
    m.commit();
    float back = 0;
    copy_to_host(mem, &back, d.data(), 4);
    EXPECT_EQ(back, -1.0f);
  }
  EXPECT_EQ(mem->used(), before);
  std::vector<float> host(4, 5.0f);
  HostMirror same(mem, host.data(), 4, true);  // host memory: no copy
  EXPECT_EQ(same.data(), host.data());
}

}  // namespace
}  // namespace trident
