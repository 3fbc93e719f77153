// ShardSpecs of GPT-2 and Llama parameters under tensor parallelism, from their role tables (see trident/model/spec.hpp).
#include "trident/model/spec.hpp"

#include <algorithm>
#include <cmath>

#include "trident/core/error.hpp"
#include "trident/model/gpt.hpp"

namespace trident::model {

std::int64_t ShardSpec::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::int64_t ShardSpec::local_numel() const {
  std::int64_t n = 1;
  for (auto d : local_shape) n *= d;
  return n;
}

int llama_ffn_hidden(int d_model, int multiple_of) {
  const std::int64_t hidden = 8 * std::int64_t(d_model) / 3;
  const std::int64_t m = std::max(1, multiple_of);
  return int((hidden + m - 1) / m * m);
}

int ModelConfig::d_ff() const {
  if (!llama()) return 4 * d_model;
  return ffn_hidden > 0 ? ffn_hidden : llama_ffn_hidden(d_model, ffn_multiple_of);
}

int vocab_per_rank(int vocab_size, int tp_size) { return (vocab_size + tp_size - 1) / tp_size; }

std::int64_t extent(const ModelConfig& cfg, Extent e) {
  switch (e) {
    case Extent::none: return 1;
    case Extent::vocab: return cfg.vocab_size;
    case Extent::seq: return cfg.seq_len;
    case Extent::model: return cfg.d_model;
    case Extent::qkv: return 3 * std::int64_t(cfg.d_model);
    case Extent::ff: return cfg.d_ff();
    case Extent::kv: return std::int64_t(cfg.kv_heads()) * cfg.head_dim();
  }
  return 1;
}

namespace {

// A normalization's weight (ones) and, with a bias role, its bias (zeros), replicated.
void add_norm(std::vector<RoleRow>& rows, Place place, Role weight, Role bias,
              const std::string& name) {
  rows.push_back({weight, place, name + ".weight", Extent::model, Extent::none, Split::none, -1,
                  Init::ones, false, true});
  if (bias != Role::count)
    rows.push_back({bias, place, name + ".bias", Extent::model, Extent::none, Split::none, -1,
                    Init::zeros, false, true});
}

// How Megatron splits a linear layer over TP.
enum class LinearSplit {
  column,    // its outputs (and the bias with them)
  qkv,       // its outputs by q, k and v blocks, each by heads (and the bias)
  kv_heads,  // its outputs by kv heads when there are at least tp of them, else replicated
  row,       // its inputs; the bias is replicated (added once, before the reduction)
};

// A linear layer of a block: weight [in, out] (GPT-2's Conv1D) or [out, in] (out_in:
// Hugging Face's nn.Linear, Llama), normal init (residual_init: a projection into the
// residual stream); with a bias role its bias [out] (zeros).
void add_linear(std::vector<RoleRow>& rows, Role weight, Role bias, const std::string& name,
                Extent in, Extent out, LinearSplit split, bool residual_init = false,
                bool out_in = false) {
  const Split cut = split == LinearSplit::qkv ? Split::qkv : Split::contiguous;
  const int out_dim = out_in ? 0 : 1, in_dim = 1 - out_dim;
  RoleRow w{weight, Place::block, name + ".weight", out_in ? out : in, out_in ? in : out, cut,
            split == LinearSplit::row ? in_dim : out_dim, Init::normal, residual_init};
  w.kv_heads = split == LinearSplit::kv_heads;
  rows.push_back(w);
  if (bias != Role::count)
    rows.push_back({bias, Place::block, name + ".bias", out, Extent::none,
                    split == LinearSplit::row ? Split::none : cut,
                    split == LinearSplit::row ? -1 : 0, Init::zeros});
}

RoleTable gpt2_table() {
  using R = Role;
  using E = Extent;
  RoleTable t{"h.", {}};
  auto& r = t.rows;
  r.push_back({R::token_embedding, Place::tied_embedding, "wte", E::vocab, E::model,
               Split::contiguous, 0});
  r.push_back({R::position_embedding, Place::embedding, "wpe", E::seq, E::model});
  add_norm(r, Place::block, R::attn_norm_weight, R::attn_norm_bias, "ln_1");
  add_linear(r, R::qkv_weight, R::qkv_bias, "attn.c_attn", E::model, E::qkv, LinearSplit::qkv);
  add_linear(r, R::attn_proj_weight, R::attn_proj_bias, "attn.c_proj", E::model, E::model,
             LinearSplit::row, true);
  add_norm(r, Place::block, R::mlp_norm_weight, R::mlp_norm_bias, "ln_2");
  add_linear(r, R::fc_weight, R::fc_bias, "mlp.c_fc", E::model, E::ff, LinearSplit::column);
  add_linear(r, R::fc_proj_weight, R::fc_proj_bias, "mlp.c_proj", E::ff, E::model,
             LinearSplit::row, true);
  add_norm(r, Place::head, R::final_norm_weight, R::final_norm_bias, "ln_f");
  return t;
}

// Llama (FORMAT.md's names, [out, in] linears, no biases): per layer q, k, v adjacent in
// the flat buffer, so that this rank's [q; k; v] rows form one [out, in] matrix (one
// product), and gate, up likewise. Under TP: q, gate, up split by rows (heads / columns of
// the MLP), o and down by columns; k and v by kv heads when n_kv_head >= tp, else
// replicated (every rank holds every kv head; tp_grad_sum).
RoleTable llama_table(bool tied) {
  using R = Role;
  using E = Extent;
  using LS = LinearSplit;
  const Role none = Role::count;
  RoleTable t{"model.layers.", {}};
  auto& r = t.rows;
  r.push_back({R::token_embedding, tied ? Place::tied_embedding : Place::embedding,
               "model.embed_tokens.weight", E::vocab, E::model, Split::contiguous, 0});
  add_norm(r, Place::block, R::attn_norm_weight, none, "input_layernorm");
  add_linear(r, R::qkv_weight, none, "self_attn.q_proj", E::model, E::model, LS::column, false,
             true);
  add_linear(r, R::k_weight, none, "self_attn.k_proj", E::model, E::kv, LS::kv_heads, false, true);
  add_linear(r, R::v_weight, none, "self_attn.v_proj", E::model, E::kv, LS::kv_heads, false, true);
  add_linear(r, R::attn_proj_weight, none, "self_attn.o_proj", E::model, E::model, LS::row, true,
             true);
  add_norm(r, Place::block, R::mlp_norm_weight, none, "post_attention_layernorm");
  add_linear(r, R::fc_weight, none, "mlp.gate_proj", E::model, E::ff, LS::column, false, true);
  add_linear(r, R::up_weight, none, "mlp.up_proj", E::model, E::ff, LS::column, false, true);
  add_linear(r, R::fc_proj_weight, none, "mlp.down_proj", E::ff, E::model, LS::row, true, true);
  add_norm(r, Place::head, R::final_norm_weight, none, "model.norm");
  if (!tied)
    r.push_back({R::lm_head, Place::head, "lm_head.weight", E::vocab, E::model, Split::contiguous,
                 0});
  return t;
}

// The blocks of `part` of `parts` along a dimension of `full` indices, and the local extent:
// contiguous (padded up to a multiple of parts) or qkv (q, k and v thirds, each split).
std::vector<ShardBlock> split_blocks(Split kind, std::int64_t full, int parts, int part,
                                     std::int64_t& local_extent) {
  if (kind == Split::qkv) {
    const std::int64_t third = full / 3, per = third / parts;
    local_extent = 3 * per;
    std::vector<ShardBlock> blocks;
    for (int b = 0; b < 3; ++b) blocks.push_back({b * third + per * part, b * per, per});
    return blocks;
  }
  const std::int64_t per = (full + parts - 1) / parts, start = per * part;
  local_extent = per;
  return {{start, 0, std::max<std::int64_t>(0, std::min(full, start + per) - start)}};
}

// 2D TP (docs/tp2d.md) on the q x q grid, this rank at (r, c): see gpt_param_specs.
void split_2d(ShardSpec& s, const RoleRow& row, int q, int r, int c) {
  const Split col_kind = row.split == Split::qkv ? Split::qkv : Split::contiguous;
  if (s.shape.size() == 1) {  // a bias or a LayerNorm's parameter: by grid column
    s.split = col_kind;
    s.split_dim = 0;
    s.blocks = split_blocks(col_kind, s.shape[0], q, c, s.local_shape[0]);
    s.tp_copy = r;
    return;
  }
  s.split = Split::block2d;
  s.split_dim = 0;
  s.col_blocks = split_blocks(col_kind, s.shape[1], q, c, s.local_shape[1]);
  if (row.place == Place::block) {  // a SUMMA weight: rows by grid row too
    s.blocks = split_blocks(Split::contiguous, s.shape[0], q, r, s.local_shape[0]);
    return;
  }
  // wte, wpe: every row (the vocabulary padded up to a multiple of q, as CrossEntropy2d's
  // blocks are), the same on the grid column's q ranks.
  s.blocks = {{0, 0, s.shape[0]}};
  if (row.rows == Extent::vocab) s.local_shape[0] = (s.shape[0] + q - 1) / q * q;
  s.tp_copy = r;
}

// One RoleRow made into this rank's ShardSpec (offset set later, in table order).
ShardSpec make_spec(const ModelConfig& cfg, const RoleTable& table, const RoleRow& row,
                    int layer, int tp_rank, int tp_size, int q2d) {
  ShardSpec s;
  s.name = layer >= 0 ? table.block_prefix + std::to_string(layer) + "." + row.name : row.name;
  s.shape = {extent(cfg, row.rows)};
  if (row.cols != Extent::none) s.shape.push_back(extent(cfg, row.cols));
  s.local_shape = s.shape;
  s.init = row.init;
  if (row.init == Init::normal)  // residual projections scaled by 1/sqrt(2 * n_layer)
    s.init_std = row.residual_init ? 0.02f / std::sqrt(2.0f * float(cfg.n_layer)) : 0.02f;
  s.weight_decay = s.shape.size() == 2;
  s.layer = layer;
  s.role = row.role;
  s.place = row.place;
  s.norm = row.norm;
  if (q2d > 0) {
    split_2d(s, row, q2d, tp_rank / q2d, tp_rank % q2d);
    return s;
  }
  s.tp_copy = tp_rank;  // until the tensor turns out to be split
  if (row.split == Split::none) return s;
  if (row.kv_heads && cfg.kv_heads() < tp_size) {  // every rank holds every kv head
    s.tp_grad_sum = true;
    return s;
  }
  const int dim = row.split_dim;
  s.split = row.split;
  s.split_dim = dim;
  s.tp_copy = 0;
  // contiguous: padded up to a multiple of tp_size; qkv: q, k and v each split by heads
  s.blocks = split_blocks(row.split, s.shape[std::size_t(dim)], tp_size, tp_rank,
                          s.local_shape[std::size_t(dim)]);
  return s;
}

}  // namespace

const RoleTable& model_roles(const ModelConfig& cfg) {
  static const RoleTable gpt2 = gpt2_table(), llama = llama_table(false),
                         llama_tied = llama_table(true);
  switch (cfg.arch.get()) {  // one line per architecture
    case Arch::gpt2: return gpt2;
    case Arch::llama: return cfg.tie_embeddings ? llama_tied : llama;
  }
  throw Error(str("internal: model.arch #", int(cfg.arch.get()), " has no role table"));
}

std::string stage_layers_problem(const std::vector<int>& stage_layers, int n_layer,
                                 int stages) {
  if (int(stage_layers.size()) != stages)
    return str("expected ", stages, " entries (parallel.pp * parallel.vpp, one per virtual "
               "stage), got ", stage_layers.size());
  std::int64_t sum = 0;
  for (std::size_t v = 0; v < stage_layers.size(); ++v) {
    if (stage_layers[v] < 1)
      return str("entry ", v, " is ", stage_layers[v], "; every virtual stage needs >= 1 layer");
    sum += stage_layers[v];
  }
  if (sum != n_layer)
    return str("the entries sum to ", sum, ", expected model.n_layer = ", n_layer);
  return "";
}

EndCosts stage_end_costs(const ModelConfig& cfg, int tp) {
  // Forward FLOPs per token per TP rank; the backward is ~2x the forward for all of them,
  // so the ratios hold for forward + backward. tp divides the block and the head alike.
  const double d = cfg.d_model, T = cfg.seq_len, V = std::max(1, cfg.vocab_size);
  (void)tp;
  const double block = 24.0 * d * d + 4.0 * T * d;
  EndCosts e;
  e.head = (2.0 * d * V + 5.0 * V) / block;  // logits matmul + softmax / cross-entropy
  e.embedding = 2.0 * d / block;             // the lookup and the positions: a memory pass
  return e;
}

double weight_pass_share(const ModelConfig& cfg) {
  // The block's own q|k|v and MLP widths (its BlockKind), unsplit.
  const ChunkDims w = chunk_dims(cfg, 1, 1, false);
  const double d = cfg.d_model, T = cfg.seq_len, F = cfg.d_ff();
  const double C3 = double(w.C3), F1 = double(w.F1);
  return 2 * d * (C3 + F1) / (2 * d * (C3 + d + F1 + F) + 4 * T * d);
}

namespace {

// n layers over parts of predicted costs extra[i] + their layers, at least `least` each:
// the smallest cap on a part's cost under which the parts hold n layers, then the surplus
// taken off the costliest parts (the first of equals).
std::vector<int> balance_parts(int n, const std::vector<double>& extra, int least) {
  const int parts = int(extra.size());
  auto capacity = [&](double K, int v) {
    return std::max(least, int(std::floor(K - extra[std::size_t(v)] + 1e-9)));
  };
  std::vector<double> caps;  // the costs a part can have
  for (int v = 0; v < parts; ++v)
    for (int l = least; l <= n; ++l) caps.push_back(l + extra[std::size_t(v)]);
  std::sort(caps.begin(), caps.end());
  std::vector<int> layers(std::size_t(parts), least);
  for (double K : caps) {
    std::int64_t sum = 0;
    for (int v = 0; v < parts; ++v) sum += capacity(K, v);
    if (sum < n) continue;
    for (int v = 0; v < parts; ++v) layers[std::size_t(v)] = capacity(K, v);
    for (; sum > n; --sum) {
      int worst = -1;
      for (int v = 0; v < parts; ++v)
        if (layers[std::size_t(v)] > least &&
            (worst < 0 || layers[std::size_t(v)] + extra[std::size_t(v)] >
                              layers[std::size_t(worst)] + extra[std::size_t(worst)] + 1e-9))
          worst = v;
      --layers[std::size_t(worst)];
    }
    break;
  }
  return layers;
}

}  // namespace

std::vector<int> balanced_stage_layers(const ModelConfig& cfg, int stages, int tp,
                                       Placement placement) {
  const int n = cfg.n_layer;
  TRIDENT_CHECK(stages >= 1 && n >= stages, "cannot split model.n_layer = ", n, " over ",
                stages, " virtual stages of >= 1 layer each");
  const EndCosts ends = stage_end_costs(cfg, tp);
  if (placement == Placement::v_shape && stages >= 4 && stages % 2 == 0) {
    // The V: rank r runs virtual stages r and 2pp-1-r, so rank 0 carries both ends. A
    // zero-bubble schedule's step is its busiest rank's work: balance the ranks first (each
    // >= 2 layers), then each rank's two stages.
    const int pp = stages / 2;
    std::vector<double> rank_extra(std::size_t(pp), 0.0);
    rank_extra[0] = ends.embedding + ends.head;
    const std::vector<int> per_rank = balance_parts(n, rank_extra, 2);
    std::vector<int> layers(std::size_t(stages), 0);
    for (int r = 0; r < pp; ++r) {
      const std::vector<double> ends_here =
          r == 0 ? std::vector<double>{ends.embedding, ends.head} : std::vector<double>{0, 0};
      const std::vector<int> two = balance_parts(per_rank[std::size_t(r)], ends_here, 1);
      layers[std::size_t(r)] = two[0];
      layers[std::size_t(stages - 1 - r)] = two[1];
    }
    return layers;
  }
  std::vector<double> extra(std::size_t(stages), 0.0);
  extra.front() += ends.embedding;
  extra.back() += ends.head;
  return balance_parts(n, extra, 1);
}

std::vector<StageLayout> chunk_layouts(const ModelConfig& cfg, int pp, int vpp, int pp_rank,
                                       const std::vector<int>& stage_layers, Placement placement) {
  TRIDENT_CHECK(pp >= 1 && vpp >= 1 && pp_rank >= 0 && pp_rank < pp, "bad pipeline placement: ",
                "rank ", pp_rank, " of pp = ", pp, ", vpp = ", vpp);
  const int stages = pp * vpp;
  std::vector<int> layers = stage_layers;
  if (layers.empty()) {
    TRIDENT_CHECK(cfg.n_layer % stages == 0, "model.n_layer = ", cfg.n_layer,
                  " is not divisible by parallel.pp * parallel.vpp = ", pp, " * ", vpp);
    layers.assign(std::size_t(stages), cfg.n_layer / stages);
  }
  const std::string problem = stage_layers_problem(layers, cfg.n_layer, stages);
  TRIDENT_CHECK(problem.empty(), "parallel.pipeline_layers: ", problem);
  std::vector<int> first(std::size_t(stages) + 1, 0);  // each virtual stage's first layer
  for (int v = 0; v < stages; ++v) first[std::size_t(v) + 1] = first[std::size_t(v)] + layers[std::size_t(v)];
  std::vector<StageLayout> chunks;
  const StageMap map{placement, pp, vpp};
  for (int c = 0; c < vpp; ++c) {
    const int v = map.virtual_stage(pp_rank, c);
    chunks.push_back(StageLayout{first[std::size_t(v)], first[std::size_t(v) + 1], v == 0,
                                 v == stages - 1});
  }
  return chunks;
}

std::vector<ShardSpec> gpt_param_specs(const ModelConfig& cfg, const StageLayout& stage,
                                       int tp_rank, int tp_size, std::int64_t offset0,
                                       bool tp_2d) {
  return gpt_param_specs(cfg, std::vector<StageLayout>{stage}, tp_rank, tp_size, offset0,
                         tp_2d);
}

std::vector<ShardSpec> gpt_param_specs(const ModelConfig& cfg,
                                       const std::vector<StageLayout>& chunks, int tp_rank,
                                       int tp_size, std::int64_t offset0, bool tp_2d) {
  return param_specs(model_roles(cfg), cfg, chunks, tp_rank, tp_size, offset0, tp_2d);
}

std::vector<ShardSpec> param_specs(const RoleTable& table, const ModelConfig& cfg,
                                   const std::vector<StageLayout>& chunks, int tp_rank,
                                   int tp_size, std::int64_t offset0, bool tp_2d) {
  TRIDENT_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "bad TP rank ", tp_rank);
  int q2d = 0;  // the 2D grid's side
  if (tp_2d) {
    while ((q2d + 1) * (q2d + 1) <= tp_size) ++q2d;
    TRIDENT_CHECK(q2d * q2d == tp_size, "2D tensor parallelism needs parallel.tp = q*q, got ",
                  tp_size);
    TRIDENT_CHECK(cfg.arch == Arch::gpt2,
                  "2D tensor parallelism is built for GPT-2 only");
    TRIDENT_CHECK(cfg.n_head % q2d == 0 && cfg.d_model % q2d == 0,
                  "model.n_head = ", cfg.n_head, " and model.d_model = ", cfg.d_model,
                  " must be divisible by ", q2d, " (2D TP on a ", q2d, " x ", q2d, " grid)");
  } else {
    TRIDENT_CHECK(cfg.n_head % tp_size == 0, "model.n_head = ", cfg.n_head,
                  " must be divisible by parallel.tp = ", tp_size);
  }
  if (cfg.llama()) {
    TRIDENT_CHECK(cfg.d_ff() % tp_size == 0, "model.ffn_hidden = ", cfg.d_ff(),
                  " must be divisible by parallel.tp = ", tp_size);
    const int kv = cfg.kv_heads();
    TRIDENT_CHECK(kv >= tp_size ? kv % tp_size == 0 : tp_size % kv == 0,
                  "model.n_kv_head = ", kv, " and parallel.tp = ", tp_size,
                  ": one must divide the other");
  }
  bool has_embedding = false, has_head = false;
  std::vector<int> layers;
  for (const StageLayout& stage : chunks) {
    has_embedding = has_embedding || stage.has_embedding;
    has_head = has_head || stage.has_head;
    for (int l = stage.first_layer; l < stage.last_layer; ++l) layers.push_back(l);
  }
  std::vector<ShardSpec> specs;
  auto add = [&](const RoleRow& row, int layer) {
    specs.push_back(make_spec(cfg, table, row, layer, tp_rank, tp_size, q2d));
  };
  // The embedding's rows, every layer's block rows, then the head's rows.
  for (const RoleRow& row : table.rows)
    if ((row.place == Place::embedding && has_embedding) ||
        (row.place == Place::tied_embedding && (has_embedding || has_head)))
      add(row, -1);
  for (int l : layers)
    for (const RoleRow& row : table.rows)
      if (row.place == Place::block) add(row, l);
  for (const RoleRow& row : table.rows)
    if (row.place == Place::head && has_head) add(row, -1);
  std::int64_t offset = offset0;
  for (ShardSpec& s : specs) {
    s.offset = offset;
    offset += s.local_numel();
  }
  return specs;
}

void for_each_local_run(
    const ShardSpec& s, const std::function<void(std::int64_t, std::int64_t, std::int64_t)>& fn) {
  if (s.split == Split::none) {
    fn(0, 0, s.numel());
    return;
  }
  if (s.split == Split::block2d) {  // each row of a row block: one run per column block
    const std::int64_t g_cols = s.shape[1], l_cols = s.local_shape[1];
    for (const auto& rb : s.blocks)
      for (std::int64_t i = 0; i < rb.count; ++i)
        for (const auto& cb : s.col_blocks)
          if (cb.count > 0)
            fn((rb.local_start + i) * l_cols + cb.local_start,
               (rb.global_start + i) * g_cols + cb.global_start, cb.count);
    return;
  }
  // View both tensors as [outer, extent, inner] around the split dimension: a block's rows
  // are contiguous in both when everything after split_dim is one run (inner).
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < s.split_dim; ++d) outer *= s.shape[d];
  for (std::size_t d = s.split_dim + 1; d < s.shape.size(); ++d) inner *= s.shape[d];
  const std::int64_t g_extent = s.shape[s.split_dim], l_extent = s.local_shape[s.split_dim];
  for (std::int64_t o = 0; o < outer; ++o)
    for (const auto& blk : s.blocks)
      if (blk.count > 0)
        fn((o * l_extent + blk.local_start) * inner, (o * g_extent + blk.global_start) * inner,
           blk.count * inner);
}

void for_each_local_element(const ShardSpec& s,
                            const std::function<void(std::int64_t, std::int64_t)>& fn) {
  for_each_local_run(s, [&](std::int64_t local, std::int64_t global, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) fn(local + i, global + i);
  });
}

}  // namespace trident::model
