// Safetensors files and Hugging Face folders (io/safetensors.hpp): the byte layout, bf16/f16
// conversions, every way a header can be damaged, and the folder's names, shards and checks.
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "io_test_util.hpp"
#include "trident/io/safetensors.hpp"
#include "trident/io/tensor_io.hpp"

using namespace iotest;
namespace io = trident::io;
namespace st = trident::io::safetensors;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file from a header text and a data section (the length written as given).
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               std::uint64_t len) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[std::size_t(i)] = char(len >> (8 * i));
  write_text(path, bytes + header + data);
}
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  write_raw(path, header, data, header.size());
}

std::string open_error(const std::string& path) {
  return error_of([&] { st::Reader r(path); });
}

}  // namespace

TEST(Safetensors, Bf16RoundsToNearestEven) {
  EXPECT_EQ(st::bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(st::bf16_bits(-2.0f), 0xC000);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(st::bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3 * 2^-8: halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up to even.
  EXPECT_EQ(st::bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(st::bf16_bits(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_TRUE(std::isnan(st::bf16_value(st::bf16_bits(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(st::bf16_value(st::bf16_bits(INFINITY)), INFINITY);
  EXPECT_EQ(st::bf16_value(0x3F81), 1.0f + std::ldexp(1.0f, -7));
  for (float x : {0.1f, -3.7f, 1e-30f, 6e30f}) {  // a bf16 value converts back exactly
    const float r = st::bf16_value(st::bf16_bits(x));
    EXPECT_EQ(st::bf16_bits(r), st::bf16_bits(x));
    EXPECT_LE(std::fabs(r - x), std::fabs(x) * std::ldexp(1.0f, -8));
  }
}

TEST(Safetensors, F16Widens) {
  EXPECT_EQ(st::f16_value(0x3C00), 1.0f);
  EXPECT_EQ(st::f16_value(0xC000), -2.0f);
  EXPECT_EQ(st::f16_value(0x7BFF), 65504.0f);
  EXPECT_EQ(st::f16_value(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(st::f16_value(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(st::f16_value(0x7C00), INFINITY);
  EXPECT_TRUE(std::isnan(st::f16_value(0x7E00)));
  EXPECT_TRUE(std::signbit(st::f16_value(0x8000)));
}

TEST(Safetensors, FileLayoutAndRoundTrip) {
  ScratchDir dir;
  const std::vector<float> a{1.5f, -2.25f, 3.0f, 0.1f, 5.0f, 6.0f}, b{7.0f};
  const std::string path = dir / "t.safetensors";
  st::write_file(path, {{"a", {2, 3}, a.data()}, {"b.c", {1}, b.data()}}, st::DType::F32);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  const std::string bytes = read_bytes(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[std::size_t(i)]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 7 * 4);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["a"]["dtype"], "F32");
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json::array({0, 24}));
  EXPECT_EQ(header["b.c"]["data_offsets"], nlohmann::json::array({24, 28}));
  float first;
  std::memcpy(&first, bytes.data() + 8 + n, 4);
  EXPECT_EQ(first, 1.5f);

  st::Reader r(path);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"a", "b.c"}));
  EXPECT_EQ(r.info("a").shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(r.read_f32("a"), a);
  EXPECT_EQ(r.metadata().at("format"), "pt");

  st::write_file(path, {{"a", {2, 3}, a.data()}}, st::DType::BF16);
  st::Reader r16(path);
  EXPECT_EQ(r16.info("a").dtype, "BF16");
  const auto back = r16.read_f32("a");
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(back[i], st::bf16_value(st::bf16_bits(a[i])));
}

TEST(Safetensors, ReadsF16) {
  ScratchDir dir;
  const std::string path = dir / "h.safetensors";
  const std::string data("\x00\x3C\x00\xC0", 4);  // 1.0, -2.0
  write_raw(path, R"({"x":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", data);
  EXPECT_EQ(st::Reader(path).read_f32("x"), (std::vector<float>{1.0f, -2.0f}));
}

TEST(Safetensors, DamagedHeadersAreOneError) {
  ScratchDir dir;
  const std::string p = dir / "bad.safetensors";
  const std::string d8(8, '\0');
  write_text(p, "abc");
  EXPECT_CONTAINS(open_error(p), "too short");
  write_raw(p, "{}", "", 1000);
  EXPECT_CONTAINS(open_error(p), "header length 1000 runs past the end of the file (10 bytes)");
  write_raw(p, "{\"x\": ", "");
  EXPECT_CONTAINS(open_error(p), "header is not valid JSON");
  write_raw(p, "[1,2]", "");
  EXPECT_CONTAINS(open_error(p), "not a JSON object");
  write_raw(p, R"({"x":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", d8);
  EXPECT_CONTAINS(open_error(p), "tensor 'x': unknown dtype 'Q7'");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", d8);
  EXPECT_CONTAINS(open_error(p), "tensor 'x': data_offsets [0, 16] out of range");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8);
  EXPECT_CONTAINS(open_error(p), "out of range");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8);
  EXPECT_CONTAINS(open_error(p), "tensor 'x': shape [3] of F32 is 12 bytes, its data_offsets [0, 8] cover 8");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8);
  EXPECT_CONTAINS(open_error(p), "is not a list of sizes");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[2]}})", d8);
  EXPECT_CONTAINS(open_error(p), "tensor 'x': header entry has no 'data_offsets'");
  write_raw(p,
            R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            d8);
  EXPECT_CONTAINS(open_error(p), "overlaps tensor");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8);
  EXPECT_CONTAINS(open_error(p), "bytes [0, 4) of the data section belong to no tensor");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8);
  EXPECT_CONTAINS(open_error(p), "the tensors cover 4 bytes of the 8-byte data section");
  write_raw(p, R"({"x":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", d8);
  EXPECT_EQ(open_error(p), "");  // a valid file: the dtype matters only when read
  EXPECT_CONTAINS(error_of([&] { st::Reader(p).read_f32("x"); }),
                  "tensor 'x' has dtype I64, expected F32, BF16 or F16");
  EXPECT_CONTAINS(error_of([&] { st::Reader(p).info("nope"); }), "no tensor 'nope'");
  EXPECT_CONTAINS(open_error(dir / "missing.safetensors"), "cannot open");
}

TEST(Safetensors, ParseSize) {
  EXPECT_EQ(st::parse_size("5GB", "s"), 5000000000);
  EXPECT_EQ(st::parse_size("500MiB", "s"), 500LL << 20);
  EXPECT_EQ(st::parse_size("4kb", "s"), 4000);
  EXPECT_EQ(st::parse_size("1000", "s"), 1000);
  EXPECT_CONTAINS(error_of([] { st::parse_size("5 parsecs", "--max-shard-size"); }),
                  "--max-shard-size = '5 parsecs': expected a positive size");
  EXPECT_CONTAINS(error_of([] { st::parse_size("-1GB", "s"); }), "expected a positive size");
}

namespace {

ModelConfig small_llama() {
  ModelConfig c{51, 8, 2, 4, 16};
  c.arch = "llama";
  c.n_kv_head = 2;
  c.ffn_hidden = 24;
  c.rope_theta = 500000.0;
  c.norm_eps = 1e-6;
  return c;
}

// Exports cfg's known values into dir/name; returns the folder.
std::string export_folder(const ScratchDir& dir, const ModelConfig& cfg, const std::string& name,
                          std::int64_t shard = 0, st::DType dtype = st::DType::F32) {
  const auto flat = make_flat(specs_for(cfg));
  const std::string out = dir / name;
  io::write_hf_folder(out, cfg, flat.data(), {dtype, shard});
  return out;
}

std::string import_error(const std::string& folder, int seq_len = 0) {
  return error_of([&] {
    const auto cfg = io::read_hf_config(folder, seq_len);
    std::vector<float> flat(std::size_t(flat_size(specs_for(cfg))));
    io::read_hf_folder(folder, cfg, flat.data());
  });
}

nlohmann::json load_json(const std::string& path) { return nlohmann::json::parse(read_bytes(path)); }
void save_json(const std::string& path, const nlohmann::json& j) { write_text(path, j.dump()); }

}  // namespace

TEST(HfFolder, RoundTripsBothArchitecturesAndShards) {
  ScratchDir dir;
  for (const ModelConfig& cfg : {small_model(), small_llama()}) {
    for (std::int64_t shard : {std::int64_t(0), std::int64_t(600)}) {
      const std::string folder =
          export_folder(dir, cfg, cfg.arch.word() + std::to_string(shard), shard);
      EXPECT_EQ(fs::exists(fs::path(folder) / "model.safetensors.index.json"), shard > 0);
      const auto back = io::read_hf_config(folder);
      EXPECT_EQ(back, cfg) << cfg.arch;
      const auto specs = specs_for(back);
      std::vector<float> flat(std::size_t(flat_size(specs)), kPadding);
      io::read_hf_folder(folder, back, flat.data());
      EXPECT_EQ(mismatches(specs, flat), 0) << cfg.arch << " shard " << shard;
    }
  }
  const auto gpt = load_json(dir / "gpt20/config.json");
  EXPECT_EQ(gpt["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(gpt["n_embd"], 8);
  EXPECT_EQ(gpt["n_positions"], 8);
  const auto llama = load_json(dir / "llama0/config.json");
  EXPECT_EQ(llama["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(llama["num_key_value_heads"], 2);
  EXPECT_EQ(llama["intermediate_size"], 24);
  EXPECT_EQ(llama["rope_theta"], 500000.0);
  EXPECT_EQ(llama["tie_word_embeddings"], false);
  // GPT-2's names carry transformer., the tied head is not written.
  st::Reader r(dir / "gpt20/model.safetensors");
  EXPECT_TRUE(r.has("transformer.wte.weight"));
  EXPECT_TRUE(r.has("transformer.h.1.mlp.c_proj.bias"));
  EXPECT_FALSE(r.has("lm_head.weight"));
  EXPECT_EQ(r.info("transformer.h.0.attn.c_attn.weight").shape, (std::vector<std::int64_t>{8, 24}));
  st::Reader l(dir / "llama0/model.safetensors");
  EXPECT_EQ(l.info("model.layers.0.self_attn.k_proj.weight").shape,
            (std::vector<std::int64_t>{8, 16}));
  EXPECT_TRUE(l.has("lm_head.weight"));
}

TEST(HfFolder, AcceptsHuggingFaceVariants) {
  ScratchDir dir;
  const ModelConfig cfg = small_model();
  const auto specs = specs_for(cfg);
  const auto flat = make_flat(specs);
  // openai-community/gpt2's spelling: no "transformer." prefix, attn.bias buffers, a longer
  // wpe, a tied lm_head saved anyway.
  std::vector<st::TensorOut> t;
  std::vector<std::vector<float>> keep;
  ModelConfig longer = cfg;
  longer.seq_len = 12;
  for (const auto& s : specs_for(longer)) {
    std::string n = io::hf_tensor_name(cfg, s.name).substr(std::string("transformer.").size());
    keep.emplace_back(std::size_t(s.numel()));
    for (std::int64_t i = 0; i < s.numel(); ++i)
      keep.back()[std::size_t(i)] = value_of(s.name, i);
    t.push_back({n, s.shape, keep.back().data()});
  }
  std::vector<float> mask(64, 1.0f);
  t.push_back({"h.0.attn.bias", {1, 1, 8, 8}, mask.data()});
  t.push_back({"lm_head.weight", {51, 8}, keep.front().data()});
  const std::string folder = dir / "gpt2";
  fs::create_directories(folder);
  st::write_file(folder + "/model.safetensors", t, st::DType::F32);
  save_json(folder + "/config.json", {{"model_type", "gpt2"}, {"vocab_size", 51}, {"n_embd", 8},
                                      {"n_layer", 2}, {"n_head", 2}, {"n_positions", 12},
                                      {"layer_norm_epsilon", 1e-5}, {"n_inner", nullptr}});
  EXPECT_EQ(io::read_hf_config(folder).seq_len, 12);
  const auto got = io::read_hf_config(folder, 8);
  EXPECT_EQ(got, cfg);
  std::vector<float> back(std::size_t(flat_size(specs)));
  io::read_hf_folder(folder, got, back.data());
  EXPECT_EQ(mismatches(specs, back), 0);
  EXPECT_CONTAINS(import_error(folder, 13), "--seq-len 13 exceeds the model's n_positions = 12");

  // A head that is not the embedding, under a config that ties them.
  keep.push_back(keep.front());
  keep.back()[3] += 1.0f;
  t.back().data = keep.back().data();
  st::write_file(folder + "/model.safetensors", t, st::DType::F32);
  EXPECT_CONTAINS(import_error(folder, 8), "tensor 'lm_head.weight' differs from the token embedding");
}

TEST(HfFolder, EveryMismatchIsOneError) {
  ScratchDir dir;
  const std::string g = export_folder(dir, small_model(), "g");
  auto cfgj = load_json(g + "/config.json");
  auto with = [&](const std::string& key, const nlohmann::json& v) {
    auto j = cfgj;
    if (v.is_null() && key != "n_inner") j.erase(key); else j[key] = v;
    save_json(g + "/config.json", j);
    return import_error(g);
  };
  EXPECT_CONTAINS(with("n_embd", 12), "model.safetensors: tensor 'transformer.wte.weight' has shape [51, 8], expected [51, 12] from config.json");
  EXPECT_CONTAINS(with("n_layer", 3), "no tensor 'transformer.h.2.ln_1.weight'");
  EXPECT_CONTAINS(with("n_layer", 1), "tensor 'transformer.h.1.attn.c_attn.bias' is not part of trident's GPT2LMHeadModel");
  EXPECT_CONTAINS(with("model_type", "bert"), "config.json: model_type = \"bert\", expected \"gpt2\"");
  EXPECT_CONTAINS(with("n_head", "two"), "config.json: n_head = \"two\", expected a positive integer");
  EXPECT_CONTAINS(with("n_head", nullptr), "config.json: no key 'n_head'");
  EXPECT_CONTAINS(with("activation_function", "relu"), "activation_function = \"relu\"");
  EXPECT_CONTAINS(with("layer_norm_epsilon", 1e-6), "layer_norm_epsilon = 1e-06");
  EXPECT_CONTAINS(with("n_inner", 10), "n_inner = 10");
  save_json(g + "/config.json", cfgj);
  EXPECT_EQ(import_error(g), "");
  write_text(g + "/config.json", "{nope");
  EXPECT_CONTAINS(import_error(g), "config.json: not valid JSON");
  fs::remove(g + "/config.json");
  EXPECT_CONTAINS(import_error(g), "no config.json");

  const std::string l = export_folder(dir, small_llama(), "l");
  auto lj = load_json(l + "/config.json");
  auto lwith = [&](const std::string& key, const nlohmann::json& v) {
    auto j = lj;
    j[key] = v;
    save_json(l + "/config.json", j);
    return import_error(l);
  };
  EXPECT_CONTAINS(lwith("num_key_value_heads", 4), "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [8, 16], expected [16, 16]");
  EXPECT_CONTAINS(lwith("tie_word_embeddings", true), "tensor 'lm_head.weight' differs from the token embedding");
  EXPECT_CONTAINS(lwith("rope_scaling", {{"type", "linear"}}), "rope_scaling");
  EXPECT_CONTAINS(lwith("hidden_act", "gelu"), "hidden_act = \"gelu\"");
  EXPECT_CONTAINS(lwith("attention_bias", true), "attention_bias = true");
  save_json(l + "/config.json", lj);

  // Shards: an index naming a file that is not there, or the wrong file.
  const std::string s = export_folder(dir, small_llama(), "s", 600);
  auto idx = load_json(s + "/model.safetensors.index.json");
  auto bad = idx;
  bad["weight_map"]["model.norm.weight"] = "model-00001-of-00009.safetensors";
  save_json(s + "/model.safetensors.index.json", bad);
  EXPECT_CONTAINS(import_error(s), "model-00001-of-00009.safetensors: cannot open");
  bad = idx;
  bad["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  save_json(s + "/model.safetensors.index.json", bad);
  EXPECT_CONTAINS(import_error(s), "is not a file name in the folder");
  bad = idx;
  bad["weight_map"]["model.norm.weight"] = idx["weight_map"]["model.embed_tokens.weight"];
  save_json(s + "/model.safetensors.index.json", bad);
  EXPECT_CONTAINS(import_error(s), "weight_map puts 'model.norm.weight' in model-00001-of-");
  save_json(s + "/model.safetensors.index.json", idx);
  EXPECT_EQ(import_error(s), "");
  // A truncated shard (the one holding model.norm.weight, the last tensor): one error naming the file, before anything is read.
  const std::string shard = s + "/" + std::string(idx["weight_map"]["model.norm.weight"]);
  fs::resize_file(shard, fs::file_size(shard) - 3);
  EXPECT_CONTAINS(import_error(s), "tensor 'model.norm.weight': data_offsets [0, 64] out of range");

  fs::create_directories(dir / "empty");
  EXPECT_CONTAINS(error_of([&] { io::read_hf_folder(dir / "empty", small_model(), nullptr); }),
                  "no model.safetensors or model.safetensors.index.json");
}

TEST(HfFolder, ExportRefusesAFolderHoldingAnotherModel) {
  ScratchDir dir;
  export_folder(dir, small_llama(), "x", 600);  // shards
  EXPECT_CONTAINS(error_of([&] { export_folder(dir, small_llama(), "x"); }),
                  "which this export would not replace");
  EXPECT_EQ(error_of([&] { export_folder(dir, small_llama(), "x", 600); }), "");  // same files
  fs::create_directories(dir / "y");
  write_text(dir / "y/tokenizer.json", "{}");  // other files are left alone
  EXPECT_EQ(error_of([&] { export_folder(dir, small_model(), "y"); }), "");
  EXPECT_TRUE(fs::exists(dir / "y/tokenizer.json"));
}

// Random damage to a valid file (a byte of the header or data changed, or the file cut
// short): the reader either reads it or throws trident::Error, never anything else (under
// make test-asan: never an out-of-bounds access).
TEST(Safetensors, RandomlyDamagedFilesAreErrorsOrValid) {
  ScratchDir dir;
  const std::vector<float> a(12, 0.5f), b(5, -1.0f);
  const std::string good = dir / "good.safetensors", bad = dir / "bad.safetensors";
  st::write_file(good, {{"a", {3, 4}, a.data()}, {"b", {5}, b.data()}}, st::DType::BF16);
  const std::string bytes = read_bytes(good);
  std::uint64_t state = 12345;
  auto next = [&] { return state = state * 6364136223846793005ULL + 1442695040888963407ULL; };
  int errors = 0, valid = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string damaged = bytes;
    if (trial % 5 == 4) {
      damaged.resize(std::size_t(next() >> 33) % bytes.size());
    } else {
      const std::size_t at = std::size_t(next() >> 33) % damaged.size();
      damaged[at] = char(next() >> 56);
    }
    write_text(bad, damaged);
    try {
      st::Reader r(bad);
      for (const auto& n : r.names()) r.read_f32(n);
      ++valid;
    } catch (const trident::Error&) {
      ++errors;
    }
  }
  EXPECT_EQ(errors + valid, 400);
  EXPECT_GT(errors, 100);  // most damage to a small file is caught
}
