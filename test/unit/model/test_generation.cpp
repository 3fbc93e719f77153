// Generation with a key-value cache (GptChunk::generation_step, one token per step) against
// the whole context run through the blocks (logits_last), for GPT-2 and Llama (grouped-query,
// untied; multi-query, tied), on the CPU and on guarded device memory (every kernel the
// cache path calls takes device pointers, nothing is read on the host behind its back).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "trident/model/gpt.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"

namespace modeltest {
void need_mpi();
}

namespace trident::model {
namespace {

ModelConfig config(const std::string& arch, int n_kv_head, bool tied) {
  ModelConfig c;
  c.vocab_size = 53;
  c.seq_len = 11;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 32;
  c.arch = arch;
  if (arch == "llama") {
    c.n_kv_head = n_kv_head;
    c.ffn_hidden = 40;
    c.tie_embeddings = tied;
  }
  return c;
}

void check(const ModelConfig& cfg, const std::string& device) {
  modeltest::need_mpi();
  parallel::ParallelState ps = parallel::make_parallel_state(parallel::GridShape{});
  auto ops = ops::make_ops(device, 1);
  GptChunk chunk(cfg, StageLayout{0, cfg.n_layer, true, true}, ps, *ops, 1);
  chunk.init_weights(7);
  std::vector<std::int32_t> tokens(std::size_t(cfg.seq_len));
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = std::int32_t((i * 17 + 5) % 53);
  std::vector<float> cached(std::size_t(cfg.vocab_size)), full(cached.size());
  for (int round = 0; round < 2; ++round) {  // a reset cache starts over
    chunk.generation_reset();
    for (int t = 1; t <= cfg.seq_len; ++t) {
      chunk.generation_step(tokens[std::size_t(t - 1)], cached.data());
      ASSERT_EQ(chunk.generation_position(), t);
      chunk.logits_last(tokens.data(), t, full.data());
      float err = 0, ref = 0;
      for (std::size_t v = 0; v < full.size(); ++v) {
        err = std::max(err, std::abs(cached[v] - full[v]));
        ref = std::max(ref, std::abs(full[v]));
      }
      EXPECT_LE(err, 1e-5f * ref) << cfg.arch << " on " << device << ", position " << t - 1;
    }
  }
  EXPECT_ANY_THROW(chunk.generation_step(1, cached.data())) << "a full cache refuses a step";
}

TEST(Generation, CacheMatchesTheWholeContext) {
  for (const char* device : {"cpu", "cpu-guarded"}) {
    check(config("gpt2", 0, false), device);
    check(config("llama", 2, false), device);
    check(config("llama", 1, true), device);
  }
}

}  // namespace
}  // namespace trident::model
