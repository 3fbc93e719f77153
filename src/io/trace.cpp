// Chrome trace files (see trident/io/trace.hpp).
#include "trident/io/trace.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "trident/core/error.hpp"

namespace trident::io {

namespace {
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}
}  // namespace

void write_chrome_trace(const std::string& path, const std::vector<TraceEvent>& events, int pid,
                        const std::string& process_name,
                        const std::vector<std::pair<std::string, std::string>>& other) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  TRIDENT_CHECK(!ec, "cannot create the trace folder '", parent.string(), "': ", ec.message());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    TRIDENT_CHECK(f.good(), "cannot write the trace '", tmp, "'");
    const std::string p = std::to_string(pid);
    f << "{\"traceEvents\": [\n";
    f << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << p
      << ", \"tid\": 0, \"args\": {\"name\": " << quoted(process_name) << "}}";
    for (const TraceEvent& e : events) {
      f << ",\n{\"name\": " << quoted(e.name) << ", \"cat\": " << quoted(e.cat)
        << ", \"ph\": \"X\", \"pid\": " << p << ", \"tid\": 0, \"ts\": " << num(e.ts_us)
        << ", \"dur\": " << num(e.dur_us) << ", \"args\": {\"mb\": " << e.mb
        << ", \"chunk\": " << e.chunk;
      if (e.peer >= 0) f << ", \"peer\": " << e.peer;
      if (!e.what.empty()) f << ", \"what\": " << quoted(e.what);
      f << "}}";
    }
    f << "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": {";
    for (std::size_t i = 0; i < other.size(); ++i)
      f << (i ? ", " : "") << quoted(other[i].first) << ": " << other[i].second;
    f << "}}\n";
    f.close();
    TRIDENT_CHECK(f.good(), "cannot write the trace '", tmp, "'");
  }
  fs::rename(tmp, path, ec);
  TRIDENT_CHECK(!ec, "cannot write the trace '", path, "': ", ec.message());
}

}  // namespace trident::io
