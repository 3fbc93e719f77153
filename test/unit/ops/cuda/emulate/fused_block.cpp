// emulate/fused_block.cpp — the CUDA backend's fused GPT-2 block (src/ops/cuda/fused_block.cpp:
// bf16 activations inside, Ops::gpt2_block_forward / backward with a bf16 stash) against the
// CPU backend's composition (ops/fused_block.cpp, fp32), on the CPU stand-in (train.sh builds
// and runs it with the backend's host code; fused_block_check.hpp holds the check, which
// fused_block_test.cpp runs on a GPU). Checked: the output, the input gradient and every
// parameter gradient within bf16 tolerance relative to the tensor's largest value; the same
// for the CUDA backend's own composition (fp32 stash, bf16 products) as a second reference;
// and two broken runs that must fail (a stash tensor overwritten between forward and
// backward, the residual gradient 5% off), so that the tolerance can catch a wrong step. The
// fused runs take two microbatches (gradients added, not written); GELU in cuBLASLt's
// epilogues (default) and in the kernels (TRIDENT_CUDA_GELU_EPILOGUE=0) both checked, and a
// shape whose epilogue cuBLASLt refuses falls back to the kernels. The split backward
// (zero-bubble B with a W stash, then W): bit for bit the whole fused backward, the W stash in
// the layer's dead fch and qkv or its own; the CPU's split against its whole backward; a W
// stash overwritten between B and W must fail. Selective recompute (gpt2_block_recompute
// between forward and backward): bit for bit the GELU-kernel run; skipped must fail. Context
// parallelism's attention hook (hook_checks): against the CPU, split and recompute bit for bit.
// usage: fused_block  (exit 0: all agree)
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <cublasLt.h>  // the shim's (emu::lt_bias16_matmuls)

#include "../fused_block_check.hpp"

using namespace trident::test::fused_block;

namespace {
// bit for bit
bool same(const Result& a, const Result& b) { return same_bits(a, b); }

// bf16 rounds each activation a product or attention reads to 8 significant bits; the
// measured worst on the stand-in is 5.5e-3 of the largest value (ln1_w's gradient).
constexpr double kTol = 1.5e-2;

bool split_checks(trident::ops::Ops& cpu, trident::ops::Ops& cuda, const Shape& s, const Case& k,
                  const Result& want, const Result& fused, double tol) {
  bool ok = true;
  for (Split how : {Split::in_place, Split::separate}) {
    const char* where = how == Split::in_place ? "in the dead fch, qkv" : "a stash of its own";
    const Result split = run(cuda, s, true, k, false, 1.0f, 2, how);
    const std::string what = std::string("fused split B + W (") + where + ") vs CPU fp32";
    ok = compare(what.c_str(), s, split, want, tol) <= tol && ok;
    if (!same(split, fused)) {
      std::printf("fused block: the split backward (%s) is not the whole fused backward bit for "
                  "bit\n", where);
      ok = false;
    }
  }
  ok = compare("CPU split B + W vs CPU whole backward", s, run(cpu, s, false, k, false, 1.0f, 2,
                                                               Split::in_place),
               want, 1e-6) <= 1e-6 && ok;
  ok = compare("CUDA composition split B + W vs CPU fp32", s,
               run(cuda, s, false, k, false, 1.0f, 2, Split::in_place), want, tol) <= tol && ok;
  if (compare("broken on purpose: the W stash overwritten before W", s,
              run(cuda, s, true, k, false, 1.0f, 1, Split::broken), want, tol, true) <= tol) {
    std::printf("fused block: the split run with a broken W stash passed: the check cannot "
                "fail\n");
    ok = false;
  }
  return ok;
}
// Selective recompute: the shared atty, lse, fch_gelu overwritten by the next layer's forward
// and refilled by gpt2_block_recompute: bit for bit the run that kept the forward's own values
// (whole and split backward), whose forward ran GELU in the kernel (what the recompute runs;
// its output bit for bit the GELU-kernel run's); the CPU's composition bit for bit its whole
// backward; the recompute skipped must fail.
bool selective_checks(trident::ops::Ops& cpu, trident::ops::Ops& cuda, const Shape& s,
                      const Case& k, const Result& want, double tol) {
  bool ok = true;
  setenv("TRIDENT_CUDA_GELU_EPILOGUE", "0", 1);
  auto kernels = trident::ops::make_ops("cuda", 1, trident::ops::Precision::bf16);
  unsetenv("TRIDENT_CUDA_GELU_EPILOGUE");
  const Result by_kernels = run(*kernels, s, true, k, false, 1.0f, 2);
  const Result kept = run(cuda, s, true, k, false, 1.0f, 2, Split::none, Recompute::kept);
  const Result sel = run(cuda, s, true, k, false, 1.0f, 2, Split::none, Recompute::selective);
  ok = compare("fused, selective recompute vs CPU fp32", s, sel, want, tol) <= tol && ok;
  if (!same(sel, kept) || sel.out != by_kernels.out) {
    std::printf("fused block: selective recompute is not the kept stash's run bit for bit, or "
                "its forward not the GELU kernel's\n");
    ok = false;
  }
  const Result sel_split = run(cuda, s, true, k, false, 1.0f, 2, Split::in_place,
                               Recompute::selective);
  if (!same(sel_split, kept)) {
    std::printf("fused block: selective recompute's split backward is not the kept stash's "
                "whole backward bit for bit\n");
    ok = false;
  }
  if (!same(run(cpu, s, false, k, false, 1.0f, 1, Split::none, Recompute::selective), want)) {
    std::printf("fused block: the CPU's selective recompute is not its whole backward bit for "
                "bit\n");
    ok = false;
  }
  if (compare("broken on purpose: selective recompute skipped (the next layer's atty, lse, fch_gelu)", s,
              run(cuda, s, true, k, false, 1.0f, 1, Split::none, Recompute::skipped), want, tol,
              false) <= tol) {
    std::printf("fused block: the run without its recompute passed: the check cannot fail\n");
    ok = false;
  }
  return ok;
}
// Context parallelism's attention hook (the shape's BlockAttention; here OwnAttention, the
// backend's own fp32 attention): the CPU through it bit for bit without it; the fused block
// (its bf16 [q k v] widened to fp32 copies around the hook, out and dqkv narrowed) against
// the CPU; its split backward and selective recompute bit for bit its whole, kept run.
bool hook_checks(trident::ops::Ops& cpu, trident::ops::Ops& cuda, Shape s, const Case& k,
                 const Result& want, double tol) {
  s.hook = true;
  bool ok = same(run(cpu, s, false, k), want);
  std::printf("fused block: the CPU through the attention hook vs without it: %s\n",
              ok ? "bit for bit" : "DIFFERENT");
  const Result fused = run(cuda, s, true, k, false, 1.0f, 2);
  ok = compare("attention hook: fused CUDA bf16 (fp32 copies around it) vs CPU fp32", s, fused,
               want, tol) <= tol && ok;
  const bool split = same(run(cuda, s, true, k, false, 1.0f, 2, Split::in_place), fused);
  const bool sel = same(run(cuda, s, true, k, false, 1.0f, 2, Split::none, Recompute::selective),
                        run(cuda, s, true, k, false, 1.0f, 2, Split::none, Recompute::kept));
  std::printf("fused block: attention hook: split B + W %s, selective recompute %s\n",
              split ? "bit for bit the whole backward" : "DIFFERENT",
              sel ? "bit for bit the kept run" : "DIFFERENT");
  return ok && split && sel;
}
}  // namespace

int main() {
  const Shape s{2, 32, 64, 4};  // heads of 16: the tensor-core kernels
  const Case k = random_case(s, 27);
  auto cpu = trident::ops::make_cpu_ops(1);
  auto cuda = trident::ops::make_ops("cuda", 1, trident::ops::Precision::bf16);
  const char* knob = std::getenv("TRIDENT_CUDA_GELU_EPILOGUE");
  const bool gelu_epilogue = !(knob && std::string(knob) == "0");
  if (!cuda->gpt2_block_stash_bf16()) {
    std::printf("fused block: the CUDA backend keeps no bf16 block stash "
                "(TRIDENT_CUDA_FUSED_BLOCK=0 or TRIDENT_CUDA_BASELINE=1): nothing to check\n");
    return 0;
  }
  // The fused runs take two microbatches into the same gradients (run() returns their mean):
  // a gradient written instead of added (c_fc's bias from cuBLASLt's DGELU_BGRAD) shows.
  const Result want = run(*cpu, s, false, k);
  const Result fused = run(*cuda, s, true, k, false, 1.0f, 2);
  const Result composed = run(*cuda, s, false, k);
  bool ok = compare("fused CUDA bf16 vs CPU fp32 composition", s, fused, want, kTol) <= kTol;
  ok = compare("CUDA bf16 composition vs CPU fp32 composition", s, composed, want, kTol) <= kTol &&
       ok;
  ok = compare("fused vs CUDA composition", s, fused, composed, kTol) <= kTol && ok;
  // C 34: c_proj's biases 8-byte aligned in the flat parameters; the cuBLASLt heuristic must be
  // asked with the bias pointer set (the shim's algorithm is chosen for the bias alignment the
  // heuristic saw, as cuBLASLt's; head size 17: the widened attention).
  const Shape odd{2, 9, 34, 2};
  const Case ko = random_case(odd, 28);
  ok = compare("fused CUDA bf16 vs CPU fp32, C 34 (8-byte aligned biases)", odd,
               run(*cuda, odd, true, ko, false, 1.0f, 2), run(*cpu, odd, false, ko), kTol) <= kTol &&
       ok;
  // GELU in cuBLASLt's epilogues (the default) and in trident's kernels
  // (TRIDENT_CUDA_GELU_EPILOGUE=0): both against the CPU, and not bit for bit the same where
  // the epilogues ran (the epilogue's GELU reads the product unrounded, the kernel its bf16
  // copy), bit for bit where cuBLASLt refused them: C 64 (F 256) is taken; C 33 (F 132,
  // aux's leading dimension not a multiple of 8) is refused and falls back to the kernels.
  if (gelu_epilogue) {
    setenv("TRIDENT_CUDA_GELU_EPILOGUE", "0", 1);
    auto kernels = trident::ops::make_ops("cuda", 1, trident::ops::Precision::bf16);
    unsetenv("TRIDENT_CUDA_GELU_EPILOGUE");
    const Result by_kernels = run(*kernels, s, true, k, false, 1.0f, 2);
    ok = compare("fused, GELU kernels (TRIDENT_CUDA_GELU_EPILOGUE=0) vs CPU fp32", s,
                 by_kernels, want, kTol) <= kTol && ok;
    if (same(fused, by_kernels)) {
      std::printf("fused block: the GELU epilogue run equals the GELU kernel run bit for bit: "
                  "the epilogues did not run\n");
      ok = false;
    }
    // A cuBLASLt that refuses an fp32 bias gradient with bf16 D (the shim's
    // TRIDENT_EMU_LT_BGRAD32=0): the bias gradient in bf16, widened, added; still the epilogue.
    auto bgrad16_ops = trident::ops::make_ops("cuda", 1, trident::ops::Precision::bf16);
    setenv("TRIDENT_EMU_LT_BGRAD32", "0", 1);
    const Result bgrad16 = run(*bgrad16_ops, s, true, k, false, 1.0f, 2);
    unsetenv("TRIDENT_EMU_LT_BGRAD32");
    ok = compare("fused, bf16 bias gradient from DGELU_BGRAD vs CPU fp32", s, bgrad16, want,
                 kTol) <= kTol && ok;
    if (same(bgrad16, by_kernels) || same(bgrad16, fused) || bgrad16.out != fused.out) {
      std::printf("fused block: the bf16 bias-gradient run is not the epilogues' with another "
                  "c_fc bias gradient\n");
      ok = false;
    }
    // A cuBLASLt that takes a bias only in D's type (the shim's TRIDENT_EMU_LT_BIAS32=0; what
    // cublasLt.h's text says): c_attn's and c_fc's biases from the weight cache's bf16 copy,
    // still in the epilogues: against the CPU, and not bit for bit the fp32-bias run (which
    // the fp32 fallback, had it run instead, would equal).
    bgrad16_ops.reset();  // the emulated device holds four backends' arenas at most
    auto bias16_ops = trident::ops::make_ops("cuda", 1, trident::ops::Precision::bf16);
    const std::uint64_t bias16_before = emu::lt_bias16_matmuls();
    setenv("TRIDENT_EMU_LT_BIAS32", "0", 1);
    const Result bias16 = run(*bias16_ops, s, true, k, false, 1.0f, 2);
    unsetenv("TRIDENT_EMU_LT_BIAS32");
    if (emu::lt_bias16_matmuls() == bias16_before) {
      std::printf("fused block: no matmul read a bf16 bias with TRIDENT_EMU_LT_BIAS32=0\n");
      ok = false;
    }
    ok = compare("fused, bf16 biases (fp32 bias with bf16 D refused) vs CPU fp32", s, bias16,
                 want, kTol) <= kTol && ok;
    if (same(bias16, fused) || same(bias16, by_kernels)) {
      std::printf("fused block: the bf16-bias run equals the fp32-bias or kernel run bit for "
                  "bit: the bf16 bias did not run\n");
      ok = false;
    }
    const Shape refused{2, 8, 33, 3};  // F = 132: aux ld % 8 != 0
    const Case kr = random_case(refused, 29);
    const Result lt = run(*cuda, refused, true, kr, false, 1.0f, 2);
    ok = compare("fused CUDA bf16 vs CPU fp32, C 33 (GELU epilogues refused)", refused, lt,
                 run(*cpu, refused, false, kr), kTol) <= kTol && ok;
    if (!same(lt, run(*kernels, refused, true, kr, false, 1.0f, 2))) {
      std::printf("fused block: C 33: the refused epilogue did not fall back to the kernels\n");
      ok = false;
    }
  }
  // The split backward (zero-bubble B, then W; Split): the fused block's B keeps the bf16
  // output gradients of c_fc and c_attn in the layer's dead fch and qkv (or a stash of their
  // own) and W runs the whole backward's two weight products on them: bit for bit the whole
  // backward, with the scratch and the tensors W must not read poisoned between B and W. The
  // default (CPU; CUDA's fp32 stash) against the CPU's whole backward; W's stash overwritten
  // must fail.
  ok = split_checks(*cpu, *cuda, s, k, want, fused, kTol) && ok;
  ok = selective_checks(*cpu, *cuda, s, k, want, kTol) && ok;
  ok = hook_checks(*cpu, *cuda, s, k, want, kTol) && ok;
  // The tolerance must catch a wrong step: a stale stash tensor, a wrong residual gradient.
  const bool stale = compare("broken on purpose: la.fch overwritten before the backward", s,
                             run(*cuda, s, true, k, true), want, kTol, true) <= kTol;
  const bool scaled = compare("broken on purpose: the residual gradient times 1.05", s,
                              run(*cuda, s, true, k, false, 1.05f), want, kTol, true) <= kTol;
  if (stale || scaled) {
    std::printf("fused block: a broken run passed: the check cannot fail\n");
    ok = false;
  }
  std::printf("fused block: %s\n", ok ? "all agree" : "FAILED");
  return ok ? 0 : 1;
}
