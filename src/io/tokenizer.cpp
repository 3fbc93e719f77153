// Byte and SentencePiece tokenizers (see trident/io/tokenizer.hpp); GPT-2's BPE is in
// tokenizer_gpt2.cpp.
#include "trident/io/tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <unordered_map>

#include "trident/core/error.hpp"
#include "trident/io/dataset.hpp"

namespace trident::io {

// tokenizer_gpt2.cpp
std::vector<std::int32_t> gpt2_encode(Gpt2Bpe& bpe, std::string_view text);
std::string gpt2_decode(const Gpt2Bpe& bpe, const std::vector<std::int32_t>& ids);
bool gpt2_can_cut(std::string_view before, std::string_view after);

namespace {
// <unk> and the 256 byte-fallback pieces come before any learned piece.
constexpr int kReservedPieces = 1 + 256;
}  // namespace

Tokenizer Tokenizer::byte() { return Tokenizer(); }

const char* Tokenizer::kind_name() const {
  switch (kind_) {
    case TokenizerKind::byte: return "byte";
    case TokenizerKind::sentencepiece: return "sentencepiece";
    case TokenizerKind::gpt2: return "gpt2";
  }
  return "?";
}

bool Tokenizer::can_cut(std::string_view before, std::string_view after) const {
  return kind_ != TokenizerKind::gpt2 || gpt2_can_cut(before, after);
}

Tokenizer Tokenizer::train_sentencepiece(const std::string& text_path, int vocab_size,
                                         int num_threads) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(text_path, ec)) fail(text_path, ": no such file");
  // SentencePiece reads `input` as a comma-separated list of files.
  TRIDENT_CHECK(text_path.find(',') == std::string::npos, text_path,
                ": SentencePiece cannot train on a path that contains a comma");
  TRIDENT_CHECK(vocab_size > kReservedPieces, text_path, ": a SentencePiece vocabulary of ",
                vocab_size, " is too small, expected more than ", kReservedPieces,
                " (256 byte pieces and <unk>)");
  const std::unordered_map<std::string, std::string> args = {
      {"input", text_path},
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      {"input_sentence_size", "2000000"},  // lines sampled from a large corpus
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", "16384"},  // bytes; longer lines are left out of training
      {"num_threads", std::to_string(num_threads)},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"minloglevel", "2"},  // SentencePiece's progress log off: errors come back as Status
  };
  std::string serialized;
  auto status = sentencepiece::SentencePieceTrainer::Train(args, nullptr, &serialized);
  if (!status.ok())
    fail(text_path, ": SentencePiece training failed: ", status.ToString());
  return from_serialized(serialized);
}

Tokenizer Tokenizer::from_serialized(const std::string& serialized_model) {
  auto sp = std::make_shared<sentencepiece::SentencePieceProcessor>();
  auto status = sp->LoadFromSerializedProto(serialized_model);
  if (!status.ok()) fail("cannot load the SentencePiece model: ", status.ToString());
  Tokenizer t;
  t.kind_ = TokenizerKind::sentencepiece;
  t.vocab_size_ = sp->GetPieceSize();
  t.serialized_ = serialized_model;
  t.sp_ = std::move(sp);
  return t;
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  if (kind_ == TokenizerKind::byte) {
    out.reserve(text.size());
    for (unsigned char c : text) out.push_back(std::int32_t(c));
    return out;
  }
  if (kind_ == TokenizerKind::gpt2) return gpt2_encode(*bpe_, text);
  // Line by line (each with its newline): SentencePiece trains on lines, so no piece
  // spans a newline and the result equals encoding the whole text at once, without one
  // huge normalization buffer for a corpus.
  std::vector<int> ids;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    end = end == std::string_view::npos ? text.size() : end + 1;
    std::string_view line = text.substr(pos, end - pos);
    auto status = sp_->Encode(absl::string_view(line.data(), line.size()), &ids);
    if (!status.ok()) fail("SentencePiece cannot encode the text: ", status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
    pos = end;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids) const {
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab_size_)
      fail("token id ", ids[i], " (at ", i, ") is outside the ", kind_name(),
           " tokenizer's vocabulary of ", vocab_size_);
  if (kind_ == TokenizerKind::byte) {
    std::string s(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) s[i] = char(static_cast<unsigned char>(ids[i]));
    return s;
  }
  if (kind_ == TokenizerKind::gpt2) return gpt2_decode(*bpe_, ids);
  std::string s;
  auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &s);
  if (!status.ok()) fail("SentencePiece cannot decode the ids: ", status.ToString());
  return s;
}

Tokenizer load_tokenizer(const std::string& dataset_path) {
  TokenDataset d = read_token_dataset_header(dataset_path);
  if (d.tokenizer == "byte") {
    if (d.vocab_size != 256)
      fail(dataset_path, ": tokenizer \"byte\" with vocab_size = ", d.vocab_size, ", expected 256");
    return Tokenizer::byte();
  }
  Tokenizer t = [&] {
    try {
      if (d.tokenizer == "gpt2") return Tokenizer::gpt2_from_serialized(d.tokenizer_model);
      return Tokenizer::from_serialized(d.tokenizer_model);
    } catch (const Error& e) {
      fail(dataset_path, ": /tokenizer/model: ", e.what());
    }
  }();
  if (t.vocab_size() != d.vocab_size)
    fail(dataset_path, t.kind() == TokenizerKind::gpt2 ? ": the GPT-2 vocabulary has "
                                                       : ": the SentencePiece model has ",
         t.vocab_size(), t.kind() == TokenizerKind::gpt2 ? " tokens" : " pieces",
         " but vocab_size = ", d.vocab_size);
  return t;
}

}  // namespace trident::io
