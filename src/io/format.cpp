// Root attributes shared by every trident HDF5 file (see trident/io/format.hpp).
#include "trident/io/format.hpp"

#include <climits>

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

void write_model_attrs(const h5::File& file, const model::ModelConfig& cfg) {
  for (const auto& f : kModelFields) h5::write_attr_int(file, f.name, cfg.*f.field);
}

model::ModelConfig read_model_attrs(const h5::File& file) {
  model::ModelConfig cfg;
  for (const auto& f : kModelFields) {
    std::int64_t v = h5::read_attr_int(file, f.name);
    if (v <= 0 || v > INT_MAX)
      fail(file.path(), ": model attribute ", f.name, " = ", v, ", expected a positive integer");
    cfg.*f.field = int(v);
  }
  return cfg;
}

void check_model_attrs(const h5::File& file, const model::ModelConfig& deck) {
  model::ModelConfig got = read_model_attrs(file);
  for (const auto& f : kModelFields)
    if (got.*f.field != deck.*f.field)
      fail(file.path(), ": model attribute ", f.name, " = ", got.*f.field,
           " does not match the deck's model.", f.name, " = ", deck.*f.field);
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
