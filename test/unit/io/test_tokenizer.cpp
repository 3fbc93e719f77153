// Tokenizers: bytes, a small SentencePiece BPE trained here, and the one in a dataset.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>

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

namespace {

// GPT-2's byte symbols as its bytes_to_unicode defines them: the printable Latin-1 bytes
// ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) are their own code point, the rest U+0100 onwards.
std::string byte_symbol(int b) {
  int cp = b;
  if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
    cp = 256;
    for (int c = 0; c < b; ++c)
      if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) ++cp;
  }
  std::string s;
  if (cp < 0x80) s += char(cp);
  else s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
  return s;
}

// A small GPT-2-style vocabulary in `dir` (encoder.json + vocab.bpe): the 256 bytes at
// scrambled ids, <|endoftext|>, and a few merges.
struct MiniBpe {
  std::map<std::string, int> vocab;
  std::vector<std::string> merges = {"h e", "l l", "he ll", "hell o", "Ġ Ġ", "Ġ b", "' s",
                                     "c 1", "x Â", "x Ã"};
  explicit MiniBpe(const std::string& dir) {
    for (int b = 0; b < 256; ++b) vocab[byte_symbol(b)] = (b + 100) % 256;
    vocab["<|endoftext|>"] = 256;
    for (const auto& m : merges) {
      const auto sp = m.find(' ');
      vocab[m.substr(0, sp) + m.substr(sp + 1)] = int(vocab.size());
    }
    std::string json = "{";
    for (const auto& [k, v] : vocab) {
      std::string esc;
      for (char c : k) esc += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
      json += (json.size() > 1 ? "," : "") + std::string("\"") + esc + "\":" + std::to_string(v);
    }
    write_text(dir + "/encoder.json", json + "}");
    std::string bpe = "#version: 0.2\n";
    for (const auto& m : merges) bpe += m + "\n";
    write_text(dir + "/vocab.bpe", bpe);
  }
  std::int32_t id(const std::string& sym) const { return vocab.at(sym); }
  std::int32_t byte(char c) const { return vocab.at(byte_symbol(static_cast<unsigned char>(c))); }
};

}  // namespace

TEST(Tokenizer, Gpt2ByteSymbolsMergesAndPreTokens) {
  ScratchDir dir;
  MiniBpe v(dir.path().string());
  auto t = io::Tokenizer::gpt2(dir.path().string());
  EXPECT_EQ(t.kind(), io::TokenizerKind::gpt2);
  EXPECT_STREQ(t.kind_name(), "gpt2");
  EXPECT_EQ(t.vocab_size(), 257 + int(v.merges.size()));
  EXPECT_EQ(t.end_of_text(), 256);
  ASSERT_EQ(t.files().size(), 2u);
  EXPECT_EQ(t.files()[0].name, "encoder.json");
  EXPECT_EQ(t.files()[0].sha256.size(), 64u);
  // Known symbols: ' ' is Ġ (U+0120), '\n' is Ċ (U+010A), 0xAD is Ń (U+0143).
  EXPECT_EQ(byte_symbol(' '), "\xC4\xA0");
  EXPECT_EQ(byte_symbol('\n'), "\xC4\x8A");
  EXPECT_EQ(byte_symbol(0xAD), "\xC5\x83");
  // Every byte string round-trips, invalid UTF-8 included; one byte is its own token.
  std::string all;
  for (int c = 0; c < 256; ++c) all += char(c);
  EXPECT_EQ(t.decode(t.encode(all)), all);
  EXPECT_EQ(t.encode("\xFF"), std::vector<std::int32_t>{v.byte('\xFF')});
  // Merges by rank: hello -> he ll -> hell o -> hello.
  EXPECT_EQ(t.encode("hello"), std::vector<std::int32_t>{v.id("hello")});
  EXPECT_EQ(t.encode("hell"), std::vector<std::int32_t>{v.id("hell")});
  // White space: "a   b" is a | "  " | " b"; a run at the end stays whole; "a  \nb" is
  // a | "  " | "\n" | b ("a  \nb": the run's last code point goes alone, not being a space).
  EXPECT_EQ(t.encode("a   b"), (std::vector<std::int32_t>{v.byte('a'), v.id("ĠĠ"), v.id("Ġb")}));
  EXPECT_EQ(t.encode("a  "), (std::vector<std::int32_t>{v.byte('a'), v.id("ĠĠ")}));
  EXPECT_EQ(t.encode("a  \nb"),
            (std::vector<std::int32_t>{v.byte('a'), v.id("ĠĠ"), v.byte('\n'), v.byte('b')}));
  EXPECT_EQ(t.encode("a \nb"),
            (std::vector<std::int32_t>{v.byte('a'), v.byte(' '), v.byte('\n'), v.byte('b')}));
  // Contractions are pre-tokens of their own; " 's" is " '" then "s" (no "'s" merge).
  EXPECT_EQ(t.encode("it's"), (std::vector<std::int32_t>{v.byte('i'), v.byte('t'), v.id("'s")}));
  EXPECT_EQ(t.encode(" 's"), (std::vector<std::int32_t>{v.byte(' '), v.byte('\''), v.byte('s')}));
  // Letters and numbers never share a pre-token ("c 1" cannot merge); Unicode classes:
  // é (U+00E9) is a letter (x+Ã merges), ½ (U+00BD) a number (x+Â does not).
  EXPECT_EQ(t.encode("abc1").size(), 4u);
  EXPECT_EQ(t.encode("x\xC3\xA9"), (std::vector<std::int32_t>{v.id("xÃ"), v.byte('\xA9')}));
  EXPECT_EQ(t.encode("x\xC2\xBD"), (std::vector<std::int32_t>{v.byte('x'), v.byte('\xC2'), v.byte('\xBD')}));
  // A literal <|endoftext|> is ordinary text; the id decodes to it.
  const auto literal = t.encode("<|endoftext|>");
  EXPECT_EQ(std::count(literal.begin(), literal.end(), 256), 0);
  EXPECT_EQ(t.decode(literal), "<|endoftext|>");
  EXPECT_EQ(t.decode({256}), "<|endoftext|>");
  EXPECT_CONTAINS(error_of([&] { t.decode({t.vocab_size()}); }), "outside the gpt2 tokenizer");
  // Where prepare-data may cut a block.
  EXPECT_TRUE(t.can_cut("word", " next"));
  EXPECT_TRUE(t.can_cut("word\n", "Next"));
  EXPECT_FALSE(t.can_cut("word \n", "Next"));
  EXPECT_FALSE(t.can_cut("word\n", "  next"));
  EXPECT_FALSE(t.can_cut("word\n\n", "Next"));
  EXPECT_FALSE(t.can_cut("wo", "rd"));
  EXPECT_TRUE(io::Tokenizer::byte().can_cut("a\n", " b"));
  // Stored and loaded back.
  auto copy = io::Tokenizer::gpt2_from_serialized(t.serialized());
  EXPECT_EQ(copy.encode("hello  world"), t.encode("hello  world"));
  io::TokenDataset d;
  d.vocab_size = t.vocab_size();
  d.tokenizer = t.kind_name();
  d.tokenizer_model = t.serialized();
  d.tokens = t.encode("hello there");
  io::write_token_dataset(dir / "g.h5", d);
  auto loaded = io::load_tokenizer(dir / "g.h5");
  EXPECT_EQ(loaded.kind(), io::TokenizerKind::gpt2);
  EXPECT_EQ(loaded.decode(io::read_token_dataset(dir / "g.h5").tokens), "hello there");
}

TEST(Tokenizer, Gpt2BadVocabularies) {
  ScratchDir dir;
  MiniBpe v(dir.path().string());
  const std::string enc = dir / "encoder.json", bpe = dir / "vocab.bpe";
  write_text(bpe, "#version: 0.2\nh e\nq zz\n");
  EXPECT_CONTAINS(error_of([&] { io::Tokenizer::gpt2(dir.path().string()); }),
                  "merge 2 (\"q zz\") names a token not in the vocabulary");
  write_text(bpe, "#version: 0.2\nh e\n");
  write_text(enc, "{\"a\": 0}");
  EXPECT_CONTAINS(error_of([&] { io::Tokenizer::gpt2(dir.path().string()); }), "the vocabulary lacks the token of byte");
  write_text(enc, "{\"a\": 0, \"b\": 0}");
  EXPECT_CONTAINS(error_of([&] { io::Tokenizer::gpt2(dir.path().string()); }), "expected ids 0..1 each once");
  write_text(enc, "[1, 2]");
  EXPECT_CONTAINS(error_of([&] { io::Tokenizer::gpt2(dir.path().string()); }),
                  enc + "': the vocabulary must be a JSON object");
  MiniBpe again(dir.path().string());
  std::filesystem::remove(bpe);
  EXPECT_EQ(error_of([&] { io::Tokenizer::gpt2(dir.path().string()); }),
            "--tokenizer-model: cannot read '" + bpe + "'");
}
