// test/unit/ops/cuda/fused_block_test.cpp — the CUDA backend's fused GPT-2 block (bf16
// activations inside; src/ops/cuda/fused_block.cpp) against the CPU backend's composition, on
// the GPU: GPT-2's head size (64: cuDNN or the tensor-core kernels), every gradient within
// the bf16 product tolerance of cuda_ops_test.cpp (3e-2 of the tensor's largest value), and a
// broken stash that must fail it; the split backward (B with a W stash, then W) and selective
// recompute (gpt2_block_recompute) the same way.
// The stand-in runs the same check (emulate/fused_block.cpp).
// The same for the fused Llama block (llama_block_check.hpp, emulate/llama_block.cpp), its
// selective recompute (llama_block_recompute) included; both under context parallelism's
// attention hook (and Llama's CP slice).
// main() is cuda_ops_test.cpp's (skips without a GPU).
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "fused_block_check.hpp"
#include "llama_block_check.hpp"
#include "trident/ops/cuda.hpp"

namespace trident::test {
namespace {

// Every case: a bf16 CUDA backend with the fused block (skipped where it is off) and the CPU's.
class CudaFusedBlock : public ::testing::Test {
 protected:
  static constexpr double kTol = 3e-2;  // the bf16 products' tolerance
  void SetUp() override {
    gpu_ = ops::make_cuda_ops(ops::Precision::bf16, std::size_t(512) << 20);
    if (!gpu_->gpt2_block_stash_bf16())
      GTEST_SKIP() << "TRIDENT_CUDA_FUSED_BLOCK=0 or TRIDENT_CUDA_BASELINE=1: no fused block";
    cpu_ = ops::make_cpu_ops(2);
  }
  std::unique_ptr<ops::Ops> gpu_, cpu_;
};

TEST_F(CudaFusedBlock, MatchesTheCpuCompositionAndCatchesAStaleStash) {
  using namespace fused_block;
  for (const Shape& s : {Shape{2, 128, 256, 4}, Shape{1, 77, 96, 3}}) {  // hs 64; hs 32, odd T
    const Case k = random_case(s, 27);
    const Result want = run(*cpu_, s, false, k);
    // two microbatches into the same gradients: c_fc's bias gradient (cuBLASLt's DGELU_BGRAD
    // writes it) must be added
    EXPECT_LE(compare("fused CUDA bf16 vs CPU, 2 microbatches", s,
                      run(*gpu_, s, true, k, false, 1.0f, 2), want, kTol), kTol);
    EXPECT_LE(compare("CUDA bf16 composition vs CPU", s, run(*gpu_, s, false, k), want, kTol),
              kTol);
    EXPECT_GT(compare("broken: stale la.fch", s, run(*gpu_, s, true, k, true), want, kTol, true),
              kTol);
    // The split backward (zero-bubble B, then W; the W stash in the dead bf16 fch and qkv)
    EXPECT_LE(compare("fused split B + W vs CPU", s,
                      run(*gpu_, s, true, k, false, 1.0f, 2, Split::in_place), want, kTol),
              kTol);
    EXPECT_GT(compare("broken: the W stash overwritten", s,
                      run(*gpu_, s, true, k, false, 1.0f, 1, Split::broken), want, kTol, true),
              kTol);
  }
}

// Selective recompute (Ops::gpt2_block_recompute): the shared atty, lse, fch_gelu overwritten
// by the next layer's forward, then recomputed: the run that kept them (to 1e-6: bit for bit
// where the backward is deterministic, as on the stand-in), the CPU within the bf16 tolerance;
// the recompute skipped must fail.
TEST_F(CudaFusedBlock, SelectiveRecomputeGivesTheKeptStashsGradients) {
  using namespace fused_block;
  const Shape s{2, 128, 256, 4};
  const Case k = random_case(s, 33);
  const Result want = run(*cpu_, s, false, k);
  const Result kept = run(*gpu_, s, true, k, false, 1.0f, 2, Split::none, Recompute::kept);
  const Result sel = run(*gpu_, s, true, k, false, 1.0f, 2, Split::none, Recompute::selective);
  EXPECT_LE(compare("fused, selective recompute vs CPU", s, sel, want, kTol), kTol);
  EXPECT_LE(compare("fused, selective recompute vs the kept stash", s, sel, kept, 1e-6), 1e-6);
  EXPECT_LE(compare("fused, selective split B + W vs the kept stash", s,
                    run(*gpu_, s, true, k, false, 1.0f, 2, Split::in_place, Recompute::selective),
                    kept, 1e-6), 1e-6);
  EXPECT_GT(compare("broken: the recompute skipped", s,
                    run(*gpu_, s, true, k, false, 1.0f, 1, Split::none, Recompute::skipped), want,
                    kTol, true), kTol);
}

// The fused block with GELU in cuBLASLt's epilogues (the default) against the GELU kernels
// (TRIDENT_CUDA_GELU_EPILOGUE=0): both against the CPU; a refused epilogue says so on stderr.
TEST_F(CudaFusedBlock, GeluEpilogueAndGeluKernelsBothMatchTheCpu) {
  using namespace fused_block;
  const char* was = std::getenv("TRIDENT_CUDA_GELU_EPILOGUE");
  const std::string saved = was ? was : "";
  setenv("TRIDENT_CUDA_GELU_EPILOGUE", "0", 1);
  auto kernels = ops::make_cuda_ops(ops::Precision::bf16, std::size_t(512) << 20);
  if (was) setenv("TRIDENT_CUDA_GELU_EPILOGUE", saved.c_str(), 1);
  else unsetenv("TRIDENT_CUDA_GELU_EPILOGUE");
  const Shape s{2, 128, 256, 4};
  const Case k = random_case(s, 31);
  const Result want = run(*cpu_, s, false, k);
  EXPECT_LE(compare("fused, GELU epilogues", s, run(*gpu_, s, true, k, false, 1.0f, 2), want,
                    kTol), kTol);
  EXPECT_LE(compare("fused, GELU kernels", s, run(*kernels, s, true, k, false, 1.0f, 2), want,
                    kTol), kTol);
}

TEST_F(CudaFusedBlock, LlamaMatchesTheCpuCompositionAndCatchesAStaleStash) {
  using namespace llama_block;
  // hs 64 with 4 query heads on 2 kv heads; hs 32, 3 query heads on 1, odd T
  for (const Shape& s : {Shape{2, 128, 256, 4, 2, 512}, Shape{1, 77, 96, 3, 1, 160}}) {
    const Case k = random_case(s, 29);
    const Result want = run(*cpu_, s, false, k);
    EXPECT_LE(compare("fused CUDA bf16 vs CPU", s, run(*gpu_, s, true, k), want, kTol), kTol);
    EXPECT_GT(compare("broken: stale la.fch", s, run(*gpu_, s, true, k, true), want, kTol, true),
              kTol);
    EXPECT_LE(compare("fused split B + W vs CPU", s,
                      run(*gpu_, s, true, k, false, 1.0f, Split::in_place), want, kTol), kTol);
    EXPECT_GT(compare("broken: the W stash overwritten", s,
                      run(*gpu_, s, true, k, false, 1.0f, Split::broken), want, kTol, true),
              kTol);
  }
}

// Llama's selective recompute (Ops::llama_block_recompute) as GPT-2's above: the shared atty,
// lse, SwiGLU output overwritten by the next layer's forward, then recomputed: the run that
// kept them to 1e-6, the CPU within the bf16 tolerance; skipped must fail.
TEST_F(CudaFusedBlock, LlamaSelectiveRecomputeGivesTheKeptStashsGradients) {
  using namespace llama_block;
  const Shape s{2, 128, 256, 4, 2, 512};
  const Case k = random_case(s, 35);
  const Result want = run(*cpu_, s, false, k);
  const Result kept = run(*gpu_, s, true, k);
  const Result sel = run(*gpu_, s, true, k, false, 1.0f, Split::none, Recompute::selective);
  EXPECT_LE(compare("fused, selective recompute vs CPU", s, sel, want, kTol), kTol);
  EXPECT_LE(compare("fused, selective recompute vs the kept stash", s, sel, kept, 1e-6), 1e-6);
  EXPECT_LE(compare("fused, selective split B + W vs the kept stash", s,
                    run(*gpu_, s, true, k, false, 1.0f, Split::in_place, Recompute::selective),
                    kept, 1e-6), 1e-6);
  EXPECT_GT(compare("broken: the recompute skipped", s,
                    run(*gpu_, s, true, k, false, 1.0f, Split::none, Recompute::skipped), want,
                    kTol, true), kTol);
}

// Context parallelism: the shapes' attention hook (here the backend's own fp32 attention, as
// a one-rank ring: the fused blocks' fp32 copies around it) and Llama's slice (rank 0 of cp 2:
// RoPE at positions 0..63 and 192..255) against the CPU's; RoPE at 0..t-1 must fail.
TEST_F(CudaFusedBlock, AttentionHookAndCpSliceMatchTheCpu) {
  {
    using namespace fused_block;
    Shape s{2, 128, 256, 4};
    s.hook = true;
    const Case k = random_case(s, 37);
    EXPECT_LE(compare("attention hook: fused CUDA bf16 vs CPU", s,
                      run(*gpu_, s, true, k, false, 1.0f, 2), run(*cpu_, s, false, k), kTol),
              kTol);
  }
  using namespace llama_block;
  Shape s{2, 128, 256, 4, 2, 512};
  s.slice = {2, 0};
  s.hook = true;
  const Case k = random_case(s, 39);
  const Result want = run(*cpu_, s, false, k);
  EXPECT_LE(compare("cp 2 rank 0: fused CUDA bf16 vs CPU", s, run(*gpu_, s, true, k), want, kTol),
            kTol);
  Shape wrong = s;
  wrong.slice = {};
  EXPECT_GT(compare("broken: RoPE at positions 0..t-1", s, run(*gpu_, wrong, true, k), want, kTol,
                    true), kTol);
}

}  // namespace
}  // namespace trident::test
