// trident/io/tensor_io.hpp — the model's tensors in an HDF5 group, written and read by
// ShardSpec: one float32 dataset per logical tensor with its full logical shape
// (FORMAT.md, "Tensors in HDF5"), each rank transferring only its shard as a hyperslab.
// defines: trident::io::all_tensor_specs, tensor_file_bytes, write_tensors, read_tensors,
//          tensor_checksum
//
// Parallel protocol (every rank of the file's communicator, same order):
//   1. create every dataset of the WHOLE model (dataset creation is collective in
//      parallel HDF5, so a rank creates the tensors it does not hold too);
//   2. one collective H5Dwrite/H5Dread per dataset; a rank selects the blocks of its shard
//      along split_dim (c_attn: q, k and v; wte: minus the TP padding rows), under 2D TP
//      (Split::block2d) the rectangles of its row blocks x column blocks, or, holding
//      nothing of the tensor, an empty selection;
//   3. checksums: each rank hashes the elements it is responsible for (ShardRole), one
//      MPI_Allreduce sums them, and the sum becomes the dataset's `checksum` attribute
//      (written) or is compared with it (read).
//
// The checksum (uint64 attribute `checksum`) of a tensor x, flattened row-major:
//   sum over i of mix(mix(i + 0x9E3779B97F4A7C15) ^ bits(x[i]))   (mod 2^64)
// with bits() the float32's bit pattern and mix() SplitMix64's finalizer
//   z = (z ^ z>>30) * 0xBF58476D1CE4E5B9; z = (z ^ z>>27) * 0x94D049BB133111EB; z ^ z>>31.
// A sum does not care which rank hashed which element or in which order, so any layout
// computes it without gathering, and it changes when any element or its position changes
// (bitwise: -0.0 != 0.0). numpy reproduces it in four lines (uint64 arithmetic wraps).
// Datasets without the attribute (files made by other tools) are read unverified.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "trident/io/h5.hpp"
#include "trident/io/shard_role.hpp"
#include "trident/model/spec.hpp"

namespace trident::io {

// ShardRole (trident/io/shard_role.hpp): which shards a rank writes and hashes.

// Every logical tensor of the model, in file order (what every rank creates and visits):
// gpt_param_specs(cfg, {0, n_layer, true, true}, 0, 1).
std::vector<model::ShardSpec> all_tensor_specs(const model::ModelConfig& cfg);

// About the size of a file holding `groups` copies of the model's tensors (a little more,
// never less): what h5::check_room is asked for before such a file is written.
std::int64_t tensor_file_bytes(const model::ModelConfig& cfg, int groups);

// Creates every tensor of cfg's model under `group` (float32, logical shape) and writes
// this rank's shards from `flat` (specs[i].offset indexes it), with a `checksum` attribute
// on each dataset. Collective over file.comm() when the file is parallel. Throws if the
// responsible ranks do not cover every element exactly once (a layout bug).
void write_tensors(const h5::File& file, hid_t group, const model::ModelConfig& cfg,
                   const std::vector<model::ShardSpec>& specs, const float* flat,
                   const ShardRole& role = {});

// Reads this rank's shards of every tensor under `group` into `flat`; TP padding rows are
// set to zero. Checks each dataset exists, is float and has the logical shape. With
// `verify`, each dataset that carries a `checksum` attribute is verified when the
// responsible ranks cover it exactly once (always true for a ShardRole::for_rank grid, and
// for one rank holding the whole model). Collective over file.comm() when parallel.
void read_tensors(const h5::File& file, hid_t group, const model::ModelConfig& cfg,
                  const std::vector<model::ShardSpec>& specs, float* flat,
                  const ShardRole& role = {}, bool verify = true);

// A whole file of one tensor group, written atomically (path + ".tmp", renamed): root
// attributes format = `format` and the model's shape, whatever `extra_attrs` adds at the
// root, then every tensor under `group`. Collective over comm (MPI_COMM_NULL: serial).
void write_tensor_file(const std::string& path, MPI_Comm comm, const char* format,
                       const char* group, const model::ModelConfig& cfg,
                       const std::vector<model::ShardSpec>& specs, const float* flat,
                       const ShardRole& role,
                       const std::function<void(const h5::File&)>& extra_attrs = {});

// The checksum of a whole logical tensor (n elements, row-major), as stored.
std::uint64_t tensor_checksum(const float* data, std::int64_t n);

}  // namespace trident::io
