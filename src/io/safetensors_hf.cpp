// Hugging Face model folders (config.json + safetensors) <-> trident's model: the config
// keys, the tensor names and the sharded layout (see trident/io/safetensors.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "trident/core/error.hpp"
#include "trident/io/safetensors.hpp"
#include "trident/io/tensor_io.hpp"

namespace trident::io {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using safetensors::DType;

constexpr const char* kConfig = "config.json";
constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
}

void write_text_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) fail(tmp, ": cannot write (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail(path, ": cannot rename ", tmp, " to it (", ec.message(), ")");
}

// config.json's keys, each read with a clear error.
struct ConfigKeys {
  std::string path;
  json j;

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  int integer(const char* key) const {
    if (!has(key)) fail(path, ": no key '", key, "'");
    const json& v = j[key];
    if (!v.is_number_integer() || v.get<std::int64_t>() <= 0 ||
        v.get<std::int64_t>() > std::int64_t(1) << 30)
      fail(path, ": ", key, " = ", v.dump(), ", expected a positive integer");
    return int(v.get<std::int64_t>());
  }
  int integer(const char* key, int dflt) const { return has(key) ? integer(key) : dflt; }
  double number(const char* key, double dflt) const {
    if (!has(key)) return dflt;
    const json& v = j[key];
    if (!v.is_number() || !(v.get<double>() > 0))
      fail(path, ": ", key, " = ", v.dump(), ", expected a positive number");
    return v.get<double>();
  }
  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    if (!j[key].is_boolean()) fail(path, ": ", key, " = ", j[key].dump(), ", expected true or false");
    return j[key].get<bool>();
  }
  std::string string(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    if (!j[key].is_string()) fail(path, ": ", key, " = ", j[key].dump(), ", expected a string");
    return j[key].get<std::string>();
  }
  // What trident cannot run: one line naming the key.
  void refuse(bool bad, const char* key, const std::string& what) const {
    if (bad) fail(path, ": ", key, " = ", j.contains(key) ? j[key].dump() : "(absent)", ": ", what);
  }
};

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Buffers Hugging Face checkpoints carry that are not parameters.
bool ignored_buffer(const std::string& name) {
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends(".rotary_emb.inv_freq");
}

std::string shard_name(int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", k, n);
  return buf;
}

bool is_model_file(const std::string& f) {
  return f == kIndex || (f.rfind("model", 0) == 0 && f.size() > 12 &&
                         f.compare(f.size() - 12, 12, ".safetensors") == 0);
}

}  // namespace

model::ModelConfig read_hf_config(const std::string& dir, int seq_len) {
  ConfigKeys c{(fs::path(dir) / kConfig).string(), {}};
  if (!fs::exists(c.path)) fail(dir, ": no ", kConfig, " (not a Hugging Face model folder?)");
  c.j = read_json(c.path);
  if (!c.j.is_object()) fail(c.path, ": not a JSON object");
  const std::string type = c.string("model_type", "");
  model::ModelConfig cfg;
  if (type == "gpt2") {
    cfg.arch = model::Arch::gpt2;
    cfg.vocab_size = c.integer("vocab_size");
    cfg.d_model = c.integer("n_embd");
    cfg.n_layer = c.integer("n_layer");
    cfg.n_head = c.integer("n_head");
    const int positions = c.integer("n_positions", c.has("n_ctx") ? c.integer("n_ctx") : 0);
    if (positions == 0) fail(c.path, ": no key 'n_positions'");
    c.refuse(c.has("n_inner") && c.integer("n_inner") != 4 * cfg.d_model, "n_inner",
             "trident's GPT-2 MLP is 4 * n_embd wide");
    const std::string act = c.string("activation_function", "gelu_new");
    c.refuse(act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast",
             "activation_function", "trident's GPT-2 uses GELU's tanh approximation (gelu_new)");
    c.refuse(std::fabs(c.number("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12, "layer_norm_epsilon",
             "trident's GPT-2 LayerNorms use 1e-5");
    c.refuse(!c.boolean("tie_word_embeddings", true), "tie_word_embeddings",
             "trident's GPT-2 ties the LM head to wte");
    c.refuse(!c.boolean("scale_attn_weights", true), "scale_attn_weights",
             "trident scales attention by 1/sqrt(head_dim)");
    c.refuse(c.boolean("scale_attn_by_inverse_layer_idx", false),
             "scale_attn_by_inverse_layer_idx", "not supported by trident");
    cfg.seq_len = positions;
    if (seq_len > 0) {
      if (seq_len > positions)
        fail("--seq-len ", seq_len, " exceeds the model's n_positions = ", positions,
             " (", c.path, ")");
      cfg.seq_len = seq_len;
    }
  } else if (type == "llama") {
    cfg.arch = model::Arch::llama;
    cfg.vocab_size = c.integer("vocab_size");
    cfg.d_model = c.integer("hidden_size");
    cfg.n_layer = c.integer("num_hidden_layers");
    cfg.n_head = c.integer("num_attention_heads");
    cfg.n_kv_head = c.integer("num_key_value_heads", cfg.n_head);
    cfg.ffn_hidden = c.integer("intermediate_size");
    cfg.rope_theta = c.number("rope_theta", 10000.0);
    cfg.norm_eps = c.number("rms_norm_eps", 1e-6);
    cfg.tie_embeddings = c.boolean("tie_word_embeddings", false);
    cfg.seq_len = seq_len > 0 ? seq_len : c.integer("max_position_embeddings");
    c.refuse(cfg.d_model % cfg.n_head != 0 || (cfg.d_model / cfg.n_head) % 2 != 0,
             "num_attention_heads", "hidden_size / num_attention_heads must be an even integer");
    c.refuse(c.has("head_dim") && c.integer("head_dim") != cfg.d_model / cfg.n_head, "head_dim",
             "trident needs head_dim = hidden_size / num_attention_heads");
    c.refuse(cfg.n_head % cfg.n_kv_head != 0, "num_key_value_heads",
             "must divide num_attention_heads");
    c.refuse(c.string("hidden_act", "silu") != "silu", "hidden_act", "trident's Llama MLP uses silu");
    c.refuse(c.boolean("attention_bias", false), "attention_bias", "trident's Llama has no biases");
    c.refuse(c.boolean("mlp_bias", false), "mlp_bias", "trident's Llama has no biases");
    c.refuse(c.has("rope_scaling"), "rope_scaling", "trident's rotary embedding is unscaled");
  } else {
    fail(c.path, ": model_type = ", c.j.contains("model_type") ? c.j["model_type"].dump() : "(absent)",
         ", expected \"gpt2\" (GPT2LMHeadModel) or \"llama\" (LlamaForCausalLM)");
  }
  return cfg;
}

std::string hf_tensor_name(const model::ModelConfig& cfg, const std::string& name) {
  if (cfg.llama()) return name;
  if (name == "wte" || name == "wpe") return "transformer." + name + ".weight";
  return "transformer." + name;
}

void read_hf_folder(const std::string& dir, const model::ModelConfig& cfg, float* flat) {
  // The files and, for a sharded folder, the index's claim of which tensor is where.
  std::vector<std::string> files;
  std::map<std::string, std::string> claimed;  // tensor -> file, from the index
  const fs::path index = fs::path(dir) / kIndex;
  if (fs::exists(index)) {
    const json j = read_json(index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail(index.string(), ": no 'weight_map' object");
    std::set<std::string> seen;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        fail(index.string(), ": weight_map['", it.key(), "'] is not a file name");
      const std::string f = it.value().get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        fail(index.string(), ": weight_map['", it.key(), "'] = \"", f,
             "\" is not a file name in the folder");
      claimed[it.key()] = f;
      if (seen.insert(f).second) files.push_back(f);
    }
  } else if (fs::exists(fs::path(dir) / kSingle)) {
    files.push_back(kSingle);
  } else {
    fail(dir, ": no ", kSingle, " or ", kIndex);
  }

  // Every header checked before any tensor is read.
  std::vector<std::unique_ptr<safetensors::Reader>> readers;
  std::map<std::string, std::pair<const safetensors::Reader*, std::string>> found;  // canonical
  for (const auto& f : files) {
    readers.push_back(std::make_unique<safetensors::Reader>((fs::path(dir) / f).string()));
    const auto* r = readers.back().get();
    for (const auto& n : r->names()) {
      // GPT-2 files saved from GPT2Model (openai-community/gpt2) lack the "transformer." prefix.
      std::string canonical = n;
      if (!cfg.llama() && n.rfind("transformer.", 0) != 0 && n != "lm_head.weight")
        canonical = "transformer." + n;
      if (found.count(canonical))
        fail(r->path(), ": tensor '", n, "' is also in ", found[canonical].first->path());
      found[canonical] = {r, n};
    }
  }
  for (const auto& [name, f] : claimed) {
    std::string canonical = name;
    if (!cfg.llama() && name.rfind("transformer.", 0) != 0 && name != "lm_head.weight")
      canonical = "transformer." + name;
    auto it = found.find(canonical);
    if (it == found.end() || fs::path(it->second.first->path()).filename() != f)
      fail(index.string(), ": weight_map puts '", name, "' in ", f, ", which does not hold it");
  }

  std::set<std::string> used;
  const auto specs = all_tensor_specs(cfg);
  const float* embedding = nullptr;
  for (const auto& s : specs) {
    const std::string hf = hf_tensor_name(cfg, s.name);
    auto it = found.find(hf);
    if (it == found.end())
      fail(dir, ": no tensor '", hf, "' (", cfg.llama() ? "LlamaForCausalLM" : "GPT2LMHeadModel",
           " with ", cfg.n_layer, " layers, per ", kConfig, ")");
    const auto& [reader, name] = it->second;
    const auto& info = reader->info(name);
    auto want = s.shape;
    // GPT-2's wpe may hold more positions than --seq-len keeps.
    const bool wpe = s.role == model::Role::position_embedding;
    if (wpe && info.shape.size() == 2 && info.shape[0] >= want[0]) want[0] = info.shape[0];
    if (info.shape != want)
      fail(reader->path(), ": tensor '", name, "' has shape ", shape_str(info.shape), ", expected ",
           shape_str(want), " from ", kConfig);
    const auto values = reader->read_f32(name);
    std::copy(values.begin(), values.begin() + s.numel(), flat + s.offset);
    if (s.role == model::Role::token_embedding) embedding = flat + s.offset;
    used.insert(hf);
  }
  for (const auto& [canonical, where] : found) {
    if (used.count(canonical) || ignored_buffer(canonical)) continue;
    if (canonical == "lm_head.weight" && cfg.tied() && embedding) {
      // A tied head saved anyway: it must be the embedding.
      const auto& [reader, name] = where;
      const auto& info = reader->info(name);
      const std::vector<std::int64_t> want{cfg.vocab_size, cfg.d_model};
      if (info.shape != want)
        fail(reader->path(), ": tensor 'lm_head.weight' has shape ", shape_str(info.shape),
             ", expected ", shape_str(want));
      const auto head = reader->read_f32(name);
      for (std::size_t i = 0; i < head.size(); ++i)
        if (head[i] != embedding[i] && !(std::isnan(head[i]) && std::isnan(embedding[i])))
          fail(reader->path(), ": tensor 'lm_head.weight' differs from the token embedding, but ",
               kConfig, " ties them (trident's ", cfg.llama() ? "tie_embeddings" : "GPT-2",
               " shares one matrix)");
      continue;
    }
    fail(where.first->path(), ": tensor '", where.second, "' is not part of trident's ",
         cfg.llama() ? "LlamaForCausalLM" : "GPT2LMHeadModel", " (it would be dropped)");
  }
}

void write_hf_folder(const std::string& dir, const model::ModelConfig& cfg, const float* flat,
                     const HfFolderOptions& opt) {
  const auto specs = all_tensor_specs(cfg);
  const int item = opt.dtype == DType::F32 ? 4 : 2;
  // Shards: whole tensors in file order, a new shard when the next tensor would overflow.
  std::vector<std::vector<safetensors::TensorOut>> shards(1);
  std::int64_t in_shard = 0, total = 0;
  for (const auto& s : specs) {
    const std::int64_t bytes = s.numel() * item;
    if (opt.max_shard_bytes > 0 && in_shard > 0 && in_shard + bytes > opt.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back({hf_tensor_name(cfg, s.name), s.shape, flat + s.offset});
    in_shard += bytes;
    total += bytes;
  }
  const int n = int(shards.size());
  std::vector<std::string> names;
  if (n == 1) {
    names.push_back(kSingle);
  } else {
    for (int k = 1; k <= n; ++k) names.push_back(shard_name(k, n));
    names.push_back(kIndex);
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) fail(dir, ": cannot create the folder (", ec.message(), ")");
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (is_model_file(f) && std::find(names.begin(), names.end(), f) == names.end())
      fail(dir, ": holds ", f, ", which this export would not replace (a model saved before?); ",
           "remove it or choose another folder");
  }

  const std::map<std::string, std::string> meta{{"format", "pt"}};
  nlohmann::ordered_json weight_map;
  for (int k = 0; k < n; ++k) {
    safetensors::write_file((fs::path(dir) / names[std::size_t(k)]).string(),
                            shards[std::size_t(k)], opt.dtype, meta);
    for (const auto& t : shards[std::size_t(k)]) weight_map[t.name] = names[std::size_t(k)];
  }
  if (n > 1) {
    nlohmann::ordered_json idx;
    idx["metadata"] = {{"total_size", total}};
    idx["weight_map"] = weight_map;
    write_text_atomic((fs::path(dir) / kIndex).string(), idx.dump(2) + "\n");
  }

  nlohmann::ordered_json c;
  const char* dtype = opt.dtype == DType::F32 ? "float32" : "bfloat16";
  if (!cfg.llama()) {
    c["architectures"] = {"GPT2LMHeadModel"};
    c["model_type"] = "gpt2";
    c["vocab_size"] = cfg.vocab_size;
    c["n_positions"] = cfg.seq_len;
    c["n_ctx"] = cfg.seq_len;
    c["n_embd"] = cfg.d_model;
    c["n_layer"] = cfg.n_layer;
    c["n_head"] = cfg.n_head;
    c["n_inner"] = nullptr;
    c["activation_function"] = "gelu_new";
    c["layer_norm_epsilon"] = 1e-5;
    c["resid_pdrop"] = 0.0;  // trident trains without dropout
    c["embd_pdrop"] = 0.0;
    c["attn_pdrop"] = 0.0;
    c["initializer_range"] = 0.02;
    c["scale_attn_weights"] = true;
    c["tie_word_embeddings"] = true;
  } else {
    c["architectures"] = {"LlamaForCausalLM"};
    c["model_type"] = "llama";
    c["vocab_size"] = cfg.vocab_size;
    c["hidden_size"] = cfg.d_model;
    c["intermediate_size"] = cfg.d_ff();
    c["num_hidden_layers"] = cfg.n_layer;
    c["num_attention_heads"] = cfg.n_head;
    c["num_key_value_heads"] = cfg.kv_heads();
    c["head_dim"] = cfg.head_dim();
    c["max_position_embeddings"] = cfg.seq_len;
    c["rms_norm_eps"] = cfg.norm_eps;
    c["rope_theta"] = cfg.rope_theta;
    c["rope_scaling"] = nullptr;
    c["hidden_act"] = "silu";
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
    c["attention_dropout"] = 0.0;
    c["initializer_range"] = 0.02;
    c["pretraining_tp"] = 1;
    c["tie_word_embeddings"] = cfg.tie_embeddings;
  }
  c["torch_dtype"] = dtype;
  write_text_atomic((fs::path(dir) / kConfig).string(), c.dump(2) + "\n");
}

}  // namespace trident::io
