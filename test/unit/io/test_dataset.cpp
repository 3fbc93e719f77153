// Token datasets: round trips in both storage types, and every way one can be wrong.
#include "io_test_util.hpp"
#include "trident/io/dataset.hpp"
#include "trident/io/h5.hpp"

using namespace iotest;
namespace io = trident::io;
namespace h5 = trident::io::h5;

namespace {
io::TokenDataset bytes_of(const std::string& text) {
  io::TokenDataset d;
  d.vocab_size = 256;
  d.tokenizer = "byte";
  for (unsigned char c : text) d.tokens.push_back(c);
  return d;
}
bool stored_as(const std::string& path, hid_t type) {
  h5::File f = h5::open_file(path, h5::Mode::read);
  h5::Hid ds = h5::open_dataset(f, "tokens");
  h5::Hid t(H5Dget_type(ds));
  return H5Tequal(t, type) > 0;
}
}  // namespace

TEST(Dataset, ByteRoundTripAsUint16) {
  ScratchDir dir;
  const std::string path = dir / "data/bytes.h5";  // the directory is created
  auto d = bytes_of("In the beginning\n\xff\x00 end");
  io::write_token_dataset(path, d);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_TRUE(stored_as(path, H5T_STD_U16LE));
  auto r = io::read_token_dataset(path);
  EXPECT_EQ(r.tokens, d.tokens);
  EXPECT_EQ(r.num_tokens, std::int64_t(d.tokens.size()));
  EXPECT_EQ(r.vocab_size, 256);
  EXPECT_EQ(r.tokenizer, "byte");
  EXPECT_TRUE(r.tokenizer_model.empty());
  auto h = io::read_token_dataset_header(path);
  EXPECT_TRUE(h.tokens.empty());
  EXPECT_EQ(h.num_tokens, std::int64_t(d.tokens.size()));
}

TEST(Dataset, SentencePieceModelAndLargeVocabularyAsInt32) {
  ScratchDir dir;
  const std::string path = dir / "sp.h5";
  io::TokenDataset d;
  d.vocab_size = 70000;
  d.tokenizer = "sentencepiece";
  d.tokenizer_model = std::string("\x0a\x01\x00model bytes", 14);
  d.tokens = {0, 65535, 65536, 69999, 3};
  io::write_token_dataset(path, d);
  EXPECT_TRUE(stored_as(path, H5T_STD_I32LE));
  auto r = io::read_token_dataset(path);
  EXPECT_EQ(r.tokens, d.tokens);
  EXPECT_EQ(r.tokenizer, "sentencepiece");
  EXPECT_EQ(r.tokenizer_model, d.tokenizer_model);
  {
    RawFile raw(path);
    auto m = raw.read<unsigned char>("/tokenizer/model", H5T_NATIVE_UCHAR);
    EXPECT_EQ(std::string(m.begin(), m.end()), d.tokenizer_model);
  }
}

TEST(Dataset, WriterRefusesBadData) {
  ScratchDir dir;
  const std::string path = dir / "x.h5";
  auto d = bytes_of("abc");
  d.tokens.push_back(256);
  EXPECT_EQ(error_of([&] { io::write_token_dataset(path, d); }),
            path + ": /tokens[3] = 256 is not a token id in [0, vocab_size = 256)");
  d = bytes_of("");
  EXPECT_EQ(error_of([&] { io::write_token_dataset(path, d); }),
            path + ": no tokens to write (empty input?)");
  d = bytes_of("abc");
  d.tokenizer = "tiktoken";
  EXPECT_EQ(error_of([&] { io::write_token_dataset(path, d); }),
            path + ": tokenizer = \"tiktoken\", expected \"byte\", \"sentencepiece\" or \"gpt2\"");
  d.tokenizer = "gpt2";  // without its vocabulary and merges
  EXPECT_EQ(error_of([&] { io::write_token_dataset(path, d); }),
            path + ": a gpt2 dataset needs its model");
  EXPECT_FALSE(fs::exists(path));
}

TEST(Dataset, ReaderErrors) {
  ScratchDir dir;
  auto make = [&](const std::string& name, auto&& edit) {
    const std::string path = dir / name;
    io::write_token_dataset(path, bytes_of("hello world"));
    RawFile raw(path);
    edit(raw);
    return path;
  };
  std::string p = make("empty.h5", [](RawFile& r) {
    r.remove("tokens");
    r.dataset("tokens", H5T_STD_U16LE, {0});
  });
  EXPECT_EQ(error_of([&] { io::read_token_dataset(p); }), p + ": dataset /tokens is empty");
  EXPECT_EQ(error_of([&] { io::read_token_dataset_header(p); }), p + ": dataset /tokens is empty");

  p = make("big.h5", [](RawFile& r) {
    r.remove("tokens");
    std::vector<std::int32_t> t = {1, 2, 300, 4};
    r.dataset("tokens", H5T_STD_I32LE, {4}, H5T_NATIVE_INT32, t.data());
  });
  EXPECT_EQ(error_of([&] { io::read_token_dataset(p); }),
            p + ": /tokens[2] = 300 is not a token id in [0, vocab_size = 256)");

  p = make("negative.h5", [](RawFile& r) {
    r.remove("tokens");
    std::vector<std::int64_t> t = {1, -1};
    r.dataset("tokens", H5T_STD_I64LE, {2}, H5T_NATIVE_INT64, t.data());
  });
  EXPECT_EQ(error_of([&] { io::read_token_dataset(p); }),
            p + ": /tokens[1] = -1 is not a token id in [0, vocab_size = 256)");

  p = make("float.h5", [](RawFile& r) {
    r.remove("tokens");
    r.dataset("tokens", H5T_IEEE_F32LE, {3});
  });
  EXPECT_EQ(error_of([&] { io::read_token_dataset(p); }),
            p + ": dataset /tokens is float, expected integer token ids");

  p = make("2d.h5", [](RawFile& r) {
    r.remove("tokens");
    r.dataset("tokens", H5T_STD_U16LE, {2, 2});
  });
  EXPECT_EQ(error_of([&] { io::read_token_dataset(p); }),
            p + ": dataset /tokens has shape [2, 2], expected 1-D");

  p = make("novocab.h5", [](RawFile& r) { H5Adelete(r.id, "vocab_size"); });
  EXPECT_EQ(error_of([&] { io::read_token_dataset(p); }), p + ": missing attribute 'vocab_size' on /");

  p = make("zerovocab.h5", [](RawFile& r) { r.attr_int("vocab_size", 0); });
  EXPECT_EQ(error_of([&] { io::read_token_dataset(p); }),
            p + ": vocab_size = 0, expected a positive integer");

  p = make("kind.h5", [](RawFile& r) { r.attr_fixed_string("tokenizer", "tiktoken"); });
  EXPECT_EQ(error_of([&] { io::read_token_dataset(p); }),
            p + ": tokenizer = \"tiktoken\", expected \"byte\", \"sentencepiece\" or \"gpt2\"");

  p = make("nomodel.h5", [](RawFile& r) { r.attr_fixed_string("tokenizer", "sentencepiece"); });
  EXPECT_EQ(error_of([&] { io::read_token_dataset(p); }), p + ": missing dataset /tokenizer/model");

  p = make("notokens.h5", [](RawFile& r) { r.remove("tokens"); });
  EXPECT_EQ(error_of([&] { io::read_token_dataset(p); }), p + ": missing dataset /tokens");
}
