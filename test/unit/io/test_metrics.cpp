// metrics.h5: columns, appends, truncation on resume, and reading it while it is written.
#include <cmath>
#include <cstdio>

#include "io_test_util.hpp"
#include "trident/io/metrics.hpp"

using namespace iotest;
namespace io = trident::io;

namespace {

io::StepMetrics row(std::int64_t step, double salt = 0.0) {
  return io::StepMetrics{step, 10.0 - double(step) + salt, 1e-4 * double(step), 0.5, 0.25, 1000.0};
}

template <typename T>
std::vector<T> column(const std::string& path, const std::string& name, hid_t type) {
  RawFile raw(path);
  return raw.read<T>(name, type);
}
std::vector<std::int64_t> steps(const std::string& path, const std::string& name = "step") {
  return column<std::int64_t>(path, name, H5T_NATIVE_INT64);
}
std::vector<double> values(const std::string& path, const std::string& name) {
  return column<double>(path, name, H5T_NATIVE_DOUBLE);
}

}  // namespace

TEST(Metrics, ColumnsAndRows) {
  ScratchDir dir;
  const std::string out = dir / "run";
  {
    io::MetricsWriter w(out, -1, {"loss_scale"});
    for (int s = 1; s <= 4; ++s) {
      if (s % 2 == 0) w.set("loss_scale", 100.0 * s);
      w.append(row(s));
    }
    w.append_eval(2, 7.5);
    w.append_eval(4, 6.5);
    EXPECT_EQ(w.rows(), 4);
    EXPECT_EQ(w.eval_rows(), 2);
    EXPECT_EQ(error_of([&] { w.set("nope", 1.0); }),
              w.path() + ": no metrics column 'nope' (extra columns are named at creation)");
  }
  const std::string path = out + "/metrics.h5";
  EXPECT_EQ(steps(path), (std::vector<std::int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(values(path, "loss"), (std::vector<double>{9, 8, 7, 6}));
  EXPECT_EQ(values(path, "lr"), (std::vector<double>{1e-4 * 1, 1e-4 * 2, 1e-4 * 3, 1e-4 * 4}));
  for (const char* c : {"grad_norm", "step_time_s", "tokens_per_s"})
    EXPECT_EQ(values(path, c).size(), 4u) << c;
  auto scale = values(path, "loss_scale");
  ASSERT_EQ(scale.size(), 4u);
  EXPECT_TRUE(std::isnan(scale[0]));
  EXPECT_EQ(scale[1], 200.0);
  EXPECT_TRUE(std::isnan(scale[2]));
  EXPECT_EQ(scale[3], 400.0);
  EXPECT_EQ(steps(path, "eval/step"), (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(values(path, "eval/loss"), (std::vector<double>{7.5, 6.5}));
}

TEST(Metrics, ResumeTruncatesRowsAfterTheCheckpoint) {
  ScratchDir dir;
  const std::string out = dir / "run", path = out + "/metrics.h5";
  {
    io::MetricsWriter w(out);
    for (int s = 1; s <= 6; ++s) w.append(row(s));
    w.append_eval(2, 7.5);
    w.append_eval(4, 6.5);
    w.append_eval(6, 5.5);
  }
  {
    // Resumed from the checkpoint of step 3 (steps 4-6 ran after it and are redone).
    io::MetricsWriter w(out, 3, {"new_column"});
    EXPECT_EQ(w.rows(), 3);
    EXPECT_EQ(w.eval_rows(), 1);
    w.append(row(4, 0.5));
    w.set("new_column", 1.0);
    w.append(row(5, 0.5));
    w.append_eval(4, 6.25);
  }
  EXPECT_EQ(steps(path), (std::vector<std::int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(values(path, "loss"), (std::vector<double>{9, 8, 7, 6.5, 5.5}));
  auto nc = values(path, "new_column");
  ASSERT_EQ(nc.size(), 5u);
  EXPECT_TRUE(std::isnan(nc[0]) && std::isnan(nc[3]));
  EXPECT_EQ(nc[4], 1.0);
  EXPECT_EQ(steps(path, "eval/step"), (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(values(path, "eval/loss"), (std::vector<double>{7.5, 6.25}));

  // A fresh run (resume_step < 0) starts a new file.
  { io::MetricsWriter w(out); }
  EXPECT_TRUE(steps(path).empty());
}

TEST(Metrics, ResumeWithoutOrWithADamagedFile) {
  ScratchDir dir;
  const std::string out = dir / "run", path = out + "/metrics.h5";
  {
    io::MetricsWriter w(out, 10);  // no file yet: a new one
    w.append(row(11));
  }
  EXPECT_EQ(steps(path), (std::vector<std::int64_t>{11}));
  write_text(path, "not hdf5 any more");
  ::testing::internal::CaptureStderr();
  {
    io::MetricsWriter w(out, 11);
    w.append(row(12));
  }
  std::string warn = ::testing::internal::GetCapturedStderr();
  EXPECT_CONTAINS(warn, path + ": not an HDF5 file; moving it to " + path + ".bad");
  EXPECT_TRUE(fs::exists(path + ".bad"));
  EXPECT_EQ(steps(path), (std::vector<std::int64_t>{12}));
}

TEST(Metrics, H5pyReadsTheFileWhileItIsWritten) {
  if (std::system("/usr/bin/python3 -c 'import h5py' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no python3 with h5py";
  ScratchDir dir;
  const std::string out = dir / "run";
  io::MetricsWriter w(out);
  w.append(row(1));
  w.append(row(2));
  const std::string cmd = "/usr/bin/python3 -c \"import h5py; f = h5py.File('" + w.path() +
                          "', 'r'); print(list(f['step'][:]), list(f['loss'][:]))\" 2>&1";
  std::string got;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, p)) got += buf;
    pclose(p);
  }
  EXPECT_EQ(got, "[1, 2] [9.0, 8.0]\n");
  w.append(row(3));  // still writable after the reader came and went
  EXPECT_EQ(w.rows(), 3);
}

TEST(Metrics, ColumnsInSubgroupsSurviveResume) {
  ScratchDir dir;
  const std::string out = dir / "run";
  const std::vector<std::string> cols{"comm/tp/bytes", "comm/dp/bytes"};
  {
    io::MetricsWriter w(out, -1, cols);
    for (int s = 1; s <= 3; ++s) {
      w.set("comm/tp/bytes", 10.0 * s);
      w.append(row(s));
    }
  }
  {
    io::MetricsWriter w(out, 2, cols);  // resume after step 2: row 3 goes
    EXPECT_EQ(w.rows(), 2);
    w.set("comm/tp/bytes", 99.0);
    w.append(row(3, 0.5));
  }
  const std::string path = out + "/metrics.h5";
  EXPECT_EQ(values(path, "comm/tp/bytes"), (std::vector<double>{10, 20, 99}));
  EXPECT_EQ(values(path, "comm/dp/bytes").size(), 3u);
  for (const char* bad : {"/x", "x/", "a//b", "eval/x", "step"})
    EXPECT_NE(error_of([&] { io::MetricsWriter(out, -1, {bad}); }), "") << bad;
}
