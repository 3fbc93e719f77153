// The cost model of one layout (see trident/plan/cost.hpp). Shapes follow GptChunk's legend
// (model/gpt.hpp): n = B*T token rows, C = d_model, C3 = this rank's q|k|v columns, F = the
// MLP's columns on this rank (F1 = 2F for Llama's gate|up), Vl = vocabulary rows per rank;
// under context parallelism T = seq_len / cp, the rank's slice of each sequence.
#include "trident/plan/cost.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>

#include "trident/core/error.hpp"
#include "trident/model/spec.hpp"
#include "trident/pipeline/schedule.hpp"
#include "trident/pipeline/simulator.hpp"
#include "trident/pipeline/stage_memory.hpp"
#include "trident/plan/planner.hpp"

namespace trident::plan {

std::vector<int> stage_layers_of(const model::ModelConfig& cfg, const Layout& lay) {
  const int stages = lay.pp * lay.vpp;
  std::vector<int> layers = train::pipeline_stage_layers(cfg, lay);
  if (layers.empty()) layers.assign(std::size_t(stages), cfg.n_layer / stages);  // even
  return layers;
}

namespace {

constexpr double kFloat = 4.0;

// A ring allreduce of `bytes` over p ranks: 2(p-1) steps of bytes/p each.
double allreduce_s(int p, double bytes, const Link& l) {
  if (p <= 1) return 0;
  return 2.0 * (p - 1) * l.alpha_s + 2.0 * (p - 1) / p * bytes / l.bytes_per_s;
}
// A reduce-scatter or an all-gather: half an allreduce.
double half_allreduce_s(int p, double bytes, const Link& l) {
  if (p <= 1) return 0;
  return double(p - 1) * l.alpha_s + double(p - 1) / p * bytes / l.bytes_per_s;
}

// Seconds of one microbatch through one chunk.
struct ChunkCost {
  double f = 0, f_tp = 0;         // forward compute, its TP collectives
  // backward: a split backward's B (input gradients, + recompute, the weight gradients it
  // keeps) and W (c_attn's and c_fc's weight gradients)
  double b_input = 0, w = 0;
  double b_tp = 0;                // the backward's TP collectives
  double f_cp = 0, b_cp = 0;      // the ring attention's exposed communication (cp > 1)
  double b() const { return b_input + w; }
};

// T: the rank's rows of each sequence (seq_len / cp), seq: the whole sequence's; nkv: the
// key/value heads its attention reads (what the ring passes on).
struct Shapes {
  std::int64_t n, C, C3, Ca, F, F1, NH, hd, Vl, T, b, seq, nkv;
  std::array<model::LinearDims, 4> linears;  // q|k|v, attention out, MLP in, MLP out
};

Shapes shapes(const model::ModelConfig& cfg, int tp, int micro_batch, int cp = 1) {
  // The model's own sizes of a rank's chunk (its block kind's q|k|v and MLP columns).
  const model::ChunkDims d = model::chunk_dims(cfg, tp, micro_batch, false, cp);
  Shapes s{};
  s.b = d.B, s.seq = cfg.seq_len, s.T = d.T, s.n = d.N, s.C = d.C;
  s.Ca = d.Ca, s.NH = d.NH, s.hd = cfg.head_dim();
  s.C3 = d.C3;
  s.nkv = model::rank_kv_heads(cfg, tp);
  s.F = d.F, s.F1 = d.F1;
  s.Vl = d.Vl;
  s.linears = model::block_linears(d);
  return s;
}

double gemm_s(const Machine& m, std::int64_t M, std::int64_t N, std::int64_t K) {
  return 2.0 * double(M) * double(N) * double(K) / m.gemm_rate(M, N, K);
}

// A linear layer y[n,out] = x[n,in] w[in,out] (ops::linear_forward): the forward product
// (n, out, in), the backward's dx = dy w^T (n, in, out) and dw = x^T dy (in, out, n), each
// as (m, n, k) of C[m,n] = A[m,k] B[k,n], the shapes `trident calibrate` measures.
struct Linear {
  double fwd, dx, dw;
};
Linear linear(const Machine& m, std::int64_t n, std::int64_t in, std::int64_t out) {
  return {gemm_s(m, n, out, in), gemm_s(m, n, in, out), gemm_s(m, in, out, n)};
}

// One block's parts: its products (forward, input and weight gradients; of these a split
// backward defers c_attn's and c_fc's to W, mm_dw_deferred), the attention core, and the
// bytes of its memory-bound kernels in the forward (the backward moves twice).
struct BlockParts {
  double mm_fwd, mm_dx, mm_dw, mm_dw_deferred, att_fwd, att_bwd, elem_fwd_bytes;
};
BlockParts block_parts(const Shapes& s, const Machine& mc) {
  std::array<Linear, 4> l;
  for (std::size_t i = 0; i < l.size(); ++i)
    l[i] = linear(mc, s.n, s.linears[i].in, s.linears[i].out);
  const Linear &qkv = l[0], &proj = l[1], &fc = l[2], &fc2 = l[3];
  // The attention core, causal (half the T x T products): forward 2 b NH T^2 hd; the
  // backward 2.5 x that (it recomputes the probabilities). Under cp the load-balanced split
  // gives each rank 1/cp of the whole sequence's: 2 b NH (seq / cp) seq hd.
  const double att_f = 2.0 * double(s.b * s.NH) * double(s.T * s.seq) * double(s.hd);
  BlockParts p;
  p.mm_fwd = qkv.fwd + proj.fwd + fc.fwd + fc2.fwd;
  p.mm_dx = qkv.dx + proj.dx + fc.dx + fc2.dx;
  p.mm_dw = qkv.dw + proj.dw + fc.dw + fc2.dw;
  p.mm_dw_deferred = qkv.dw + fc.dw;
  p.att_fwd = att_f / mc.attention_flops;
  p.att_bwd = 2.5 * att_f / mc.attention_flops;
  // Memory-bound kernels per token row: two norms (read, write C), bias and residual adds,
  // the GELU / SwiGLU (read F1, write F), the rotary embedding on q, k.
  p.elem_fwd_bytes = double(s.n) * kFloat * double(10 * s.C + s.C3 + 2 * s.F1 + s.F);
  return p;
}

// The ring attention's communication of one block (model::RingAttention, cp > 1) that its
// attention tiles do not hide, forward and backward. Each of the cp steps computes 1/cp of
// the rank's attention (the load-balanced split: two chunk-pairs' work every step) while the
// next key/value block, 2 b T nkv hd floats, travels one hop (cp - 1 hops forward). The
// backward's steps also pass the gradient block of the one before (K, V and their gradients:
// two blocks a step on the same link), and one last hop returns each gradient block to its
// owner after the tiles, exposed whole. Assumed: a step's transfer and its tiles overlap
// fully, so a step costs max(tiles, transfer); only the excess is counted.
struct RingCost {
  double f = 0, b = 0;
};
RingCost ring_cost(const Shapes& s, int cp, const BlockParts& bp, const Link& cp_link) {
  if (cp <= 1) return {};
  const double block = 2.0 * double(s.b * s.T) * double(s.nkv * s.hd) * kFloat;
  const double hop = cp_link.p2p_time(block);
  RingCost r;
  r.f = (cp - 1) * std::max(0.0, hop - bp.att_fwd / cp);
  r.b = (cp - 1) * std::max(0.0, 2 * hop - bp.att_bwd / cp) + hop;
  return r;
}

// The ring's own memory-bound work in one layer (model::RingAttention's copies, fills, adds
// and merges), in bytes moved: forward, packing k and v into one block (read, write) and
// merging each step's partial output into the running one (~the rank's output rows read
// twice and written once a step); backward, packing k, v and q, clearing dq, clearing and
// adding the travelling gradient block every step, and unpacking dq, dk, dv.
struct RingBytes {
  double f = 0, b = 0;
};
RingBytes ring_bytes(const Shapes& s, int cp) {
  if (cp <= 1) return {};
  const double kv = 2.0 * double(s.b * s.T) * double(s.nkv * s.hd) * kFloat;  // one block
  const double q = double(s.b * s.T) * double(s.Ca) * kFloat;  // the rank's q (or out) rows
  return {2 * kv + 3.0 * cp * q, 4 * kv + 5 * q + 4.0 * cp * kv};
}

ChunkCost chunk_cost(const model::ModelConfig& cfg, const Shapes& s, int layers, bool emb,
                     bool head, const Layout& lay, const Machine& mc, const Link& tp_link,
                     const Link& cp_link) {
  ChunkCost c;
  const BlockParts bp = block_parts(s, mc);
  const RingCost ring = ring_cost(s, lay.cp, bp, cp_link);
  const RingBytes ring_copies = ring_bytes(s, lay.cp);
  const double ring_f = ring_copies.f / mc.kernel_bytes_per_s;
  const double att_fwd = bp.att_fwd + ring_f;  // the attention core: what recomputation repeats
  const double elem_fwd = bp.elem_fwd_bytes / mc.kernel_bytes_per_s;
  const double gelu_fwd = double(s.n) * kFloat * double(s.F1 + s.F) / mc.kernel_bytes_per_s;
  const double layer_f = bp.mm_fwd + att_fwd + elem_fwd;
  // A split backward's B: the input gradients and the weight gradients W does not take (the
  // c_projs', the norms': model::Block::backward); the sum is the whole backward either way.
  const double layer_dx = bp.mm_dx + (bp.mm_dw - bp.mm_dw_deferred) + bp.att_bwd +
                          ring_copies.b / mc.kernel_bytes_per_s + 2 * elem_fwd;
  const double layer_dw = bp.mm_dw_deferred;
  // TP per block: two row-parallel outputs forward, two column-parallel inputs backward,
  // [n, C] floats each (sequence parallelism: a reduce-scatter + all-gather pair instead,
  // the same bytes and twice the messages).
  const double act_bytes = double(s.n * s.C) * kFloat;
  double ar = allreduce_s(lay.tp, act_bytes, tp_link);
  if (lay.sequence_parallel && lay.tp > 1) ar += 2.0 * (lay.tp - 1) * tp_link.alpha_s;
  c.f = layers * layer_f;
  c.f_tp = layers * 2 * ar;
  c.b_input = layers * layer_dx;
  c.w = layers * layer_dw;
  c.b_tp = layers * 2 * ar;
  c.f_cp = layers * ring.f;
  c.b_cp = layers * ring.b;
  if (lay.recompute == model::Recompute::full) {
    c.b_input += layers * layer_f;
    c.b_tp += layers * 2 * ar;
  } else if (lay.recompute == model::Recompute::selective) {
    c.b_input += layers * (att_fwd + gelu_fwd);
  }
  // Recomputing the attention core (both recomputations) runs its ring forward again.
  if (lay.recompute != model::Recompute::none) c.b_cp += layers * ring.f;
  if (emb) {
    c.f += double(s.n * s.C) * 3 * kFloat / mc.kernel_bytes_per_s;
    c.w += double(s.n * s.C) * 3 * kFloat / mc.kernel_bytes_per_s;
    c.f_tp += allreduce_s(lay.tp, act_bytes, tp_link);  // the vocab-parallel lookup leaves
  }
  if (head) {
    // The head runs its own backward inside the forward (model/gpt.hpp): logits, the
    // cross-entropy's passes over them, the input and weight gradients.
    const Linear lm = linear(mc, s.n, s.C, s.Vl);
    c.f += lm.fwd + lm.dx + lm.dw +
           double(s.n * s.Vl) * 4 * kFloat / mc.kernel_bytes_per_s +
           double(s.n * s.C) * 4 * kFloat / mc.kernel_bytes_per_s;
    c.f_tp += allreduce_s(lay.tp, act_bytes, tp_link) +
              3 * allreduce_s(lay.tp, double(s.n) * kFloat, tp_link);
  }
  (void)cfg;
  return c;
}

}  // namespace

BlockCost block_cost(const model::ModelConfig& cfg, int tp, int micro_batch, const Machine& mc) {
  // cp = 1: the block `trident calibrate` times whole
  const BlockParts p = block_parts(shapes(cfg, tp, micro_batch), mc);
  return {p.mm_fwd + p.mm_dx + p.mm_dw, p.att_fwd + p.att_bwd, 3 * p.elem_fwd_bytes};
}

double model_flops_per_step(const model::ModelConfig& cfg, std::int64_t global_batch) {
  // The block's own q|k|v and MLP widths (its BlockKind), unsplit.
  const model::ChunkDims w = model::chunk_dims(cfg, 1, 1, false);
  const double C = cfg.d_model, T = cfg.seq_len, L = cfg.n_layer, V = cfg.vocab_size;
  const double C3 = double(w.C3), F = cfg.d_ff(), F1 = double(w.F1);
  const double per_token = 2 * L * (C * C3 + C * C + C * F1 + F * C) + 2 * C * V + 4 * L * T * C;
  return 3 * per_token * double(global_batch) * T;
}

StepPrediction predict(const model::ModelConfig& cfg, std::int64_t global_batch,
                       const Layout& lay, const Machine& mc, bool host_memory,
                       ops::Precision precision, OpenFiles open_files) {
  StepPrediction p;
  p.layout = lay;
  const std::int64_t per_step = std::int64_t(lay.micro_batch_size) * lay.dp;
  TRIDENT_CHECK(global_batch % per_step == 0, "plan: global batch ", global_batch,
                " does not split into microbatches of ", lay.micro_batch_size, " on ", lay.dp,
                " data-parallel ranks");
  p.microbatches = int(global_batch / per_step);
  const pipeline::Schedule sched =
      pipeline::make_schedule(lay.schedule.kind(), lay.pp, lay.vpp, p.microbatches);
  // Layers per virtual stage as `trident train` cuts them (parallel.pipeline_layers =
  // lay.pipeline_layers).
  const int stages = lay.pp * lay.vpp;
  p.stage_layers = stage_layers_of(cfg, lay);

  // The ranks holding the same weights (the dp_cp communicator): the gradient reduction and
  // the ZeRO-1 shard span DP x CP.
  const int sharers = lay.dp * lay.cp;

  // Memory: every pipeline stage (their stashes and chunks differ); the largest. Each from
  // the layout as `trident train` reads it from its deck (train::memory_layout).
  std::vector<double> param_bytes(std::size_t(lay.pp), 0.0);  // each rank's parameters
  const std::vector<pipeline::RankScheduleMemory> sched_memory = pipeline::schedule_memory(sched);
  for (int r = 0; r < lay.pp; ++r) {
    model::MemoryLayout ml = train::memory_layout(cfg, lay, r);
    pipeline::set_schedule_memory(ml, sched, sched_memory[std::size_t(r)]);
    ml.host_memory = host_memory;
    ml.open_files = r == 0 ? open_files.rank0 : open_files.others;  // rank 0 writes metrics
    ml.set_precision(precision);
    ml.nonblocking_temp_ratio = mc.nonblocking_temp_ratio;
    ml.reduce_scatter_temp_ratio = mc.reduce_scatter_temp_ratio;
    model::MemoryEstimate e = model::predict_memory(cfg, ml);
    e.libraries = mc.library_bytes();
    // weights also counts an asynchronous schedule's extra versions; gradients holds the
    // parameters once (plus, under ZeRO-1, the shard of them: params (1 + 1/(dp cp))).
    param_bytes[std::size_t(r)] =
        ml.weight_versions == 1 ? double(e.weights)
        : ml.zero1 && sharers > 1 ? double(e.gradients) * sharers / (sharers + 1.0)
                                  : double(e.gradients);
    if (r == 0) p.rank0_peak_bytes = e.peak();
    if (r == 0 || e.peak() > p.memory.peak()) p.memory = e, p.memory_pp_rank = r;
  }
  p.fits = p.memory.peak() <= mc.memory_bytes();

  // Links by the grid order (tp fastest, then cp, then dp, then pp; the DP x CP group spans
  // tp * cp * dp ranks).
  const int R = mc.ranks_per_node;
  const Link& tp_link = lay.tp > R ? mc.inter : mc.intra;
  const Link& cp_link = lay.tp * lay.cp > R ? mc.inter : mc.intra;
  const Link& dp_link = lay.tp * lay.cp * lay.dp > R ? mc.inter : mc.intra;
  const Link& pp_link = lay.tp * lay.cp * lay.dp * lay.pp > R ? mc.inter : mc.intra;

  const Shapes s = shapes(cfg, lay.tp, lay.micro_batch_size, lay.cp);

  // Every virtual stage at its own cost: its layers, the embedding on the first, the head
  // and the loss on the last (on the rank the schedule's placement gives it: zb-v's rank 0
  // holds both ends).
  std::vector<ChunkCost> chunk(static_cast<std::size_t>(stages));
  for (int v = 0; v < stages; ++v)
    chunk[std::size_t(v)] = chunk_cost(cfg, s, p.stage_layers[std::size_t(v)], v == 0,
                                       v == stages - 1, lay, mc, tp_link, cp_link);
  // The boundary tensor a stage sends: Nr x C floats.
  const double boundary = double(lay.sequence_parallel ? s.n / lay.tp : s.n) * double(s.C) * kFloat;
  const double p2p = lay.pp > 1 ? pp_link.p2p_time(boundary) : 0.0;

  // The simulator counts in integer slots: 1/2000 of the slowest action of any stage.
  double slowest = 1e-12;
  for (const ChunkCost& c : chunk)
    slowest = std::max({slowest, c.f + c.f_tp + c.f_cp, c.b() + c.b_tp + c.b_cp});
  const double unit = slowest / 2000.0;
  auto slots = [unit](double t) { return std::max(1, int(std::lround(t / unit))); };
  pipeline::Costs costs;
  for (const ChunkCost& c : chunk)
    costs.stage_slots.push_back({slots(c.f + c.f_tp + c.f_cp), slots(c.b() + c.b_tp + c.b_cp),
                                 slots(c.b_input + c.b_tp + c.b_cp), slots(c.w)});
  costs.comm = p2p > 0 ? int(std::lround(p2p / unit)) : 0;
  // The DP reduction of a rank's gradients over DP x CP (parallel.grad_bucket_mb, 25 MiB
  // buckets; ZeRO-1: the reduce-scatter, and the all-gather of the updated weights) and its
  // AdamW update
  // (reads p, g, m, v and writes p, m, v over its shard; the norm reads the gradients,
  // zeroing writes them).
  struct Update {
    double reduce = 0, gather = 0, buckets = 1, optimizer = 0;
  };
  auto update_of = [&](double bytes) {
    Update u;
    u.buckets = std::max(1.0, std::ceil(bytes / (25.0 * 1048576.0)));
    if (sharers > 1 && lay.zero1()) {
      u.reduce = half_allreduce_s(sharers, bytes, dp_link) +
                 (u.buckets - 1) * (sharers - 1) * dp_link.alpha_s;
      u.gather = u.reduce;
    } else if (sharers > 1) {
      u.reduce = allreduce_s(sharers, bytes, dp_link) +
                 (u.buckets - 1) * 2 * (sharers - 1) * dp_link.alpha_s;
    }
    const double params = bytes / kFloat;
    const double shard = lay.zero1() && sharers > 1 ? params / sharers : params;
    u.optimizer = (7 * shard + 2 * params) * kFloat / mc.kernel_bytes_per_s;
    return u;
  };
  // Asynchronous schedules run 1F1B's action lists: one window of m microbatches per step,
  // which the executor drains at the end of the step (no overlap across steps), so the
  // simulation of their lists is their makespan. pipedream-2bw updates once per step, as a
  // flush does (below). pipedream updates every stage after every backward, each update
  // waiting for the DP average of that microbatch's gradient: those m reductions and
  // updates per step are on the rank's timeline, so they are part of its B's here. Not
  // modelled: the weight-version swaps (memory copies of the rank's parameters).
  const bool per_microbatch =
      lay.schedule->update == pipeline::WeightUpdate::per_microbatch;
  const StageMap map = sched.stage_map();
  if (per_microbatch)
    for (int v = 0; v < stages; ++v) {
      const Update u = update_of(param_bytes[std::size_t(map.rank_of(v))]);
      costs.stage_slots[std::size_t(v)].b += slots(u.reduce + u.optimizer);
    }
  const pipeline::Simulation sim = pipeline::simulate(sched, costs);
  // The parts of the step on the rank with the most work (its chunks' actions).
  int critical = 0;
  double rank_compute = -1, rank_tp = 0, rank_cp = 0, rank_backward = 0;
  for (int r = 0; r < lay.pp; ++r) {
    double compute = 0, tp = 0, cp = 0, backward = 0;
    for (int c = 0; c < lay.vpp; ++c) {
      const ChunkCost& k = chunk[std::size_t(map.virtual_stage(r, c))];
      compute += k.f + k.b(), tp += k.f_tp + k.b_tp, cp += k.f_cp + k.b_cp;
      backward += k.b() + k.b_tp + k.b_cp;
    }
    if (compute + tp + cp > rank_compute + rank_tp + rank_cp)
      rank_compute = compute, rank_tp = tp, rank_cp = cp, rank_backward = backward, critical = r;
  }
  p.compute_s = double(p.microbatches) * rank_compute;
  p.tp_comm_s = double(p.microbatches) * rank_tp;
  p.cp_comm_s = double(p.microbatches) * rank_cp;
  // Ranks sharing cores (solo_speedup > 1): while some wait, the others run faster, so the
  // schedule's critical path shrinks by up to that factor, never below a rank's own work.
  const double own = p.compute_s + p.tp_comm_s + p.cp_comm_s;
  const double makespan =
      std::max(sim.makespan * unit / mc.solo_speedup, mc.solo_speedup > 1 ? own : 0.0);
  p.bubble_s = std::max(0.0, makespan - own);
  p.bubble_fraction = sim.bubble_fraction;

  const Update u = update_of(param_bytes[std::size_t(critical)]);
  if (per_microbatch) {
    // Inside the makespan (the B's above): m reductions and updates, not part of the bubble.
    p.dp_exposed_s = double(p.microbatches) * u.reduce;
    p.optimizer_s = double(p.microbatches) * u.optimizer;
    p.bubble_s = std::max(0.0, p.bubble_s - p.dp_exposed_s - p.optimizer_s);
  } else {
    // The buckets start during the last microbatch's backward on this rank.
    p.dp_exposed_s =
        (u.reduce > 0 ? std::max(u.reduce - rank_backward, u.reduce / u.buckets) : 0.0) +
        u.gather;
    p.optimizer_s = u.optimizer;
  }
  // GPT-2's tied embedding: its gradient summed between the first and the last stage.
  if (lay.pp > 1 && cfg.tied())
    p.embed_sync_s = allreduce_s(2, double(s.Vl) * double(s.C) * kFloat, pp_link);

  p.step_s = makespan + (per_microbatch ? 0.0 : p.dp_exposed_s + p.optimizer_s) + p.embed_sync_s;
  p.tokens_per_s = double(global_batch) * cfg.seq_len / p.step_s;
  p.model_flops = model_flops_per_step(cfg, global_batch);
  const double ranks = double(lay.tp) * lay.cp * lay.pp * lay.dp;
  p.mfu = p.model_flops / (p.step_s * ranks * mc.peak_flops);
  const std::pair<double, const char*> parts[] = {
      {p.compute_s, "compute"},       {p.tp_comm_s, "tp comm"},
      {p.cp_comm_s, "cp comm"},
      {p.bubble_s, "bubble"},         {p.dp_exposed_s, "dp comm"},
      {p.embed_sync_s, "embedding sync"}, {p.optimizer_s, "optimizer"}};
  p.dominant = std::max_element(std::begin(parts), std::end(parts))->second;
  return p;
}

}  // namespace trident::plan
