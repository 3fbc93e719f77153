// The cpu-guarded test backend: it must fail where the CUDA backend would (host code touching
// device memory, host memory handed to a kernel) and compute what "cpu" computes.
#include <gtest/gtest.h>

#include <memory>
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

// The Llama ops (RMSNorm, RoPE, SwiGLU) forward and backward: the guarded backend takes and
// gives device memory only, and computes what "cpu" computes, bit for bit.
TEST(Guarded, LlamaOpsComputeAsTheCpu) {
  auto g = guarded();
  auto cpu = ops::make_ops("cpu", 1);
  DeviceMemory* mem = g->memory();
  const int b = 2, t = 5, heads = 3, hs = 4, c = heads * hs, n = b * t, f = 7;
  auto host = [](std::size_t k, float scale) {
    std::vector<float> v(k);
    for (std::size_t i = 0; i < k; ++i) v[i] = scale * (float((i * 37) % 23) - 11.0f) / 7.0f;
    return v;
  };
  auto device = [&](const std::vector<float>& h) {
    auto d = std::make_unique<FloatBuffer>(h.size(), mem);
    copy_to_device(mem, d->data(), h.data(), h.size() * 4);
    return d;
  };
  auto back = [&](const FloatBuffer& d) {
    std::vector<float> h(d.size());
    copy_to_host(mem, h.data(), d.data(), h.size() * 4);
    return h;
  };
  const std::vector<float> x = host(n * c, 1.0f), w = host(c, 0.3f), dy = host(n * c, 0.5f);
  const std::vector<float> gu = host(n * 2 * f, 2.0f), dyf = host(n * f, 0.7f);
  // cpu
  std::vector<float> y(n * c), rstd(n), dx(n * c, 0.5f), dw(c, 0.25f), r = x, h(n * f), dgu(n * 2 * f);
  cpu->rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), n, c, 1e-5f);
  cpu->rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), n, c);
  cpu->rope_forward(r.data(), b, t, c, heads, hs, 3, 10000.0f);
  std::vector<float> rb = r;
  cpu->rope_backward(rb.data(), b, t, c, heads, hs, 3, 10000.0f);
  cpu->swiglu_forward(h.data(), gu.data(), n, f);
  cpu->swiglu_backward(dgu.data(), gu.data(), dyf.data(), n, f);
  // guarded
  auto gx = device(x), gw = device(w), gdy = device(dy), ggu = device(gu), gdyf = device(dyf);
  auto gy = device(std::vector<float>(n * c)), grstd = device(std::vector<float>(n));
  auto gdx = device(std::vector<float>(n * c, 0.5f)), gdw = device(std::vector<float>(c, 0.25f));
  auto gr = device(x), gh = device(std::vector<float>(n * f)), gdgu = device(std::vector<float>(n * 2 * f));
  g->rmsnorm_forward(gy->data(), grstd->data(), gx->data(), gw->data(), n, c, 1e-5f);
  g->rmsnorm_backward(gdx->data(), gdw->data(), gdy->data(), gx->data(), gw->data(), grstd->data(), n, c);
  g->rope_forward(gr->data(), b, t, c, heads, hs, 3, 10000.0f);
  EXPECT_EQ(back(*gr), r) << "rope_forward";
  g->rope_backward(gr->data(), b, t, c, heads, hs, 3, 10000.0f);
  g->swiglu_forward(gh->data(), ggu->data(), n, f);
  g->swiglu_backward(gdgu->data(), ggu->data(), gdyf->data(), n, f);
  EXPECT_EQ(back(*gy), y) << "rmsnorm_forward y";
  EXPECT_EQ(back(*grstd), rstd) << "rmsnorm_forward rstd";
  EXPECT_EQ(back(*gdx), dx) << "rmsnorm_backward dx";
  EXPECT_EQ(back(*gdw), dw) << "rmsnorm_backward dw";
  EXPECT_EQ(back(*gr), rb) << "rope_backward";
  EXPECT_EQ(back(*gh), h) << "swiglu_forward";
  EXPECT_EQ(back(*gdgu), dgu) << "swiglu_backward";
  // host memory handed to each of them is refused
  std::vector<float> hx = x;
  EXPECT_THROW(g->rmsnorm_forward(gy->data(), nullptr, hx.data(), gw->data(), n, c, 1e-5f), Error);
  EXPECT_THROW(g->rope_forward(hx.data(), b, t, c, heads, hs, 0, 10000.0f), Error);
  EXPECT_THROW(g->swiglu_backward(gdgu->data(), hx.data(), gdyf->data(), n, f), Error);
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
