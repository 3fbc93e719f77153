// GPT-2's byte-level BPE (see trident/io/tokenizer.hpp), as OpenAI's encoder.py does it:
// the text is cut into pre-tokens by GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (a hand-written scanner over code points; letters, numbers and white space from ICU's
// tables: \p{L} = general category L*, \p{N} = N*, \s = Unicode White_Space, as tiktoken's
// Rust regex has them), each pre-token's bytes are mapped to GPT-2's printable symbols
// (bytes_to_unicode) and merged by rank, lowest first, every occurrence of the pair at once.
// A byte that is not part of valid UTF-8 counts as a symbol (neither letter, number nor space).
#include <openssl/evp.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <unordered_map>

#include "trident/core/error.hpp"
#include "trident/io/tokenizer.hpp"

namespace trident::io {

namespace fs = std::filesystem;

struct Gpt2Bpe {
  std::vector<std::string> bytes_of;  // id -> the bytes it stands for
  std::int32_t byte_id[256] = {};      // byte -> its one-byte token
  // (left id, right id) -> (rank, merged id)
  std::unordered_map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> merges;
  std::mutex cache_mutex;
  std::unordered_map<std::string, std::vector<std::int32_t>> cache;  // pre-token -> ids

  void bpe(std::string_view piece, std::vector<std::int32_t>& out);
};

namespace {

constexpr const char* kEndOfText = "<|endoftext|>";

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for
// U+0100 onwards, in byte order. Each symbol as UTF-8.
std::vector<std::string> byte_symbols() {
  std::vector<int> cp(256, -1);
  for (int b = '!'; b <= '~'; ++b) cp[b] = b;
  for (int b = 0xA1; b <= 0xAC; ++b) cp[b] = b;
  for (int b = 0xAE; b <= 0xFF; ++b) cp[b] = b;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (cp[b] < 0) cp[b] = 256 + n++;
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) {
    char buf[4];
    std::int32_t len = 0;
    UBool err = false;
    U8_APPEND(reinterpret_cast<std::uint8_t*>(buf), len, 4, cp[b], err);
    (void)err;  // every code point here fits
    out[b].assign(buf, std::size_t(len));
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TRIDENT_CHECK(f.good(), "--tokenizer-model: cannot read '", path, "'");
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string sha256_hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  TRIDENT_CHECK(EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr) == 1,
                "SHA-256 failed");
  std::string hex;
  char buf[3];
  for (unsigned int i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", md[i]);
    hex += buf;
  }
  return hex;
}

// The parsed tables before they are checked and indexed.
struct RawBpe {
  nlohmann::json vocab;                                     // symbol string -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
};

nlohmann::json parse_json(const std::string& text, const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) fail("--tokenizer-model: '", path, "' is not valid JSON");
  return j;
}

void check_vocab(const nlohmann::json& v, const std::string& path, const char* what) {
  if (!v.is_object() || v.empty())
    fail("--tokenizer-model: '", path, "': ", what,
         " must be a JSON object mapping each token to its id");
}

// vocab.bpe / merges.txt: an optional "#version" line, then one "left right" per line.
std::vector<std::pair<std::string, std::string>> parse_merges(const std::string& text,
                                                              const std::string& path) {
  std::vector<std::pair<std::string, std::string>> out;
  std::size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const std::size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string::npos)
      fail("--tokenizer-model: '", path, "':", line_no,
           ": expected a merge \"LEFT RIGHT\" (two symbols and one space)");
    out.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  if (out.empty()) fail("--tokenizer-model: '", path, "' holds no merges");
  return out;
}

RawBpe parse_tokenizer_json(const std::string& text, const std::string& path) {
  nlohmann::json j = parse_json(text, path);
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    fail("--tokenizer-model: '", path, "': expected a tokenizer.json with an object \"model\"");
  const nlohmann::json& m = j["model"];
  if (m.contains("type") && m["type"] != "BPE")
    fail("--tokenizer-model: '", path, "': model.type is ", m["type"].dump(),
         ", expected \"BPE\" (GPT-2's byte-level BPE)");
  RawBpe r;
  if (!m.contains("vocab")) fail("--tokenizer-model: '", path, "': no model.vocab");
  r.vocab = m["vocab"];
  check_vocab(r.vocab, path, "model.vocab");
  if (!m.contains("merges") || !m["merges"].is_array() || m["merges"].empty())
    fail("--tokenizer-model: '", path, "': model.merges must be a non-empty array");
  std::size_t i = 0;
  for (const auto& e : m["merges"]) {
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const std::size_t sp = s.find(' ');
      if (sp != std::string::npos && sp > 0 && sp + 1 < s.size() &&
          s.find(' ', sp + 1) == std::string::npos) {
        r.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        ++i;
        continue;
      }
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      r.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      ++i;
      continue;
    }
    fail("--tokenizer-model: '", path, "': model.merges[", i,
         "] is neither \"LEFT RIGHT\" nor [\"LEFT\", \"RIGHT\"]");
  }
  // Added tokens (GPT-2's <|endoftext|>) may live outside model.vocab.
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"])
      if (t.is_object() && t.contains("content") && t["content"].is_string() && t.contains("id") &&
          t["id"].is_number_integer() && !r.vocab.contains(t["content"].get<std::string>()))
        r.vocab[t["content"].get<std::string>()] = t["id"];
  return r;
}

// Checks the tables and builds the tokenizer's state; `where` names the source in errors.
std::shared_ptr<Gpt2Bpe> build(const RawBpe& raw, const std::string& where, int& vocab_size,
                               std::int32_t& eot) {
  auto bpe = std::make_shared<Gpt2Bpe>();
  const std::vector<std::string> sym = byte_symbols();
  std::unordered_map<std::string, int> sym_byte;  // symbol -> byte
  for (int b = 0; b < 256; ++b) sym_byte[sym[b]] = b;
  const std::size_t n = raw.vocab.size();
  bpe->bytes_of.assign(n, std::string());
  std::vector<bool> seen(n, false);
  std::unordered_map<std::string, std::int32_t> id_of;
  id_of.reserve(n);
  for (const auto& [key, value] : raw.vocab.items()) {
    if (!value.is_number_integer() || value.get<std::int64_t>() < 0 ||
        value.get<std::int64_t>() >= std::int64_t(n) || seen[value.get<std::size_t>()])
      fail(where, ": the id of token ", nlohmann::json(key).dump(), " is ", value.dump(),
           ", expected ids 0..", n - 1, " each once");
    const auto id = value.get<std::int32_t>();
    seen[std::size_t(id)] = true;
    id_of[key] = id;
    // The token's bytes: each code point is one byte's symbol (special tokens like
    // <|endoftext|> are printable ASCII, so they too).
    std::string bytes;
    std::size_t i = 0;
    while (i < key.size()) {
      std::size_t len = 1;
      const auto c = static_cast<unsigned char>(key[i]);
      if (c >= 0xC0) len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      auto it = sym_byte.find(key.substr(i, len));
      if (it == sym_byte.end())
        fail(where, ": token ", nlohmann::json(key).dump(),
             " is not in GPT-2's byte-level alphabet (not a byte-level BPE vocabulary?)");
      bytes += char(it->second);
      i += len;
    }
    bpe->bytes_of[std::size_t(id)] = bytes;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = id_of.find(sym[b]);
    if (it == id_of.end())
      fail(where, ": the vocabulary lacks the token of byte ", b, " (", sym[b], ")");
    bpe->byte_id[b] = it->second;
  }
  auto eot_it = id_of.find(kEndOfText);
  if (eot_it == id_of.end()) fail(where, ": the vocabulary lacks ", kEndOfText);
  eot = eot_it->second;
  bpe->merges.reserve(raw.merges.size());
  for (std::size_t r = 0; r < raw.merges.size(); ++r) {
    const auto& [a, b] = raw.merges[r];
    auto ia = id_of.find(a), ib = id_of.find(b), iab = id_of.find(a + b);
    if (ia == id_of.end() || ib == id_of.end() || iab == id_of.end())
      fail(where, ": merge ", r + 1, " (\"", a, " ", b, "\") names a token not in the vocabulary");
    const std::uint64_t key = std::uint64_t(std::uint32_t(ia->second)) << 32 | std::uint32_t(ib->second);
    bpe->merges.emplace(key, std::make_pair(std::int32_t(r), iab->second));  // first rank wins
  }
  vocab_size = int(n);
  return bpe;
}

// ---- pre-tokenization ---------------------------------------------------------------------

enum class CharClass { letter, number, space, other };

struct CodePoint {
  CharClass cls;
  std::size_t len;
  UChar32 c;
};

CodePoint next_code_point(std::string_view s, std::size_t i) {
  UChar32 c = 0;
  std::int32_t at = 0;
  const auto* p = reinterpret_cast<const std::uint8_t*>(s.data() + i);
  const auto n = std::int32_t(std::min<std::size_t>(s.size() - i, 4));
  U8_NEXT(p, at, n, c);
  if (c < 0) return {CharClass::other, 1, c};  // not valid UTF-8: one byte, a symbol
  CharClass cls = CharClass::other;
  if (c < 0x80) {  // ASCII fast path, same classes as ICU's
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) cls = CharClass::letter;
    else if (c >= '0' && c <= '9') cls = CharClass::number;
    else if (c == ' ' || (c >= 0x09 && c <= 0x0D)) cls = CharClass::space;
  } else {
    const std::uint32_t mask = U_GET_GC_MASK(c);
    if (mask & U_GC_L_MASK) cls = CharClass::letter;
    else if (mask & U_GC_N_MASK) cls = CharClass::number;
    else if (u_isUWhiteSpace(c)) cls = CharClass::space;
  }
  return {cls, std::size_t(at), c};
}

// Calls emit(begin, end) for each pre-token of `s`, in order.
template <class Emit>
void pre_tokenize(std::string_view s, Emit&& emit) {
  static const char* const kContractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
  std::size_t pos = 0;
  const std::size_t n = s.size();
  while (pos < n) {
    if (s[pos] == '\'') {
      bool matched = false;
      for (const char* k : kContractions) {
        const std::string_view kv(k);
        if (s.substr(pos, kv.size()) == kv) {
          emit(pos, pos + kv.size());
          pos += kv.size();
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    CodePoint cp = next_code_point(s, pos);
    std::size_t start = pos, body = pos;
    CharClass cls = cp.cls;
    // " ?X+": a space joins the run of letters, numbers or symbols that follows it.
    if (s[pos] == ' ' && pos + 1 < n) {
      CodePoint next = next_code_point(s, pos + 1);
      if (next.cls != CharClass::space) {
        body = pos + 1;
        cp = next;
        cls = next.cls;
      }
    }
    if (cls != CharClass::space) {
      std::size_t end = body + cp.len;
      while (end < n) {
        CodePoint c = next_code_point(s, end);
        if (c.cls != cls) break;
        end += c.len;
      }
      emit(start, end);
      pos = end;
      continue;
    }
    // White space: "\s+(?!\S)" takes the run but its last code point when a non-space
    // follows (that one goes alone, or with what follows when it is ' '), all of it at the end.
    std::size_t end = pos, last = pos;
    int count = 0;
    while (end < n) {
      CodePoint c = next_code_point(s, end);
      if (c.cls != CharClass::space) break;
      last = end;
      end += c.len;
      ++count;
    }
    if (end < n && count > 1) end = last;
    emit(start, end);
    pos = end;
  }
}

}  // namespace

// OpenAI's bpe(): merge the lowest-ranked adjacent pair, every occurrence left to right,
// until no adjacent pair is a merge.
void Gpt2Bpe::bpe(std::string_view piece, std::vector<std::int32_t>& out) {
  if (piece.size() == 1) {
    out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = cache.find(std::string(piece));
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<std::int32_t> word(piece.size()), next;
  for (std::size_t i = 0; i < piece.size(); ++i) word[i] = byte_id[static_cast<unsigned char>(piece[i])];
  auto key = [](std::int32_t a, std::int32_t b) {
    return std::uint64_t(std::uint32_t(a)) << 32 | std::uint32_t(b);
  };
  while (word.size() > 1) {
    std::int32_t best_rank = INT32_MAX, best_id = -1;
    std::uint64_t best = 0;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = merges.find(key(word[i], word[i + 1]));
      if (it != merges.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        best_id = it->second.second;
        best = it->first;
      }
    }
    if (best_id < 0) break;
    next.clear();
    for (std::size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && key(word[i], word[i + 1]) == best) {
        next.push_back(best_id);
        i += 2;
      } else {
        next.push_back(word[i++]);
      }
    }
    word.swap(next);
  }
  out.insert(out.end(), word.begin(), word.end());
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (cache.size() >= (1u << 18)) cache.clear();  // bounded: a corpus has a long tail of words
  cache.emplace(std::string(piece), std::move(word));
}

Tokenizer Tokenizer::gpt2(const std::string& path) {
  std::error_code ec;
  RawBpe raw;
  std::vector<TokenizerFile> files;
  auto take = [&](const std::string& file) {
    std::string text = read_file(file);
    files.push_back({fs::path(file).filename().string(), sha256_hex(text)});
    return text;
  };
  std::string where;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    std::string vocab_file, merges_file;
    if (fs::exists(dir / "encoder.json", ec) || fs::exists(dir / "vocab.bpe", ec)) {
      vocab_file = (dir / "encoder.json").string();
      merges_file = (dir / "vocab.bpe").string();
    } else if (fs::exists(dir / "vocab.json", ec) || fs::exists(dir / "merges.txt", ec)) {
      vocab_file = (dir / "vocab.json").string();
      merges_file = (dir / "merges.txt").string();
    } else if (fs::exists(dir / "tokenizer.json", ec)) {
      return gpt2((dir / "tokenizer.json").string());
    } else {
      fail("--tokenizer-model: folder '", path, "' holds neither encoder.json + vocab.bpe, "
           "vocab.json + merges.txt nor tokenizer.json");
    }
    raw.vocab = parse_json(take(vocab_file), vocab_file);
    check_vocab(raw.vocab, vocab_file, "the vocabulary");
    raw.merges = parse_merges(take(merges_file), merges_file);
    where = "--tokenizer-model: '" + vocab_file + "' and '" + merges_file + "'";
  } else {
    raw = parse_tokenizer_json(take(path), path);
    where = "--tokenizer-model: '" + path + "'";
  }
  Tokenizer t;
  t.kind_ = TokenizerKind::gpt2;
  t.bpe_ = build(raw, where, t.vocab_size_, t.end_of_text_);
  t.files_ = std::move(files);
  // What the dataset stores: the tables in one canonical JSON text.
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [a, b] : raw.merges) merges.push_back(a + " " + b);
  t.serialized_ = nlohmann::json{{"format", "gpt2-bpe"}, {"vocab", raw.vocab}, {"merges", merges}}.dump();
  return t;
}

Tokenizer Tokenizer::gpt2_from_serialized(const std::string& serialized_model) {
  nlohmann::json j = nlohmann::json::parse(serialized_model, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "gpt2-bpe" ||
      !j.contains("vocab") || !j.contains("merges") || !j["merges"].is_array())
    fail("not a GPT-2 tokenizer (expected JSON with format \"gpt2-bpe\", vocab and merges)");
  RawBpe raw;
  raw.vocab = j["vocab"];
  check_vocab(raw.vocab, "/tokenizer/model", "vocab");
  for (const auto& m : j["merges"]) {
    const std::string s = m.is_string() ? m.get<std::string>() : std::string();
    const std::size_t sp = s.find(' ');
    if (sp == std::string::npos) fail("a GPT-2 merge is not \"LEFT RIGHT\"");
    raw.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
  }
  Tokenizer t;
  t.kind_ = TokenizerKind::gpt2;
  t.bpe_ = build(raw, "the GPT-2 tokenizer", t.vocab_size_, t.end_of_text_);
  t.serialized_ = serialized_model;
  return t;
}

std::vector<std::int32_t> gpt2_encode(Gpt2Bpe& bpe, std::string_view text) {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3);
  pre_tokenize(text, [&](std::size_t b, std::size_t e) { bpe.bpe(text.substr(b, e - b), out); });
  return out;
}

std::string gpt2_decode(const Gpt2Bpe& bpe, const std::vector<std::int32_t>& ids) {
  std::string s;
  for (auto id : ids) s += bpe.bytes_of[std::size_t(id)];
  return s;
}

bool gpt2_can_cut(std::string_view before, std::string_view after) {
  if (before.empty() || after.empty()) return true;
  // The last code point of `before` (and the one before it) and the first of `after`.
  std::vector<CodePoint> tail;
  std::size_t i = before.size() >= 8 ? before.size() - 8 : 0;
  while (i < before.size()) {
    CodePoint c = next_code_point(before, i);
    tail.push_back(c);
    i += c.len;
  }
  const CodePoint a = tail.back(), b = next_code_point(after, 0);
  if (a.cls != CharClass::space) return b.cls == CharClass::space;
  return a.c != ' ' && b.cls != CharClass::space && tail.size() >= 2 &&
         tail[tail.size() - 2].cls != CharClass::space;
}

}  // namespace trident::io
