// The safetensors file format: a checked reader and an atomic writer (see
// trident/io/safetensors.hpp).
#include "trident/io/safetensors.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "trident/core/error.hpp"

namespace trident::io::safetensors {

namespace {

using json = nlohmann::json;

// The safetensors library refuses headers above 100 MB; so do we (a hostile length
// must not make us allocate gigabytes).
constexpr std::uint64_t kMaxHeader = 100'000'000;

// Bytes per element of every dtype the format defines; 0: not a safetensors dtype.
int dtype_size(const std::string& d) {
  static const std::map<std::string, int> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
      {"F64", 8},  {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::uint32_t float_bits(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

float bits_float(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

// Little-endian loads and stores (the format's byte order, whatever the host's).
std::uint64_t load_le64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::uint16_t bf16_bits(float x) {
  const std::uint32_t b = float_bits(x);
  if (std::isnan(x)) return std::uint16_t((b >> 16) | 0x40);  // stays a (quiet) NaN
  const std::uint32_t rounding = 0x7FFF + ((b >> 16) & 1);     // to nearest, ties to even
  return std::uint16_t((b + rounding) >> 16);
}

float bf16_value(std::uint16_t bits) { return bits_float(std::uint32_t(bits) << 16); }

float f16_value(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000) << 16;
  const int exp = (h >> 10) & 0x1F;
  std::uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return bits_float(sign | 0x7F800000 | (mant << 13));  // Inf, NaN
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    int e = -1;  // subnormal: normalize
    do {
      ++e;
      mant <<= 1;
    } while (!(mant & 0x400));
    return bits_float(sign | std::uint32_t(127 - 15 - e) << 23 | (mant & 0x3FF) << 13);
  }
  return bits_float(sign | std::uint32_t(exp - 15 + 127) << 23 | mant << 13);
}

std::int64_t parse_size(const std::string& text, const std::string& what) {
  std::size_t pos = 0;
  double number = 0;
  try {
    number = std::stod(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  std::string unit = text.substr(pos);
  for (auto& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> units = {
      {"", 1},         {"B", 1},         {"KB", 1e3},          {"MB", 1e6},
      {"GB", 1e9},     {"TB", 1e12},     {"KIB", 1024.0},      {"MIB", 1048576.0},
      {"GIB", 1073741824.0}};
  auto it = units.find(unit);
  if (pos == 0 || it == units.end() || !(number > 0))
    fail(what, " = '", text, "': expected a positive size such as 5GB, 500MiB or 1000000");
  return std::int64_t(number * it->second);
}

Reader::Reader(const std::string& path) : path_(path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, ": cannot open (", ec.message(), ")");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open for reading");
  if (size < 8) fail(path, ": ", size, " bytes, too short for a safetensors file (8-byte header length)");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  const std::uint64_t header_len = load_le64(len_bytes);
  if (header_len > size - 8)
    fail(path, ": safetensors header length ", header_len, " runs past the end of the file (",
         size, " bytes)");
  if (header_len > kMaxHeader)
    fail(path, ": safetensors header length ", header_len, " exceeds the format's limit of ",
         kMaxHeader, " bytes");
  std::string text(header_len, '\0');
  in.read(text.data(), std::streamsize(header_len));
  if (!in) fail(path, ": cannot read the safetensors header");
  data_start_ = 8 + header_len;
  const std::uint64_t data_size = size - data_start_;

  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    fail(path, ": safetensors header is not valid JSON (", e.what(), ")");
  }
  if (!header.is_object()) fail(path, ": safetensors header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, ": __metadata__ is not a JSON object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail(path, ": __metadata__ entry '", m.key(), "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    if (!v.is_object()) fail(where, ": header entry is not a JSON object");
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!v.contains(key)) fail(where, ": header entry has no '", key, "'");
    TensorInfo t;
    t.name = name;
    if (!v["dtype"].is_string()) fail(where, ": dtype is not a string");
    t.dtype = v["dtype"].get<std::string>();
    const int item = dtype_size(t.dtype);
    if (item == 0) fail(where, ": unknown dtype '", t.dtype, "'");
    if (!v["shape"].is_array()) fail(where, ": shape is not a list");
    std::uint64_t numel = 1;
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (std::uint64_t(1) << 40))
        fail(where, ": shape ", v["shape"].dump(), " is not a list of sizes");
      t.shape.push_back(std::int64_t(d.get<std::uint64_t>()));
      numel *= d.get<std::uint64_t>();
      if (numel > (std::uint64_t(1) << 50)) fail(where, ": shape ", v["shape"].dump(), " is too large");
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      fail(where, ": data_offsets ", off.dump(), " is not [begin, end]");
    t.begin = off[0].get<std::uint64_t>();
    t.end = off[1].get<std::uint64_t>();
    if (t.begin > t.end || t.end > data_size)
      fail(where, ": data_offsets [", t.begin, ", ", t.end, "] out of range (the data section has ",
           data_size, " bytes)");
    if (t.end - t.begin != numel * std::uint64_t(item))
      fail(where, ": shape ", shape_str(t.shape), " of ", t.dtype, " is ", numel * item,
           " bytes, its data_offsets [", t.begin, ", ", t.end, "] cover ", t.end - t.begin);
    tensors_[name] = t;
  }

  // The data section must be exactly covered: sorted by offset, no overlap, no hole.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& kv : tensors_) by_offset.push_back(&kv.second);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t at = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (t->begin < at)
      fail(path, ": tensor '", t->name, "' (data_offsets [", t->begin, ", ", t->end,
           "]) overlaps tensor '", prev->name, "' ([", prev->begin, ", ", prev->end, "])");
    if (t->begin > at)
      fail(path, ": bytes [", at, ", ", t->begin, ") of the data section belong to no tensor (before '",
           t->name, "')");
    at = t->end;
    prev = t;
  }
  if (at != data_size)
    fail(path, ": the tensors cover ", at, " bytes of the ", data_size,
         "-byte data section (the file has trailing bytes or is damaged)");
}

const TensorInfo& Reader::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(path_, ": no tensor '", name, "'");
  return it->second;
}

std::vector<std::string> Reader::names() const {
  std::vector<std::string> out;
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

std::vector<unsigned char> Reader::read_raw(const std::string& name) const {
  const TensorInfo& t = info(name);
  std::vector<unsigned char> bytes(t.end - t.begin);
  std::ifstream in(path_, std::ios::binary);
  in.seekg(std::streamoff(data_start_ + t.begin));
  in.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!in) fail(path_, ": cannot read tensor '", name, "' (the file changed or is unreadable)");
  return bytes;
}

std::vector<float> Reader::read_f32(const std::string& name) const {
  const TensorInfo& t = info(name);
  if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
    fail(path_, ": tensor '", name, "' has dtype ", t.dtype, ", expected F32, BF16 or F16");
  const auto bytes = read_raw(name);
  std::vector<float> out(std::size_t(t.numel()));
  const unsigned char* p = bytes.data();
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == "F32") {
      out[i] = bits_float(std::uint32_t(p[4 * i]) | std::uint32_t(p[4 * i + 1]) << 8 |
                          std::uint32_t(p[4 * i + 2]) << 16 | std::uint32_t(p[4 * i + 3]) << 24);
    } else {
      const std::uint16_t h = std::uint16_t(p[2 * i] | p[2 * i + 1] << 8);
      out[i] = t.dtype == "BF16" ? bf16_value(h) : f16_value(h);
    }
  }
  return out;
}

void write_file(const std::string& path, const std::vector<TensorOut>& tensors, DType dtype,
                const std::map<std::string, std::string>& metadata) {
  TRIDENT_CHECK(dtype == DType::F32 || dtype == DType::BF16,
                "internal: safetensors::write_file writes F32 or BF16");
  const int item = dtype == DType::F32 ? 4 : 2;
  nlohmann::ordered_json header;
  header["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    header[t.name] = {{"dtype", dtype == DType::F32 ? "F32" : "BF16"},
                      {"shape", t.shape},
                      {"data_offsets", {at, at + std::uint64_t(n) * item}}};
    at += std::uint64_t(n) * item;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(tmp, ": cannot create");
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(std::uint64_t(text.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), std::streamsize(text.size()));
    std::vector<unsigned char> buf;
    for (const auto& t : tensors) {
      std::int64_t n = 1;
      for (auto d : t.shape) n *= d;
      buf.resize(std::size_t(n) * item);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint32_t v = dtype == DType::F32 ? float_bits(t.data[i]) : bf16_bits(t.data[i]);
        for (int b = 0; b < item; ++b) buf[std::size_t(i) * item + b] = static_cast<unsigned char>(v >> (8 * b));
      }
      out.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
    }
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      fail(tmp, ": cannot write (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail(path, ": cannot rename ", tmp, " to it (", ec.message(), ")");
}

}  // namespace trident::io::safetensors
