// ops/cuda/op_timer.cpp — see op_timer.hpp.
// defines: OpTimer
#include "op_timer.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "check.hpp"

namespace trident::ops::cuda {

namespace {
// Pairs kept before a harvest (a GPT-2 step records a few thousand).
constexpr std::size_t kHarvestEvery = 8192;

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}
}  // namespace

OpTimer::OpTimer(std::string path, cudaStream_t stream) : path_(std::move(path)), stream_(stream) {}

OpTimer::~OpTimer() {
  try {
    write();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trident: warning: op timing not written to %s: %s\n", path_.c_str(),
                 e.what());
  }
  for (auto& p : pending_) {
    cudaEventDestroy(p.start);
    cudaEventDestroy(p.stop);
  }
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
}

std::unique_ptr<OpTimer> OpTimer::from_environment(cudaStream_t stream) {
  const char* path = std::getenv("TRIDENT_OP_TIMING");
  if (!path || !*path) return nullptr;
  std::string file = path;
  // ranks other than 0 (Open MPI, MPICH/PMI) write beside rank 0's file
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    const char* r = std::getenv(var);
    if (r && *r && std::string(r) != "0") {
      file += std::string(".rank") + r;
      break;
    }
  }
  return std::make_unique<OpTimer>(file, stream);
}

cudaEvent_t OpTimer::event() {
  if (!pool_.empty()) {
    cudaEvent_t e = pool_.back();
    pool_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  TRIDENT_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void OpTimer::begin(const std::string& name) {
  if (depth_++ > 0) return;  // an op calling another op: the outer one holds the time
  if (pending_.size() >= kHarvestEvery) harvest();
  Pending p{name, event(), event()};
  TRIDENT_CUDA_CHECK(cudaEventRecord(p.start, stream_));
  pending_.push_back(std::move(p));
}

void OpTimer::end() {
  if (depth_ == 0 || --depth_ > 0) return;
  TRIDENT_CUDA_CHECK(cudaEventRecord(pending_.back().stop, stream_));
}

void OpTimer::harvest() {
  if (pending_.empty()) return;
  TRIDENT_CUDA_CHECK(cudaEventSynchronize(pending_.back().stop));
  for (auto& p : pending_) {
    float ms = 0.0f;
    TRIDENT_CUDA_CHECK(cudaEventElapsedTime(&ms, p.start, p.stop));
    Total& t = totals_[p.name];
    t.calls++;
    t.ms += double(ms);
    pool_.push_back(p.start);
    pool_.push_back(p.stop);
  }
  pending_.clear();
}

std::string OpTimer::json() {
  harvest();
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double total = 0.0;
  for (const auto& r : rows) total += r.second.ms;
  std::ostringstream o;
  o.precision(6);
#ifdef TRIDENT_EMU_DEVICE_POINTERS
  const char* events = "host";  // the CPU stand-in: events read the host clock
#else
  const char* events = "cuda";
#endif
  o << "{\"events\": \"" << events << "\", \"total_ms\": " << total << ", \"ops\": [";
  for (std::size_t i = 0; i < rows.size(); i++) {
    o << (i ? ",\n  " : "\n  ") << "{\"op\": " << json_string(rows[i].first)
      << ", \"calls\": " << rows[i].second.calls << ", \"total_ms\": " << rows[i].second.ms
      << ", \"share\": " << (total > 0 ? rows[i].second.ms / total : 0.0) << "}";
  }
  o << "\n]}\n";
  return o.str();
}

void OpTimer::write() {
  const std::string text = json();
  std::ofstream f(path_);
  f << text;
  f.close();
  if (!f) throw std::runtime_error("cannot write " + path_);
}

}  // namespace trident::ops::cuda
