// The executor's activation memory on one rank (pp 1, communicators of size 1: no MPI)
// against predict_memory, byte for byte on guarded device memory ("cpu-guarded": an arena
// that counts what is allocated): the pool's slots (the chunk's input and every layer's
// output but the last, which waits in the model's boundary scratch) and the rows the head's
// output gradients wait in where its B does not follow its F (gpipe). The rows must carry
// each microbatch's own gradient, and a head gradient left in the shared scratch must not be
// overwritten silently.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/model/gpt.hpp"
#include "trident/model/memory.hpp"
#include "trident/model/stage_model.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/pipeline/executor.hpp"
#include "trident/pipeline/stage_memory.hpp"

namespace trident::pipeline {
namespace {

constexpr int kMicrobatches = 4, kB = 2, kT = 16;

model::ModelConfig tiny(const std::string& arch) {
  model::ModelConfig c;
  c.vocab_size = 64, c.seq_len = kT, c.n_layer = 2, c.n_head = 4, c.d_model = 32;
  c.arch = arch;
  if (arch == "llama") c.ffn_hidden = 64;
  return c;
}

struct Tokens {
  std::vector<std::int32_t> inputs, targets;
  Tokens() : inputs(kMicrobatches * kB * kT), targets(inputs.size()) {
    for (std::size_t i = 0; i < inputs.size(); ++i)
      inputs[i] = std::int32_t((i * 7 + 3) % 61), targets[i] = std::int32_t((i * 5 + 1) % 59);
  }
  MicrobatchTokens operator()(int mb) const {
    return {inputs.data() + mb * kB * kT, targets.data() + mb * kB * kT};
  }
};

// Builds the model on guarded memory, then the executor for `schedule` (pp 1, m 4): the arena
// bytes the executor allocated, and the gradients of one run.
struct Outcome {
  std::int64_t pool_bytes = 0;
  int head_rows = 0;
  std::vector<float> grads;
};
Outcome run(const model::ModelConfig& cfg, model::Recompute rc, const std::string& schedule) {
  parallel::ParallelState ps;  // every communicator of size 1
  auto ops = ops::make_ops("cpu-guarded", 1);
  model::StageModelOptions o;
  o.micro_batch = kB, o.recompute = rc;
  auto m = model::make_stage_model(cfg, {model::StageLayout{0, cfg.n_layer, true, true}}, ps, *ops, o);
  m->init_weights(3);
  m->zero_grads();
  const std::int64_t before = std::int64_t(ops->memory()->used());
  Executor ex(*m, ps, make_schedule(schedule, 1, 1, kMicrobatches));
  Outcome out;
  out.pool_bytes = std::int64_t(ops->memory()->used()) - before;
  out.head_rows = peak_head_gradients(ex.schedule().stages[0], 0);
  const Tokens tokens;
  ex.run([&](int mb) { return tokens(mb); }, 1.0f / (kMicrobatches * kB * kT));
  out.grads.resize(std::size_t(m->num_params()));
  m->read_grads(out.grads.data());
  return out;
}

TEST(ExecutorMemory, PoolAndHeadRowsAreWhatPredictMemoryCounts) {
  for (const char* arch : {"gpt2", "llama"})
    for (model::Recompute rc : {model::Recompute::none, model::Recompute::selective,
                                model::Recompute::full})
      for (const char* schedule : {"gpipe", "1f1b", "zb-h1"}) {
        const std::string what = std::string(arch) + " " + schedule + " recompute " +
                                 std::to_string(int(rc));
        const model::ModelConfig cfg = tiny(arch);
        const Outcome got = run(cfg, rc, schedule);
        model::MemoryLayout lay;
        lay.micro_batch = kB, lay.recompute = rc, lay.host_memory = false;
        set_schedule_memory(lay, make_schedule(schedule, 1, 1, kMicrobatches), 0);
        // gpipe runs every F before the first B: each head gradient waits in a row.
        EXPECT_EQ(lay.head_gradients, std::string(schedule) == "gpipe" ? kMicrobatches : 0)
            << what;
        EXPECT_EQ(got.head_rows, lay.head_gradients) << what;
        std::int64_t expected = model::predict_memory(cfg, lay).activations;
        // Full recompute's one layer is made with the first activations (predict_memory
        // counts it as scratch).
        const model::ChunkDims d = model::chunk_dims(cfg, 1, kB, false);
        if (rc == model::Recompute::full)
          expected += model::layer_floats(d, false) * std::int64_t(sizeof(float));
        EXPECT_EQ(got.pool_bytes, expected) << what;
      }
}

// gpipe keeps every head gradient in a row of its own until its B; 1F1B leaves each in the
// shared scratch (its B follows at once). The same gradients but for the order of the sums
// (the tied embedding's head and embedding terms interleave differently): a wrong row (one
// microbatch's gradient read for another's) is far outside that.
TEST(ExecutorMemory, HeadRowsCarryEachMicrobatchsGradient) {
  for (const char* arch : {"gpt2", "llama"}) {
    const model::ModelConfig cfg = tiny(arch);
    const Outcome gpipe = run(cfg, model::Recompute::none, "gpipe");
    const Outcome one = run(cfg, model::Recompute::none, "1f1b");
    ASSERT_EQ(gpipe.grads.size(), one.grads.size());
    float most = 0, diff = 0;
    for (std::size_t i = 0; i < one.grads.size(); ++i) {
      most = std::max(most, std::fabs(one.grads[i]));
      diff = std::max(diff, std::fabs(one.grads[i] - gpipe.grads[i]));
    }
    EXPECT_GT(most, 0.0f) << arch;
    EXPECT_LE(diff, 1e-5f * most) << arch;
  }
}

// The head's forward leaves its gradient in the shared scratch when no row was given: a
// second forward before its backward is refused, not run over it.
TEST(ExecutorMemory, ASecondForwardOverAWaitingHeadGradientIsRefused) {
  parallel::ParallelState ps;
  auto ops = ops::make_ops("cpu", 1);
  const model::ModelConfig cfg = tiny("gpt2");
  model::StageModelOptions o;
  o.micro_batch = kB;
  auto m = model::make_stage_model(cfg, {model::StageLayout{0, 2, true, true}}, ps, *ops, o);
  m->init_weights(3);
  const Tokens tokens;
  auto a = m->make_activations(0), b = m->make_activations(0);
  std::vector<float> row(std::size_t(m->boundary_numel()));
  m->forward(0, *a, tokens(0).inputs, tokens(0).targets, 0.01f);
  try {
    m->forward(0, *b, tokens(1).inputs, tokens(1).targets, 0.01f);
    ADD_FAILURE() << "a forward over a waiting head gradient ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("waits in the shared boundary scratch"),
              std::string::npos) << e.what();
  }
  m->backward(0, *a, tokens(0).inputs);  // its own backward may run
  // With a row for the first, F F B B runs: the second gradient waits for the B that follows.
  a->keep_head_gradient(row.data());
  m->forward(0, *a, tokens(0).inputs, tokens(0).targets, 0.01f);
  b->keep_head_gradient(nullptr);
  m->forward(0, *b, tokens(1).inputs, tokens(1).targets, 0.01f);
  m->backward(0, *b, tokens(1).inputs);
  m->backward(0, *a, tokens(0).inputs);
}

}  // namespace
}  // namespace trident::pipeline
