// trident/io/format.hpp — what every trident HDF5 file carries at its root: the `format`
// and `format_version` attributes, and the model's shape (vocab_size, seq_len, n_layer,
// n_head, d_model as integers), with the checks that turn a wrong file into one line.
// defines: trident::io::kFormatVersion, kWeightsFormat, kCheckpointFormat, kGradFormat,
//          write_format, check_format, write_model_attrs, read_model_attrs,
//          check_model_attrs, create_output, open_input
#pragma once

#include <initializer_list>
#include <string>

#include "trident/io/h5.hpp"
#include "trident/model/spec.hpp"

namespace trident::io {

inline constexpr int kFormatVersion = 1;  // of every format below
inline constexpr const char* kWeightsFormat = "trident-weights";
inline constexpr const char* kCheckpointFormat = "trident-checkpoint";
inline constexpr const char* kGradFormat = "trident-grad";

// Root attributes format = `format`, format_version = kFormatVersion.
void write_format(const h5::File& file, const char* format);
// Checks `format` is one of `accepted` and format_version is kFormatVersion; returns the
// format found. Errors: "W.h5: format = "x", expected "trident-weights"", "W.h5: no
// 'format' attribute, expected format = "trident-weights" (not a trident file?)",
// "W.h5: format_version = 2, expected 1 (written by another trident version?)".
std::string check_format(const h5::File& file, std::initializer_list<const char*> accepted);

void write_model_attrs(const h5::File& file, const model::ModelConfig& cfg);
// Reads and checks (positive integers) the model attributes.
model::ModelConfig read_model_attrs(const h5::File& file);
// Errors when the file's model differs from the deck's: "W.h5: model attribute n_layer = 2
// does not match the deck's model.n_layer = 4".
void check_model_attrs(const h5::File& file, const model::ModelConfig& deck);

// Opens `path` for writing (Mode::create) or reading through MPI-IO on comm, or serially
// when comm is MPI_COMM_NULL.
h5::File create_output(const std::string& path, MPI_Comm comm);
h5::File open_input(const std::string& path, MPI_Comm comm);

}  // namespace trident::io
