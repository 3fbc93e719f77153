// trident/io/safetensors.hpp — Hugging Face's safetensors files and model folders
// (FORMAT.md, "Hugging Face models"): a file is an 8-byte little-endian header length N, N
// bytes of JSON ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// padded with spaces), then the tensors' bytes, offsets relative to the end of the header.
// A folder is config.json plus model.safetensors, or shards model-0000k-of-0000n.safetensors
// listed in model.safetensors.index.json.
// defines: trident::io::safetensors::{DType, TensorInfo, Reader, TensorOut, write_file,
//          bf16_bits, bf16_value, f16_value, parse_size}, trident::io::HfFolderOptions,
//          read_hf_config, read_hf_folder, write_hf_folder, hf_tensor_name
//
// Reading checks the whole header before any tensor byte is read: the header length against
// the file size, the JSON (a real parser: nlohmann-json), every dtype, every shape against
// its data_offsets, the offsets inside the data, sorted without overlaps or holes. A damaged
// or hostile file is one Error naming the file (and the tensor), never an out-of-bounds read.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trident/model/spec.hpp"

namespace trident::io {

namespace safetensors {

// The dtypes trident converts from (to float32, exactly) and to (F32, BF16 on export).
enum class DType { F32, BF16, F16, other };

struct TensorInfo {
  std::string name;
  std::string dtype;  // as in the header ("F32", "BF16", "I64", ...)
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets into the data section
  std::int64_t numel() const;
};

// One file, its header read and checked on construction.
class Reader {
 public:
  explicit Reader(const std::string& path);
  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;  // Error when absent
  std::vector<std::string> names() const;                 // sorted
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor as float32 (F32 copied, BF16 and F16 widened exactly); Error for other dtypes.
  std::vector<float> read_f32(const std::string& name) const;
  // Its raw bytes.
  std::vector<unsigned char> read_raw(const std::string& name) const;

 private:
  std::string path_;
  std::uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorOut {
  std::string name;
  std::vector<std::int64_t> shape;
  const float* data;  // numel floats, row-major
};

// Writes `path` atomically (path + ".tmp", renamed): tensors in the given order, stored as
// `dtype` (F32, or BF16 rounded to nearest even), header padded with spaces to a multiple
// of 8 bytes, `__metadata__` = metadata.
void write_file(const std::string& path, const std::vector<TensorOut>& tensors, DType dtype,
                const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// float32 <-> bfloat16 (round to nearest even; NaN stays NaN) and float16 -> float32.
std::uint16_t bf16_bits(float x);
float bf16_value(std::uint16_t bits);
float f16_value(std::uint16_t bits);

// "5GB" (10^9), "500MiB" (2^20), "1000000" (bytes): Hugging Face's --max-shard-size
// spellings. Error naming `what` for anything else or a size <= 0.
std::int64_t parse_size(const std::string& text, const std::string& what);

}  // namespace safetensors

// The model a Hugging Face folder's config.json describes (GPT2LMHeadModel or
// LlamaForCausalLM), checked against what trident runs. seq_len: n_positions /
// max_position_embeddings, or `seq_len` when > 0 (GPT-2: at most n_positions; wpe keeps
// its first seq_len rows).
model::ModelConfig read_hf_config(const std::string& dir, int seq_len = 0);

// The Hugging Face name of a trident tensor (GPT-2: "transformer." + name, wte -> 
// transformer.wte.weight; Llama: the same name).
std::string hf_tensor_name(const model::ModelConfig& cfg, const std::string& trident_name);

// Reads every tensor of cfg's model (all_tensor_specs order and offsets: one process holding
// the whole model, true vocabulary) from the folder's safetensors files into flat, after
// checking every file's header, that every tensor is present with the config's shape, that
// no unknown tensor is left over (GPT-2's attn.bias / attn.masked_bias buffers and Llama's
// rotary_emb.inv_freq are ignored), and that a tied model's lm_head.weight, if present,
// equals the embedding.
void read_hf_folder(const std::string& dir, const model::ModelConfig& cfg, float* flat);

struct HfFolderOptions {
  safetensors::DType dtype = safetensors::DType::F32;  // F32 | BF16
  std::int64_t max_shard_bytes = 0;  // 0: one model.safetensors
};
// Writes config.json and model.safetensors (or shards and their index) into `dir` (created
// when missing) from flat (all_tensor_specs order). Refuses, before writing anything, a
// folder holding safetensors files or an index this export would not overwrite.
void write_hf_folder(const std::string& dir, const model::ModelConfig& cfg, const float* flat,
                     const HfFolderOptions& opt);

}  // namespace trident::io
