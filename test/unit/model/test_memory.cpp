// predict_memory under bf16 storage (runtime.precision = "bf16" on a GPU): each layer's large
// activations count 2 bytes an element, its per-row statistics 4, and one layer's fp32
// working copy joins the scratch; weights, gradients and optimizer state stay fp32. The
// expected figures are written out from the model's shapes, not from the carving functions.
#include <gtest/gtest.h>

#include "trident/model/memory.hpp"

namespace trident::model {
namespace {

TEST(Memory, Bf16StorageCountsTheStashAtTwoBytes) {
  ModelConfig cfg;
  cfg.vocab_size = 64, cfg.seq_len = 16, cfg.n_layer = 4, cfg.n_head = 4, cfg.d_model = 32;
  MemoryLayout lay;
  lay.micro_batch = 2;
  lay.peak_stash = 3;
  lay.host_memory = false;
  const MemoryEstimate fp32 = predict_memory(cfg, lay);
  lay.bf16_activations = true;
  const MemoryEstimate bf16 = predict_memory(cfg, lay);

  // N = B*T = 32 rows; per row ln1 C + qkv 3C + atty C + res2 C + ln2 C + fc 4C + gelu 4C
  // = 15C = 480 large elements; statistics: 4 per row (two LayerNorms' mean and rstd) plus
  // the log-sum-exps, B*NH*T = 128.
  const std::int64_t large = 32 * 480, stats = 4 * 32 + 128, layers = 4;
  EXPECT_EQ(fp32.activations_per_microbatch - bf16.activations_per_microbatch,
            layers * large * 2);  // 4 bytes -> 2
  EXPECT_EQ(fp32.activations - bf16.activations, 3 * layers * large * 2);
  EXPECT_EQ(bf16.scratch - fp32.scratch, (large + stats) * 4);  // the working copy
  EXPECT_EQ(bf16.weights, fp32.weights);
  EXPECT_EQ(bf16.gradients, fp32.gradients);
  EXPECT_EQ(bf16.optimizer, fp32.optimizer);
  EXPECT_LT(bf16.peak(), fp32.peak());

  // With recomputation the model keeps fp32 (GptChunk::bf16_storage): no change.
  for (Recompute r : {Recompute::selective, Recompute::full}) {
    lay.recompute = r;
    lay.bf16_activations = false;
    const std::int64_t plain = predict_memory(cfg, lay).peak();
    lay.bf16_activations = true;
    EXPECT_EQ(predict_memory(cfg, lay).peak(), plain);
  }
}

// bf16 products on a device: the backend converts each product's activation inputs in its
// scratch, which settles at 1.25x the largest need (for GPT-2 small's shapes the LM head's
// weight gradient, x^T . dlogits), and keeps a bf16 copy of the weights (the weight cache;
// ops/cuda/cuda_ops.cpp, matmul.cpp).
TEST(Memory, Bf16ProductsCountTheBackendsLargestConversion) {
  ModelConfig cfg;
  cfg.vocab_size = 50304, cfg.seq_len = 1024, cfg.n_layer = 12, cfg.n_head = 12, cfg.d_model = 768;
  MemoryLayout lay;
  lay.micro_batch = 8;
  lay.host_memory = false;
  const MemoryEstimate fp32 = predict_memory(cfg, lay);
  lay.bf16_products = true;
  const MemoryEstimate bf16 = predict_memory(cfg, lay);
  const std::int64_t N = 8 * 1024, V = 50304, C = 768;
  // The head's weight-gradient product converts both activations, x [N, C] and dy [N, V];
  // the weights come from the weight cache, a bf16 copy of every parameter (2 bytes each).
  const std::int64_t need = 2 * (N * C + N * V);
  const std::int64_t cache = 2 * (fp32.weights / 4);
  EXPECT_EQ(bf16.scratch - fp32.scratch, need + need / 4 - (std::int64_t(1) << 20) + cache);
  // On the CPU there is no backend scratch, whatever the flag says.
  lay.host_memory = true;
  EXPECT_EQ(predict_memory(cfg, lay).scratch, fp32.scratch - (std::int64_t(1) << 20));
}

// An asynchronous schedule's weight versions (PipeDream-2BW: 2) count the rank's parameters
// once more each, plus the buffer they are swapped through (kVersionSwapFloats or fewer);
// nothing else changes.
TEST(Memory, WeightVersionsCountTheParametersAgain) {
  ModelConfig cfg;
  cfg.vocab_size = 64, cfg.seq_len = 16, cfg.n_layer = 2, cfg.n_head = 2, cfg.d_model = 32;
  MemoryLayout lay;
  const MemoryEstimate one = predict_memory(cfg, lay);
  lay.weight_versions = 2;
  const MemoryEstimate two = predict_memory(cfg, lay);
  // GPT-2: wte 64*32 + wpe 16*32 + 2 blocks of (4 LN 32 + 32*96+96 + 32*32+32 + 32*128+128
  // + 128*32+32) + ln_f 2*32 floats; fewer than 2^18, so the swap buffer is all of them.
  const std::int64_t block = 4 * 32 + 32 * 96 + 96 + 32 * 32 + 32 + 32 * 128 + 128 + 128 * 32 + 32;
  const std::int64_t params = 64 * 32 + 16 * 32 + 2 * block + 2 * 32;
  EXPECT_EQ(one.weights, params * 4);
  EXPECT_EQ(two.weights, 3 * params * 4);
  EXPECT_EQ(two.peak() - one.peak(), 2 * params * 4);
  EXPECT_EQ(two.gradients, one.gradients);
  EXPECT_EQ(two.optimizer, one.optimizer);
}

}  // namespace
}  // namespace trident::model
