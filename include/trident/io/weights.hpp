// trident/io/weights.hpp — the weights file (FORMAT.md): the model's tensors under /model,
// root attributes format = "trident-weights", format_version = 1 and the model's shape.
// Written and read collectively by ShardSpec, so any TP/PP/DP layout reads any file.
// defines: trident::io::write_weights, read_weights, read_model_config
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "trident/io/shard_role.hpp"
#include "trident/model/spec.hpp"

namespace trident::io {

// Writes `path` atomically (to path + ".tmp", then renamed) from every rank of comm: each
// rank gives its ShardSpecs (offsets into `flat`) and its role. comm = MPI_COMM_NULL: one
// process without MPI-IO.
void write_weights(const std::string& path, MPI_Comm comm, const model::ModelConfig& cfg,
                   const std::vector<model::ShardSpec>& specs, const float* flat,
                   const ShardRole& role = {});

// Reads this rank's shards of `path` into `flat` after checking the file: format
// "trident-weights" (a checkpoint's /model is accepted too), format_version, model
// attributes equal to cfg, every tensor present, float, of its logical shape, and
// matching its checksum. Collective over comm (or MPI_COMM_NULL).
void read_weights(const std::string& path, MPI_Comm comm, const model::ModelConfig& cfg,
                  const std::vector<model::ShardSpec>& specs, float* flat,
                  const ShardRole& role = {});

// The model's shape from a weights file's (or a checkpoint's) root attributes. Serial.
model::ModelConfig read_model_config(const std::string& path);

}  // namespace trident::io
