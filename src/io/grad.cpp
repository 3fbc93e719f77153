// Batch files and gradient dumps for `trident grad` (see trident/io/grad.hpp).
#include "trident/io/grad.hpp"

#include "trident/core/error.hpp"
#include "trident/io/format.hpp"
#include "trident/io/tensor_io.hpp"

namespace trident::io {

namespace {

// One [B, T] integer dataset of a batch file, read as int32.
std::vector<std::int32_t> read_ids(const h5::File& f, const char* name,
                                   std::vector<std::int64_t>& shape) {
  h5::Hid ds = h5::open_dataset(f, name);
  H5T_class_t c = h5::dataset_class(ds);
  if (c != H5T_INTEGER)
    fail(f.path(), ": dataset /", name, " is ", h5::class_name(c), ", expected int32 token ids");
  shape = h5::dataset_shape(ds);
  if (shape.size() != 2 || shape[0] <= 0 || shape[1] <= 0)
    fail(f.path(), ": dataset /", name, " has shape ", h5::shape_str(shape),
         ", expected [batch, seq_len]");
  std::vector<std::int32_t> v(std::size_t(shape[0] * shape[1]));
  if (H5Dread(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    fail(f.path(), ": cannot read dataset /", name);
  return v;
}

void check_ids(const std::string& path, const char* name, const std::vector<std::int32_t>& v,
               int seq_len, int vocab_size) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] < 0 || v[i] >= vocab_size)
      fail(path, ": /", name, "[", i / std::size_t(seq_len), ", ", i % std::size_t(seq_len),
           "] = ", v[i], " is not a token id in [0, ", vocab_size, ") (model.vocab_size = ",
           vocab_size, ")");
}

void write_ids(const h5::File& f, const char* name, const Batch& b,
               const std::vector<std::int32_t>& v) {
  h5::Hid ds = h5::create_dataset(f, name, H5T_STD_I32LE, {b.batch, b.seq_len});
  if (H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    fail(f.path(), ": cannot write dataset /", name);
}

}  // namespace

Batch read_batch(const std::string& path, int vocab_size) {
  h5::File f = h5::open_file(path, h5::Mode::read);
  std::vector<std::int64_t> si, st;
  Batch b;
  b.inputs = read_ids(f, "inputs", si);
  b.targets = read_ids(f, "targets", st);
  if (si != st)
    fail(path, ": /inputs has shape ", h5::shape_str(si), " but /targets has ",
         h5::shape_str(st), ", expected the same [batch, seq_len]");
  b.batch = int(si[0]);
  b.seq_len = int(si[1]);
  if (vocab_size > 0) {
    check_ids(path, "inputs", b.inputs, b.seq_len, vocab_size);
    check_ids(path, "targets", b.targets, b.seq_len, vocab_size);
  }
  return b;
}

void write_batch(const std::string& path, const Batch& b) {
  const std::size_t n = std::size_t(b.batch) * std::size_t(b.seq_len);
  TRIDENT_CHECK(b.batch > 0 && b.seq_len > 0 && b.inputs.size() == n && b.targets.size() == n,
                path, ": write_batch: inputs and targets must hold batch * seq_len ids");
  h5::File f = h5::open_file(path, h5::Mode::create);
  write_ids(f, "inputs", b, b.inputs);
  write_ids(f, "targets", b, b.targets);
  f.close();
}

void write_grad_dump(const std::string& path, MPI_Comm comm, const model::ModelConfig& cfg,
                     const std::vector<model::ShardSpec>& specs, const float* grads, double loss,
                     const ShardRole& role) {
  write_tensor_file(path, comm, kGradFormat, "grad", cfg, specs, grads, role,
                    [loss](const h5::File& f) { h5::write_attr_double(f, "loss", loss); });
}

double read_grad_dump(const std::string& path, MPI_Comm comm, const model::ModelConfig& cfg,
                      const std::vector<model::ShardSpec>& specs, float* grads,
                      const ShardRole& role) {
  h5::File f = open_input(path, comm);
  check_format(f, {kGradFormat});
  check_model_attrs(f, cfg);
  double loss = h5::read_attr_double(f, "loss");
  h5::Hid g = h5::open_group(f, "grad");
  read_tensors(f, g, cfg, specs, grads, role);
  return loss;
}

}  // namespace trident::io
