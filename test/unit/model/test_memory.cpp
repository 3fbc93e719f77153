// predict_memory under bf16 storage (runtime.precision = "bf16" on a GPU): each layer's large
// activations count 2 bytes an element, its per-row statistics 4, and one layer's fp32
// working copy joins the scratch; weights, gradients and optimizer state stay fp32. The
// expected figures are written out from the model's shapes, not from the carving functions.
#include <gtest/gtest.h>

#include <array>
#include <vector>

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

// The CUDA backend's fused GPT-2 block (Ops::gpt2_block_stash_bf16; Llama's too): its stash
// keeps ln1, qkv, atty, ln2, fch, fch_gelu at 2 bytes and res2 at 4, carved as such
// (carve_fused_layer), and needs no fp32 working copy; at TP 2 and under context parallelism
// too (there with its attention hook's fp32 copies). Under the split backward its W stash is
// bf16.
TEST(Memory, FusedBlockCountsItsBf16StashAndNoWorkingCopy) {
  ModelConfig cfg;
  cfg.vocab_size = 64, cfg.seq_len = 16, cfg.n_layer = 4, cfg.n_head = 4, cfg.d_model = 32;
  MemoryLayout lay;
  lay.micro_batch = 2;
  lay.peak_stash = 3;
  lay.host_memory = false;
  lay.bf16_activations = true;
  lay.bf16_products = true;
  const MemoryEstimate packed = predict_memory(cfg, lay);
  lay.block_stash_bf16 = true;
  const MemoryEstimate fused = predict_memory(cfg, lay);
  // N = 32 rows, C = 32: 14C = 448 elements a row at 2 bytes and res2's C at 4, where the
  // packed stash has all 15C at 2; statistics 4 a row + B*NH*T = 128 log-sum-exps either way.
  const std::int64_t layers = 4, rows = 32, stats = 4 * 32 + 128;
  EXPECT_EQ(fused.activations_per_microbatch - packed.activations_per_microbatch,
            layers * rows * 32 * 2);
  EXPECT_EQ(packed.scratch - fused.scratch, (rows * 15 * 32 + stats) * 4);  // no working copy
  ChunkDims d = chunk_dims(cfg, 1, lay.micro_batch, false, 1);
  Carver count;
  LayerActivations la;
  carve_fused_layer(d, count, la);
  EXPECT_EQ(count.used, (rows * 14 * 32) / 2 + rows * 32 + stats);
  EXPECT_TRUE(la.bf16);
  EXPECT_LT(fused.peak(), packed.peak());
  // TP 2, with and without SP: GPT-2's fused block takes it, below the packed stash with its
  // working copy.
  for (bool sp : {false, true}) {
    MemoryLayout tp2 = lay, tp2_packed = lay;
    tp2.tp = tp2_packed.tp = 2;
    tp2.sequence_parallel = tp2_packed.sequence_parallel = sp;
    tp2_packed.block_stash_bf16 = false;
    EXPECT_LT(predict_memory(cfg, tp2).peak(), predict_memory(cfg, tp2_packed).peak()) << sp;
  }
  // CP 2: the fused block takes it too (the ring as its attention hook), with the hook's fp32
  // copies (CudaOps::hook_scratch: qkv and dqkv [N, 3C], atty and datty [N, C]; N = 16 rows
  // here, each a multiple of the arena's 256 bytes) in place of the packed stash's working copy.
  {
    MemoryLayout cp2 = lay, cp2_packed = lay;
    cp2.cp = cp2_packed.cp = 2;
    cp2_packed.block_stash_bf16 = false;
    const MemoryEstimate f = predict_memory(cfg, cp2), p = predict_memory(cfg, cp2_packed);
    const ChunkDims d2 = chunk_dims(cfg, 1, lay.micro_batch, false, 2);
    const std::int64_t hook = (2 * d2.N * 3 * 32 + 2 * d2.N * 32) * 4;
    EXPECT_EQ(d2.N, 16);
    EXPECT_EQ(f.activations_per_microbatch - p.activations_per_microbatch,
              layers * d2.N * 32 * 2);
    EXPECT_EQ(p.scratch - f.scratch, layer_floats(d2, false) * 4 - hook);
    EXPECT_LT(f.peak(), p.peak());
  }
  // Full recompute: its one recomputed layer is the fused stash instead of fp32.
  MemoryLayout full = lay;
  full.recompute = Recompute::full;
  full.bf16_activations = false;  // set_precision's rule: no bf16 storage with recomputation
  full.bf16_products = true;
  MemoryLayout full_fp32 = full;
  full_fp32.block_stash_bf16 = false;
  EXPECT_EQ(predict_memory(cfg, full_fp32).scratch - predict_memory(cfg, full).scratch,
            (rows * 15 * 32 + stats - count.used) * 4);
  // The split backward (zero-bubble B and W) keeps c_attn's and c_fc's output gradients for W,
  // N (3C + 4C) elements a layer: the fused block in its layers' own dead bf16 qkv and fch
  // (nothing more), the packed stash in fp32 of their own; under full recompute the fused
  // block in bf16 of their own, the fp32 recompute in fp32.
  const std::int64_t w_stash = layers * rows * 7 * 32;
  auto split_extra = [&](MemoryLayout l) {
    const std::int64_t whole = predict_memory(cfg, l).activations_per_microbatch;
    l.split_backward = true;
    return predict_memory(cfg, l).activations_per_microbatch - whole;
  };
  MemoryLayout packed_lay = lay;
  packed_lay.block_stash_bf16 = false;
  EXPECT_EQ(split_extra(lay), 0);
  EXPECT_EQ(split_extra(packed_lay), w_stash * 4);
  EXPECT_EQ(split_extra(full), w_stash * 2);
  EXPECT_EQ(split_extra(full_fp32), w_stash * 4);
  Carver w16;
  LayerGradStash g{};
  carve_grad_stash(d, w16, g, true);
  EXPECT_EQ(w16.used, rows * 7 * 32 / 2);
  EXPECT_EQ(grad_stash_floats(d, true), w16.used);
  // GPT-2's and Llama's blocks (Ops::gpt2_block_*, llama_block_*) under any recompute (no
  // argument), at any TP and SP (their collectives; no argument) and CP (the attention hook;
  // no argument).
  EXPECT_TRUE(stores_fused_block(true, true, Arch::gpt2));
  EXPECT_TRUE(stores_fused_block(true, true, Arch::llama));
  EXPECT_FALSE(stores_fused_block(true, false, Arch::llama));
  EXPECT_FALSE(stores_fused_block(false, true, Arch::gpt2));
}

// Selective recompute on the fused block (Ops::gpt2_block_recompute): each layer keeps ln1,
// qkv, ln2, fch at 2 bytes, res2 and the LayerNorm statistics at 4; atty, fch_gelu (2 bytes)
// and lse (4) are one shared copy, counted once in the scratch.
TEST(Memory, FusedBlockUnderSelectiveRecomputeSharesItsBf16Core) {
  ModelConfig cfg;
  cfg.vocab_size = 64, cfg.seq_len = 16, cfg.n_layer = 4, cfg.n_head = 4, cfg.d_model = 32;
  MemoryLayout lay;
  lay.micro_batch = 2;
  lay.peak_stash = 3;
  lay.host_memory = false;
  lay.recompute = Recompute::selective;
  lay.bf16_products = true;  // set_precision's rule: no packed bf16 storage with recompute
  const MemoryEstimate fp32 = predict_memory(cfg, lay);
  lay.block_stash_bf16 = true;
  const MemoryEstimate fused = predict_memory(cfg, lay);
  // N = 32 rows, C = 32. A layer: fp32 ln1 qkv ln2 fch (9C) res2 (C) and 4 statistics a row;
  // the fused block's 9C at 2 bytes. Shared: atty and fch_gelu (5C) and 128 log-sum-exps.
  const std::int64_t layers = 4, rows = 32, C = 32;
  const std::int64_t layer = rows * 9 * C / 2 + rows * C + 4 * rows;
  const ChunkDims d = chunk_dims(cfg, 1, lay.micro_batch, false, 1);
  EXPECT_EQ(fused_layer_floats(d, true), layer);
  EXPECT_EQ(recomputed_floats(d, true), rows * 5 * C / 2 + 128);
  EXPECT_EQ(fp32.activations_per_microbatch - fused.activations_per_microbatch,
            layers * rows * 9 * C / 2 * 4);
  EXPECT_EQ(fp32.scratch - fused.scratch, rows * 5 * C / 2 * 4);
  Carver count;
  LayerActivations shared, la;
  carve_recomputed(d, count, shared, true);
  EXPECT_TRUE(shared.bf16 && shared.recomputed);
  carve_fused_layer(d, count, la, &shared);
  EXPECT_EQ(la.atty, shared.atty);
  EXPECT_EQ(la.lse, shared.lse);
  EXPECT_EQ(la.fch_gelu, shared.fch_gelu);
  EXPECT_TRUE(la.bf16 && la.recomputed);
  // The split backward's W stash: the layers' own dead bf16 qkv and fch, as without recompute.
  MemoryLayout split = lay;
  split.split_backward = true;
  EXPECT_EQ(predict_memory(cfg, split).activations_per_microbatch,
            fused.activations_per_microbatch);
}

// Llama's fused block under selective recompute (Ops::llama_block_recompute), the same way:
// each layer keeps ln1, [q k v], ln2, [gate up] at 2 bytes (res2 and the statistics at 4);
// the shared copy is atty and the SwiGLU output at 2 bytes and the log-sum-exps. At TP 1 and
// at TP 2 with SP (this rank's columns: Ca, kv_cols, F; its residual rows).
TEST(Memory, LlamaFusedBlockUnderSelectiveRecomputeSharesItsBf16Core) {
  ModelConfig cfg;
  cfg.vocab_size = 64, cfg.seq_len = 16, cfg.n_layer = 4, cfg.n_head = 4, cfg.d_model = 32;
  cfg.arch = "llama", cfg.n_kv_head = 2, cfg.ffn_hidden = 64;
  for (int tp : {1, 2}) {
    MemoryLayout lay;
    lay.micro_batch = 2;
    lay.peak_stash = 3;
    lay.host_memory = false;
    lay.recompute = Recompute::selective;
    lay.bf16_products = true;
    lay.tp = tp;
    lay.sequence_parallel = tp > 1;
    const MemoryEstimate fp32 = predict_memory(cfg, lay);
    lay.block_stash_bf16 = true;
    const MemoryEstimate fused = predict_memory(cfg, lay);
    const ChunkDims d = chunk_dims(cfg, tp, lay.micro_batch, lay.sequence_parallel, 1);
    const std::int64_t rows = 32, C = 32, lse = 2 * (4 / tp) * 16;
    // this rank's query, k (v) and SwiGLU columns: 32/tp, 16/tp, 64/tp
    EXPECT_EQ(d.Ca, C / tp);
    EXPECT_EQ(d.C3, (C + 2 * 16) / tp);
    EXPECT_EQ(d.F, 64 / tp);
    EXPECT_EQ(d.F1, 2 * d.F);
    const std::int64_t halves = rows * (C + d.C3 + C + d.F1) / 2;  // ln1 qkv ln2 fch
    EXPECT_EQ(fused_layer_floats(d, true), halves + d.Nr * C + 4 * d.Nr);
    EXPECT_EQ(layer_floats(d, true), 2 * halves + d.Nr * C + 4 * d.Nr);
    EXPECT_EQ(recomputed_floats(d, true), rows * (d.Ca + d.F) / 2 + lse);
    EXPECT_EQ(fp32.activations_per_microbatch - fused.activations_per_microbatch,
              4 * halves * 4);
    EXPECT_EQ(fp32.scratch - fused.scratch, rows * (d.Ca + d.F) / 2 * 4);
    MemoryLayout split = lay;  // the W stash in the layers' own dead bf16 qkv and fch
    split.split_backward = true;
    EXPECT_EQ(predict_memory(cfg, split).activations_per_microbatch,
              fused.activations_per_microbatch);
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

// The fused LM head (Ops::lm_head on CUDA under bf16, at any TP) keeps the logits in
// bf16 in the model's logits buffer (half its fp32 size) and converts only lnf [N, C]: the
// largest need is then the MLP's c_fc (x [N, C] and dy [N, 4C]), not the head's
// 2 (N C + N V); at tp 2 on the rank's vocabulary share.
TEST(Memory, FusedHeadConvertsOnlyTheFinalNorm) {
  ModelConfig cfg;
  cfg.vocab_size = 50304, cfg.seq_len = 1024, cfg.n_layer = 12, cfg.n_head = 12, cfg.d_model = 768;
  MemoryLayout lay;
  lay.micro_batch = 8;
  lay.host_memory = false;
  lay.set_precision(ops::Precision::bf16);
  EXPECT_TRUE(lay.fused_head);  // the backend's default under bf16
  const MemoryEstimate fused = predict_memory(cfg, lay);
  lay.fused_head = false;  // TRIDENT_CUDA_FUSED_HEAD=0, TRIDENT_CUDA_BASELINE=1
  const MemoryEstimate composed = predict_memory(cfg, lay);
  const std::int64_t N = 8 * 1024, V = 50304, C = 768;
  const std::int64_t head = 2 * (N * C + N * V), fc = 2 * (N * C + N * 4 * C);
  // and the model's logits buffer holds bf16: half of N V floats
  EXPECT_EQ(composed.scratch - fused.scratch, (head + head / 4) - (fc + fc / 4) + 2 * N * V);
  // At tp 2 the same on the rank's share: Vl = V / 2 columns of logits, 2C MLP columns.
  lay.tp = 2;
  const MemoryEstimate composed2 = predict_memory(cfg, lay);
  lay.fused_head = true;
  const MemoryEstimate fused2 = predict_memory(cfg, lay);
  const std::int64_t Vl = V / 2, head2 = 2 * (N * C + N * Vl), fc2 = 2 * (N * C + N * 2 * C);
  EXPECT_EQ(composed2.scratch - fused2.scratch,
            (head2 + head2 / 4) - (fc2 + fc2 / 4) + 2 * N * Vl);
}

// Attention through cuDNN (ops/cuda/cudnn_attention.hpp) takes its bf16 copies and cuDNN's
// workspace from the backend's scratch; the backend states the bytes for a shape
// (Ops::fused_attention_bytes) and predict_memory counts them where they are the largest
// need, asking for the rank's own attention shape: here GPT-2 small's heads at B 8, T 1024,
// then tp 2 (6 heads), then Ulysses at cp 2 (the whole sequence, 3 of the 6 heads).
TEST(Memory, FusedAttentionCountsTheBackendsBytesForTheRanksShape) {
  ModelConfig cfg;
  cfg.vocab_size = 512, cfg.seq_len = 1024, cfg.n_layer = 2, cfg.n_head = 12, cfg.d_model = 768;
  MemoryLayout lay;
  lay.micro_batch = 8;
  lay.host_memory = false;
  lay.bf16_products = true;
  const MemoryEstimate kernel = predict_memory(cfg, lay);
  std::vector<std::array<int, 6>> asked;
  const std::int64_t bytes = 400000000;  // more than any product's conversion here
  lay.fused_attention_bytes = [&](int b, int t, int nh, int nkv, int hs, bool qkv_rows) {
    asked.push_back({b, t, nh, nkv, hs, int(qkv_rows)});
    return bytes;
  };
  const MemoryEstimate cudnn = predict_memory(cfg, lay);
  // c_fc's conversion, 2 * 8192 * (768 + 3072) bytes, was the largest need; both at 1.25x.
  const std::int64_t fc = 2 * 8192 * (768 + 3072);
  EXPECT_EQ(cudnn.scratch - kernel.scratch, (bytes + bytes / 4) - (fc + fc / 4));
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], (std::array<int, 6>{8, 1024, 12, 12, 64, 0}));
  lay.tp = 2;
  predict_memory(cfg, lay);
  EXPECT_EQ(asked.back(), (std::array<int, 6>{8, 1024, 6, 6, 64, 0}));
  // The fused block (stores_fused_block) asks for its bf16 plans on the [q k v] rows.
  lay.block_stash_bf16 = true;
  predict_memory(cfg, lay);
  EXPECT_EQ(asked.back(), (std::array<int, 6>{8, 1024, 6, 6, 64, 1}));
  lay.cp = 2, lay.cp_mode = CpMode::ulysses;  // not the fused block's: packed rows
  predict_memory(cfg, lay);
  EXPECT_EQ(asked.back(), (std::array<int, 6>{8, 1024, 3, 3, 64, 0}));
  // A backend that takes none (0 bytes): the prediction without it.
  lay.tp = 1, lay.cp = 1, lay.cp_mode = CpMode::ring, lay.block_stash_bf16 = false;
  lay.fused_attention_bytes = [](int, int, int, int, int, bool) { return std::int64_t(0); };
  EXPECT_EQ(predict_memory(cfg, lay).scratch, kernel.scratch);
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

// Context parallelism (MemoryLayout::cp): each rank holds seq_len / cp rows of every
// sequence, so the stash, the scratch and the boundary messages are 1/cp of cp = 1's; the
// ring attention adds its buffers (RingAttention's constructor, written out here from the
// shapes); the weights stay; ZeRO-1 shards over dp * cp ranks and the MPI temporaries of
// the gradient buckets appear as soon as dp * cp > 1.
TEST(Memory, ContextParallelSplitsTheActivationsAndAddsTheRing) {
  ModelConfig cfg;
  cfg.vocab_size = 64, cfg.seq_len = 64, cfg.n_layer = 4, cfg.n_head = 4, cfg.d_model = 32;
  MemoryLayout lay;
  lay.pp = 2, lay.micro_batch = 2, lay.peak_stash = 3, lay.message_buffers = 2;
  lay.host_memory = false;  // no start-up staging, no MPI temporaries: those below apart
  const MemoryEstimate one = predict_memory(cfg, lay);
  EXPECT_EQ(one.ring, 0);
  for (int cp : {2, 4}) {
    lay.cp = cp;
    const MemoryEstimate e = predict_memory(cfg, lay);
    EXPECT_EQ(e.weights, one.weights) << cp;
    EXPECT_EQ(e.gradients, one.gradients) << cp;
    EXPECT_EQ(e.optimizer, one.optimizer) << cp;
    // Every activation, stash and message is per token row: exactly 1/cp.
    EXPECT_EQ(e.activations * cp, one.activations) << cp;
    EXPECT_EQ(e.activations_per_microbatch * cp, one.activations_per_microbatch) << cp;
    EXPECT_EQ(e.messages * cp, one.messages) << cp;
    // The scratch too, but for the device backend's 1 MiB floor.
    const std::int64_t fixed = std::int64_t(1) << 20;
    EXPECT_EQ((e.scratch - fixed) * cp, one.scratch - fixed) << cp;
    // The ring: rows = B * T / cp; GPT-2 at tp 1 has nkv * hs = NH * hs = C = 32. Five
    // key/value blocks (2 in flight, 2 gradients, 1 received) of 2 rows C, the partial output
    // [rows, C], its LSE [rows, NH], packed q and the dq accumulator [rows, C] each.
    const std::int64_t rows = 2 * 64 / cp;
    const std::int64_t ring = 5 * 2 * rows * 32 + rows * 32 + rows * 4 + 2 * rows * 32;
    EXPECT_EQ(e.ring, ring * 4) << cp;
    EXPECT_EQ(e.peak(), e.weights + e.gradients + e.optimizer + e.activations + e.scratch +
                            e.messages + e.ring) << cp;
    EXPECT_NE(e.describe().find(" + ring attention " + format_bytes(e.ring)), std::string::npos)
        << e.describe();
    EXPECT_LT(e.peak(), one.peak()) << cp;
  }

  // ZeRO-1 over dp * cp: dp 2 x cp 2 shards the moments and the gradient shard in 4, as dp 4
  // does at cp 1; the gradient buckets' MPI temporaries (CPU ranks) come with cp alone.
  MemoryLayout z;
  z.micro_batch = 2, z.zero1 = true;
  const std::int64_t params = predict_memory(cfg, z).weights / 4;
  EXPECT_EQ(predict_memory(cfg, z).optimizer, 2 * params * 4);  // dp 1, cp 1: no sharding
  EXPECT_EQ(predict_memory(cfg, z).collectives, 0);
  z.dp = 2, z.cp = 2;
  const std::int64_t shard = (params + 3) / 4;
  const MemoryEstimate zc = predict_memory(cfg, z);
  EXPECT_EQ(zc.optimizer, 2 * shard * 4);
  EXPECT_EQ(zc.gradients, (params + shard) * 4);
  // ZeRO-1 over 4 ranks: reduce-scatters, two temporaries each (libnbc over 3 or more ranks)
  EXPECT_EQ(zc.collectives, 2 * params * 4);
  z.reduce_scatter_temp_ratio = 1.5;
  EXPECT_EQ(predict_memory(cfg, z).collectives, std::int64_t(1.5 * double(params * 4)));
  z.zero1 = false;  // allreduces: one each
  EXPECT_EQ(predict_memory(cfg, z).collectives, params * 4);
  z.zero1 = true, z.dp = 1;  // reduce-scatters over 2 ranks: one each, as an allreduce
  EXPECT_EQ(predict_memory(cfg, z).optimizer, 2 * ((params + 1) / 2) * 4);
  EXPECT_EQ(predict_memory(cfg, z).collectives, params * 4);
}

// Llama's grouped-query attention: the ring passes the key/value heads the rank's attention
// reads (n_kv_head / tp, or one when n_kv_head < tp replicates them), not the query heads.
TEST(Memory, RingCountsTheKeyValueHeadsOfTheRank) {
  ModelConfig cfg;
  cfg.arch = "llama";
  cfg.vocab_size = 64, cfg.seq_len = 32, cfg.n_layer = 2, cfg.n_head = 8, cfg.d_model = 64;
  cfg.n_kv_head = 2;  // head size 8
  MemoryLayout lay;
  lay.micro_batch = 1, lay.cp = 2;
  const std::int64_t rows = 32 / 2;
  // tp 1: 8 query heads (Ca 64), 2 key/value heads of 8.
  EXPECT_EQ(predict_memory(cfg, lay).ring,
            (5 * 2 * rows * 16 + rows * 64 + rows * 8 + 2 * rows * 64) * 4);
  // tp 2: 4 query heads (Ca 32), 1 key/value head.
  lay.tp = 2;
  EXPECT_EQ(predict_memory(cfg, lay).ring,
            (5 * 2 * rows * 8 + rows * 32 + rows * 4 + 2 * rows * 32) * 4);
  // tp 4: 2 query heads (Ca 16); the 2 key/value heads are replicated, each rank reads one.
  lay.tp = 4;
  EXPECT_EQ(predict_memory(cfg, lay).ring,
            (5 * 2 * rows * 8 + rows * 16 + rows * 2 + 2 * rows * 16) * 4);
}

// parallel.cp_mode = "ulysses": the term holds UlyssesAttention's buffers instead of the
// ring's (send and receive of max(q|k|v, out|dout) per row, the whole-sequence q|k|v and
// out|dout of the rank's heads); nothing else changes.
TEST(Memory, UlyssesCountsItsAllToAllBuffersInsteadOfTheRing) {
  ModelConfig cfg;
  cfg.arch = "llama";
  cfg.vocab_size = 64, cfg.seq_len = 32, cfg.n_layer = 2, cfg.n_head = 8, cfg.d_model = 64;
  cfg.n_kv_head = 2;  // head size 8
  MemoryLayout lay;
  lay.micro_batch = 1, lay.cp = 2;
  const MemoryEstimate ring = predict_memory(cfg, lay);
  lay.cp_mode = CpMode::ulysses;
  const MemoryEstimate uly = predict_memory(cfg, lay);
  const std::int64_t rows = 32 / 2;
  // tp 1: q|k|v (8 + 2 * 2) * 8 = 96 floats a row, out|dout 2 * 64 = 128.
  EXPECT_EQ(uly.ring, (2 * rows * 128 + rows * 96 + rows * 128) * 4);
  EXPECT_TRUE(uly.ulysses);
  EXPECT_FALSE(ring.ulysses);
  EXPECT_EQ(uly.peak() - uly.ring, ring.peak() - ring.ring);
  EXPECT_NE(uly.describe().find("+ ulysses attention"), std::string::npos) << uly.describe();
  EXPECT_EQ(uly.describe().find("ring attention"), std::string::npos) << uly.describe();
  // tp 2: 4 query heads, 1 key/value head: q|k|v 48, out|dout 64 floats a row.
  lay.tp = 2;
  EXPECT_EQ(predict_memory(cfg, lay).ring, (2 * rows * 64 + rows * 48 + rows * 64) * 4);
  // cp 1: no CP attention at all, whatever the mode.
  lay.cp = 1;
  EXPECT_EQ(predict_memory(cfg, lay).ring, 0);
}

// The fused bf16 block under CP on a device (MemoryLayout::cp_bf16, CUDA's default): the ring or
// Ulysses made for its bf16 operands (Ulysses' buffers half, the ring's 4.5 key/value blocks
// instead of 5) and no fp32 copies of the attention's operands in scratch; cp_bf16 off: the
// copies (2 x [N, C3] + 2 x [N, Ca] floats) and fp32 buffers.
TEST(Memory, FusedBlockCpOnBf16OperandsDropsTheHookCopies) {
  ModelConfig cfg;
  cfg.arch = "llama";
  cfg.vocab_size = 64, cfg.seq_len = 32, cfg.n_layer = 2, cfg.n_head = 8, cfg.d_model = 64;
  cfg.n_kv_head = 2;  // head size 8: C3 = 64 + 2 * 16 = 96, Ca = 64
  MemoryLayout lay;
  lay.micro_batch = 1, lay.cp = 2;
  lay.host_memory = false;
  lay.set_precision(ops::Precision::bf16);
  ASSERT_TRUE(lay.cp_bf16 && lay.block_stash_bf16);
  const std::int64_t rows = 32 / 2, kv_block = 2 * rows * 16;
  const std::int64_t copies = (2 * rows * 96 + 2 * rows * 64) * 4;  // each 256-byte aligned
  for (CpMode mode : {CpMode::ring, CpMode::ulysses}) {
    lay.cp_mode = mode;
    lay.cp_bf16 = true;
    const MemoryEstimate on = predict_memory(cfg, lay);
    lay.cp_bf16 = false;
    const MemoryEstimate off = predict_memory(cfg, lay);
    EXPECT_EQ(off.scratch - on.scratch, copies);
    if (mode == CpMode::ulysses)
      EXPECT_EQ(off.ring, 2 * on.ring);
    else
      EXPECT_EQ(off.ring - on.ring, kv_block / 2 * 4);
    EXPECT_EQ(off.activations, on.activations);
  }
}

}  // namespace
}  // namespace trident::model
