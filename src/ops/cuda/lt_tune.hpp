// ops/cuda/lt_tune.hpp — TRIDENT_CUDA_LT_TUNE: each cuBLASLt plan's algorithm (CudaOps::bias_lt,
// and under the knob gemm_lt16: gemm_rm16's and gemm_rm16_to16's products) chosen by timing the
// heuristic's candidates on the plan's first call, instead of taking the heuristic's first; and,
// for resumed runs to round as the first did, the choices kept in a file.
//   unset, empty, 0   off: the heuristic's first algorithm (and no file)
//   1                 tune every plan, keep nothing
//   FILE              read the choices from FILE (rank r > 0: FILE.rankr, as TRIDENT_OP_TIMING)
//                     where it has an entry for the plan that cublasLtMatmulAlgoCheck accepts,
//                     else tune; FILE is rewritten (whole, by rename) after each tuning.
// An entry: device name (blanks as _), cuBLASLt version, the plan key's 5 numbers, and the
// algorithm as its 9 cublasLtMatmulAlgoConfigAttributes_t values (ID .. CLUSTER_SHAPE_ID); entries
// of another device or version are kept when rewriting, never used. Per rank, not one shared
// file: each rank times its own candidates, and only its own choices replay its own rounding.
// defines: LtTuner
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace trident::ops::cuda {

class LtTuner {
 public:
  using Key = std::array<std::int64_t, 5>;  // CudaOps::lt_plans_'s key
  static constexpr int kCandidates = 8;      // asked of the heuristic
  static constexpr int kRuns = 5;            // timed runs per candidate (after one warm-up)

  // Null when TRIDENT_CUDA_LT_TUNE is unset, empty or 0. Reads the file when it names one.
  static std::unique_ptr<LtTuner> from_environment(const std::string& device_name);
  LtTuner(std::string file, const std::string& device_name);
  ~LtTuner();  // says what was done, one line on stderr (when any plan was made)
  LtTuner(const LtTuner&) = delete;
  LtTuner& operator=(const LtTuner&) = delete;

  // The file's algorithm for `key`, rebuilt (cublasLtMatmulAlgoInit + config attributes) and
  // accepted by cublasLtMatmulAlgoCheck for this problem with at most `workspace` bytes; false
  // when the file has none or it is refused (counted: the caller tunes).
  bool stored(cublasLtHandle_t lt, const Key& key, cublasLtMatmulDesc_t desc,
              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d,
              cudaDataType_t ab_type, cudaDataType_t d_type, std::size_t workspace,
              cublasLtMatmulAlgo_t& algo);
  // The index of the fastest of `count` candidates: each run once (warm-up; one whose status is
  // not success is out), then kRuns times between CUDA events on `stream`, by the median.
  // -1 when none ran. Synchronizes the stream.
  int fastest(cudaStream_t stream, int count, const std::function<cublasStatus_t(int)>& run);
  // The choice for `key`, written to the file (when there is one).
  void record(const Key& key, const cublasLtMatmulAlgo_t& algo, int candidates);
  // A plan left on the heuristic's first (no memory for the scratch D).
  void skipped() { skipped_++; }
  const std::string& file() const { return file_; }

 private:
  using Config = std::array<std::int64_t, 9>;  // cublasLtMatmulAlgoConfigAttributes_t 0..8
  void write();

  std::string file_;    // empty: nothing kept
  std::string device_;  // the device name, blanks as _
  std::size_t version_;
  std::map<Key, Config> entries_;      // this device and version's
  std::vector<std::string> foreign_;   // other devices' or versions' lines, kept as they are
  int tuned_ = 0, single_ = 0, read_ = 0, refused_ = 0, skipped_ = 0;
  double tune_ms_ = 0.0;
  bool write_failed_ = false;
};

}  // namespace trident::ops::cuda
