// `trident sample` (text from a model) and `trident export` (a checkpoint's weights as a
// weights file). prepare-data: cmd_prepare.cpp.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "commands.hpp"
#include "trident/core/log.hpp"
#include "trident/core/rng.hpp"
#include "trident/io/checkpoint.hpp"
#include "trident/io/dataset.hpp"
#include "trident/io/tokenizer.hpp"
#include "trident/io/weights.hpp"
#include "trident/model/gpt.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/parallel/process.hpp"
#include "trident/train/data_loader.hpp"

namespace trident::app {

int run_sample(const std::string& checkpoint, const std::string& prompt, int tokens,
               double temperature, int top_k, std::uint64_t seed,
               const std::string& tokenizer_data) {
  model::ModelConfig cfg;
  std::unique_ptr<io::Tokenizer> tok;
  parallel::agree([&] {
    const int world = parallel::world_size();
    TRIDENT_CHECK(world == 1, "sample runs on one process (not under mpirun -np ", world, ")");
    cfg = io::read_model_config(checkpoint);
    // The tokenizer lives in the training dataset (by default the one the checkpoint's
    // deck trained on).
    std::string data = tokenizer_data;
    if (data.empty()) {
      const train::Config deck =
          train::parse_config(io::read_checkpoint_state(checkpoint).config, checkpoint,
                              {}, true);  // its data.train only
      TRIDENT_CHECK(!deck.data.train.empty(), checkpoint,
                    ": its deck names no data.train; pass --data");
      data = train::first_token_file(deck.data.train, "data.train");
    }
    tok = std::make_unique<io::Tokenizer>(io::load_tokenizer(data));
  });
  parallel::ParallelState ps = parallel::make_parallel_state(parallel::GridShape{});
  auto ops = ops::make_cpu_ops(int(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))));
  model::GptChunk chunk(cfg, model::StageLayout{0, cfg.n_layer, true, true}, ps, *ops, 1);
  io::read_weights(checkpoint, MPI_COMM_NULL, cfg, chunk.specs(), chunk.params());

  // No prompt: GPT-2 starts from <|endoftext|> (a document's start), the others from a line.
  std::vector<std::int32_t> ids =
      prompt.empty() && tok->end_of_text() >= 0 ? std::vector<std::int32_t>{tok->end_of_text()}
                                                : tok->encode(prompt.empty() ? "\n" : prompt);
  // A model's vocabulary may be padded past the tokenizer's (for TP): never sample padding.
  const int vocab = std::min(cfg.vocab_size, tok->vocab_size());
  std::vector<float> logits(std::size_t(cfg.vocab_size));
  std::vector<int> order(std::size_t(cfg.vocab_size));
  const std::uint64_t stream = rng::key_of("sample");
  // The key-value cache holds seq_len positions: (re)fill it with the last `keep` tokens of
  // the text, one step each; when it is full, slide by half the window. Each generated token
  // is then one step of one token, and the refills add about one more per token.
  auto refill = [&](std::size_t keep) {
    keep = std::min(keep, ids.size());
    chunk.generation_reset();
    for (std::size_t i = ids.size() - keep; i < ids.size(); ++i)
      chunk.generation_step(ids[i], logits.data());
  };
  refill(std::size_t(cfg.seq_len));
  // Tokens are printed as they come (issue 32): the text of ids[window..] is decoded again
  // after each token and its new tail printed. The window restarts every 512 tokens one token
  // back, so that a SentencePiece piece's leading space is decoded as in the whole text.
  std::size_t window = 0, shown = 0;  // shown: bytes of decode(ids[window..]) already out
  {
    const std::string head = tok->decode(ids);
    if (!prompt.empty()) std::fputs(head.c_str(), stdout);
    shown = head.size();
    std::fflush(stdout);
  }
  auto show_new = [&] {
    if (ids.size() - window > 512) {
      window = ids.size() - 2;
      shown = tok->decode({ids[window]}).size();
    }
    const std::string text = tok->decode({ids.begin() + long(window), ids.end()});
    if (text.size() > shown) std::fwrite(text.data() + shown, 1, text.size() - shown, stdout);
    shown = std::max(shown, text.size());
    std::fflush(stdout);
  };
  for (int n = 0; n < tokens; ++n) {
    int next = int(std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin());
    if (temperature > 0) {
      std::iota(order.begin(), order.begin() + vocab, 0);
      const int k = top_k > 0 ? std::min(top_k, vocab) : vocab;
      std::partial_sort(order.begin(), order.begin() + k, order.begin() + vocab,
                        [&](int a, int b) { return logits[a] > logits[b]; });
      std::vector<double> p(static_cast<std::size_t>(k));
      double total = 0;
      for (int i = 0; i < k; ++i)
        total += p[i] = std::exp((logits[order[i]] - logits[order[0]]) / temperature);
      double u = rng::uniform01(seed, stream, std::uint64_t(n)) * total;
      next = order[k - 1];
      for (int i = 0; i < k; ++i)
        if ((u -= p[i]) <= 0) {
          next = order[i];
          break;
        }
    }
    ids.push_back(next);
    show_new();
    if (n + 1 == tokens) break;
    if (chunk.generation_position() == cfg.seq_len)
      refill(std::size_t(cfg.seq_len) / 2 + 1);
    else
      chunk.generation_step(next, logits.data());
  }
  std::fputc('\n', stdout);
  return 0;
}

int run_export(const std::string& checkpoint, const std::string& out) {
  model::ModelConfig cfg;
  parallel::agree([&] {
    const int world = parallel::world_size();
    TRIDENT_CHECK(world == 1, "export runs on one process (not under mpirun -np ", world, ")");
    refuse_output_over_input("--out", out, "--checkpoint", checkpoint);
    io::read_checkpoint_state(checkpoint);  // a checkpoint, not some other HDF5 file
    cfg = io::read_model_config(checkpoint);
  });
  // The whole model in one flat buffer: the logical tensors, whatever layout wrote them.
  model::StageLayout whole;
  whole.first_layer = 0;
  whole.last_layer = cfg.n_layer;
  const auto specs = model::gpt_param_specs(cfg, whole, 0, 1);
  std::int64_t n = 0;
  for (const auto& s : specs) n = std::max(n, s.offset + s.local_numel());
  FloatBuffer flat(static_cast<std::size_t>(n));
  io::read_weights(checkpoint, MPI_COMM_NULL, cfg, specs, flat.data());
  io::write_weights(out, MPI_COMM_NULL, cfg, specs, flat.data());
  log::info("wrote ", out, ": ", n, " parameters of ", checkpoint);
  return 0;
}

}  // namespace trident::app
