// ops/cuda/lt_tune.cpp — TRIDENT_CUDA_LT_TUNE's timing of cuBLASLt candidates and its file
// (lt_tune.hpp says what the knob does and what the file holds).
// defines: LtTuner
#include "lt_tune.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "check.hpp"
#include "trident/core/error.hpp"

namespace trident::ops::cuda {

namespace {
// cublasLtMatmulAlgoConfigAttributes_t 0..8 (ID, TILE_ID, SPLITK_NUM, REDUCTION_SCHEME,
// CTA_SWIZZLING, CUSTOM_OPTION, STAGES_ID, INNER_SHAPE_ID, CLUSTER_SHAPE_ID): their sizes.
constexpr std::size_t kConfigBytes[9] = {4, 4, 4, 4, 4, 4, 4, 2, 2};
constexpr const char* kHeader =
    "# trident TRIDENT_CUDA_LT_TUNE: device cuBLASLt_version plan_key[5] "
    "algo_config[ID TILE_ID SPLITK_NUM REDUCTION_SCHEME CTA_SWIZZLING CUSTOM_OPTION STAGES_ID "
    "INNER_SHAPE_ID CLUSTER_SHAPE_ID]";

std::string blanks_as_underscores(std::string s) {
  for (char& c : s)
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') c = '_';
  return s;
}
}  // namespace

std::unique_ptr<LtTuner> LtTuner::from_environment(const std::string& device_name) {
  const char* v = std::getenv("TRIDENT_CUDA_LT_TUNE");
  if (!v || !*v || std::string(v) == "0") return nullptr;
  std::string file = std::string(v) == "1" ? "" : v;
  // ranks other than 0 (Open MPI, MPICH/PMI) keep their own file beside rank 0's
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    const char* r = std::getenv(var);
    if (!file.empty() && r && *r && std::string(r) != "0") {
      file += std::string(".rank") + r;
      break;
    }
  }
  return std::make_unique<LtTuner>(file, device_name);
}

LtTuner::LtTuner(std::string file, const std::string& device_name)
    : file_(std::move(file)), device_(blanks_as_underscores(device_name)),
      version_(cublasLtGetVersion()) {
  if (file_.empty()) return;
  std::ifstream in(file_);
  if (!in) {  // no file yet: it must be writable, said now rather than after the tuning
    std::ofstream probe(file_, std::ios::app);
    TRIDENT_CHECK(bool(probe), "TRIDENT_CUDA_LT_TUNE: cannot create '", file_,
                  "' (expected 0, 1, or the path of a file to keep cuBLASLt's choices in)");
    probe.close();
    std::remove(file_.c_str());
    return;
  }
  int unreadable = 0, foreign = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string device, extra;
    std::size_t version = 0;
    Key key{};
    Config config{};
    bool ok = bool(fields >> device >> version);
    for (auto& k : key) ok = ok && bool(fields >> k);
    for (auto& c : config) ok = ok && bool(fields >> c);
    if (!ok || (fields >> extra)) {
      unreadable++;
      continue;
    }
    if (device == device_ && version == version_) {
      entries_[key] = config;
    } else {
      foreign_.push_back(line);
      foreign++;
    }
  }
  if (unreadable || foreign)
    std::fprintf(stderr,
                 "cuBLASLt tuning (TRIDENT_CUDA_LT_TUNE): %s: %d unreadable line(s) and %d "
                 "entr%s of another device or cuBLASLt version ignored (this one: %s, "
                 "cuBLASLt %zu); shapes without an entry are tuned again\n",
                 file_.c_str(), unreadable, foreign, foreign == 1 ? "y" : "ies", device_.c_str(),
                 version_);
}

LtTuner::~LtTuner() {
  if (tuned_ + single_ + read_ + skipped_ == 0) return;
  std::fprintf(stderr,
               "cuBLASLt tuning (TRIDENT_CUDA_LT_TUNE): %d shape(s) timed in %.1f ms, %d with "
               "one candidate, %d read from %s%s%s\n",
               tuned_, tune_ms_, single_, read_, file_.empty() ? "no file" : file_.c_str(),
               refused_ ? str(", ", refused_, " stored one(s) refused here (timed again)").c_str()
                        : "",
               skipped_ ? str(", ", skipped_, " left on the heuristic's first (no memory for "
                                              "a scratch D)").c_str()
                        : "");
}

bool LtTuner::stored(cublasLtHandle_t lt, const Key& key, cublasLtMatmulDesc_t desc,
                     cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                     cublasLtMatrixLayout_t d, cudaDataType_t ab_type, cudaDataType_t d_type,
                     std::size_t workspace, cublasLtMatmulAlgo_t& algo) {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  const Config& c = it->second;
  cublasLtMatmulAlgo_t rebuilt{};
  cublasStatus_t st = cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, ab_type, ab_type,
                                             d_type, d_type, int(c[0]), &rebuilt);
  for (int i = 1; i < 9 && st == CUBLAS_STATUS_SUCCESS; i++) {
    const std::uint32_t v32 = std::uint32_t(c[std::size_t(i)]);
    const std::uint16_t v16 = std::uint16_t(c[std::size_t(i)]);
    const void* v = kConfigBytes[i] == 2 ? static_cast<const void*>(&v16) : &v32;
    st = cublasLtMatmulAlgoConfigSetAttribute(
        &rebuilt, static_cast<cublasLtMatmulAlgoConfigAttributes_t>(i), v, kConfigBytes[i]);
  }
  cublasLtMatmulHeuristicResult_t result{};
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoCheck(lt, desc, a, b, d, d, &rebuilt, &result);
  if (st != CUBLAS_STATUS_SUCCESS || result.workspaceSize > workspace) {
    refused_++;
    return false;
  }
  algo = rebuilt;
  read_++;
  return true;
}

int LtTuner::fastest(cudaStream_t stream, int count,
                     const std::function<cublasStatus_t(int)>& run) {
  const auto start = std::chrono::steady_clock::now();
  std::array<cudaEvent_t, kRuns + 1> events{};
  for (auto& e : events) TRIDENT_CUDA_CHECK(cudaEventCreate(&e));
  int best = -1;
  float best_ms = 0.0f;
  for (int i = 0; i < count; i++) {
    if (run(i) != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; a refusal rules it out
    TRIDENT_CUDA_CHECK(cudaEventRecord(events[0], stream));
    bool ran = true;
    for (int r = 0; r < kRuns && ran; r++) {
      ran = run(i) == CUBLAS_STATUS_SUCCESS;
      TRIDENT_CUDA_CHECK(cudaEventRecord(events[std::size_t(r) + 1], stream));
    }
    TRIDENT_CUDA_CHECK(cudaEventSynchronize(events[kRuns]));
    if (!ran) continue;
    std::array<float, kRuns> ms{};
    for (int r = 0; r < kRuns; r++)
      TRIDENT_CUDA_CHECK(cudaEventElapsedTime(&ms[std::size_t(r)], events[std::size_t(r)],
                                              events[std::size_t(r) + 1]));
    std::nth_element(ms.begin(), ms.begin() + kRuns / 2, ms.end());
    const float median = ms[kRuns / 2];
    if (best < 0 || median < best_ms) best = i, best_ms = median;
  }
  for (auto& e : events) cudaEventDestroy(e);
  tune_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count();
  return best;
}

void LtTuner::record(const Key& key, const cublasLtMatmulAlgo_t& algo, int candidates) {
  (candidates > 1 ? tuned_ : single_)++;
  if (file_.empty()) return;
  Config c{};
  for (int i = 0; i < 9; i++) {
    std::uint32_t v32 = 0;
    std::uint16_t v16 = 0;
    void* v = kConfigBytes[i] == 2 ? static_cast<void*>(&v16) : &v32;
    std::size_t written = 0;
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(
        &algo, static_cast<cublasLtMatmulAlgoConfigAttributes_t>(i), v, kConfigBytes[i],
        &written));
    // ID and SPLITK_NUM are int32_t, the others unsigned
    c[std::size_t(i)] = kConfigBytes[i] == 2 ? std::int64_t(v16)
                        : (i == 0 || i == 2) ? std::int64_t(std::int32_t(v32))
                                             : std::int64_t(v32);
  }
  entries_[key] = c;
  write();
}

void LtTuner::write() {
  // the whole file, then a rename: a reader (or a crash) never sees half of it
  const std::string tmp = file_ + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kHeader << '\n';
    for (const std::string& line : foreign_) out << line << '\n';
    for (const auto& [key, config] : entries_) {
      out << device_ << ' ' << version_;
      for (std::int64_t k : key) out << ' ' << k;
      for (std::int64_t c : config) out << ' ' << c;
      out << '\n';
    }
    out.flush();
    if (out && std::rename(tmp.c_str(), file_.c_str()) == 0) return;
  }
  std::remove(tmp.c_str());
  if (!write_failed_)
    std::fprintf(stderr, "cuBLASLt tuning (TRIDENT_CUDA_LT_TUNE): cannot write %s: the choices "
                 "of this run are not kept\n", file_.c_str());
  write_failed_ = true;
}

}  // namespace trident::ops::cuda
