// `trident grad` files: the batch it reads and the gradient dump it writes.
#include <numeric>

#include "io_test_util.hpp"
#include "trident/io/grad.hpp"
#include "trident/io/h5.hpp"

using namespace iotest;
namespace io = trident::io;
namespace h5 = trident::io::h5;

namespace {
io::Batch sample_batch() {
  io::Batch b;
  b.batch = 3;
  b.seq_len = 5;
  for (int i = 0; i < 15; ++i) {
    b.inputs.push_back((i * 7) % 51);
    b.targets.push_back((i * 7 + 1) % 51);
  }
  return b;
}
}  // namespace

TEST(Grad, DumpRoundTripWithLossAndAttributes) {
  ScratchDir dir;
  const auto cfg = small_model();
  const auto specs = specs_for(cfg);
  const auto grads = make_flat(specs, 7);
  const std::string path = dir / "g.h5";
  io::write_grad_dump(path, MPI_COMM_NULL, cfg, specs, grads.data(), 3.25);
  {
    h5::File f = h5::open_file(path, h5::Mode::read);
    EXPECT_EQ(h5::read_attr_double(f, "loss"), 3.25);
    EXPECT_EQ(h5::read_attr_string(f, "format"), "trident-grad");
    EXPECT_EQ(h5::read_attr_int(f, "d_model"), 8);
    EXPECT_TRUE(h5::exists(f, "grad/h.1.attn.c_attn.bias"));
  }
  std::vector<float> back(grads.size());
  EXPECT_EQ(io::read_grad_dump(path, MPI_COMM_NULL, cfg, specs, back.data()), 3.25);
  EXPECT_EQ(back, grads);
  // A weights file is not a gradient dump.
  EXPECT_EQ(error_of([&] {
              io::read_grad_dump(path, MPI_COMM_NULL, ModelConfig{51, 8, 1, 2, 8}, specs, back.data());
            }),
            path + ": model attribute n_layer = 2 does not match the deck's model.n_layer = 1");
}

TEST(Grad, BatchRoundTrip) {
  ScratchDir dir;
  const std::string path = dir / "b.h5";
  const auto b = sample_batch();
  io::write_batch(path, b);
  auto r = io::read_batch(path, 51);
  EXPECT_EQ(r.batch, 3);
  EXPECT_EQ(r.seq_len, 5);
  EXPECT_EQ(r.inputs, b.inputs);
  EXPECT_EQ(r.targets, b.targets);
  h5::File f = h5::open_file(path, h5::Mode::read);
  h5::Hid ds = h5::open_dataset(f, "inputs");
  h5::Hid t(H5Dget_type(ds));
  EXPECT_GT(H5Tequal(t, H5T_STD_I32LE), 0);  // int32 on disk, as FORMAT.md says
}

TEST(Grad, BatchErrors) {
  ScratchDir dir;
  const auto b = sample_batch();
  const std::string missing = dir / "missing.h5";
  {
    RawFile raw(missing, true);
    raw.dataset("inputs", H5T_STD_I32LE, {3, 5}, H5T_NATIVE_INT32, b.inputs.data());
  }
  EXPECT_EQ(error_of([&] { io::read_batch(missing); }), missing + ": missing dataset /targets");

  const std::string shape = dir / "shape.h5";
  {
    RawFile raw(shape, true);
    raw.dataset("inputs", H5T_STD_I32LE, {3, 5}, H5T_NATIVE_INT32, b.inputs.data());
    raw.dataset("targets", H5T_STD_I32LE, {5, 3}, H5T_NATIVE_INT32, b.targets.data());
  }
  EXPECT_EQ(error_of([&] { io::read_batch(shape); }),
            shape + ": /inputs has shape [3, 5] but /targets has [5, 3], expected the same "
                    "[batch, seq_len]");

  const std::string flt = dir / "float.h5";
  {
    RawFile raw(flt, true);
    raw.dataset("inputs", H5T_IEEE_F32LE, {3, 5});
    raw.dataset("targets", H5T_STD_I32LE, {3, 5}, H5T_NATIVE_INT32, b.targets.data());
  }
  EXPECT_EQ(error_of([&] { io::read_batch(flt); }),
            flt + ": dataset /inputs is float, expected int32 token ids");

  const std::string oned = dir / "1d.h5";
  {
    RawFile raw(oned, true);
    raw.dataset("inputs", H5T_STD_I32LE, {15}, H5T_NATIVE_INT32, b.inputs.data());
    raw.dataset("targets", H5T_STD_I32LE, {15}, H5T_NATIVE_INT32, b.targets.data());
  }
  EXPECT_EQ(error_of([&] { io::read_batch(oned); }),
            oned + ": dataset /inputs has shape [15], expected [batch, seq_len]");

  const std::string big = dir / "big.h5";
  io::write_batch(big, b);
  EXPECT_EQ(error_of([&] { io::read_batch(big, 50); }),
            big + ": /targets[1, 2] = 50 is not a token id in [0, 50) (model.vocab_size = 50)");
}
