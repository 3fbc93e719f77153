// The data loader (trident/train/data_loader.hpp) on one process: each epoch draws every
// sequence once (read back from the index file), a DP slice sees the same sequences as the
// whole batch, a reopened loader continues identically, blends hold their weights exactly
// per window, and a stale index is rebuilt while a tampered one is refused.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "trident/core/error.hpp"
#include "trident/io/dataset.hpp"
#include "trident/train/config.hpp"
#include "trident/train/data_loader.hpp"

namespace trident::train {
namespace {

namespace fs = std::filesystem;

struct Scratch {
  fs::path dir;
  Scratch() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir = fs::temp_directory_path() / ("trident-data-" + std::string(info->name()) + "-" +
                                       std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() {
    if (!::testing::Test::HasFailure()) fs::remove_all(dir);
  }
  std::string operator/(const std::string& n) const { return (dir / n).string(); }
};

// A byte dataset whose token i is (base + i) % span, so a window shows where it came from.
std::string make_dataset(const std::string& path, std::int64_t n, int base = 0, int span = 251) {
  io::TokenDataset d;
  d.vocab_size = 256;
  d.tokenizer = "byte";
  for (std::int64_t i = 0; i < n; ++i) d.tokens.push_back(std::int32_t(base + i % span));
  d.documents = {0, n / 2};
  io::write_token_dataset(path, d);
  return path;
}

LoaderOptions options(const std::string& index, std::int64_t sequences, int T = 8,
                      std::uint64_t seed = 1234) {
  LoaderOptions o;
  o.key = "data.train";
  o.stream = "train";
  o.seq_len = T;
  o.seed = seed;
  o.vocab_limit = 256;
  o.sequences = sequences;
  o.index_path = index;
  return o;
}

std::vector<std::int64_t> read_all(const std::string& file, const std::string& name) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  hid_t sp = H5Dget_space(ds);
  std::vector<std::int64_t> v(std::size_t(H5Sget_simple_extent_npoints(sp)));
  H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Sclose(sp);
  H5Dclose(ds);
  H5Fclose(f);
  return v;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DataLoader, EveryEpochDrawsEverySequenceOnce) {
  Scratch s;
  const int T = 8;
  const std::int64_t N = 8 * 50 + 1;  // 50 sequences per epoch
  make_dataset(s / "a.h5", N);
  const std::vector<DataSource> src{{s / "a.h5", 1.0}};
  const auto opt = options(s / "index.h5", 130, T);  // 2.6 epochs: 3 in the index
  build_sample_index(src, opt);
  const auto samples = read_all(s / "index.h5", "dataset_0/samples");
  ASSERT_EQ(samples.size(), 150u);
  for (int e = 0; e < 3; ++e) {
    std::vector<std::int64_t> epoch(samples.begin() + e * 50, samples.begin() + (e + 1) * 50);
    std::vector<std::int64_t> sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::int64_t> all(50);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all) << "epoch " << e;
    if (e > 0) EXPECT_NE(epoch, std::vector<std::int64_t>(samples.begin(), samples.begin() + 50));
  }
  // The loader reads exactly those windows: sequence k is tokens [k*T, k*T + T].
  DataLoader dl(src, opt);
  std::vector<std::int32_t> in(50 * T), tg(50 * T);
  dl.fill(0, 50, 0, 50, in.data(), tg.data());
  for (int j = 0; j < 50; ++j) {
    const std::int64_t k = samples[std::size_t(j)];
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(in[std::size_t(j * T + t)], (k * T + t) % 251);
      EXPECT_EQ(tg[std::size_t(j * T + t)], (k * T + t + 1) % 251);
    }
  }
  EXPECT_DOUBLE_EQ(dl.epoch(50), 1.0);
  EXPECT_DOUBLE_EQ(dl.epoch(75), 1.5);
}

TEST(DataLoader, DpSlicesAndAReopenedLoaderSeeTheSameBatches) {
  Scratch s;
  const int T = 8, G = 8;
  make_dataset(s / "a.h5", 1000);
  const std::vector<DataSource> src{{s / "a.h5", 1.0}};
  const auto opt = options(s / "index.h5", 20 * G, T);
  build_sample_index(src, opt);
  DataLoader whole(src, opt);
  std::vector<std::int32_t> a(G * T), at(G * T), b(G * T), bt(G * T);
  for (std::int64_t step = 0; step < 20; ++step) {
    whole.fill(step, G, 0, G, a.data(), at.data());
    // dp = 2 (layout 1x1x2): two ranks, half the batch each; dp = 4: a quarter each.
    for (int dp : {2, 4})
      for (int r = 0; r < dp; ++r)
        whole.fill(step, G, r * G / dp, G / dp, b.data() + r * (G / dp) * T,
                   bt.data() + r * (G / dp) * T);
    EXPECT_EQ(a, b);
    EXPECT_EQ(at, bt);
  }
  // A resumed run: the index is found up to date and step 13 reads the same.
  EXPECT_NE(build_sample_index(src, opt).find("up to date"), std::string::npos);
  DataLoader again(src, opt);
  whole.fill(13, G, 0, G, a.data(), at.data());
  again.fill(13, G, 0, G, b.data(), bt.data());
  EXPECT_EQ(a, b);
}

TEST(DataLoader, BlendHoldsItsWeightsExactlyPerWindow) {
  Scratch s;
  const int T = 8;
  make_dataset(s / "a.h5", 801, 0, 100);     // ids 0..99
  fs::create_directories(s / "b");           // a directory of shards is one dataset
  make_dataset(s / "b/shard-0.h5", 81, 100, 100);  // ids 100..199
  make_dataset(s / "b/shard-1.h5", 97, 100, 100);
  const auto src = parse_data_sources(
      "[{path = \"" + (s / "a.h5") + "\", weight = 0.7}, {path = \"" + (s / "b") +
          "\", weight = 0.3}]",
      "data.train");
  ASSERT_EQ(src.size(), 2u);
  const auto opt = options(s / "index.h5", 1000, T);
  build_sample_index(src, opt);
  const auto which = read_all(s / "index.h5", "blend/dataset");
  ASSERT_EQ(which.size(), 1000u);
  std::int64_t b_count = 0;
  for (std::size_t n = 0; n < which.size(); ++n) {
    b_count += which[n];
    if ((n + 1) % 10 == 0) ASSERT_EQ(b_count, std::int64_t(3 * (n + 1) / 10)) << "after " << n + 1;
  }
  // The tokens come from the right files: b's ids are >= 100.
  DataLoader dl(src, opt);
  std::vector<std::int32_t> in(1000 * T), tg(1000 * T);
  dl.fill(0, 1000, 0, 1000, in.data(), tg.data());
  for (std::size_t n = 0; n < 1000; ++n) ASSERT_EQ(in[n * T] >= 100, which[n] == 1) << n;
  // A 3-way blend: within one sequence of its share at every point.
  const auto src3 = parse_data_sources("[{path = \"" + (s / "a.h5") + "\", weight = 5}, " +
                                           "{path = \"" + (s / "b") + "\", weight = 3}, " +
                                           "{path = \"" + (s / "a.h5") + "\", weight = 2}]",
                                       "data.train");
  build_sample_index(src3, options(s / "index3.h5", 1000, T));
  const auto w3 = read_all(s / "index3.h5", "blend/dataset");
  std::int64_t c[3] = {0, 0, 0};
  const double share[3] = {0.5, 0.3, 0.2};
  for (std::size_t n = 0; n < w3.size(); ++n) {
    ++c[w3[n]];
    for (int d = 0; d < 3; ++d) ASSERT_LT(std::abs(double(c[d]) - share[d] * double(n + 1)), 1.0);
    if ((n + 1) % 10 == 0)
      for (int d = 0; d < 3; ++d) ASSERT_EQ(c[d], std::int64_t(share[d] * double(n + 1) + 0.5));
  }
}

// Issue 32: weights near DBL_MAX summed to inf and normalised to 0 (every sequence from one
// dataset); scaled by the largest first they give the same draw as 0.7 / 0.3.
TEST(DataLoader, HugeBlendWeightsNormaliseLikeSmallOnes) {
  Scratch s;
  make_dataset(s / "a.h5", 801, 0, 100);
  make_dataset(s / "b.h5", 801, 100, 100);
  const auto list = [&](const std::string& wa, const std::string& wb) {
    return parse_data_sources("[{path = \"" + (s / "a.h5") + "\", weight = " + wa +
                                  "}, {path = \"" + (s / "b.h5") + "\", weight = " + wb + "}]",
                              "data.train");
  };
  build_sample_index(list("0.7", "0.3"), options(s / "small.h5", 200, 8));
  build_sample_index(list("1.4e308", "0.6e308"), options(s / "huge.h5", 200, 8));
  const auto small = read_all(s / "small.h5", "blend/dataset");
  const auto huge = read_all(s / "huge.h5", "blend/dataset");
  ASSERT_EQ(small.size(), 200u);
  EXPECT_EQ(small, huge);
  EXPECT_EQ(std::count(huge.begin(), huge.end(), 1), 60);
}

TEST(DataLoader, StaleIndexIsRebuiltTamperedOneRefused) {
  Scratch s;
  make_dataset(s / "a.h5", 1000);
  const std::vector<DataSource> src{{s / "a.h5", 1.0}};
  EXPECT_NE(build_sample_index(src, options(s / "i.h5", 64)).find("built"), std::string::npos);
  // Another seed, more sequences, another dataset: rebuilt.
  EXPECT_NE(build_sample_index(src, options(s / "i.h5", 64, 8, 99)).find("another train.seed"),
            std::string::npos);
  EXPECT_NE(build_sample_index(src, options(s / "i.h5", 640, 8, 99)).find("more sequences"),
            std::string::npos);
  make_dataset(s / "a.h5", 1001);
  EXPECT_NE(build_sample_index(src, options(s / "i.h5", 640, 8, 99)).find("changed"),
            std::string::npos);
  // Reused as it is: checksums of every bit pattern (half have the top bit set) round-trip.
  for (int n = 1001; n < 1009; ++n) {
    make_dataset(s / "c.h5", n);
    const std::vector<DataSource> c{{s / "c.h5", 1.0}};
    build_sample_index(c, options(s / "c-index.h5", 64));
    EXPECT_NE(build_sample_index(c, options(s / "c-index.h5", 64)).find("up to date"),
              std::string::npos) << n;
  }
  // One entry changed by hand: refused, naming the file and the way out.
  {
    hid_t f = H5Fopen((s / "i.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "dataset_0/samples", H5P_DEFAULT);
    hid_t sp = H5Dget_space(ds);
    hsize_t at = 3, one = 1;
    H5Sselect_hyperslab(sp, H5S_SELECT_SET, &at, nullptr, &one, nullptr);
    hid_t ms = H5Screate_simple(1, &one, nullptr);
    std::int64_t v = 0;
    H5Dread(ds, H5T_NATIVE_INT64, ms, sp, H5P_DEFAULT, &v);
    v = (v + 1) % 124;
    H5Dwrite(ds, H5T_NATIVE_INT64, ms, sp, H5P_DEFAULT, &v);
    H5Sclose(ms);
    H5Sclose(sp);
    H5Dclose(ds);
    H5Fclose(f);
  }
  const std::string e = error_of([&] { build_sample_index(src, options(s / "i.h5", 640, 8, 99)); });
  EXPECT_NE(e.find(s / "i.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("damaged"), std::string::npos) << e;
  EXPECT_NE(e.find("delete it"), std::string::npos) << e;
}

TEST(DataLoader, DataSourcesParseAndRefuse) {
  EXPECT_EQ(parse_data_sources("a.h5", "k"), (std::vector<DataSource>{{"a.h5", 1.0}}));
  EXPECT_EQ(parse_data_sources("[{path = \"a.h5\", weight = 0.7}, \"b.h5\"]", "k"),
            (std::vector<DataSource>{{"a.h5", 0.7}, {"b.h5", 1.0}}));
  EXPECT_NE(error_of([] { parse_data_sources("[{path = \"a.h5\", weight = -1}]", "k"); })
                .find("weight must be a finite number >= 0, got -1"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_data_sources("[{path = \"a.h5\", weight = 0}]", "k"); })
                .find("every weight is 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_data_sources("[{file = \"a.h5\"}]", "k"); }).find("unknown key 'file'"),
            std::string::npos);
  EXPECT_EQ(data_sources_toml({{"a.h5", 1.0}}), "a.h5");
  const std::string t = data_sources_toml({{"a.h5", 0.7}, {"b.h5", 0.3}});
  EXPECT_EQ(parse_data_sources(t, "k"), (std::vector<DataSource>{{"a.h5", 0.7}, {"b.h5", 0.3}})) << t;
}

TEST(DataLoader, TokenFileReadsRangesDocumentsAndChecksum) {
  Scratch s;
  make_dataset(s / "a.h5", 1000);
  const io::TokenDataset d = io::read_token_dataset(s / "a.h5");
  EXPECT_EQ(d.documents, (std::vector<std::int64_t>{0, 500}));
  ASSERT_TRUE(d.has_checksum);
  EXPECT_EQ(d.checksum, io::token_checksum(d.tokens.data(), 1000, 0));
  // Sums of slices add up (what ranks writing one file together rely on).
  EXPECT_EQ(d.checksum, io::token_checksum(d.tokens.data(), 300, 0) +
                            io::token_checksum(d.tokens.data() + 300, 700, 300));
  {
    io::TokenFile f(s / "a.h5");
    std::vector<std::int32_t> w(10);
    f.read(995, 5, w.data());
    EXPECT_EQ(std::vector<std::int32_t>(w.begin(), w.begin() + 5),
              std::vector<std::int32_t>(d.tokens.begin() + 995, d.tokens.end()));
    EXPECT_EQ(f.verify(), d.checksum);
    EXPECT_NE(error_of([&] { f.read(996, 5, w.data()); }).find("outside /tokens of 1000"),
              std::string::npos);
  }
  {  // one id changed behind the checksum's back
    hid_t h = H5Fopen((s / "a.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(h, "tokens", H5P_DEFAULT);
    hid_t sp = H5Dget_space(ds);
    hsize_t at = 7, one = 1;
    H5Sselect_hyperslab(sp, H5S_SELECT_SET, &at, nullptr, &one, nullptr);
    hid_t ms = H5Screate_simple(1, &one, nullptr);
    std::int32_t v = 3;
    H5Dwrite(ds, H5T_NATIVE_INT32, ms, sp, H5P_DEFAULT, &v);
    H5Sclose(ms);
    H5Sclose(sp);
    H5Dclose(ds);
    H5Fclose(h);
  }
  EXPECT_NE(error_of([&] { io::TokenFile(s / "a.h5").verify(); }).find("tokens_checksum"),
            std::string::npos);
}

TEST(DataLoader, DeckTakesABlendListAndWritesItBack) {
  const Config c = parse_config(
      "[data]\ntrain = [{path = \"a.h5\", weight = 0.7}, {path = \"b/\", weight = 0.3}]\n"
      "valid = \"v.h5\"\n",
      "deck.toml");
  EXPECT_EQ(c.data.train, "[{path = \"a.h5\", weight = 0.7}, {path = \"b/\", weight = 0.3}]");
  EXPECT_EQ(c.data.valid, "v.h5");
  const std::string toml = to_toml(c);
  EXPECT_NE(toml.find("train = [{path = \"a.h5\", weight = 0.7}, {path = \"b/\", weight = 0.3}]"),
            std::string::npos);
  EXPECT_EQ(parse_config(toml, "resolved.toml"), c);
  // --set takes the list too; bad weights point at the deck key.
  const Config o = parse_config("", "deck.toml", {"data.train=[{path = \"x.h5\", weight = 2}]"});
  EXPECT_EQ(parse_data_sources(o.data.train, "k"), (std::vector<DataSource>{{"x.h5", 2.0}}));
  const std::string e = error_of(
      [] { parse_config("[data]\ntrain = [{path = \"a.h5\", weight = -1}]\n", "deck.toml"); });
  EXPECT_NE(e.find("deck.toml:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("data.train[0] (a.h5): weight must be a finite number >= 0, got -1"),
            std::string::npos) << e;
}

}  // namespace
}  // namespace trident::train
