// Predicted peak bytes of one rank (see trident/model/memory.hpp). Each term repeats the size
// arithmetic of the allocation it stands for; the comments name it.
#include "trident/model/memory.hpp"

#include <algorithm>
#include <cstdio>

namespace trident::model {

namespace {
constexpr std::int64_t kFloat = sizeof(float);
}

std::int64_t MemoryEstimate::peak() const {
  return weights + gradients + optimizer + scratch + std::max(activations, staging);
}

std::string format_bytes(std::int64_t bytes) {
  // A unit per size, so that a tiny model's report does not read "0.0 MiB".
  const double b = double(bytes);
  char s[32];
  if (b >= 1024.0 * 1048576.0)
    std::snprintf(s, sizeof s, "%.2f GiB", b / (1024.0 * 1048576.0));
  else if (b >= 1048576.0)
    std::snprintf(s, sizeof s, "%.1f MiB", b / 1048576.0);
  else
    std::snprintf(s, sizeof s, "%.1f KiB", b / 1024.0);
  return s;
}

std::string MemoryEstimate::describe() const {
  std::string d = "peak " + format_bytes(peak()) + " = weights " + format_bytes(weights) +
                  " + gradients " + format_bytes(gradients) + " + optimizer " +
                  format_bytes(optimizer) + " + activations " + format_bytes(activations) +
                  " + scratch " + format_bytes(scratch);
  if (staging > activations) d += " (start-up staging " + format_bytes(staging) + " > activations)";
  return d;
}

MemoryEstimate predict_memory(const ModelConfig& cfg, const MemoryLayout& lay) {
  MemoryEstimate e;
  const std::vector<StageLayout> chunks = chunk_layouts(cfg, lay.pp, lay.vpp, lay.pp_rank);
  std::int64_t params = 0;
  for (const ShardSpec& s : gpt_param_specs(cfg, chunks, lay.tp_rank, lay.tp))
    params += s.local_numel();
  const bool head = std::any_of(chunks.begin(), chunks.end(),
                                [](const StageLayout& c) { return c.has_head; });
  const int L = chunks.empty() ? 0 : chunks[0].last_layer - chunks[0].first_layer;

  // GptChunk's dimensions (its constructor).
  const std::int64_t B = lay.micro_batch, T = cfg.seq_len, C = cfg.d_model;
  const std::int64_t N = B * T, NH = cfg.n_head / lay.tp, Ca = C / lay.tp,
                     Vl = vocab_per_rank(cfg.vocab_size, lay.tp);
  // Llama: q | k | v columns with this rank's kv heads (all of them when replicated), the MLP
  // at ffn_hidden / tp with its first product twice as wide (gate | up).
  const std::int64_t kv = cfg.kv_heads(), hd = cfg.head_dim();
  const std::int64_t C3 = cfg.llama() ? Ca + 2 * (kv >= lay.tp ? kv / lay.tp : kv) * hd
                                      : 3 * C / lay.tp;
  const std::int64_t F = cfg.d_ff() / lay.tp, F1 = cfg.llama() ? 2 * F : F;
  const std::int64_t Nr = lay.sequence_parallel ? N / lay.tp : N;

  // params_, grads_; ZeRO-1: GradSync's shard_grads_ and AdamW's moments over the shard.
  const std::int64_t shard = lay.zero1 && lay.dp > 1 ? (params + lay.dp - 1) / lay.dp : params;
  e.weights = params * kFloat;
  e.gradients = (params + (lay.zero1 && lay.dp > 1 ? shard : 0)) * kFloat;
  e.optimizer = 2 * shard * kFloat;

  // One layer's stash (GptChunk::layer_store_size): ln1, qkv, atty, ln2, fch, fch_gelu over
  // all rows; res2 and the LayerNorm statistics over this rank's rows; the attention LSE.
  const std::int64_t layer_store = N * (C + C3 + Ca + C + F1 + F) + Nr * (4 + C) + B * NH * T;
  // GptChunk::make_activations: boundary buffers, the layers' stash, the zero-bubble
  // gradient stash, the head's LayerNorm.
  std::int64_t per_mb = Nr * C * (3 + std::max(1, L));
  // Selective recompute keeps one layer's attention output, LSE and GELU output, shared.
  const std::int64_t inner = N * Ca + B * NH * T + N * F;
  if (lay.recompute == Recompute::none) per_mb += L * layer_store;
  if (lay.recompute == Recompute::selective) per_mb += L * (layer_store - inner);
  if (lay.split_backward) per_mb += std::max<std::int64_t>(1, L * (N * (2 * C + F1 + C3) + 2 * Nr * C));
  if (head) per_mb += N * C + 2 * Nr;
  e.activations_per_microbatch = per_mb * kFloat;
  e.activations = std::max(1, lay.peak_stash) * per_mb * kFloat;

  // The backward's shared buffers (dres_, dbuf_, dqkv_, dfch_, dgelu_), sequence
  // parallelism's gathers, the head's logits and loss, full recomputation's one layer.
  std::int64_t scratch = N * C * 2 + N * C3 + N * F1 + N * F + 2 * C;
  if (lay.sequence_parallel) scratch += N * C + Nr * C;
  if (head) scratch += N * Vl + 5 * N;
  if (lay.recompute == Recompute::full) scratch += layer_store;
  if (lay.recompute == Recompute::selective) scratch += inner;
  e.scratch = scratch * kFloat;

  // GptChunk::init_weights draws the weights into a host vector, then copies them over.
  e.staging = lay.host_memory ? params * kFloat : 0;
  return e;
}

}  // namespace trident::model
