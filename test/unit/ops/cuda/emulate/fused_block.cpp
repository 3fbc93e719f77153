// emulate/fused_block.cpp — the CUDA backend's fused GPT-2 block (src/ops/cuda/fused_block.cpp:
// bf16 activations inside, Ops::gpt2_block_forward / backward with a bf16 stash) against the
// CPU backend's composition (ops/fused_block.cpp, fp32), on the CPU stand-in (train.sh builds
// and runs it with the backend's host code; fused_block_check.hpp holds the check, which
// fused_block_test.cpp runs on a GPU). Checked: the output, the input gradient and every
// parameter gradient within bf16 tolerance relative to the tensor's largest value; the same
// for the CUDA backend's own composition (fp32 stash, bf16 products) as a second reference;
// and two broken runs that must fail (a stash tensor overwritten between forward and
// backward, the residual gradient 5% off), so that the tolerance can catch a wrong step.
// usage: fused_block  (exit 0: all agree)
#include <cstdio>
#include <memory>

#include "../fused_block_check.hpp"

using namespace trident::test::fused_block;

namespace {
// bf16 rounds each activation a product or attention reads to 8 significant bits; the
// measured worst on the stand-in is 5.5e-3 of the largest value (ln1_w's gradient).
constexpr double kTol = 1.5e-2;
}  // namespace

int main() {
  const Shape s{2, 32, 64, 4};  // heads of 16: the tensor-core kernels
  const Case k = random_case(s, 27);
  auto cpu = trident::ops::make_cpu_ops(1);
  auto cuda = trident::ops::make_ops("cuda", 1, trident::ops::Precision::bf16);
  if (!cuda->gpt2_block_stash_bf16()) {
    std::printf("fused block: the CUDA backend keeps no bf16 block stash "
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
  // C 34: c_proj's biases 8-byte aligned in the flat parameters; the cuBLASLt heuristic must be
  // asked with the bias pointer set (the shim's algorithm is chosen for the bias alignment the
  // heuristic saw, as cuBLASLt's; head size 17: the widened attention).
  const Shape odd{2, 9, 34, 2};
  const Case ko = random_case(odd, 28);
  ok = compare("fused CUDA bf16 vs CPU fp32, C 34 (8-byte aligned biases)", odd,
               run(*cuda, odd, true, ko), run(*cpu, odd, false, ko), kTol) <= kTol && ok;
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
