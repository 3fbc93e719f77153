// Helpers shared by the io unit tests: scratch directories, model tensors with known
// values, and raw HDF5 writes for making bad files.
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/model/spec.hpp"

namespace iotest {

namespace fs = std::filesystem;
using trident::model::ModelConfig;
using trident::model::ShardSpec;

// Starts MPI if it is not running yet (main.cpp): call it first in a test that uses MPI.
void need_mpi();
// True under mpirun/srun (then MPI is already running).
bool launched_by_mpi();

// A scratch directory per test, under $TRIDENT_TEST_OUT (or the system's temp dir), the
// same on every rank of comm (MPI_COMM_NULL: no MPI); removed when the test passed.
class ScratchDir {
 public:
  explicit ScratchDir(MPI_Comm comm = MPI_COMM_NULL) : comm_(comm) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    long pid = long(::getpid());
    if (comm_ != MPI_COMM_NULL) MPI_Bcast(&pid, 1, MPI_LONG, 0, comm_);
    const char* base = std::getenv("TRIDENT_TEST_OUT");
    path_ = fs::path(base && *base ? base : fs::temp_directory_path().c_str()) /
            ("io-" + std::string(info->test_suite_name()) + "." + info->name() + "-" +
             std::to_string(pid));
    if (rank() == 0) {
      fs::remove_all(path_);
      fs::create_directories(path_);
    }
    if (comm_ != MPI_COMM_NULL) MPI_Barrier(comm_);
  }
  ~ScratchDir() {
    if (comm_ != MPI_COMM_NULL) MPI_Barrier(comm_);
    if (rank() == 0 && !::testing::Test::HasFailure()) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  int rank() const {
    int r = 0;
    if (comm_ != MPI_COMM_NULL) MPI_Comm_rank(comm_, &r);
    return r;
  }

  MPI_Comm comm_;
  fs::path path_;
};

// A small model: vocabulary 51 (not a multiple of 2: TP padding), 2 layers, 2 heads.
inline ModelConfig small_model() { return ModelConfig{51, 8, 2, 2, 8}; }

inline std::vector<ShardSpec> specs_for(const ModelConfig& cfg, int tp_rank = 0, int tp = 1) {
  return trident::model::gpt_param_specs(cfg, {0, cfg.n_layer, true, true}, tp_rank, tp);
}

inline std::int64_t flat_size(const std::vector<ShardSpec>& specs) {
  std::int64_t n = 0;
  for (const auto& s : specs) n = std::max(n, s.offset + s.local_numel());
  return n;
}

// The known value of element `global` of tensor `name` (varies with `salt`, so that the
// parameters and the two moments of a checkpoint differ).
inline float value_of(const std::string& name, std::int64_t global, int salt = 0) {
  std::uint64_t h = trident::rng::uniform_u64(std::uint64_t(salt), trident::rng::key_of(name),
                                              std::uint64_t(global));
  return float(std::int64_t(h % 200001) - 100000) * 1e-4f;
}

constexpr float kPadding = 777.0f;

// A flat buffer holding value_of for every element of the specs; padding = kPadding.
inline std::vector<float> make_flat(const std::vector<ShardSpec>& specs, int salt = 0) {
  std::vector<float> flat(std::size_t(flat_size(specs)), kPadding);
  for (const auto& s : specs)
    trident::model::for_each_local_element(s, [&](std::int64_t l, std::int64_t g) {
      flat[std::size_t(s.offset + l)] = value_of(s.name, g, salt);
    });
  return flat;
}

// Counts elements of the specs that differ from value_of (padding must read as zero).
inline std::int64_t mismatches(const std::vector<ShardSpec>& specs, const std::vector<float>& flat,
                               int salt = 0) {
  std::int64_t bad = 0;
  for (const auto& s : specs) {
    std::vector<char> seen(std::size_t(s.local_numel()), 0);
    trident::model::for_each_local_element(s, [&](std::int64_t l, std::int64_t g) {
      seen[std::size_t(l)] = 1;
      if (flat[std::size_t(s.offset + l)] != value_of(s.name, g, salt)) ++bad;
    });
    for (std::int64_t l = 0; l < s.local_numel(); ++l)
      if (!seen[std::size_t(l)] && flat[std::size_t(s.offset + l)] != 0.0f) ++bad;
  }
  return bad;
}

// Runs fn and returns the trident::Error message it throws ("" when it does not throw).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const trident::Error& e) {
    return e.what();
  }
  return "";
}

// EXPECT_CONTAINS(haystack, needle): the message holds the expected part.
#define EXPECT_CONTAINS(haystack, needle)                                              \
  do {                                                                                 \
    const std::string hay_ = (haystack), needle_ = (needle);                           \
    EXPECT_NE(hay_.find(needle_), std::string::npos) << "\"" << hay_ << "\"\n  lacks \"" \
                                                    << needle_ << "\"";               \
  } while (0)

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Raw HDF5 for bad files (the library's own checks are what is under test).
struct RawFile {
  hid_t id;
  explicit RawFile(const std::string& path, bool create = false) {
    id = create ? H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)
                : H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    if (id < 0) throw std::runtime_error("RawFile: cannot open " + path);
  }
  ~RawFile() { H5Fclose(id); }
  void remove(const std::string& name) const { H5Ldelete(id, name.c_str(), H5P_DEFAULT); }
  // A dataset of `type` and `dims`, written from `data` (of mem_type) when given.
  void dataset(const std::string& name, hid_t type, const std::vector<hsize_t>& dims,
               hid_t mem_type = -1, const void* data = nullptr) const {
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
    hid_t ds = H5Dcreate2(id, name.c_str(), type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    if (data) H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    H5Dclose(ds);
    H5Sclose(space);
    H5Pclose(lcpl);
  }
  void attr_int(const std::string& name, std::int64_t v) const {
    if (H5Aexists(id, name.c_str()) > 0) H5Adelete(id, name.c_str());
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(id, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Sclose(space);
  }
  // A fixed-length string attribute (as numpy bytes would be written).
  void attr_fixed_string(const std::string& name, const std::string& v) const {
    if (H5Aexists(id, name.c_str()) > 0) H5Adelete(id, name.c_str());
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, v.size() + 1);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(id, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, type, v.c_str());
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
  }
  // Reads a whole dataset as `mem_type` values.
  template <typename T>
  std::vector<T> read(const std::string& name, hid_t mem_type) const {
    hid_t ds = H5Dopen2(id, name.c_str(), H5P_DEFAULT);
    hid_t space = H5Dget_space(ds);
    std::vector<T> v(std::size_t(H5Sget_simple_extent_npoints(space)));
    H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Sclose(space);
    H5Dclose(ds);
    return v;
  }
};

}  // namespace iotest
