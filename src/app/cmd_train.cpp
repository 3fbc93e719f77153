// `trident train`, `trident grad`, `trident step` and `trident init`.
#include <mpi.h>

#include "commands.hpp"
#include "trident/core/log.hpp"
#include "trident/io/grad.hpp"
#include "trident/io/format.hpp"
#include "trident/io/h5.hpp"
#include "trident/io/tensor_io.hpp"
#include "trident/io/weights.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/train/run.hpp"

namespace trident::app {

int run_train(const DeckArgs& args) {
  Session s = open_session(args, "", true);
  train::Trainer trainer(s.cfg, s.ps, *s.ops);
  train::run_training(trainer);
  return 0;
}

namespace {

// The batch file's tokens and the trainer with the file's weights: what grad and step share.
struct FixedBatch {
  io::Batch batch;
  const std::int32_t* inputs = nullptr;   // this DP rank's slice
  const std::int32_t* targets = nullptr;
};

FixedBatch load_fixed(train::Trainer& tr, const std::string& weights, const std::string& batch) {
  FixedBatch fb;
  const train::Config& cfg = tr.config();
  parallel::agree([&] {
    fb.batch = io::read_batch(batch, cfg.model.vocab_size);
    TRIDENT_CHECK(fb.batch.seq_len == cfg.model.seq_len, batch, ": sequences of ",
                  fb.batch.seq_len, " tokens, the deck has model.seq_len = ", cfg.model.seq_len);
    TRIDENT_CHECK(fb.batch.batch % (cfg.parallel.micro_batch_size * tr.state().shape.dp) == 0,
                  batch, ": a batch of ", fb.batch.batch,
                  " sequences does not split into microbatches of parallel.micro_batch_size = ",
                  cfg.parallel.micro_batch_size, " over dp = ", tr.state().shape.dp);
  });
  parallel::agree([&] {
    model::StageModel& m = tr.model();
    HostMirror params(m.memory(), m.params(), m.num_params(), false);
    io::read_weights(weights, tr.state().world.raw(), cfg.model, m.specs(), params.data(),
                     train::shard_role(tr.state()));
    params.commit();
  });
  const std::int64_t first = tr.local_first(fb.batch.batch) * cfg.model.seq_len;
  fb.inputs = fb.batch.inputs.data() + first;
  fb.targets = fb.batch.targets.data() + first;
  return fb;
}

}  // namespace

int run_grad(const DeckArgs& args, const std::string& weights, const std::string& batch,
             const std::string& out) {
  Session s = open_session(args, "", true);
  train::Trainer tr(s.cfg, s.ps, *s.ops);
  TRIDENT_CHECK(tr.weight_update() != pipeline::WeightUpdate::per_microbatch,
                "trident grad: parallel.schedule = \"", s.cfg.parallel.schedule, "\" updates the "
                "weights after every microbatch, so a step has no one gradient; use a "
                "synchronous schedule");
  FixedBatch fb = load_fixed(tr, weights, batch);
  const double loss = tr.forward_backward(fb.inputs, fb.targets, fb.batch.batch);
  tr.gather_gradients();
  tr.write_trace();  // io.trace_step = 1: the pipeline trace of this one step
  model::StageModel& m = tr.model();
  HostMirror grads(m.memory(), m.grads(), m.num_params(), true);
  io::write_grad_dump(out, s.ps.world.raw(), s.cfg.model, m.specs(), grads.data(), loss,
                      train::shard_role(s.ps));
  log::info("loss ", loss, " -> ", out);
  return 0;
}

int run_step(const DeckArgs& args, const std::string& weights, const std::string& batch,
             int steps, const std::string& out) {
  Session s = open_session(args, "", true);
  train::Trainer tr(s.cfg, s.ps, *s.ops);
  FixedBatch fb = load_fixed(tr, weights, batch);
  std::vector<double> losses, norms;
  for (int k = 1; k <= steps; ++k) {
    tr.set_step(k);  // PipeDream updates inside the step, at step k's lr
    const double loss = tr.forward_backward(fb.inputs, fb.targets, fb.batch.batch);
    const train::StepStats st = tr.optimizer_step(k, loss);
    losses.push_back(st.loss);
    norms.push_back(st.grad_norm);
    log::info("step ", k, " | loss ", st.loss, " | grad norm ", st.grad_norm, " | lr ", st.lr);
  }
  // Every rank holds the same losses, as the collective attribute write needs.
  model::StageModel& m = tr.model();
  HostMirror params(m.memory(), m.params(), m.num_params(), true);
  io::write_tensor_file(out, s.ps.world.raw(), io::kWeightsFormat, "model", s.cfg.model,
                        m.specs(), params.data(), train::shard_role(s.ps),
                        [&](const io::h5::File& f) {
                          io::h5::write_attr_doubles(f, "losses", losses);
                          io::h5::write_attr_doubles(f, "grad_norms", norms);
                        });
  return 0;
}

int run_init(const DeckArgs& args, const std::string& out) {
  Session s = open_session(args, "", true);
  train::Trainer tr(s.cfg, s.ps, *s.ops);
  model::StageModel& m = tr.model();
  m.init_weights(std::uint64_t(s.cfg.train.seed));
  HostMirror params(m.memory(), m.params(), m.num_params(), true);
  io::write_weights(out, s.ps.world.raw(), s.cfg.model, m.specs(), params.data(),
                    train::shard_role(s.ps));
  log::info("initialized weights (seed ", s.cfg.train.seed, ") -> ", out);
  return 0;
}

}  // namespace trident::app
