// trident/io/tokenizer.hpp — text <-> token ids: the byte tokenizer (vocabulary 256, id =
// byte value), SentencePiece BPE models trained on a corpus (byte fallback, so every
// byte string round-trips: decode(encode(text)) == text) and GPT-2's byte-level BPE read
// from OpenAI's or Hugging Face's files (also round-trips every byte string).
// defines: trident::io::TokenizerKind, Tokenizer, TokenizerFile, load_tokenizer
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace trident::io {

enum class TokenizerKind { byte, sentencepiece, gpt2 };

struct Gpt2Bpe;  // tokenizer_gpt2.cpp

// A file a tokenizer was read from, for the dataset's record.
struct TokenizerFile {
  std::string name;    // base name, e.g. "encoder.json"
  std::string sha256;  // lower-case hex
};

// Immutable once made; copies share the SentencePiece model or the GPT-2 tables (whose
// cache of encoded words is behind a mutex).
class Tokenizer {
 public:
  static Tokenizer byte();
  // Trains a BPE model of `vocab_size` pieces on the text file `text_path`, one sentence
  // per line (SentencePiece's input_sentence_size bounds the lines it samples). Settings:
  // model_type=bpe, character_coverage=1.0, byte_fallback=true, identity normalization,
  // no added dummy prefix and no whitespace folding (so that text round-trips exactly),
  // no BOS/EOS pieces. vocab_size must leave room for the 256 byte pieces and <unk>.
  static Tokenizer train_sentencepiece(const std::string& text_path, int vocab_size,
                                       int num_threads = 2);
  // A SentencePiece model from its serialized ModelProto bytes (what serialized() gives).
  static Tokenizer from_serialized(const std::string& serialized_model);
  // GPT-2's byte-level BPE from `path`: a folder holding encoder.json + vocab.bpe (OpenAI)
  // or vocab.json + merges.txt (Hugging Face), or a tokenizer.json whose model is a BPE
  // (model.vocab, model.merges as "a b" strings or ["a", "b"] pairs). The vocabulary must
  // hold <|endoftext|>, every byte's symbol and every merge's parts and result, with ids
  // 0..N-1 each once. Errors name the file.
  static Tokenizer gpt2(const std::string& path);
  // From what serialized() gives for a GPT-2 tokenizer (a JSON text with vocab and merges).
  static Tokenizer gpt2_from_serialized(const std::string& serialized_model);

  TokenizerKind kind() const { return kind_; }
  const char* kind_name() const;
  int vocab_size() const { return vocab_size_; }
  // The serialized SentencePiece model or GPT-2 vocabulary and merges; empty for bytes.
  const std::string& serialized() const { return serialized_; }
  // GPT-2: the files the tokenizer was read from (empty when it came from a dataset).
  const std::vector<TokenizerFile>& files() const { return files_; }
  // The id that separates documents (GPT-2's <|endoftext|>); -1: none (documents are only
  // recorded in the dataset's /documents).
  std::int32_t end_of_text() const { return end_of_text_; }

  // GPT-2: `text` is ordinary text, a literal "<|endoftext|>" in it included (tiktoken's
  // encode_ordinary); the separator id comes only from end_of_text().
  std::vector<std::int32_t> encode(std::string_view text) const;
  // Whether encoding `before` and `after` separately gives the tokens of encoding their
  // concatenation (`before` being the last bytes of the text so far). Line ends always are
  // for bytes and SentencePiece (they encode line by line); for GPT-2 a cut is safe between
  // a non-space and a space, or after a lone line break followed by a non-space.
  bool can_cut(std::string_view before, std::string_view after) const;
  // Errors on an id outside [0, vocab_size).
  std::string decode(const std::vector<std::int32_t>& ids) const;

 private:
  Tokenizer() = default;
  TokenizerKind kind_ = TokenizerKind::byte;
  int vocab_size_ = 256;
  std::string serialized_;
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp_;
  std::shared_ptr<Gpt2Bpe> bpe_;
  std::vector<TokenizerFile> files_;
  std::int32_t end_of_text_ = -1;
};

// The tokenizer a token dataset was made with (its `tokenizer` attribute and, for
// SentencePiece and GPT-2, /tokenizer/model); checks the model's size against vocab_size.
Tokenizer load_tokenizer(const std::string& dataset_path);

}  // namespace trident::io
