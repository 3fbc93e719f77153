// `trident prepare-data`: text in, token datasets out, streamed (FORMAT.md, "Token dataset").
//
// Rank 0 reads the inputs in order (files, directories, globs, stdin; plain text or JSON
// Lines), cuts them into blocks of whole lines (records), splits off the held-out lines for
// validation and hands one block to each rank per round; every rank tokenizes its block
// and the ranks append their tokens in rank order to one file (io::TokenWriter, MPI-IO).
// Tokens never depend on where blocks are cut (bytes and SentencePiece encode line by line;
// for GPT-2, whose pre-tokens can span lines, a block ends only where Tokenizer::can_cut
// says the cut changes nothing), so any number of ranks writes the same file. GPT-2's
// <|endoftext|> goes between documents. Memory: a block per rank, never the corpus.
#include <glob.h>
#include <mpi.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "commands.hpp"
#include "trident/core/log.hpp"
#include "trident/io/dataset.hpp"
#include "trident/io/tokenizer.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/parallel/comm.hpp"

namespace trident::app {

namespace {

namespace fs = std::filesystem;
constexpr int kBlockLines = 100;  // validation holds out whole blocks of lines

struct Input {
  std::string path;  // "-": stdin
  bool jsonl = false;
  std::uint64_t bytes = 0;  // 0 for stdin (unknown)
};

std::vector<Input> expand_inputs(const PrepareOptions& opt) {
  std::vector<Input> out;
  auto add = [&](const std::string& p) {
    Input in;
    in.path = p;
    const std::string ext = fs::path(p).extension().string();
    in.jsonl = opt.format == "jsonl" || (opt.format == "auto" && (ext == ".jsonl" || ext == ".json"));
    if (p != "-") {
      std::error_code ec;
      std::ifstream f(p, std::ios::binary);
      TRIDENT_CHECK(f.good() && fs::is_regular_file(p, ec), "--input: cannot read text file '", p,
                    "'");
      in.bytes = fs::file_size(p, ec);
    }
    out.push_back(in);
  };
  for (const std::string& p : opt.inputs) {
    std::error_code ec;
    if (p == "-") {
      add(p);
    } else if (fs::is_directory(p, ec)) {
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(p, ec))
        if (e.is_regular_file(ec)) files.push_back(e.path().string());
      std::sort(files.begin(), files.end());
      TRIDENT_CHECK(!files.empty(), "--input: directory '", p, "' holds no files");
      for (const auto& f : files) add(f);
    } else if (!fs::exists(p, ec) && p.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      std::vector<std::string> files;
      if (::glob(p.c_str(), 0, nullptr, &g) == 0)
        for (std::size_t i = 0; i < g.gl_pathc; ++i) files.push_back(g.gl_pathv[i]);
      globfree(&g);
      TRIDENT_CHECK(!files.empty(), "--input: no file matches '", p, "'");
      for (const auto& f : files) add(f);  // glob(3) sorts
    } else {
      add(p);
    }
  }
  TRIDENT_CHECK(std::count_if(out.begin(), out.end(), [](const Input& i) { return i.path == "-"; }) <= 1,
                "--input: stdin (-) given twice");
  return out;
}

// What one rank tokenizes in one round: text bound for train and for valid, with the byte
// offsets where documents begin.
struct Part {
  std::string text;
  std::vector<std::uint64_t> doc_starts;
  std::uint64_t docs_before = 0;  // documents this part's output held before this block
};
struct Block {
  Part train, valid;
  std::uint64_t input_bytes = 0;
  bool empty() const { return train.text.empty() && valid.text.empty(); }
};

void put_u64(std::string& s, std::uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
std::uint64_t get_u64(const std::string& s, std::size_t& at) {
  std::uint64_t v = 0;
  std::memcpy(&v, s.data() + at, 8);
  at += 8;
  return v;
}
std::string pack(const Block& b) {
  std::string s;
  for (const Part* p : {&b.train, &b.valid}) {
    put_u64(s, p->text.size());
    s += p->text;
    put_u64(s, p->doc_starts.size());
    for (auto d : p->doc_starts) put_u64(s, d);
    put_u64(s, p->docs_before);
  }
  put_u64(s, b.input_bytes);
  return s;
}
Block unpack(const std::string& s) {
  Block b;
  std::size_t at = 0;
  for (Part* p : {&b.train, &b.valid}) {
    const std::uint64_t n = get_u64(s, at);
    p->text = s.substr(at, n);
    at += n;
    const std::uint64_t d = get_u64(s, at);
    for (std::uint64_t i = 0; i < d; ++i) p->doc_starts.push_back(get_u64(s, at));
    p->docs_before = get_u64(s, at);
  }
  b.input_bytes = get_u64(s, at);
  return b;
}

// Rank 0's view of the inputs: units (lines of text, records of JSON Lines) in order, each
// bound for train or valid, each file (record) a document.
class Reader {
 public:
  // tok: where a block may end (Tokenizer::can_cut) and whether JSON Lines records get a
  // final newline (not for GPT-2, whose tokens would change).
  Reader(std::vector<Input> inputs, int valid_every, const io::Tokenizer* tok = nullptr)
      : inputs_(std::move(inputs)), valid_every_(valid_every), tok_(tok) {
    record_newline_ = !tok_ || tok_->kind() != io::TokenizerKind::gpt2;
  }

  // Appends whole units to `b` until it holds about `bytes` and the next unit may begin a
  // new block (a document's start always may; past 4 x `bytes` the block ends anyway);
  // false when the inputs are done and nothing was added.
  bool next(Block& b, std::uint64_t bytes) {
    b.train.docs_before = docs_[0];
    b.valid.docs_before = docs_[1];
    for (;;) {
      if (!have_pending_ && !read_unit(pending_, pending_new_doc_)) break;
      have_pending_ = true;
      const std::uint64_t size = b.train.text.size() + b.valid.text.size();
      if (size >= bytes &&
          (pending_new_doc_ || !tok_ || size >= 4 * bytes || tok_->can_cut(tail_, pending_)))
        break;
      have_pending_ = false;
      const bool held = valid_every_ > 0 && (units_ / kBlockLines) % valid_every_ == valid_every_ - 1;
      ++units_;
      if (held) ++valid_units_;
      if (pending_new_doc_) started_[0] = started_[1] = false, tail_.clear();
      Part& p = held ? b.valid : b.train;
      if (!started_[held]) p.doc_starts.push_back(p.text.size()), ++docs_[held];
      started_[held] = true;
      p.text += pending_;
      tail_ += pending_;
      if (tail_.size() > 16) tail_.erase(0, tail_.size() - 16);
    }
    return !b.empty();
  }
  std::uint64_t bytes_read() const { return bytes_; }
  std::int64_t valid_units() const { return valid_units_; }

 private:
  bool read_unit(std::string& unit, bool& new_doc) {
    for (;;) {
      if (!in_) {
        if (next_ == inputs_.size()) return false;
        cur_ = inputs_[next_++];
        line_no_ = 0;
        if (cur_.path == "-") {
          in_ = &std::cin;
        } else {
          file_ = std::ifstream(cur_.path, std::ios::binary);
          TRIDENT_CHECK(file_.good(), "--input: cannot read text file '", cur_.path, "'");
          in_ = &file_;
        }
        doc_open_ = false;
      }
      std::string line;
      if (!std::getline(*in_, line)) {
        TRIDENT_CHECK(!in_->bad(), "--input: error reading '", cur_.path, "'");
        in_ = nullptr;
        file_.close();
        continue;
      }
      ++line_no_;
      const bool had_newline = !in_->eof();
      bytes_ += line.size() + (had_newline ? 1 : 0);
      if (cur_.jsonl) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object() || !j.contains("text") || !j["text"].is_string())
          fail("--input: ", cur_.path == "-" ? "stdin" : cur_.path, ":", line_no_,
               ": expected a JSON object with a string field \"text\" (JSON Lines)");
        unit = j["text"].get<std::string>();
        if (record_newline_ && (unit.empty() || unit.back() != '\n'))
          unit += '\n';  // documents end a line
        new_doc = true;
      } else {
        unit = std::move(line);
        if (had_newline) unit += '\n';
        new_doc = !doc_open_;
        doc_open_ = true;
      }
      return true;
    }
  }

  std::vector<Input> inputs_;
  int valid_every_;
  const io::Tokenizer* tok_;
  bool record_newline_ = true;
  std::string pending_, tail_;  // the unit read ahead; the last bytes added
  bool have_pending_ = false, pending_new_doc_ = false;
  std::uint64_t docs_[2] = {0, 0};  // documents started in train, valid
  std::size_t next_ = 0;
  Input cur_;
  std::ifstream file_;
  std::istream* in_ = nullptr;
  bool doc_open_ = false, started_[2] = {false, false};
  std::int64_t units_ = 0, valid_units_ = 0, line_no_ = 0;
  std::uint64_t bytes_ = 0;
};

// Tokens of a part, segment by segment between document starts (no piece spans a document
// boundary); a document start is kept only where its segment has tokens. With GPT-2 every
// document but a file's first begins with <|endoftext|>.
void tokenize(const io::Tokenizer& tok, const Part& p, std::vector<std::int32_t>& out,
              std::vector<std::int64_t>& docs) {
  out.clear();
  docs.clear();
  const std::string_view text(p.text);
  const auto& starts = p.doc_starts;
  auto encode = [&](std::uint64_t begin, std::uint64_t end) {
    auto ids = tok.encode(text.substr(begin, end - begin));
    out.insert(out.end(), ids.begin(), ids.end());
  };
  // The end of a document begun in an earlier block, then each document (GPT-2's empty
  // JSON Lines records make documents of no text, starting where the next one does).
  if (starts.empty() || starts.front() != 0) encode(0, starts.empty() ? text.size() : starts.front());
  for (std::size_t k = 0; k < starts.size(); ++k) {
    const std::size_t before = out.size();
    if (tok.end_of_text() >= 0 && p.docs_before + k > 0) out.push_back(tok.end_of_text());
    encode(starts[k], k + 1 < starts.size() ? starts[k + 1] : text.size());
    if (out.size() > before) docs.push_back(std::int64_t(before));
  }
}

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  return buf;
}

void bcast_string(parallel::Comm& world, std::string& s, int root) {
  std::uint64_t n = s.size();
  world.broadcast(&n, sizeof n, root);
  s.resize(n);
  if (n) world.broadcast(s.data(), std::int64_t(n), root);
}

// The text the SentencePiece trainer reads: the training part of the inputs (never the
// held-out lines), written by rank 0 to a temporary file.
void write_training_text(const std::vector<Input>& inputs, int valid_every, const std::string& path) {
  Reader r(inputs, valid_every);
  std::ofstream f(path, std::ios::binary);
  TRIDENT_CHECK(f.good(), path, ": cannot write the SentencePiece training text");
  Block b;
  while (r.next(b, 64u << 20)) {
    f << b.train.text;
    b = Block();
  }
  f.close();
  TRIDENT_CHECK(f.good(), path, ": cannot write the SentencePiece training text (disk full?)");
}

}  // namespace

int run_prepare_data(const PrepareOptions& opt_in) {
  PrepareOptions opt = opt_in;
  parallel::Comm world_comm = parallel::Comm::world();
  const int rank = world_comm.rank(), world = world_comm.size();
  std::vector<Input> inputs;
  std::vector<std::string> temporaries;  // removed by rank 0 at the end, whatever happens
  struct Cleanup {
    std::vector<std::string>& files;
    int rank;
    ~Cleanup() {
      std::error_code ec;
      if (rank == 0)
        for (const auto& f : files) fs::remove(f, ec);
    }
  } cleanup{temporaries, rank};

  parallel::agree([&] {
    if (opt.valid_every == 0 && !opt.valid_output.empty()) opt.valid_every = 20;
    TRIDENT_CHECK(opt.valid_every >= 0, "--valid-every must be >= 0");
    if (opt.valid_output.empty()) opt.valid_every = 0;
    if (opt.tokenizer == "gpt2")
      TRIDENT_CHECK(!opt.tokenizer_model.empty(),
                    "--tokenizer gpt2 needs --tokenizer-model PATH (a folder with encoder.json + "
                    "vocab.bpe or vocab.json + merges.txt, or a tokenizer.json)");
    if (!opt.tokenizer_model.empty() && opt.tokenizer != "gpt2") {
      TRIDENT_CHECK(opt.tokenizer != "byte" || opt_in.tokenizer == "byte",
                    "--tokenizer-model needs --tokenizer sentencepiece or gpt2");
      opt.tokenizer = "sentencepiece";
    }
    if (opt.tokenizer == "sentencepiece" && opt.tokenizer_model.empty())
      TRIDENT_CHECK(opt.vocab_size > 0, "--tokenizer sentencepiece needs --vocab-size N");
    if (opt.tokenizer == "byte")
      TRIDENT_CHECK(opt.vocab_size == 0 || opt.vocab_size == 256,
                    "--tokenizer byte has a vocabulary of 256, not --vocab-size ", opt.vocab_size);
    if (rank != 0) return;
    inputs = expand_inputs(opt);
    for (const auto& i : inputs)  // issue 32: --output X --input X destroyed the corpus
      for (const auto& [key, o] : {std::pair{"--output", opt.output}, {"--valid-output", opt.valid_output}})
        refuse_output_over_input(key, o, "--input", i.path);
    std::uint64_t total = 0;
    bool has_stdin = false;
    for (const auto& i : inputs) total += i.bytes, has_stdin |= i.path == "-";
    TRIDENT_CHECK(total > 0 || has_stdin, "--input: '", inputs.size() == 1 ? inputs[0].path : opt.inputs[0],
                  "' is empty");
  });

  // The tokenizer, the same on every rank.
  std::string model, gpt2_files;  // gpt2_files: "name sha256" lines
  parallel::agree([&] {
    if (rank != 0 || opt.tokenizer == "byte") return;
    if (opt.tokenizer == "gpt2") {
      io::Tokenizer t = io::Tokenizer::gpt2(opt.tokenizer_model);
      model = t.serialized();
      for (const auto& f : t.files()) gpt2_files += f.name + " " + f.sha256 + "\n";
      return;
    }
    if (!opt.tokenizer_model.empty()) {
      std::ifstream f(opt.tokenizer_model, std::ios::binary);
      TRIDENT_CHECK(f.good(), "--tokenizer-model: cannot read '", opt.tokenizer_model, "'");
      model.assign(std::istreambuf_iterator<char>(f), {});
      return;
    }
    // Training reads the inputs twice: stdin is kept in a file for the second pass.
    for (auto& in : inputs)
      if (in.path == "-") {
        const std::string spool = opt.output + ".stdin.tmp";
        temporaries.push_back(spool);
        std::ofstream f(spool, std::ios::binary);
        f << std::cin.rdbuf();
        f.close();
        TRIDENT_CHECK(f.good(), spool, ": cannot keep stdin for the second pass (disk full?)");
        in.path = spool;
        std::error_code ec;
        in.bytes = fs::file_size(spool, ec);
      }
    const std::string text = opt.output + ".train-text.tmp";
    temporaries.push_back(text);
    write_training_text(inputs, opt.valid_every, text);
    model = io::Tokenizer::train_sentencepiece(text, opt.vocab_size).serialized();
  });
  bcast_string(world_comm, model, 0);
  bcast_string(world_comm, gpt2_files, 0);
  io::Tokenizer tok = io::Tokenizer::byte();
  parallel::agree([&] {
    if (model.empty()) return;
    try {
      tok = opt.tokenizer == "gpt2" ? io::Tokenizer::gpt2_from_serialized(model)
                                    : io::Tokenizer::from_serialized(model);
    } catch (const Error& e) {
      fail("--tokenizer-model: '", opt.tokenizer_model, "': ", e.what());
    }
    if (!opt.tokenizer_model.empty() && opt.vocab_size > 0)
      TRIDENT_CHECK(opt.vocab_size == tok.vocab_size(), "--vocab-size ", opt.vocab_size,
                    " differs from the ", tok.vocab_size(), " tokens of --tokenizer-model '",
                    opt.tokenizer_model, "'");
  });

  io::TokenDataset header;
  header.vocab_size = tok.vocab_size();
  header.tokenizer = tok.kind_name();
  header.tokenizer_model = tok.serialized();
  for (std::size_t at = 0; at < gpt2_files.size();) {
    const std::size_t sp = gpt2_files.find(' ', at), nl = gpt2_files.find('\n', at);
    header.tokenizer_files.emplace_back(gpt2_files.substr(at, sp - at), gpt2_files.substr(sp + 1, nl - sp - 1));
    at = nl + 1;
  }
  parallel::Comm* comm = world > 1 ? &world_comm : nullptr;
  std::unique_ptr<io::TokenWriter> train, valid;
  // Collective inside, but every rank fails alike (the directory, the file system).
  parallel::agree([&] {
    train = std::make_unique<io::TokenWriter>(opt.output, header, comm);
    if (!opt.valid_output.empty())
      valid = std::make_unique<io::TokenWriter>(opt.valid_output, header, comm);
  });

  std::unique_ptr<Reader> reader;
  std::uint64_t total_bytes = 0;
  bool size_known = true;
  if (rank == 0) {
    for (const auto& i : inputs) total_bytes += i.bytes, size_known &= i.path != "-";
    reader = std::make_unique<Reader>(inputs, opt.valid_every, &tok);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto last_report = t0;
  const std::uint64_t block_bytes = std::uint64_t(std::max(1.0, opt.block_mb * 1e6));
  std::uint64_t train_bytes = 0, valid_bytes = 0;
  std::vector<std::int32_t> tt, vt;
  std::vector<std::int64_t> td, vd;
  for (;;) {
    std::vector<Block> blocks;
    parallel::agree([&] {
      if (rank != 0) return;
      for (int k = 0; k < world; ++k) {
        Block b;
        if (!reader->next(b, block_bytes)) break;
        blocks.push_back(std::move(b));
      }
    });
    int nb = int(blocks.size());
    world_comm.broadcast(&nb, sizeof nb, 0);
    if (nb == 0) break;
    Block mine;
    if (rank == 0) {
      for (int k = 1; k < nb; ++k) {
        const std::string s = pack(blocks[std::size_t(k)]);
        std::uint64_t n = s.size();
        world_comm.send(&n, sizeof n, k, 17);
        world_comm.send(s.data(), std::int64_t(n), k, 18);
      }
      for (const auto& b : blocks) train_bytes += b.train.text.size(), valid_bytes += b.valid.text.size();
      mine = std::move(blocks[0]);
    } else if (rank < nb) {
      std::uint64_t n = 0;
      world_comm.recv(&n, sizeof n, 0, 17);
      std::string s(n, '\0');
      world_comm.recv(s.data(), std::int64_t(n), 0, 18);
      mine = unpack(s);
    }
    parallel::agree([&] {
      tokenize(tok, mine.train, tt, td);
      tokenize(tok, mine.valid, vt, vd);
    });
    train->append(tt, td);
    if (valid) valid->append(vt, vd);
    const auto now = std::chrono::steady_clock::now();
    if (rank == 0 && std::chrono::duration<double>(now - last_report).count() >= 5.0) {
      last_report = now;
      const double s = std::chrono::duration<double>(now - t0).count();
      const double done = double(reader->bytes_read()), mbs = done / 1e6 / s;
      std::string eta;
      if (size_known && total_bytes > 0) {
        char buf[64];
        std::snprintf(buf, sizeof buf, " of %s (%.0f%%), ETA %.0f s", human_bytes(double(total_bytes)).c_str(),
                      100.0 * done / double(total_bytes), (double(total_bytes) - done) / 1e6 / mbs);
        eta = buf;
      }
      char line[256];
      std::snprintf(line, sizeof line, "prepare-data: %s%s, %lld tokens, %.1f MB/s (%.1f MB/s per rank)",
                    human_bytes(done).c_str(), eta.c_str(),
                    static_cast<long long>(train->num_tokens() + (valid ? valid->num_tokens() : 0)),
                    mbs, mbs / world);
      log::info(line);
    }
    if (nb < world) break;  // the inputs ran out this round
  }
  std::int64_t valid_units = rank == 0 ? reader->valid_units() : 0;
  world_comm.broadcast(&valid_units, sizeof valid_units, 0);
  parallel::agree([&] {
    TRIDENT_CHECK(!valid || valid_units > 0, "--input: '", opt.inputs[0],
                  "' is too short to hold out every ", opt.valid_every, "-th block of ",
                  kBlockLines, " lines for --valid-output");
    TRIDENT_CHECK(train->num_tokens() > 0, opt.output, ": no tokens to write (empty input?)");
  });
  train->finish();
  if (valid) valid->finish();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::uint64_t in_bytes = rank == 0 ? reader->bytes_read() : 0;
  char rate[96];
  std::snprintf(rate, sizeof rate, "%.1f MB/s, %.1f MB/s per rank on %d rank%s",
                double(in_bytes) / 1e6 / std::max(s, 1e-9), double(in_bytes) / 1e6 / std::max(s, 1e-9) / world,
                world, world > 1 ? "s" : "");
  log::info(opt.output, ": ", train->num_tokens(), " tokens in ", train->num_documents(),
            " documents (", tok.kind_name(), ", vocabulary ", tok.vocab_size(), ") from ",
            train_bytes, " bytes");
  if (valid)
    log::info(opt.valid_output, ": ", valid->num_tokens(), " tokens from ", valid_bytes, " bytes");
  log::info("prepare-data: ", human_bytes(double(in_bytes)), " in ", s, " s (", rate, ")");
  return 0;
}

}  // namespace trident::app
