// Ring attention's communication, with and without the tiles it hides behind (issue 30;
// bench/cp_bench.py runs it beside `trident train`). Under `mpirun -np CP` (the CP group is the
// world) one model::RingAttention of one GPT-2 block's shape, the local t = T/CP rows of
// --batch B sequences of --seq T tokens, --dmodel C over --heads NH (fused qkv, as
// Gpt2Block makes it): --reps R forward + backward passes after --warmup W, each timed by the
// ring's own counters (RingAttention::Stats: the time in the calls and the part blocked waiting
// for messages), then R times the same messages alone (forward_messages_alone,
// backward_messages_alone: no tiles between them; a barrier before each). Prints one JSON line
// (rank 0): each rank's median and minimum of every figure, per pass, averaged over the ranks
// (and the medians' maximum, *_max), and the hidden share 1 - wait / alone of the forward and
// the backward, in wall and in thread-CPU seconds, from the medians and (*_best) from the
// minima (the messages and the waits with the least interference from other work on shared
// cores). --watchdog S waits as `runtime.watchdog_s = S` does (polling,
// sleeping between polls: ranks that share cores leave them to the others).
// usage: mpirun -np CP trident_bench_ring [--seq T] [--batch B] [--dmodel C] [--heads NH]
//        [--reps R] [--warmup W] [--watchdog S]
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/model/ring_attention.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/parallel/wait.hpp"

namespace par = trident::parallel;
namespace model = trident::model;
using trident::FloatBuffer;

namespace {

void fill(FloatBuffer& b, unsigned seed) {
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = float(int((i * 2654435761u + seed) % 97) - 48) / 96.0f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The per-pass figures this rank measured (medians over the reps), in this order.
enum Figure {
  kForward,          // wall seconds in forward()
  kForwardCpu,       // and thread-CPU
  kForwardWait,      // of which blocked waiting
  kForwardWaitCpu,   // the waits' thread-CPU seconds
  kForwardAlone,     // forward's messages alone, wall
  kForwardAloneCpu,  // and thread-CPU
  kBackward,
  kBackwardCpu,
  kBackwardWait,
  kBackwardWaitCpu,
  kBackwardAlone,
  kBackwardAloneCpu,
  kFigures
};
const char* kNames[kFigures] = {"forward_s",           "forward_cpu_s",    "forward_wait_s",
                                "forward_wait_cpu_s",  "forward_alone_s",  "forward_alone_cpu_s",
                                "backward_s",          "backward_cpu_s",   "backward_wait_s",
                                "backward_wait_cpu_s", "backward_alone_s", "backward_alone_cpu_s"};

// The bench, between MPI_Init and MPI_Finalize (its communicators freed before the latter).
int run(int argc, char** argv) {
  int seq = 4096, batch = 1, dmodel = 256, heads = 4, reps = 5, warmup = 1;
  double watchdog = 0;
  for (int i = 1; i < argc; ++i) {
    auto arg = [&](const char* name) { return std::strcmp(argv[i], name) == 0 && i + 1 < argc; };
    if (arg("--seq"))
      seq = std::atoi(argv[++i]);
    else if (arg("--batch"))
      batch = std::atoi(argv[++i]);
    else if (arg("--dmodel"))
      dmodel = std::atoi(argv[++i]);
    else if (arg("--heads"))
      heads = std::atoi(argv[++i]);
    else if (arg("--reps"))
      reps = std::atoi(argv[++i]);
    else if (arg("--warmup"))
      warmup = std::atoi(argv[++i]);
    else if (arg("--watchdog"))
      watchdog = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "trident_bench_ring: unknown or incomplete argument '%s'\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  par::Comm world = par::Comm::world();
  const int cp = world.size(), rank = world.rank();
  if (seq % (2 * cp) != 0 || dmodel % heads != 0 || reps < 1) {
    if (rank == 0)
      std::fprintf(stderr,
                   "trident_bench_ring: --seq %d must be divisible by 2 * cp = %d, "
                   "--dmodel %d by --heads %d, and --reps >= 1\n",
                   seq, 2 * cp, dmodel, heads);
    return 2;
  }
  par::set_watchdog_seconds(watchdog);
  const int t = seq / cp;
  auto ops = trident::ops::make_cpu_ops(1);
  par::Comm group = world.split(0, rank, "cp");
  const auto shape = trident::ops::attention_shape_qkv(batch, t, dmodel, heads);
  model::RingAttention ring(*ops, group, shape);

  const std::size_t rows = std::size_t(batch) * t;
  FloatBuffer qkv(rows * 3 * dmodel), dqkv(rows * 3 * dmodel), out(rows * dmodel),
      dout(rows * dmodel), lse(rows * heads);
  fill(qkv, 17u + unsigned(rank));
  fill(dout, 29u + unsigned(rank));
  const float *q = qkv.data(), *k = q + dmodel, *v = q + 2 * dmodel;
  float *dq = dqkv.data(), *dk = dq + dmodel, *dv = dq + 2 * dmodel;

  std::vector<double> per[kFigures];
  for (int r = 0; r < warmup + reps; ++r) {
    world.barrier();
    const model::RingAttention::Stats a = ring.stats();
    ring.forward(out.data(), lse.data(), q, k, v);
    ring.backward(dq, dk, dv, dout.data(), out.data(), lse.data(), q, k, v);
    const model::RingAttention::Stats& b = ring.stats();
    if (r < warmup) continue;
    per[kForward].push_back(b.forward_s - a.forward_s);
    per[kForwardCpu].push_back(b.forward_cpu_s - a.forward_cpu_s);
    per[kBackwardCpu].push_back(b.backward_cpu_s - a.backward_cpu_s);
    per[kForwardWait].push_back(b.forward_wait_s - a.forward_wait_s);
    per[kForwardWaitCpu].push_back(b.forward_wait_cpu_s - a.forward_wait_cpu_s);
    per[kBackward].push_back(b.backward_s - a.backward_s);
    per[kBackwardWait].push_back(b.backward_wait_s - a.backward_wait_s);
    per[kBackwardWaitCpu].push_back(b.backward_wait_cpu_s - a.backward_wait_cpu_s);
  }
  for (int r = 0; r < warmup + reps; ++r) {
    double cpu = 0;
    world.barrier();
    const double f = ring.forward_messages_alone(&cpu);
    if (r >= warmup) per[kForwardAlone].push_back(f), per[kForwardAloneCpu].push_back(cpu);
    world.barrier();
    const double b = ring.backward_messages_alone(&cpu);
    if (r >= warmup) per[kBackwardAlone].push_back(b), per[kBackwardAloneCpu].push_back(cpu);
  }
  double mean[kFigures], most[kFigures], least[kFigures];
  for (int i = 0; i < kFigures; ++i) {
    mean[i] = most[i] = median(per[i]);
    least[i] = *std::min_element(per[i].begin(), per[i].end());
  }
  MPI_Allreduce(MPI_IN_PLACE, mean, kFigures, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, most, kFigures, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, least, kFigures, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  for (int i = 0; i < kFigures; ++i) mean[i] /= cp, least[i] /= cp;
  if (rank == 0) {
    auto hidden = [](double wait, double alone) {
      return alone > 0 ? std::max(0.0, 1.0 - wait / alone) : 0.0;
    };
    std::printf(
        "{\"cp\": %d, \"seq\": %d, \"batch\": %d, \"dmodel\": %d, \"heads\": %d, "
        "\"reps\": %d, \"watchdog_s\": %g, \"block_bytes\": %.0f, "
        "\"messages_per_pass\": [%d, %d]",
        cp, seq, batch, dmodel, heads, reps, watchdog,
        ring.stats().messages ? ring.stats().bytes / double(ring.stats().messages) : 0.0, cp - 1,
        cp > 1 ? 2 * cp - 1 : 0);
    for (int i = 0; i < kFigures; ++i)
      std::printf(", \"%s\": %.6f, \"%s_max\": %.6f, \"%s_min\": %.6f", kNames[i], mean[i],
                  kNames[i], most[i], kNames[i], least[i]);
    for (const double* f : {mean, least})
      std::printf(
          ", \"forward_hidden%s\": %.4f, \"backward_hidden%s\": %.4f, "
          "\"forward_hidden_cpu%s\": %.4f, \"backward_hidden_cpu%s\": %.4f",
          f == least ? "_best" : "", hidden(f[kForwardWait], f[kForwardAlone]),
          f == least ? "_best" : "", hidden(f[kBackwardWait], f[kBackwardAlone]),
          f == least ? "_best" : "", hidden(f[kForwardWaitCpu], f[kForwardAloneCpu]),
          f == least ? "_best" : "", hidden(f[kBackwardWaitCpu], f[kBackwardAloneCpu]));
    std::printf("}\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rc = run(argc, argv);
  MPI_Finalize();
  return rc;
}
