// emulate/llama_block.cpp — the CUDA backend's fused Llama block (src/ops/cuda/fused_block.cpp:
// bf16 activations inside, Ops::llama_block_forward / backward with a bf16 stash) against the
// CPU backend's composition (ops/fused_block.cpp, fp32), on the CPU stand-in (train.sh builds
// and runs it; llama_block_check.hpp holds the check). Grouped-query heads (8 query heads on 2
// kv heads). Checked as fused_block.cpp: the output, the input gradient and every parameter
// gradient within bf16 tolerance relative to the tensor's largest value, the CUDA backend's
// own composition (fp32 stash, bf16 products) as a second reference, and two broken runs that
// must fail (a stash tensor overwritten, the residual gradient 5% off). The split backward
// (zero-bubble B, then W) as fused_block.cpp's: bit for bit the whole fused backward, with the
// W stash in the layer's dead [gate up] and [q k v] outputs or its own; a broken W stash fails.
// Selective recompute (llama_block_recompute after the next layer's forward overwrote the
// shared atty, lse, SwiGLU output): bit for bit the run that kept them, whole and split, on the
// fused block, the CUDA composition and the CPU; the recompute skipped must fail.
// Context parallelism (cp_checks): rank 0 of cp 2's rows (RoPE at positions 0..15, 48..63) with
// attention through the shape's hook (CudaOps' fp32 copies around it), against the CPU with
// the same slice and hook; whole, split and selective; RoPE at positions 0..t-1 must fail.
// usage: llama_block  (exit 0: all agree)
#include <cstdio>
#include <memory>

#include "../llama_block_check.hpp"

using namespace trident::test::llama_block;

namespace {
constexpr double kTol = 1.5e-2;  // fused_block.cpp's: bf16 activations, relative to the largest

// Selective recompute: each run whose shared atty, lse and fch_gelu were overwritten by the
// next layer's forward and refilled by llama_block_recompute is bit for bit the same backend's
// run that kept them; skipped (the next layer's values) must fail against the CPU.
bool selective_checks(trident::ops::Ops& cpu, trident::ops::Ops& cuda, const Shape& s,
                      const Case& k, const Result& want, const Result& fused,
                      const Result& composed) {
  using trident::test::fused_block::same_bits;
  bool ok = true;
  auto bitwise = [&ok](const char* what, const Result& got, const Result& kept) {
    const bool same = same_bits(got, kept);
    std::printf("llama block: %s: %s\n", what, same ? "bit for bit the kept run" : "DIFFERENT");
    ok = ok && same;
  };
  const Result sel = run(cuda, s, true, k, false, 1.0f, Split::none, Recompute::selective);
  ok = compare("fused, selective recompute vs CPU fp32", s, sel, want, kTol) <= kTol && ok;
  bitwise("fused, selective recompute", sel, fused);
  bitwise("fused, selective recompute, split B + W",
          run(cuda, s, true, k, false, 1.0f, Split::in_place, Recompute::selective), fused);
  bitwise("CUDA composition, selective recompute",
          run(cuda, s, false, k, false, 1.0f, Split::none, Recompute::selective), composed);
  bitwise("CPU, selective recompute",
          run(cpu, s, false, k, false, 1.0f, Split::none, Recompute::selective), want);
  if (compare("broken on purpose: selective recompute skipped (the next layer's atty, lse, "
              "SwiGLU output)", s,
              run(cuda, s, true, k, false, 1.0f, Split::none, Recompute::skipped), want, kTol,
              false) <= kTol) {
    std::printf("llama block: the run without its recompute passed: the check cannot fail\n");
    ok = false;
  }
  return ok;
}
// Context parallelism: the shape's slice (rank 0 of cp 2: RoPE at positions 0..15 and 48..63;
// rank 1's 16..47 are one run, which a shift of every position leaves the scores the same as
// at 0..31, so it could not tell a wrong offset) and its attention hook (the backend's own
// fp32 attention: the fused block's fp32 copies around it).
bool cp_checks(trident::ops::Ops& cpu, trident::ops::Ops& cuda, Shape s, const Case& k) {
  using trident::test::fused_block::same_bits;
  s.slice = {2, 0};
  Shape no_hook = s;
  s.hook = true;
  const Result want = run(cpu, s, false, k);
  bool ok = same_bits(want, run(cpu, no_hook, false, k));
  std::printf("llama block: cp 2 rank 0, CPU through the hook vs without it: %s\n",
              ok ? "bit for bit" : "DIFFERENT");
  const Result fused = run(cuda, s, true, k);
  ok = compare("cp 2 rank 0: fused CUDA bf16 (hook on fp32 copies) vs CPU fp32", s, fused, want,
               kTol) <= kTol && ok;
  ok = compare("cp 2 rank 0: CUDA bf16 composition vs CPU fp32", s, run(cuda, s, false, k), want,
               kTol) <= kTol && ok;
  for (Split how : {Split::in_place, Split::separate}) {
    const bool same = same_bits(run(cuda, s, true, k, false, 1.0f, how), fused);
    std::printf("llama block: cp 2 rank 0: fused split B + W (%s): %s\n",
                how == Split::in_place ? "in place" : "own stash",
                same ? "bit for bit the whole backward" : "DIFFERENT");
    ok = ok && same;
  }
  const bool sel = same_bits(run(cuda, s, true, k, false, 1.0f, Split::none,
                                 Recompute::selective), fused);
  std::printf("llama block: cp 2 rank 0: fused, selective recompute: %s\n",
              sel ? "bit for bit the kept run" : "DIFFERENT");
  ok = ok && sel;
  Shape wrong = s;
  wrong.slice = {};
  if (compare("broken on purpose: cp 2 rank 0's rows rotated at positions 0..t-1", s,
              run(cuda, wrong, true, k), want, kTol, false) <= kTol) {
    std::printf("llama block: RoPE at the wrong positions passed: the check cannot fail\n");
    ok = false;
  }
  return ok;
}
}  // namespace

int main() {
  const Shape s{2, 32, 128, 8, 2, 96};  // heads of 16: the tensor-core kernels
  const Case k = random_case(s, 29);
  auto cpu = trident::ops::make_cpu_ops(1);
  auto cuda = trident::ops::make_ops("cuda", 1, trident::ops::Precision::bf16);
  if (!cuda->gpt2_block_stash_bf16()) {
    std::printf("llama block: the CUDA backend keeps no bf16 block stash "
                "(TRIDENT_CUDA_FUSED_BLOCK=0 or TRIDENT_CUDA_BASELINE=1): nothing to check\n");
    return 0;
  }
  const Result want = run(*cpu, s, false, k);
  const Result fused = run(*cuda, s, true, k);
  const Result composed = run(*cuda, s, false, k);
  bool ok = compare("fused CUDA bf16 vs CPU fp32 composition", s, fused, want, kTol) <= kTol;
  ok = compare("CUDA bf16 composition vs CPU fp32 composition", s, composed, want, kTol) <= kTol &&
       ok;
  ok = compare("fused vs CUDA composition", s, fused, composed, kTol) <= kTol && ok;
  for (Split how : {Split::in_place, Split::separate}) {
    const Result split = run(*cuda, s, true, k, false, 1.0f, how);
    ok = compare(how == Split::in_place ? "fused split B + W (in the dead fch, qkv) vs CPU fp32"
                                        : "fused split B + W (a stash of its own) vs CPU fp32",
                 s, split, want, kTol) <= kTol && ok;
    if (!trident::test::fused_block::same_bits(split, fused)) {
      std::printf("llama block: the split backward is not the whole fused backward bit for bit\n");
      ok = false;
    }
  }
  ok = selective_checks(*cpu, *cuda, s, k, want, fused, composed) && ok;
  ok = cp_checks(*cpu, *cuda, s, k) && ok;
  ok = compare("CPU split B + W vs CPU whole backward", s,
               run(*cpu, s, false, k, false, 1.0f, Split::in_place), want, 1e-6) <= 1e-6 && ok;
  ok = compare("CUDA composition split B + W vs CPU fp32", s,
               run(*cuda, s, false, k, false, 1.0f, Split::in_place), want, kTol) <= kTol && ok;
  if (compare("broken on purpose: the W stash overwritten before W", s,
              run(*cuda, s, true, k, false, 1.0f, Split::broken), want, kTol, true) <= kTol) {
    std::printf("llama block: the split run with a broken W stash passed: the check cannot "
                "fail\n");
    ok = false;
  }
  const bool stale = compare("broken on purpose: la.fch overwritten before the backward", s,
                             run(*cuda, s, true, k, true), want, kTol, true) <= kTol;
  const bool scaled = compare("broken on purpose: the residual gradient times 1.05", s,
                              run(*cuda, s, true, k, false, 1.05f), want, kTol, true) <= kTol;
  if (stale || scaled) {
    std::printf("llama block: a broken run passed: the check cannot fail\n");
    ok = false;
  }
  std::printf("llama block: %s\n", ok ? "all agree" : "FAILED");
  return ok ? 0 : 1;
}
