// ShardSpecs of GPT-2 parameters under tensor parallelism (see trident/model/spec.hpp).
#include "trident/model/spec.hpp"

#include <algorithm>
#include <cmath>

#include "trident/core/error.hpp"

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

namespace {

struct SpecBuilder {
  int tp_rank, tp_size;
  std::int64_t offset;
  std::vector<ShardSpec> specs;

  ShardSpec& add(std::string name, std::vector<std::int64_t> shape, Init init, float std_dev,
                 int layer) {
    ShardSpec s;
    s.name = std::move(name);
    s.shape = shape;
    s.local_shape = shape;
    s.init = init;
    s.init_std = std_dev;
    s.weight_decay = shape.size() == 2;
    s.layer = layer;
    specs.push_back(std::move(s));
    return specs.back();
  }
  // Contiguous split of `extent` (padded up to a multiple of tp_size) along dim.
  void split_contiguous(ShardSpec& s, int dim) {
    std::int64_t extent = s.shape[dim];
    std::int64_t per = (extent + tp_size - 1) / tp_size;
    std::int64_t start = per * tp_rank;
    std::int64_t count = std::max<std::int64_t>(0, std::min(extent, start + per) - start);
    s.split = Split::contiguous;
    s.split_dim = dim;
    s.local_shape[dim] = per;
    s.blocks = {{start, 0, count}};
  }
  // c_attn: three blocks (q, k, v) of d_model columns, each split by heads.
  void split_qkv(ShardSpec& s, int dim, std::int64_t d_model) {
    std::int64_t per = d_model / tp_size;
    s.split = Split::qkv;
    s.split_dim = dim;
    s.local_shape[dim] = 3 * per;
    s.blocks.clear();
    for (int b = 0; b < 3; ++b) s.blocks.push_back({b * d_model + per * tp_rank, b * per, per});
  }
  void finish() {
    for (auto& s : specs) {
      s.offset = offset;
      offset += s.local_numel();
    }
  }
};

// Llama's rows (FORMAT.md's names; [out, in] linears), in flat-buffer order.
void add_llama(SpecBuilder& b, const ModelConfig& cfg, bool has_embedding, bool has_head,
               const std::vector<int>& layers) {
  const std::int64_t C = cfg.d_model, V = cfg.vocab_size, HD = cfg.head_dim();
  const std::int64_t Q = std::int64_t(cfg.n_head) * HD, KV = std::int64_t(cfg.kv_heads()) * HD;
  const std::int64_t F = cfg.d_ff();
  TRIDENT_CHECK(F % b.tp_size == 0, "model.ffn_hidden = ", F,
                " must be divisible by parallel.tp = ", b.tp_size);
  const bool kv_split = cfg.kv_heads() >= b.tp_size;
  TRIDENT_CHECK(kv_split ? cfg.kv_heads() % b.tp_size == 0 : b.tp_size % cfg.kv_heads() == 0,
                "model.n_kv_head = ", cfg.kv_heads(), " and parallel.tp = ", b.tp_size,
                ": one must divide the other");
  const float std0 = 0.02f, std_proj = 0.02f / std::sqrt(2.0f * float(cfg.n_layer));
  if (has_embedding || (has_head && cfg.tie_embeddings)) {
    ShardSpec& e = b.add("model.embed_tokens.weight", {V, C}, Init::normal, std0, -1);
    b.split_contiguous(e, 0);
    e.tied = cfg.tie_embeddings;
  }
  for (int l : layers) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    b.add(p + "input_layernorm.weight", {C}, Init::ones, 0, l).norm = true;
    b.split_contiguous(b.add(p + "self_attn.q_proj.weight", {Q, C}, Init::normal, std0, l), 0);
    for (const char* kv : {"self_attn.k_proj.weight", "self_attn.v_proj.weight"}) {
      ShardSpec& s = b.add(p + kv, {KV, C}, Init::normal, std0, l);
      if (kv_split)
        b.split_contiguous(s, 0);
      else
        s.tp_grad_sum = b.tp_size > 1;
    }
    b.split_contiguous(b.add(p + "self_attn.o_proj.weight", {C, Q}, Init::normal, std_proj, l), 1);
    b.add(p + "post_attention_layernorm.weight", {C}, Init::ones, 0, l).norm = true;
    b.split_contiguous(b.add(p + "mlp.gate_proj.weight", {F, C}, Init::normal, std0, l), 0);
    b.split_contiguous(b.add(p + "mlp.up_proj.weight", {F, C}, Init::normal, std0, l), 0);
    b.split_contiguous(b.add(p + "mlp.down_proj.weight", {C, F}, Init::normal, std_proj, l), 1);
  }
  if (has_head) {
    ShardSpec& n = b.add("model.norm.weight", {C}, Init::ones, 0, -1);
    n.norm = n.in_head = true;
    if (!cfg.tie_embeddings) {
      ShardSpec& h = b.add("lm_head.weight", {V, C}, Init::normal, std0, -1);
      b.split_contiguous(h, 0);
      h.in_head = true;
    }
  }
}

}  // namespace

std::vector<StageLayout> chunk_layouts(const ModelConfig& cfg, int pp, int vpp, int pp_rank) {
  TRIDENT_CHECK(pp >= 1 && vpp >= 1 && pp_rank >= 0 && pp_rank < pp, "bad pipeline placement: ",
                "rank ", pp_rank, " of pp = ", pp, ", vpp = ", vpp);
  const int stages = pp * vpp;
  TRIDENT_CHECK(cfg.n_layer % stages == 0, "model.n_layer = ", cfg.n_layer,
                " is not divisible by parallel.pp * parallel.vpp = ", pp, " * ", vpp);
  const int per = cfg.n_layer / stages;
  std::vector<StageLayout> chunks;
  for (int c = 0; c < vpp; ++c) {
    const int v = c * pp + pp_rank;  // virtual stage
    chunks.push_back(StageLayout{v * per, (v + 1) * per, v == 0, v == stages - 1});
  }
  return chunks;
}

std::vector<ShardSpec> gpt_param_specs(const ModelConfig& cfg, const StageLayout& stage,
                                       int tp_rank, int tp_size, std::int64_t offset0) {
  return gpt_param_specs(cfg, std::vector<StageLayout>{stage}, tp_rank, tp_size, offset0);
}

std::vector<ShardSpec> gpt_param_specs(const ModelConfig& cfg,
                                       const std::vector<StageLayout>& chunks, int tp_rank,
                                       int tp_size, std::int64_t offset0) {
  TRIDENT_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "bad TP rank ", tp_rank);
  TRIDENT_CHECK(cfg.n_head % tp_size == 0, "model.n_head = ", cfg.n_head,
                " must be divisible by parallel.tp = ", tp_size);
  const std::int64_t C = cfg.d_model, V = cfg.vocab_size, T = cfg.seq_len;
  const float std0 = 0.02f;
  // GPT-2: residual projections scaled by 1/sqrt(2 * n_layer).
  const float std_proj = 0.02f / std::sqrt(2.0f * float(cfg.n_layer));
  SpecBuilder b{tp_rank, tp_size, offset0, {}};
  bool has_embedding = false, has_head = false;
  std::vector<int> layers;
  for (const StageLayout& stage : chunks) {
    has_embedding = has_embedding || stage.has_embedding;
    has_head = has_head || stage.has_head;
    for (int l = stage.first_layer; l < stage.last_layer; ++l) layers.push_back(l);
  }

  if (cfg.llama()) {
    add_llama(b, cfg, has_embedding, has_head, layers);
    b.finish();
    return std::move(b.specs);
  }
  if (has_embedding || has_head) {
    auto& wte = b.add("wte", {V, C}, Init::normal, std0, -1);
    b.split_contiguous(wte, 0);
    wte.tied = true;
  }
  if (has_embedding) b.add("wpe", {T, C}, Init::normal, std0, -1);
  for (int l : layers) {
    const std::string p = "h." + std::to_string(l) + ".";
    b.add(p + "ln_1.weight", {C}, Init::ones, 0, l).norm = true;
    b.add(p + "ln_1.bias", {C}, Init::zeros, 0, l).norm = true;
    b.split_qkv(b.add(p + "attn.c_attn.weight", {C, 3 * C}, Init::normal, std0, l), 1, C);
    b.split_qkv(b.add(p + "attn.c_attn.bias", {3 * C}, Init::zeros, 0, l), 0, C);
    b.split_contiguous(b.add(p + "attn.c_proj.weight", {C, C}, Init::normal, std_proj, l), 0);
    b.add(p + "attn.c_proj.bias", {C}, Init::zeros, 0, l);
    b.add(p + "ln_2.weight", {C}, Init::ones, 0, l).norm = true;
    b.add(p + "ln_2.bias", {C}, Init::zeros, 0, l).norm = true;
    b.split_contiguous(b.add(p + "mlp.c_fc.weight", {C, 4 * C}, Init::normal, std0, l), 1);
    b.split_contiguous(b.add(p + "mlp.c_fc.bias", {4 * C}, Init::zeros, 0, l), 0);
    b.split_contiguous(b.add(p + "mlp.c_proj.weight", {4 * C, C}, Init::normal, std_proj, l), 0);
    b.add(p + "mlp.c_proj.bias", {C}, Init::zeros, 0, l);
  }
  if (has_head) {
    for (const char* name : {"ln_f.weight", "ln_f.bias"}) {
      ShardSpec& s = b.add(name, {C}, name[5] == 'w' ? Init::ones : Init::zeros, 0, -1);
      s.norm = s.in_head = true;
    }
  }
  b.finish();
  return std::move(b.specs);
}

void for_each_local_element(const ShardSpec& s,
                            const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (s.split == Split::none) {
    for (std::int64_t i = 0, n = s.numel(); i < n; ++i) fn(i, i);
    return;
  }
  // View both tensors as [outer, extent, inner] around the split dimension.
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < s.split_dim; ++d) outer *= s.shape[d];
  for (std::size_t d = s.split_dim + 1; d < s.shape.size(); ++d) inner *= s.shape[d];
  const std::int64_t g_extent = s.shape[s.split_dim], l_extent = s.local_shape[s.split_dim];
  for (std::int64_t o = 0; o < outer; ++o)
    for (const auto& blk : s.blocks)
      for (std::int64_t j = 0; j < blk.count; ++j)
        for (std::int64_t i = 0; i < inner; ++i)
          fn((o * l_extent + blk.local_start + j) * inner + i,
             (o * g_extent + blk.global_start + j) * inner + i);
}

}  // namespace trident::model
