// emulate/executor_memory.cpp — the executor's activation memory on the CUDA backend under
// bf16 (the fused block's bf16 stash; with zb-h1 its W stash in the layers' dead bf16 qkv and
// fch, or under full recompute a bf16 one of its own) against predict_memory, byte for byte,
// on the stand-in's device arena: pipeline/test_executor_memory.cpp's check (which runs on
// "cpu-guarded", fp32) where the fused block runs. Then each run's gradients: zb-h1's split
// backward (B with the W stash, then W) against 1F1B's whole backward, within 1e-6 of the
// largest (the split runs the whole backward's products: on the stand-in bit for bit).
// pp 1, m 4, GPT-2 and Llama, recompute none, full and selective (selective: the layers' bf16
// stash without atty, lse, fch_gelu; the shared copy is the model's, made before the
// executor). train.sh builds and runs it.
// usage: executor_memory  (exit 0: all as predicted)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "trident/model/gpt.hpp"
#include "trident/model/memory.hpp"
#include "trident/model/stage_model.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/pipeline/executor.hpp"
#include "trident/pipeline/stage_memory.hpp"

using namespace trident;

namespace {

constexpr int kMicrobatches = 4, kB = 2, kT = 16;

model::ModelConfig tiny(const std::string& arch) {
  model::ModelConfig c;
  c.vocab_size = 64, c.seq_len = kT, c.n_layer = 2, c.n_head = 2, c.d_model = 32;  // heads of 16
  c.arch = arch;
  if (arch == "llama") c.ffn_hidden = 64, c.n_kv_head = 1;
  return c;
}

struct Outcome {
  std::int64_t pool_bytes = 0, predicted = 0;
  bool fused = false;
  std::vector<float> grads;
};

Outcome run(const model::ModelConfig& cfg, model::Recompute rc, const std::string& schedule) {
  parallel::ParallelState ps;  // every communicator of size 1
  auto ops = ops::make_ops("cuda", 1, ops::Precision::bf16);
  model::StageModelOptions o;
  o.micro_batch = kB, o.recompute = rc;
  auto m = model::make_stage_model(cfg, {model::StageLayout{0, cfg.n_layer, true, true}}, ps,
                                   *ops, o);
  m->init_weights(3);
  m->zero_grads();
  const std::int64_t before = std::int64_t(ops->memory()->used());
  pipeline::Executor ex(*m, ps, pipeline::make_schedule(schedule, 1, 1, kMicrobatches));
  Outcome out;
  out.pool_bytes = std::int64_t(ops->memory()->used()) - before;
  model::MemoryLayout lay;
  lay.micro_batch = kB, lay.recompute = rc, lay.host_memory = false;
  lay.set_precision(ops->precision());
  lay.block_stash_bf16 = ops->gpt2_block_stash_bf16();
  out.fused = model::stores_fused_block(true, lay.block_stash_bf16, cfg.arch.get());
  pipeline::set_schedule_memory(lay, ex.schedule(), 0);
  out.predicted = model::predict_memory(cfg, lay).activations;
  // Full recompute's one layer is made with the first activations (predict_memory counts it
  // as scratch): the fused block's bf16 stash of one layer.
  if (rc == model::Recompute::full)
    out.predicted += model::fused_layer_floats(model::chunk_dims(cfg, 1, kB, false)) *
                     std::int64_t(sizeof(float));
  std::vector<std::int32_t> inputs(kMicrobatches * kB * kT), targets(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    inputs[i] = std::int32_t((i * 7 + 3) % 61), targets[i] = std::int32_t((i * 5 + 1) % 59);
  ex.run([&](int mb) {
    return pipeline::MicrobatchTokens{inputs.data() + mb * kB * kT, targets.data() + mb * kB * kT};
  }, 1.0f / (kMicrobatches * kB * kT));
  out.grads.resize(std::size_t(m->num_params()));
  m->read_grads(out.grads.data());
  return out;
}

}  // namespace

int main() {
  bool ok = true;
  auto name = [](model::Recompute rc) {
    return rc == model::Recompute::none ? "none" : rc == model::Recompute::full ? "full"
                                                                                : "selective";
  };
  for (const char* arch : {"gpt2", "llama"})
    for (model::Recompute rc : {model::Recompute::none, model::Recompute::full,
                                model::Recompute::selective}) {
      const model::ModelConfig cfg = tiny(arch);
      const Outcome whole = run(cfg, rc, "1f1b"), split = run(cfg, rc, "zb-h1");
      for (const Outcome* o : {&whole, &split}) {
        const char* sched = o == &whole ? "1f1b" : "zb-h1";
        const bool same = o->pool_bytes == o->predicted;
        std::printf("executor memory: %s %s recompute %s: pool %lld B, predicted %lld B: %s\n",
                    arch, sched, name(rc),
                    static_cast<long long>(o->pool_bytes), static_cast<long long>(o->predicted),
                    same ? "equal" : "DIFFERENT");
        ok = ok && same && o->fused;
      }
      float most = 0, diff = 0;
      for (std::size_t i = 0; i < whole.grads.size(); ++i) {
        most = std::max(most, std::fabs(whole.grads[i]));
        diff = std::max(diff, std::fabs(whole.grads[i] - split.grads[i]));
      }
      const bool close = most > 0 && diff <= 1e-6f * most;
      std::printf("executor memory: %s recompute %s: zb-h1's gradients against 1f1b's: "
                  "max |d| %.2e of max %.2e (%s)\n", arch, name(rc), double(diff), double(most),
                  diff == 0 ? "bit for bit" : close ? "close" : "MISMATCH");
      ok = ok && close;
    }
  if (!ok) std::printf("executor memory: FAILED (or the fused block did not run)\n");
  else std::printf("executor memory: all as predicted\n");
  return ok ? 0 : 1;
}
