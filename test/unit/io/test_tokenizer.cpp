// Tokenizers: bytes, a small SentencePiece BPE trained here, and the one in a dataset.
#include <chrono>

#include "io_test_util.hpp"
#include "trident/io/dataset.hpp"
#include "trident/io/tokenizer.hpp"

using namespace iotest;
namespace io = trident::io;

namespace {

// About 8 KB of English-like lines from a fixed word list (deterministic).
std::string corpus() {
  const char* words[] = {"the", "and", "of", "to", "in", "that", "he", "shall", "unto", "for",
                         "i", "his", "a", "lord", "they", "be", "is", "him", "not", "them",
                         "it", "with", "all", "thou", "thy", "was", "god", "which", "my", "me",
                         "said", "but", "ye", "their", "have", "will", "thee", "from", "as",
                         "are", "when", "this", "out", "were", "upon", "man", "by", "you",
                         "israel", "king", "son", "up", "there", "hath", "then", "people",
                         "came", "had", "house", "into", "on", "her", "come", "one", "we",
                         "children", "s", "before", "your", "also", "day", "land", "men"};
  const std::size_t n = sizeof words / sizeof words[0];
  std::string text;
  std::uint64_t x = 88172645463325252ull;
  for (int line = 0; line < 160; ++line) {
    int len = 6 + line % 9;
    for (int w = 0; w < len; ++w) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      std::string word = words[x % n];
      if (w == 0) word[0] = char(std::toupper(word[0]));
      text += (w ? " " : "") + word;
    }
    text += line % 3 ? ".\n" : ", saith the Lord.\n";
  }
  return text;
}

}  // namespace

TEST(Tokenizer, ByteRoundTripsEveryByte) {
  auto t = io::Tokenizer::byte();
  EXPECT_EQ(t.kind(), io::TokenizerKind::byte);
  EXPECT_STREQ(t.kind_name(), "byte");
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_TRUE(t.serialized().empty());
  std::string all;
  for (int c = 0; c < 256; ++c) all += char(c);
  auto ids = t.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int c = 0; c < 256; ++c) EXPECT_EQ(ids[std::size_t(c)], c);
  EXPECT_EQ(t.decode(ids), all);
  EXPECT_EQ(error_of([&] { t.decode({65, 256}); }),
            "token id 256 (at 1) is outside the byte tokenizer's vocabulary of 256");
}

TEST(Tokenizer, SentencePieceBpeTrainsAndRoundTrips) {
  ScratchDir dir;
  const std::string text = corpus();
  ASSERT_GT(text.size(), 6000u);
  const std::string path = dir / "corpus.txt";
  write_text(path, text);

  auto t0 = std::chrono::steady_clock::now();
  auto t = io::Tokenizer::train_sentencepiece(path, 400);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 5.0);
  EXPECT_EQ(t.kind(), io::TokenizerKind::sentencepiece);
  EXPECT_EQ(t.vocab_size(), 400);

  auto ids = t.encode(text);
  EXPECT_LT(ids.size(), text.size() / 2);  // learned merges: well under a token per byte
  for (auto id : ids) ASSERT_TRUE(id >= 0 && id < 400);
  EXPECT_EQ(t.decode(ids), text);
  // Text it never saw: bytes it has no piece for fall back to byte pieces.
  const std::string odd = "  Leading spaces,\ttabs, ünïcödé 日本語 and\n\nblank lines\n";
  EXPECT_EQ(t.decode(t.encode(odd)), odd);
  EXPECT_EQ(t.encode("the king"), t.encode(std::string("the king")));

  auto copy = io::Tokenizer::from_serialized(t.serialized());
  EXPECT_EQ(copy.encode(text), ids);
  EXPECT_EQ(copy.vocab_size(), 400);

  EXPECT_CONTAINS(error_of([&] { t.decode({400}); }), "token id 400 (at 0) is outside");
  EXPECT_EQ(error_of([&] { io::Tokenizer::train_sentencepiece(path, 200); }),
            path + ": a SentencePiece vocabulary of 200 is too small, expected more than 257 "
                   "(256 byte pieces and <unk>)");
  EXPECT_EQ(error_of([&] { io::Tokenizer::train_sentencepiece(dir / "no.txt", 400); }),
            dir / "no.txt" + ": no such file");
  EXPECT_CONTAINS(error_of([&] { io::Tokenizer::from_serialized("not a model"); }),
                  "cannot load the SentencePiece model");

  // Stored in a token dataset and loaded back from it.
  io::TokenDataset d;
  d.vocab_size = t.vocab_size();
  d.tokenizer = t.kind_name();
  d.tokenizer_model = t.serialized();
  d.tokens = ids;
  const std::string data = dir / "data.h5";
  io::write_token_dataset(data, d);
  auto loaded = io::load_tokenizer(data);
  EXPECT_EQ(loaded.kind(), io::TokenizerKind::sentencepiece);
  EXPECT_EQ(loaded.decode(io::read_token_dataset(data).tokens), text);

  d.vocab_size = 500;  // a model that does not match its dataset
  io::write_token_dataset(data, d);
  EXPECT_EQ(error_of([&] { io::load_tokenizer(data); }),
            data + ": the SentencePiece model has 400 pieces but vocab_size = 500");
}

TEST(Tokenizer, ByteTokenizerFromADataset) {
  ScratchDir dir;
  io::TokenDataset d;
  d.vocab_size = 256;
  d.tokenizer = "byte";
  d.tokens = {72, 105};
  io::write_token_dataset(dir / "b.h5", d);
  auto t = io::load_tokenizer(dir / "b.h5");
  EXPECT_EQ(t.kind(), io::TokenizerKind::byte);
  EXPECT_EQ(t.decode(io::read_token_dataset(dir / "b.h5").tokens), "Hi");
}
