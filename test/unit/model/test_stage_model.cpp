// make_stage_model (model/stage_model.hpp): the implementation the deck asks for behind the
// runtime's interface, and the names it is asked with parsed once: a tp_mode or an
// architecture nobody wrote a model for is an error naming the key, never a GPT-2 built
// anyway. (The 2D implementation needs a q x q grid: parallel.summa's Gpt2dChunk test.)
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "trident/core/error.hpp"
#include "trident/model/gpt.hpp"
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

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(StageModel, NamesAreParsedOnceAndUnknownOnesRefused) {
  EXPECT_EQ(tiny("gpt2").arch, Arch::gpt2);
  EXPECT_EQ(tiny("llama").arch, Arch::llama);
  EXPECT_EQ(tiny("llama").arch.word(), std::string("llama"));
  EXPECT_EQ(error_of([] { tiny("mamba"); }),
            "model.arch: expected \"gpt2\" or \"llama\", got \"mamba\"");
}

TEST(StageModel, OneDimensionalDecksGetTheChunkAndAThirdArchitectureIsRefused) {
  modeltest::need_mpi();
  parallel::ParallelState ps = parallel::make_parallel_state(parallel::GridShape{});
  auto ops = ops::make_ops("cpu", 1);
  const std::vector<StageLayout> whole{StageLayout{0, 2, true, true}};
  StageModelOptions o;
  o.micro_batch = 2;
  for (const char* arch : {"gpt2", "llama"}) {
    const std::unique_ptr<StageModel> m = make_stage_model(tiny(arch), whole, ps, *ops, o);
    ASSERT_NE(dynamic_cast<GptChunk*>(m.get()), nullptr) << arch;
    EXPECT_EQ(m->num_chunks(), 1);
    EXPECT_EQ(m->boundary_numel(), 2 * 8 * 16);
    std::int64_t held = 0;
    for (const ShardSpec& s : m->specs()) held += s.local_numel();
    EXPECT_EQ(m->num_params(), held) << arch;
    // GPT-2's wte is the head; this Llama's (tie_embeddings false) is not.
    EXPECT_EQ(m->tied_embedding() != nullptr, std::string(arch) == "gpt2") << arch;
  }
  EXPECT_NE(error_of([&] { make_stage_model(tiny("mamba"), whole, ps, *ops, o); })
                .find("model.arch"),
            std::string::npos);
}

}  // namespace
}  // namespace trident::model
