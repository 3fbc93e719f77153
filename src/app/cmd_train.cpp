// `trident train`, `trident grad`, `trident step` and `trident init`.
#include <mpi.h>

#include "commands.hpp"
#include "trident/core/log.hpp"
#include "trident/io/grad.hpp"
#include "trident/io/format.hpp"
#include "trident/io/h5.hpp"
#include "trident/io/tensor_io.hpp"
#include "trident/io/weights.hpp"
#include "trident/model/gpt2d.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/train/run.hpp"

namespace trident::app {

int run_train(const DeckArgs& args) {
  Session s = open_session(args, "");
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
  parallel::agree(MPI_COMM_WORLD, [&] {
    fb.batch = io::read_batch(batch, cfg.model.vocab_size);
    TRIDENT_CHECK(fb.batch.seq_len == cfg.model.seq_len, batch, ": sequences of ",
                  fb.batch.seq_len, " tokens, the deck has model.seq_len = ", cfg.model.seq_len);
    TRIDENT_CHECK(fb.batch.batch % (cfg.parallel.micro_batch_size * tr.state().shape.dp) == 0,
                  batch, ": a batch of ", fb.batch.batch,
                  " sequences does not split into microbatches of parallel.micro_batch_size = ",
                  cfg.parallel.micro_batch_size, " over dp = ", tr.state().shape.dp);
  });
  parallel::agree(MPI_COMM_WORLD, [&] {
    model::GptChunk& m = tr.model();
    HostMirror params(m.memory(), m.params(), m.num_params(), false);
    io::read_weights(weights, MPI_COMM_WORLD, cfg.model, m.specs(), params.data(),
                     train::shard_role(tr.state()));
    params.commit();
  });
  const std::int64_t first = tr.local_first(fb.batch.batch) * cfg.model.seq_len;
  fb.inputs = fb.batch.inputs.data() + first;
  fb.targets = fb.batch.targets.data() + first;
  return fb;
}

// parallel.tp_mode = "2d" (docs/tp2d.md): init and grad run model::Gpt2d, one stage per
// pipeline rank; grad runs the microbatches GPipe-fashion (every forward, then every
// backward; blocking sends of [B*T/q, C/q] blocks to the same grid position of the next
// stage) and sums the gradients over DP and the tied wte's over its two stages. The files are
// layout-independent (the 2D ShardSpecs' hyperslabs). Training does not run 2D yet: it will
// take the pipeline executor (docs/tp2d.md, "What remains").
bool tp2d(const Session& s) { return s.cfg.parallel.tp_mode == "2d"; }

std::unique_ptr<model::Gpt2d> make_gpt2d(Session& s, parallel::Tp2dGrid& grid) {
  std::unique_ptr<model::Gpt2d> m;
  parallel::agree(MPI_COMM_WORLD, [&] {
    TRIDENT_CHECK(s.cfg.parallel.vpp == 1, s.cfg.source, ": parallel.tp_mode = \"2d\" runs one "
                  "chunk per pipeline rank; expected parallel.vpp = 1, got ", s.cfg.parallel.vpp);
    const model::StageLayout stage =
        model::chunk_layouts(s.cfg.model, s.ps.shape.pp, 1, s.ps.coord.pp).front();
    m = std::make_unique<model::Gpt2d>(s.cfg.model, stage, grid, *s.ops,
                                       s.cfg.parallel.micro_batch_size);
  });
  return m;
}

int run_grad_2d(Session& s, const std::string& weights, const std::string& batch,
                const std::string& out) {
  parallel::Tp2dGrid grid = parallel::make_tp2d_grid(s.ps.tp);
  auto m = make_gpt2d(s, grid);
  const train::Config& cfg = s.cfg;
  const int dp = s.ps.shape.dp, mbs = cfg.parallel.micro_batch_size;
  io::Batch b;
  parallel::agree(MPI_COMM_WORLD, [&] {
    b = io::read_batch(batch, cfg.model.vocab_size);
    TRIDENT_CHECK(b.seq_len == cfg.model.seq_len, batch, ": sequences of ", b.seq_len,
                  " tokens, the deck has model.seq_len = ", cfg.model.seq_len);
    TRIDENT_CHECK(b.batch % (mbs * dp) == 0, batch, ": a batch of ", b.batch,
                  " sequences does not split into microbatches of parallel.micro_batch_size = ",
                  mbs, " over dp = ", dp);
  });
  parallel::agree(MPI_COMM_WORLD, [&] {
    io::read_weights(weights, MPI_COMM_WORLD, cfg.model, m->specs(), m->params(),
                     train::shard_role(s.ps));
  });
  const int T = cfg.model.seq_len, per_replica = b.batch / dp, nmb = per_replica / mbs;
  const float scale = float(1.0 / double(std::int64_t(b.batch) * T));  // as Trainer's
  const bool first = s.ps.first_stage(), last = s.ps.last_stage();
  const int stage = s.ps.coord.pp, n = int(m->boundary_numel());
  MPI_Comm pp = s.ps.pp.raw();
  m->zero_grads();
  std::vector<std::unique_ptr<model::Gpt2dActivations>> acts;
  double loss = 0;
  for (int k = 0; k < nmb; ++k) {
    acts.push_back(m->make_activations());
    model::Gpt2dActivations& a = *acts.back();
    const std::int64_t at = (std::int64_t(s.ps.coord.dp) * per_replica + k * mbs) * T;
    if (!first) MPI_Recv(m->input(a), n, MPI_FLOAT, stage - 1, k, pp, MPI_STATUS_IGNORE);
    loss += m->forward(a, b.inputs.data() + at, b.targets.data() + at, scale);
    if (!last) MPI_Send(m->output(a), n, MPI_FLOAT, stage + 1, k, pp);
  }
  for (int k = 0; k < nmb; ++k) {
    model::Gpt2dActivations& a = *acts[std::size_t(k)];
    if (!last) MPI_Recv(a.doutput.data(), n, MPI_FLOAT, stage + 1, nmb + k, pp, MPI_STATUS_IGNORE);
    m->backward(a);
    if (!first) MPI_Send(a.dinput.data(), n, MPI_FLOAT, stage - 1, nmb + k, pp);
  }
  m->reduce_param_grads();
  if (s.ps.shape.pp > 1 && (first || last))  // the tied wte's two copies
    for (const auto& t : m->specs())
      if (t.tied_across_stages()) s.ps.embedding.allreduce_sum(m->grads() + t.offset, t.local_numel());
  s.ps.dp.allreduce_sum(m->grads(), m->num_params());  // each already scaled: the sum is the mean
  s.ps.pp.allreduce_sum(&loss, 1);  // the last stage's
  s.ps.dp.allreduce_sum(&loss, 1);
  loss /= double(std::int64_t(b.batch) * T);
  io::write_grad_dump(out, MPI_COMM_WORLD, cfg.model, m->specs(), m->grads(), loss,
                      train::shard_role(s.ps));
  log::info("loss ", loss, " -> ", out);
  return 0;
}

}  // namespace

int run_grad(const DeckArgs& args, const std::string& weights, const std::string& batch,
             const std::string& out) {
  Session s = open_session(args, "", true);
  if (tp2d(s)) return run_grad_2d(s, weights, batch, out);
  train::Trainer tr(s.cfg, s.ps, *s.ops);
  TRIDENT_CHECK(tr.weight_update() != pipeline::WeightUpdate::per_microbatch,
                "trident grad: parallel.schedule = \"", s.cfg.parallel.schedule, "\" updates the "
                "weights after every microbatch, so a step has no one gradient; use a "
                "synchronous schedule");
  FixedBatch fb = load_fixed(tr, weights, batch);
  const double loss = tr.forward_backward(fb.inputs, fb.targets, fb.batch.batch);
  tr.gather_gradients();
  tr.write_trace();  // io.trace_step = 1: the pipeline trace of this one step
  model::GptChunk& m = tr.model();
  HostMirror grads(m.memory(), m.grads(), m.num_params(), true);
  io::write_grad_dump(out, MPI_COMM_WORLD, s.cfg.model, m.specs(), grads.data(), loss,
                      train::shard_role(s.ps));
  log::info("loss ", loss, " -> ", out);
  return 0;
}

int run_step(const DeckArgs& args, const std::string& weights, const std::string& batch,
             int steps, const std::string& out) {
  Session s = open_session(args, "");
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
  model::GptChunk& m = tr.model();
  HostMirror params(m.memory(), m.params(), m.num_params(), true);
  io::write_tensor_file(out, MPI_COMM_WORLD, io::kWeightsFormat, "model", s.cfg.model,
                        m.specs(), params.data(), train::shard_role(s.ps),
                        [&](const io::h5::File& f) {
                          io::h5::write_attr_doubles(f, "losses", losses);
                          io::h5::write_attr_doubles(f, "grad_norms", norms);
                        });
  return 0;
}

int run_init(const DeckArgs& args, const std::string& out) {
  Session s = open_session(args, "", true);
  if (tp2d(s)) {
    parallel::Tp2dGrid grid = parallel::make_tp2d_grid(s.ps.tp);
    auto m = make_gpt2d(s, grid);
    m->init_weights(std::uint64_t(s.cfg.train.seed));
    io::write_weights(out, MPI_COMM_WORLD, s.cfg.model, m->specs(), m->params(),
                      train::shard_role(s.ps));
    log::info("initialized weights (seed ", s.cfg.train.seed, ") -> ", out);
    return 0;
  }
  train::Trainer tr(s.cfg, s.ps, *s.ops);
  model::GptChunk& m = tr.model();
  m.init_weights(std::uint64_t(s.cfg.train.seed));
  HostMirror params(m.memory(), m.params(), m.num_params(), true);
  io::write_weights(out, MPI_COMM_WORLD, s.cfg.model, m.specs(), params.data(),
                    train::shard_role(s.ps));
  log::info("initialized weights (seed ", s.cfg.train.seed, ") -> ", out);
  return 0;
}

}  // namespace trident::app
