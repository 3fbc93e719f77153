// Parallel HDF5 on two ranks: shards written collectively by a TP, PP or DP layout read
// back serially, serial files read by a parallel layout, a checkpoint resumed in another
// layout, and errors that every rank reports alike. Run with
//   mpirun -np 2 --oversubscribe trident_unit_io --gtest_filter='IoMpi.*'
// (skipped in a single process).
#include "io_test_util.hpp"
#include "trident/io/checkpoint.hpp"
#include "trident/io/tensor_io.hpp"
#include "trident/io/weights.hpp"

using namespace iotest;
namespace io = trident::io;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

#define NEED_TWO_RANKS()                                                      \
  do {                                                                        \
    if (!launched_by_mpi()) GTEST_SKIP() << "needs mpirun -np 2";             \
    int size_ = 0;                                                            \
    MPI_Comm_size(MPI_COMM_WORLD, &size_);                                    \
    if (size_ != 2) GTEST_SKIP() << "needs exactly 2 ranks, have " << size_;  \
  } while (0)

std::vector<ShardSpec> stage_specs(const ModelConfig& cfg, int stage) {
  return trident::model::gpt_param_specs(cfg, {stage, stage + 1, stage == 0, stage == 1}, 0, 1);
}

// The messages of an error on both ranks, as seen by rank 0 ("" when no error).
std::vector<std::string> both(const std::string& msg) {
  int n = int(msg.size()), m = 0;
  std::vector<std::string> out = {msg};
  if (world_rank() == 1) MPI_Send(msg.data(), n, MPI_CHAR, 0, 7, MPI_COMM_WORLD);
  if (world_rank() == 0) {
    MPI_Status st;
    MPI_Probe(1, 7, MPI_COMM_WORLD, &st);
    MPI_Get_count(&st, MPI_CHAR, &m);
    std::string other(std::size_t(m), '\0');
    MPI_Recv(other.data(), m, MPI_CHAR, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    out.push_back(other);
  }
  return out;
}

}  // namespace

TEST(IoMpi, Tp2WriteThenReadSeriallyAndInParallel) {
  NEED_TWO_RANKS();
  const int rank = world_rank();
  ScratchDir dir(MPI_COMM_WORLD);
  const auto cfg = small_model();
  const auto specs = specs_for(cfg, rank, 2);
  auto flat = make_flat(specs);
  // Rank 1's copies of replicated tensors are poisoned: only tp_rank 0 may write them.
  if (rank == 1)
    for (const auto& s : specs)
      if (s.tp_replicated()) std::fill_n(flat.begin() + s.offset, s.local_numel(), -1.0f);
  const auto role = io::ShardRole::for_rank(rank, 0, 0);
  const std::string path = dir / "tp2.h5";
  io::write_weights(path, MPI_COMM_WORLD, cfg, specs, flat.data(), role);
  if (rank == 0) {
    const auto full = specs_for(cfg);
    std::vector<float> back(std::size_t(flat_size(full)), -2.0f);
    io::read_weights(path, MPI_COMM_NULL, cfg, full, back.data());
    EXPECT_EQ(mismatches(full, back), 0);
  }
  std::vector<float> mine(flat.size(), kPadding);
  io::read_weights(path, MPI_COMM_WORLD, cfg, specs, mine.data(), role);
  EXPECT_EQ(mismatches(specs, mine), 0) << "rank " << rank;
}

TEST(IoMpi, SerialWriteThenTp2ReadWithChecksums) {
  NEED_TWO_RANKS();
  const int rank = world_rank();
  ScratchDir dir(MPI_COMM_WORLD);
  const auto cfg = small_model();
  const std::string path = dir / "serial.h5";
  if (rank == 0) {
    const auto full = specs_for(cfg);
    const auto flat = make_flat(full);
    io::write_weights(path, MPI_COMM_SELF, cfg, full, flat.data());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const auto specs = specs_for(cfg, rank, 2);
  const auto role = io::ShardRole::for_rank(rank, 0, 0);
  std::vector<float> mine(std::size_t(flat_size(specs)), kPadding);
  io::read_weights(path, MPI_COMM_WORLD, cfg, specs, mine.data(), role);
  EXPECT_EQ(mismatches(specs, mine), 0) << "rank " << rank;

  // An element damaged in rank 1's half of a split tensor, or in a replicated tensor that
  // both ranks read (and rank 0 alone hashes): the checksum, summed over the ranks, catches
  // it, and both ranks say so.
  for (const char* name : {"h.1.mlp.c_fc.weight", "wpe"}) {
    const std::string bad = dir / (std::string("bad-") + name + ".h5");
    if (rank == 0) {
      fs::copy_file(path, bad);
      RawFile raw(bad);
      hid_t ds = H5Dopen2(raw.id, (std::string("/model/") + name).c_str(), H5P_DEFAULT);
      hid_t fsp = H5Dget_space(ds);
      hsize_t start[2] = {2, 7}, count[2] = {1, 1};  // c_fc column 7 of 32: tp_rank 0's
      if (std::string(name) == "h.1.mlp.c_fc.weight") start[1] = 30;  // tp_rank 1's
      H5Sselect_hyperslab(fsp, H5S_SELECT_SET, start, nullptr, count, nullptr);
      hid_t ms = H5Screate_simple(2, count, nullptr);
      float v = 1.5f;
      H5Dwrite(ds, H5T_NATIVE_FLOAT, ms, fsp, H5P_DEFAULT, &v);
      H5Sclose(ms);
      H5Sclose(fsp);
      H5Dclose(ds);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    auto msgs = both(error_of([&] {
      io::read_weights(bad, MPI_COMM_WORLD, cfg, specs, mine.data(), role);
    }));
    if (rank == 0) {
      EXPECT_EQ(msgs[0], bad + ": dataset /model/" + name +
                             " does not match its checksum (the file is damaged)");
      EXPECT_EQ(msgs[1], msgs[0]);
    }
  }
}

TEST(IoMpi, PipelineStagesWriteTheirLayers) {
  NEED_TWO_RANKS();
  const int rank = world_rank();
  ScratchDir dir(MPI_COMM_WORLD);
  const auto cfg = small_model();
  const auto specs = stage_specs(cfg, rank);  // rank 1 holds wte too (the tied LM head)
  auto flat = make_flat(specs);
  if (rank == 1)  // poisoned: the last stage's wte must not be written
    for (const auto& s : specs)
      if (s.name == "wte") std::fill_n(flat.begin() + s.offset, s.local_numel(), -1.0f);
  const auto role = io::ShardRole::for_rank(0, 0, rank);
  const std::string path = dir / "pp2.h5";
  io::write_weights(path, MPI_COMM_WORLD, cfg, specs, flat.data(), role);
  if (rank == 0) {
    const auto full = specs_for(cfg);
    std::vector<float> back(std::size_t(flat_size(full)));
    io::read_weights(path, MPI_COMM_NULL, cfg, full, back.data());
    EXPECT_EQ(mismatches(full, back), 0);
  }
  std::vector<float> mine(flat.size());
  io::read_weights(path, MPI_COMM_WORLD, cfg, specs, mine.data(), role);
  EXPECT_EQ(mismatches(specs, mine), 0) << "rank " << rank;
}

TEST(IoMpi, OnlyTheFirstDataParallelReplicaWrites) {
  NEED_TWO_RANKS();
  const int rank = world_rank();
  ScratchDir dir(MPI_COMM_WORLD);
  const auto cfg = small_model();
  const auto specs = specs_for(cfg);
  const auto flat = make_flat(specs, rank == 0 ? 0 : 9);  // replica 1 holds other values
  const std::string path = dir / "dp2.h5";
  io::write_weights(path, MPI_COMM_WORLD, cfg, specs, flat.data(),
                    io::ShardRole::for_rank(0, rank, 0));
  std::vector<float> back(flat.size());
  io::read_weights(path, MPI_COMM_WORLD, cfg, specs, back.data(), io::ShardRole::for_rank(0, rank, 0));
  EXPECT_EQ(mismatches(specs, back, 0), 0) << "rank " << rank;
}

TEST(IoMpi, CheckpointFromTp2ResumesInPp2) {
  NEED_TWO_RANKS();
  const int rank = world_rank();
  ScratchDir dir(MPI_COMM_WORLD);
  const auto cfg = small_model();
  const std::string ck = dir / "run/checkpoints";
  {
    const auto specs = specs_for(cfg, rank, 2);
    const auto p = make_flat(specs, 1), m = make_flat(specs, 2), v = make_flat(specs, 3);
    for (std::int64_t step : {5, 10})
      io::write_checkpoint(ck, MPI_COMM_WORLD, cfg, specs, {step, step * 8, 42, "deck"}, p.data(),
                           m.data(), v.data(), io::ShardRole::for_rank(rank, 0, 0));
  }
  auto latest = io::find_latest_checkpoint(ck);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, io::checkpoint_path(ck, 10));
  const auto specs = stage_specs(cfg, rank);
  std::vector<float> p(std::size_t(flat_size(specs))), m(p.size()), v(p.size());
  auto st = io::read_checkpoint(*latest, MPI_COMM_WORLD, cfg, specs, p.data(), m.data(), v.data(),
                                io::ShardRole::for_rank(0, 0, rank));
  EXPECT_EQ(st.step, 10);
  EXPECT_EQ(st.consumed_samples, 80);
  EXPECT_EQ(st.seed, 42u);
  EXPECT_EQ(st.config, "deck");
  EXPECT_EQ(mismatches(specs, p, 1), 0);
  EXPECT_EQ(mismatches(specs, m, 2), 0);
  EXPECT_EQ(mismatches(specs, v, 3), 0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) EXPECT_EQ(io::prune_checkpoints(ck, 1).size(), 1u);
}

TEST(IoMpi, EveryRankReportsTheSameError) {
  NEED_TWO_RANKS();
  const int rank = world_rank();
  ScratchDir dir(MPI_COMM_WORLD);
  const auto cfg = small_model();
  const auto specs = specs_for(cfg, rank, 2);
  const auto flat = make_flat(specs);
  const std::string path = dir / "w.h5";
  io::write_weights(path, MPI_COMM_WORLD, cfg, specs, flat.data(), io::ShardRole::for_rank(rank, 0, 0));
  std::vector<float> back(flat.size());
  ModelConfig deck = cfg;
  deck.d_model = 16;
  const auto deck_specs = specs_for(deck, rank, 2);
  std::vector<float> big(std::size_t(flat_size(deck_specs)));
  auto msgs = both(error_of([&] {
    io::read_weights(path, MPI_COMM_WORLD, deck, deck_specs, big.data());
  }));
  if (rank == 0) {
    EXPECT_EQ(msgs[0], path + ": model attribute d_model = 8 does not match the deck's "
                              "model.d_model = 16");
    EXPECT_EQ(msgs[1], msgs[0]);
  }
  msgs = both(error_of([&] {
    io::read_weights(dir / "none.h5", MPI_COMM_WORLD, cfg, specs, back.data());
  }));
  if (rank == 0) {
    EXPECT_EQ(msgs[0], dir / "none.h5" + ": no such file");
    EXPECT_EQ(msgs[1], msgs[0]);
  }
}
