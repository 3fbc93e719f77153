// Tensors by ShardSpec and the weights file: layout on disk, round trips, shards of other
// layouts, checksums, and every way a weights file can be wrong.
#include "io_test_util.hpp"
#include "trident/io/format.hpp"
#include "trident/io/tensor_io.hpp"
#include "trident/io/weights.hpp"

using namespace iotest;
namespace io = trident::io;
namespace h5 = trident::io::h5;

namespace {

// A good weights file of the small model (serial writer).
std::string good_weights(const ScratchDir& dir, const std::string& name = "w.h5") {
  const auto cfg = small_model();
  const auto specs = specs_for(cfg);
  const auto flat = make_flat(specs);
  const std::string path = dir / name;
  io::write_weights(path, MPI_COMM_NULL, cfg, specs, flat.data());
  return path;
}

std::string read_error(const std::string& path, const ModelConfig& cfg = small_model()) {
  const auto specs = specs_for(cfg);
  std::vector<float> flat(std::size_t(flat_size(specs)));
  return error_of([&] { io::read_weights(path, MPI_COMM_NULL, cfg, specs, flat.data()); });
}

}  // namespace

TEST(Weights, FileLayoutIsFormatMd) {
  ScratchDir dir;
  const auto cfg = small_model();
  const std::string path = good_weights(dir);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  h5::File f = h5::open_file(path, h5::Mode::read);
  EXPECT_EQ(h5::read_attr_string(f, "format"), "trident-weights");
  EXPECT_EQ(h5::read_attr_int(f, "format_version"), 1);
  EXPECT_EQ(h5::read_attr_int(f, "vocab_size"), 51);
  EXPECT_EQ(h5::read_attr_int(f, "seq_len"), 8);
  EXPECT_EQ(h5::read_attr_int(f, "n_layer"), 2);
  EXPECT_EQ(h5::read_attr_int(f, "n_head"), 2);
  EXPECT_EQ(h5::read_attr_int(f, "d_model"), 8);
  f.close();

  {
    RawFile raw(path);
    for (const auto& s : io::all_tensor_specs(cfg)) {
      auto v = raw.read<float>("/model/" + s.name, H5T_NATIVE_FLOAT);
      ASSERT_EQ(std::int64_t(v.size()), s.numel()) << s.name;
      std::int64_t bad = 0;
      for (std::int64_t i = 0; i < s.numel(); ++i) bad += v[std::size_t(i)] != value_of(s.name, i);
      EXPECT_EQ(bad, 0) << s.name;
    }
  }
  // Shapes, [in, out] for linears: c_attn [d_model, 3 d_model], c_proj of the MLP [4C, C].
  h5::File g = h5::open_file(path, h5::Mode::read);
  auto shape = [&](const std::string& n) { return h5::dataset_shape(h5::open_dataset(g, n)); };
  EXPECT_EQ(shape("model/wte"), (std::vector<std::int64_t>{51, 8}));
  EXPECT_EQ(shape("model/wpe"), (std::vector<std::int64_t>{8, 8}));
  EXPECT_EQ(shape("model/h.1.attn.c_attn.weight"), (std::vector<std::int64_t>{8, 24}));
  EXPECT_EQ(shape("model/h.1.mlp.c_proj.weight"), (std::vector<std::int64_t>{32, 8}));
  EXPECT_EQ(shape("model/ln_f.bias"), (std::vector<std::int64_t>{8}));
}

TEST(Weights, RoundTripSerialAndThroughMpiIo) {
  need_mpi();
  ScratchDir dir;
  const auto cfg = small_model();
  const auto specs = specs_for(cfg);
  const auto flat = make_flat(specs);
  for (MPI_Comm comm : {MPI_COMM_NULL, MPI_COMM_SELF}) {
    const std::string path = dir / (comm == MPI_COMM_NULL ? "serial.h5" : "mpiio.h5");
    io::write_weights(path, comm, cfg, specs, flat.data());
    std::vector<float> back(flat.size(), -1.0f);
    io::read_weights(path, comm, cfg, specs, back.data());
    EXPECT_EQ(back, flat) << path;
    EXPECT_EQ(io::read_model_config(path), cfg);
  }
}

TEST(Weights, ReadsTp2ShardsOfASerialFile) {
  ScratchDir dir;
  const auto cfg = small_model();
  const std::string path = good_weights(dir);
  for (int r = 0; r < 2; ++r) {
    const auto specs = specs_for(cfg, r, 2);
    std::vector<float> flat(std::size_t(flat_size(specs)), kPadding);
    io::read_weights(path, MPI_COMM_NULL, cfg, specs, flat.data(), io::ShardRole::for_rank(r, 0, 0));
    EXPECT_EQ(mismatches(specs, flat), 0) << "tp_rank " << r;  // padding rows read as zero
  }
}

// 2D TP (tp = 4 as 2 x 2): each rank's hyperslabs are its blocks (two split dims), wte's
// padding row reads as zero; the ranks of grid row 1 hold copies and verify nothing.
TEST(Weights, ReadsTp2dBlocksOfASerialFile) {
  ScratchDir dir;
  const auto cfg = small_model();
  const std::string path = good_weights(dir);
  for (int r = 0; r < 4; ++r) {
    const auto specs =
        trident::model::gpt_param_specs(cfg, {0, cfg.n_layer, true, true}, r, 4, 0, true);
    std::vector<float> flat(std::size_t(flat_size(specs)), kPadding);
    io::read_weights(path, MPI_COMM_NULL, cfg, specs, flat.data(), io::ShardRole::for_rank(r, 0, 0));
    EXPECT_EQ(mismatches(specs, flat), 0) << "tp_rank " << r;
  }
}

TEST(Weights, ATensorTwiceOnOneRankIsWrittenOnceAndReadTwice) {
  // pp = 1, vpp = 2: the rank's first chunk (embedding) and last chunk (head) both hold wte.
  ScratchDir dir;
  const auto cfg = small_model();
  auto specs = trident::model::gpt_param_specs(cfg, {0, 1, true, false}, 0, 1);
  auto more = trident::model::gpt_param_specs(cfg, {1, 2, false, true}, 0, 1, flat_size(specs));
  specs.insert(specs.end(), more.begin(), more.end());
  ASSERT_EQ(std::count_if(specs.begin(), specs.end(), [](auto& s) { return s.name == "wte"; }), 2);
  const auto flat = make_flat(specs);
  const std::string path = dir / "vpp.h5";
  io::write_weights(path, MPI_COMM_NULL, cfg, specs, flat.data());
  std::vector<float> back(flat.size(), 0.0f);
  io::read_weights(path, MPI_COMM_NULL, cfg, specs, back.data());
  EXPECT_EQ(back, flat);
}

TEST(Weights, ChecksumIsTheWholeTensorsAndCatchesACorruptElement) {
  ScratchDir dir;
  const auto cfg = small_model();
  const std::string path = good_weights(dir);
  {
    h5::File f = h5::open_file(path, h5::Mode::read);
    h5::Hid ds = h5::open_dataset(f, "model/h.0.mlp.c_fc.weight");
    std::vector<float> whole(8 * 32);
    for (std::size_t i = 0; i < whole.size(); ++i)
      whole[i] = value_of("h.0.mlp.c_fc.weight", std::int64_t(i));
    EXPECT_EQ(h5::read_attr_u64(ds, "checksum"), io::tensor_checksum(whole.data(), 8 * 32));
    whole[5] = -whole[5];
    EXPECT_NE(h5::read_attr_u64(ds, "checksum"), io::tensor_checksum(whole.data(), 8 * 32));
  }
  {
    // Flip one element on disk.
    RawFile raw(path);
    hid_t ds = H5Dopen2(raw.id, "/model/h.0.mlp.c_fc.weight", H5P_DEFAULT);
    hid_t fs_ = H5Dget_space(ds);
    hsize_t start[2] = {3, 7}, count[2] = {1, 1};
    H5Sselect_hyperslab(fs_, H5S_SELECT_SET, start, nullptr, count, nullptr);
    hid_t ms = H5Screate_simple(2, count, nullptr);
    float v = 12345.0f;
    H5Dwrite(ds, H5T_NATIVE_FLOAT, ms, fs_, H5P_DEFAULT, &v);
    H5Sclose(ms);
    H5Sclose(fs_);
    H5Dclose(ds);
  }
  EXPECT_EQ(read_error(path),
            path + ": dataset /model/h.0.mlp.c_fc.weight does not match its checksum (the file is "
                   "damaged)");
}

TEST(Weights, RanksThatCoverNothingAreALayoutBug) {
  ScratchDir dir;
  const auto cfg = small_model();
  const auto specs = specs_for(cfg);
  const auto flat = make_flat(specs);
  io::ShardRole replica{false, true, true};
  const std::string path = dir / "w.h5";
  EXPECT_CONTAINS(error_of([&] {
                    io::write_weights(path, MPI_COMM_NULL, cfg, specs, flat.data(), replica);
                  }),
                  path + ".tmp: internal: wte was written with 0 of its 408 elements");
  EXPECT_FALSE(fs::exists(path));  // nothing published
}

TEST(Weights, MissingAndNonHdf5Files) {
  ScratchDir dir;
  EXPECT_EQ(read_error(dir / "nope.h5"), dir / "nope.h5" + ": no such file");
  write_text(dir / "x.h5", "hello");
  EXPECT_EQ(read_error(dir / "x.h5"), dir / "x.h5" + ": not an HDF5 file");
  EXPECT_EQ(error_of([&] { io::read_model_config(dir / "x.h5"); }), dir / "x.h5" + ": not an HDF5 file");
}

TEST(Weights, WrongFormatAttributes) {
  ScratchDir dir;
  const std::string path = good_weights(dir);
  {
    RawFile raw(path);
    raw.attr_fixed_string("format", "trident-grad");
  }
  EXPECT_EQ(read_error(path), path + ": format = \"trident-grad\", expected \"trident-weights\" or "
                                     "\"trident-checkpoint\"");
  {
    RawFile raw(path);
    raw.remove("format");  // H5Ldelete does not remove attributes; H5Adelete does
    H5Adelete(raw.id, "format");
  }
  EXPECT_EQ(read_error(path), path + ": no 'format' attribute, expected format = "
                                     "\"trident-weights\" or \"trident-checkpoint\" (not a "
                                     "trident file?)");
  {
    RawFile raw(path);
    raw.attr_fixed_string("format", "trident-weights");
    raw.attr_int("format_version", 2);
  }
  EXPECT_EQ(read_error(path),
            path + ": format_version = 2, expected 1 (written by another trident version?)");
}

TEST(Weights, ModelAttributesMustMatchTheDeck) {
  ScratchDir dir;
  const std::string path = good_weights(dir);
  ModelConfig deck = small_model();
  deck.n_layer = 3;
  EXPECT_EQ(read_error(path, deck),
            path + ": model attribute n_layer = 2 does not match the deck's model.n_layer = 3");
  deck = small_model();
  deck.vocab_size = 64;
  EXPECT_EQ(read_error(path, deck),
            path + ": model attribute vocab_size = 51 does not match the deck's model.vocab_size = 64");
  {
    RawFile raw(path);
    H5Adelete(raw.id, "d_model");
  }
  EXPECT_EQ(read_error(path), path + ": missing attribute 'd_model' on /");
  EXPECT_EQ(error_of([&] { io::read_model_config(path); }), path + ": missing attribute 'd_model' on /");
}

// model.arch is the file's `arch` attribute, parsed once when read: a Llama file names it, a
// GPT-2 file has none (it reads as gpt2), any other word is refused naming the attribute.
TEST(Weights, TheArchAttributeIsParsedWhenReadAndChecked) {
  ScratchDir dir;
  const std::string gpt2 = good_weights(dir);
  EXPECT_FALSE(h5::has_attr(h5::open_file(gpt2, h5::Mode::read), "arch"));
  EXPECT_EQ(io::read_model_config(gpt2).arch, trident::model::Arch::gpt2);

  ModelConfig llama = small_model();
  llama.arch = trident::model::Arch::llama;
  EXPECT_EQ(read_error(gpt2, llama), gpt2 + ": model attribute arch = \"gpt2\" does not match "
                                            "the deck's model.arch = \"llama\"");
  const auto specs = specs_for(llama);
  const auto flat = make_flat(specs);
  const std::string path = dir / "llama.h5";
  io::write_weights(path, MPI_COMM_NULL, llama, specs, flat.data());
  EXPECT_EQ(h5::read_attr_string(h5::open_file(path, h5::Mode::read), "arch"), "llama");
  EXPECT_EQ(io::read_model_config(path), llama);
  EXPECT_EQ(read_error(path), path + ": model attribute arch = \"llama\" does not match the "
                                     "deck's model.arch = \"gpt2\"");
  {
    RawFile raw(path);
    raw.attr_fixed_string("arch", "mamba");
  }
  EXPECT_EQ(error_of([&] { io::read_model_config(path); }),
            path + ": model attribute arch = \"mamba\", expected \"gpt2\" or \"llama\"");
}

TEST(Weights, DatasetsOfTheWrongShapeOrTypeOrMissing) {
  ScratchDir dir;
  std::string path = good_weights(dir, "shape.h5");
  {
    RawFile raw(path);
    raw.remove("/model/wpe");
    raw.dataset("/model/wpe", H5T_IEEE_F32LE, {4, 8});
  }
  EXPECT_EQ(read_error(path), path + ": dataset /model/wpe has shape [4, 8], expected [8, 8] for "
                                     "the deck's model");
  path = good_weights(dir, "type.h5");
  {
    RawFile raw(path);
    raw.remove("/model/ln_f.bias");
    raw.dataset("/model/ln_f.bias", H5T_STD_I32LE, {8});
  }
  EXPECT_EQ(read_error(path), path + ": dataset /model/ln_f.bias is integer, expected float32");
  path = good_weights(dir, "missing.h5");
  {
    RawFile raw(path);
    raw.remove("/model/h.1.ln_2.weight");
  }
  EXPECT_EQ(read_error(path), path + ": missing dataset /model/h.1.ln_2.weight");
  path = good_weights(dir, "nogroup.h5");
  {
    RawFile raw(path);
    raw.remove("/model");
  }
  EXPECT_EQ(read_error(path), path + ": missing group /model");
}

TEST(Weights, Float64DatasetsFromOtherToolsAreAccepted) {
  // A weights file made by h5py from float64 arrays (no checksums): converted on read.
  ScratchDir dir;
  const auto cfg = small_model();
  const std::string path = dir / "f64.h5";
  {
    RawFile raw(path, true);
    raw.attr_fixed_string("format", "trident-weights");
    raw.attr_int("format_version", 1);
    raw.attr_int("vocab_size", 51);
    raw.attr_int("seq_len", 8);
    raw.attr_int("n_layer", 2);
    raw.attr_int("n_head", 2);
    raw.attr_int("d_model", 8);
    for (const auto& s : io::all_tensor_specs(cfg)) {
      std::vector<double> v(std::size_t(s.numel()));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = value_of(s.name, std::int64_t(i));
      std::vector<hsize_t> dims(s.shape.begin(), s.shape.end());
      raw.dataset("/model/" + s.name, H5T_IEEE_F64LE, dims, H5T_NATIVE_DOUBLE, v.data());
    }
  }
  const auto specs = specs_for(cfg);
  std::vector<float> flat(std::size_t(flat_size(specs)));
  io::read_weights(path, MPI_COMM_NULL, cfg, specs, flat.data());
  EXPECT_EQ(mismatches(specs, flat), 0);
}
