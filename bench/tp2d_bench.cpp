// 1D (Megatron) against 2D (SUMMA) tensor parallelism on one transformer MLP, the building
// block 2D TP has so far (issue 20): X[N,C] -> c_fc [C,4C] -> GELU -> c_proj [4C,C], forward
// and backward, under `mpirun -np 4` (tp = 4, q = 2). Prints one JSON line per d_model (rank 0):
// the bytes each rank's communicators counted per forward+backward (measured, Comm's
// counters) beside the closed forms, the median wall time of one forward+backward, and the
// floats each rank keeps for the backward (the MLP's stash: input, c_fc output, GELU output).
// With --layers L (> 0) it also runs whole GPT-2 training steps (forward + backward of one
// microbatch of --batch B sequences of --seq T tokens, vocabulary --vocab V, 8 heads):
// 1D = GptChunk at tp = 4, 2D = model::Gpt2d on the 2 x 2 grid; per d_model one more JSON line
// with each one's TP bytes per rank and step (Comm's counters; 2D includes the once-per-step
// column reductions of the vectors' and embeddings' gradients), the median step time, and
// the activation floats one layer allocates per rank (1D: layer_floats, the carving GptChunk
// and the memory report use; 2D: Block2dActivations::floats) beside serial's.
// It is not `trident train`: 2D TP is not wired into the training loop yet.
// usage: mpirun -np 4 trident_bench_tp2d [--tokens N] [--reps R] [--dmodel C ...]
//        [--layers L --seq T --batch B --vocab V]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/model/gpt.hpp"
#include "trident/model/gpt2d.hpp"
#include "trident/model/summa.hpp"
#include "trident/parallel/tp_grid2d.hpp"
#include "trident/parallel/tp_mappings.hpp"

namespace par = trident::parallel;
namespace model = trident::model;
using trident::FloatBuffer;

namespace {

void fill(FloatBuffer& b, int seed) {
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = float(int((i * 2654435761u + seed) % 97) - 48) / 480.0f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Result {
  double bytes_per_rank = 0;  // all this rank's TP communicators, one forward + backward
  double closed_form = 0;
  double seconds = 0;         // median wall time of one forward + backward (slowest rank)
  double stash_floats = 0;    // floats kept for the backward on a rank
};

// Megatron: X replicated; c_fc column-parallel (4C/p columns), c_proj row-parallel, one
// allreduce of [N, C] forward (after c_proj) and one backward (into c_fc's input gradient).
Result one_d(trident::ops::Ops& ops, par::Comm& tp, int n, int c, int reps) {
  const int p = tp.size(), f = 4 * c / p;
  FloatBuffer x(std::size_t(n) * c), w1(std::size_t(c) * f), w2(std::size_t(f) * c),
      h(std::size_t(n) * f), g(std::size_t(n) * f), y(std::size_t(n) * c), dy(std::size_t(n) * c),
      dg(std::size_t(n) * f), dh(std::size_t(n) * f), dx(std::size_t(n) * c),
      dw1(std::size_t(c) * f), dw2(std::size_t(f) * c);
  fill(x, 1), fill(w1, 2), fill(w2, 3), fill(dy, 4);
  dw1.zero(), dw2.zero();
  par::TpMappings map(tp, false);
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    tp.barrier();
    tp.reset_counters();
    const double t0 = now();
    map.enter_forward(x.data(), std::int64_t(n) * c);
    ops.linear_forward(h.data(), x.data(), w1.data(), nullptr, n, c, f);
    ops.gelu_forward(g.data(), h.data(), std::int64_t(n) * f);
    ops.linear_forward(y.data(), g.data(), w2.data(), nullptr, n, f, c);
    map.leave_forward(y.data(), y.data(), std::int64_t(n) * c);
    const float* d = map.leave_backward(dy.data(), nullptr, std::int64_t(n) * c);
    ops.linear_backward(dg.data(), dw2.data(), nullptr, d, g.data(), w2.data(), n, f, c);
    ops.gelu_backward(dh.data(), h.data(), dg.data(), std::int64_t(n) * f);
    ops.linear_backward(dx.data(), dw1.data(), nullptr, dh.data(), x.data(), w1.data(), n, c, f);
    map.enter_backward(dx.data(), nullptr, std::int64_t(n) * c);
    double t = now() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, tp.raw());
    times.push_back(t);
  }
  Result res;
  res.bytes_per_rank = tp.counters().bytes;
  res.closed_form = p > 1 ? 2 * 2.0 * (p - 1) / p * 4.0 * n * c : 0;
  res.seconds = median(times);
  res.stash_floats = double(n) * c + 2.0 * n * f;
  return res;
}

// SUMMA: every matrix in q x q blocks; two SummaLinear layers and GELU on the block.
Result two_d(trident::ops::Ops& ops, par::Tp2dGrid& grid, int n, int c, int reps) {
  const int q = grid.q, nb = n / q, cb = c / q, fb = 4 * c / q;
  model::SummaLinear fc(ops, grid, {n, c, 4 * c}), proj(ops, grid, {n, 4 * c, c});
  FloatBuffer x(std::size_t(nb) * cb), w1(std::size_t(cb) * fb), w2(std::size_t(fb) * cb),
      h(std::size_t(nb) * fb), g(std::size_t(nb) * fb), y(std::size_t(nb) * cb),
      dy(std::size_t(nb) * cb), dg(std::size_t(nb) * fb), dh(std::size_t(nb) * fb),
      dx(std::size_t(nb) * cb), dw1(std::size_t(cb) * fb), dw2(std::size_t(fb) * cb);
  fill(x, 1), fill(w1, 2), fill(w2, 3), fill(dy, 4);
  dw1.zero(), dw2.zero();
  std::vector<double> times;
  double bytes = 0;
  for (int r = 0; r < reps; ++r) {
    grid.row.barrier();
    grid.col.barrier();
    grid.row.reset_counters();
    grid.col.reset_counters();
    const double t0 = now();
    fc.forward(h.data(), x.data(), w1.data());
    ops.gelu_forward(g.data(), h.data(), std::int64_t(nb) * fb);
    proj.forward(y.data(), g.data(), w2.data());
    proj.backward(dg.data(), dw2.data(), dy.data(), g.data(), w2.data());
    ops.gelu_backward(dh.data(), h.data(), dg.data(), std::int64_t(nb) * fb);
    fc.backward(dx.data(), dw1.data(), dh.data(), x.data(), w1.data());
    double t = now() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times.push_back(t);
    bytes = grid.row.counters().bytes + grid.col.counters().bytes;
  }
  Result res;
  res.bytes_per_rank = bytes;
  for (const model::SummaShape& s : {fc.shape(), proj.shape()}) {
    const model::SummaBytes f = model::summa_forward_bytes(q, s), b = model::summa_backward_bytes(q, s);
    res.closed_form += f.row + f.col + b.row + b.col;
  }
  res.seconds = median(times);
  res.stash_floats = double(nb) * cb + 2.0 * nb * fb;
  return res;
}

struct StepResult {
  double bytes_1d = 0, bytes_2d = 0, seconds_1d = 0, seconds_2d = 0, loss_1d = 0, loss_2d = 0;
  double layer_floats_1d = 0, layer_floats_2d = 0, layer_floats_serial = 0;
};

// Whole-model steps, 1D GptChunk (tp = world) against Gpt2d (q x q), the same weights.
StepResult model_steps(trident::ops::Ops& ops, par::Tp2dGrid& grid, par::Comm& world,
                       const model::ModelConfig& cfg, int batch, int reps) {
  const int n = batch * cfg.seq_len;
  std::vector<std::int32_t> in(static_cast<std::size_t>(n)), tg(in.size());
  for (int i = 0; i < n; ++i) {
    in[std::size_t(i)] = (7 * i + 3) % cfg.vocab_size;
    tg[std::size_t(i)] = (11 * i + 5) % cfg.vocab_size;
  }
  const float scale = 1.0f / float(n);
  StepResult r;
  par::GridShape all_tp;
  all_tp.tp = world.size();
  par::ParallelState ps = par::make_parallel_state(all_tp);
  model::GptChunk one(cfg, model::StageLayout{0, cfg.n_layer, true, true}, ps, ops, batch);
  one.init_weights(1);
  auto acts = one.make_activations();
  std::vector<double> t1, t2;
  for (int k = 0; k < reps; ++k) {
    world.barrier();
    ps.tp.reset_counters();
    const double t0 = now();
    one.zero_grads();
    r.loss_1d = one.forward(0, *acts, in.data(), tg.data(), scale);
    one.backward(0, *acts, in.data());
    double t = now() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world.raw());
    t1.push_back(t);
    r.bytes_1d = ps.tp.counters().bytes;
  }
  model::Gpt2d two(cfg, grid, ops, batch);
  two.init_weights(1);
  for (int k = 0; k < reps; ++k) {
    world.barrier();
    grid.row.reset_counters();
    grid.col.reset_counters();
    const double t0 = now();
    two.zero_grads();
    r.loss_2d = two.forward_backward(in.data(), tg.data(), scale);
    two.reduce_param_grads();
    double t = now() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world.raw());
    t2.push_back(t);
    r.bytes_2d = grid.row.counters().bytes + grid.col.counters().bytes;
  }
  r.seconds_1d = median(t1);
  r.seconds_2d = median(t2);
  r.layer_floats_1d = double(model::layer_floats(model::chunk_dims(cfg, world.size(), batch, false), false));
  r.layer_floats_serial = double(model::layer_floats(model::chunk_dims(cfg, 1, batch, false), false));
  model::Block2d blk(ops, grid, {batch, cfg.seq_len, cfg.d_model, cfg.n_head});
  r.layer_floats_2d = double(blk.make_activations().floats());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int tokens = 1024, reps = 5, layers = 0, seq = 64, batch = 4, vocab = 1024;
  std::vector<int> widths;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dmodel")) widths.push_back(std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--layers")) layers = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seq")) seq = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch")) batch = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--vocab")) vocab = std::atoi(argv[i + 1]);
  }
  if (widths.empty()) widths = {512, 1024};
  par::Comm world = par::Comm::world();
  if (par::tp2d_side(world.size()) < 2) {
    if (world.rank() == 0)
      std::fprintf(stderr, "trident: error: trident_bench_tp2d needs a square world >= 4, got %d\n",
                   world.size());
    MPI_Finalize();
    return 2;
  }
  par::Tp2dGrid grid = par::make_tp2d_grid(world);
  auto ops = trident::ops::make_cpu_ops(1);
  for (int c : widths) {
    const Result a = one_d(*ops, world, tokens, c, reps);
    const Result b = two_d(*ops, grid, tokens, c, reps);
    if (world.rank() == 0)
      std::printf(
          "{\"tp\": %d, \"tokens\": %d, \"d_model\": %d, \"reps\": %d, "
          "\"1d\": {\"bytes_per_rank\": %.0f, \"closed_form\": %.0f, \"seconds\": %.6f, \"stash_floats\": %.0f}, "
          "\"2d\": {\"bytes_per_rank\": %.0f, \"closed_form\": %.0f, \"seconds\": %.6f, \"stash_floats\": %.0f}, "
          "\"serial_stash_floats\": %.0f}\n",
          world.size(), tokens, c, reps, a.bytes_per_rank, a.closed_form, a.seconds,
          a.stash_floats, b.bytes_per_rank, b.closed_form, b.seconds, b.stash_floats,
          double(tokens) * c + 2.0 * tokens * 4 * c);
    if (layers > 0) {
      const model::ModelConfig cfg{vocab, seq, layers, 8, c};
      const StepResult m = model_steps(*ops, grid, world, cfg, batch, reps);
      if (world.rank() == 0)
        std::printf(
            "{\"model_step\": true, \"tp\": %d, \"d_model\": %d, \"n_layer\": %d, \"seq\": %d, "
            "\"batch\": %d, \"vocab\": %d, \"reps\": %d, "
            "\"1d\": {\"bytes_per_rank\": %.0f, \"seconds\": %.6f, \"loss\": %.6f, \"layer_floats\": %.0f}, "
            "\"2d\": {\"bytes_per_rank\": %.0f, \"seconds\": %.6f, \"loss\": %.6f, \"layer_floats\": %.0f}, "
            "\"serial_layer_floats\": %.0f}\n",
            world.size(), c, layers, seq, batch, vocab, reps, m.bytes_1d, m.seconds_1d,
            m.loss_1d, m.layer_floats_1d, m.bytes_2d, m.seconds_2d, m.loss_2d,
            m.layer_floats_2d, m.layer_floats_serial);
    }
  }
  MPI_Finalize();
  return 0;
}
