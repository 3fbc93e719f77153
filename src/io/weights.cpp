// The weights file: /model tensors and the root attributes (see trident/io/weights.hpp).
#include "trident/io/weights.hpp"

#include "trident/io/format.hpp"
#include "trident/io/tensor_io.hpp"

namespace trident::io {

void write_weights(const std::string& path, MPI_Comm comm, const model::ModelConfig& cfg,
                   const std::vector<model::ShardSpec>& specs, const float* flat,
                   const ShardRole& role) {
  const std::string tmp = path + ".tmp";
  h5::make_parent_dir(path, comm);
  {
    h5::File f = create_output(tmp, comm);
    write_format(f, kWeightsFormat);
    write_model_attrs(f, cfg);
    {
      h5::Hid g = h5::create_group(f, "model");
      write_tensors(f, g, cfg, specs, flat, role);
    }
    f.flush();
    f.close();
  }
  h5::commit_file(tmp, path, comm);
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
