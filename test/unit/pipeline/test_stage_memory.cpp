// What a schedule makes one pipeline rank hold: set_schedule_memory and the message
// buffers (stage_memory.hpp).
#include <gtest/gtest.h>

#include <algorithm>

#include "trident/model/memory.hpp"
#include "trident/pipeline/lower.hpp"
#include "trident/pipeline/stage_memory.hpp"

using namespace trident::pipeline;

TEST(MessageBuffers, NoneWithoutAPipeline) {
  EXPECT_EQ(peak_message_buffers(make_schedule("1f1b", 1, 1, 8))[0].total(), 0);
}

// Receives are exact: each is posted kReceiveLead compute actions ahead of its consumer.
// Under 1F1B at pp 2 the first rank receives gradients, and in its steady F B F B two are
// posted at once (the next B's before the F that precedes it, while this B's is still
// waiting); the last rank runs F B F B too but its one receive per pair is consumed first.
TEST(MessageBuffers, ReceivesFollowTheLoweredList) {
  const Schedule s = make_schedule("1f1b", 2, 1, 8);
  EXPECT_EQ(peak_message_buffers(s)[0].receives, 2);
  EXPECT_EQ(peak_message_buffers(s)[1].receives, 1);
  for (const char* name : {"gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "looped-bfs"})
    for (int pp : {2, 4}) {
      const int vpp = std::string(name) == "interleaved-1f1b" || std::string(name) == "looped-bfs" ? 2 : 1;
      const Schedule t = make_schedule(name, pp, vpp, 8);
      for (int r = 0; r < pp; ++r) {
        const MessageBuffers b = peak_message_buffers(t)[std::size_t(r)];
        EXPECT_GE(b.receives, 1) << name << " pp " << pp << " rank " << r;
        EXPECT_LE(b.receives, kReceiveLead + 1) << name << " pp " << pp << " rank " << r;
        EXPECT_GE(b.sends, 1) << name << " pp " << pp << " rank " << r;
      }
    }
}

// Breadth-first runs every chunk-0 forward before any backward: its sends wait for a
// receiver busy with its own forwards, so it holds several buffers where 1F1B's steady
// state holds about one (the executor measured 8 and 1 on model C of mpi.plan_memory).
TEST(MessageBuffers, BreadthFirstHoldsMoreSendsThan1F1B) {
  const int bfs = peak_message_buffers(make_schedule("looped-bfs", 2, 3, 8))[0].sends;
  const int one = peak_message_buffers(make_schedule("1f1b", 2, 1, 8))[0].sends;
  EXPECT_EQ(one, 1);
  EXPECT_GE(bfs, 4);
  EXPECT_LE(bfs, 8);  // at most one per microbatch of the first chunk it sends
}

TEST(ScheduleMemory, FillsTheLayoutFromTheSchedule) {
  const Schedule s = make_schedule("zb-h1", 4, 1, 8);
  trident::model::MemoryLayout lay;
  set_schedule_memory(lay, s, 1);
  EXPECT_EQ(lay.peak_stash, peak_activations(s.stages[1]));
  EXPECT_TRUE(lay.split_backward);
  EXPECT_EQ(lay.weight_versions, 1);
  EXPECT_EQ(lay.message_buffers, peak_message_buffers(s)[1].total());
  set_schedule_memory(lay, make_schedule("pipedream-2bw", 4, 1, 8), 0);
  EXPECT_FALSE(lay.split_backward);
  EXPECT_EQ(lay.weight_versions, 2);
  EXPECT_EQ(lay.placement, trident::Placement::round_robin);
  set_schedule_memory(lay, make_schedule("zb-v", 2, 2, 8), 0);  // the V: the placement too
  EXPECT_EQ(lay.placement, trident::Placement::v_shape);
}

// Every rank's figures from one simulation are each rank's own.
TEST(ScheduleMemory, EveryRankAtOnce) {
  for (const char* name : {"gpipe", "1f1b", "zb-h1"}) {
    const Schedule s = make_schedule(name, 4, 1, 8);
    const std::vector<RankScheduleMemory> all = schedule_memory(s);
    ASSERT_EQ(all.size(), 4u);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(all[std::size_t(r)].peak_stash, peak_activations(s.stages[std::size_t(r)])) << name;
      EXPECT_EQ(all[std::size_t(r)].message_buffers,
                peak_message_buffers(s)[std::size_t(r)].total()) << name;
    }
    if (std::string(name) == "1f1b")  // the first rank stashes most
      EXPECT_GT(all[0].peak_stash, all[3].peak_stash) << name;
  }
}

// Issue 29: zb-v holds no more activation memory than 1F1B on its worst rank. A slot keeps
// the chunk's input and every layer's output but the last (which waits in the model's
// boundary scratch until its send; the output gradient waits there from its receive, and the
// head's from its F to the B that follows it at once on zb-v's first rank and 1F1B's last),
// so zb-v's 2·pp half-stage slots hold exactly 1F1B's pp whole stages: equal. The split
// backward's B -> W gradients live in the layers' dead qkv and fch where the layers keep them
// (fp32, or the fused block's bf16 stash: bf16 gradients); where they do not (full recompute,
// the packed bf16 storage) they are a stash of their own, which 1F1B does not need: there
// zb-v holds zb-h1's. The pipeline bench's model with a 32k vocabulary, m = 8, at pp 2 and
// pp 4: plain, selective recompute, tp 2 with sequence parallelism, bf16 storage on a device
// with the fused block's stash (variant 4); full recompute, the packed bf16 storage (5).
TEST(ScheduleMemory, ZeroBubbleVHoldsNoMoreActivationsThan1F1B) {
  using trident::model::Recompute;
  for (int pp : {2, 4})
    for (int variant = 0; variant < 6; ++variant) {
      trident::model::ModelConfig cfg;
      cfg.vocab_size = 32000, cfg.seq_len = 128, cfg.n_layer = 4 * pp / 2, cfg.n_head = 4;
      cfg.d_model = 256;
      auto worst = [&](const char* name, int vpp) {
        const Schedule s = make_schedule(name, pp, vpp, 8);
        std::int64_t most = 0;
        for (int r = 0; r < pp; ++r) {
          trident::model::MemoryLayout lay;
          lay.pp = pp, lay.vpp = vpp, lay.pp_rank = r;
          if (variant == 1) lay.recompute = Recompute::selective;
          if (variant == 2) lay.tp = 2, lay.sequence_parallel = true;
          if (variant == 3) lay.recompute = Recompute::full;
          if (variant >= 4) {
            lay.host_memory = false;
            lay.set_precision(trident::ops::Precision::bf16);
            lay.block_stash_bf16 = variant == 4;
          }
          set_schedule_memory(lay, s, r);
          EXPECT_EQ(lay.head_gradients, 0) << name << " rank " << r;
          most = std::max(most, trident::model::predict_memory(cfg, lay).activations);
        }
        return most;
      };
      const std::string what = "pp " + std::to_string(pp) + " variant " + std::to_string(variant);
      const std::int64_t zbv = worst("zb-v", 2), one = worst("1f1b", 1), zbh1 = worst("zb-h1", 1);
      const bool own_stash = variant == 3 || variant == 5;  // the B -> W stash of its own
      if (!own_stash) EXPECT_EQ(zbv, one) << what;
      EXPECT_EQ(zbv, zbh1) << what;
      if (own_stash) EXPECT_GT(zbh1, one) << what;
    }
}

// One slot: the input and L - 1 layer outputs, [Nr, C] each, besides the layers' stash; the
// head's output gradients that wait for a later B, one [Nr, C] row each, on top (gpipe's last
// rank: all m of them); the boundary scratch, [Nr, C] once, with the scratch.
TEST(ScheduleMemory, SlotsHoldAllButTheLastOutputAndWaitingHeadGradientsARow) {
  trident::model::ModelConfig cfg;
  cfg.vocab_size = 64, cfg.seq_len = 16, cfg.n_layer = 4, cfg.n_head = 4, cfg.d_model = 32;
  const std::int64_t row = 2 * 16 * 32 * 4;  // micro-batch 2: [Nr, C] in bytes
  trident::model::MemoryLayout lay;
  lay.micro_batch = 2, lay.recompute = trident::model::Recompute::full;  // no layers' stash
  lay.pp = 2, lay.pp_rank = 1;  // 2 layers
  EXPECT_EQ(trident::model::predict_memory(cfg, lay).activations_per_microbatch, 2 * row);
  const Schedule gpipe = make_schedule("gpipe", 2, 1, 8);
  set_schedule_memory(lay, gpipe, 1);
  EXPECT_EQ(lay.peak_stash, 8);
  EXPECT_EQ(lay.head_gradients, 8);
  EXPECT_EQ(trident::model::predict_memory(cfg, lay).activations, 8 * 2 * row + 8 * row);
  set_schedule_memory(lay, gpipe, 0);  // no head on the first rank
  EXPECT_EQ(lay.head_gradients, 0);
  lay.pp = 1, lay.pp_rank = 0;  // 4 layers: 4 rows a slot, its head gradient in scratch
  set_schedule_memory(lay, make_schedule("1f1b", 1, 1, 8), 0);
  EXPECT_EQ(trident::model::predict_memory(cfg, lay).activations, 4 * row);
}
