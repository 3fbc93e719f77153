// `trident convert`: a trident weights file or checkpoint <-> a Hugging Face model folder
// (config.json + safetensors; FORMAT.md, "Hugging Face models"). One process; the whole
// model in one flat buffer with the true vocabulary (the TP padding is the loader's).
#include <algorithm>
#include <filesystem>

#include "commands.hpp"
#include "trident/core/log.hpp"
#include "trident/io/safetensors.hpp"
#include "trident/io/tensor_io.hpp"
#include "trident/io/weights.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/parallel/process.hpp"

namespace trident::app {

namespace {

std::vector<float> whole_model_buffer(const model::ModelConfig& cfg) {
  std::int64_t n = 0;
  for (const auto& s : io::all_tensor_specs(cfg)) n = std::max(n, s.offset + s.local_numel());
  return std::vector<float>(std::size_t(n), 0.0f);
}

}  // namespace

int run_convert(const ConvertArgs& a) {
  parallel::agree([&] {
    const int world = parallel::world_size();
    TRIDENT_CHECK(world == 1, "convert runs on one process (not under mpirun -np ", world, ")");
    TRIDENT_CHECK(a.dtype == "f32" || a.dtype == "bf16", "--dtype ", a.dtype,
                  ": expected f32 or bf16");
    TRIDENT_CHECK(std::filesystem::exists(a.from), a.from, ": no such file or folder");
  });
  const bool import = std::filesystem::is_directory(a.from);
  if (import) {
    TRIDENT_CHECK(a.dtype_given == false && a.max_shard_size.empty(),
                  "--dtype and --max-shard-size are for an export (trident file -> folder); ",
                  a.from, " is a folder, so this is an import");
    const model::ModelConfig cfg = io::read_hf_config(a.from, a.seq_len);
    auto flat = whole_model_buffer(cfg);
    io::read_hf_folder(a.from, cfg, flat.data());
    io::write_weights(a.to, MPI_COMM_NULL, cfg, io::all_tensor_specs(cfg), flat.data());
    log::info("wrote ", a.to, ": ", cfg.arch, " model (vocab_size ", cfg.vocab_size, ", seq_len ",
              cfg.seq_len, ", n_layer ", cfg.n_layer, ", n_head ", cfg.n_head, ", d_model ",
              cfg.d_model, ") of ", a.from);
    return 0;
  }
  TRIDENT_CHECK(a.seq_len == 0, "--seq-len is for an import (Hugging Face folder -> trident file); ",
                a.from, " is a file, so this is an export");
  const model::ModelConfig cfg = io::read_model_config(a.from);
  auto flat = whole_model_buffer(cfg);
  io::read_weights(a.from, MPI_COMM_NULL, cfg, io::all_tensor_specs(cfg), flat.data());
  io::HfFolderOptions opt;
  opt.dtype = a.dtype == "bf16" ? io::safetensors::DType::BF16 : io::safetensors::DType::F32;
  if (!a.max_shard_size.empty())
    opt.max_shard_bytes = io::safetensors::parse_size(a.max_shard_size, "--max-shard-size");
  io::write_hf_folder(a.to, cfg, flat.data(), opt);
  log::info("wrote ", a.to, ": ", cfg.llama() ? "LlamaForCausalLM" : "GPT2LMHeadModel", " (",
            a.dtype, ") of ", a.from);
  return 0;
}

}  // namespace trident::app
