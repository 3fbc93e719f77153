// Predicted peak bytes of one rank (see trident/model/memory.hpp). The activations count
// GptChunk's own carving (chunk_dims, carve_layer, carve_grad_stash); the other terms repeat
// the size arithmetic of the allocation they stand for, and the comments name it.
#include "trident/model/memory.hpp"

#include <algorithm>

#include "trident/core/arena.hpp"
#include "trident/parallel/tp_grid2d.hpp"

namespace trident::model {

namespace {
constexpr std::int64_t kFloat = sizeof(float);
}

std::int64_t MemoryEstimate::peak() const {
  return weights + gradients + optimizer + scratch + std::max(activations, staging) + collectives +
         messages + files + ring + libraries;
}

std::string MemoryEstimate::describe() const {
  std::string d = "peak " + format_bytes(peak()) + " = weights " + format_bytes(weights) +
                  " + gradients " + format_bytes(gradients) + " + optimizer " +
                  format_bytes(optimizer) + " + activations " + format_bytes(activations) +
                  " + scratch " + format_bytes(scratch);
  if (collectives > 0) d += " + MPI temporaries " + format_bytes(collectives);
  if (messages > 0) d += " + pipeline messages " + format_bytes(messages);
  if (files > 0) d += " + HDF5 files " + format_bytes(files);
  if (ring > 0)
    d += (ulysses ? " + ulysses attention " : " + ring attention ") + format_bytes(ring);
  if (libraries > 0) d += " + libraries " + format_bytes(libraries);
  if (staging > activations) d += " (start-up staging " + format_bytes(staging) + " > activations)";
  return d;
}

void MemoryLayout::set_precision(ops::Precision precision) {
  bf16_activations = stores_bf16(precision, recompute);
  bf16_products = !host_memory && precision == ops::Precision::bf16;
  fused_head = bf16_products;
  block_stash_bf16 = bf16_products;  // the CUDA backend's default (Trainer asks its backend)
  cp_bf16 = bf16_products;
}

namespace {
// parallel.tp_mode = "2d" (one chunk, fp32, host memory, no recompute or split backward: what
// the deck lets through): Gpt2dStage's boundary blocks and the 2D model's (model/gpt2d.cpp,
// block2d.cpp, summa.cpp, embedding2d.cpp, xent2d.cpp) allocations. x = [B*T/q, C/q].
void predict_2d(const ModelConfig& cfg, const MemoryLayout& lay, const StageLayout& st,
                MemoryEstimate& e) {
  const int q = parallel::tp2d_side(lay.tp);
  const std::int64_t mb = std::int64_t(lay.micro_batch) * cfg.seq_len / q, cb = cfg.d_model / q,
                     x = mb * cb, L = st.last_layer - st.first_layer;
  const std::int64_t vp = (cfg.vocab_size + q - 1) / q * q, vb = vp / q;
  // Gpt2dActivations: xs [L+1] x, doutput, dinput; per layer Block2d::make_activations: ln1,
  // atty, res2, ln2 (x each), qkv (3x), fch and fch_gelu (4x each), four row statistics and
  // attention's LSE [B/q, NH/q, T]; the head's lnf, its statistics, logits [mb, Vp/q], loss.
  std::int64_t per_mb = 3 * x + (L + 3) * x;
  per_mb += L * (15 * x + 4 * mb + std::int64_t(lay.micro_batch / q) * (cfg.n_head / q) * cfg.seq_len);
  if (st.has_head) per_mb += x + 3 * mb + mb * vb;
  e.activations_per_microbatch = per_mb * kFloat;
  e.activations = std::max(1, lay.peak_stash) * per_mb * kFloat;
  // Gpt2d's dx_, dy_; Block2d's backward scratch (14x); each SummaLinear's panels, stack,
  // dW block and ones over [in, out]: c_attn [C, 3C], c_proj [C, C], c_fc [C, 4C],
  // mlp c_proj [4C, C]; the head's stack [q, mb, Vp/q] and the cross-entropy's 3 per row.
  std::int64_t scratch = 2 * x + 14 * x;
  auto summa = [&](std::int64_t in, std::int64_t out) {
    const std::int64_t xb = mb * in / q, wb = (in / q) * (out / q);
    scratch += xb + 2 * wb + q * std::max(xb, wb) + mb;
  };
  summa(cfg.d_model, 3 * cfg.d_model), summa(cfg.d_model, cfg.d_model);
  summa(cfg.d_model, 4 * cfg.d_model), summa(4 * cfg.d_model, cfg.d_model);
  if (st.has_embedding || st.has_head) scratch += q * mb * vb + 3 * mb;
  e.scratch = scratch * kFloat;
  e.messages = lay.message_buffers * x * kFloat;  // Gpt2d::boundary_numel each
}
}  // namespace

std::int64_t ring_floats(const ModelConfig& cfg, int tp, const ChunkDims& d, bool bf16) {
  // The attention shape the chunk gives its RingAttention (the blocks' attention_shape):
  // nh = NH, hs = head_dim, ld_o = Ca = NH * hs; nkv its key/value heads (LlamaBlock:
  // kv_heads_, one each when n_kv_head < tp replicates them; GPT-2: NH).
  const std::int64_t nkv = rank_kv_heads(cfg, tp), hs = cfg.head_dim();
  const std::int64_t rows = d.B * d.T, kv_block = 2 * rows * nkv * hs;
  // bf16 (RingAttention's bf16 operands): the two travelling blocks bf16 (half), one bf16
  // block more (the blocks' dk, dv partials); q_packed_ holds bf16 q and dq (the same floats).
  if (bf16) return 4 * kv_block + kv_block / 2 + rows * d.Ca + rows * d.NH + 2 * rows * d.NH * hs;
  return 5 * kv_block + rows * d.Ca + rows * d.NH + 2 * rows * d.NH * hs;
}

MemoryEstimate predict_memory(const ModelConfig& cfg, const MemoryLayout& lay) {
  MemoryEstimate e;
  const std::vector<StageLayout> chunks =
      chunk_layouts(cfg, lay.pp, lay.vpp, lay.pp_rank, lay.stage_layers, lay.placement);
  std::int64_t params = 0;
  for (const ShardSpec& s : gpt_param_specs(cfg, chunks, lay.tp_rank, lay.tp, 0, lay.tp_2d))
    params += s.local_numel();
  // params_, grads_ (the model's flat buffers, 1D or 2D); ZeRO-1: GradSync's shard_grads_
  // and AdamW's moments over the shard. The gradients are shared by the dp_cp communicator
  // (DP x CP ranks hold the same weights), which the shard divides.
  const int sharers = lay.dp * lay.cp;
  const bool sharded = lay.zero1 && sharers > 1;
  const std::int64_t shard = sharded ? (params + sharers - 1) / sharers : params;
  e.weights = params * kFloat;
  if (lay.weight_versions > 1)  // the older versions and the swap buffer (WeightVersions)
    e.weights += ((lay.weight_versions - 1) * params + std::min(params, kVersionSwapFloats)) * kFloat;
  e.gradients = (params + (sharded ? shard : 0)) * kFloat;
  e.optimizer = 2 * shard * kFloat;
  if (lay.host_memory) e.files = lay.open_files * kHdf5FileBytes;  // host memory, not the device's
  if (lay.host_memory && sharers > 1) {
    const double ratio = sharded && sharers > 2 ? lay.reduce_scatter_temp_ratio
                                                : lay.nonblocking_temp_ratio;
    e.collectives = std::int64_t(ratio * double(params * kFloat));
  }
  if (lay.tp_2d) {  // the activations and scratch of the 2D model's own carving
    predict_2d(cfg, lay, chunks.at(0), e);
    e.staging = 0;  // Gpt2d::init_weights draws in place
    return e;
  }
  const bool head = std::any_of(chunks.begin(), chunks.end(),
                                [](const StageLayout& c) { return c.has_head; });
  const bool embedding = std::any_of(chunks.begin(), chunks.end(),
                                     [](const StageLayout& c) { return c.has_embedding; });
  int L = 0;  // the largest chunk's layers: the activation slots are sized for it
  for (const StageLayout& c : chunks) L = std::max(L, c.last_layer - c.first_layer);

  // GptChunk's dimensions (its constructor): under cp, seq_len / cp rows of each sequence.
  const ChunkDims d = chunk_dims(cfg, lay.tp, lay.micro_batch, lay.sequence_parallel, lay.cp);
  const std::int64_t N = d.N, Nr = d.Nr, C = d.C, C3 = d.C3, F = d.F, F1 = d.F1, Vl = d.Vl;
  e.messages = lay.message_buffers * Nr * C * kFloat;  // GptChunk::boundary_numel each

  // GptChunk::make_activations: the input and each layer's output but the last (which, and
  // the output gradient, is the chunk's boundary_ scratch; the input gradient is dres_), the
  // layers' stash (carve_layer), the zero-bubble gradient stash (carve_grad_stash).
  const std::int64_t layer_store = layer_floats(d, false);
  std::int64_t per_mb = Nr * C * std::max(1, L);
  // Selective recompute keeps one layer's attention output, LSE and GELU output, shared.
  const bool bf16 = lay.bf16_activations && lay.recompute == Recompute::none;
  const bool fused = stores_fused_block(lay.bf16_products, lay.block_stash_bf16, cfg.arch.get());
  const std::int64_t inner = recomputed_floats(d, fused);  // the fused block's in bf16
  if (lay.recompute == Recompute::none)
    per_mb += L * (fused  ? fused_layer_floats(d)
                   : bf16 ? packed_layer_floats(d)
                          : layer_store);
  if (lay.recompute == Recompute::selective)
    per_mb += L * (fused ? fused_layer_floats(d, true) : layer_floats(d, true));
  // The split backward's gradients for W: in the layers' dead qkv and fch, or their own
  // (the fused block's in bf16).
  if (lay.split_backward && grad_stash_separate(bf16 && !fused, lay.recompute))
    per_mb += L * grad_stash_floats(d, fused);
  e.activations_per_microbatch = per_mb * kFloat;
  // The head's output gradients the executor keeps between their F and B, one row each.
  e.activations = (std::max(1, lay.peak_stash) * per_mb + lay.head_gradients * Nr * C) * kFloat;

  // The backward's shared buffers (dres_, dbuf_, dqkv_, dfch_, dgelu_), the boundary tensor
  // (boundary_), sequence parallelism's gathers, the head's final norm, logits and loss, full
  // recomputation's one layer.
  std::int64_t scratch = N * C * 2 + Nr * C + N * C3 + N * F1 + N * F;
  if (lay.sequence_parallel) scratch += N * C + Nr * C;
  // The fused head keeps bf16 logits (at any TP): half of N * Vl floats (GptChunk's
  // constructor).
  const bool bf16_logits = lay.fused_head;
  const std::int64_t logits = bf16_logits ? std::max((N * Vl + 1) / 2, Vl) : N * Vl;
  if (head) scratch += N * C + 2 * Nr + logits + 5 * N;
  // one layer in fp32 (the fused block's stash needs no working copy; full recompute's layer
  // is its bf16 stash then)
  if (lay.recompute == Recompute::full && fused) scratch += fused_layer_floats(d);
  else if (lay.recompute == Recompute::full || (bf16 && !fused)) scratch += layer_store;
  if (lay.recompute == Recompute::selective) scratch += inner;
  // The fused block's CP attention on bf16 operands (no fp32 copies; ring/Ulysses in bf16).
  const bool cp_bf16 = lay.cp > 1 && fused && cp_bf16_operands(lay.cp_bf16, cfg.head_dim());
  e.scratch = scratch * kFloat;
  if (!lay.host_memory) {
    // The device backend's own scratch (CudaOps::scratch: 1.25x the largest need, >= 1 MiB).
    std::int64_t need = 0;
    if (lay.bf16_products) {
      // bf16 copies of the activation inputs of each product of a linear [N, in] -> [N, out]:
      // forward x (W from the weight cache), input gradient dy, weight gradient x and dy.
      auto linear = [&](std::int64_t in, std::int64_t out) {
        need = std::max({need, 2 * N * in, 2 * N * out, 2 * (N * in + N * out)});
      };
      for (const LinearDims& l : block_linears(d)) linear(l.in, l.out);
      if (head && bf16_logits)
        need = std::max(need, 2 * N * C);  // the fused head: lnf in bf16 (Ops::lm_head)
      else if (head)
        linear(C, Vl);
    }
    // The token embedding's backward groups the tokens by row in ints (CudaOps::
    // embedding_backward: counts, starts and fill per row, two position lists).
    if (embedding) need = std::max(need, (3 * Vl + 1 + 2 * N) * std::int64_t(sizeof(int)));
    // Attention through a library (cuDNN): the backend's exact bytes for the rank's shape, its
    // heads (key/value heads as ring_floats counts them); Ulysses runs attention over the
    // whole sequence with NH / cp heads.
    // (Not the bf16 ring's: its blocks are parts of longer sequences, which cuDNN declines.)
    const bool ulysses = lay.cp > 1 && lay.cp_mode == CpMode::ulysses;
    if (lay.fused_attention_bytes && !(cp_bf16 && !ulysses)) {
      const std::int64_t nkv = rank_kv_heads(cfg, lay.tp);
      const std::int64_t t = ulysses ? d.T * lay.cp : d.T, nh = ulysses ? d.NH / lay.cp : d.NH;
      const std::int64_t nkv_l = ulysses ? std::max<std::int64_t>(1, nkv / lay.cp) : nkv;
      // (the fused block's bf16 entry points at cp 1 and under CP in bf16; else under CP its
      // hook's fp32 attention)
      need = std::max(need, lay.fused_attention_bytes(int(d.B), int(t), int(nh), int(nkv_l),
                                                      cfg.head_dim(),
                                                      fused && (lay.cp == 1 || cp_bf16)));
    }
    e.scratch += std::max<std::int64_t>(need + need / 4, std::int64_t(1) << 20);
    // The fused block under CP: its attention hook's fp32 copies (CudaOps::hook_scratch: qkv
    // and dqkv [N, C3], atty and datty [N, Ca], each rounded to the arena's alignment).
    if (fused && lay.cp > 1 && !cp_bf16) {
      auto aligned = [](std::int64_t bytes) {
        const std::int64_t a = std::int64_t(ArenaAllocator::kAlign);
        return (bytes + a - 1) / a * a;
      };
      e.scratch += 2 * aligned(N * C3 * kFloat) + 2 * aligned(N * d.Ca * kFloat);
    }
    // The weight cache (CudaOps::set_weights): a bf16 copy of every parameter of the rank.
    if (lay.bf16_products) e.scratch += 2 * params;
  }

  // Context parallelism: the rank's one RingAttention (shared by its chunks and layers).
  if (lay.cp > 1 && lay.cp_mode == CpMode::ulysses) {
    // UlyssesAttention's buffers for the same local shape (the rank's NH and kv heads).
    const std::int64_t nkv = rank_kv_heads(cfg, lay.tp);
    e.ring = ulysses_floats(d.B * d.T, int(d.NH), int(nkv), cfg.head_dim()) / (cp_bf16 ? 2 : 1) *
             kFloat;
    e.ulysses = true;
  } else if (lay.cp > 1) {
    e.ring = ring_floats(cfg, lay.tp, d, cp_bf16) * kFloat;
  }

  // GptChunk::init_weights draws the weights into a host vector, then copies them over.
  e.staging = lay.host_memory ? params * kFloat : 0;
  return e;
}

}  // namespace trident::model
