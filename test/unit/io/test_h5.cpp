// The HDF5 layer: opening errors name the file, HDF5 prints nothing, attributes round-trip.
#include <sys/stat.h>

#include <cerrno>
#include <cmath>

#include "io_test_util.hpp"
#include "trident/io/h5.hpp"

using namespace iotest;
namespace h5 = trident::io::h5;

TEST(H5, OpenErrorsNameTheFileAndTheProblem) {
  ScratchDir dir;
  const std::string missing = dir / "none.h5";
  EXPECT_EQ(error_of([&] { h5::open_file(missing, h5::Mode::read); }), missing + ": no such file");

  const std::string text = dir / "text.h5";
  write_text(text, "this is not HDF5\n");
  EXPECT_EQ(error_of([&] { h5::open_file(text, h5::Mode::read); }), text + ": not an HDF5 file");

  // A file cut short: the signature is there, the rest is not.
  const std::string cut = dir / "cut.h5";
  {
    h5::File f = h5::open_file(cut, h5::Mode::create);
    h5::write_attr_string(f, "pad", std::string(4000, 'x'));
    f.close();
  }
  fs::resize_file(cut, fs::file_size(cut) / 2);
  std::string msg = error_of([&] { h5::open_file(cut, h5::Mode::read); });
  EXPECT_CONTAINS(msg, cut + ": HDF5 cannot open it, truncated or damaged?");
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(H5, HdfErrorStackIsNeverPrinted) {
  ScratchDir dir;
  const std::string path = dir / "a.h5";
  {
    h5::File f = h5::open_file(path, h5::Mode::create);
    f.close();
  }
  write_text(dir / "bad.h5", "garbage");
  fs::resize_file(path, 10);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(error_of([&] { h5::open_file(path, h5::Mode::read); }).empty());
  EXPECT_FALSE(error_of([&] { h5::open_file(dir / "bad.h5", h5::Mode::read); }).empty());
  EXPECT_FALSE(error_of([&] { h5::open_file(dir / "no/such/dir.h5", h5::Mode::create); }).empty());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(H5, AttributesRoundTrip) {
  need_mpi();  // written through MPI-IO on one rank
  ScratchDir dir;
  const std::string path = dir / "attrs.h5";
  const std::string toml = "[model]\nn_layer = 2\nname = \"ünïcode\"\n";
  {
    h5::File f = h5::open_file_parallel(path, MPI_COMM_SELF, h5::Mode::create);
    h5::write_attr_int(f, "i", -1234567890123);
    h5::write_attr_u64(f, "u", 0xFEDCBA9876543210ull);
    h5::write_attr_double(f, "d", 0.1);
    h5::write_attr_string(f, "s", toml);
    h5::write_attr_string(f, "empty", "");
    h5::write_attr_ints(f, "iv", {1, -2, 3});
    h5::write_attr_doubles(f, "dv", {0.5, -1.5});
    h5::write_attr_int(f, "replaced", 1);
    h5::write_attr_string(f, "replaced", "now a string");
    h5::Hid g = h5::create_group(f, "a/b/c");
    h5::write_attr_int(g, "depth", 3);
    g.reset();
    f.close();
  }
  {
    RawFile raw(path);
    raw.attr_fixed_string("fixed", "trident-weights");
  }
  h5::File f = h5::open_file(path, h5::Mode::read);
  EXPECT_EQ(h5::read_attr_int(f, "i"), -1234567890123);
  EXPECT_EQ(h5::read_attr_u64(f, "u"), 0xFEDCBA9876543210ull);
  EXPECT_EQ(h5::read_attr_double(f, "d"), 0.1);
  EXPECT_EQ(h5::read_attr_double(f, "i"), -1234567890123.0);  // integers read as numbers
  EXPECT_EQ(h5::read_attr_string(f, "s"), toml);
  EXPECT_EQ(h5::read_attr_string(f, "empty"), "");
  EXPECT_EQ(h5::read_attr_string(f, "fixed"), "trident-weights");
  EXPECT_EQ(h5::read_attr_ints(f, "iv"), (std::vector<std::int64_t>{1, -2, 3}));
  EXPECT_EQ(h5::read_attr_doubles(f, "dv"), (std::vector<double>{0.5, -1.5}));
  EXPECT_EQ(h5::read_attr_string(f, "replaced"), "now a string");
  EXPECT_TRUE(h5::has_attr(f, "i"));
  EXPECT_FALSE(h5::has_attr(f, "nope"));
  EXPECT_TRUE(h5::exists(f, "a/b/c"));
  EXPECT_TRUE(h5::exists(f, "/a/b"));
  EXPECT_FALSE(h5::exists(f, "a/x/c"));
  h5::Hid g = h5::open_group(f, "/a/b/c");
  EXPECT_EQ(h5::read_attr_int(g, "depth"), 3);
  EXPECT_EQ(h5::object_name(g), "/a/b/c");
  EXPECT_EQ(h5::file_name(g), path);

  EXPECT_EQ(error_of([&] { h5::read_attr_int(f, "s"); }),
            path + ": attribute 's' on / is string, expected an integer");
  EXPECT_EQ(error_of([&] { h5::read_attr_string(f, "d"); }),
            path + ": attribute 'd' on / is float, expected a string");
  EXPECT_EQ(error_of([&] { h5::read_attr_int(f, "iv"); }),
            path + ": attribute 'iv' on / has 3 values, expected one");
  EXPECT_EQ(error_of([&] { h5::read_attr_int(g, "nope"); }),
            path + ": missing attribute 'nope' on /a/b/c");
  EXPECT_EQ(error_of([&] { h5::open_dataset(g, "x"); }), path + ": missing dataset /a/b/c/x");
  EXPECT_EQ(error_of([&] { h5::open_group(f, "zz"); }), path + ": missing group /zz");
  EXPECT_EQ(error_of([&] { h5::open_dataset(f, "a/b"); }), path + ": /a/b is not a dataset");
}

TEST(H5, CommitFilePublishesAtomically) {
  ScratchDir dir;
  const std::string tmp = dir / "x.h5.tmp", final_path = dir / "x.h5";
  write_text(tmp, "new");
  write_text(final_path, "old");
  h5::commit_file(tmp, final_path, MPI_COMM_NULL);
  EXPECT_FALSE(fs::exists(tmp));
  std::ifstream in(final_path);
  std::string s;
  in >> s;
  EXPECT_EQ(s, "new");
  EXPECT_CONTAINS(error_of([&] { h5::commit_file(tmp, final_path, MPI_COMM_NULL); }),
                  final_path + ": cannot rename " + tmp);
}

TEST(H5, ReserveRoomAllocatesUpToTheEndWithoutChangingTheFile) {
  ScratchDir dir;
  const std::string path = dir / "r.bin";
  write_text(path, "contents");
  struct stat before, after;
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  h5::reserve_room(path, 256 << 10);
  h5::reserve_room(path, 4);  // inside the file already: nothing
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_size, before.st_size);  // KEEP_SIZE: nothing a reader sees changes
  // Blocks of 512 bytes: the reservation is allocated (where fallocate is implemented).
  if (after.st_blocks != before.st_blocks) EXPECT_GE(after.st_blocks * 512, (256 << 10) - 8);
  std::ifstream in(path);
  std::string s;
  in >> s;
  EXPECT_EQ(s, "contents");
  const std::string err = error_of([&] { h5::reserve_room(path, (1 << 20) + 8, ENOSPC); });
  EXPECT_CONTAINS(err, path + ": cannot reserve 1.0 MiB for its next write");
  EXPECT_CONTAINS(err, "(disk full?)");
  EXPECT_CONTAINS(error_of([&] { h5::reserve_room(dir / "none.bin", 1); }),
                  dir / "none.bin");
}

TEST(H5, ShapesAndClasses) {
  ScratchDir dir;
  const std::string path = dir / "d.h5";
  h5::File f = h5::open_file(path, h5::Mode::create);
  h5::Hid d = h5::create_dataset(f, "g/x", H5T_IEEE_F32LE, {3, 4});
  EXPECT_EQ(h5::dataset_shape(d), (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(h5::dataset_class(d), H5T_FLOAT);
  EXPECT_EQ(h5::shape_str({3, 4}), "[3, 4]");
  EXPECT_EQ(h5::shape_str({}), "[]");
  h5::Hid e = h5::create_dataset(f, "ext", H5T_STD_I64LE, {0}, [] {
    hid_t p = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t c = 16;
    H5Pset_chunk(p, 1, &c);
    return p;
  }(), {-1});
  hsize_t n = 40;
  EXPECT_GE(H5Dset_extent(e, &n), 0);
  EXPECT_EQ(h5::dataset_shape(e), (std::vector<std::int64_t>{40}));
}
