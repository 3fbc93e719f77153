// ops/cuda/cudnn_attention.cpp — CudnnAttention (cudnn_attention.hpp): cuDNN loaded with
// dlopen, the fused flash attention graphs built with cuDNN 9's backend graph API, plans
// cached per shape; and CudaOps's two entry points to it (attention_cudnn_forward and
// _backward, called first by matmul.cpp's attention_forward / attention_backward).
// defines: CudnnAttention, CudaOps::attention_cudnn_forward, CudaOps::attention_cudnn_backward
//
// Why a composed graph: cuDNN 9.19's dedicated CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD
// descriptors have no causal attribute (a block mask only; the mask subgraph they take
// arrives in 9.21), so this builds what cudnn-frontend's "composite" SDPA nodes lower to for
// cuDNN < 9.21 (node/scaled_dot_product_flash_attention.h, softmax.h, diagonal_band_mask.h;
// read, not copied): matmuls, pointwise and reduction operations that the runtime-fusion
// "fused flash attention" engines recognise as one pattern. The pattern matters more than
// the arithmetic: the order, data types and virtual-ness below follow the frontend's.
//
// Conventions (the frontend's): I/O tensors bf16; every virtual intermediate fp32 (its
// "intermediate" type) except the index tensors (int32), the mask (boolean) and the
// probabilities fed to a matmul (bf16, "the bmm's aType is the I/O type"); compute fp32;
// 16-byte alignment; scalars passed by value ([1,1,1,1] fp32, a host pointer in the variant
// pack). K enters the first matmul as K^T (dims [b,h,d,s], its strides swapped: no copy).
// The causal mask is top-left: keep column j of row i when i >= j (GEN_INDEX on axes 2 and
// 3, CMP_GE, BINARY_SELECT(x = score, b = -inf, t = mask): y = t ? x : b); the fill is -inf
// from cuDNN 9.10 on, the lowest float before (the frontend's get_negative_inf_value).
// GEN_INDEX computes in fp32 (the current frontend leaves its compute type to the context's)
// and, when that graph gets no plan, in int32 (the frontend's earlier causal_mask): each
// shape tries both before giving up.
// Stats = max + log(sum exp(s - max)) in fp32, natural log: trident's lse.
//
// Forward (14 operations):
//   S = Q @ K^T; S1 = S * scale; mask(S1) -> S2; M = max_row(S2); E = exp(S2 - M);
//   Z = sum_row(E); Stats = M + log(Z); P = E / Z (bf16); O = P @ V.
// Backward (21 or 22):
//   Dsum = sum_row(dO * O) * 1 (non-virtual fp32 [b,h,s,1]: its memory is ours);
//   S = Q @ K^T; S1 = S * scale; S2 = S1 - Stats; mask(S2) -> S3; P = exp(S3);
//   dV = reshape(P)^T(bf16) @ dO; dP = dO @ V^T; dS = (dP - Dsum) * P * scale;
//   dK = reshape(dS)^T(bf16) @ Q; dQ = dS @ reshape(K^T) (fp32 K view).
// Deterministic (default): dQ written by its matmul (the frontend's "dP workspace" form,
// which it uses for set_deterministic_algorithm); otherwise dQ accumulated in a non-virtual
// fp32 [b,h,s,d] (zeroed by the engine from 9.6 on, by us before) and an IDENTITY to dQ.
// In deterministic mode engine configs with CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC are
// skipped as well.
#include "cudnn_attention.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>
#include <vector>

#include "check.hpp"
#include "cuda_ops.hpp"
#include "kernels.hpp"

#if defined(TRIDENT_HAVE_CUDNN) && TRIDENT_HAVE_CUDNN
#include <cudnn_graph.h>
#define TRIDENT_CUDNN_BUILT 1
#else
#define TRIDENT_CUDNN_BUILT 0
#endif

namespace trident::ops::cuda {

namespace {

bool env_equals(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::string(v) == value;
}

std::atomic<bool> g_told{false};  // the one stderr line per process

}  // namespace

std::int64_t cudnn_workspace_bound(std::int64_t b, std::int64_t t, std::int64_t nh,
                                   std::int64_t hs) {
  const std::int64_t dp = 2 * b * nh * ((t + 63) / 64 * 64) * ((t + 127) / 128 * 128);
  return std::max<std::int64_t>(dp + 4 * b * nh * t * hs, std::int64_t(64) << 20);
}

const char* CudnnAttention::decline(const Ops::AttentionShape& s) {
  if (!s.causal) return "not causal";
  if (s.accumulate) return "accumulated gradients";
  if (s.nkv != s.nh) return "grouped key/value heads";
  if (s.hs % 8 != 0 || s.hs > 128) return "head size not a multiple of 8 up to 128";
  if (s.b <= 0 || s.t <= 0 || s.nh <= 0) return "empty shape";
  if (s.batch_q() != s.t * s.ld_q || s.batch_k() != s.t * s.ld_k ||
      s.batch_v() != s.t * s.ld_v || s.batch_o() != s.t * s.ld_o)
    return "blocks of a longer sequence";
  if (s.lse_row() != s.t) return "lse rows longer than t";
  return nullptr;
}

const char* CudnnAttention::decline_bf16(const Ops::AttentionShape& s,
                                         std::initializer_list<const void*> tensors) {
  if (const char* no = decline(s)) return no;
  if (s.ld_q % 8 || s.ld_k % 8 || s.ld_v % 8 || s.ld_o % 8)
    return "bf16 row strides not multiples of 8 elements";
  for (const void* p : tensors)
    if (reinterpret_cast<std::uintptr_t>(p) % 16) return "bf16 tensor not 16-byte aligned";
  return nullptr;
}

bool CudnnAttention::refuse(std::string why) {
  reason_ = std::move(why);
  if (!g_told.exchange(true))
    std::fprintf(stderr, "cuDNN attention unavailable (%s): using trident's kernel\n",
                 reason_.c_str());
  return false;
}

#if TRIDENT_CUDNN_BUILT

namespace {

// The cuDNN functions trident calls, resolved from the loaded library.
struct Api {
  void* lib = nullptr;
  std::string path;
  std::size_t version = 0;
  decltype(&cudnnGetVersion) GetVersion = nullptr;
  decltype(&cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&cudnnGetLastErrorString) GetLastErrorString = nullptr;  // optional
  decltype(&cudnnCreate) Create = nullptr;
  decltype(&cudnnDestroy) Destroy = nullptr;
  decltype(&cudnnSetStream) SetStream = nullptr;
  decltype(&cudnnBackendCreateDescriptor) CreateDescriptor = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) DestroyDescriptor = nullptr;
  decltype(&cudnnBackendSetAttribute) SetAttribute = nullptr;
  decltype(&cudnnBackendGetAttribute) GetAttribute = nullptr;
  decltype(&cudnnBackendFinalize) Finalize = nullptr;
  decltype(&cudnnBackendExecute) Execute = nullptr;

  // "" when loaded, else why not.
  std::string load() {
    const char* env = std::getenv("TRIDENT_CUDNN_LIBRARY");
    path = env && *env ? env : "libcudnn.so.9";
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      return "cannot load " + path + (e ? std::string(": ") + e : std::string());
    }
    std::string missing;
    auto get = [&](auto& fn, const char* name, bool required = true) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && required) missing += std::string(missing.empty() ? "" : ", ") + name;
    };
    get(GetVersion, "cudnnGetVersion");
    get(GetErrorString, "cudnnGetErrorString");
    get(GetLastErrorString, "cudnnGetLastErrorString", false);
    get(Create, "cudnnCreate");
    get(Destroy, "cudnnDestroy");
    get(SetStream, "cudnnSetStream");
    get(CreateDescriptor, "cudnnBackendCreateDescriptor");
    get(DestroyDescriptor, "cudnnBackendDestroyDescriptor");
    get(SetAttribute, "cudnnBackendSetAttribute");
    get(GetAttribute, "cudnnBackendGetAttribute");
    get(Finalize, "cudnnBackendFinalize");
    get(Execute, "cudnnBackendExecute");
    if (!missing.empty()) return path + " lacks " + missing;
    version = GetVersion();
    if (version < 90000) return "cuDNN " + version_string() + " in " + path + " is older than 9.0";
    return "";
  }
  // 91900 -> "9.19.0"
  std::string version_string() const {
    return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
           std::to_string(version % 100);
  }
  std::string status(cudnnStatus_t st) const {
    std::string s = GetErrorString ? GetErrorString(st) : std::to_string(int(st));
    if (GetLastErrorString) {
      char buf[512] = {0};
      GetLastErrorString(buf, sizeof buf);
      if (buf[0]) s += std::string(" [") + buf + "]";
    }
    return s;
  }
};

// Attributes deprecated in 9.x but the only way to name the handle there (no warning).
constexpr auto kGraphHandle = static_cast<cudnnBackendAttributeName_t>(800);  // OPERATIONGRAPH_HANDLE
constexpr auto kPlanHandle = static_cast<cudnnBackendAttributeName_t>(400);  // EXECUTION_PLAN_HANDLE

using Dims = std::array<std::int64_t, 4>;

// Tensor unique ids of the variant pack (virtual tensors get ids from 100 on).
enum Uid : std::int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kDsum, kOne, kDQAcc
};

// One built graph and its plan; owns every descriptor it made.
struct Graph {
  const Api* api = nullptr;
  std::vector<cudnnBackendDescriptor_t> owned;
  cudnnBackendDescriptor_t plan = nullptr;
  std::int64_t workspace = 0;
  std::int64_t engine = -1;   // the plan's engine (global index)
  bool dq_accumulator = false;
  float scale = 1.0f, neg_inf = -INFINITY, one = 1.0f;  // the by-value scalars
  std::string error;          // first failing call, "" when none
  ~Graph() {
    for (auto it = owned.rbegin(); it != owned.rend(); ++it) api->DestroyDescriptor(*it);
  }
};

// Builds one graph's descriptors, recording the first failure (later calls are no-ops).
class Builder {
 public:
  // index_compute: GEN_INDEX's compute type (fp32 as cudnn-frontend's composite band mask
  // leaves it; int32 as its earlier causal_mask set it).
  Builder(Graph& g, std::ostream* log, cudnnDataType_t index_compute)
      : g_(g), api_(*g.api), log_(log), index_compute_(index_compute) {}
  bool ok() const { return g_.error.empty(); }

  bool check(cudnnStatus_t st, const std::string& what) {
    if (!ok()) return false;
    if (st != CUDNN_STATUS_SUCCESS) {
      g_.error = what + ": " + api_.status(st);
      if (log_) *log_ << "FAIL " << g_.error << "\n";
      return false;
    }
    return true;
  }
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type, const std::string& what) {
    cudnnBackendDescriptor_t d = nullptr;
    if (!check(api_.CreateDescriptor(type, &d), "create " + what)) return nullptr;
    g_.owned.push_back(d);
    return d;
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, std::int64_t n, const void* value,
           const std::string& what) {
    if (!ok()) return;
    check(api_.SetAttribute(d, name, type, n, value), "set " + what);
  }
  void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendDescriptor_t value, const std::string& what) {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
  }
  bool finalize(cudnnBackendDescriptor_t d, const std::string& what) {
    if (!ok()) return false;
    const bool done = check(api_.Finalize(d), "finalize " + what);
    if (done && log_) *log_ << "ok   " << what << "\n";
    return done;
  }

  // A tensor [4] of `type`; uid < 0 takes the next virtual id.
  cudnnBackendDescriptor_t tensor(const std::string& name, std::int64_t uid,
                                  cudnnDataType_t type, Dims dims, Dims strides,
                                  bool is_virtual, bool by_value = false) {
    if (uid < 0) uid = next_virtual_++;
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor " + name);
    const std::int64_t alignment = 16;
    const bool v = is_virtual, bv = by_value;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, name + " type");
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), name + " dims");
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), name + " strides");
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, name + " uid");
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, name + " align");
    if (v) set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, name + " virtual");
    if (bv) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv, name + " by value");
    finalize(t, "tensor " + name);
    return t;
  }
  cudnnBackendDescriptor_t scalar(const std::string& name, std::int64_t uid) {
    return tensor(name, uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x[, b][, t]); axis >= 0 for GEN_INDEX.
  void pointwise(const std::string& name, cudnnPointwiseMode_t mode, cudnnDataType_t compute,
                 cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 std::int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, name);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, name + " mode");
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute, name + " prec");
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, name + " axis");
    finalize(pw, "pointwise " + name);
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name + " op");
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, name + " pw");
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, name + " x");
    if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, name + " b");
    if (t) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, name + " t");
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, name + " y");
    if (finalize(op, "operation " + name)) ops_.push_back(op);
  }
  void reduction(const std::string& name, cudnnReduceTensorOp_t mode,
                 cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, name);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode,
        name + " operator");
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, name + " comp");
    finalize(rd, "reduction " + name);
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name + " op");
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd, name + " desc");
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, name + " x");
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, name + " y");
    if (finalize(op, "operation " + name)) ops_.push_back(op);
  }
  void matmul(const std::string& name, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
              cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, name);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, name + " comp");
    finalize(mm, "matmul " + name);
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name + " op");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, name + " a");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, name + " b");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, name + " c");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm, name + " desc");
    if (finalize(op, "operation " + name)) ops_.push_back(op);
  }
  void reshape(const std::string& name, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name);
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, name + " x");
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, name + " y");
    if (finalize(op, "operation " + name)) ops_.push_back(op);
  }
  // The causal mask of cudnn-frontend's CompositeDiagonalBandMaskNode (top-left, right
  // bound 0): keep (i, j) when row i >= column j, else the by-value fill (-inf).
  cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t s, cudnnBackendDescriptor_t fill,
                                       Dims dims, Dims strides) {
    auto row = tensor("row_index", -1, CUDNN_DATA_INT32, dims, strides, true);
    auto col = tensor("col_index", -1, CUDNN_DATA_INT32, dims, strides, true);
    auto keep = tensor("causal_keep", -1, CUDNN_DATA_BOOLEAN, dims, strides, true);
    auto out = tensor("masked", -1, CUDNN_DATA_FLOAT, dims, strides, true);
    pointwise("gen_row_index", CUDNN_POINTWISE_GEN_INDEX, index_compute_, s, nullptr, nullptr,
              row, 2);
    pointwise("gen_col_index", CUDNN_POINTWISE_GEN_INDEX, index_compute_, s, nullptr, nullptr,
              col, 3);
    pointwise("row_ge_col", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep);
    pointwise("causal_select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, fill, keep,
              out);
    return out;
  }

  // The operation graph (handle may be null: the probe without a GPU) and, with a handle,
  // the plan: heuristics mode A then the fallback list, the first config that finalizes
  // within the workspace bound (and, if deterministic, is not marked non-deterministic).
  void plan(cudnnHandle_t handle, bool deterministic, std::int64_t workspace_bound) {
    if (!ok()) return;
    cudnnBackendDescriptor_t graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "graph");
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        std::int64_t(ops_.size()), ops_.data(), "graph ops");
    if (handle) set(graph, kGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
    if (!finalize(graph, "operation graph (" + std::to_string(ops_.size()) + " operations)"))
      return;
    int configs = 0, nondeterministic = 0, refused = 0, too_big = 0;
    std::string first_refusal;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      const std::string m = mode == CUDNN_HEUR_MODE_A ? "heuristics A" : "heuristics fallback";
      cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, m);
      set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, m + " graph");
      set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, m + " mode");
      if (!finalize(heur, m)) return;
      std::int64_t count = 0;
      if (!check(api_.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                 m + " result count"))
        return;
      if (log_) *log_ << "     " << m << ": " << count << " engine configs\n";
      if (count <= 0) continue;
      std::vector<cudnnBackendDescriptor_t> cfgs(std::size_t(count), nullptr);
      for (auto& c : cfgs) c = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, m + " config");
      std::int64_t got = 0;
      if (!check(api_.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs.data()),
                 m + " results"))
        return;
      if (log_ && got != count) *log_ << "     " << m << ": " << got << " configs returned\n";
      for (std::int64_t i = 0; i < got; i++) {
        configs++;
        cudnnBackendDescriptor_t engine = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
        std::int64_t n = 0, index = -1;
        std::array<cudnnBackendNumericalNote_t, 16> notes{};
        if (!ok()) return;
        bool nondet = false;
        if (api_.GetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                              1, &n, &engine) == CUDNN_STATUS_SUCCESS) {
          api_.GetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                            &index);
          std::int64_t notes_n = 0;
          if (api_.GetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                CUDNN_TYPE_NUMERICAL_NOTE, std::int64_t(notes.size()), &notes_n,
                                notes.data()) == CUDNN_STATUS_SUCCESS)
            for (std::int64_t k = 0; k < notes_n && k < std::int64_t(notes.size()); k++)
              nondet = nondet || notes[std::size_t(k)] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
        }
        const std::string cfg = "     " + m + " config " + std::to_string(i) + ": engine " +
                                std::to_string(index) + (nondet ? " (non-deterministic)" : "");
        if (deterministic && nondet) {
          nondeterministic++;
          if (log_) *log_ << cfg << ": skipped\n";
          continue;
        }
        cudnnBackendDescriptor_t p = nullptr;
        if (api_.CreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) !=
            CUDNN_STATUS_SUCCESS)
          continue;
        cudnnStatus_t st = api_.SetAttribute(p, kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle);
        if (st == CUDNN_STATUS_SUCCESS)
          st = api_.SetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[std::size_t(i)]);
        if (st == CUDNN_STATUS_SUCCESS) st = api_.Finalize(p);
        std::int64_t ws = 0;
        if (st == CUDNN_STATUS_SUCCESS)
          st = api_.GetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                 1, &n, &ws);
        if (st != CUDNN_STATUS_SUCCESS) {
          if (log_) *log_ << cfg << ": " << api_.status(st) << "\n";
          if (first_refusal.empty())
            first_refusal = "engine " + std::to_string(index) + ": " + api_.status(st);
          refused++;
          api_.DestroyDescriptor(p);
          continue;
        }
        if (ws > workspace_bound) {
          if (log_) *log_ << cfg << ": workspace " << ws << " > bound " << workspace_bound << "\n";
          too_big++;
          api_.DestroyDescriptor(p);
          continue;
        }
        g_.owned.push_back(p);
        g_.plan = p;
        g_.workspace = ws;
        g_.engine = index;
        if (log_)
          *log_ << "ok   plan: engine " << index << (nondet ? " (non-deterministic)" : "")
                << ", workspace " << ws << " bytes (bound " << workspace_bound << ")\n";
        return;
      }
    }
    g_.error = "no engine for the graph: " + std::to_string(configs) + " configs" +
               (nondeterministic ? ", " + std::to_string(nondeterministic) + " non-deterministic"
                                 : "") +
               (too_big ? ", " + std::to_string(too_big) + " above the workspace bound" : "") +
               (refused ? ", " + std::to_string(refused) + " refused (first " + first_refusal + ")"
                        : "");
    if (log_) *log_ << "FAIL " << g_.error << "\n";
  }

 private:
  Graph& g_;
  const Api& api_;
  std::ostream* log_;
  cudnnDataType_t index_compute_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::int64_t next_virtual_ = 100;
};

// The bf16 tensors' row strides (elements): the packed copies' (NH * hs each), or the
// caller's own (the bf16-I/O entry points: q, k, v inside GPT's fused qkv, ld 3C). Sequences
// are packed (batch stride t * ld: decline() holds ring attention's blocks back).
struct Layout {
  std::int64_t q, k, v, o;
};
Layout packed_layout(std::int64_t nh, std::int64_t hs) {
  return {nh * hs, nh * hs, nh * hs, nh * hs};
}

// A [B, T, NH, hs] tensor with row stride ld as cuDNN's [b, h, s, d], and the K^T / V^T view
// of one (dims [b, h, d, s], the last two strides swapped).
Dims bshd_dims(std::int64_t b, std::int64_t t, std::int64_t nh, std::int64_t hs) {
  return {b, nh, t, hs};
}
Dims bshd_strides(std::int64_t t, std::int64_t ld, std::int64_t hs) { return {t * ld, hs, ld, 1}; }
Dims transposed_dims(std::int64_t b, std::int64_t t, std::int64_t nh, std::int64_t hs) {
  return {b, nh, hs, t};
}
Dims transposed_strides(std::int64_t t, std::int64_t ld, std::int64_t hs) {
  return {t * ld, hs, 1, ld};
}

void build_forward(Graph& g, Builder& B, std::int64_t b, std::int64_t t, std::int64_t nh,
                   std::int64_t hs, const Layout& ld) {
  const Dims io = bshd_dims(b, t, nh, hs);
  const Dims sc = {b, nh, t, t}, sc_s = {nh * t * t, t * t, t, 1};
  const Dims row = {b, nh, t, 1}, row_s = {nh * t, t, 1, 1};
  auto Q = B.tensor("Q", kQ, CUDNN_DATA_BFLOAT16, io, bshd_strides(t, ld.q, hs), false);
  auto KT = B.tensor("K^T", kK, CUDNN_DATA_BFLOAT16, transposed_dims(b, t, nh, hs),
                     transposed_strides(t, ld.k, hs), false);
  auto V = B.tensor("V", kV, CUDNN_DATA_BFLOAT16, io, bshd_strides(t, ld.v, hs), false);
  auto O = B.tensor("O", kO, CUDNN_DATA_BFLOAT16, io, bshd_strides(t, ld.o, hs), false);
  auto stats = B.tensor("Stats", kStats, CUDNN_DATA_FLOAT, row, row_s, false);
  auto scale = B.scalar("scale", kScale);
  auto fill = B.scalar("mask fill", kNegInf);
  auto S = B.tensor("S", -1, CUDNN_DATA_FLOAT, sc, sc_s, true);
  B.matmul("bmm1 Q.K^T", Q, KT, S);
  auto S1 = B.tensor("S*scale", -1, CUDNN_DATA_FLOAT, sc, sc_s, true);
  B.pointwise("attn_scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, S, scale, nullptr, S1);
  auto S2 = B.causal_mask(S1, fill, sc, sc_s);
  // cudnn-frontend's CompositeSoftmaxNode with Stats only.
  auto M = B.tensor("row max", -1, CUDNN_DATA_FLOAT, row, row_s, true);
  B.reduction("max", CUDNN_REDUCE_TENSOR_MAX, S2, M);
  auto D = B.tensor("S-max", -1, CUDNN_DATA_FLOAT, sc, sc_s, true);
  B.pointwise("sub", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, S2, M, nullptr, D);
  auto E = B.tensor("exp", -1, CUDNN_DATA_FLOAT, sc, sc_s, true);
  B.pointwise("exp", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, D, nullptr, nullptr, E);
  auto Z = B.tensor("row sum", -1, CUDNN_DATA_FLOAT, row, row_s, true);
  B.reduction("sum", CUDNN_REDUCE_TENSOR_ADD, E, Z);
  auto L = B.tensor("log sum", -1, CUDNN_DATA_FLOAT, row, row_s, true);
  B.pointwise("log", CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, Z, nullptr, nullptr, L);
  B.pointwise("stats", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, M, L, nullptr, stats);
  auto P = B.tensor("P", -1, CUDNN_DATA_BFLOAT16, sc, sc_s, true);
  B.pointwise("div", CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, E, Z, nullptr, P);
  B.matmul("bmm2 P.V", P, V, O);
  (void)g;
}

void build_backward(Graph& g, Builder& B, std::int64_t b, std::int64_t t, std::int64_t nh,
                    std::int64_t hs, const Layout& ld) {
  const Dims io = bshd_dims(b, t, nh, hs), tr = transposed_dims(b, t, nh, hs);
  const Dims q_s = bshd_strides(t, ld.q, hs), kt_s = transposed_strides(t, ld.k, hs);
  const Dims vt_s = transposed_strides(t, ld.v, hs), o_s = bshd_strides(t, ld.o, hs);
  const Dims sc = {b, nh, t, t}, sc_s = {nh * t * t, t * t, t, 1};
  const Dims sc_t_s = {nh * t * t, t * t, 1, t};  // [b,h,s_kv,s_q] views of [b,h,s_q,s_kv]
  const Dims row = {b, nh, t, 1}, row_s = {nh * t, t, 1, 1};
  // dO has out's strides, dQ / dK / dV those of q / k / v (the gradients of GPT's fused
  // qkv land in the fused dqkv).
  auto Q = B.tensor("Q", kQ, CUDNN_DATA_BFLOAT16, io, q_s, false);
  auto KT = B.tensor("K^T", kK, CUDNN_DATA_BFLOAT16, tr, kt_s, false);
  auto VT = B.tensor("V^T", kV, CUDNN_DATA_BFLOAT16, tr, vt_s, false);
  auto O = B.tensor("O", kO, CUDNN_DATA_BFLOAT16, io, o_s, false);
  auto dO = B.tensor("dO", kDO, CUDNN_DATA_BFLOAT16, io, o_s, false);
  auto stats = B.tensor("Stats", kStats, CUDNN_DATA_FLOAT, row, row_s, false);
  auto dQ = B.tensor("dQ", kDQ, CUDNN_DATA_BFLOAT16, io, q_s, false);
  auto dK = B.tensor("dK", kDK, CUDNN_DATA_BFLOAT16, io, bshd_strides(t, ld.k, hs), false);
  auto dV = B.tensor("dV", kDV, CUDNN_DATA_BFLOAT16, io, bshd_strides(t, ld.v, hs), false);
  auto scale = B.scalar("scale", kScale);
  auto fill = B.scalar("mask fill", kNegInf);
  auto one = B.scalar("one", kOne);
  // Dsum = rowsum(dO * O) * 1 (the frontend's softmax_sum; the 1 stands for dropout's scale).
  auto dOO = B.tensor("dO*O", -1, CUDNN_DATA_FLOAT, io, {nh * t * hs, t * hs, nh * hs, 1}, true);
  B.pointwise("mul_dO_O", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dO, O, nullptr, dOO);
  auto dOO_sum = B.tensor("rowsum dO*O", -1, CUDNN_DATA_FLOAT, row, row_s, true);
  B.reduction("reduce_dO_O", CUDNN_REDUCE_TENSOR_ADD, dOO, dOO_sum);
  auto dsum = B.tensor("Dsum", kDsum, CUDNN_DATA_FLOAT, row, row_s, false);
  B.pointwise("scale_dropout_inv", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dOO_sum, one, nullptr,
              dsum);
  // P = exp(mask(S * scale - Stats)).
  auto S = B.tensor("S", -1, CUDNN_DATA_FLOAT, sc, sc_s, true);
  B.matmul("matmul_Q_KT", Q, KT, S);
  auto S1 = B.tensor("S*scale", -1, CUDNN_DATA_FLOAT, sc, sc_s, true);
  B.pointwise("mul_s_attn_scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, S, scale, nullptr, S1);
  auto S2 = B.tensor("S-stats", -1, CUDNN_DATA_FLOAT, sc, sc_s, true);
  B.pointwise("sub_s_m", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, S1, stats, nullptr, S2);
  auto S3 = B.causal_mask(S2, fill, sc, sc_s);
  auto P = B.tensor("P", -1, CUDNN_DATA_FLOAT, sc, sc_s, true);
  B.pointwise("exp_s", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, S3, nullptr, nullptr, P);
  // dV = P^T dO.
  auto PT = B.tensor("P^T", -1, CUDNN_DATA_BFLOAT16, {b, nh, t, t}, sc_t_s, true);
  B.reshape("reshape_p", P, PT);
  B.matmul("matmul_pT_dO", PT, dO, dV);
  // dS = (dO V^T - Dsum) * P * scale.
  auto dP = B.tensor("dP", -1, CUDNN_DATA_FLOAT, sc, sc_s, true);
  B.matmul("matmul_dO_VT", dO, VT, dP);
  auto dP1 = B.tensor("dP-Dsum", -1, CUDNN_DATA_FLOAT, sc, sc_s, true);
  B.pointwise("sub_dP_softmax_sum", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dP, dsum, nullptr,
              dP1);
  auto dP2 = B.tensor("(dP-Dsum)*P", -1, CUDNN_DATA_FLOAT, sc, sc_s, true);
  B.pointwise("mul_dP_exp_s", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dP1, P, nullptr, dP2);
  auto dS = B.tensor("dS", -1, CUDNN_DATA_FLOAT, sc, sc_s, true);
  B.pointwise("mul_dS_attn_scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dP2, scale, nullptr, dS);
  // dK = dS^T Q.
  auto dST = B.tensor("dS^T", -1, CUDNN_DATA_BFLOAT16, {b, nh, t, t}, sc_t_s, true);
  B.reshape("reshape_dS", dS, dST);
  B.matmul("matmul_dST_Q", dST, Q, dK);
  // dQ = dS K (K as a [b,h,s,d] view of K^T; fp32 like the frontend's unset virtual type).
  auto K = B.tensor("K", -1, CUDNN_DATA_FLOAT, io, bshd_strides(t, ld.k, hs), true);
  B.reshape("reshape_k", KT, K);
  if (g.dq_accumulator) {
    auto acc = B.tensor("dQ accumulator", kDQAcc, CUDNN_DATA_FLOAT, io,
                        {nh * t * hs, t * hs, hs, 1}, false);
    B.matmul("matmul_dS_K", dS, K, acc);
    B.pointwise("identity_dQ", CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, acc, nullptr, nullptr,
                dQ);
  } else {
    B.matmul("matmul_dS_K", dS, K, dQ);
  }
}

// What a graph depends on: {backward, b, t, nh, hs, row strides of q, k, v, out}.
using GraphKey = std::array<std::int64_t, 9>;
GraphKey graph_key(bool backward, const Ops::AttentionShape& s, const Layout& ld) {
  return {backward, s.b, s.t, s.nh, s.hs, ld.q, ld.k, ld.v, ld.o};
}
// The strides cuDNN sees: the caller's (bf16 I/O) or the packed copies'.
Layout layout_of(const Ops::AttentionShape& s, bool bf16_io) {
  return bf16_io ? Layout{s.ld_q, s.ld_k, s.ld_v, s.ld_o} : packed_layout(s.nh, s.hs);
}

}  // namespace

struct CudnnAttention::Impl {
  Api api;
  cudnnHandle_t handle = nullptr;
  bool deterministic = true;
  bool verbose = false;
  // Per GraphKey (everything the graph depends on): the graph, or the failure (not retried).
  std::map<GraphKey, std::unique_ptr<Graph>> graphs;
  std::map<GraphKey, std::string> failures;

  ~Impl() {
    graphs.clear();  // descriptors before the handle
    if (handle) api.Destroy(handle);
    // The library stays loaded: cuDNN keeps process-wide state that outlives dlclose badly.
  }

  // The graph with a plan, trying the two ways cudnn-frontend has written the causal mask's
  // index generation (fp32 compute, then int32); the last attempt when neither plans.
  std::unique_ptr<Graph> build(bool backward, std::int64_t b, std::int64_t t, std::int64_t nh,
                               std::int64_t hs, const Layout& ld, cudnnHandle_t h,
                               std::ostream* log) {
    std::unique_ptr<Graph> g;
    std::string first_error;
    for (cudnnDataType_t index_compute : {CUDNN_DATA_FLOAT, CUDNN_DATA_INT32}) {
      if (log)
        *log << "     causal mask's GEN_INDEX computing in "
             << (index_compute == CUDNN_DATA_FLOAT ? "fp32" : "int32") << "\n";
      g = std::make_unique<Graph>();
      g->api = &api;
      g->scale = 1.0f / std::sqrt(float(hs));
      // -inf from cuDNN 9.10 on; earlier versions prefer the lowest float as the mask's fill.
      g->neg_inf = api.version < 91000 ? std::numeric_limits<float>::lowest() : -INFINITY;
      g->dq_accumulator = backward && !deterministic;
      Builder B(*g, log, index_compute);
      if (backward)
        build_backward(*g, B, b, t, nh, hs, ld);
      else
        build_forward(*g, B, b, t, nh, hs, ld);
      B.plan(h, deterministic, cudnn_workspace_bound(b, t, nh, hs));
      if (g->error.empty() && g->plan) return g;
      if (first_error.empty()) first_error = g->error;
    }
    g->error = first_error + " (and with int32 indices: " + g->error + ")";
    return g;
  }
};

CudnnAttention::CudnnAttention(cudaStream_t stream) : stream_(stream) {}
CudnnAttention::~CudnnAttention() = default;

bool CudnnAttention::available() {
  if (tried_) return ok_;
  tried_ = true;
  if (env_equals("TRIDENT_CUDNN", "0")) return refuse("TRIDENT_CUDNN=0");
  impl_ = std::make_unique<Impl>();
  const std::string why = impl_->api.load();
  if (!why.empty()) return refuse(why);
  cudnnStatus_t st = impl_->api.Create(&impl_->handle);
  if (st != CUDNN_STATUS_SUCCESS) {
    impl_->handle = nullptr;
    return refuse("cudnnCreate: " + impl_->api.status(st));
  }
#if defined(TRIDENT_CUDNN_STAND_IN)
  // The CPU stand-in (emulate/train.sh) builds this path to run the loader and the fallback;
  // its "device" memory is host memory, which a real cuDNN on a real GPU must never get.
  return refuse("the CPU stand-in cannot give cuDNN device memory");
#endif
  st = impl_->api.SetStream(impl_->handle, stream_);
  if (st != CUDNN_STATUS_SUCCESS) return refuse("cudnnSetStream: " + impl_->api.status(st));
  impl_->deterministic = !env_equals("TRIDENT_CUDNN_DETERMINISTIC", "0");
  impl_->verbose = env_equals("TRIDENT_CUDNN_VERBOSE", "1");
  if (impl_->verbose)
    std::fprintf(stderr, "cuDNN attention: %s, %s backward\n", describe().c_str(),
                 impl_->deterministic ? "deterministic" : "non-deterministic");
  ok_ = true;
  return true;
}

std::string CudnnAttention::describe() const {
  if (!impl_ || !impl_->api.version) return "";
  return "cuDNN " + impl_->api.version_string() + " (" + impl_->api.path + ")";
}

namespace {
// Scratch layout of one call: the bf16 copies, then Dsum and the dQ accumulator (backward),
// then cuDNN's workspace.
struct Blocks {
  std::int64_t copy = 0, copies = 0, dsum = 0, acc = 0, workspace = 0;
  std::int64_t total() const {
    return copies * std::int64_t(aligned_bytes(std::size_t(copy))) +
           std::int64_t(aligned_bytes(std::size_t(dsum))) +
           std::int64_t(aligned_bytes(std::size_t(acc))) +
           std::int64_t(aligned_bytes(std::size_t(std::max<std::int64_t>(workspace, 1))));
  }
};
Blocks blocks_of(const Ops::AttentionShape& s, bool backward, bool bf16_io, const Graph& g) {
  Blocks k;
  k.copy = 2 * std::int64_t(s.b) * s.t * s.nh * s.hs;
  k.copies = bf16_io ? 0 : backward ? 8 : 4;
  k.dsum = backward ? 4 * std::int64_t(s.b) * s.nh * s.t : 0;
  k.acc = g.dq_accumulator ? 4 * std::int64_t(s.b) * s.nh * s.t * s.hs : 0;
  k.workspace = g.workspace;
  return k;
}
}  // namespace

std::int64_t CudnnAttention::prepare(const Ops::AttentionShape& s, bool backward, bool bf16_io) {
  if (!available()) return -1;
  if (const char* no = decline(s)) {
    reason_ = no;
    return -1;
  }
  if (backward && impl_->api.version <= 91500 && s.t % 128 != 0) {
    // cudnn-frontend adds a padding mask there (a backward bug for s_kv % 128 != 0).
    refuse("backward with t % 128 != 0 needs cuDNN > 9.15");
    return -1;
  }
  const Layout ld = layout_of(s, bf16_io);
  const GraphKey key = graph_key(backward, s, ld);
  auto it = impl_->graphs.find(key);
  if (it == impl_->graphs.end()) {
    if (impl_->failures.count(key)) {
      reason_ = impl_->failures[key];
      return -1;
    }
    std::unique_ptr<Graph> g =
        impl_->build(backward, s.b, s.t, s.nh, s.hs, ld, impl_->handle, nullptr);
    if (!g->error.empty() || !g->plan) {
      const std::string why = (backward ? "backward b " : "forward b ") + std::to_string(s.b) +
                              " t " + std::to_string(s.t) + " nh " + std::to_string(s.nh) +
                              " hs " + std::to_string(s.hs) +
                              (bf16_io ? " (bf16, row strides " + std::to_string(ld.q) + " " +
                                             std::to_string(ld.k) + " " + std::to_string(ld.v) +
                                             " " + std::to_string(ld.o) + ")"
                                       : std::string()) +
                              ": " +
                              (g->error.empty() ? std::string("no plan") : g->error);
      impl_->failures[key] = why;
      refuse(why);
      return -1;
    }
    if (impl_->verbose)
      std::fprintf(stderr, "cuDNN attention: %s%s plan b %d t %d nh %d hs %d: engine %lld, "
                   "workspace %lld bytes\n", backward ? "backward" : "forward",
                   bf16_io ? " (bf16 I/O)" : "", s.b, s.t, s.nh, s.hs,
                   static_cast<long long>(g->engine), static_cast<long long>(g->workspace));
    it = impl_->graphs.emplace(key, std::move(g)).first;
  }
  return blocks_of(s, backward, bf16_io, *it->second).total();
}

namespace {
bool execute(const Api& api, cudnnHandle_t handle, const Graph& g,
             const std::vector<std::int64_t>& uids, const std::vector<void*>& ptrs,
             void* workspace, std::string& error) {
  cudnnBackendDescriptor_t pack = nullptr;
  cudnnStatus_t st = api.CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (st == CUDNN_STATUS_SUCCESS)
    st = api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                          std::int64_t(uids.size()), uids.data());
  if (st == CUDNN_STATUS_SUCCESS)
    st = api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                          std::int64_t(ptrs.size()), ptrs.data());
  if (st == CUDNN_STATUS_SUCCESS)
    st = api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                          &workspace);
  if (st == CUDNN_STATUS_SUCCESS) st = api.Finalize(pack);
  if (st == CUDNN_STATUS_SUCCESS) st = api.Execute(handle, g.plan, pack);
  if (pack) api.DestroyDescriptor(pack);
  if (st != CUDNN_STATUS_SUCCESS) error = "execute: " + api.status(st);
  return st == CUDNN_STATUS_SUCCESS;
}
}  // namespace

bool CudnnAttention::forward(BumpBlock& scratch, float* out, float* lse, const float* q,
                             const float* k, const float* v, const Ops::AttentionShape& s) {
  const GraphKey key = graph_key(false, s, layout_of(s, false));
  Graph& g = *impl_->graphs.at(key);
  const Blocks k_ = blocks_of(s, false, false, g);
  const std::int64_t rows = std::int64_t(s.b) * s.t, cols = std::int64_t(s.nh) * s.hs;
  void* q16 = scratch.alloc(std::size_t(k_.copy));
  void* k16 = scratch.alloc(std::size_t(k_.copy));
  void* v16 = scratch.alloc(std::size_t(k_.copy));
  void* o16 = scratch.alloc(std::size_t(k_.copy));
  void* ws = scratch.alloc(std::size_t(std::max<std::int64_t>(k_.workspace, 1)));
  launch_to_bf16(stream_, q16, q, rows, cols, s.ld_q);
  launch_to_bf16(stream_, k16, k, rows, cols, s.ld_k);
  launch_to_bf16(stream_, v16, v, rows, cols, s.ld_v);
  std::string error;
  if (!execute(impl_->api, impl_->handle, g,
               {kQ, kK, kV, kO, kStats, kScale, kNegInf},
               {q16, k16, v16, o16, lse, &g.scale, &g.neg_inf}, ws, error)) {
    impl_->graphs.erase(key);
    impl_->failures[key] = error;
    return refuse(error);
  }
  launch_from_bf16_rows(stream_, out, s.ld_o, o16, rows, cols, false);
  return true;
}

bool CudnnAttention::backward(BumpBlock& scratch, float* dq, float* dk, float* dv,
                              const float* dout, const float* out, const float* lse,
                              const float* q, const float* k, const float* v,
                              const Ops::AttentionShape& s) {
  const GraphKey key = graph_key(true, s, layout_of(s, false));
  Graph& g = *impl_->graphs.at(key);
  const Blocks k_ = blocks_of(s, true, false, g);
  const std::int64_t rows = std::int64_t(s.b) * s.t, cols = std::int64_t(s.nh) * s.hs;
  std::array<void*, 8> c{};
  for (void*& p : c) p = scratch.alloc(std::size_t(k_.copy));
  void *q16 = c[0], *k16 = c[1], *v16 = c[2], *o16 = c[3], *do16 = c[4];
  void *dq16 = c[5], *dk16 = c[6], *dv16 = c[7];
  void* dsum = scratch.alloc(std::size_t(k_.dsum));
  void* acc = k_.acc ? scratch.alloc(std::size_t(k_.acc)) : nullptr;
  void* ws = scratch.alloc(std::size_t(std::max<std::int64_t>(k_.workspace, 1)));
  launch_to_bf16(stream_, q16, q, rows, cols, s.ld_q);
  launch_to_bf16(stream_, k16, k, rows, cols, s.ld_k);
  launch_to_bf16(stream_, v16, v, rows, cols, s.ld_v);
  launch_to_bf16(stream_, o16, out, rows, cols, s.ld_o);
  launch_to_bf16(stream_, do16, dout, rows, cols, s.ld_o);
  std::vector<std::int64_t> uids = {kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kDsum,
                                    kScale, kNegInf, kOne};
  std::vector<void*> ptrs = {q16, k16, v16, o16, do16, const_cast<float*>(lse), dq16, dk16,
                             dv16, dsum, &g.scale, &g.neg_inf, &g.one};
  if (acc) {
    // cuDNN zeroes the accumulator itself from 9.6 on (cudnn-frontend's memset stops there).
    if (impl_->api.version < 90600)
      TRIDENT_CUDA_CHECK(cudaMemsetAsync(acc, 0, std::size_t(k_.acc), stream_));
    uids.push_back(kDQAcc);
    ptrs.push_back(acc);
  }
  std::string error;
  if (!execute(impl_->api, impl_->handle, g, uids, ptrs, ws, error)) {
    impl_->graphs.erase(key);
    impl_->failures[key] = error;
    return refuse(error);
  }
  launch_from_bf16_rows(stream_, dq, s.ld_q, dq16, rows, cols, false);
  launch_from_bf16_rows(stream_, dk, s.ld_k, dk16, rows, cols, false);
  launch_from_bf16_rows(stream_, dv, s.ld_v, dv16, rows, cols, false);
  return true;
}

bool CudnnAttention::forward_bf16(BumpBlock& scratch, std::uint16_t* out, float* lse,
                                  const std::uint16_t* q, const std::uint16_t* k,
                                  const std::uint16_t* v, const Ops::AttentionShape& s) {
  const GraphKey key = graph_key(false, s, layout_of(s, true));
  Graph& g = *impl_->graphs.at(key);
  const Blocks k_ = blocks_of(s, false, true, g);
  void* ws = scratch.alloc(std::size_t(std::max<std::int64_t>(k_.workspace, 1)));
  std::string error;
  if (!execute(impl_->api, impl_->handle, g, {kQ, kK, kV, kO, kStats, kScale, kNegInf},
               {const_cast<std::uint16_t*>(q), const_cast<std::uint16_t*>(k),
                const_cast<std::uint16_t*>(v), out, lse, &g.scale, &g.neg_inf},
               ws, error)) {
    impl_->graphs.erase(key);
    impl_->failures[key] = error;
    return refuse(error);
  }
  return true;
}

bool CudnnAttention::backward_bf16(BumpBlock& scratch, std::uint16_t* dq, std::uint16_t* dk,
                                   std::uint16_t* dv, const std::uint16_t* dout,
                                   const std::uint16_t* out, const float* lse,
                                   const std::uint16_t* q, const std::uint16_t* k,
                                   const std::uint16_t* v, const Ops::AttentionShape& s) {
  const GraphKey key = graph_key(true, s, layout_of(s, true));
  Graph& g = *impl_->graphs.at(key);
  const Blocks k_ = blocks_of(s, true, true, g);
  void* dsum = scratch.alloc(std::size_t(k_.dsum));
  void* acc = k_.acc ? scratch.alloc(std::size_t(k_.acc)) : nullptr;
  void* ws = scratch.alloc(std::size_t(std::max<std::int64_t>(k_.workspace, 1)));
  const auto in = [](const std::uint16_t* p) {
    return static_cast<void*>(const_cast<std::uint16_t*>(p));
  };
  std::vector<std::int64_t> uids = {kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kDsum,
                                    kScale, kNegInf, kOne};
  std::vector<void*> ptrs = {in(q), in(k), in(v), in(out), in(dout), const_cast<float*>(lse),
                             dq, dk, dv, dsum, &g.scale, &g.neg_inf, &g.one};
  if (acc) {
    if (impl_->api.version < 90600)
      TRIDENT_CUDA_CHECK(cudaMemsetAsync(acc, 0, std::size_t(k_.acc), stream_));
    uids.push_back(kDQAcc);
    ptrs.push_back(acc);
  }
  std::string error;
  if (!execute(impl_->api, impl_->handle, g, uids, ptrs, ws, error)) {
    impl_->graphs.erase(key);
    impl_->failures[key] = error;
    return refuse(error);
  }
  return true;
}

std::string CudnnAttention::probe(int b, int t, int nh, int hs) {
  std::ostringstream out;
  Api api;
  const std::string why = api.load();
  if (!why.empty()) {
    out << "FAIL load: " << why << "\n";
    return out.str();
  }
  out << "ok   load: cuDNN " << api.version_string() << " from " << api.path << "\n";
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t st = api.Create(&handle);
  if (st != CUDNN_STATUS_SUCCESS) {
    handle = nullptr;
    out << "note cudnnCreate: " << api.status(st)
        << " (no GPU?): building without a handle, as far as that goes\n";
  } else {
    out << "ok   cudnnCreate\n";
  }
  // The forward, the backward trident uses (deterministic unless TRIDENT_CUDNN_DETERMINISTIC=0:
  // "ok   backward" is for that one), and the other backward, for the record.
  // Then the bf16-I/O entry points' graphs on GPT's fused qkv (q, k, v row stride 3 NH hs,
  // out NH hs; "ok   forward bf16 fused qkv", "ok   backward bf16 fused qkv").
  const bool deterministic = !env_equals("TRIDENT_CUDNN_DETERMINISTIC", "0");
  const std::int64_t c = std::int64_t(nh) * hs;
  for (int which = 0; which < 5; which++) {
    const bool backward = which == 1 || which == 2 || which == 4;
    const bool det = which == 2 ? !deterministic : deterministic, fused = which >= 3;
    const std::string name = std::string(!backward ? "forward" : which == 2 ? "other backward"
                                                                            : "backward") +
                             (fused ? " bf16 fused qkv" : "");
    const Layout ld = fused ? Layout{3 * c, 3 * c, 3 * c, c} : packed_layout(nh, hs);
    out << "---- " << name << (backward ? det ? " (deterministic)" : " (non-deterministic)" : "")
        << " b " << b << " t " << t << " nh " << nh << " hs " << hs << " row strides q "
        << ld.q << " k " << ld.k << " v " << ld.v << " o " << ld.o << "\n";
    Impl impl;
    impl.api = api;
    impl.handle = nullptr;  // the probe's own handle is destroyed below, not by impl
    impl.deterministic = det;
    std::unique_ptr<Graph> g = impl.build(backward, b, t, nh, hs, ld, handle, &out);
    if (g->error.empty() && g->plan) out << "ok   " << name << "\n";
    g.reset();
  }
  if (handle) api.Destroy(handle);
  return out.str();
}

#else  // no cuDNN headers at build time: never available

struct CudnnAttention::Impl {};

CudnnAttention::CudnnAttention(cudaStream_t stream) : stream_(stream) {}
CudnnAttention::~CudnnAttention() = default;

bool CudnnAttention::available() {
  if (!tried_) {
    tried_ = true;
    if (env_equals("TRIDENT_CUDNN", "0"))
      refuse("TRIDENT_CUDNN=0");
    else
      refuse("this build has no cuDNN headers");
  }
  return false;
}
std::string CudnnAttention::describe() const { return ""; }
std::int64_t CudnnAttention::prepare(const Ops::AttentionShape&, bool, bool) { return -1; }
bool CudnnAttention::forward_bf16(BumpBlock&, std::uint16_t*, float*, const std::uint16_t*,
                                  const std::uint16_t*, const std::uint16_t*,
                                  const Ops::AttentionShape&) {
  return false;
}
bool CudnnAttention::backward_bf16(BumpBlock&, std::uint16_t*, std::uint16_t*, std::uint16_t*,
                                   const std::uint16_t*, const std::uint16_t*, const float*,
                                   const std::uint16_t*, const std::uint16_t*,
                                   const std::uint16_t*, const Ops::AttentionShape&) {
  return false;
}
bool CudnnAttention::forward(BumpBlock&, float*, float*, const float*, const float*,
                             const float*, const Ops::AttentionShape&) {
  return false;
}
bool CudnnAttention::backward(BumpBlock&, float*, float*, float*, const float*, const float*,
                              const float*, const float*, const float*, const float*,
                              const Ops::AttentionShape&) {
  return false;
}
std::string CudnnAttention::probe(int, int, int, int) {
  return "FAIL build: trident was built without the cuDNN headers (cudnn_graph.h)\n";
}

#endif

// ---- CudaOps's entry points ------------------------------------------------------------

std::int64_t CudaOps::fused_attention_bytes(const AttentionShape& s, bool bf16_io) {
  if (!cudnn_ || CudnnAttention::decline(s) || !cudnn_->available()) return 0;
  return std::max<std::int64_t>(
      {0, cudnn_->prepare(s, false, bf16_io), cudnn_->prepare(s, true, bf16_io)});
}

bool CudaOps::attention_cudnn_forward(float* out, float* lse, const float* q, const float* k,
                                      const float* v, const AttentionShape& s) {
  if (!cudnn_ || CudnnAttention::decline(s) || !cudnn_->available()) return false;
  const std::int64_t bytes = cudnn_->prepare(s, false);
  if (bytes < 0) return false;
  OpScope timed(timer_.get(), "attention_forward cudnn");
  return cudnn_->forward(scratch(std::size_t(bytes)), out, lse, q, k, v, s);
}

bool CudaOps::attention_cudnn_backward(float* dq, float* dk, float* dv, const float* dout,
                                       const float* out, const float* lse, const float* q,
                                       const float* k, const float* v, const AttentionShape& s) {
  if (!cudnn_ || CudnnAttention::decline(s) || !cudnn_->available()) return false;
  const std::int64_t bytes = cudnn_->prepare(s, true);
  if (bytes < 0) return false;
  OpScope timed(timer_.get(), "attention_backward cudnn");
  return cudnn_->backward(scratch(std::size_t(bytes)), dq, dk, dv, dout, out, lse, q, k, v, s);
}

}  // namespace trident::ops::cuda
