// block_kind (model/block.hpp): each architecture gets its own block, made once from the
// chunk's context, and sizes the chunk's q|k|v and MLP columns its way; an architecture
// with no block is an error naming model.arch, never a GPT-2 block built anyway. (What the
// blocks compute is checked against PyTorch by oracle.grad and against the serial run by
// the mpi.* layout tests; decode against the whole context by model.Generation.)
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "trident/core/error.hpp"
#include "trident/model/gpt.hpp"
#include "trident/model/gpt2_block.hpp"
#include "trident/model/llama_block.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/parallel/tp_mappings.hpp"
#include "tiny_model.hpp"

namespace modeltest {
void need_mpi();
}

namespace trident::model {
namespace {

// Llama with grouped-query heads: 4 query heads share 2 key/value heads.
ModelConfig tiny(const std::string& arch) { return tiny_model(arch, 4, 32, 2); }

TEST(Block, EachArchitectureGetsItsOwnBlockAndSizes) {
  // GPT-2: q, k, v of C each, split by heads; one c_fc of 4C.
  const ChunkDims g = chunk_dims(tiny("gpt2"), 2, 3, false);
  EXPECT_EQ(g.C3, 3 * 16);
  EXPECT_EQ(g.F1, g.F);
  EXPECT_EQ(g.F, 4 * 32 / 2);
  EXPECT_EQ(g.kv_cols, 16);
  // Llama, 4 query heads of 8 and 2 kv heads: at tp 2 one kv head each; at tp 4 both kv
  // heads replicated on every rank. [gate | up] of 24 columns each, split.
  const ChunkDims l2 = chunk_dims(tiny("llama"), 2, 3, false);
  EXPECT_EQ(l2.kv_cols, 8);
  EXPECT_EQ(l2.C3, 16 + 2 * 8);
  EXPECT_EQ(l2.F, 12);
  EXPECT_EQ(l2.F1, 24);
  const ChunkDims l4 = chunk_dims(tiny("llama"), 4, 3, false);
  EXPECT_EQ(l4.kv_cols, 16);
  EXPECT_EQ(l4.C3, 8 + 2 * 16);

  modeltest::need_mpi();
  parallel::ParallelState ps = parallel::make_parallel_state(parallel::GridShape{});
  auto ops = ops::make_ops("cpu", 1);
  parallel::TpMappings tpm(ps.tp, false);
  for (const char* arch : {"gpt2", "llama"}) {
    const ModelConfig cfg = tiny(arch);
    const ChunkDims d = chunk_dims(cfg, 1, 2, false);
    const BlockContext ctx{cfg, *ops, tpm, 0, 1, d, nullptr, nullptr, nullptr,
                           nullptr, nullptr, nullptr, nullptr};
    const std::unique_ptr<Block> block = block_kind(cfg.arch.get()).make(ctx);
    EXPECT_EQ(dynamic_cast<Gpt2Block*>(block.get()) != nullptr, std::string(arch) == "gpt2");
    EXPECT_EQ(dynamic_cast<LlamaBlock*>(block.get()) != nullptr, std::string(arch) == "llama");
    EXPECT_EQ(block->kv_width(), d.kv_cols) << arch;
  }
}

// The key/value heads a rank's attention reads: its share where TP splits them, one copy
// where n_kv_head < tp replicates them; GPT-2's are its query heads.
TEST(Block, TheRanksKeyValueHeads) {
  ModelConfig gpt2 = tiny("gpt2"), llama = tiny("llama");  // 4 heads; Llama: 2 kv heads
  EXPECT_EQ(rank_kv_heads(gpt2, 1), 4);
  EXPECT_EQ(rank_kv_heads(gpt2, 4), 1);
  EXPECT_EQ(rank_kv_heads(llama, 1), 2);
  EXPECT_EQ(rank_kv_heads(llama, 2), 1);
  EXPECT_EQ(rank_kv_heads(llama, 4), 1);  // replicated: each rank reads one of the two
  llama.n_kv_head = 4;
  EXPECT_EQ(rank_kv_heads(llama, 2), 2);
  gpt2.n_kv_head = 2;  // not a GPT-2 key: its kv heads stay its heads
  EXPECT_EQ(rank_kv_heads(gpt2, 2), 2);
}

TEST(Block, AnArchitectureWithoutABlockIsRefused) {
  std::string what;
  try {
    block_kind(static_cast<Arch>(99));
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("model.arch"), std::string::npos) << what;
}

}  // namespace
}  // namespace trident::model
