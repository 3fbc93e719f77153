// test/unit/ops/cuda/emulate/driver.cpp — trident's CUDA kernels, run on the CPU through
// shim/emu.hpp, against the CPU backend (make_cpu_ops). A check that needs no GPU: indexing,
// masks, reductions and the cuBLAS argument mapping of attention (with column-major OpenBLAS
// calls standing in for cuBLAS: exactly cublasGemmStridedBatchedEx's semantics), on odd
// shapes. Norm as in cuda_ops_test.cpp: ||emulated - cpu||_inf <= tol ||cpu||_inf.
// Not a CTest test; run.sh builds and runs it (about 10 s, most of it compiling).
#include <cblas.h>
#include <cuda_runtime.h>  // the shim's: emu::vector_accesses
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>
#include <vector>
#include "fused_head.hpp"
#include "kernels.hpp"
#include "plans.hpp"
#include "trident/ops/adamw.hpp"
#include "trident/ops/ops.hpp"
using namespace trident;
using namespace trident::ops::cuda;
using V = std::vector<float>;
std::mt19937 g(3);  // NOLINT: one generator for the whole run
V rnd(size_t n, float sd = 1, float mean = 0) { std::normal_distribution<float> d(mean, sd); V v(n); for (auto& x : v) x = d(g); return v; }
int bad = 0;
float bf16_round(float f) { std::uint32_t u; std::memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); u &= 0xffff0000u; std::memcpy(&f, &u, 4); return f; }
double maxdiff(const V& a, const V& b) { double e = 0; for (size_t i = 0; i < a.size(); i++) e = std::fmax(e, std::fabs(double(a[i]) - b[i])); return e; }
double maxabs(const V& a) { double r = 0; for (float x : a) r = std::fmax(r, std::fabs(x)); return r; }
// scale > 0: the error relative to it instead of ||want||_inf (a set of outputs, one norm)
void cmp(const char* what, const V& got, const V& want, double tol, double scale = 0) {
  double e = 0, r = 0; bool nan = false;
  for (size_t i = 0; i < got.size(); i++) { double d = std::fabs(double(got[i]) - want[i]); if (std::isnan(d)) nan = true; e = std::fmax(e, d); r = std::fmax(r, std::fabs(want[i])); }
  if (scale > 0) r = scale;
  bool ok = !nan && e <= tol * r;
  if (!ok) bad++;
  printf("%-44s %s  err %.2e  ref %.2e\n", what, ok ? "ok  " : "BAD ", e, r);
}
// cuBLAS stand-in: cublasGemmStridedBatchedEx's column-major semantics through OpenBLAS.
static void cublas_batched(const ColMajor& g, float alpha, float beta, float* c, int ldc,
                           std::int64_t sc, int batch) {
  for (int i = 0; i < batch; i++)
    cblas_sgemm(CblasColMajor, g.trans1 ? CblasTrans : CblasNoTrans, g.trans2 ? CblasTrans : CblasNoTrans,
                g.m, g.n, g.k, alpha, g.p1 + i * g.stride1, g.ld1, g.p2 + i * g.stride2, g.ld2, beta,
                c + i * sc, ldc);
}
// CudaOps::gemm_batched_rm with the stand-in: the production mapping (col_major).
static void gemm_batched_rm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                            std::int64_t sa, const float* b, int ldb, std::int64_t sb, float beta, float* c,
                            int ldc, std::int64_t sc, int batch) {
  cublas_batched(col_major(ta, tb, m, n, k, a, lda, sa, b, ldb, sb), alpha, beta, c, ldc, sc, batch);
}
int main() {
  auto cpu = ops::make_cpu_ops(1);
  // run.sh's second run: the tensor-core kernels built with a float standing in for bf16
  // (shim/cuda_bf16.h), so their logic must match fp32 to fp32's accuracy.
  const bool exact_bf16 = std::getenv("TRIDENT_EMU_BF16_EXACT") != nullptr;
  const double tc_tol_out = exact_bf16 ? 1e-5 : 2e-2, tc_tol_grad = exact_bf16 ? 1e-4 : 2e-2;
  char name[128];
  // every transpose pair, leading dimensions wider than the matrices, alpha and beta
  for (int tcase = 0; tcase < 4; tcase++) {
    const bool ta = tcase & 1, tb = tcase & 2;
    const int m = 37, n = 29, k = 41, lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 5;
    V a = rnd(size_t(ta ? k : m) * lda), bm = rnd(size_t(tb ? n : k) * ldb), c0 = rnd(size_t(m) * ldc);
    V c1 = c0, c2 = c0;
    cpu->gemm(ta, tb, m, n, k, 0.7f, a.data(), lda, bm.data(), ldb, 0.3f, c1.data(), ldc);
    gemm_batched_rm(ta, tb, m, n, k, 0.7f, a.data(), lda, 0, bm.data(), ldb, 0, 0.3f, c2.data(), ldc, 0, 1);
    snprintf(name, sizeof name, "gemm ta%d tb%d (col_major mapping)", int(ta), int(tb));
    cmp(name, c2, c1, 1e-5);
  }
  const int ln[][2] = {{5, 12}, {3, 1}, {7, 33}, {300, 130}, {70, 768}};
  for (auto& s : ln) {
    int n = s[0], c = s[1];
    V x = rnd(size_t(n) * c, 2, 0.5), w = rnd(c, 0.2, 1), b = rnd(c, 0.5), dy = rnd(x.size()), dx0 = rnd(x.size()), dw0 = rnd(c), db0 = rnd(c);
    V y(x.size()), m(n), r(n), dx = dx0, dw = dw0, db = db0;
    V y2(x.size(), 777), m2(n, 777), r2(n, 777), dx2 = dx0, dw2 = dw0, db2 = db0;
    cpu->layernorm_forward(y.data(), m.data(), r.data(), x.data(), w.data(), b.data(), n, c);
    cpu->layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), m.data(), r.data(), n, c);
    launch_layernorm_forward(nullptr, y2.data(), m2.data(), r2.data(), x.data(), w.data(), b.data(), n, c);
    V partial(layernorm_partial_floats(n, c));
    launch_layernorm_backward(nullptr, dx2.data(), dw2.data(), db2.data(), dy.data(), x.data(), w.data(), m2.data(), r2.data(), n, c, partial.data());
    snprintf(name, sizeof name, "layernorm n%d c%d y", n, c); cmp(name, y2, y, 1e-5);
    cmp("  mean", m2, m, 1e-5); cmp("  rstd", r2, r, 1e-5); cmp("  dx", dx2, dx, 1e-5); cmp("  dw", dw2, dw, 1e-5); cmp("  db", db2, db, 1e-5);
  }
  // RMSNorm, RoPE, SwiGLU (Llama)
  for (auto& s : ln) {
    int n = s[0], c = s[1];
    V x = rnd(size_t(n) * c, 2, 0.5), w = rnd(c, 0.2, 1), dy = rnd(x.size()), dx0 = rnd(x.size()), dw0 = rnd(c);
    V y(x.size()), r(n), dx = dx0, dw = dw0, y2(x.size(), 777), r2(n, 777), dx2 = dx0, dw2 = dw0;
    cpu->rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), n, c, 1e-5f);
    cpu->rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), r.data(), n, c);
    launch_rmsnorm_forward(nullptr, y2.data(), r2.data(), x.data(), w.data(), n, c, 1e-5f);
    V partial(rmsnorm_partial_floats(n, c));
    launch_rmsnorm_backward(nullptr, dx2.data(), dw2.data(), dy.data(), x.data(), w.data(), r2.data(), n, c, partial.data());
    snprintf(name, sizeof name, "rmsnorm n%d c%d y", n, c); cmp(name, y2, y, 1e-5);
    cmp("  rstd", r2, r, 1e-5); cmp("  dx", dx2, dx, 1e-5); cmp("  dw", dw2, dw, 1e-5);
  }
  struct R { int b, t, ld, heads, hs, pos0; float theta; } ropes[] = {{2, 7, 36, 6, 4, 0, 1e4f}, {3, 33, 50, 3, 16, 4093, 1e4f}, {2, 65, 200, 6, 32, 0, 5e5f}};
  for (auto& s : ropes) {
    V x = rnd(size_t(s.b) * s.t * s.ld), y = x, y2 = x, d = rnd(x.size()), d2 = d;
    cpu->rope_forward(y.data(), s.b, s.t, s.ld, s.heads, s.hs, s.pos0, s.theta);
    cpu->rope_backward(d.data(), s.b, s.t, s.ld, s.heads, s.hs, s.pos0, s.theta);
    launch_rope(nullptr, y2.data(), s.b, s.t, s.ld, s.heads, s.hs, s.pos0, s.theta, 1.0f);
    launch_rope(nullptr, d2.data(), s.b, s.t, s.ld, s.heads, s.hs, s.pos0, s.theta, -1.0f);
    snprintf(name, sizeof name, "rope b%d t%d ld%d h%d hs%d p%d", s.b, s.t, s.ld, s.heads, s.hs, s.pos0);
    cmp(name, y2, y, 1e-6); cmp("  backward", d2, d, 1e-6);
  }
  for (auto& s : {std::pair<int, int>{3, 11}, {130, 172}}) {
    int n = s.first, f = s.second;
    V gu = rnd(size_t(n) * 2 * f, 3), dy = rnd(size_t(n) * f);
    float sp[] = {0, 1e-4f, -1e-4f, 1, -1, 20, -20, 90, -90}; for (int i = 0; i < 9 && i < f; i++) gu[i] = sp[i];
    V y(dy.size()), y2(dy.size(), 7), dg(gu.size()), dg2(gu.size(), 7);
    cpu->swiglu_forward(y.data(), gu.data(), n, f); cpu->swiglu_backward(dg.data(), gu.data(), dy.data(), n, f);
    launch_swiglu_forward(nullptr, y2.data(), gu.data(), n, f); launch_swiglu_backward(nullptr, dg2.data(), gu.data(), dy.data(), n, f);
    snprintf(name, sizeof name, "swiglu n%d f%d y", n, f); cmp(name, y2, y, 1e-5); cmp("  dgu", dg2, dg, 1e-5);
  }
  struct D { int b, s, nh, nkv, hs; } decodes[] = {{1, 1, 2, 2, 4}, {2, 9, 4, 2, 8}, {3, 37, 6, 1, 4}};
  for (auto& d : decodes) {
    const int c = d.nh * d.hs, ckv = d.nkv * d.hs;
    const std::int64_t ld_kv = 2 * ckv + 3, kv_batch = (d.s + 2) * ld_kv, ld_q = c + 5;
    V q = rnd(size_t(d.b) * ld_q), kv = rnd(size_t(d.b) * kv_batch, 1.5f);
    V o1(size_t(d.b) * (c + 1), 0), o2 = o1, sc(size_t(ops::Ops::decode_scratch_floats(d.b, d.nh, d.s)));
    cpu->attention_decode(o1.data(), sc.data(), q.data(), kv.data(), kv.data() + ckv, d.b, d.s, d.nh, d.nkv, d.hs, ld_q, ld_kv, kv_batch, c + 1);
    launch_attention_decode(nullptr, o2.data(), sc.data(), q.data(), kv.data(), kv.data() + ckv, d.b, d.s, d.nh, d.nkv, d.hs, ld_q, ld_kv, kv_batch, c + 1);
    snprintf(name, sizeof name, "attention_decode b%d s%d nh%d nkv%d", d.b, d.s, d.nh, d.nkv); cmp(name, o2, o1, 1e-5);
  }
  const int att[][4] = {{2, 7, 12, 3}, {1, 1, 4, 1}, {3, 33, 8, 1}, {2, 67, 16, 4}};
  for (auto& s : att) {
    int b = s[0], t = s[1], c = s[2], nh = s[3];
    std::int64_t tt = std::int64_t(t) * t;
    V qkv = rnd(size_t(b) * t * 3 * c), dout = rnd(size_t(b) * t * c);
    V o1(dout.size()), a1(size_t(b) * nh * tt), dq1(qkv.size()), da1(a1.size());
    cpu->attention_naive_forward(o1.data(), a1.data(), qkv.data(), b, t, c, nh);
    cpu->attention_naive_backward(dq1.data(), da1.data(), dout.data(), qkv.data(), a1.data(), b, t, c, nh);
    V o2(o1.size(), 777), a2(a1.size(), 777), dq2(qkv.size(), 777), da2(a1.size(), 777);
    // the production plans (plans.hpp) with the emulated softmax kernels
    attention_forward_steps(gemm_batched_rm,
                            [](float* a, std::int64_t rows, int tq) { launch_causal_softmax(nullptr, a, rows, tq); },
                            o2.data(), a2.data(), qkv.data(), b, t, c, nh);
    attention_backward_steps(gemm_batched_rm,
                             [](float* d, const float* a, std::int64_t rows, int tq, float sc) {
                               launch_causal_softmax_backward(nullptr, d, a, rows, tq, sc);
                             },
                             dq2.data(), da2.data(), dout.data(), qkv.data(), a2.data(), b, t, c, nh);
    snprintf(name, sizeof name, "attention b%d t%d c%d nh%d out", b, t, c, nh); cmp(name, o2, o1, 1e-5);
    cmp("  att", a2, a1, 1e-5); cmp("  dqkv", dq2, dq1, 1e-5);
  }
  // flash attention (flash_attention.cu) against the CPU's: tile remainders (16-row tiles),
  // grouped-query heads, padded row strides, head sizes up to the kernel's 128; causal and
  // full (ring attention's blocks against earlier keys)
  const auto to_fs = [](const ops::Ops::AttentionShape& sh) {
    return FlashShape{sh.b, sh.t, sh.nh, sh.nkv, sh.hs, sh.ld_q, sh.ld_k, sh.ld_v, sh.ld_o,
                      sh.batch_q(), sh.batch_k(), sh.batch_v(), sh.batch_o(), sh.lse_row(),
                      sh.causal, sh.accumulate};
  };
  const int fl[][6] = {{2, 37, 3, 3, 24, 1}, {1, 2, 2, 1, 4, 1}, {2, 45, 4, 2, 16, 1}, {1, 70, 2, 1, 128, 1}, {1, 33, 1, 1, 7, 1},
                       {2, 37, 3, 3, 24, 0}, {2, 45, 4, 2, 16, 0}, {1, 1, 2, 1, 4, 0}};
  for (auto& f : fl) {
    ops::Ops::AttentionShape sh;
    sh.b = f[0], sh.t = f[1], sh.nh = f[2], sh.nkv = f[3], sh.hs = f[4], sh.causal = f[5] != 0;
    sh.ld_q = sh.nh * sh.hs + 3, sh.ld_k = sh.nkv * sh.hs + 1, sh.ld_v = sh.nkv * sh.hs + 2, sh.ld_o = sh.nh * sh.hs + 1;
    const size_t rows = size_t(sh.b) * sh.t;
    V q = rnd(rows * sh.ld_q), k = rnd(rows * sh.ld_k), v = rnd(rows * sh.ld_v), dout = rnd(rows * sh.ld_o);
    V o1(rows * sh.ld_o, 0), l1(size_t(sh.b) * sh.nh * sh.t), dq1(q.size(), 0), dk1(k.size(), 0), dv1(v.size(), 0);
    V o2 = o1, l2(l1.size(), 7), dq2 = dq1, dk2 = dk1, dv2 = dv1;
    cpu->attention_forward(o1.data(), l1.data(), q.data(), k.data(), v.data(), sh);
    cpu->attention_backward(dq1.data(), dk1.data(), dv1.data(), dout.data(), o1.data(), l1.data(), q.data(), k.data(), v.data(), sh);
    const FlashShape fs = to_fs(sh);
    launch_flash_attention_forward(nullptr, o2.data(), l2.data(), q.data(), k.data(), v.data(), fs);
    launch_flash_attention_backward(nullptr, dq2.data(), dk2.data(), dv2.data(), dout.data(), o2.data(), l2.data(), q.data(), k.data(), v.data(), fs);
    snprintf(name, sizeof name, "flash%s b%d t%d nh%d nkv%d hs%d out", sh.causal ? "" : " full", sh.b, sh.t, sh.nh, sh.nkv, sh.hs);
    cmp(name, o2, o1, 1e-5);
    cmp("  lse", l2, l1, 1e-5); cmp("  dq", dq2, dq1, 1e-4); cmp("  dk", dk2, dk1, 1e-4); cmp("  dv", dv2, dv1, 1e-4);
  }
  // ring attention's blocks: a sequence of 2t rows as two blocks of t (batch strides 2t rows,
  // lse row stride 2t); the second half's queries against the first half's keys (full) and its
  // own (causal), merged (attention_merge, the first merge into lse = -inf); the backward of
  // every block accumulating into dq, dk, dv (which start non-zero); the scalar kernels
  // (f[5] = 0) and the tensor-core ones (1, bf16 tolerance)
  const int bl[][6] = {{2, 12, 3, 3, 8, 0}, {1, 37, 4, 2, 16, 0}, {2, 40, 3, 3, 32, 1}, {1, 75, 4, 2, 64, 1}};
  for (auto& f : bl) {
    const bool tcm = f[5] != 0;
    const auto fwd = tcm ? launch_flash_attention_tc_forward : launch_flash_attention_forward;
    const auto bwd = tcm ? launch_flash_attention_tc_backward : launch_flash_attention_backward;
    const double tol_o = tcm ? tc_tol_out : 1e-5, tol_g = tcm ? tc_tol_grad : 1e-4;
    ops::Ops::AttentionShape sh;
    sh.b = f[0], sh.t = f[1], sh.nh = f[2], sh.nkv = f[3], sh.hs = f[4];
    const int t = sh.t;
    sh.ld_q = sh.nh * sh.hs + 1, sh.ld_k = sh.nkv * sh.hs + 2, sh.ld_v = sh.nkv * sh.hs, sh.ld_o = sh.nh * sh.hs + 3;
    sh.bs_q = 2 * t * sh.ld_q, sh.bs_k = 2 * t * sh.ld_k, sh.bs_v = 2 * t * sh.ld_v, sh.bs_o = 2 * t * sh.ld_o, sh.bs_lse = 2 * t;
    sh.accumulate = true;
    ops::Ops::AttentionShape full = sh;
    full.causal = false;
    const size_t rows = size_t(sh.b) * 2 * t;
    const V q = rnd(rows * sh.ld_q), k = rnd(rows * sh.ld_k), v = rnd(rows * sh.ld_v), dout = rnd(rows * sh.ld_o), g0 = rnd(rows * sh.ld_q);
    const long tq = t * sh.ld_q, tk = t * sh.ld_k, tv = t * sh.ld_v, to = t * sh.ld_o;
    V o[2], l[2], part[2], pl[2], dq[2], dk[2], dv[2];
    for (int which = 0; which < 2; which++) {  // 0: CPU, 1: the kernels
      o[which] = V(rows * sh.ld_o, 0), l[which] = V(size_t(sh.b) * sh.nh * 2 * t, -INFINITY);
      part[which] = o[which], pl[which] = V(l[which].size(), 0);
      dq[which] = g0, dk[which] = V(k.size(), 0.5f), dv[which] = V(v.size(), -0.5f);
      for (int half = 0; half < 2; half++)
        for (int kb = 0; kb <= half; kb++) {
          const ops::Ops::AttentionShape& s2 = kb == half ? sh : full;
          float* po = part[which].data() + half * to; float* pls = pl[which].data() + half * t;
          float* oo = o[which].data() + half * to; float* ll = l[which].data() + half * t;
          if (which == 0) {
            cpu->attention_forward(po, pls, q.data() + half * tq, k.data() + kb * tk, v.data() + kb * tv, s2);
            cpu->attention_merge(oo, ll, po, pls, s2);
          } else {
            fwd(nullptr, po, pls, q.data() + half * tq, k.data() + kb * tk, v.data() + kb * tv, to_fs(s2));
            launch_attention_merge(nullptr, oo, ll, po, pls, to_fs(s2));
          }
        }
      for (int half = 0; half < 2; half++)
        for (int kb = 0; kb <= half; kb++) {
          const ops::Ops::AttentionShape& s2 = kb == half ? sh : full;
          float* a[3] = {dq[which].data() + half * tq, dk[which].data() + kb * tk, dv[which].data() + kb * tv};
          const float* in[6] = {dout.data() + half * to, o[which].data() + half * to, l[which].data() + half * t,
                                q.data() + half * tq, k.data() + kb * tk, v.data() + kb * tv};
          if (which == 0)
            cpu->attention_backward(a[0], a[1], a[2], in[0], in[1], in[2], in[3], in[4], in[5], s2);
          else
            bwd(nullptr, a[0], a[1], a[2], in[0], in[1], in[2], in[3], in[4], in[5], to_fs(s2));
        }
    }
    snprintf(name, sizeof name, "flash%s blocks b%d t%d nh%d nkv%d hs%d merged out", tcm ? " tc" : "", sh.b, t, sh.nh, sh.nkv, sh.hs);
    cmp(name, o[1], o[0], tol_o);
    cmp("  lse", l[1], l[0], tol_o); cmp("  dq", dq[1], dq[0], tol_g); cmp("  dk", dk[1], dk[0], tol_g); cmp("  dv", dv[1], dv[0], tol_g);
  }
  // Tensor-core flash attention (flash_attention_tc.cu: bf16 operands, fp32 accumulation)
  // against the CPU's fp32 attention, tolerance 2e-2 of the largest |value| (bf16 operands:
  // 8 bits of mantissa; the gradients against the largest of dq, dk, dv). Printed beside each
  // case: the error of the CPU's attention on inputs rounded to bf16, which the kernels' stays
  // close to. Causal and full, grouped-query heads, accumulate (gradients start
  // non-zero), q|k|v from one fused buffer and dq|dk|dv into one (GPT's layout), padded row
  // strides, t = 1 and t off the 64/32/16-row tiles, head sizes 16 to 128.
  {
    struct F { int b, t, nh, nkv, hs; bool causal, fused, accumulate; };
    const F tc[] = {{2, 37, 3, 3, 64, true, true, false},   {2, 37, 3, 3, 64, false, true, true},
                    {1, 1, 2, 1, 64, true, false, false},    {1, 1, 2, 2, 32, false, false, true},
                    {2, 130, 4, 2, 64, true, false, true},   {1, 100, 4, 2, 64, false, true, false},
                    {1, 77, 2, 1, 128, true, true, true},    {1, 45, 2, 2, 128, false, false, false},
                    {2, 70, 2, 2, 32, true, false, false},   {1, 50, 4, 1, 16, true, true, false},
                    {1, 33, 2, 2, 48, false, false, true},   {1, 96, 1, 1, 96, true, false, false},
                    {1, 200, 2, 2, 64, true, true, false}};
    for (const F& f : tc) {
      ops::Ops::AttentionShape sh;
      sh.b = f.b, sh.t = f.t, sh.nh = f.nh, sh.nkv = f.nkv, sh.hs = f.hs, sh.causal = f.causal, sh.accumulate = f.accumulate;
      const size_t rows = size_t(sh.b) * sh.t;
      const int cq = sh.nh * sh.hs, ckv = sh.nkv * sh.hs;
      V qkv, dqkv0, qs, ks, vs, dqs0, dks0, dvs0;
      const float *q, *k, *v;
      if (f.fused) {  // one [rows, cq + 2 ckv + 5] buffer, q | k | v at column offsets
        const int ld = cq + 2 * ckv + 5;
        sh.ld_q = sh.ld_k = sh.ld_v = ld;
        qkv = rnd(rows * ld, 1.5f);
        q = qkv.data(), k = qkv.data() + cq, v = qkv.data() + cq + ckv;
        dqkv0 = f.accumulate ? rnd(qkv.size(), 0.3f) : V(qkv.size(), 0);
      } else {
        sh.ld_q = cq + 3, sh.ld_k = ckv + 1, sh.ld_v = ckv + 2;
        qs = rnd(rows * sh.ld_q, 1.5f), ks = rnd(rows * sh.ld_k, 1.5f), vs = rnd(rows * sh.ld_v);
        q = qs.data(), k = ks.data(), v = vs.data();
        dqs0 = f.accumulate ? rnd(qs.size(), 0.3f) : V(qs.size(), 0);
        dks0 = f.accumulate ? rnd(ks.size(), 0.3f) : V(ks.size(), 0);
        dvs0 = f.accumulate ? rnd(vs.size(), 0.3f) : V(vs.size(), 0);
      }
      sh.ld_o = cq + 1;
      const V dout = rnd(rows * sh.ld_o);
      V o1(rows * sh.ld_o, 0), l1(size_t(sh.b) * sh.nh * sh.t), o2 = o1, l2(l1.size(), 7);
      V g1[3], g2[3];  // dq, dk, dv (fused: g[0] is the one dqkv buffer)
      if (f.fused) g1[0] = dqkv0; else g1[0] = dqs0, g1[1] = dks0, g1[2] = dvs0;
      for (int x = 0; x < 3; x++) g2[x] = g1[x];
      const auto grads = [&](V* g) {
        std::array<float*, 3> p;
        if (f.fused) p = {g[0].data(), g[0].data() + cq, g[0].data() + cq + ckv};
        else p = {g[0].data(), g[1].data(), g[2].data()};
        return p;
      };
      const auto p1 = grads(g1), p2 = grads(g2);
      cpu->attention_forward(o1.data(), l1.data(), q, k, v, sh);
      cpu->attention_backward(p1[0], p1[1], p1[2], dout.data(), o1.data(), l1.data(), q, k, v, sh);
      const FlashShape fs = to_fs(sh);
      if (!flash_tc_supported(fs)) { printf("flash tc: shape not supported\n"); bad++; continue; }
      launch_flash_attention_tc_forward(nullptr, o2.data(), l2.data(), q, k, v, fs);
      // the backward from the kernels' own out and lse, as in training (D = rowsum(dout out)
      // then agrees with the bf16 products: from the CPU's out the gradients err ~2x more)
      launch_flash_attention_tc_backward(nullptr, p2[0], p2[1], p2[2], dout.data(), o2.data(), l2.data(), q, k, v, fs);
      snprintf(name, sizeof name, "flash tc%s b%d t%d nh%d nkv%d hs%d%s%s out", sh.causal ? "" : " full", sh.b, sh.t, sh.nh,
               sh.nkv, sh.hs, f.fused ? " fused" : "", f.accumulate ? " acc" : "");
      // What bf16 inputs alone cost: the CPU's fp32 attention on q, k, v, dout rounded to bf16.
      if (!exact_bf16) {
      const auto round = [](const float* x, size_t n) { V r(x, x + n); for (auto& e : r) e = bf16_round(e); return r; };
      {
        const size_t nq = f.fused ? qkv.size() : qs.size();
        V rq = round(f.fused ? qkv.data() : qs.data(), nq), rk, rv;
        const float *q3 = rq.data(), *k3, *v3;
        if (f.fused) k3 = rq.data() + cq, v3 = rq.data() + cq + ckv;
        else rk = round(ks.data(), ks.size()), rv = round(vs.data(), vs.size()), k3 = rk.data(), v3 = rv.data();
        const V rdo = round(dout.data(), dout.size());
        V o3(o1.size(), 0), l3(l1.size()), g3[3];
        for (int x = 0; x < 3; x++) g3[x] = f.fused ? (x == 0 ? dqkv0 : V()) : (x == 0 ? dqs0 : x == 1 ? dks0 : dvs0);
        const auto p3 = grads(g3);
        cpu->attention_forward(o3.data(), l3.data(), q3, k3, v3, sh);
        cpu->attention_backward(p3[0], p3[1], p3[2], rdo.data(), o3.data(), l3.data(), q3, k3, v3, sh);
        printf("%-44s [bf16 inputs alone: out err %.2e, grads err %.2e]\n", name, maxdiff(o3, o1),
               std::max({maxdiff(g3[0], g1[0]), f.fused ? 0.0 : maxdiff(g3[1], g1[1]), f.fused ? 0.0 : maxdiff(g3[2], g1[2])}));
      }
      }
      cmp(name, o2, o1, tc_tol_out);
      cmp("  lse", l2, l1, tc_tol_out);
      if (f.fused) {
        cmp("  dqkv", g2[0], g1[0], tc_tol_grad);
      } else {  // one scale for the three: t = 1's dq and dk are 0 but for rounding
        const double sc = std::max({maxabs(g1[0]), maxabs(g1[1]), maxabs(g1[2])});
        cmp("  dq", g2[0], g1[0], tc_tol_grad, sc); cmp("  dk", g2[1], g1[1], tc_tol_grad, sc); cmp("  dv", g2[2], g1[2], tc_tol_grad, sc);
      }
    }
  }
  // Attention on bf16 storage (CudaOps::attention_forward_bf16 / backward_bf16's kernel
  // paths, attention_bf16.cpp): bf16 q, k, v, dout in, bf16 out, dq, dk, dv out, fp32 lse;
  // against the CPU's fp32 attention on the same bf16 inputs (widened exactly). Each case
  // runs "tc" (the tensor-core kernels instantiated on bf16 storage) where they take the head
  // size, and "widened" (widen into packed fp32, flash_attention.cu's kernels, narrow: the
  // fallback, composed here as attention_bf16.cpp composes it). Layouts: GPT's fused qkv
  // ([B,T,3C], q|k|v at column offsets, dq|dk|dv into one dqkv, out ld C), separate buffers
  // with odd padded strides, and ring attention's blocks (batch strides of 2t rows, lse rows
  // of 2t). Every output buffer starts at kPad (2^-7, small beside the values, so that the
  // norm is the outputs') beside what the call writes: the padding must stay. Tolerance as the tc cases: 2e-2 of the largest (the gradients: of dq, dk, dv's
  // largest). The exact build (a float standing in for bf16 inside the kernels; storage stays
  // 16-bit) feeds the CPU's backward the kernels' own out and lse; what remains is the
  // outputs' rounding to bf16, half an ulp, at most 2^-8 of the largest (4e-3); lse 1e-5.
  {
    using H = std::vector<std::uint16_t>;
    const auto bits_of = [](const V& x) { H h(x.size()); for (size_t i = 0; i < x.size(); i++) { float r = bf16_round(x[i]); std::uint32_t u; std::memcpy(&u, &r, 4); h[i] = std::uint16_t(u >> 16); } return h; };
    const auto widen = [](const H& h) { V x(h.size()); for (size_t i = 0; i < h.size(); i++) { std::uint32_t u = std::uint32_t(h[i]) << 16; std::memcpy(&x[i], &u, 4); } return x; };
    const double tol_out = exact_bf16 ? 4e-3 : 2e-2, tol_lse = exact_bf16 ? 1e-5 : 2e-2, tol_grad = exact_bf16 ? 4e-3 : 2e-2;
    const float kPad = 0.0078125f;
    enum Layout { kFused, kSeparate, kRing };
    struct F { int b, t, nh, nkv, hs; bool causal; Layout layout; };
    const F cases[] = {{2, 37, 3, 3, 64, true, kFused},    {1, 130, 2, 2, 32, true, kFused},
                       {1, 100, 4, 2, 64, true, kSeparate}, {2, 45, 4, 1, 16, true, kSeparate},
                       {1, 77, 2, 2, 128, true, kFused},   {1, 33, 2, 2, 48, true, kSeparate},
                       {1, 70, 1, 1, 96, false, kSeparate}, {2, 40, 2, 1, 64, false, kRing},
                       {1, 1, 2, 2, 16, true, kFused},     {2, 37, 3, 3, 24, true, kFused},
                       {1, 50, 4, 2, 40, true, kSeparate},  {2, 29, 2, 2, 8, false, kRing}};
    for (const F& f : cases) {
      ops::Ops::AttentionShape sh;
      sh.b = f.b, sh.t = f.t, sh.nh = f.nh, sh.nkv = f.nkv, sh.hs = f.hs, sh.causal = f.causal;
      const int cq = f.nh * f.hs, ckv = f.nkv * f.hs;
      const size_t span = f.layout == kRing ? 2 * size_t(f.t) : size_t(f.t);  // rows a sequence takes
      const size_t rows = size_t(f.b) * span;
      // in: q, k, v (one buffer when fused: qkv); g: the gradients likewise; q|k|v offsets
      V in[3];
      H in16[3];
      size_t off[3] = {0, 0, 0};
      int nbuf = 3;
      if (f.layout == kFused) {
        nbuf = 1;
        sh.ld_q = sh.ld_k = sh.ld_v = cq + 2 * ckv;
        in[0] = rnd(rows * sh.ld_q, 1.5f);
        off[1] = size_t(cq), off[2] = size_t(cq + ckv);
      } else {
        sh.ld_q = cq + 3, sh.ld_k = ckv + 1, sh.ld_v = ckv + 2;
        in[0] = rnd(rows * sh.ld_q, 1.5f), in[1] = rnd(rows * sh.ld_k, 1.5f), in[2] = rnd(rows * sh.ld_v);
      }
      sh.ld_o = f.layout == kFused ? cq : cq + 1;
      if (f.layout == kRing) {
        sh.bs_q = std::int64_t(span) * sh.ld_q, sh.bs_k = std::int64_t(span) * sh.ld_k;
        sh.bs_v = std::int64_t(span) * sh.ld_v, sh.bs_o = std::int64_t(span) * sh.ld_o;
        sh.bs_lse = std::int64_t(span);
      }
      for (int x = 0; x < nbuf; x++) in16[x] = bits_of(in[x]), in[x] = widen(in16[x]);
      const auto ptr = [&](auto* bufs, int x) { return bufs[f.layout == kFused ? 0 : x].data() + off[x]; };
      const H dout16 = bits_of(rnd(rows * sh.ld_o));
      const V dout = widen(dout16);
      const size_t lse_n = size_t(f.b) * f.nh * (f.layout == kRing ? span : size_t(f.t));
      // the CPU on the bf16 inputs
      V o1(rows * sh.ld_o, kPad), l1(lse_n, kPad);
      cpu->attention_forward(o1.data(), l1.data(), ptr(in, 0), ptr(in, 1), ptr(in, 2), sh);
      const FlashShape fs = to_fs(sh);
      for (int path = 0; path < 2; path++) {  // 0: tc, 1: widened
        const bool tc = path == 0;
        if (tc && !flash_tc_supported(fs)) continue;
        H o2(o1.size()), g2[3];
        const std::uint16_t pad = bits_of(V{kPad})[0];
        std::fill(o2.begin(), o2.end(), pad);
        V l2(lse_n, kPad);
        for (int x = 0; x < nbuf; x++) g2[x] = H(in[x].size(), pad);
        const std::uint16_t *q16 = ptr(in16, 0), *k16 = ptr(in16, 1), *v16 = ptr(in16, 2);
        std::uint16_t *dq16 = ptr(g2, 0), *dk16 = ptr(g2, 1), *dv16 = ptr(g2, 2);
        if (tc) {
          launch_flash_attention_tc_forward_bf16(nullptr, o2.data(), l2.data(), q16, k16, v16, fs);
          launch_flash_attention_tc_backward_bf16(nullptr, dq16, dk16, dv16, dout16.data(), o2.data(), l2.data(), q16, k16, v16, fs);
        } else {  // attention_bf16.cpp's step 3
          FlashShape p = fs;
          p.ld_q = p.ld_o = cq, p.ld_k = p.ld_v = ckv;
          p.bs_q = p.bs_o = std::int64_t(f.t) * cq, p.bs_k = p.bs_v = std::int64_t(f.t) * ckv;
          const size_t nq = size_t(f.b) * f.t * cq, nk = size_t(f.b) * f.t * ckv;
          V q32(nq), k32(nk), v32(nk), o32(nq), do32(nq), oo32(nq), dq32(nq, 5), dk32(nk, 5), dv32(nk, 5);
          launch_bf16_rows_to_float(nullptr, q32.data(), cq, p.bs_q, q16, sh.ld_q, fs.bs_q, f.b, f.t, cq);
          launch_bf16_rows_to_float(nullptr, k32.data(), ckv, p.bs_k, k16, sh.ld_k, fs.bs_k, f.b, f.t, ckv);
          launch_bf16_rows_to_float(nullptr, v32.data(), ckv, p.bs_v, v16, sh.ld_v, fs.bs_v, f.b, f.t, ckv);
          launch_flash_attention_forward(nullptr, o32.data(), l2.data(), q32.data(), k32.data(), v32.data(), p);
          launch_float_rows_to_bf16(nullptr, o2.data(), sh.ld_o, fs.bs_o, o32.data(), cq, p.bs_o, f.b, f.t, cq);
          launch_bf16_rows_to_float(nullptr, do32.data(), cq, p.bs_o, dout16.data(), sh.ld_o, fs.bs_o, f.b, f.t, cq);
          launch_bf16_rows_to_float(nullptr, oo32.data(), cq, p.bs_o, o2.data(), sh.ld_o, fs.bs_o, f.b, f.t, cq);
          launch_flash_attention_backward(nullptr, dq32.data(), dk32.data(), dv32.data(), do32.data(), oo32.data(), l2.data(), q32.data(), k32.data(), v32.data(), p);
          launch_float_rows_to_bf16(nullptr, dq16, sh.ld_q, fs.bs_q, dq32.data(), cq, p.bs_q, f.b, f.t, cq);
          launch_float_rows_to_bf16(nullptr, dk16, sh.ld_k, fs.bs_k, dk32.data(), ckv, p.bs_k, f.b, f.t, ckv);
          launch_float_rows_to_bf16(nullptr, dv16, sh.ld_v, fs.bs_v, dv32.data(), ckv, p.bs_v, f.b, f.t, ckv);
        }
        // the CPU's backward: from its own out and lse, or (exact build) from the kernels'
        const V o_k = widen(o2);
        const V& ob = exact_bf16 ? o_k : o1;
        const V& lb = exact_bf16 ? l2 : l1;
        V g1[3];
        for (int x = 0; x < nbuf; x++) g1[x] = V(in[x].size(), kPad);
        cpu->attention_backward(ptr(g1, 0), ptr(g1, 1), ptr(g1, 2), dout.data(), ob.data(), lb.data(), ptr(in, 0), ptr(in, 1), ptr(in, 2), sh);
        const char* lay = f.layout == kFused ? " gpt-qkv" : f.layout == kRing ? " ring" : "";
        snprintf(name, sizeof name, "attention bf16 %s%s b%d t%d nh%d nkv%d hs%d%s out", tc ? "tc" : "widened",
                 f.causal ? "" : " full", f.b, f.t, f.nh, f.nkv, f.hs, lay);
        cmp(name, o_k, o1, tol_out);
        cmp("  lse", l2, l1, tol_lse);
        double sc = 0;
        for (int x = 0; x < nbuf; x++) sc = std::max(sc, maxabs(g1[x]));
        const char* gname[3] = {"  dq", "  dk", "  dv"};
        for (int x = 0; x < nbuf; x++) cmp(nbuf == 1 ? "  dqkv" : gname[x], widen(g2[x]), g1[x], tol_grad, sc);
      }
    }
  }
  struct X { int n, ld, v, vs; float off, sd; } xs[] = {{5, 13, 11, 20, 0, 1}, {64, 1008, 1000, 0, 80, 5}, {3, 4109, 4096, 4096, -30, 3}};
  for (auto& s : xs) {
    V l = rnd(size_t(s.n) * s.ld, s.sd, s.off);
    for (int i = 0; i < s.n; i++) for (int j = s.v; j < s.ld; j++) l[size_t(i) * s.ld + j] = 1e4f;
    std::vector<std::int32_t> tg(s.n);
    for (int i = 0; i < s.n; i++) tg[i] = s.vs + int(g() % s.v);
    tg[0] = s.vs - 1; if (s.n > 1) tg[1] = s.vs + s.v;
    float scale = 1.0f / s.n;
    V mx(s.n), se(s.n), tl(s.n), loss(s.n), gr = l, mx2(s.n, 7), se2(s.n, 7), tl2(s.n, 7), loss2(s.n, 7), gr2 = l;
    cpu->xent_row_max(mx.data(), l.data(), s.n, s.ld, s.v);
    cpu->xent_sumexp(se.data(), tl.data(), l.data(), mx.data(), tg.data(), s.n, s.ld, s.v, s.vs);
    cpu->xent_loss(loss.data(), mx.data(), se.data(), tl.data(), s.n);
    cpu->xent_backward(gr.data(), mx.data(), se.data(), tg.data(), s.n, s.ld, s.v, s.vs, scale);
    launch_xent_row_max(nullptr, mx2.data(), l.data(), s.n, s.ld, s.v);
    launch_xent_sumexp(nullptr, se2.data(), tl2.data(), l.data(), mx2.data(), tg.data(), s.n, s.ld, s.v, s.vs);
    launch_xent_loss(nullptr, loss2.data(), mx2.data(), se2.data(), tl2.data(), s.n);
    launch_xent_backward(nullptr, gr2.data(), mx2.data(), se2.data(), tg.data(), s.n, s.ld, s.v, s.vs, scale);
    snprintf(name, sizeof name, "xent n%d ld%d v%d row_max", s.n, s.ld, s.v); cmp(name, mx2, mx, 0);
    cmp("  target_logit", tl2, tl, 0); cmp("  sumexp", se2, se, 1e-5); cmp("  loss", loss2, loss, 1e-5); cmp("  grad", gr2, gr, 1e-5);
  }
  // A vocabulary in two shards, as under TP: each shard's one-pass stats (xent_shard_stats),
  // the global max, each shard's sum rescaled (xent_rescale_sumexp), summed; on the kernels
  // and on the CPU backend, against the CPU's unsharded forward. Shard 1 is narrow, and in
  // one row holds the row's max (the other shard's sum then shrinks by its rescale).
  {
    const int n = 6, v0 = 700, v1 = 5, ld = v0 + v1;
    V l = rnd(size_t(n) * ld, 2, 1);
    l[size_t(2) * ld + v0 + 3] = 40.0f;
    std::vector<std::int32_t> tg(n);
    for (int i = 0; i < n; i++) tg[i] = int(g() % ld);
    tg[1] = v0 + 1;
    V mx(n), se(n), tl(n), loss(n);
    cpu->xent_forward(loss.data(), mx.data(), se.data(), tl.data(), l.data(), tg.data(), n, ld, ld, 0);
    for (int backend = 0; backend < 2; backend++) {
      V m0(n, 7), s0(n, 7), t0(n, 7), m1(n, 7), s1(n, 7), t1(n, 7), gm(n);
      // shard 0: columns [0, v0), shard 1: [v0, ld) (row stride ld, its own vocab_start)
      if (backend == 0) {
        launch_xent_forward(nullptr, nullptr, m0.data(), s0.data(), t0.data(), l.data(), tg.data(), n, ld, v0, 0);
        launch_xent_forward(nullptr, nullptr, m1.data(), s1.data(), t1.data(), l.data() + v0, tg.data(), n, ld, v1, v0);
      } else {
        cpu->xent_shard_stats(m0.data(), s0.data(), t0.data(), l.data(), tg.data(), n, ld, v0, 0);
        cpu->xent_shard_stats(m1.data(), s1.data(), t1.data(), l.data() + v0, tg.data(), n, ld, v1, v0);
      }
      for (int i = 0; i < n; i++) gm[i] = std::max(m0[i], m1[i]);
      if (backend == 0) {
        launch_xent_rescale_sumexp(nullptr, s0.data(), m0.data(), gm.data(), n);
        launch_xent_rescale_sumexp(nullptr, s1.data(), m1.data(), gm.data(), n);
      } else {
        cpu->xent_rescale_sumexp(s0.data(), m0.data(), gm.data(), n);
        cpu->xent_rescale_sumexp(s1.data(), m1.data(), gm.data(), n);
      }
      V ss(n), ts(n);
      for (int i = 0; i < n; i++) ss[i] = s0[i] + s1[i], ts[i] = t0[i] + t1[i];
      const char* who = backend == 0 ? "kernels" : "cpu";
      snprintf(name, sizeof name, "xent two shards (%s) row_max", who); cmp(name, gm, mx, 0);
      cmp("  target_logit", ts, tl, 0); cmp("  sumexp", ss, se, 1e-6);
    }
  }
  // linear_backward's dy under bf16: the packed copy (bit-identical to to_bf16) and db +=
  // column sums in one read, against double sums; n not a multiple of the row block.
  for (int shape = 0; shape < 2; shape++) {
    const int n = shape ? 200 : 3, cols = shape ? 300 : 5;
    V src = rnd(size_t(n) * cols), db0 = rnd(size_t(cols)), db = db0, partial(size_t(colsum_partial_floats(n, cols)), 7);
    std::vector<unsigned short> d1(src.size(), 1), d2(src.size(), 2);
    launch_to_bf16(nullptr, d1.data(), src.data(), n, cols, cols);
    launch_to_bf16_colsum(nullptr, d2.data(), db.data(), partial.data(), src.data(), n, cols);
    V want(cols);
    for (int c = 0; c < cols; c++) { double sum = db0[c]; for (int r = 0; r < n; r++) sum += src[size_t(r) * cols + c]; want[c] = float(sum); }
    snprintf(name, sizeof name, "to_bf16_colsum n%d cols%d db", n, cols);
    cmp(name, db, want, 1e-5);
    const bool same = d1 == d2;
    if (!same) bad++;
    printf("%-44s %s\n", "  packed bf16 = to_bf16", same ? "ok  " : "BAD ");
  }
  // The one-pass forward (online max and sum) against the CPU's default (the three passes),
  // on the shapes above and on ascending rows (each thread's max grows at every element, so
  // its sum is rescaled every time) and descending ones.
  for (int shape = 0; shape < 5; shape++) {
    X s = shape < 3 ? xs[shape] : X{4, 5000, 4999, 7, 0, 1};
    V l = rnd(size_t(s.n) * s.ld, s.sd, s.off);
    if (shape >= 3)
      for (int i = 0; i < s.n; i++)
        for (int j = 0; j < s.ld; j++) l[size_t(i) * s.ld + j] = 0.01f * float(shape == 3 ? j : s.ld - j) + float(i);
    for (int i = 0; i < s.n; i++) for (int j = s.v; j < s.ld; j++) l[size_t(i) * s.ld + j] = 1e4f;
    std::vector<std::int32_t> tg(s.n);
    for (int i = 0; i < s.n; i++) tg[i] = s.vs + int(g() % s.v);
    tg[0] = s.vs - 1;
    V mx(s.n), se(s.n), tl(s.n), loss(s.n), mx2(s.n, 7), se2(s.n, 7), tl2(s.n, 7), loss2(s.n, 7);
    cpu->xent_forward(loss.data(), mx.data(), se.data(), tl.data(), l.data(), tg.data(), s.n, s.ld, s.v, s.vs);
    launch_xent_forward(nullptr, loss2.data(), mx2.data(), se2.data(), tl2.data(), l.data(), tg.data(), s.n, s.ld, s.v, s.vs);
    snprintf(name, sizeof name, "xent_forward n%d ld%d v%d%s row_max", s.n, s.ld, s.v, shape == 3 ? " ascending" : shape == 4 ? " descending" : "");
    cmp(name, mx2, mx, 0);
    cmp("  target_logit", tl2, tl, 0); cmp("  sumexp", se2, se, 1e-6); cmp("  loss", loss2, loss, 1e-6);
  }
  { int n = 300, c = 130, vs = 1000, v = 57;
    V wte = rnd(size_t(v) * c), dx = rnd(size_t(n) * c), dw0 = rnd(wte.size());
    std::vector<std::int32_t> tok(n); for (auto& t : tok) t = vs - 3 + int(g() % (v + 6)); tok[1] = tok[2] = vs + 1;
    V x(size_t(n) * c), x2(x.size(), 7), dw = dw0, dw2 = dw0;
    cpu->embedding_forward(x.data(), tok.data(), wte.data(), n, c, vs, v); cpu->embedding_backward(dw.data(), dx.data(), tok.data(), n, c, vs, v);
    launch_embedding_forward(nullptr, x2.data(), tok.data(), wte.data(), n, c, vs, v); launch_embedding_backward(nullptr, dw2.data(), dx.data(), tok.data(), n, c, vs, v, nullptr);
    cmp("embedding x", x2, x, 0); cmp("  dwte (atomicAdd, the baseline)", dw2, dw, 1e-5);
    // Grouped by row: the CPU's order of additions, so its bits. Tokens: the mix above (out of
    // range too), one row hit by a third of them, every token one row, and n > 4 blocks.
    for (int mix = 0; mix < 3; mix++) {
      const int nn = mix == 2 ? 1100 : n;
      std::vector<std::int32_t> tk(nn);
      for (int i = 0; i < nn; i++) tk[i] = mix == 0 ? tok[i] : mix == 1 ? (i % 3 ? tok[i] : vs + 5) : vs + 2;
      V dxx = rnd(size_t(nn) * c), dwa = dw0, dwb = dw0;
      std::vector<int> sort(size_t(embedding_backward_scratch_ints(nn, v)), -7);
      cpu->embedding_backward(dwa.data(), dxx.data(), tk.data(), nn, c, vs, v);
      launch_embedding_backward(nullptr, dwb.data(), dxx.data(), tk.data(), nn, c, vs, v, sort.data());
      cmp(mix == 0 ? "  dwte by row (mixed tokens)" : mix == 1 ? "  dwte by row (a hot row)" : "  dwte by row (one row only)", dwb, dwa, 0);
    }
    int b = 4, t = 65; c = 130; V x0 = rnd(size_t(b) * t * c), wpe = rnd(size_t(t) * c), d = rnd(x0.size()), dp0 = rnd(wpe.size());
    V xa = x0, xb = x0, dpa = dp0, dpb = dp0;
    cpu->position_forward(xa.data(), wpe.data(), b, t, c); cpu->position_backward(dpa.data(), d.data(), b, t, c);
    launch_position_forward(nullptr, xb.data(), wpe.data(), b, t, c); launch_position_backward(nullptr, dpb.data(), d.data(), b, t, c);
    cmp("position x", xb, xa, 0); cmp("  dwpe", dpb, dpa, 0);
  }
  for (int n : {11, 4001}) {
    V x = rnd(n, 3), dy = rnd(n); float sp[] = {0, 1e-4f, -1e-4f, 1, -1, 3, -3, 10, -10, 20, -20}; for (int i = 0; i < 11 && i < n; i++) x[i] = sp[i];
    V y(n), y2(n, 7), dx(n), dx2(n, 7);
    cpu->gelu_forward(y.data(), x.data(), n); cpu->gelu_backward(dx.data(), x.data(), dy.data(), n);
    launch_gelu_forward(nullptr, y2.data(), x.data(), n); launch_gelu_backward(nullptr, dx2.data(), x.data(), dy.data(), n);
    snprintf(name, sizeof name, "gelu n%d y", n); cmp(name, y2, y, 1e-5); cmp("  dx", dx2, dx, 1e-5);
    V a = rnd(n), s1(n), s2(n, 7), sc1 = a, sc2 = a, f(n, 7);
    cpu->add(s1.data(), a.data(), x.data(), n); launch_add(nullptr, s2.data(), a.data(), x.data(), n); cmp("  add", s2, s1, 0);
    cpu->scale(sc1.data(), -0.37f, n); launch_scale(nullptr, sc2.data(), -0.37f, n); cmp("  scale", sc2, sc1, 0);
    launch_fill(nullptr, f.data(), 2.5f, n); cmp("  fill", f, V(n, 2.5f), 0);
  }
  for (long n : {8L, 40001L}) {  // bf16 storage: bit for bit the CPU's conversions
    V x = rnd(n, 30); float sp[] = {0, -0.0f, 1 + 0x1p-8f, 1 + 3 * 0x1p-8f, 3.4028235e38f, -INFINITY, NAN, 1e-40f};
    for (int i = 0; i < 8; i++) x[i] = sp[i];
    std::vector<std::uint16_t> b1(n), b2(n, 0x1234); V y1(n), y2(n, 7);
    cpu->to_bf16(b1.data(), x.data(), n); cpu->from_bf16(y1.data(), b1.data(), n);
    launch_to_bf16(nullptr, b2.data(), x.data(), 1, n, n); launch_from_bf16(nullptr, y2.data(), b1.data(), n);
    bool ok = b1 == b2 && std::memcmp(y1.data(), y2.data(), n * sizeof(float)) == 0; bad += !ok;
    printf("bf16 to/from n%-7ld %s\n", n, ok ? "ok  " : "BAD ");
  }
  for (long n : {1L, 1000L, 30011L}) {
    V x = rnd(n, 3); double want = cpu->sum_squares(x.data(), n);
    std::vector<double> part(sum_squares_blocks()); double got = -1;
    launch_sum_squares(nullptr, &got, part.data(), x.data(), n);
    bool ok = std::fabs(got - want) <= 1e-10 * want; bad += !ok;
    printf("sum_squares n%-7ld %s got %.17g want %.17g\n", n, ok ? "ok  " : "BAD ", got, want);
  }
  { int n = 1001; V p = rnd(n), m = rnd(n, 0.1f), v(n); for (auto& e : v) e = float(g() % 1000) * 1e-5f;
    V p2 = p, m2 = m, v2 = v;
    for (int step = 1; step <= 3; step++) {
      V gr = rnd(n, 0.5); float bc1 = 1 - std::pow(0.9f, float(step)), bc2 = 1 - std::pow(0.95f, float(step));
      cpu->adamw(p.data(), gr.data(), m.data(), v.data(), n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2);
      auto s = ops::adamw_scalars(6e-4f, 0.9f, 0.95f, 0.1f, bc1, bc2);
      launch_adamw(nullptr, p2.data(), gr.data(), m2.data(), v2.data(), n, 0.9f, 0.95f, s.omb1, s.omb2, 1e-8f, s.decay, s.step, s.bc2_sqrt);
    }
    // GCC may fuse a multiply and an add in the CPU's AdamW (FMA machines); the kernel never
    // does: they agree to an ulp or two, not to the bit.
    cmp("adamw p", p2, p, 1e-6); cmp("  m", m2, m, 1e-6); cmp("  v", v2, v, 1e-6);
  }
  // The optimizer step over many tensors (Ops::sum_squares_spans, Ops::adamw_segments on
  // CUDA) against the per-tensor launches it replaces, bit for bit: segments of odd counts
  // (1, 0, sizes around a chunk and a block, one past kSumBlocks blocks) at scattered offsets
  // of one parameter buffer and one shard buffer (moments, gradients), weight decay on some,
  // the clip's scale on and off, a bf16 copy (the weight cache) on some and not others.
  {
    const long counts[] = {1, 0, 7, 4096, 4097, 255, 300001, 3, 1000};
    const int ns = int(sizeof counts / sizeof counts[0]);
    std::vector<long> at_p, at_s;  // each segment's offset in P and in the shard buffers
    long np = 5, nsh = 3;
    for (int i = 0; i < ns; i++) {
      at_p.push_back(np), at_s.push_back(nsh);
      np += counts[i] + 2 + i % 3, nsh += counts[i] + 1;
    }
    // sum_squares_spans: the sums of the spans against launch_sum_squares's, one by one.
    const V x = rnd(size_t(nsh), 2);
    std::vector<SumSquaresSpan> spans;
    long blocks = 0;
    for (int i = 0; i < ns; i++) {
      spans.push_back({x.data() + at_s[i], counts[i], blocks, sum_squares_span_blocks(counts[i])});
      blocks += spans.back().blocks;
    }
    std::vector<double> part(size_t(blocks), -1), sums(size_t(ns), -1), one(sum_squares_blocks());
    launch_sum_squares_spans(nullptr, sums.data(), part.data(), spans.data(), ns, blocks);
    bool ok = true;
    for (int i = 0; i < ns; i++) {
      double want = -1;
      launch_sum_squares(nullptr, &want, one.data(), x.data() + at_s[i], counts[i]);
      ok = ok && std::memcmp(&want, &sums[size_t(i)], sizeof want) == 0;
    }
    bad += !ok;
    printf("sum_squares_spans %d spans, %ld blocks %s\n", ns, blocks, ok ? "ok  " : "BAD ");
    // adamw_segments: three steps, clip off, on, off.
    const V p0 = rnd(size_t(np)), m0 = rnd(size_t(nsh), 0.1f);
    V v0(static_cast<size_t>(nsh));
    for (auto& e : v0) e = float(g() % 1000) * 1e-5f;
    V p1 = p0, m1 = m0, v1 = v0, p2 = p0, m2 = m0, v2 = v0;
    std::vector<std::uint16_t> p16(size_t(np), 0x1234);
    const float wd = 0.1f;
    for (int step = 1; step <= 3; step++) {
      const float clip = step == 2 ? 0.37f : 1.0f;
      const V gr = rnd(size_t(nsh), 0.5);
      V g1 = gr, g2 = gr;
      const float bc1 = 1 - std::pow(0.9f, float(step)), bc2 = 1 - std::pow(0.95f, float(step));
      std::vector<AdamWSegmentEntry> table;
      long chunks = 0;
      for (int i = 0; i < ns; i++) {
        const bool decay = i % 2 == 0;
        float* p = p1.data() + at_p[i];
        float* gi = g1.data() + at_s[i];
        if (clip != 1.0f) launch_scale(nullptr, gi, clip, counts[i]);
        const auto s = ops::adamw_scalars(6e-4f, 0.9f, 0.95f, decay ? wd : 0.0f, bc1, bc2);
        launch_adamw(nullptr, p, gi, m1.data() + at_s[i], v1.data() + at_s[i], counts[i], 0.9f,
                     0.95f, s.omb1, s.omb2, 1e-8f, s.decay, s.step, s.bc2_sqrt);
        if (counts[i] == 0) continue;  // as CudaOps::adamw_segments: not in the table
        std::uint16_t* cache = i % 3 != 1 ? p16.data() + at_p[i] : nullptr;
        table.push_back({p2.data() + at_p[i], g2.data() + at_s[i], m2.data() + at_s[i],
                         v2.data() + at_s[i], cache, counts[i], chunks, decay ? 1 : 0});
        chunks += adamw_chunks(counts[i]);
      }
      const auto on = ops::adamw_scalars(6e-4f, 0.9f, 0.95f, wd, bc1, bc2);
      const auto off = ops::adamw_scalars(6e-4f, 0.9f, 0.95f, 0.0f, bc1, bc2);
      launch_adamw_segments(nullptr, table.data(), int(table.size()), chunks, clip, 0.9f, 0.95f,
                            on.omb1, on.omb2, 1e-8f, on.decay, off.decay, on.step, on.bc2_sqrt);
    }
    const bool same = std::memcmp(p1.data(), p2.data(), p1.size() * 4) == 0 &&
                      std::memcmp(m1.data(), m2.data(), m1.size() * 4) == 0 &&
                      std::memcmp(v1.data(), v2.data(), v1.size() * 4) == 0;
    // The bf16 copy: each cached segment's rounding of the final p, everything else untouched.
    std::vector<std::uint16_t> want16(static_cast<size_t>(np), 0x1234), conv(static_cast<size_t>(np));
    launch_to_bf16(nullptr, conv.data(), p1.data(), 1, np, np);
    for (int i = 0; i < ns; i++)
      if (i % 3 != 1)
        for (long k = 0; k < counts[i]; k++) want16[size_t(at_p[i] + k)] = conv[size_t(at_p[i] + k)];
    const bool cached = p16 == want16, moved = maxdiff(p1, p0) > 1e-4;
    bad += !(same && cached && moved);
    printf("adamw_segments %d segments, 3 steps (clip off/on/off) %s p, m, v %s, bf16 copy %s\n",
           ns, moved ? "ok  " : "BAD (nothing moved)", same ? "bit for bit" : "DIFFER",
           cached ? "ok" : "WRONG");
  }
  { V b = rnd(7), y(5 * 7, 9), want(35); for (int i = 0; i < 35; i++) want[i] = b[i % 7];
    launch_bias_rows(nullptr, y.data(), b.data(), 5, 7); cmp("bias_rows", y, want, 0); }
  // cuDNN attention's widening of its bf16 outputs into strided fp32 rows (written, or added
  // to): against the CPU's from_bf16 of the packed rows, the padding columns untouched.
  for (bool acc : {false, true}) {
    const int rows = 5, cols = 12, ld = 17;
    V x = rnd(size_t(rows) * cols, 3), base = rnd(size_t(rows) * ld), y = base, want = base, wide(x.size());
    std::vector<std::uint16_t> packed(x.size());
    cpu->to_bf16(packed.data(), x.data(), std::int64_t(x.size()));
    cpu->from_bf16(wide.data(), packed.data(), std::int64_t(x.size()));
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) {
        float& w = want[size_t(r) * ld + c];
        w = acc ? w + wide[size_t(r) * cols + c] : wide[size_t(r) * cols + c];
      }
    launch_from_bf16_rows(nullptr, y.data(), ld, packed.data(), rows, cols, acc);
    cmp(acc ? "from_bf16_rows accumulate" : "from_bf16_rows", y, want, 0);
  }
  // The LM head under bf16. First the fused classifier alone (classifier.cu) on bf16 logits
  // against the CPU's forward and backward on the same values widened to fp32: the loss to the
  // rounding of a float sum, dlogits to one bf16 rounding, padding columns exactly 0. ld 104:
  // 16-byte packs; ld 53: the scalar path; v_valid < ld: padding (1e4 there would dominate
  // the sums if it were read).
  { struct H { int n, ld, v; };
    for (H h : {H{9, 104, 104}, H{9, 104, 97}, H{9, 104, 85}, H{7, 53, 50}}) for (int backward = 0; backward < 2; backward++) {
      V l = rnd(size_t(h.n) * h.ld, 3);
      for (int i = 0; i < h.n; i++) for (int j = h.v; j < h.ld; j++) l[size_t(i) * h.ld + j] = 1e4f;
      std::vector<std::uint16_t> l16(l.size());
      cpu->to_bf16(l16.data(), l.data(), std::int64_t(l.size()));
      cpu->from_bf16(l.data(), l16.data(), std::int64_t(l.size()));
      std::vector<std::int32_t> tg(h.n); for (auto& t : tg) t = int(g() % h.v);
      const float scale = 1.0f / float(h.n);
      V mx(h.n), st(2 * h.n), loss(h.n), loss2(h.n, 7);
      cpu->xent_forward(loss.data(), mx.data(), st.data(), st.data() + h.n, l.data(), tg.data(), h.n, h.ld, h.v, 0);
      cpu->xent_backward(l.data(), mx.data(), st.data(), tg.data(), h.n, h.ld, h.v, 0, scale);
      std::uint16_t* d16 = nullptr; float* dloss = nullptr; std::int32_t* dtg = nullptr;
      cudaMalloc(reinterpret_cast<void**>(&d16), l16.size() * 2); cudaMalloc(reinterpret_cast<void**>(&dloss), size_t(h.n) * 4);
      cudaMalloc(reinterpret_cast<void**>(&dtg), size_t(h.n) * 4);
      cudaMemcpy(d16, l16.data(), l16.size() * 2, cudaMemcpyHostToDevice); cudaMemcpy(dtg, tg.data(), size_t(h.n) * 4, cudaMemcpyHostToDevice);
      launch_fused_classifier(nullptr, d16, dloss, dtg, h.n, h.ld, h.v, scale, backward != 0);
      std::vector<std::uint16_t> got16(l16.size());
      cudaMemcpy(got16.data(), d16, got16.size() * 2, cudaMemcpyDeviceToHost); cudaMemcpy(loss2.data(), dloss, size_t(h.n) * 4, cudaMemcpyDeviceToHost);
      snprintf(name, sizeof name, "fused_classifier n%d ld%d v%d%s loss", h.n, h.ld, h.v, backward ? " +backward" : "");
      cmp(name, loss2, loss, 1e-5);
      if (backward) {
        V got(got16.size()); cpu->from_bf16(got.data(), got16.data(), std::int64_t(got.size()));
        cmp("  dlogits", got, l, 4e-3);
        bool zero = true; for (int i = 0; i < h.n; i++) for (int j = h.v; j < h.ld; j++) zero = zero && got16[size_t(i) * h.ld + j] == 0;
        bad += !zero; printf("  padding columns' gradient exactly 0        %s\n", zero ? "ok  " : "BAD ");
      } else {
        bool kept = got16 == l16; bad += !kept;
        printf("  logits untouched without the backward      %s\n", kept ? "ok  " : "BAD ");
      }
      cudaFree(d16); cudaFree(dloss); cudaFree(dtg);
    } }
  // Then the whole head (fused_head.cpp: the bf16-out product, the classifier, the two bf16
  // products, on the cuBLAS stand-in) against the CPU composition (Ops::lm_head) on the same
  // bf16-rounded lnf and wte: loss, dlnf and dwte's increment (dwte starts random) within bf16's
  // rounding of the logits and dlogits; dwte's padding rows unchanged bit for bit.
  { struct H { int n, c, v, vv; };
    cublasHandle_t cb = nullptr; cublasCreate(&cb);
    for (H h : {H{24, 16, 96, 96}, H{24, 16, 96, 85}, H{10, 12, 45, 41}}) for (int backward = 0; backward < 2; backward++) {
      V lnf = rnd(size_t(h.n) * h.c), wte = rnd(size_t(h.v) * h.c, 0.5f), dw0 = rnd(wte.size(), 0.1f);
      std::vector<std::uint16_t> lnf16(lnf.size()), wte16(wte.size());
      cpu->to_bf16(lnf16.data(), lnf.data(), std::int64_t(lnf.size())); cpu->from_bf16(lnf.data(), lnf16.data(), std::int64_t(lnf.size()));
      cpu->to_bf16(wte16.data(), wte.data(), std::int64_t(wte.size())); cpu->from_bf16(wte.data(), wte16.data(), std::int64_t(wte.size()));
      std::vector<std::int32_t> tg(h.n); for (auto& t : tg) t = int(g() % h.vv);
      const float scale = 1.0f / float(h.n);
      V loss(h.n), dlnf(lnf.size()), dw = dw0, logits(size_t(h.n) * h.v), mx(h.n), st(2 * h.n);
      cpu->lm_head(loss.data(), dlnf.data(), dw.data(), logits.data(), mx.data(), st.data(), lnf.data(), wte.data(), tg.data(), h.n, h.c, h.v, h.vv, scale, backward != 0, 0, nullptr);
      const double want_total = cpu->take_loss();
      void *dl16, *dlnf16, *dwte16; float *dloss, *ddlnf, *ddw; std::int32_t* dtg;
      cudaMalloc(&dl16, size_t(h.n) * h.v * 4); cudaMalloc(&dlnf16, lnf16.size() * 2); cudaMalloc(&dwte16, wte16.size() * 2);
      cudaMalloc(reinterpret_cast<void**>(&dloss), size_t(h.n) * 4); cudaMalloc(reinterpret_cast<void**>(&ddlnf), lnf.size() * 4);
      cudaMalloc(reinterpret_cast<void**>(&ddw), wte.size() * 4); cudaMalloc(reinterpret_cast<void**>(&dtg), size_t(h.n) * 4);
      cudaMemcpy(dlnf16, lnf16.data(), lnf16.size() * 2, cudaMemcpyHostToDevice); cudaMemcpy(dwte16, wte16.data(), wte16.size() * 2, cudaMemcpyHostToDevice);
      cudaMemcpy(ddw, dw0.data(), dw0.size() * 4, cudaMemcpyHostToDevice); cudaMemcpy(dtg, tg.data(), size_t(h.n) * 4, cudaMemcpyHostToDevice);
      fused_head(cb, nullptr, nullptr, dloss, ddlnf, ddw, dl16, dlnf16, dwte16, dtg, h.n, h.c, h.v, h.vv, scale, backward != 0);
      V loss2(h.n), dlnf2(dlnf.size()), dw2(dw.size());
      cudaMemcpy(loss2.data(), dloss, loss2.size() * 4, cudaMemcpyDeviceToHost); cudaMemcpy(dlnf2.data(), ddlnf, dlnf2.size() * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(dw2.data(), ddw, dw2.size() * 4, cudaMemcpyDeviceToHost);
      snprintf(name, sizeof name, "fused_head n%d c%d v%d valid %d%s loss", h.n, h.c, h.v, h.vv, backward ? " +backward" : "");
      cmp(name, loss2, loss, 1e-2);
      double total = 0; for (float x : loss2) total += x;
      const bool sum_ok = std::fabs(total - want_total) <= 1e-2 * std::fabs(want_total); bad += !sum_ok;
      printf("  the CPU's add_loss total %.6f, ours %.6f    %s\n", want_total, total, sum_ok ? "ok  " : "BAD ");
      if (backward) {
        cmp("  dlnf", dlnf2, dlnf, 1e-2);
        V add(dw.size()), add2(dw.size());  // what each added to dwte (d wte is small beside dw0)
        for (size_t i = 0; i < dw.size(); i++) { add[i] = dw[i] - dw0[i]; add2[i] = dw2[i] - dw0[i]; }
        cmp("  dwte (+=)", add2, add, 1e-2);
        bool kept = std::memcmp(dw2.data() + size_t(h.vv) * h.c, dw0.data() + size_t(h.vv) * h.c, size_t(h.v - h.vv) * h.c * 4) == 0;
        bad += !kept; printf("  dwte's padding rows unchanged              %s\n", kept ? "ok  " : "BAD ");
      } else {
        bool kept = std::memcmp(dw2.data(), dw0.data(), dw0.size() * 4) == 0; bad += !kept;
        printf("  dwte untouched without the backward        %s\n", kept ? "ok  " : "BAD ");
      }
      for (void* p : {dl16, dlnf16, dwte16, static_cast<void*>(dloss), static_cast<void*>(ddlnf), static_cast<void*>(ddw), static_cast<void*>(dtg)}) cudaFree(p);
    }
    cublasDestroy(cb);
  }
  // The head over a vocabulary in two shards (TP 2: fused_head with a HeadShard, the
  // classifier's two passes around the collectives), both shards in this process: each
  // shard runs three times with collectives that record what it reduces and hand back what
  // the two shards' records give once both are known (the max in the 2nd run, the max and the
  // sums in the 3rd; the kernels are deterministic). Against the CPU composition over the
  // whole (padded) vocabulary on the same bf16-rounded operands: each shard's loss, the sum of
  // the shards' dlnf partials, dwte's increment, its padding rows unchanged. Shard 1 holds
  // every row's largest logits (its wte rows shifted), so sums left at the shard's own max
  // are far off; the targets fall in both shards.
  { struct H { int n, c, vv; };
    struct Replay final : ops::Ops::HeadCollectives {
      int n = 0;
      V max_in, sum_in;
      const V* max_out = nullptr; const V* sum_out = nullptr;
      void allreduce_max(float* x, std::int64_t count) override { io(x, count, max_in, max_out); }
      void allreduce_sum(float* x, std::int64_t count) override { io(x, count, sum_in, sum_out); }
      static void io(float* x, std::int64_t count, V& in, const V* out) {
        in.assign(size_t(count), 0.0f);
        cudaMemcpy(in.data(), x, size_t(count) * 4, cudaMemcpyDeviceToHost);
        if (out) cudaMemcpy(x, out->data(), size_t(count) * 4, cudaMemcpyHostToDevice);
      }
    };
    cublasHandle_t cb = nullptr; cublasCreate(&cb);
    for (H h : {H{24, 16, 96}, H{24, 16, 85}, H{10, 12, 41}}) for (int backward = 0; backward < 2; backward++) {
      const int vl = (h.vv + 1) / 2, v = 2 * vl;  // each shard's columns; the padded vocabulary
      V lnf = rnd(size_t(h.n) * h.c), wte = rnd(size_t(v) * h.c, 0.5f), dw0 = rnd(wte.size(), 0.1f);
      for (size_t i = 0; i < size_t(h.n) * h.c; i++) lnf[i] = std::fabs(lnf[i]);  // lnf >= 0, so
      for (size_t i = size_t(vl) * h.c; i < wte.size(); i++) wte[i] += 0.4f;      // shard 1's logits are larger
      std::vector<std::uint16_t> lnf16(lnf.size()), wte16(wte.size());
      cpu->to_bf16(lnf16.data(), lnf.data(), std::int64_t(lnf.size())); cpu->from_bf16(lnf.data(), lnf16.data(), std::int64_t(lnf.size()));
      cpu->to_bf16(wte16.data(), wte.data(), std::int64_t(wte.size())); cpu->from_bf16(wte.data(), wte16.data(), std::int64_t(wte.size()));
      std::vector<std::int32_t> tg(h.n); for (int i = 0; i < h.n; i++) tg[i] = i % 2 ? int(g() % (h.vv - vl)) + vl : int(g() % vl);
      const float scale = 1.0f / float(h.n);
      V loss(h.n), dlnf(lnf.size()), dw = dw0, logits(size_t(h.n) * v), mx(h.n), st(2 * h.n);
      cpu->lm_head(loss.data(), dlnf.data(), dw.data(), logits.data(), mx.data(), st.data(), lnf.data(), wte.data(), tg.data(), h.n, h.c, v, h.vv, scale, backward != 0, 0, nullptr);
      cpu->take_loss();
      void *dl16, *dlnf16, *dwte16; float *dloss, *ddlnf, *ddw, *drow, *dst; std::int32_t* dtg;
      cudaMalloc(&dl16, size_t(h.n) * vl * 2); cudaMalloc(&dlnf16, lnf16.size() * 2); cudaMalloc(&dwte16, wte16.size() * 2);
      cudaMalloc(reinterpret_cast<void**>(&dloss), size_t(h.n) * 4); cudaMalloc(reinterpret_cast<void**>(&ddlnf), lnf.size() * 4);
      cudaMalloc(reinterpret_cast<void**>(&ddw), wte.size() * 4); cudaMalloc(reinterpret_cast<void**>(&dtg), size_t(h.n) * 4);
      cudaMalloc(reinterpret_cast<void**>(&drow), size_t(h.n) * 4); cudaMalloc(reinterpret_cast<void**>(&dst), size_t(h.n) * 8);
      cudaMemcpy(dlnf16, lnf16.data(), lnf16.size() * 2, cudaMemcpyHostToDevice); cudaMemcpy(dwte16, wte16.data(), wte16.size() * 2, cudaMemcpyHostToDevice);
      cudaMemcpy(dtg, tg.data(), size_t(h.n) * 4, cudaMemcpyHostToDevice);
      Replay rp[2];
      V gmax(h.n), gsum(2 * size_t(h.n)), loss2[2], dlnf2(lnf.size(), 0.0f), dw2 = dw0;
      for (int run = 0; run < 3; run++) {
        if (run == 1) for (int i = 0; i < h.n; i++) gmax[size_t(i)] = std::max(rp[0].max_in[size_t(i)], rp[1].max_in[size_t(i)]);
        if (run == 2) for (size_t i = 0; i < gsum.size(); i++) gsum[i] = rp[0].sum_in[i] + rp[1].sum_in[i];
        for (int s = 0; s < 2; s++) {
          rp[s].max_out = run >= 1 ? &gmax : nullptr; rp[s].sum_out = run == 2 ? &gsum : nullptr;
          const int start = s * vl, valid = std::clamp(h.vv - start, 0, vl);
          const size_t rows = size_t(start) * h.c;
          cudaMemcpy(ddw, dw0.data(), dw0.size() * 4, cudaMemcpyHostToDevice);
          const HeadShard shard{start, drow, dst, &rp[s]};
          fused_head(cb, nullptr, nullptr, dloss, ddlnf, ddw + rows, dl16, dlnf16, static_cast<std::uint16_t*>(dwte16) + rows, dtg, h.n, h.c, vl, valid, scale, backward != 0, &shard);
          if (run < 2) continue;
          loss2[s].resize(size_t(h.n)); cudaMemcpy(loss2[s].data(), dloss, size_t(h.n) * 4, cudaMemcpyDeviceToHost);
          V part(lnf.size()), w(wte.size()); cudaMemcpy(part.data(), ddlnf, part.size() * 4, cudaMemcpyDeviceToHost);
          cudaMemcpy(w.data(), ddw, w.size() * 4, cudaMemcpyDeviceToHost);
          if (backward) for (size_t i = 0; i < part.size(); i++) dlnf2[i] += part[i];
          std::copy(w.begin() + std::ptrdiff_t(rows), w.begin() + std::ptrdiff_t(rows + size_t(vl) * h.c), dw2.begin() + std::ptrdiff_t(rows));
        }
      }
      snprintf(name, sizeof name, "fused_head 2 shards n%d c%d valid %d%s loss", h.n, h.c, h.vv, backward ? " +backward" : "");
      cmp(name, loss2[0], loss, 1e-2);
      cmp("  the other shard's loss", loss2[1], loss, 1e-2);
      if (backward) {
        cmp("  dlnf (the shards' partials summed)", dlnf2, dlnf, 1e-2);
        V add(dw.size()), add2(dw.size());
        for (size_t i = 0; i < dw.size(); i++) { add[i] = dw[i] - dw0[i]; add2[i] = dw2[i] - dw0[i]; }
        cmp("  dwte (+=)", add2, add, 1e-2);
        bool kept = std::memcmp(dw2.data() + size_t(h.vv) * h.c, dw0.data() + size_t(h.vv) * h.c, size_t(v - h.vv) * h.c * 4) == 0;
        bad += !kept; printf("  dwte's padding rows unchanged              %s\n", kept ? "ok  " : "BAD ");
      } else {
        bool kept = dw2 == dw0; bad += !kept;
        printf("  dwte untouched without the backward        %s\n", kept ? "ok  " : "BAD ");
      }
      for (void* p : {dl16, dlnf16, dwte16, static_cast<void*>(dloss), static_cast<void*>(ddlnf), static_cast<void*>(ddw), static_cast<void*>(dtg), static_cast<void*>(drow), static_cast<void*>(dst)}) cudaFree(p);
    }
    cublasDestroy(cb);
  }
  // The fused block's bf16 kernels (fused_block.cu) against the CPU's fp32 ops on the same
  // (widened) inputs: bf16 outputs within bf16's rounding (2^-8 of the largest value), the
  // statistics and the bias-gradient sums to fp32's.
  {
    auto widen = [&](const std::vector<std::uint16_t>& h) {
      V w(h.size());
      cpu->from_bf16(w.data(), h.data(), std::int64_t(h.size()));
      return w;
    };
    auto narrow = [&](const V& v) {
      std::vector<std::uint16_t> h(v.size());
      cpu->to_bf16(h.data(), v.data(), std::int64_t(v.size()));
      return h;
    };
    const int n = 37, c = 100;
    V x = rnd(size_t(n) * c, 2, 0.5f), w = rnd(size_t(c), 0.2f, 1), b = rnd(size_t(c), 0.1f);
    V y(x.size()), mean(n), rstd(n), m2(n), r2(n);
    std::vector<std::uint16_t> y16(x.size());
    cpu->layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
    launch_layernorm_forward_bf16(nullptr, y16.data(), m2.data(), r2.data(), x.data(), w.data(),
                                  b.data(), n, c);
    cmp("layernorm_forward_bf16 y", widen(y16), y, 4e-3);
    cmp("  mean", m2, mean, 1e-5, maxabs(mean) + 1);
    cmp("  rstd", r2, rstd, 1e-5);
    for (int shape = 0; shape < 2; shape++) {
      const int rows = shape ? 200 : 3, cols = shape ? 300 : 5;
      const std::int64_t total = std::int64_t(rows) * cols;
      std::vector<std::uint16_t> x16 = narrow(rnd(size_t(total), 2)), dy16 = narrow(rnd(size_t(total)));
      const V xw = widen(x16), dyw = widen(dy16);
      const size_t count = static_cast<size_t>(total);
      V gy(count), gdx(count);
      cpu->gelu_forward(gy.data(), xw.data(), total);
      cpu->gelu_backward(gdx.data(), xw.data(), dyw.data(), total);
      std::vector<std::uint16_t> y16b(count), dx16(count);
      launch_gelu_forward_bf16(nullptr, y16b.data(), x16.data(), total);
      snprintf(name, sizeof name, "gelu_forward_bf16 n%d cols%d", rows, cols);
      cmp(name, widen(y16b), gy, 4e-3);
      V db0 = rnd(size_t(cols)), db = db0, db2 = db0, partial(size_t(colsum_partial_floats(rows, cols)), 7);
      launch_gelu_backward_bf16_colsum(nullptr, dx16.data(), db.data(), partial.data(), x16.data(),
                                       dy16.data(), rows, cols);
      V want(cols), want2(cols);
      for (int col = 0; col < cols; col++) {
        double sum = db0[col], sum2 = db0[col];
        for (int r = 0; r < rows; r++) {
          sum += gdx[size_t(r) * cols + col];
          sum2 += dyw[size_t(r) * cols + col];
        }
        want[col] = float(sum), want2[col] = float(sum2);
      }
      snprintf(name, sizeof name, "gelu_backward_bf16_colsum n%d cols%d dx", rows, cols);
      cmp(name, widen(dx16), gdx, 4e-3);
      cmp("  db", db, want, 1e-4, maxabs(want) + 1);
      launch_colsum_bf16(nullptr, db2.data(), partial.data(), dy16.data(), rows, cols);
      snprintf(name, sizeof name, "colsum_bf16 n%d cols%d", rows, cols);
      cmp(name, db2, want2, 1e-5, maxabs(want2) + 1);
    }
    // The fused Llama block's: RMSNorm to bf16, RoPE on bf16 (both signs), SwiGLU on bf16.
    V ry(x.size()), rr(n), rr2(n);
    cpu->rmsnorm_forward(ry.data(), rr.data(), x.data(), w.data(), n, c, 1e-5f);
    launch_rmsnorm_forward_bf16(nullptr, y16.data(), rr2.data(), x.data(), w.data(), n, c, 1e-5f);
    cmp("rmsnorm_forward_bf16 y", widen(y16), ry, 4e-3);
    cmp("  rstd", rr2, rr, 1e-5);
    {
      const int rb = 2, rt = 5, heads = 3, hs = 8, ld = heads * hs + 4;  // a column tail
      std::vector<std::uint16_t> q16 = narrow(rnd(size_t(rb) * rt * ld, 1));
      for (float sign : {1.0f, -1.0f}) {
        V qw = widen(q16);
        std::vector<std::uint16_t> got = q16;
        if (sign > 0)
          cpu->rope_forward(qw.data(), rb, rt, ld, heads, hs, 3, 10000.0f);
        else
          cpu->rope_backward(qw.data(), rb, rt, ld, heads, hs, 3, 10000.0f);
        launch_rope_bf16(nullptr, got.data(), rb, rt, ld, heads, hs, 3, 10000.0f, sign);
        cmp(sign > 0 ? "rope_bf16 forward" : "rope_bf16 backward", widen(got), qw, 4e-3);
      }
    }
    {
      const int rows = 7, f = 45;
      std::vector<std::uint16_t> gu16 = narrow(rnd(size_t(rows) * 2 * f, 2));
      std::vector<std::uint16_t> dy16 = narrow(rnd(size_t(rows) * f));
      const V guw = widen(gu16), dyw = widen(dy16);
      V sy(size_t(rows) * f), sdgu(size_t(rows) * 2 * f);
      cpu->swiglu_forward(sy.data(), guw.data(), rows, f);
      cpu->swiglu_backward(sdgu.data(), guw.data(), dyw.data(), rows, f);
      std::vector<std::uint16_t> y16s(sy.size()), dgu16(sdgu.size());
      launch_swiglu_forward_bf16(nullptr, y16s.data(), gu16.data(), rows, f);
      launch_swiglu_backward_bf16(nullptr, dgu16.data(), gu16.data(), dy16.data(), rows, f);
      cmp("swiglu_forward_bf16", widen(y16s), sy, 4e-3);
      cmp("swiglu_backward_bf16", widen(dgu16), sdgu, 4e-3);
    }
  }
  // The 16-byte (Packed128) paths against the scalar kernels, bit for bit. Each case runs
  // once with every buffer 64-byte aligned (the packed path where the widths allow: it must
  // then make 16-byte accesses, counted by the shim) and once per buffer with that buffer
  // alone one element off 16 bytes (the host's check must send it to the scalar kernel, or
  // the shim stops on the misaligned access); every buffer's bytes after the call, outputs
  // (which start as noise: an element left unwritten shows) and in-place inputs, must be the
  // same in all runs. Sizes off the pack (tails), C off 8 (the scalar path), odd shapes.
  {
    struct Arg { std::vector<unsigned char> bytes; size_t elem; };
    auto f32 = [&](size_t n, float sd = 1, float mean = 0) { V v = rnd(n, sd, mean); Arg a{std::vector<unsigned char>(n * 4), 4}; std::memcpy(a.bytes.data(), v.data(), n * 4); return a; };
    auto b16 = [&](size_t n, float sd = 1) { V v = rnd(n, sd); Arg a{std::vector<unsigned char>(n * 2), 2}; for (size_t i = 0; i < n; i++) { std::uint32_t u; std::memcpy(&u, &v[i], 4); std::uint16_t h = std::uint16_t(u >> 16); std::memcpy(&a.bytes[i * 2], &h, 2); } return a; };
    auto check_packed = [&](const char* what, bool expect_packed, std::vector<Arg> args, auto run) {
      auto exec = [&](int misaligned, std::uint64_t* vec) {
        std::vector<std::vector<unsigned char>> raw(args.size());
        std::vector<void*> ptr(args.size());
        for (size_t k = 0; k < args.size(); k++) {
          raw[k].resize(args[k].bytes.size() + 64 + args[k].elem);
          auto base = (reinterpret_cast<std::uintptr_t>(raw[k].data()) + 63) / 64 * 64;
          ptr[k] = reinterpret_cast<void*>(base + (int(k) == misaligned ? args[k].elem : 0));
          std::memcpy(ptr[k], args[k].bytes.data(), args[k].bytes.size());
        }
        const std::uint64_t before = emu::vector_accesses;
        run(ptr);
        if (vec) *vec = emu::vector_accesses - before;
        std::vector<std::vector<unsigned char>> out(args.size());
        for (size_t k = 0; k < args.size(); k++) {
          const auto* b = static_cast<unsigned char*>(ptr[k]);
          out[k].assign(b, b + args[k].bytes.size());
        }
        return out;
      };
      std::uint64_t vec = 0;
      const auto want = exec(-1, &vec);
      bool ok = (vec > 0) == (expect_packed && packed_access());  // none under TRIDENT_CUDA_BASELINE=1
      for (int k = 0; k < int(args.size()); k++) ok = ok && exec(k, nullptr) == want;
      bad += !ok;
      printf("packed %-37s %s  (%llu 16-byte accesses)\n", what, ok ? "ok  " : "BAD ", static_cast<unsigned long long>(vec));
    };
    auto F = [](void* p) { return static_cast<float*>(p); };
    auto H = [](void* p) { return static_cast<std::uint16_t*>(p); };
    for (long n : {8L, 61L, 4099L}) {
      snprintf(name, sizeof name, "gelu_forward_bf16 n%ld", n);
      check_packed(name, true, {b16(size_t(n)), b16(size_t(n), 2)}, [&](std::vector<void*>& p) { launch_gelu_forward_bf16(nullptr, p[0], p[1], n); });
      snprintf(name, sizeof name, "add n%ld", n + 1);
      check_packed(name, true, {f32(size_t(n + 1)), f32(size_t(n + 1)), f32(size_t(n + 1))}, [&](std::vector<void*>& p) { launch_add(nullptr, F(p[0]), F(p[1]), F(p[2]), n + 1); });
      snprintf(name, sizeof name, "from_bf16 n%ld", n + 3);
      check_packed(name, true, {f32(size_t(n + 3)), b16(size_t(n + 3), 30)}, [&](std::vector<void*>& p) { launch_from_bf16(nullptr, F(p[0]), p[1], n + 3); });
    }
    struct RC { int rows, cols; };
    for (RC rc : {RC{3, 8}, RC{130, 24}, RC{70, 776}, RC{9, 100}, RC{5, 30}}) {
      const int r = rc.rows, c = rc.cols;
      const size_t rcs = size_t(r) * c;
      const size_t parts = size_t(colsum_partial_floats(r, c));
      snprintf(name, sizeof name, "gelu_backward_bf16_colsum n%d c%d", r, c);
      check_packed(name, c % 8 == 0, {b16(rcs), f32(size_t(c)), f32(parts), b16(rcs, 2), b16(rcs)}, [&](std::vector<void*>& p) {
        launch_gelu_backward_bf16_colsum(nullptr, p[0], F(p[1]), F(p[2]), p[3], p[4], r, c); });
      snprintf(name, sizeof name, "colsum_bf16 n%d c%d", r, c);
      check_packed(name, c % 8 == 0, {f32(size_t(c)), f32(parts), b16(rcs)}, [&](std::vector<void*>& p) {
        launch_colsum_bf16(nullptr, F(p[0]), F(p[1]), p[2], r, c); });
      snprintf(name, sizeof name, "to_bf16_colsum n%d c%d", r, c);
      check_packed(name, c % 8 == 0, {b16(rcs), f32(size_t(c)), f32(parts), f32(rcs)}, [&](std::vector<void*>& p) {
        launch_to_bf16_colsum(nullptr, p[0], F(p[1]), F(p[2]), F(p[3]), r, c); });
      snprintf(name, sizeof name, "layernorm_forward_bf16 n%d c%d", r, c);
      check_packed(name, c % 8 == 0, {b16(rcs), f32(size_t(r)), f32(size_t(r)), f32(rcs, 2, 0.5f), f32(size_t(c), 0.2f, 1), f32(size_t(c), 0.1f)}, [&](std::vector<void*>& p) {
        launch_layernorm_forward_bf16(nullptr, p[0], F(p[1]), F(p[2]), F(p[3]), F(p[4]), F(p[5]), r, c); });
      snprintf(name, sizeof name, "rmsnorm_forward_bf16 n%d c%d", r, c);
      check_packed(name, c % 8 == 0, {b16(rcs), f32(size_t(r)), f32(rcs, 2, 0.5f), f32(size_t(c), 0.2f, 1)}, [&](std::vector<void*>& p) {
        launch_rmsnorm_forward_bf16(nullptr, p[0], F(p[1]), F(p[2]), F(p[3]), r, c, 1e-5f); });
      // the backward's mean and rstd: the forward's on the same x
      V x = rnd(rcs, 2, 0.5f), w = rnd(size_t(c), 0.2f, 1), bias = rnd(size_t(c), 0.1f), y(rcs), mean(static_cast<size_t>(r)), rstd(mean), rrstd(mean);
      cpu->layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), r, c);
      cpu->rmsnorm_forward(y.data(), rrstd.data(), x.data(), w.data(), r, c, 1e-5f);
      auto as_arg = [](const V& v) { Arg a{std::vector<unsigned char>(v.size() * 4), 4}; std::memcpy(a.bytes.data(), v.data(), v.size() * 4); return a; };
      const size_t lparts = size_t(layernorm_partial_floats(r, c));
      snprintf(name, sizeof name, "layernorm_backward n%d c%d", r, c);
      check_packed(name, c % 4 == 0, {f32(rcs), f32(size_t(c)), f32(size_t(c)), f32(rcs), as_arg(x), as_arg(w), as_arg(mean), as_arg(rstd), f32(lparts)}, [&](std::vector<void*>& p) {
        launch_layernorm_backward(nullptr, F(p[0]), F(p[1]), F(p[2]), F(p[3]), F(p[4]), F(p[5]), F(p[6]), F(p[7]), r, c, F(p[8])); });
      snprintf(name, sizeof name, "rmsnorm_backward n%d c%d", r, c);
      check_packed(name, c % 4 == 0, {f32(rcs), f32(size_t(c)), f32(rcs), as_arg(x), as_arg(w), as_arg(rrstd), f32(size_t(rmsnorm_partial_floats(r, c)))}, [&](std::vector<void*>& p) {
        launch_rmsnorm_backward(nullptr, F(p[0]), F(p[1]), F(p[2]), F(p[3]), F(p[4]), F(p[5]), r, c, F(p[6])); });
      snprintf(name, sizeof name, "swiglu_forward_bf16 n%d f%d", r, c);
      check_packed(name, c % 8 == 0, {b16(rcs), b16(2 * rcs, 2)}, [&](std::vector<void*>& p) { launch_swiglu_forward_bf16(nullptr, p[0], p[1], r, c); });
      snprintf(name, sizeof name, "swiglu_backward_bf16 n%d f%d", r, c);
      check_packed(name, c % 8 == 0, {b16(2 * rcs), b16(2 * rcs, 2), b16(rcs)}, [&](std::vector<void*>& p) { launch_swiglu_backward_bf16(nullptr, p[0], p[1], p[2], r, c); });
    }
    struct RCL { long rows, cols, ld; bool packed; };
    for (RCL s : {RCL{1, 1003, 1003, true}, RCL{5, 16, 20, true}, RCL{5, 12, 12, true}, RCL{5, 12, 17, false}, RCL{4, 16, 18, false}}) {
      snprintf(name, sizeof name, "to_bf16 rows%ld cols%ld ld%ld", s.rows, s.cols, s.ld);
      check_packed(name, s.packed, {b16(size_t(s.rows * s.cols)), f32(size_t(s.rows * s.ld))}, [&](std::vector<void*>& p) { launch_to_bf16(nullptr, p[0], F(p[1]), s.rows, s.cols, s.ld); });
      for (bool acc : {false, true}) {
        const bool packed = s.cols % 8 == 0 && s.ld % 4 == 0;
        snprintf(name, sizeof name, "from_bf16_rows rows%ld cols%ld ld%ld%s", s.rows, s.cols, s.ld, acc ? " acc" : "");
        check_packed(name, packed, {f32(size_t(s.rows * s.ld)), b16(size_t(s.rows * s.cols), 3)}, [&](std::vector<void*>& p) { launch_from_bf16_rows(nullptr, F(p[0]), s.ld, p[1], s.rows, s.cols, acc); });
      }
    }
    // bf16_rows.cu: b blocks of t rows, each side with its own strides (fp32 packed rows and
    // padded bf16 ones, as attention_bf16.cpp's widening of a fused qkv)
    struct BR { int b, t; long cols, ld16, bs16; bool packed; };
    for (BR s : {BR{2, 3, 16, 40, 3 * 40 + 8, true}, BR{2, 3, 16, 20, 64, false}, BR{1, 5, 12, 12, 60, false}}) {
      const size_t n16 = size_t(s.bs16) * s.b, n32 = size_t(s.b * s.t * s.cols);
      snprintf(name, sizeof name, "bf16_rows_to_float b%d t%d cols%ld ld%ld", s.b, s.t, s.cols, s.ld16);
      check_packed(name, s.packed, {f32(n32), b16(n16)}, [&](std::vector<void*>& p) { launch_bf16_rows_to_float(nullptr, F(p[0]), s.cols, s.t * s.cols, H(p[1]), s.ld16, s.bs16, s.b, s.t, s.cols); });
      snprintf(name, sizeof name, "float_rows_to_bf16 b%d t%d cols%ld ld%ld", s.b, s.t, s.cols, s.ld16);
      check_packed(name, s.packed, {b16(n16), f32(n32)}, [&](std::vector<void*>& p) { launch_float_rows_to_bf16(nullptr, H(p[0]), s.ld16, s.bs16, F(p[1]), s.cols, s.t * s.cols, s.b, s.t, s.cols); });
    }
    // AdamW's segments: one segment of two chunks and 7 (a pack and 3 one by one), bf16 copy
    // on and off, the clip's scale on; the table itself is not a kernel's 16-byte access.
    for (bool copy : {true, false}) {
      const long n = 2 * kAdamWChunk + 7;
      Arg vv = f32(size_t(n));
      for (size_t i = 0; i < size_t(n); i++) { const float e = float(g() % 1000) * 1e-5f; std::memcpy(&vv.bytes[i * 4], &e, 4); }
      const auto sc = ops::adamw_scalars(6e-4f, 0.9f, 0.95f, 0.1f, 0.1f, 0.0975f);
      snprintf(name, sizeof name, "adamw_segments n%ld%s", n, copy ? " bf16 copy" : "");
      check_packed(name, true, {f32(size_t(n)), f32(size_t(n), 0.5f), f32(size_t(n), 0.1f), vv, b16(size_t(n))}, [&](std::vector<void*>& p) {
        AdamWSegmentEntry e{F(p[0]), F(p[1]), F(p[2]), F(p[3]), copy ? H(p[4]) : nullptr, n, 0, 1};
        launch_adamw_segments(nullptr, &e, 1, adamw_chunks(n), 0.37f, 0.9f, 0.95f, sc.omb1, sc.omb2, 1e-8f, sc.decay, 1.0f, sc.step, sc.bc2_sqrt); });
    }
  }
  printf(bad ? "%d MISMATCHES\n" : "all kernels agree with the CPU backend\n", bad);
  return bad != 0;
}
