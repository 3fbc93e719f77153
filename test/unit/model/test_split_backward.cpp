// The split backward of the zero-bubble schedules (GptChunk::backward with weight_grads =
// false, then backward_weights): the gradients of the fused backward, with the two weight
// passes' output gradients stashed in the layers' own qkv and fch (dead once B has read them)
// unless the layer keeps no copy of its own (full recompute), and the activation slot
// exactly what predict_memory counts for one microbatch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "trident/model/gpt.hpp"
#include "trident/model/memory.hpp"
#include "trident/model/stage_model.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"
#include "tiny_model.hpp"

namespace modeltest {
void need_mpi();
}

namespace trident::model {
namespace {

ModelConfig tiny(const std::string& arch) { return tiny_model(arch, 2, 16); }

std::int64_t slot_floats(const ChunkActivations& a) {
  std::int64_t n = 0;
  for (const FloatBuffer* b : {&a.input, &a.outputs, &a.store, &a.grad_store})
    n += std::int64_t(b->size());
  return n;
}

// Two microbatches of two sequences through the whole model (one chunk): fused, F F B B,
// against split, F F B B W W (each W after both B's, as the schedules let them lag).
TEST(SplitBackward, GivesTheFusedGradientsFromTheLayersDeadTensors) {
  modeltest::need_mpi();
  parallel::ParallelState ps = parallel::make_parallel_state(parallel::GridShape{});
  auto ops = ops::make_ops("cpu", 1);
  const std::vector<StageLayout> whole{StageLayout{0, 2, true, true}};
  std::vector<std::int32_t> tokens(2 * 2 * 8), targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = std::int32_t((i * 7 + 3) % 29), targets[i] = std::int32_t((i * 5 + 1) % 29);
  for (const char* arch : {"gpt2", "llama"})
    for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
      const std::string what = std::string(arch) + " recompute " + std::to_string(int(rc));
      StageModelOptions o;
      o.micro_batch = 2, o.recompute = rc;
      const ModelConfig cfg = tiny(arch);
      auto m = make_stage_model(cfg, whole, ps, *ops, o);
      auto& chunk = dynamic_cast<GptChunk&>(*m);
      chunk.init_weights(5);
      auto run = [&](bool split) {
        chunk.zero_grads();
        std::unique_ptr<ChunkActivations> a[2] = {chunk.make_chunk_activations(-1, split),
                                                  chunk.make_chunk_activations(-1, split)};
        // F F B B: neither B follows its F, so each head gradient waits in a row of its own.
        std::vector<float> rows(2 * std::size_t(chunk.boundary_numel()));
        for (int k = 0; k < 2; ++k) a[k]->keep_head_gradient(rows.data() + k * chunk.boundary_numel());
        for (int k = 0; k < 2; ++k)
          chunk.forward(0, *a[k], tokens.data() + k * 16, targets.data() + k * 16, 0.01f);
        for (int k = 0; k < 2; ++k) chunk.backward(0, *a[k], tokens.data() + k * 16, !split);
        if (split)
          for (int k = 0; k < 2; ++k) chunk.backward_weights(0, *a[k]);
        return std::vector<float>(chunk.grads(), chunk.grads() + chunk.num_params());
      };
      const std::vector<float> fused = run(false), split = run(true);
      float most = 0, diff = 0;
      for (std::size_t i = 0; i < fused.size(); ++i) {
        most = std::max(most, std::fabs(fused[i]));
        diff = std::max(diff, std::fabs(fused[i] - split[i]));
      }
      EXPECT_GT(most, 0.0f) << what;
      EXPECT_LE(diff, 1e-6f * most) << what;

      // Where the stash lives, and the slot against the prediction.
      const auto slot = chunk.make_chunk_activations(-1, true);
      for (int l = 0; l < 2; ++l) {
        const LayerGradStash& g = slot->grad_stash[std::size_t(l)];
        if (rc == Recompute::full) {
          EXPECT_EQ(slot->grad_store.size(),
                    std::size_t(grad_stash_floats(chunk_dims(cfg, 1, 2, false)) * 2)) << what;
          EXPECT_NE(g.dqkv, nullptr) << what;
        } else {
          EXPECT_EQ(g.dqkv, slot->layers[std::size_t(l)].qkv) << what;
          EXPECT_EQ(g.dfch, slot->layers[std::size_t(l)].fch) << what;
          EXPECT_EQ(slot->grad_store.size(), 0u) << what;
        }
      }
      MemoryLayout lay;
      lay.micro_batch = 2, lay.recompute = rc, lay.split_backward = true;
      EXPECT_EQ(predict_memory(cfg, lay).activations_per_microbatch,
                slot_floats(*slot) * std::int64_t(sizeof(float))) << what;
      lay.split_backward = false;
      EXPECT_EQ(predict_memory(cfg, lay).activations_per_microbatch,
                slot_floats(*chunk.make_chunk_activations(-1, false)) * std::int64_t(sizeof(float)))
          << what;
    }
}

// The split backward's stash under what predict_memory counts: nothing beyond the layers'
// own activations where they are kept in fp32 (none, selective), and where they are not (bf16
// storage, full recompute) the gradients at c_attn's and c_fc's outputs, N (C3 + F1) floats a
// layer, written out from the shapes: GPT-2 at d 32, tp 1 keeps 3C + 4C = 224 per row.
TEST(SplitBackward, PredictedStashIsTheDeadActivationsOrTwoGradientsALayer) {
  ModelConfig cfg;
  cfg.vocab_size = 64, cfg.seq_len = 16, cfg.n_layer = 4, cfg.n_head = 4, cfg.d_model = 32;
  MemoryLayout lay;
  lay.micro_batch = 2, lay.host_memory = false;
  const std::int64_t per_layer = 2 * 16 * (3 * 32 + 4 * 32), layers = 4;
  auto stash = [&](Recompute rc, bool bf16) {
    lay.recompute = rc, lay.bf16_activations = bf16;
    lay.split_backward = false;
    const std::int64_t fused = predict_memory(cfg, lay).activations_per_microbatch;
    lay.split_backward = true;
    return predict_memory(cfg, lay).activations_per_microbatch - fused;
  };
  EXPECT_EQ(stash(Recompute::none, false), 0);
  EXPECT_EQ(stash(Recompute::selective, false), 0);
  EXPECT_EQ(stash(Recompute::full, false), layers * per_layer * 4);
  EXPECT_EQ(stash(Recompute::none, true), layers * per_layer * 4);
}

}  // namespace
}  // namespace trident::model
