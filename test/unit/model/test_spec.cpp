// ShardSpec geometry: offsets pack the flat buffer, shards tile the logical tensor.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>
#include <string>

#include "trident/core/error.hpp"
#include "trident/model/spec.hpp"

using namespace trident::model;

TEST(Spec, SerialSpecsPackTheFlatBuffer) {
  ModelConfig cfg{50, 16, 2, 2, 8};
  auto specs = gpt_param_specs(cfg, StageLayout{0, 2, true, true}, 0, 1);
  ASSERT_EQ(specs.size(), 2 + 2 * 12 + 2u);
  std::int64_t off = 0;
  for (const auto& s : specs) {
    EXPECT_EQ(s.offset, off) << s.name;
    EXPECT_EQ(s.local_numel(), s.numel()) << s.name;
    off += s.local_numel();
  }
  EXPECT_EQ(specs[0].name, "wte");
  EXPECT_EQ(specs.back().name, "ln_f.bias");
}

TEST(Spec, TensorShardsTileEveryLogicalTensorExactlyOnce) {
  ModelConfig cfg{51, 16, 1, 4, 16};  // vocabulary not a multiple of tp: padding rows
  for (int tp : {1, 2, 4}) {
    std::vector<std::vector<ShardSpec>> per_rank;
    for (int r = 0; r < tp; ++r)
      per_rank.push_back(gpt_param_specs(cfg, StageLayout{0, 1, true, true}, r, tp));
    for (std::size_t p = 0; p < per_rank[0].size(); ++p) {
      std::multiset<std::int64_t> seen;
      for (int r = 0; r < tp; ++r) {
        const auto& s = per_rank[r][p];
        if (s.tp_replicated() && r > 0) continue;
        for_each_local_element(s, [&](std::int64_t local, std::int64_t global) {
          EXPECT_LT(local, s.local_numel());
          seen.insert(global);
        });
      }
      const auto& s0 = per_rank[0][p];
      ASSERT_EQ(std::int64_t(seen.size()), s0.numel()) << s0.name << " tp=" << tp;
      EXPECT_EQ(std::int64_t(std::set<std::int64_t>(seen.begin(), seen.end()).size()), s0.numel())
          << s0.name;
    }
  }
}

TEST(Spec, ChunkLayoutsPlaceVirtualStagesRoundRobin) {
  ModelConfig cfg{50, 16, 8, 2, 8};
  // pp 2, vpp 2: virtual stages of 2 layers; v on rank v % 2 as chunk v / 2.
  auto r0 = chunk_layouts(cfg, 2, 2, 0), r1 = chunk_layouts(cfg, 2, 2, 1);
  ASSERT_EQ(r0.size(), 2u);
  EXPECT_EQ(r0[0].first_layer, 0);
  EXPECT_EQ(r0[0].last_layer, 2);
  EXPECT_EQ(r0[1].first_layer, 4);
  EXPECT_EQ(r0[1].last_layer, 6);
  EXPECT_EQ(r1[0].first_layer, 2);
  EXPECT_EQ(r1[1].first_layer, 6);
  EXPECT_TRUE(r0[0].has_embedding);
  EXPECT_FALSE(r0[1].has_embedding || r0[0].has_head || r0[1].has_head);
  EXPECT_TRUE(r1[1].has_head);
  EXPECT_FALSE(r1[0].has_head || r1[0].has_embedding || r1[1].has_embedding);
  // vpp 1 is the plain pipeline split.
  auto one = chunk_layouts(cfg, 4, 1, 3);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].first_layer, 6);
  EXPECT_TRUE(one[0].has_head);
  EXPECT_THROW(chunk_layouts(cfg, 3, 1, 0), trident::Error);  // 8 layers over 3 stages
  EXPECT_THROW(chunk_layouts(cfg, 2, 3, 0), trident::Error);  // over 6 virtual stages
}

TEST(Spec, ChunkLayoutsTakeUnevenStageLayers) {
  ModelConfig cfg{50, 16, 7, 2, 8};
  // pp 2, vpp 2, virtual stages of 3, 1, 1, 2 layers: rank 0 holds v0 [0,3) and v2 [4,5),
  // rank 1 v1 [3,4) and v3 [5,7) with the head.
  auto r0 = chunk_layouts(cfg, 2, 2, 0, {3, 1, 1, 2}), r1 = chunk_layouts(cfg, 2, 2, 1, {3, 1, 1, 2});
  ASSERT_EQ(r0.size(), 2u);
  EXPECT_EQ(r0[0].first_layer, 0);
  EXPECT_EQ(r0[0].last_layer, 3);
  EXPECT_EQ(r0[1].first_layer, 4);
  EXPECT_EQ(r0[1].last_layer, 5);
  EXPECT_EQ(r1[0].first_layer, 3);
  EXPECT_EQ(r1[0].last_layer, 4);
  EXPECT_EQ(r1[1].first_layer, 5);
  EXPECT_EQ(r1[1].last_layer, 7);
  EXPECT_TRUE(r0[0].has_embedding && r1[1].has_head);
  EXPECT_THROW(chunk_layouts(cfg, 2, 2, 0, {3, 1, 1}), trident::Error);     // 3 of 4 stages
  EXPECT_THROW(chunk_layouts(cfg, 2, 2, 0, {3, 1, 1, 1}), trident::Error);  // sums to 6
  EXPECT_THROW(chunk_layouts(cfg, 2, 2, 0, {4, 0, 1, 2}), trident::Error);  // an empty stage
  EXPECT_EQ(stage_layers_problem({3, 1, 1, 2}, 7, 4), "");
  EXPECT_NE(stage_layers_problem({4, 0, 1, 2}, 7, 4).find("entry 1 is 0"), std::string::npos);
}

TEST(Spec, BalancedStageLayersCarryTheHeadOnTheLastStage) {
  // A vocabulary of 2 makes the ends nearly free: the even split where it divides, else the
  // remainder off the head's stage first (then the first stage's).
  ModelConfig tiny{2, 16, 8, 2, 64};
  EXPECT_EQ(balanced_stage_layers(tiny, 4, 1), (std::vector<int>{2, 2, 2, 2}));
  tiny.n_layer = 5;
  EXPECT_EQ(balanced_stage_layers(tiny, 3, 1), (std::vector<int>{2, 2, 1}));
  tiny.n_layer = 7;
  EXPECT_EQ(balanced_stage_layers(tiny, 4, 1), (std::vector<int>{2, 2, 2, 1}));
  // GPT-2 124M's head (d 768, V 50257, T 1024) costs (2 d V + 5 V) / (24 d^2 + 4 T d) = 4.47
  // layers: at pp 4 the last stage keeps one layer and the others share the rest.
  ModelConfig gpt2{50257, 1024, 12, 12, 768};
  EXPECT_NEAR(stage_end_costs(gpt2, 1).head, 4.47, 0.01);
  const std::vector<int> split = balanced_stage_layers(gpt2, 4, 1);
  EXPECT_EQ(split.back(), 1);
  EXPECT_EQ(std::accumulate(split.begin(), split.end(), 0), 12);
  EXPECT_LE(*std::max_element(split.begin(), split.end()), 4);
  // 32 layers at pp 3 (the example): 11 + 11 + 10 minus what the head costs.
  ModelConfig big{32000, 2048, 32, 32, 4096};
  const std::vector<int> b = balanced_stage_layers(big, 3, 1);
  EXPECT_EQ(std::accumulate(b.begin(), b.end(), 0), 32);
  EXPECT_LT(b.back(), b.front());
  EXPECT_THROW(balanced_stage_layers(tiny, 8, 1), trident::Error);  // 7 layers, 8 stages
}

// Under zb-v's V rank 0 holds the first and the last virtual stage, so both ends: the split
// balances each rank's pair of stages (the busiest rank bounds a zero-bubble step), then the
// pair within rank 0 (the embedding's stage takes the layers the head's cannot).
TEST(Spec, BalancedStageLayersUnderTheVBalanceRanks) {
  ModelConfig tiny{2, 16, 8, 2, 64};  // ends nearly free: the even split
  EXPECT_EQ(balanced_stage_layers(tiny, 4, 1, trident::Placement::v_shape),
            (std::vector<int>{2, 2, 2, 2}));
  // GPT-2 124M's head costs 4.47 layers: 12 layers at pp 2 x 2 chunks. Rank 0 (stages 0 and
  // 3) takes 2 + 1 layers plus both ends (~7.5), rank 1 (stages 1 and 2) the other 9 less
  // what keeps it at or under rank 0's cost.
  ModelConfig gpt2{50257, 1024, 12, 12, 768};
  const std::vector<int> v = balanced_stage_layers(gpt2, 4, 1, trident::Placement::v_shape);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(std::accumulate(v.begin(), v.end(), 0), 12);
  const EndCosts e = stage_end_costs(gpt2, 1);
  const double rank0 = v[0] + v[3] + e.embedding + e.head, rank1 = v[1] + v[2];
  EXPECT_LE(std::abs(rank0 - rank1), 1.0 + 1e-9) << v[0] << v[1] << v[2] << v[3];
  EXPECT_GE(v[0], v[3]);  // the head's stage holds fewer layers than the embedding's
  // With 8 layers the round-robin split balances stages, not ranks ([2, 2, 3, 1]): under the
  // V its stages 0 and 3 would give rank 0 3 layers + both ends (7.5) against rank 1's 5.
  ModelConfig deep{50257, 1024, 8, 12, 768};
  const std::vector<int> rr = balanced_stage_layers(deep, 4, 1);
  const std::vector<int> dv = balanced_stage_layers(deep, 4, 1, trident::Placement::v_shape);
  EXPECT_GT(rr[0] + rr[3], dv[0] + dv[3]);
  EXPECT_EQ(dv[0] + dv[3], 2);  // 2 + 4.48 against 6: the least largest rank
}

TEST(Spec, OneTableOverARanksChunksNamesEachTensorOnce) {
  ModelConfig cfg{50, 16, 8, 2, 8};
  // Every rank of pp 2 x vpp 2: the layers of its two chunks, in ascending order, packed;
  // over the ranks every layer exactly once; wte on both ends of the pipeline.
  std::multiset<std::string> all;
  for (int r = 0; r < 2; ++r) {
    auto specs = gpt_param_specs(cfg, chunk_layouts(cfg, 2, 2, r), 0, 1);
    std::int64_t off = 0;
    int last_layer = -1;
    std::set<std::string> names;
    for (const auto& s : specs) {
      EXPECT_EQ(s.offset, off) << s.name;
      off += s.local_numel();
      EXPECT_TRUE(names.insert(s.name).second) << s.name << " twice on rank " << r;
      if (s.layer >= 0) {
        EXPECT_GE(s.layer, last_layer) << s.name;
        last_layer = s.layer;
      }
      all.insert(s.name);
    }
    EXPECT_EQ(specs.front().name, "wte");
  }
  EXPECT_EQ(all.count("wte"), 2u);
  EXPECT_EQ(all.count("wpe"), 1u);
  EXPECT_EQ(all.count("ln_f.weight"), 1u);
  for (int l = 0; l < 8; ++l) EXPECT_EQ(all.count("h." + std::to_string(l) + ".ln_1.weight"), 1u);
  // A rank with the embedding chunk and the head chunk keeps one wte (a serial model cut
  // into chunks has the serial table's tensors).
  auto both = gpt_param_specs(cfg, {StageLayout{0, 4, true, false}, StageLayout{4, 8, false, true}},
                              0, 1);
  auto serial = gpt_param_specs(cfg, StageLayout{0, 8, true, true}, 0, 1);
  ASSERT_EQ(both.size(), serial.size());
  for (std::size_t i = 0; i < both.size(); ++i) {
    EXPECT_EQ(both[i].name, serial[i].name);
    EXPECT_EQ(both[i].offset, serial[i].offset);
  }
}

// Llama's table: FORMAT.md's names in order, q k v (gate up) adjacent, shards tiling every
// tensor once over TP with the kv heads split (n_kv_head >= tp) or replicated (< tp: every
// rank holds all, tp_grad_sum), no wpe, an lm_head unless tied.
TEST(Spec, LlamaTableSplitsOrReplicatesTheKvHeads) {
  ModelConfig cfg{51, 16, 2, 4, 32};
  cfg.arch = "llama";
  cfg.n_kv_head = 2;
  cfg.ffn_hidden = 24;
  auto serial = gpt_param_specs(cfg, StageLayout{0, 2, true, true}, 0, 1);
  ASSERT_EQ(serial.size(), 1 + 2 * 9 + 2u);
  EXPECT_EQ(serial[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(serial[1].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(serial[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(serial[3].shape, (std::vector<std::int64_t>{16, 32}));  // k_proj [kv*hd, C]
  EXPECT_EQ(serial[9].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(serial[9].shape, (std::vector<std::int64_t>{32, 24}));
  EXPECT_EQ(serial.back().name, "lm_head.weight");
  EXPECT_TRUE(serial[1].norm && !serial[2].norm && serial.back().place == Place::head &&
              !serial[0].tied_across_stages());
  for (int tp : {1, 2, 4}) {
    std::vector<std::vector<ShardSpec>> per_rank;
    for (int r = 0; r < tp; ++r)
      per_rank.push_back(gpt_param_specs(cfg, StageLayout{0, 2, true, true}, r, tp));
    for (std::size_t p = 0; p < per_rank[0].size(); ++p) {
      const ShardSpec& s0 = per_rank[0][p];
      const bool kv = s0.name.find("k_proj") != std::string::npos ||
                      s0.name.find("v_proj") != std::string::npos;
      if (kv) EXPECT_EQ(s0.tp_replicated(), tp > 2) << s0.name << " tp=" << tp;
      EXPECT_EQ(s0.tp_grad_sum, kv && tp > 2) << s0.name << " tp=" << tp;
      std::multiset<std::int64_t> seen;
      for (int r = 0; r < tp; ++r) {
        const auto& s = per_rank[r][p];
        if (s.tp_replicated() && r > 0) continue;
        for_each_local_element(s, [&](std::int64_t, std::int64_t global) { seen.insert(global); });
      }
      EXPECT_EQ(std::int64_t(std::set<std::int64_t>(seen.begin(), seen.end()).size()), s0.numel())
          << s0.name << " tp=" << tp;
      EXPECT_EQ(std::int64_t(seen.size()), s0.numel()) << s0.name << " tp=" << tp;
    }
    for (const auto& specs : per_rank)  // [q; k; v] and [gate; up] are one matrix each
      for (std::size_t p = 0; p + 2 < specs.size(); ++p)
        if (specs[p].name.find("q_proj") != std::string::npos) {
          EXPECT_EQ(specs[p + 1].offset, specs[p].offset + specs[p].local_numel());
          EXPECT_EQ(specs[p + 2].offset, specs[p + 1].offset + specs[p + 1].local_numel());
        }
  }
  cfg.tie_embeddings = true;  // the embedding is the head: on the last stage too, tied
  auto last = gpt_param_specs(cfg, StageLayout{1, 2, false, true}, 0, 1);
  EXPECT_EQ(last.front().name, "model.embed_tokens.weight");
  EXPECT_TRUE(last.front().tied_across_stages());
  EXPECT_EQ(last.back().name, "model.norm.weight");
}

// The role tables: every role of a table once in the embedding/head and once per layer,
// each spec named by its row; the normalizations (and only they) marked for the SP sum.
TEST(Spec, RolesFromTheTableReachEveryTensorOnce) {
  ModelConfig gpt{50, 16, 3, 2, 8}, llama = gpt;
  llama.arch = "llama";
  for (const ModelConfig& cfg : {gpt, llama}) {
    auto specs = gpt_param_specs(cfg, StageLayout{0, 3, true, true}, 0, 1);
    std::map<std::pair<int, int>, int> seen;  // (layer, role) -> count
    for (const auto& s : specs) {
      ++seen[{s.layer, int(s.role)}];
      const bool named_norm = s.name.find("ln_") != std::string::npos ||
                              s.name.find("norm") != std::string::npos;
      EXPECT_EQ(s.norm, named_norm) << s.name;
      EXPECT_EQ(s.tied_across_stages(), s.name == "wte") << s.name;
    }
    const RoleTable& table = model_roles(cfg);
    std::size_t want = 0;
    for (const RoleRow& row : table.rows) {
      if (row.place == Place::block) {
        want += std::size_t(cfg.n_layer);
        for (int l = 0; l < cfg.n_layer; ++l) EXPECT_EQ((seen[{l, int(row.role)}]), 1) << row.name;
      } else {
        ++want;
        EXPECT_EQ((seen[{-1, int(row.role)}]), 1) << row.name;
      }
    }
    EXPECT_EQ(seen.size(), want);
    EXPECT_EQ(specs.size(), want);
  }
}

// 2D TP (docs/tp2d.md) at tp = 4 (2 x 2) and q = 1: the copy-0 ranks tile every logical
// tensor exactly once, a tensor's other copies hold the same elements at the same places,
// and a few blocks land where the layout says (checked against its arithmetic, not the
// code's).
TEST(Spec, Tp2dBlocksTileEveryTensorOnceAndCopiesAgree) {
  ModelConfig cfg{51, 16, 1, 4, 16};  // vocabulary odd: one padding row at q = 2
  for (int tp : {1, 4}) {
    std::vector<std::vector<ShardSpec>> per_rank;
    for (int r = 0; r < tp; ++r)
      per_rank.push_back(gpt_param_specs(cfg, StageLayout{0, 1, true, true}, r, tp, 0, true));
    for (std::size_t p = 0; p < per_rank[0].size(); ++p) {
      std::multiset<std::int64_t> seen;
      std::map<int, std::vector<std::pair<std::int64_t, std::int64_t>>> copy0;  // by grid column
      for (int r = 0; r < tp; ++r) {
        const auto& s = per_rank[std::size_t(r)][p];
        std::vector<std::pair<std::int64_t, std::int64_t>> mine;
        for_each_local_element(s, [&](std::int64_t local, std::int64_t global) {
          EXPECT_LT(local, s.local_numel());
          mine.push_back({local, global});
        });
        if (s.tp_copy == 0) {
          for (const auto& e : mine) seen.insert(e.second);
          copy0[r % (tp == 4 ? 2 : 1)] = mine;
        }
      }
      for (int r = 0; r < tp; ++r) {  // the copies (grid rows > 0) hold what row 0 holds
        const auto& s = per_rank[std::size_t(r)][p];
        if (s.tp_copy == 0) continue;
        EXPECT_EQ(s.tp_copy, r / 2) << s.name;
        std::vector<std::pair<std::int64_t, std::int64_t>> mine;
        for_each_local_element(s, [&](std::int64_t l, std::int64_t g) { mine.push_back({l, g}); });
        EXPECT_EQ(mine, copy0[r % 2]) << s.name << " rank " << r;
      }
      const auto& s0 = per_rank[0][p];
      ASSERT_EQ(std::int64_t(seen.size()), s0.numel()) << s0.name << " tp=" << tp;
      EXPECT_EQ(std::int64_t(std::set<std::int64_t>(seen.begin(), seen.end()).size()), s0.numel())
          << s0.name;
    }
  }
  // Rank 3 = (1, 1) of the 2 x 2 grid.
  const auto specs = gpt_param_specs(cfg, StageLayout{0, 1, true, true}, 3, 4, 0, true);
  auto find = [&](const std::string& name) -> const ShardSpec& {
    for (const auto& s : specs)
      if (s.name == name) return s;
    throw std::runtime_error("no " + name);
  };
  auto pairs = [](const ShardSpec& s) {
    std::map<std::int64_t, std::int64_t> m;
    for_each_local_element(s, [&](std::int64_t l, std::int64_t g) { m[l] = g; });
    return m;
  };
  {  // c_attn [16, 48]: rows 8..15, columns q, k, v of heads 2..3 (8 of each third)
    const auto& s = find("h.0.attn.c_attn.weight");
    EXPECT_EQ(s.split, Split::block2d);
    EXPECT_EQ(s.local_shape, (std::vector<std::int64_t>{8, 24}));
    EXPECT_EQ(s.tp_copy, 0);
    const auto m = pairs(s);
    ASSERT_EQ(m.size(), 8u * 24u);
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 24; ++j)
        EXPECT_EQ(m.at(i * 24 + j), (8 + i) * 48 + (j / 8) * 16 + 8 + j % 8) << i << "," << j;
  }
  {  // mlp.c_proj [64, 16]: rows 32..63, columns 8..15
    const auto m = pairs(find("h.0.mlp.c_proj.weight"));
    ASSERT_EQ(m.size(), 32u * 8u);
    for (int i = 0; i < 32; ++i)
      for (int j = 0; j < 8; ++j) EXPECT_EQ(m.at(i * 8 + j), (32 + i) * 16 + 8 + j);
  }
  {  // wte [51, 16] as [52, 8]: every row, columns 8..15, the padding row never visited
    const auto& s = find("wte");
    EXPECT_EQ(s.local_shape, (std::vector<std::int64_t>{52, 8}));
    EXPECT_EQ(s.tp_copy, 1);
    const auto m = pairs(s);
    ASSERT_EQ(m.size(), 51u * 8u);
    for (int i = 0; i < 51; ++i)
      for (int j = 0; j < 8; ++j) EXPECT_EQ(m.at(i * 8 + j), i * 16 + 8 + j);
  }
  {  // biases and LayerNorms by grid column: c_attn's by q, k, v; ln_1's contiguous
    const auto b = pairs(find("h.0.attn.c_attn.bias"));
    ASSERT_EQ(b.size(), 24u);
    for (int j = 0; j < 24; ++j) EXPECT_EQ(b.at(j), (j / 8) * 16 + 8 + j % 8);
    const auto& ln = find("h.0.ln_1.weight");
    EXPECT_EQ(ln.local_shape, (std::vector<std::int64_t>{8}));
    EXPECT_EQ(ln.tp_copy, 1);
    EXPECT_EQ(pairs(ln).begin()->second, 8);
    EXPECT_EQ(find("h.0.attn.c_proj.bias").local_shape, (std::vector<std::int64_t>{8}));
  }
  // What 2D refuses: a tp that is not a square, Llama, heads that do not split.
  EXPECT_THROW(gpt_param_specs(cfg, StageLayout{0, 1, true, true}, 0, 2, 0, true), trident::Error);
  ModelConfig llama = cfg;
  llama.arch = "llama";
  EXPECT_THROW(gpt_param_specs(llama, StageLayout{0, 1, true, true}, 0, 4, 0, true),
               trident::Error);
  ModelConfig odd_heads{51, 16, 1, 3, 18};
  EXPECT_THROW(gpt_param_specs(odd_heads, StageLayout{0, 1, true, true}, 0, 4, 0, true),
               trident::Error);
}
