// Root attributes shared by every trident HDF5 file (see trident/io/format.hpp).
#include "trident/io/format.hpp"

#include <climits>
#include <optional>
#include <string>

#include "trident/core/error.hpp"

namespace trident::io {

namespace {

std::string quoted_list(std::initializer_list<const char*> v) {
  std::string s;
  std::size_t i = 0;
  for (const char* x : v) {
    s += i == 0 ? "" : (i + 1 == v.size() ? " or " : ", ");
    s += std::string("\"") + x + "\"";
    ++i;
  }
  return s;
}

struct ModelField {
  const char* name;
  int model::ModelConfig::*field;
};
constexpr ModelField kModelFields[] = {
    {"vocab_size", &model::ModelConfig::vocab_size}, {"seq_len", &model::ModelConfig::seq_len},
    {"n_layer", &model::ModelConfig::n_layer},       {"n_head", &model::ModelConfig::n_head},
    {"d_model", &model::ModelConfig::d_model},
};

}  // namespace

void write_format(const h5::File& file, const char* format) {
  h5::write_attr_string(file, "format", format);
  h5::write_attr_int(file, "format_version", kFormatVersion);
}

std::string check_format(const h5::File& file, std::initializer_list<const char*> accepted) {
  if (!h5::has_attr(file, "format"))
    fail(file.path(), ": no 'format' attribute, expected format = ", quoted_list(accepted),
         " (not a trident file?)");
  std::string format = h5::read_attr_string(file, "format");
  bool ok = false;
  for (const char* a : accepted) ok = ok || format == a;
  if (!ok) fail(file.path(), ": format = \"", format, "\", expected ", quoted_list(accepted));
  std::int64_t version = h5::read_attr_int(file, "format_version");
  if (version != kFormatVersion)
    fail(file.path(), ": format_version = ", version, ", expected ", kFormatVersion,
         " (written by another trident version?)");
  return format;
}

namespace {

// A Llama file also carries arch = "llama" and these, resolved (n_kv_head, ffn_hidden never
// 0); a GPT-2 file has none of them (files written before Llama existed read as GPT-2).
void write_llama_attrs(const h5::File& file, const model::ModelConfig& cfg) {
  h5::write_attr_string(file, "arch", cfg.arch.word());
  h5::write_attr_int(file, "n_kv_head", cfg.kv_heads());
  h5::write_attr_int(file, "ffn_hidden", cfg.d_ff());
  h5::write_attr_int(file, "tie_embeddings", cfg.tie_embeddings ? 1 : 0);
  h5::write_attr_double(file, "rope_theta", cfg.rope_theta);
  h5::write_attr_double(file, "norm_eps", cfg.norm_eps);
}

void read_llama_attrs(const h5::File& file, model::ModelConfig& cfg) {
  for (const char* name : {"n_kv_head", "ffn_hidden"}) {
    const std::int64_t v = h5::read_attr_int(file, name);
    if (v <= 0 || v > INT_MAX)
      fail(file.path(), ": model attribute ", name, " = ", v, ", expected a positive integer");
    (std::string(name) == "n_kv_head" ? cfg.n_kv_head : cfg.ffn_hidden) = int(v);
  }
  const std::int64_t tie = h5::read_attr_int(file, "tie_embeddings");
  if (tie != 0 && tie != 1)
    fail(file.path(), ": model attribute tie_embeddings = ", tie, ", expected 0 or 1");
  cfg.tie_embeddings = tie == 1;
  cfg.rope_theta = h5::read_attr_double(file, "rope_theta");
  cfg.norm_eps = h5::read_attr_double(file, "norm_eps");
  if (cfg.n_head % cfg.n_kv_head != 0)
    fail(file.path(), ": model attribute n_kv_head = ", cfg.n_kv_head,
         " does not divide n_head = ", cfg.n_head);
}

}  // namespace

void write_model_attrs(const h5::File& file, const model::ModelConfig& cfg) {
  for (const auto& f : kModelFields) h5::write_attr_int(file, f.name, cfg.*f.field);
  if (cfg.llama()) write_llama_attrs(file, cfg);
}

model::ModelConfig read_model_attrs(const h5::File& file) {
  model::ModelConfig cfg;
  for (const auto& f : kModelFields) {
    std::int64_t v = h5::read_attr_int(file, f.name);
    if (v <= 0 || v > INT_MAX)
      fail(file.path(), ": model attribute ", f.name, " = ", v, ", expected a positive integer");
    cfg.*f.field = int(v);
  }
  const std::string arch =
      h5::has_attr(file, "arch") ? h5::read_attr_string(file, "arch") : "gpt2";
  const std::optional<model::Arch> parsed = Choice<model::Arch>::find(arch);
  if (!parsed)
    fail(file.path(), ": model attribute arch = \"", arch, "\", expected \"gpt2\" or \"llama\"");
  cfg.arch = *parsed;
  if (cfg.llama()) read_llama_attrs(file, cfg);
  return cfg;
}

void check_model_attrs(const h5::File& file, const model::ModelConfig& deck) {
  model::ModelConfig got = read_model_attrs(file);
  for (const auto& f : kModelFields)
    if (got.*f.field != deck.*f.field)
      fail(file.path(), ": model attribute ", f.name, " = ", got.*f.field,
           " does not match the deck's model.", f.name, " = ", deck.*f.field);
  if (got.arch != deck.arch)
    fail(file.path(), ": model attribute arch = \"", got.arch,
         "\" does not match the deck's model.arch = \"", deck.arch, "\"");
  if (!deck.llama()) return;
  auto differs = [&](const char* key, auto file_value, auto deck_value) {
    if (file_value != deck_value)
      fail(file.path(), ": model attribute ", key, " = ", file_value,
           " does not match the deck's model.", key, " (resolved) = ", deck_value);
  };
  differs("n_kv_head", got.kv_heads(), deck.kv_heads());
  differs("ffn_hidden", got.d_ff(), deck.d_ff());
  differs("tie_embeddings", got.tie_embeddings, deck.tie_embeddings);
  differs("rope_theta", got.rope_theta, deck.rope_theta);
  differs("norm_eps", got.norm_eps, deck.norm_eps);
}

h5::File create_output(const std::string& path, MPI_Comm comm) {
  return comm == MPI_COMM_NULL ? h5::open_file(path, h5::Mode::create)
                               : h5::open_file_parallel(path, comm, h5::Mode::create);
}

h5::File open_input(const std::string& path, MPI_Comm comm) {
  return comm == MPI_COMM_NULL ? h5::open_file(path, h5::Mode::read)
                               : h5::open_file_parallel(path, comm, h5::Mode::read);
}

}  // namespace trident::io
