// An op-level estimate of a GPT-2 training step on one GPU through trident's CUDA backend
// (the Ops interface exactly as a model would call it, device buffers, one stream): one
// transformer block forward+backward, the tied LM head with the three-pass cross-entropy,
// embeddings, the gradient norm and AdamW, each timed with CUDA events (median of the
// repetitions), then step = L * block + the rest. No communication, no data loading: a
// ceiling for what the model code can reach once its buffers live on the device.
// Usage: trident_bench_cuda_step [repetitions (5)] [precisions (fp32,tf32,bf16)] — one JSON
// object per (model, precision) line:
//   {"model", "precision", "block_ms", "head_ms", "embed_ms", "optim_ms", "step_ms_est",
//    "tokens_per_s_est", "model_tflops_est"}
// model_tflops_est counts 6 * params + 12 * L * C * T FLOPs per token (llm.c's count:
// forward + backward matrix products, attention included).
// defines: main
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/ops/cuda.hpp"
#include "trident/ops/ops.hpp"

namespace {

using trident::ops::Ops;
using trident::ops::Precision;

struct Model {
  const char* name;
  int layers, c, nh;
};
constexpr int kB = 8, kT = 1024, kV = 50257, kVp = 50304;  // 8192 tokens, padded vocabulary

// Device buffers, each a Buffer of the backend's one arena (ops.memory()), freed together at
// the end of a model's run.
class Pool {
 public:
  explicit Pool(Ops& ops) : ops_(ops) {}
  float* zeros(std::size_t n) {
    float* p = floats_.emplace_back(n, ops_.memory()).data();
    ops_.fill(p, 0.0f, static_cast<std::int64_t>(n));
    return p;
  }
  // uniform with standard deviation sd, from a cheap LCG (tens of millions of values)
  float* random(std::size_t n, float sd) {
    std::vector<float> h(n);
    for (float& x : h) {
      lcg_ = lcg_ * 6364136223846793005ull + 1442695040888963407ull;
      const float u = static_cast<float>(lcg_ >> 40) / float(1 << 24);  // [0, 1)
      x = (2.0f * u - 1.0f) * 1.7320508f * sd;
    }
    float* p = floats_.emplace_back(n, ops_.memory()).data();
    ops_.memory()->to_device(p, h.data(), n * sizeof(float));
    return p;
  }
  std::int32_t* tokens(std::size_t n, int vocab) {
    std::vector<std::int32_t> h(n);
    std::uniform_int_distribution<int> d(0, vocab - 1);
    for (auto& t : h) t = d(gen_);
    std::int32_t* p = ints_.emplace_back(n, ops_.memory()).data();
    ops_.memory()->to_device(p, h.data(), n * sizeof(std::int32_t));
    return p;
  }

 private:
  Ops& ops_;
  std::mt19937 gen_{7};
  std::uint64_t lcg_ = 7;
  std::vector<trident::FloatBuffer> floats_;
  std::vector<trident::IntBuffer> ints_;
};

double median_ms(Ops& ops, int reps, const std::function<void()>& f) {
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  f();  // warm-up: cuBLAS heuristics, the scratch arena's first growth
  trident::ops::cuda_synchronize(ops);
  std::vector<double> ms;
  for (int i = 0; i < reps; i++) {
    // the ops run on the backend's blocking stream; events on the legacy default stream
    // are ordered with it
    cudaEventRecord(t0, nullptr);
    f();
    cudaEventRecord(t1, nullptr);
    cudaEventSynchronize(t1);
    float e = 0.0f;
    cudaEventElapsedTime(&e, t0, t1);
    ms.push_back(e);
  }
  trident::ops::cuda_synchronize(ops);  // surfaces a kernel fault as an Error
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void run_model(const Model& md, Precision precision, int reps) {
  auto ops_ptr = trident::ops::make_cuda_ops(precision);
  Ops& o = *ops_ptr;
  Pool pool(o);
  const int C = md.c, NH = md.nh, N = kB * kT;
  const std::size_t nc = std::size_t(N) * C, att_n = std::size_t(kB) * NH * kT;  // flash: lse [B,NH,T]
  // one block's parameters and gradients
  float *w_qkv = pool.random(std::size_t(C) * 3 * C, 0.02f), *b_qkv = pool.zeros(3 * C);
  float *w_proj = pool.random(std::size_t(C) * C, 0.02f), *b_proj = pool.zeros(C);
  float *w_fc = pool.random(std::size_t(C) * 4 * C, 0.02f), *b_fc = pool.zeros(4 * C);
  float *w_fp = pool.random(std::size_t(4) * C * C, 0.02f), *b_fp = pool.zeros(C);
  float *ln1w = pool.random(C, 1.0f), *ln1b = pool.zeros(C), *ln2w = pool.random(C, 1.0f),
        *ln2b = pool.zeros(C);
  float *dw_qkv = pool.zeros(std::size_t(C) * 3 * C), *db_qkv = pool.zeros(3 * C);
  float *dw_proj = pool.zeros(std::size_t(C) * C), *db_proj = pool.zeros(C);
  float *dw_fc = pool.zeros(std::size_t(C) * 4 * C), *db_fc = pool.zeros(4 * C);
  float *dw_fp = pool.zeros(std::size_t(4) * C * C), *db_fp = pool.zeros(C);
  float *dln1w = pool.zeros(C), *dln1b = pool.zeros(C), *dln2w = pool.zeros(C),
        *dln2b = pool.zeros(C);
  // one block's activations and their gradients
  float *x = pool.random(nc, 1.0f), *ln1 = pool.zeros(nc), *m1 = pool.zeros(N), *r1 = pool.zeros(N);
  float *qkv = pool.zeros(3 * nc), *atty = pool.zeros(nc), *att = pool.zeros(att_n);
  float *res2 = pool.zeros(nc), *ln2 = pool.zeros(nc), *m2 = pool.zeros(N), *r2 = pool.zeros(N);
  float *fch = pool.zeros(4 * nc), *fcg = pool.zeros(4 * nc), *res3 = pool.zeros(nc);
  float *dres3 = pool.random(nc, 1e-3f), *dfcg = pool.zeros(4 * nc), *dfch = pool.zeros(4 * nc);
  float *dln2 = pool.zeros(nc), *dres2 = pool.zeros(nc), *datty = pool.zeros(nc);
  float *dqkv = pool.zeros(3 * nc), *dln1 = pool.zeros(nc),
        *dx = pool.zeros(nc);

  const double block_ms = median_ms(o, reps, [&] {
    o.layernorm_forward(ln1, m1, r1, x, ln1w, ln1b, N, C);
    o.linear_forward(qkv, ln1, w_qkv, b_qkv, N, C, 3 * C);
    const Ops::AttentionShape ash = trident::ops::attention_shape_qkv(kB, kT, C, NH);
    o.attention_forward(atty, att, qkv, qkv + C, qkv + 2 * C, ash);  // att: the [B,NH,T] lse
    o.linear_forward(res2, atty, w_proj, b_proj, N, C, C);
    o.add(res2, res2, x, static_cast<std::int64_t>(nc));
    o.layernorm_forward(ln2, m2, r2, res2, ln2w, ln2b, N, C);
    o.linear_forward(fch, ln2, w_fc, b_fc, N, C, 4 * C);
    o.gelu_forward(fcg, fch, static_cast<std::int64_t>(4 * nc));
    o.linear_forward(res3, fcg, w_fp, b_fp, N, 4 * C, C);
    o.add(res3, res3, res2, static_cast<std::int64_t>(nc));
    // backward
    o.copy(dres2, dres3, static_cast<std::int64_t>(nc));
    o.linear_backward(dfcg, dw_fp, db_fp, dres3, fcg, w_fp, N, 4 * C, C);
    o.gelu_backward(dfch, fch, dfcg, static_cast<std::int64_t>(4 * nc));
    o.linear_backward(dln2, dw_fc, db_fc, dfch, ln2, w_fc, N, C, 4 * C);
    o.layernorm_backward(dres2, dln2w, dln2b, dln2, res2, ln2w, m2, r2, N, C);
    o.copy(dx, dres2, static_cast<std::int64_t>(nc));
    o.linear_backward(datty, dw_proj, db_proj, dres2, atty, w_proj, N, C, C);
    o.attention_backward(dqkv, dqkv + C, dqkv + 2 * C, datty, atty, att, qkv, qkv + C, qkv + 2 * C,
                         trident::ops::attention_shape_qkv(kB, kT, C, NH));
    o.linear_backward(dln1, dw_qkv, db_qkv, dqkv, ln1, w_qkv, N, C, 3 * C);
    o.layernorm_backward(dx, dln1w, dln1b, dln1, x, ln1w, m1, r1, N, C);
  });

  // tied head: logits = lnf @ wte^T, three-pass cross-entropy, backward into dlnf and dwte
  float *wte = pool.random(std::size_t(kVp) * C, 0.02f), *dwte = pool.zeros(std::size_t(kVp) * C);
  float *wpe = pool.random(std::size_t(kT) * C, 0.01f), *dwpe = pool.zeros(std::size_t(kT) * C);
  float *lnfw = pool.random(C, 1.0f), *lnfb = pool.zeros(C), *dlnfw = pool.zeros(C),
        *dlnfb = pool.zeros(C);
  float *lnf = pool.zeros(nc), *mf = pool.zeros(N), *rf = pool.zeros(N), *dlnf = pool.zeros(nc);
  float* logits = pool.zeros(std::size_t(N) * kVp);
  float *row_max = pool.zeros(N), *sumexp = pool.zeros(N), *tl = pool.zeros(N), *loss = pool.zeros(N);
  std::int32_t* targets = pool.tokens(N, kV);
  std::int32_t* tokens = pool.tokens(N, kV);
  const double head_ms = median_ms(o, reps, [&] {
    o.layernorm_forward(lnf, mf, rf, res3, lnfw, lnfb, N, C);
    o.gemm(false, true, N, kVp, C, 1.0f, lnf, C, wte, C, 0.0f, logits, kVp);
    o.xent_row_max(row_max, logits, N, kVp, kV);
    o.xent_sumexp(sumexp, tl, logits, row_max, targets, N, kVp, kV, 0);
    o.xent_loss(loss, row_max, sumexp, tl, N);
    o.xent_backward(logits, row_max, sumexp, targets, N, kVp, kV, 0, 1.0f / float(N));
    o.gemm(false, false, N, C, kVp, 1.0f, logits, kVp, wte, C, 0.0f, dlnf, C);
    o.gemm(true, false, kVp, C, N, 1.0f, logits, kVp, lnf, C, 1.0f, dwte, C);
    o.layernorm_backward(dres3, dlnfw, dlnfb, dlnf, res3, lnfw, mf, rf, N, C);
  });
  const double embed_ms = median_ms(o, reps, [&] {
    o.embedding_forward(x, tokens, wte, N, C, 0, kVp);
    o.position_forward(x, wpe, kB, kT, C);
    o.embedding_backward(dwte, dx, tokens, N, C, 0, kVp);
    o.position_backward(dwpe, dx, kB, kT, C);
  });
  // every parameter once: grad norm (sum of squares) and AdamW over one flat buffer
  const std::size_t params = std::size_t(md.layers) * (12 * std::size_t(C) * C + 13 * std::size_t(C)) +
                             std::size_t(kVp) * C + std::size_t(kT) * C + 2 * std::size_t(C);
  // (values do not change the time of these memory-bound kernels)
  float *p = pool.zeros(params), *g = pool.zeros(params), *m = pool.zeros(params),
        *v = pool.zeros(params);
  o.fill(g, 1e-3f, static_cast<std::int64_t>(params));
  const double optim_ms = median_ms(o, reps, [&] {
    volatile double norm = o.sum_squares(g, static_cast<std::int64_t>(params));
    (void)norm;
    o.adamw(p, g, m, v, static_cast<std::int64_t>(params), 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f,
            0.05f);
  });
  const double step_ms = md.layers * block_ms + head_ms + embed_ms + optim_ms;
  const double tokens_per_s = N / (step_ms * 1e-3);
  const double flops_per_token = 6.0 * double(params) + 12.0 * md.layers * C * double(kT);
  std::printf("{\"model\": \"%s\", \"precision\": \"%s\", \"B\": %d, \"T\": %d, \"params\": %zu, "
              "\"block_ms\": %.3f, \"head_ms\": %.3f, \"embed_ms\": %.3f, \"optim_ms\": %.3f, "
              "\"step_ms_est\": %.2f, \"tokens_per_s_est\": %.0f, \"model_tflops_est\": %.1f}\n",
              md.name, trident::ops::precision_name(precision), kB, kT, params, block_ms, head_ms,
              embed_ms, optim_ms, step_ms, tokens_per_s, flops_per_token * tokens_per_s / 1e12);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
    const std::string list = argc > 2 ? argv[2] : "fp32,tf32,bf16";
    if (reps < 1) {
      std::fprintf(stderr, "usage: %s [repetitions >= 1] [precisions, e.g. tf32,bf16]\n", argv[0]);
      return 2;
    }
    std::vector<Precision> precisions;
    std::stringstream ss(list);
    for (std::string word; std::getline(ss, word, ',');)
      precisions.push_back(trident::ops::parse_precision(word));
    const Model models[] = {{"gpt2-small", 12, 768, 12}, {"gpt2-medium", 24, 1024, 16}};
    for (const Model& md : models)
      for (Precision p : precisions) run_model(md, p, reps);
  } catch (const trident::Error& e) {
    std::fprintf(stderr, "cuda step bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
