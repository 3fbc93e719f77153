// The weights file: /model tensors and the root attributes (see trident/io/weights.hpp).
#include "trident/io/weights.hpp"

#include "trident/io/format.hpp"
#include "trident/io/tensor_io.hpp"

namespace trident::io {

void write_weights(const std::string& path, MPI_Comm comm, const model::ModelConfig& cfg,
                   const std::vector<model::ShardSpec>& specs, const float* flat,
                   const ShardRole& role) {
  write_tensor_file(path, comm, kWeightsFormat, "model", cfg, specs, flat, role);
}

void read_weights(const std::string& path, MPI_Comm comm, const model::ModelConfig& cfg,
                  const std::vector<model::ShardSpec>& specs, float* flat,
                  const ShardRole& role) {
  h5::File f = open_input(path, comm);
  check_format(f, {kWeightsFormat, kCheckpointFormat});
  check_model_attrs(f, cfg);
  h5::Hid g = h5::open_group(f, "model");
  read_tensors(f, g, cfg, specs, flat, role);
}

model::ModelConfig read_model_config(const std::string& path) {
  h5::File f = h5::open_file(path, h5::Mode::read);
  check_format(f, {kWeightsFormat, kCheckpointFormat});
  return read_model_attrs(f);
}

}  // namespace trident::io
