// trident/io/tokenizer.hpp — text <-> token ids: the byte tokenizer (vocabulary 256, id =
// byte value) and SentencePiece BPE models trained on a corpus (byte fallback, so every
// byte string round-trips: decode(encode(text)) == text).
// defines: trident::io::TokenizerKind, Tokenizer, load_tokenizer
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

enum class TokenizerKind { byte, sentencepiece };

// Immutable once made; copies share the SentencePiece model.
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

  TokenizerKind kind() const { return kind_; }
  const char* kind_name() const { return kind_ == TokenizerKind::byte ? "byte" : "sentencepiece"; }
  int vocab_size() const { return vocab_size_; }
  // The serialized SentencePiece model; empty for the byte tokenizer.
  const std::string& serialized() const { return serialized_; }

  std::vector<std::int32_t> encode(std::string_view text) const;
  // Errors on an id outside [0, vocab_size).
  std::string decode(const std::vector<std::int32_t>& ids) const;

 private:
  Tokenizer() = default;
  TokenizerKind kind_ = TokenizerKind::byte;
  int vocab_size_ = 256;
  std::string serialized_;
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp_;
};

// The tokenizer a token dataset was made with (its `tokenizer` attribute and, for
// SentencePiece, /tokenizer/model); checks the model's size against vocab_size.
Tokenizer load_tokenizer(const std::string& dataset_path);

}  // namespace trident::io
