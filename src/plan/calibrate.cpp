// Measuring a machine (see trident/plan/calibrate.hpp). Each figure is timed on every rank at
// once after a barrier, repeated until it has run min_seconds, and averaged over the ranks
// (the pace training sees when all ranks compute together).
#include "trident/plan/calibrate.hpp"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <set>

#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/core/memory_usage.hpp"
#include "trident/model/stage_model.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/parallel/node_comm.hpp"
#include "trident/parallel/wait.hpp"
#include "trident/plan/cost.hpp"

namespace trident::plan {

namespace {

using parallel::Comm;

// The clock every figure is timed with: wall time, or with CalibrateOptions::cpu_time this
// process's CPU time (set once by calibrate(), which is not reentrant).
bool g_cpu_clock = false;

double now() {
  if (g_cpu_clock) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Device backends run asynchronously: reading one float back waits for the queue.
void sync(ops::Ops& ops, const float* any) {
  if (DeviceMemory* m = ops.memory()) {
    float x;
    m->to_host(&x, any, sizeof x);
  }
}

// The figure of five rounds: their mean (the machine as a long step sees it, preemptions
// included) or, with best, the fastest (the machine undisturbed).
double summarize(const std::vector<double>& rounds, bool best) {
  if (best) return *std::min_element(rounds.begin(), rounds.end());
  double sum = 0;
  for (double r : rounds) sum += r;
  return sum / double(rounds.size());
}

// Calls of fn that take about `seconds` on the slowest rank of comm: batches of 1, 2, 4, ...
// calls, every rank the same (fn may be a collective), until one takes that long.
template <typename Fn>
int calls_for(Comm& comm, double seconds, Fn fn) {
  for (int calls = 1;; calls *= 2) {
    const double t0 = now();
    for (int i = 0; i < calls; ++i) fn();
    double t = now() - t0;
    comm.allreduce_max(&t, 1);
    if (t >= seconds || calls >= (1 << 20)) return calls;
  }
}

// Seconds per call of fn in each of `rounds` rounds of `calls` calls, every rank starting
// together after a barrier: the slowest rank's of each round (what a collective waits for),
// or with `mean` the ranks' mean.
template <typename Fn>
std::vector<double> slowest_rounds(Comm& comm, int rounds, int calls, Fn fn, bool mean = false) {
  std::vector<double> out;
  for (int r = 0; r < rounds; ++r) {
    comm.barrier();
    const double t0 = now();
    for (int i = 0; i < calls; ++i) fn();
    double per = (now() - t0) / calls;
    if (mean) {
      comm.allreduce_sum(&per, 1);
      per /= std::max(1, comm.size());
    } else {
      comm.allreduce_max(&per, 1);
    }
    out.push_back(per);
  }
  return out;
}

// Seconds per call of fn, every rank starting together: a warm-up that also sets the count,
// then five timed rounds of that count (about min_s / 5 each), averaged over the rounds and
// the ranks. The mean, not the median: a training step sees this machine's share of the cores
// over time, preemptions included, and so must the figure (a median keeps the rounds no
// other process interrupted, and on a shared machine predicts steps too fast).
template <typename Fn>
double timed(Comm& comm, ops::Ops& ops, const float* any, double min_s, bool best, Fn fn) {
  const int calls = calls_for(comm, min_s / 5, [&] {
    fn();
    sync(ops, any);
  });
  std::vector<double> rounds;
  for (int r = 0; r < 5; ++r) {
    comm.barrier();
    const double t0 = now();
    for (int i = 0; i < calls; ++i) fn();
    sync(ops, any);
    rounds.push_back((now() - t0) / calls);
  }
  double per = summarize(rounds, best);
  comm.allreduce_sum(&per, 1);
  return per / std::max(1, comm.size());
}

// A block's four linears (the model's sizes) and the LM head.
std::vector<model::LinearDims> linears(const model::ModelConfig& cfg, int tp) {
  const model::ChunkDims d = model::chunk_dims(cfg, tp, 1, false);
  const std::array<model::LinearDims, 4> block = model::block_linears(d);
  std::vector<model::LinearDims> out(block.begin(), block.end());
  out.push_back({d.C, d.Vl});
  return out;
}

// Allreduce seconds of `n` floats over comm: five rounds of a fixed count (about
// min_s / 5 each), the slowest rank's time of each, their mean (as in timed()). With `work`, each
// allreduce follows a call of it (a layer's product, as in tensor parallelism) and the time
// of `work` alone is taken off: what the collective adds where ranks arrive unevenly (on a
// shared or oversubscribed machine, a rank descheduled by the others).
double allreduce_time(Comm& comm, std::int64_t n, double min_s, bool best,
                      const std::function<void()>& work = {}) {
  std::vector<float> buf(std::size_t(std::max<std::int64_t>(n, 1)), 1.0f);
  auto once = [&] {
    if (work) work();
    comm.allreduce_sum(buf.data(), n);
  };
  const int calls = calls_for(comm, min_s / 5, once);
  std::vector<double> rounds;
  for (int r = 0; r < 5; ++r) {
    double per = slowest_rounds(comm, 1, calls, once).front();
    // The work alone (the ranks' mean) right after, taken off: each pair of rounds sees the
    // same load on a shared machine.
    if (work) per = std::max(per - slowest_rounds(comm, 1, calls, work, true).front(), 0.0);
    rounds.push_back(per);
  }
  return summarize(rounds, best);
}

// One-way seconds of a message of `n` floats between ranks 0 and 1 of comm (the others wait):
// round trips in a fixed count (about min_s), halved; the mean of three rounds.
double pingpong_time(Comm& comm, std::int64_t n, double min_s, bool best) {
  const int rank = comm.rank();
  std::vector<float> buf(std::size_t(std::max<std::int64_t>(n, 1)), 1.0f);
  auto describe = [] { return std::string("calibrate: a ping-pong"); };
  auto send = [&](int peer) {
    comm.isend(buf.data(), n, peer, 7).wait(describe);
  };
  auto receive = [&](int peer) {
    comm.irecv(buf.data(), n, peer, 7).wait(describe);
  };
  auto trip = [&] {
    if (rank == 0) send(1), receive(1);
    else if (rank == 1) receive(0), send(0);
  };
  const int calls = calls_for(comm, min_s / 3, trip);
  std::vector<double> rounds = slowest_rounds(comm, 3, calls, trip);
  for (double& r : rounds) r /= 2;  // one way
  return summarize(rounds, best);
}

// alpha and beta of a ring allreduce over p ranks from a small and a large message:
// t(S) = 2(p-1) alpha + 2(p-1)/p S / beta. The small one after `work` (see allreduce_time):
// alpha is the latency a collective costs between layers, not in a tight loop.
Link fit_link(Comm& comm, double min_s, bool best, const std::function<void()>& work) {
  const int p = comm.size();
  const std::int64_t small = 1, large = 1 << 22;  // floats: 4 B and 16 MiB
  // The latency sets what every TP collective costs and varies most on a shared machine: at
  // least half a second of it.
  const double ts = allreduce_time(comm, small, std::max(min_s, 0.5), best, work),
               tl = allreduce_time(comm, large, min_s, best);
  Link l;
  l.alpha_s = ts / (2.0 * (p - 1));
  const double bytes = 2.0 * (p - 1) / p * double(large) * 4.0;
  l.bytes_per_s = bytes / std::max(tl - std::min(ts, tl / 2), 1e-9);
  // Point-to-point: ranks 0 and 1 of comm exchange a message back and forth (a pipeline's
  // send and its peer's receive); one way is half the round trip.
  const double ps = pingpong_time(comm, small, min_s, best),
               pl = pingpong_time(comm, large, min_s, best);
  l.p2p_alpha_s = ps;
  l.p2p_bytes_per_s = double(large) * 4.0 / std::max(pl - std::min(ps, pl / 2), 1e-9);
  return l;
}

}  // namespace

std::vector<std::array<std::int64_t, 3>> linear_shapes(const model::ModelConfig& cfg, int tp,
                                                       int micro_batch, int cp) {
  const std::int64_t n = std::int64_t(micro_batch) * cfg.seq_len / cp;
  std::vector<std::array<std::int64_t, 3>> out;
  for (const model::LinearDims& d : linears(cfg, tp)) {
    out.push_back({n, d.out, d.in});
    out.push_back({n, d.in, d.out});
    out.push_back({d.in, d.out, n});
  }
  return out;
}

Machine calibrate(const CalibrateOptions& opt, ops::Ops& ops) {
  const model::ModelConfig& cfg = opt.model;
  TRIDENT_CHECK(cfg.vocab_size > 0, "calibrate: the model needs model.vocab_size > 0");
  Comm world = Comm::world();
  const int world_size = world.size(), rank = world.rank();
  DeviceMemory* mem = ops.memory();
  TRIDENT_CHECK(!opt.cpu_time || !mem, "calibrate --cpu-time measures CPU ranks (each process's ",
                "CPU time), not a device backend");
  g_cpu_clock = opt.cpu_time;
  Machine m;
  // The libraries' working memory (host ranks): what stays resident after the products and
  // collectives below at the model's shapes, once this function's own buffers are freed.
  const std::int64_t resident_before = resident_bytes();
  // A device's: the backend's own blocks already in its arena (the cuBLAS workspace), as
  // `trident train`'s report counts them.
  if (mem) m.library_mib = double(mem->used()) / 1048576.0;

  // Matrix products: each shape once, the largest buffers sized for all.
  std::set<std::array<std::int64_t, 3>> shapes;
  for (int tp : opt.tps)
    for (int b : opt.micro_batches)
      for (int cp : opt.cps)  // b * T / cp rows: new shapes only where b < cp
        for (const auto& s : linear_shapes(cfg, tp, b, cp)) shapes.insert(s);
  std::int64_t a_max = 1, b_max = 1, c_max = 1;
  for (const auto& s : shapes) {
    a_max = std::max(a_max, s[0] * s[2]);
    b_max = std::max(b_max, s[2] * s[1]);
    c_max = std::max(c_max, s[0] * s[1]);
  }
  {
    FloatBuffer A(std::size_t(a_max), mem), B(std::size_t(b_max), mem), Cm(std::size_t(c_max), mem);
    ops.fill(A.data(), 0.01f, a_max);
    ops.fill(B.data(), 0.02f, b_max);
    ops.fill(Cm.data(), 0.0f, c_max);
    double best = 0;
    for (const auto& s : shapes) {
      const int M = int(s[0]), N = int(s[1]), K = int(s[2]);
      const double t = timed(world, ops, Cm.data(), opt.min_seconds, opt.best, [&] {
        ops.gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, Cm.data(), N);
      });
      GemmRate g{s[0], s[1], s[2], 2.0 * double(M) * N * K / t};
      m.gemms.push_back(g);
      best = std::max(best, g.flops_per_s);
    }
    m.gemm_flops = best;
    m.peak_flops = best;  // no published peak for a CPU: the best product measured

    // Ranks sharing cores: the largest product on rank 0 of each node alone (the others
    // wait in a barrier) against all ranks at once.
    const auto& big = *std::max_element(shapes.begin(), shapes.end(), [](const auto& x, const auto& y) {
      return x[0] * x[1] * x[2] < y[0] * y[1] * y[2];
    });
    const int M = int(big[0]), N = int(big[1]), K = int(big[2]);
    auto product = [&] {
      ops.gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, Cm.data(), N);
    };
    Comm node_comm = parallel::split_by_node(world, "node");
    const int node_rank = node_comm.rank(), node_size = node_comm.size();
    const double together = timed(world, ops, Cm.data(), opt.min_seconds, opt.best, product);
    double alone = together;
    if (node_size > 1) {
      // Rank 0 of the node repeats the product for min_s; the rest wait at the barrier.
      node_comm.barrier();
      std::vector<double> rounds;
      for (int r = 0; r < 5; ++r) {
        int calls = 0;
        const double t0 = now();
        if (node_rank == 0) {
          do {
            product();
            sync(ops, Cm.data());
            ++calls;
          } while (now() - t0 < opt.min_seconds / 5);
          rounds.push_back((now() - t0) / calls);
        }
        node_comm.barrier();
      }
      if (node_rank == 0) alone = summarize(rounds, opt.best);
      node_comm.broadcast(&alone, sizeof alone, 0);
    }
    m.solo_speedup = std::max(1.0, together / alone);
  }

  // The attention core at the model's shape (tp = the first given, micro-batch the largest).
  {
    const int tp = opt.tps.front(), b = *std::max_element(opt.micro_batches.begin(),
                                                          opt.micro_batches.end());
    const int T = cfg.seq_len, nh = cfg.n_head / tp, hd = cfg.head_dim(), c = nh * hd;
    const std::int64_t rows = std::int64_t(b) * T;
    FloatBuffer qkv(std::size_t(rows * 3 * c), mem), dqkv(std::size_t(rows * 3 * c), mem),
        out(std::size_t(rows * c), mem), dout(std::size_t(rows * c), mem),
        lse(std::size_t(std::int64_t(b) * nh * T), mem);
    ops.fill(qkv.data(), 0.01f, rows * 3 * c);
    ops.fill(dout.data(), 0.01f, rows * c);
    const ops::Ops::AttentionShape s = ops::attention_shape_qkv(b, T, c, nh);
    const float *q = qkv.data(), *k = q + c, *v = q + 2 * c;
    const double tf = timed(world, ops, out.data(), opt.min_seconds, opt.best,
                            [&] { ops.attention_forward(out.data(), lse.data(), q, k, v, s); });
    const double tb = timed(world, ops, dqkv.data(), opt.min_seconds, opt.best, [&] {
      ops.attention_backward(dqkv.data(), dqkv.data() + c, dqkv.data() + 2 * c, dout.data(),
                             out.data(), lse.data(), q, k, v, s);
    });
    // plan/cost.cpp's convention: forward 2 b NH T^2 hd, backward 2.5 x that.
    const double flops = 2.0 * double(b) * nh * double(T) * T * hd;
    m.attention_flops = 3.5 * flops / (tf + tb);
  }

  // Memory-bound kernels: LayerNorm forward and backward over [n, C], GELU over [n, 4C].
  {
    const int n = int(std::int64_t(*std::max_element(opt.micro_batches.begin(),
                                                     opt.micro_batches.end())) * cfg.seq_len);
    const int C = cfg.d_model;
    const std::int64_t F = 4 * std::int64_t(C), big = std::int64_t(n) * F;
    FloatBuffer x(std::size_t(big), mem), y(std::size_t(big), mem), dy(std::size_t(big), mem),
        dx(std::size_t(big), mem), w(std::size_t(C), mem), bb(std::size_t(C), mem),
        dw(std::size_t(C), mem), db(std::size_t(C), mem), mean(std::size_t(n), mem),
        rstd(std::size_t(n), mem);
    for (FloatBuffer* f : {&x, &dy, &w, &bb}) ops.fill(f->data(), 0.5f, std::int64_t(f->size()));
    const double t = timed(world, ops, dx.data(), opt.min_seconds, opt.best, [&] {
      ops.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), bb.data(), n, C);
      ops.layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                             mean.data(), rstd.data(), n, C);
      ops.gelu_forward(y.data(), x.data(), big);
      ops.gelu_backward(dx.data(), x.data(), dy.data(), big);
    });
    // Bytes each kernel reads and writes: LayerNorm 2C forward, 4C backward (dx +=);
    // GELU 2F forward, 3F backward.
    const double bytes = 4.0 * double(n) * double(6 * C + 5 * F);
    m.kernel_bytes_per_s = bytes / t;
  }

  // One whole transformer block (the model's own code: GptChunk, tp 1, a middle chunk) forward
  // and backward at each micro-batch size. What it takes beyond the cost model's products and
  // attention at the rates just measured is the memory-bound part: kernel_bytes_per_s becomes
  // the rate that makes the model's block time the measured one (the median over the sizes),
  // so the kernels between the products (bias gradients, copies, residuals) are counted.
  {
    parallel::GridShape all_dp;
    all_dp.dp = world_size;
    parallel::ParallelState ps = parallel::make_parallel_state(all_dp);
    model::ModelConfig one = cfg;
    one.n_layer = 1;
    model::StageLayout mid;
    mid.first_layer = 0, mid.last_layer = 1, mid.has_embedding = false, mid.has_head = false;
    std::vector<double> rates;
    for (int b : opt.micro_batches) {
      model::StageModelOptions one_d;
      one_d.micro_batch = b;
      const std::unique_ptr<model::StageModel> chunk =
          model::make_stage_model(one, {mid}, ps, ops, one_d);
      chunk->init_weights(1);
      auto a = chunk->make_activations(0);
      const std::int64_t rows = std::int64_t(b) * cfg.seq_len * cfg.d_model;
      ops.fill(a->forward_input(), 0.1f, rows);
      ops.fill(a->backward_input(), 0.01f, rows);
      const double t = timed(world, ops, a->backward_output(), opt.min_seconds, opt.best, [&] {
        chunk->forward(0, *a, nullptr, nullptr, 1.0f);
        chunk->backward(0, *a, nullptr);
      });
      const BlockCost bc = block_cost(cfg, 1, b, m);
      const double rest = t - bc.matmul_s - bc.attention_s;
      if (rest > 0) rates.push_back(bc.kernel_bytes / rest);
    }
    if (!rates.empty()) {
      std::sort(rates.begin(), rates.end());
      m.kernel_bytes_per_s = rates[rates.size() / 2];
    }
  }

  // Links: the ranks of this node; one rank per node between nodes.
  // The product between collectives: the model's q|k|v forward at tp 1, micro-batch 1.
  const int wn = cfg.seq_len, wk = cfg.d_model, wm = 3 * cfg.d_model;
  FloatBuffer wa(std::size_t(wn) * wk, mem), wb(std::size_t(wk) * wm, mem), wc(std::size_t(wn) * wm, mem);
  ops.fill(wa.data(), 0.01f, std::int64_t(wn) * wk);
  ops.fill(wb.data(), 0.01f, std::int64_t(wk) * wm);
  const std::function<void()> work = [&] {
    ops.gemm(false, false, wn, wm, wk, 1.0f, wa.data(), wk, wb.data(), wm, 0.0f, wc.data(), wm);
    sync(ops, wc.data());
  };
  Comm local = parallel::split_by_node(world, "node");
  const int local_size = local.size(), local_rank = local.rank();
  Comm across = world.split(local_rank, rank, "across");
  const int nodes = across.size();
  // The fewest ranks on a node and nodes per local rank, over the world (max of negatives).
  int fewest[2] = {-local_size, -nodes};
  world.allreduce_max(fewest, 2);
  const int min_local = -fewest[0], nodes_min = -fewest[1];
  m.ranks_per_node = local_size;
  if (min_local >= 2) {
    m.intra = fit_link(local, opt.min_seconds, opt.best, work);
  } else {
    // One rank per node: nothing to measure inside a node; a memory copy stands in.
    m.intra = {1e-6, m.kernel_bytes_per_s, 1e-6, m.kernel_bytes_per_s};
  }
  // Between nodes: the communicator of each node's local rank r (all measure at once, as
  // in training); without a second node the figures inside the node stand in.
  m.inter = nodes_min >= 2 ? fit_link(across, opt.min_seconds, opt.best, work) : m.intra;

  // MPI's temporaries of a non-blocking allreduce in place (the DP buckets'), per byte: the
  // rise of the resident high-water mark over one of 4 MiB, freed heap pages returned first
  // so that the temporaries take fresh ones (host ranks; Open MPI 4.1's libnbc: 1.0).
  if (!mem && world_size > 1) {
    const std::int64_t n = std::int64_t(1) << 20;
    std::vector<float> buf(std::size_t(n), 1.0f);
    world.barrier();
    malloc_trim(0);
    double ratio = 0;
    if (reset_peak_resident()) {
      const std::int64_t before = peak_resident_bytes();
      world.iallreduce_sum(buf.data(), n)
          .wait([] { return std::string("calibrate: a non-blocking allreduce"); });
      ratio = double(std::max<std::int64_t>(0, peak_resident_bytes() - before)) / (4.0 * double(n));
    }
    world.allreduce_max(&ratio, 1);
    m.nonblocking_temp_ratio = std::round(ratio * 100) / 100;
    // ZeRO-1's reduce-scatter: libnbc holds one copy over 2 ranks and two over more, so it is
    // measured only where there are 3 or more (else the default stands).
    if (world_size > 2) {
      const std::int64_t part = n / world_size;
      std::vector<int> counts(static_cast<std::size_t>(world_size), static_cast<int>(part));
      std::vector<float> mine(static_cast<std::size_t>(part));
      world.barrier();
      malloc_trim(0);
      double rs_ratio = 0;
      if (reset_peak_resident()) {
        const std::int64_t before = peak_resident_bytes();
        world.ireduce_scatter_sum(buf.data(), mine.data(), counts.data(), part * world_size)
            .wait([] { return std::string("calibrate: a non-blocking reduce-scatter"); });
        rs_ratio = double(std::max<std::int64_t>(0, peak_resident_bytes() - before)) /
                   (4.0 * double(part * world_size));
      }
      world.allreduce_max(&rs_ratio, 1);
      m.reduce_scatter_temp_ratio = std::round(rs_ratio * 100) / 100;
    }
  }

  // Memory per rank: the device's arena, or this node's memory shared by its ranks.
  if (mem) {
    m.memory_gib = double(mem->capacity()) / 1073741824.0;
  } else {
    const double bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
    m.memory_gib = bytes / local_size / 1073741824.0;
  }
  if (!mem) {
    malloc_trim(0);  // freed buffers back to the system: what remains is the libraries'
    m.library_mib = double(std::max<std::int64_t>(0, resident_bytes() - resident_before)) / 1048576.0;
  }
  // Every rank must write the same file: rank 0's figures.
  world.broadcast(&m.solo_speedup, sizeof m.solo_speedup, 0);
  double nums[12] = {m.gemm_flops,          m.peak_flops,          m.attention_flops,
                     m.kernel_bytes_per_s,  m.intra.alpha_s,       m.intra.bytes_per_s,
                     m.inter.alpha_s,       m.inter.bytes_per_s,   m.intra.p2p_alpha_s,
                     m.intra.p2p_bytes_per_s, m.inter.p2p_alpha_s, m.inter.p2p_bytes_per_s};
  world.broadcast(nums, sizeof nums, 0);
  m.gemm_flops = nums[0], m.peak_flops = nums[1], m.attention_flops = nums[2];
  m.kernel_bytes_per_s = nums[3];
  m.intra = {nums[4], nums[5], nums[8], nums[9]};
  m.inter = {nums[6], nums[7], nums[10], nums[11]};
  world.broadcast(&m.memory_gib, sizeof m.memory_gib, 0);
  world.broadcast(&m.library_mib, sizeof m.library_mib, 0);
  world.broadcast(&m.ranks_per_node, sizeof m.ranks_per_node, 0);
  return m;
}

}  // namespace trident::plan
