// Checkpoints: round trip of tensors and scalar state, atomic publication, discovery that
// skips what a crash leaves behind, pruning.
#include "io_test_util.hpp"
#include "trident/io/checkpoint.hpp"
#include "trident/io/h5.hpp"
#include "trident/io/weights.hpp"

using namespace iotest;
namespace io = trident::io;
namespace h5 = trident::io::h5;

namespace {

io::CheckpointState state_at(std::int64_t step) {
  return io::CheckpointState{step, step * 32, 1234, "[train]\nsteps = 200\nseed = 1234\n"};
}

std::string write_at(const std::string& dir, std::int64_t step) {
  const auto cfg = small_model();
  const auto specs = specs_for(cfg);
  const auto p = make_flat(specs, 1), m = make_flat(specs, 2), v = make_flat(specs, 3);
  return io::write_checkpoint(dir, MPI_COMM_NULL, cfg, specs, state_at(step), p.data(), m.data(),
                              v.data());
}

}  // namespace

TEST(Checkpoint, RoundTripOfTensorsAndState) {
  ScratchDir dir;
  const auto cfg = small_model();
  const auto specs = specs_for(cfg);
  const std::string ckdir = dir / "run/checkpoints";  // created by the writer
  const std::string path = write_at(ckdir, 12);
  EXPECT_EQ(path, ckdir + "/step-00000012.h5");
  EXPECT_EQ(io::checkpoint_path(ckdir, 123456789), ckdir + "/step-123456789.h5");
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  std::vector<float> p(std::size_t(flat_size(specs))), m(p.size()), v(p.size());
  auto st = io::read_checkpoint(path, MPI_COMM_NULL, cfg, specs, p.data(), m.data(), v.data());
  EXPECT_EQ(st.step, 12);
  EXPECT_EQ(st.consumed_samples, 12 * 32);
  EXPECT_EQ(st.seed, 1234u);
  EXPECT_EQ(st.config, state_at(12).config);
  EXPECT_EQ(mismatches(specs, p, 1), 0);
  EXPECT_EQ(mismatches(specs, m, 2), 0);
  EXPECT_EQ(mismatches(specs, v, 3), 0);

  // Parameters alone, and the model of a checkpoint as weights.
  std::vector<float> p2(p.size());
  io::read_checkpoint(path, MPI_COMM_NULL, cfg, specs, p2.data(), nullptr, nullptr);
  EXPECT_EQ(p2, p);
  io::read_weights(path, MPI_COMM_NULL, cfg, specs, p2.data());
  EXPECT_EQ(p2, p);
  EXPECT_EQ(io::read_model_config(path), cfg);

  h5::File f = h5::open_file(path, h5::Mode::read);
  EXPECT_EQ(h5::read_attr_string(f, "format"), "trident-checkpoint");
  EXPECT_EQ(h5::read_attr_int(f, "format_version"), 1);
  EXPECT_TRUE(h5::exists(f, "optimizer/exp_avg/h.0.mlp.c_fc.weight"));
  EXPECT_TRUE(h5::exists(f, "optimizer/exp_avg_sq/wte"));
}

TEST(Checkpoint, WeightsAreNotACheckpoint) {
  ScratchDir dir;
  const auto cfg = small_model();
  const auto specs = specs_for(cfg);
  const auto flat = make_flat(specs);
  const std::string w = dir / "w.h5";
  io::write_weights(w, MPI_COMM_NULL, cfg, specs, flat.data());
  std::vector<float> p(flat.size());
  EXPECT_EQ(error_of([&] {
              io::read_checkpoint(w, MPI_COMM_NULL, cfg, specs, p.data(), nullptr, nullptr);
            }),
            w + ": format = \"trident-weights\", expected \"trident-checkpoint\"");
  EXPECT_EQ(error_of([&] { io::read_checkpoint_state(w); }),
            w + ": format = \"trident-weights\", expected \"trident-checkpoint\"");
}

TEST(Checkpoint, FindLatestSkipsTmpTruncatedAndMisnamedFiles) {
  ScratchDir dir;
  const std::string ck = dir / "ck";
  EXPECT_FALSE(io::find_latest_checkpoint(ck).has_value());  // no directory yet
  write_at(ck, 10);
  const std::string good = write_at(ck, 20);
  EXPECT_EQ(io::find_latest_checkpoint(ck).value_or(""), good);

  // A crash mid-write leaves a .tmp; a broken copy leaves a truncated newest file; a file
  // renamed by hand has a step that does not match its name; a stray file is ignored.
  const std::string tmp = io::checkpoint_path(ck, 40) + ".tmp";
  fs::copy_file(good, tmp);
  fs::resize_file(tmp, 100);
  const std::string cut = io::checkpoint_path(ck, 30);
  fs::copy_file(good, cut);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  const std::string misnamed = io::checkpoint_path(ck, 25);
  fs::copy_file(good, misnamed);
  write_text(ck + "/notes.txt", "hello");

  ::testing::internal::CaptureStderr();
  auto latest = io::find_latest_checkpoint(ck);
  std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(latest.value_or(""), good);
  EXPECT_CONTAINS(warnings, "trident: warning: skipping checkpoint: " + cut +
                                ": HDF5 cannot open it, truncated or damaged?");
  EXPECT_CONTAINS(warnings, misnamed + ": attribute step = 20 does not match the name");
  EXPECT_EQ(warnings.find(tmp), std::string::npos) << warnings;
}

TEST(Checkpoint, PruneKeepsTheNewestComplete) {
  ScratchDir dir;
  const std::string ck = dir / "ck";
  for (int s : {1, 2, 3, 4}) write_at(ck, s);
  write_text(io::checkpoint_path(ck, 0) + ".tmp", "left by a crash");
  write_text(io::checkpoint_path(ck, 5), "newest, but damaged");

  EXPECT_TRUE(io::prune_checkpoints(ck, 0).empty());  // keep = 0: keep all
  EXPECT_TRUE(io::prune_checkpoints(ck, 5).empty());  // fewer complete ones than that
  // Four complete: nothing of them goes, but the stale .tmp older than all of them does.
  EXPECT_EQ(io::prune_checkpoints(ck, 4),
            (std::vector<std::string>{io::checkpoint_path(ck, 0) + ".tmp"}));
  auto removed = io::prune_checkpoints(ck, 2);
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed,
            (std::vector<std::string>{io::checkpoint_path(ck, 1), io::checkpoint_path(ck, 2)}));
  EXPECT_TRUE(fs::exists(io::checkpoint_path(ck, 3)));
  EXPECT_TRUE(fs::exists(io::checkpoint_path(ck, 4)));
  EXPECT_TRUE(fs::exists(io::checkpoint_path(ck, 5)));  // newer than what is kept: left alone
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(io::find_latest_checkpoint(ck).value_or(""), io::checkpoint_path(ck, 4));
  ::testing::internal::GetCapturedStderr();
}

TEST(Checkpoint, StateErrors) {
  ScratchDir dir;
  const std::string path = write_at(dir / "ck", 7);
  {
    RawFile raw(path);
    H5Adelete(raw.id, "consumed_samples");
  }
  EXPECT_EQ(error_of([&] { io::read_checkpoint_state(path); }),
            path + ": missing attribute 'consumed_samples' on /");
  const std::string path2 = write_at(dir / "ck2", 8);
  {
    RawFile raw(path2);
    raw.remove("/optimizer/exp_avg_sq");
  }
  EXPECT_EQ(error_of([&] { io::read_checkpoint_state(path2); }),
            path2 + ": missing group /optimizer/exp_avg_sq");
}
