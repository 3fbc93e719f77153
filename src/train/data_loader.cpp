// Sharded, blended token data with a cached per-epoch sample index (see
// trident/train/data_loader.hpp; the index file is FORMAT.md's "Sample index").
#include "trident/train/data_loader.hpp"

#include <glob.h>

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <utility>

#include "trident/core/error.hpp"
#include "trident/core/log.hpp"
#include "trident/core/rng.hpp"
#include "trident/io/h5.hpp"

namespace trident::train {

namespace fs = std::filesystem;
namespace h5 = io::h5;

namespace {

constexpr int kIndexVersion = 1;
constexpr std::int64_t kBlock = 1 << 20;   // entries per write/check block
constexpr std::size_t kMaxOpenFiles = 64;  // shard files a rank keeps open

std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The index's own checksum: a sum over its arrays of mix(array, position, value).
std::uint64_t entries_checksum(const std::int64_t* v, std::int64_t n, std::int64_t first,
                               std::uint64_t salt) {
  std::uint64_t s = 0;
  for (std::int64_t i = 0; i < n; ++i)
    s += mix64((std::uint64_t(first + i) * 0x9E3779B97F4A7C15ull) ^ mix64(salt) ^
               std::uint64_t(v[i]));
  return s;
}

// The file and memory dataspaces of the 1-D range [at, at + n) of ds.
struct Range1d {
  h5::Hid file, mem;
};
Range1d range_1d(hid_t ds, std::int64_t at, std::int64_t n) {
  h5::Hid fspace(H5Dget_space(ds));
  hsize_t s = hsize_t(at), c = hsize_t(n);
  H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &s, nullptr, &c, nullptr);
  return {std::move(fspace), h5::Hid(H5Screate_simple(1, &c, nullptr))};
}

// 1-D ranges of int64 (mem_type NATIVE_UINT64 for the uint64 checksums, bit for bit).
void read_i64(hid_t ds, std::int64_t at, std::int64_t n, std::int64_t* out, const std::string& what,
              hid_t mem_type = H5T_NATIVE_INT64) {
  if (n <= 0) return;
  const Range1d r = range_1d(ds, at, n);
  if (H5Dread(ds, mem_type, r.mem, r.file, H5P_DEFAULT, out) < 0)
    fail(what, ": cannot read ", h5::object_name(ds), "[", at, ":", at + n, "]");
}

void write_i64(hid_t ds, std::int64_t at, std::int64_t n, const std::int64_t* v,
               const std::string& what, hid_t mem_type = H5T_NATIVE_INT64) {
  if (n <= 0) return;
  const Range1d r = range_1d(ds, at, n);
  if (H5Dwrite(ds, mem_type, r.mem, r.file, H5P_DEFAULT, v) < 0)
    fail(what, ": cannot write ", h5::object_name(ds), " (disk full?)");
}

// What rank 0 learns of one dataset of the blend from its files.
struct DatasetInfo {
  std::string source;
  double weight = 0;  // normalized
  std::vector<std::string> files;
  std::vector<std::int64_t> shard_tokens;
  std::vector<std::uint64_t> shard_checksums;
  std::int64_t sequences = 0;  // per epoch
};

std::int64_t sequences_in(std::int64_t tokens, int T) { return tokens > T ? (tokens - 1) / T : 0; }

std::vector<double> normalized(const std::vector<DataSource>& sources) {
  // Scaled by the largest weight first: weights of 1e308 summed to inf and normalised to 0.
  double largest = 0;
  for (const auto& s : sources) largest = std::max(largest, s.weight);
  double total = 0;
  for (const auto& s : sources) total += s.weight / largest;
  std::vector<double> w;
  for (const auto& s : sources) w.push_back(s.weight / largest / total);
  return w;
}

// Sequences each dataset contributes to the first n of the blend (Megatron's greedy
// blending: the next sequence goes to the dataset furthest below its share; ties to the
// first). Calls emit(d, position within d) for each.
template <typename Emit>
void blend(const std::vector<double>& w, std::int64_t n, Emit emit) {
  std::vector<std::int64_t> count(w.size(), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    std::size_t best = 0;
    double best_gap = -1e300;
    for (std::size_t d = 0; d < w.size(); ++d) {
      const double gap = w[d] * double(i + 1) - double(count[d]);
      if (gap > best_gap) best_gap = gap, best = d;
    }
    emit(int(best), count[best]++);
  }
}

// A basic TOML string, escaped.
std::string toml_quoted(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// The shortest decimal that reads back as v ("0.7", not "0.69999999999999996").
std::string shortest(double v) {
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string dataset_group(std::size_t k) { return "dataset_" + std::to_string(k); }

// Why an existing index does not fit (empty: it fits).
std::string stale_reason(const h5::File& f, const std::vector<DatasetInfo>& infos,
                         const LoaderOptions& opt) {
  if (h5::read_attr_int(f, "version") != kIndexVersion) return "another index version";
  if (h5::read_attr_u64(f, "seed") != opt.seed) return "another train.seed";
  if (h5::read_attr_string(f, "stream") != opt.stream) return "another stream";
  if (h5::read_attr_int(f, "seq_len") != opt.seq_len) return "another model.seq_len";
  if (h5::read_attr_int(f, "num_datasets") != std::int64_t(infos.size()))
    return "another number of datasets";
  if (h5::read_attr_int(f, "sequences") < opt.sequences) return "more sequences needed";
  for (std::size_t k = 0; k < infos.size(); ++k) {
    h5::Hid g = h5::open_group(f, dataset_group(k));
    if (h5::read_attr_double(g, "weight") != infos[k].weight) return "other weights";
    h5::Hid st = h5::open_dataset(g, "shard_tokens"), sc = h5::open_dataset(g, "shard_checksums");
    const std::size_t nf = infos[k].files.size();
    if (h5::dataset_shape(st) != std::vector<std::int64_t>{std::int64_t(nf)} ||
        h5::dataset_shape(sc) != std::vector<std::int64_t>{std::int64_t(nf)})
      return str(infos[k].source, " has another number of shards");
    std::vector<std::int64_t> tok(nf), sum(nf);
    read_i64(st, 0, std::int64_t(nf), tok.data(), f.path());
    read_i64(sc, 0, std::int64_t(nf), sum.data(), f.path(), H5T_NATIVE_UINT64);
    for (std::size_t i = 0; i < nf; ++i)
      if (tok[i] != infos[k].shard_tokens[i] || std::uint64_t(sum[i]) != infos[k].shard_checksums[i])
        return str(infos[k].files[i], " changed (size or checksum)");
  }
  return "";
}

// Checks the index's arrays: shapes, ranges and its content checksum.
void check_index_content(const h5::File& f, const std::vector<DatasetInfo>& infos) {
  const std::string damaged = str(f.path(), ": the sample index is damaged (");
  const std::string advice = "); delete it and it is rebuilt from the seed";
  const std::int64_t n = h5::read_attr_int(f, "sequences");
  std::uint64_t sum = 0;
  std::vector<std::int64_t> buf;
  auto scan = [&](hid_t ds, std::int64_t len, std::uint64_t salt, std::int64_t lo, std::int64_t hi,
                  const std::string& name) {
    if (h5::dataset_shape(ds) != std::vector<std::int64_t>{len})
      fail(damaged, name, " has shape ", h5::shape_str(h5::dataset_shape(ds)), ", expected [", len,
           "]", advice);
    for (std::int64_t at = 0; at < len; at += kBlock) {
      const std::int64_t m = std::min(kBlock, len - at);
      buf.resize(std::size_t(m));
      read_i64(ds, at, m, buf.data(), f.path());
      for (std::int64_t i = 0; i < m; ++i)
        if (buf[std::size_t(i)] < lo || buf[std::size_t(i)] >= hi)
          fail(damaged, name, "[", at + i, "] = ", buf[std::size_t(i)], " is outside [", lo, ", ",
               hi, ")", advice);
      sum += entries_checksum(buf.data(), m, at, salt);
    }
  };
  for (std::size_t k = 0; k < infos.size(); ++k) {
    h5::Hid g = h5::open_group(f, dataset_group(k));
    const std::int64_t S = h5::read_attr_int(g, "sequences_per_epoch");
    const std::int64_t E = h5::read_attr_int(g, "epochs");
    if (S != infos[k].sequences || E < 0) fail(damaged, "/", dataset_group(k), " attributes", advice);
    h5::Hid s = h5::open_dataset(g, "samples");
    scan(s, E * S, k, 0, std::max<std::int64_t>(S, 1), "/" + dataset_group(k) + "/samples");
  }
  if (infos.size() > 1) {
    h5::Hid d = h5::open_dataset(f, "blend/dataset"), p = h5::open_dataset(f, "blend/position");
    scan(d, n, 1000001, 0, std::int64_t(infos.size()), "/blend/dataset");
    scan(p, n, 1000002, 0, INT64_MAX, "/blend/position");
  }
  if (sum != h5::read_attr_u64(f, "content_checksum"))
    fail(damaged, "its entries do not match content_checksum", advice);
}

void write_index(const std::string& path, const std::vector<DatasetInfo>& infos,
                 const LoaderOptions& opt) {
  const std::string tmp = path + ".tmp";
  h5::make_parent_dir(path, MPI_COMM_NULL);
  const std::int64_t n = opt.sequences;
  std::vector<double> w;
  for (const auto& i : infos) w.push_back(i.weight);
  // How many of each dataset's sequences the run draws, hence its epochs.
  std::vector<std::int64_t> drawn(infos.size(), 0);
  if (infos.size() == 1) drawn[0] = n;
  else blend(w, n, [&](int d, std::int64_t) { ++drawn[std::size_t(d)]; });

  // Its size before any of it is written (issue 32: a full disk halfway through a build):
  // 8 bytes per sample entry, 10 per blend entry, and a margin for HDF5's metadata.
  std::int64_t bytes = 8 << 10;
  for (std::size_t k = 0; k < infos.size(); ++k) {
    const std::int64_t S = infos[k].sequences;
    bytes += 8 * (S > 0 ? (drawn[k] + S - 1) / S * S : 0);
  }
  if (infos.size() > 1) bytes += 10 * n;
  h5::check_room(tmp, bytes, MPI_COMM_NULL);

  std::uint64_t sum = 0;
  {
    h5::File f = h5::open_file(tmp, h5::Mode::create);
    h5::write_attr_string(f, "format", "trident sample index");
    h5::write_attr_int(f, "version", kIndexVersion);
    h5::write_attr_u64(f, "seed", opt.seed);
    h5::write_attr_string(f, "stream", opt.stream);
    h5::write_attr_int(f, "seq_len", opt.seq_len);
    h5::write_attr_int(f, "sequences", n);
    h5::write_attr_int(f, "num_datasets", std::int64_t(infos.size()));
    for (std::size_t k = 0; k < infos.size(); ++k) {
      const DatasetInfo& in = infos[k];
      h5::Hid g = h5::create_group(f, dataset_group(k));
      h5::write_attr_string(g, "source", in.source);
      h5::write_attr_double(g, "weight", in.weight);
      const std::int64_t S = in.sequences;
      const std::int64_t E = S > 0 ? (drawn[k] + S - 1) / S : 0;
      h5::write_attr_int(g, "sequences_per_epoch", S);
      h5::write_attr_int(g, "epochs", E);
      const std::int64_t nf = std::int64_t(in.files.size());
      h5::Hid st = h5::create_dataset(g, "shard_tokens", H5T_STD_I64LE, {nf});
      h5::Hid sc = h5::create_dataset(g, "shard_checksums", H5T_STD_U64LE, {nf});
      write_i64(st, 0, nf, in.shard_tokens.data(), tmp);
      std::vector<std::int64_t> sums(in.shard_checksums.begin(), in.shard_checksums.end());
      write_i64(sc, 0, nf, sums.data(), tmp, H5T_NATIVE_UINT64);
      // One shuffled permutation of [0, S) per epoch (Fisher-Yates from counter-based
      // random numbers: a function of seed, stream, dataset and epoch only).
      h5::Hid samples = h5::create_dataset(g, "samples", H5T_STD_I64LE, {E * S});
      std::vector<std::int64_t> perm(static_cast<std::size_t>(S));
      const std::uint64_t key = rng::key_of(str("data/", opt.stream, "/", k));
      for (std::int64_t e = 0; e < E; ++e) {
        for (std::int64_t i = 0; i < S; ++i) perm[std::size_t(i)] = i;
        const std::uint64_t ekey = key ^ mix64(std::uint64_t(e) + 1);
        for (std::int64_t i = S - 1; i > 0; --i) {
          const std::int64_t j = std::int64_t(rng::uniform_u64(opt.seed, ekey, std::uint64_t(i)) %
                                              std::uint64_t(i + 1));
          std::swap(perm[std::size_t(i)], perm[std::size_t(j)]);
        }
        write_i64(samples, e * S, S, perm.data(), tmp);
        sum += entries_checksum(perm.data(), S, e * S, k);
      }
    }
    if (infos.size() > 1) {
      h5::Hid ds = h5::create_dataset(f, "blend/dataset", H5T_STD_U16LE, {n});
      h5::Hid ps = h5::create_dataset(f, "blend/position", H5T_STD_I64LE, {n});
      std::vector<std::int64_t> d, p;
      std::int64_t at = 0;
      auto flush = [&] {
        write_i64(ds, at, std::int64_t(d.size()), d.data(), tmp);
        write_i64(ps, at, std::int64_t(p.size()), p.data(), tmp);
        sum += entries_checksum(d.data(), std::int64_t(d.size()), at, 1000001);
        sum += entries_checksum(p.data(), std::int64_t(p.size()), at, 1000002);
        at += std::int64_t(d.size());
        d.clear();
        p.clear();
      };
      blend(w, n, [&](int k, std::int64_t pos) {
        d.push_back(k);
        p.push_back(pos);
        if (std::int64_t(d.size()) == kBlock) flush();
      });
      flush();
    }
    h5::write_attr_u64(f, "content_checksum", sum);
    f.close();
  }
  h5::commit_file(tmp, path, MPI_COMM_NULL);
}

}  // namespace

// ---- data.train's value ------------------------------------------------------------------

std::vector<DataSource> parse_data_sources(const std::string& value, const std::string& where) {
  std::vector<DataSource> out;
  const std::size_t b = value.find_first_not_of(" \t");
  if (b == std::string::npos || value[b] != '[') {
    if (!value.empty()) out.push_back({value, 1.0});
    return out;
  }
  toml::table t;
  try {
    t = toml::parse("v = " + value, std::string_view("data"));
  } catch (const toml::parse_error& e) {
    fail(where, ": expected a path or a list of {path = \"...\", weight = w} tables, got ", value);
  }
  const toml::array* a = t["v"].as_array();
  if (!a || a->empty())
    fail(where, ": expected a path or a non-empty list of {path = \"...\", weight = w} tables");
  for (std::size_t i = 0; i < a->size(); ++i) {
    const toml::node& n = *a->get(i);
    DataSource s;
    if (n.is_string()) {
      s.path = n.as_string()->get();
    } else if (const toml::table* e = n.as_table()) {
      for (auto&& [k, v] : *e)
        if (k.str() != "path" && k.str() != "weight")
          fail(where, "[", i, "]: unknown key '", k.str(), "' (expected path and weight)");
      const auto* p = e->get("path");
      if (!p || !p->is_string()) fail(where, "[", i, "]: expected path = \"<token dataset>\"");
      s.path = p->as_string()->get();
      if (const auto* w = e->get("weight")) {
        if (w->is_integer()) s.weight = double(w->as_integer()->get());
        else if (w->is_floating_point()) s.weight = w->as_floating_point()->get();
        else fail(where, "[", i, "]: weight: expected a number");
      }
    } else {
      fail(where, "[", i, "]: expected {path = \"...\", weight = w} or a path");
    }
    if (s.path.empty()) fail(where, "[", i, "]: path is empty");
    if (!std::isfinite(s.weight) || s.weight < 0)
      fail(where, "[", i, "] (", s.path, "): weight must be a finite number >= 0, got ", s.weight);
    out.push_back(s);
  }
  double total = 0;
  for (const auto& s : out) total += s.weight;
  if (!(total > 0)) fail(where, ": every weight is 0; at least one dataset needs a weight > 0");
  return out;
}

std::string data_sources_toml(const std::vector<DataSource>& sources) {
  if (sources.size() == 1 && sources[0].weight == 1.0) return sources[0].path;
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < sources.size(); ++i)
    os << (i ? ", " : "") << "{path = " << toml_quoted(sources[i].path)
       << ", weight = " << shortest(sources[i].weight) << "}";
  os << "]";
  return os.str();
}

std::vector<std::string> shard_files(const std::string& path, const std::string& key) {
  std::error_code ec;
  std::vector<std::string> files;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".h5" && e.is_regular_file(ec)) files.push_back(e.path().string());
    if (files.empty()) fail(path, ": a directory with no *.h5 token datasets (", key, ")");
  } else if (path.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    const int rc = ::glob(path.c_str(), 0, nullptr, &g);
    for (std::size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) files.push_back(g.gl_pathv[i]);
    globfree(&g);
    if (files.empty()) fail(path, ": no file matches this pattern (", key, ")");
  } else {
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string first_token_file(const std::string& value, const std::string& key) {
  const auto sources = parse_data_sources(value, key);
  TRIDENT_CHECK(!sources.empty(), key, " is empty");
  return shard_files(sources[0].path, key)[0];
}

int loader_files_held_open(const std::string& value, const std::string& key) {
  if (value.empty()) return 0;
  std::size_t shards = 0;
  for (const DataSource& source : parse_data_sources(value, key)) {
    try {
      shards += shard_files(source.path, key).size();
    } catch (const Error&) {
      ++shards;
    }
  }
  return 1 + int(std::min(shards, kMaxOpenFiles));
}

// ---- the index ---------------------------------------------------------------------------

std::string build_sample_index(const std::vector<DataSource>& sources, const LoaderOptions& opt) {
  TRIDENT_CHECK(!sources.empty(), opt.key, ": no dataset");
  const std::vector<double> w = normalized(sources);
  std::vector<DatasetInfo> infos;
  std::unique_ptr<io::TokenFile> first;  // the vocabulary every file must share
  std::int64_t unverified = 0;
  for (std::size_t k = 0; k < sources.size(); ++k) {
    DatasetInfo in;
    in.source = sources[k].path;
    in.weight = w[k];
    in.files = shard_files(sources[k].path, opt.key);
    std::int64_t tokens = 0;
    for (const std::string& file : in.files) {
      auto f = std::make_unique<io::TokenFile>(file);
      const io::TokenDataset& h = f->header();
      TRIDENT_CHECK(h.vocab_size <= opt.vocab_limit, file, ": vocab_size = ", h.vocab_size,
                    " exceeds the deck's model.vocab_size = ", opt.vocab_limit, " (", opt.key, ")");
      if (first) {
        const io::TokenDataset& a = first->header();
        if (h.vocab_size != a.vocab_size || h.tokenizer != a.tokenizer ||
            h.tokenizer_model != a.tokenizer_model)
          fail(file, ": tokenizer ", h.tokenizer, " with vocab_size ", h.vocab_size,
               " differs from that of ", first->path(), " (", a.tokenizer, ", vocab_size ",
               a.vocab_size, (h.tokenizer == a.tokenizer && h.vocab_size == a.vocab_size
                                  ? ", another SentencePiece model" : ""),
               "); every dataset of ", opt.key, " must come from one tokenizer");
      }
      in.shard_tokens.push_back(f->num_tokens());
      // Files from before issue 17 carry no checksum: computed (a full read) every start.
      in.shard_checksums.push_back(h.has_checksum ? h.checksum : f->verify());
      if (h.has_checksum) unverified += f->num_tokens();
      in.sequences += sequences_in(f->num_tokens(), opt.seq_len);
      tokens += f->num_tokens();
      if (!first) first = std::move(f);
    }
    if (in.sequences == 0 && sources[k].weight > 0) {
      if (in.files.size() == 1)
        fail(in.files[0], " (", opt.key, "): ", tokens, " tokens, but a sequence of model.seq_len = ",
             opt.seq_len, " needs at least ", opt.seq_len + 1);
      fail(in.source, " (", opt.key, "): no shard holds a sequence of model.seq_len = ",
           opt.seq_len, " (", opt.seq_len + 1, " tokens)");
    }
    infos.push_back(std::move(in));
  }

  std::string reason = "none yet";
  std::error_code ec;
  if (fs::exists(opt.index_path, ec)) {
    const std::string damaged = str(opt.index_path, ": the sample index is damaged (");
    try {
      h5::File f = h5::open_file(opt.index_path, h5::Mode::read);
      if (!h5::has_attr(f, "format") ||
          h5::read_attr_string(f, "format") != "trident sample index")
        fail("not a sample index");
      reason = stale_reason(f, infos, opt);
      if (reason.empty()) {
        check_index_content(f, infos);
        return str(opt.key, ": sample index ", opt.index_path, " is up to date");
      }
    } catch (const Error& e) {
      const std::string m = e.what();
      if (m.rfind(damaged, 0) == 0) throw;
      fail(damaged, m, "); delete it and it is rebuilt from the seed");
    }
  }
  // A new index: read every token once (ids in range, checksums as recorded) first.
  if (unverified > 0)
    for (const auto& in : infos)
      for (const std::string& file : in.files) {
        io::TokenFile f(file);
        if (f.header().has_checksum) f.verify();
      }
  write_index(opt.index_path, infos, opt);
  return str(opt.key, ": built the sample index ", opt.index_path, " (", reason, ")");
}

// ---- the loader --------------------------------------------------------------------------

struct DataLoader::Impl {
  struct Dataset {
    std::vector<std::string> files;
    std::vector<std::int64_t> first_sequence;  // per shard, prefix sums; back() = total
    std::int64_t sequences = 0, epochs = 0;
    double weight = 0;
    h5::Hid samples;
  };
  LoaderOptions opt;
  h5::File index;
  h5::Hid blend_dataset, blend_position;
  std::vector<Dataset> datasets;
  std::int64_t total_tokens = 0;
  mutable std::vector<std::unique_ptr<io::TokenFile>> open;  // by global shard number
  mutable std::vector<std::size_t> open_list;
  mutable std::vector<std::int32_t> window;
  std::vector<std::size_t> shard_base;  // global shard number of each dataset's first shard

  const io::TokenFile& file(std::size_t d, std::size_t shard) const {
    const std::size_t g = shard_base[d] + shard;
    if (!open[g]) {
      if (open_list.size() >= kMaxOpenFiles) {
        for (std::size_t i : open_list) open[i].reset();
        open_list.clear();
      }
      open[g] = std::make_unique<io::TokenFile>(datasets[d].files[shard]);
      open_list.push_back(g);
    }
    return *open[g];
  }
};

DataLoader::DataLoader(const std::vector<DataSource>& sources, const LoaderOptions& opt)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = opt;
  m.index = h5::open_file(opt.index_path, h5::Mode::read);
  const std::int64_t nd = h5::read_attr_int(m.index, "num_datasets");
  TRIDENT_CHECK(nd == std::int64_t(sources.size()), opt.index_path, ": ", nd,
                " datasets, the deck names ", sources.size());
  std::size_t base = 0;
  for (std::size_t k = 0; k < sources.size(); ++k) {
    Impl::Dataset d;
    d.files = shard_files(sources[k].path, opt.key);
    h5::Hid g = h5::open_group(m.index, dataset_group(k));
    d.sequences = h5::read_attr_int(g, "sequences_per_epoch");
    d.epochs = h5::read_attr_int(g, "epochs");
    d.weight = h5::read_attr_double(g, "weight");
    h5::Hid st = h5::open_dataset(g, "shard_tokens");
    std::vector<std::int64_t> tokens(d.files.size());
    TRIDENT_CHECK(h5::dataset_shape(st) == std::vector<std::int64_t>{std::int64_t(d.files.size())},
                  opt.index_path, ": another number of shards than ", sources[k].path, " has");
    read_i64(st, 0, std::int64_t(tokens.size()), tokens.data(), opt.index_path);
    d.first_sequence.push_back(0);
    for (std::int64_t t : tokens) {
      d.first_sequence.push_back(d.first_sequence.back() + sequences_in(t, opt.seq_len));
      m.total_tokens += t;
    }
    d.samples = h5::open_dataset(g, "samples");
    m.shard_base.push_back(base);
    base += d.files.size();
    m.datasets.push_back(std::move(d));
  }
  m.open.resize(base);
  if (sources.size() > 1) {
    m.blend_dataset = h5::open_dataset(m.index, "blend/dataset");
    m.blend_position = h5::open_dataset(m.index, "blend/position");
  }
  m.window.resize(std::size_t(opt.seq_len) + 1);
}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

void DataLoader::fill(std::int64_t batch, std::int64_t global_batch, std::int64_t first,
                      std::int64_t count, std::int32_t* inputs, std::int32_t* targets) const {
  const Impl& m = *impl_;
  const std::int64_t T = m.opt.seq_len, n0 = batch * global_batch + first;
  std::vector<std::int64_t> which(static_cast<std::size_t>(count), 0), pos(which.size());
  if (m.datasets.size() > 1) {
    read_i64(m.blend_dataset, n0, count, which.data(), m.opt.index_path);
    read_i64(m.blend_position, n0, count, pos.data(), m.opt.index_path);
  } else {
    for (std::int64_t j = 0; j < count; ++j) pos[std::size_t(j)] = n0 + j;
  }
  for (std::int64_t j = 0; j < count; ++j) {
    const auto& d = m.datasets[std::size_t(which[std::size_t(j)])];
    const std::int64_t p = pos[std::size_t(j)];
    TRIDENT_CHECK(p < d.epochs * d.sequences, m.opt.index_path, ": sequence ", n0 + j,
                  " is beyond the index (", d.epochs, " epochs)");
    std::int64_t seq = 0;
    read_i64(d.samples, p, 1, &seq, m.opt.index_path);
    TRIDENT_CHECK(seq >= 0 && seq < d.sequences, m.opt.index_path, ": entry ", p, " = ", seq,
                  " is outside [0, ", d.sequences, "): the index is damaged");
    const std::size_t shard = std::size_t(
        std::upper_bound(d.first_sequence.begin(), d.first_sequence.end(), seq) -
        d.first_sequence.begin() - 1);
    const std::int64_t start = (seq - d.first_sequence[shard]) * T;
    m.file(std::size_t(which[std::size_t(j)]), shard).read(start, T + 1, m.window.data());
    std::copy(m.window.begin(), m.window.end() - 1, inputs + j * T);
    std::copy(m.window.begin() + 1, m.window.end(), targets + j * T);
  }
}

double DataLoader::epoch(std::int64_t sequences) const {
  double e = 0;
  for (const auto& d : impl_->datasets)
    if (d.sequences > 0) e = std::max(e, d.weight * double(sequences) / double(d.sequences));
  return e;
}

std::int64_t DataLoader::num_tokens() const { return impl_->total_tokens; }

}  // namespace trident::train
