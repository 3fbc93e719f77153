// Unit tests of the input deck (trident/train/config.hpp): FORMAT.md's defaults, the TOML
// round trip, --set overrides, world resolution, and every error (one line, naming the file
// and the key).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/train/config.hpp"

namespace trident::train {
namespace {

// FORMAT.md's deck, verbatim: every key at its default.
const char* kFormatDeck = R"(
[model]
vocab_size = 0          # 0: take it from the token dataset
seq_len = 128
n_layer = 4
n_head = 4
d_model = 256

[parallel]
tp = 1
pp = 1
dp = 0                  # 0: world size / (tp * cp * pp)
cp = 1                  # context parallelism: ranks per sequence (grid only so far)
cp_mode = "ring"        # ring | ulysses (all-to-all over heads)
vpp = 1                 # model chunks per pipeline rank (interleaved schedules)
schedule = "1f1b"       # naive | gpipe | 1f1b | interleaved-1f1b | looped-bfs | zb-h1
micro_batch_size = 4
sequence_parallel = false
tp_mode = "1d"          # 1d (Megatron) | 2d (SUMMA on a q x q grid, tp = q*q: refused until wired)
zero_stage = 0          # 0 | 1 (1: Adam moments sharded over dp, Megatron's distributed optimizer)
grad_bucket_mb = 25.0   # MiB per DP gradient bucket, reduced during the last backward
recompute = "none"      # none | selective | full
layout = "deck"         # deck: the keys above | auto: the fastest layout that fits the job's
                        # ranks, chosen at start-up by the planner (no layout key above set)
machine = ""            # layout = "auto": machine file (""; calibrated, cached in out_dir)

[train]
steps = 200
global_batch_size = 32  # sequences per optimizer step; microbatches per DP rank =
                        # global_batch_size / (micro_batch_size * dp)
lr = 3e-4
min_lr = 3e-5
warmup_steps = 20       # linear warm-up, then cosine decay to min_lr at `steps`
weight_decay = 0.1      # AdamW, decoupled; applied to 2-D weights (wte, wpe, linears),
                        # not to biases or LayerNorm parameters
beta1 = 0.9
beta2 = 0.95
eps = 1e-8
grad_clip = 1.0         # global L2 norm over all parameters; 0 disables
seed = 1234
eval_every = 0
eval_batches = 4

[data]
train = ""              # token dataset (HDF5)
valid = ""

[io]
out_dir = "output/run"
checkpoint_every = 0    # steps; 0: only at the end
final_checkpoint = true # false: none at the last step (a trial run measuring memory or
                        # speed); checkpoint_every's and a stop signal's still written
keep_checkpoints = 2
resume = "auto"         # auto | none | path to a checkpoint
init_weights = ""       # weights file to start from
trace_step = 0          # write the pipeline trace of this optimizer step; 0: off

[runtime]
device = "cpu"          # cpu | cuda
precision = "fp32"      # fp32 | tf32 | bf16 (cuda)
threads = 0             # 0: cores / ranks on this node
watchdog_s = 0.0        # abort when a pipeline wait exceeds this; 0: off
)";

// The message of the Error that parsing `text` with `overrides` throws ("" if none).
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "deck.toml", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Expects an error whose one line names deck.toml and contains every needle.
void expect_error(const std::string& text, const std::vector<std::string>& overrides,
                  const std::vector<std::string>& needles) {
  const std::string msg = error_of(text, overrides);
  ASSERT_FALSE(msg.empty()) << "no error for deck:\n" << text;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  EXPECT_NE(msg.find("deck.toml"), std::string::npos) << "no file name in: " << msg;
  for (const std::string& n : needles)
    EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
}
void expect_error(const std::string& text, const std::vector<std::string>& needles) {
  expect_error(text, {}, needles);
}

TEST(Config, DefaultsAreFormatMd) {
  const Config c = parse_config("", "empty.toml");
  EXPECT_EQ(c.model.vocab_size, 0);
  EXPECT_EQ(c.model.seq_len, 128);
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.d_model, 256);
  EXPECT_EQ(c.parallel.tp, 1);
  EXPECT_EQ(c.parallel.pp, 1);
  EXPECT_EQ(c.parallel.dp, 0);
  EXPECT_EQ(c.parallel.cp, 1);
  EXPECT_EQ(c.parallel.cp_mode, "ring");
  EXPECT_EQ(c.parallel.vpp, 1);
  EXPECT_EQ(c.parallel.schedule, "1f1b");
  EXPECT_EQ(c.parallel.micro_batch_size, 4);
  EXPECT_FALSE(c.parallel.sequence_parallel);
  EXPECT_EQ(c.parallel.zero_stage, 0);
  EXPECT_EQ(c.parallel.recompute, "none");
  EXPECT_EQ(c.train.steps, 200);
  EXPECT_EQ(c.train.global_batch_size, 32);
  EXPECT_EQ(c.train.lr, 3e-4);
  EXPECT_EQ(c.train.min_lr, 3e-5);
  EXPECT_EQ(c.train.warmup_steps, 20);
  EXPECT_EQ(c.train.weight_decay, 0.1);
  EXPECT_EQ(c.train.beta1, 0.9);
  EXPECT_EQ(c.train.beta2, 0.95);
  EXPECT_EQ(c.train.eps, 1e-8);
  EXPECT_EQ(c.train.grad_clip, 1.0);
  EXPECT_EQ(c.train.seed, 1234);
  EXPECT_EQ(c.train.eval_every, 0);
  EXPECT_EQ(c.train.eval_batches, 4);
  EXPECT_EQ(c.data.train, "");
  EXPECT_EQ(c.data.valid, "");
  EXPECT_EQ(c.io.out_dir, "output/run");
  EXPECT_EQ(c.io.checkpoint_every, 0);
  EXPECT_TRUE(c.io.final_checkpoint);
  EXPECT_EQ(c.io.keep_checkpoints, 2);
  EXPECT_EQ(c.io.resume, "auto");
  EXPECT_EQ(c.io.init_weights, "");
  EXPECT_EQ(c.runtime.device, "cpu");
  EXPECT_EQ(c.runtime.precision, "fp32");
  EXPECT_EQ(c.runtime.threads, 0);
  EXPECT_EQ(c.source, "empty.toml");
  EXPECT_TRUE(c == Config{});
}

TEST(Config, FormatMdDeckParsesToTheDefaults) {
  EXPECT_TRUE(parse_config(kFormatDeck, "format.toml") == Config{});
}

TEST(Config, ToTomlHasEveryKeyInFormatOrder) {
  const std::string text = to_toml(Config{});
  // Every key of FORMAT.md's deck, in its order, each exactly once.
  const std::vector<std::string> lines = {
      "[model]", "vocab_size = 0", "seq_len = 128", "n_layer = 4", "n_head = 4",
      "d_model = 256", "[parallel]", "tp = 1", "pp = 1", "dp = 0", "cp = 1",
      "cp_mode = \"ring\"", "vpp = 1",
      "schedule = \"1f1b\"", "pipeline_layers = \"even\"", "micro_batch_size = 4", "sequence_parallel = false", "tp_mode = \"1d\"",
      "zero_stage = 0", "grad_bucket_mb = 25.0", "recompute = \"none\"", "layout = \"deck\"", "machine = \"\"", "[train]", "steps = 200",
      "global_batch_size = 32", "lr = 0.0003", "min_lr = 3e-05", "warmup_steps = 20",
      "weight_decay = 0.1", "beta1 = 0.9", "beta2 = 0.95", "eps = 1e-08", "grad_clip = 1.0",
      "seed = 1234", "eval_every = 0", "eval_batches = 4", "on_nonfinite = \"abort\"", "[data]", "train = \"\"",
      "valid = \"\"", "[io]", "out_dir = \"output/run\"", "checkpoint_every = 0",
      "final_checkpoint = true", "keep_checkpoints = 2", "resume = \"auto\"", "overwrite = false", "init_weights = \"\"", "trace_step = 0",
      "[runtime]", "device = \"cpu\"", "precision = \"fp32\"", "threads = 0",
      "watchdog_s = 0.0", "cuda_graphs = false"};
  std::size_t pos = 0;
  for (const std::string& l : lines) {
    const std::size_t at = text.find("\n" + l + "\n", pos);
    ASSERT_NE(at, std::string::npos) << "'" << l << "' missing or out of order in:\n" << text;
    pos = at + 1;
  }
  std::size_t assignments = 0;
  for (std::size_t i = 0; (i = text.find(" = ", i)) != std::string::npos; ++i) ++assignments;
  EXPECT_EQ(assignments, 50u);
}

// parallel.pipeline_layers: "even" by default, "auto", or a list that prints and parses back;
// the resolved split: empty (even) where n_layer divides, balanced where it does not.
TEST(Config, PipelineLayers) {
  Config c = parse_config("[model]\nvocab_size = 64\nn_layer = 7\n[parallel]\npp = 2\nvpp = 2\n"
                          "schedule = \"interleaved-1f1b\"\npipeline_layers = [3, 1, 1, 2]\n"
                          "[train]\nglobal_batch_size = 8\n",
                          "uneven.toml");
  EXPECT_EQ(c.parallel.pipeline_layers, "[3, 1, 1, 2]");
  EXPECT_EQ(pipeline_stage_layers(c), (std::vector<int>{3, 1, 1, 2}));
  const std::string text = to_toml(c);
  EXPECT_NE(text.find("pipeline_layers = [3, 1, 1, 2]\n"), std::string::npos) << text;
  EXPECT_EQ(parse_config(text, "again.toml"), c);
  Config d = parse_config("[model]\nvocab_size = 64\nn_layer = 8\n[parallel]\npp = 2\n",
                          "even.toml", {"parallel.pipeline_layers=[5,3]"});
  EXPECT_EQ(pipeline_stage_layers(d), (std::vector<int>{5, 3}));
  d.parallel.pipeline_layers = "even";
  EXPECT_TRUE(pipeline_stage_layers(d).empty()) << "8 layers at pp 2: today's even split";
  d.model.n_layer = 7;
  EXPECT_EQ(pipeline_stage_layers(d).size(), 2u) << "7 layers at pp 2: the balanced split";
  EXPECT_NE(to_toml(Config{}).find("pipeline_layers = \"even\"\n"), std::string::npos);
  EXPECT_THROW(parse_config("[parallel]\npp = 2\npipeline_layers = [1, 2]\n", "bad.toml"),
               trident::Error);  // 3 layers, the deck has 4
}

// model.arch = "llama": its keys print (after d_model, resolved as written), parse back, and
// are refused in a GPT-2 deck; the TP rule for kv heads and the even head size.
TEST(Config, LlamaKeys) {
  Config c = parse_config("[model]\narch = \"llama\"\nn_head = 8\nn_kv_head = 2\n"
                          "ffn_hidden = 100\nrope_theta = 500000.0\ntie_embeddings = true\n",
                          "llama.toml");
  EXPECT_TRUE(c.model.llama());
  EXPECT_EQ(c.model.kv_heads(), 2);
  EXPECT_EQ(c.model.d_ff(), 100);
  const std::string text = to_toml(c);
  EXPECT_NE(text.find("d_model = 256\narch = \"llama\"\nn_kv_head = 2\nffn_hidden = 100\n"
                      "ffn_multiple_of = 256\nrope_theta = 5e+05\nnorm_eps = 1e-05\n"
                      "tie_embeddings = true\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(parse_config(text, "again.toml"), c);
  EXPECT_EQ(to_toml(Config{}).find("arch"), std::string::npos) << "a GPT-2 deck prints as before";
  // Llama's MLP rule: 2/3 * 4 d rounded up to ffn_multiple_of; n_kv_head 0 is n_head
  Config d = parse_config("[model]\narch = \"llama\"\nd_model = 4096\nn_head = 32\n", "d.toml");
  EXPECT_EQ(d.model.d_ff(), 11008);
  EXPECT_EQ(d.model.kv_heads(), 32);
  EXPECT_EQ(model::llama_ffn_hidden(768, 64), 2048);
  auto error_of = [](const std::string& deck) {
    try {
      parse_config(deck, "bad.toml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("[model]\nn_kv_head = 2\n").find("bad.toml:2:1: model.n_kv_head is a key of "
                                                      "model.arch = \"llama\""),
            std::string::npos);
  EXPECT_NE(error_of("[model]\narch = \"mamba\"\n").find("model.arch: expected gpt2 or llama"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\narch = \"llama\"\nn_head = 4\nn_kv_head = 3\n")
                .find("model.n_kv_head = 3 does not divide model.n_head = 4"),
            std::string::npos);
  EXPECT_EQ(error_of("[model]\narch = \"llama\"\nn_head = 8\nn_kv_head = 2\n[parallel]\ntp = 8\n"),
            "no error") << "tp 8 over 2 kv heads: each replicated on 4 ranks";
  EXPECT_NE(error_of("[model]\narch = \"llama\"\nn_head = 12\nd_model = 240\nn_kv_head = 6\n"
                     "[parallel]\ntp = 4\n").find("one must divide the other"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\narch = \"llama\"\nn_head = 4\nd_model = 12\n")
                .find("even head size"),
            std::string::npos);
}

TEST(Config, RoundTripThroughToToml) {
  Config c;
  c.model = {50257, 64, 6, 6, 384};
  c.parallel.tp = 2;
  c.parallel.pp = 3;
  c.parallel.dp = 5;
  c.parallel.vpp = 2;
  c.parallel.schedule = "interleaved-1f1b";
  c.parallel.micro_batch_size = 3;
  c.parallel.sequence_parallel = true;
  c.parallel.zero_stage = 1;
  c.parallel.grad_bucket_mb = 0.1 + 0.2;
  c.parallel.recompute = "full";
  c.train.steps = 1000;
  c.train.global_batch_size = 90;
  c.train.lr = 0.5;
  c.train.min_lr = 1.0 / 3.0;
  c.train.warmup_steps = 0;
  c.train.weight_decay = 0.0;
  c.train.beta1 = 0.1 + 0.2;  // 0.30000000000000004: needs all 17 digits
  c.train.beta2 = 0.999;
  c.train.eps = 1e-300;
  c.train.grad_clip = 0.0;
  c.train.seed = 9007199254740993;  // beyond double precision: an integer must stay one
  c.train.eval_every = 50;
  c.train.eval_batches = 7;
  c.train.on_nonfinite = "skip";
  c.data.train = "input/with \"quotes\" and \\back\\slashes\t.h5";
  c.data.valid = "input/valid.h5";
  c.io.out_dir = "output/ünïcode";
  c.io.checkpoint_every = 25;
  c.io.final_checkpoint = false;
  c.io.keep_checkpoints = 0;
  c.io.resume = "output/run/checkpoints/step-00000100.h5";
  c.io.init_weights = "w.h5";
  c.runtime.device = "cuda";
  c.runtime.precision = "bf16";
  c.runtime.threads = 3;

  const std::string text = to_toml(c);
  const Config back = parse_config(text, "roundtrip.toml");
  EXPECT_TRUE(back == c) << text;
  EXPECT_EQ(back.train.beta1, 0.1 + 0.2);
  EXPECT_EQ(back.train.seed, 9007199254740993);
  EXPECT_EQ(back.data.train, c.data.train);
  EXPECT_EQ(to_toml(back), text);  // stable
  // The defaults too.
  EXPECT_TRUE(parse_config(to_toml(Config{}), "d.toml") == Config{});
}

TEST(Config, EqualityLooksAtEveryKeyButNotTheSource) {
  Config a, b;
  b.source = "elsewhere.toml";
  EXPECT_TRUE(a == b);
  b.runtime.threads = 1;
  EXPECT_TRUE(a != b);
  b = a;
  b.parallel.sequence_parallel = true;
  EXPECT_TRUE(a != b);
  b = a;
  b.parallel.tp_mode = "2d";
  EXPECT_TRUE(a != b);
  b = a;
  b.train.eval_batches = 5;
  EXPECT_TRUE(a != b);
  b = a;
  b.io.init_weights = "x";
  EXPECT_TRUE(a != b);
}

TEST(Config, PartialDeckKeepsOtherDefaults) {
  const Config c = parse_config("[model]\nn_layer = 8\n[train]\nlr = 1\n", "deck.toml");
  EXPECT_EQ(c.model.n_layer, 8);
  EXPECT_EQ(c.train.lr, 1.0);  // an integer is fine for a float key
  EXPECT_EQ(c.model.d_model, 256);
  EXPECT_EQ(c.train.min_lr, 3e-5);
  // Dotted keys and inline tables are ordinary TOML.
  const Config d = parse_config("model.n_layer = 2\nparallel = { tp = 2 }\n", "deck.toml");
  EXPECT_EQ(d.model.n_layer, 2);
  EXPECT_EQ(d.parallel.tp, 2);
}

TEST(Config, Overrides) {
  const std::string deck = "[train]\nlr = 1e-2\n[io]\nresume = \"auto\"\n";
  const Config c = parse_config(deck, "deck.toml",
                                {"train.lr=1e-3", "parallel.sequence_parallel=true",
                                 "io.resume=\"none\"", "io.out_dir=output/x",
                                 " model.n_layer = 8 ", "data.train=123", "train.min_lr=0"});
  EXPECT_EQ(c.train.lr, 1e-3);  // the override wins over the file
  EXPECT_TRUE(c.parallel.sequence_parallel);
  EXPECT_EQ(c.io.resume, "none");
  EXPECT_EQ(c.io.out_dir, "output/x");  // not TOML: taken as text for a string key
  EXPECT_EQ(c.model.n_layer, 8);        // spaces around key and value are fine
  EXPECT_EQ(c.data.train, "123");       // a string key keeps the text, even if it parses
  EXPECT_EQ(c.train.min_lr, 0.0);

  // Unquoted strings; the last of several overrides of one key wins; an empty value.
  const Config d = parse_config("", "deck.toml",
                                {"io.resume=none", "parallel.schedule=gpipe",
                                 "parallel.schedule=zb-h1", "io.init_weights=",
                                 "data.valid=a=b.h5"});
  EXPECT_EQ(d.io.resume, "none");
  EXPECT_EQ(d.parallel.schedule, "zb-h1");
  EXPECT_EQ(d.io.init_weights, "");
  EXPECT_EQ(d.data.valid, "a=b.h5");  // only the first '=' splits
}

TEST(Config, LoadConfigReadsAFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "trident_test_config";
  fs::create_directories(dir);
  const fs::path deck = dir / "small.toml";
  {
    std::ofstream out(deck);
    out << "[model]\nn_layer = 2\nd_model = 64\n[parallel]\nschedule = \"gpipe\"\n";
  }
  const Config c = load_config(deck.string(), {"train.steps=7", "train.warmup_steps=3"});
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.d_model, 64);
  EXPECT_EQ(c.parallel.schedule, "gpipe");
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.source, deck.string());

  // Errors from a file name the file (with line:column where the key is).
  {
    std::ofstream out(dir / "bad.toml");
    out << "[model]\n\nn_head = \"four\"\n";
  }
  try {
    load_config((dir / "bad.toml").string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "bad.toml").string() + ":3:1: model.n_head"),
              std::string::npos)
        << e.what();
  }

  // Missing, or not a file.
  for (const fs::path& p : {dir / "missing.toml", dir}) {
    try {
      load_config(p.string());
      FAIL() << "no error for " << p;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  fs::remove_all(dir);
}

TEST(ConfigErrors, TomlSyntaxHasLineAndColumn) {
  expect_error("[model]\nn_layer = = 3\n", {"deck.toml:2:", "TOML syntax error"});
  expect_error("[model\n", {"deck.toml:1:", "TOML syntax error"});
  expect_error("[train]\nlr = 1e-3\nlr = 2e-3\n", {"deck.toml:3:", "TOML syntax error"});
}

TEST(ConfigErrors, UnknownKeysAndSections) {
  expect_error("[model]\nd_modle = 256\n",
               {"deck.toml:2:1: unknown key 'model.d_modle' (did you mean 'model.d_model'?)"});
  expect_error("[model]\nn_layers = 4\n", {"'model.n_layers'", "did you mean 'model.n_layer'"});
  // Far from every key: no suggestion.
  const std::string far = error_of("[model]\nfrobnicate = 1\n");
  EXPECT_NE(far.find("unknown key 'model.frobnicate'"), std::string::npos) << far;
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
  // A key in the wrong section.
  expect_error("[train]\ntp = 2\n", {"unknown key 'train.tp'", "did you mean 'parallel.tp'"});
  // Unknown sections, and keys outside any section.
  expect_error("[modle]\nn_layer = 4\n",
               {"deck.toml:1:", "unknown section '[modle]'", "did you mean '[model]'"});
  expect_error("[optimizer]\nlr = 4\n", {"unknown section '[optimizer]'"});
  expect_error("lr = 1e-3\n", {"deck.toml:1:1:", "unknown key 'lr'", "did you mean 'train.lr'"});
  expect_error("[model.extra]\nx = 1\n", {"unknown key 'model.extra'"});
  // The first problem in the file is the one reported (toml++ sorts keys by name).
  expect_error("[model]\nzzz = 1\naaa = 2\n", {"deck.toml:2:1: unknown key 'model.zzz'"});
}

TEST(ConfigErrors, WrongTypes) {
  expect_error("[model]\nn_layer = \"4\"\n",
               {"deck.toml:2:1: model.n_layer: expected an integer, got a string"});
  expect_error("[model]\nn_layer = 4.0\n", {"model.n_layer: expected an integer, got a float"});
  expect_error("[model]\nn_layer = 99999999999\n", {"model.n_layer", "out of range"});
  expect_error("[train]\nlr = \"fast\"\n", {"train.lr: expected a number, got a string"});
  expect_error("[train]\nsteps = [1, 2]\n", {"train.steps: expected an integer, got an array"});
  expect_error("[parallel]\nsequence_parallel = 1\n",
               {"parallel.sequence_parallel: expected a boolean", "got an integer"});
  expect_error("[parallel]\nschedule = 3\n",
               {"parallel.schedule: expected a string, got an integer"});
  expect_error("[io]\nout_dir = 1979-05-27\n", {"io.out_dir: expected a string, got a date"});
  expect_error("model = 3\n", {"model: expected a table", "got an integer"});
  expect_error("[[model]]\nn_layer = 2\n", {"model: expected a table", "got an array"});
}

TEST(ConfigErrors, Ranges) {
  struct Case {
    std::string set;  // one override
    std::string key;  // the key the message must name
  };
  const std::vector<Case> cases = {
      {"model.vocab_size=-1", "model.vocab_size"},
      {"model.seq_len=0", "model.seq_len"},
      {"model.n_layer=0", "model.n_layer"},
      {"model.n_head=0", "model.n_head"},
      {"model.d_model=-256", "model.d_model"},
      {"parallel.tp=0", "parallel.tp"},
      {"parallel.pp=0", "parallel.pp"},
      {"parallel.dp=-1", "parallel.dp"},
      {"parallel.cp=0", "parallel.cp"},
      {"parallel.cp=-2", "parallel.cp"},
      {"parallel.vpp=0", "parallel.vpp"},
      {"parallel.micro_batch_size=0", "parallel.micro_batch_size"},
      {"train.steps=0", "train.steps"},
      {"train.global_batch_size=0", "train.global_batch_size"},
      {"train.lr=0", "train.lr"},
      {"train.lr=-1e-3", "train.lr"},
      {"train.lr=inf", "train.lr"},
      {"train.lr=nan", "train.lr"},
      {"train.min_lr=-1e-5", "train.min_lr"},
      {"train.min_lr=1e-3", "train.min_lr"},  // above lr = 3e-4
      {"train.warmup_steps=-1", "train.warmup_steps"},
      {"train.warmup_steps=201", "train.warmup_steps"},  // above steps = 200
      {"train.weight_decay=-0.1", "train.weight_decay"},
      {"train.beta1=1", "train.beta1"},
      {"train.beta1=-0.5", "train.beta1"},
      {"train.beta2=1.0", "train.beta2"},
      {"train.eps=0", "train.eps"},
      {"train.grad_clip=-1", "train.grad_clip"},
      {"train.seed=-3", "train.seed"},
      {"train.eval_every=-1", "train.eval_every"},
      {"train.eval_batches=0", "train.eval_batches"},
      {"train.on_nonfinite=\"ignore\"", "train.on_nonfinite"},
      {"io.out_dir=\"\"", "io.out_dir"},
      {"io.checkpoint_every=-5", "io.checkpoint_every"},
      {"io.keep_checkpoints=-1", "io.keep_checkpoints"},
      {"io.resume=\"\"", "io.resume"},
      {"runtime.threads=-2", "runtime.threads"},
      {"io.trace_step=-1", "io.trace_step"},
      {"io.trace_step=201", "io.trace_step"},  // above steps = 200
      {"runtime.watchdog_s=-1", "runtime.watchdog_s"},
      {"runtime.watchdog_s=inf", "runtime.watchdog_s"},
      {"runtime.cuda_graphs=true", "runtime.cuda_graphs"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.set);
    expect_error("", {c.set}, {"deck.toml (--set): " + c.key});
  }
  // Boundaries that are allowed.
  EXPECT_NO_THROW(parse_config("", "d.toml",
                               {"train.min_lr=3e-4", "train.warmup_steps=200", "train.beta1=0",
                                "train.grad_clip=0", "train.weight_decay=0", "train.seed=0",
                                "io.keep_checkpoints=0", "model.vocab_size=0",
                                "parallel.dp=0", "runtime.threads=0", "io.trace_step=200",
                                "runtime.watchdog_s=0.5"}));
  // The same rule from the file points at the key's line.
  expect_error("[train]\nsteps = 10\n\nlr = -1.0\n", {"deck.toml:4:1: train.lr: must be > 0"});
}

TEST(ConfigErrors, Enums) {
  expect_error("[parallel]\nschedule = \"2f2b\"\n",
               {"deck.toml:2:1: parallel.schedule", "naive", "zb-h1", "\"2f2b\""});
  for (const std::string& s : kSchedules) {
    std::vector<std::string> sets{"parallel.schedule=" + s, "train.grad_clip=0"};
    if (s == "zb-v")  // two chunks per rank, nothing else
      sets.insert(sets.end(), {"parallel.pp=2", "parallel.vpp=2", "model.n_layer=4"});
    EXPECT_NO_THROW(parse_config("", "d.toml", sets)) << s;
  }
  // PipeDream: per-stage updates after every microbatch.
  expect_error("", {"parallel.schedule=pipedream"}, {"train.grad_clip", "must be 0", "1"});
  expect_error("", {"parallel.schedule=pipedream", "train.grad_clip=0", "parallel.zero_stage=1"},
               {"parallel.zero_stage", "pipedream"});
  expect_error("", {"parallel.schedule=pipedream", "train.grad_clip=0", "parallel.pp=2"},
               {"model.tie_embeddings", "untied"});
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.schedule=pipedream", "train.grad_clip=0",
                                              "parallel.pp=2", "model.arch=llama"}));
  expect_error("", {"parallel.schedule=pipedream-2bw", "parallel.vpp=2", "parallel.pp=2"},
               {"parallel.vpp", "parallel.schedule", "interleaved-1f1b"});
  expect_error("", {"parallel.zero_stage=2"}, {"parallel.zero_stage", "0 or 1"});
  expect_error("", {"parallel.grad_bucket_mb=0"}, {"parallel.grad_bucket_mb", "> 0"});
  expect_error("", {"parallel.grad_bucket_mb=-1.5"}, {"parallel.grad_bucket_mb", "> 0"});
  expect_error("", {"parallel.recompute=partial"}, {"parallel.recompute", "none, selective or full"});
  expect_error("", {"runtime.device=tpu"}, {"runtime.device", "cpu, cuda or cpu-guarded"});
  expect_error("", {"runtime.precision=fp16"}, {"runtime.precision", "fp32, tf32 or bf16"});
  expect_error("", {"runtime.precision=bf16"}, {"runtime.precision", "runtime.device"});
  expect_error("[runtime]\nprecision = \"tf32\"\n",
               {"deck.toml:2:1: runtime.precision", "needs runtime.device = \"cuda\""});
  EXPECT_NO_THROW(parse_config("", "d.toml", {"runtime.device=cuda", "runtime.precision=bf16"}));
  EXPECT_NO_THROW(parse_config("", "d.toml", {"runtime.device=cuda", "runtime.precision=tf32"}));
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.recompute=full", "parallel.zero_stage=1"}));
  // resume: auto, none or any path.
  EXPECT_EQ(parse_config("", "d.toml", {"io.resume=ck/step-00000010.h5"}).io.resume,
            "ck/step-00000010.h5");
}

TEST(ConfigErrors, Divisibility) {
  expect_error("[model]\nd_model = 100\nn_head = 3\n",
               {"deck.toml:2:1: model.d_model = 100 is not divisible by model.n_head = 3"});
  // Only n_head was written: the message points at it.
  expect_error("[model]\nn_head = 3\n", {"deck.toml:2:1:", "model.d_model", "model.n_head"});
  expect_error("", {"parallel.tp=8"}, {"model.n_head = 4", "parallel.tp = 8"});
  // n_layer need not divide pp * vpp (the balanced split, parallel.pipeline_layers), but
  // every virtual stage needs a layer.
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.pp=3"}));
  expect_error("", {"parallel.pp=5"}, {"model.n_layer = 4", "fewer than", "parallel.pp * parallel.vpp"});
  expect_error("", {"parallel.pp=3", "parallel.vpp=2", "parallel.schedule=looped-bfs"},
               {"model.n_layer", "parallel.pp * parallel.vpp = 3 * 2"});
  expect_error("", {"parallel.vpp=2"}, {"parallel.vpp = 2", "parallel.schedule", "\"1f1b\""});
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.vpp=2", "parallel.pp=2",
                                              "parallel.schedule=interleaved-1f1b"}));
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.vpp=2", "parallel.pp=2",
                                              "parallel.schedule=looped-bfs"}));
  // Chunks of one rank interleave over the pipeline ranks: vpp > 1 needs pp >= 2.
  expect_error("", {"parallel.vpp=4", "parallel.schedule=looped-bfs"},
               {"parallel.vpp = 4", "parallel.pp >= 2"});
  expect_error("[train]\nglobal_batch_size = 10\n",
               {"deck.toml:2:1: train.global_batch_size = 10",
                "parallel.micro_batch_size = 4"});
  // Context parallelism splits each sequence in 2 * cp chunks (seq_len 128 by default).
  expect_error("", {"parallel.cp=3"},
               {"deck.toml (--set): parallel.cp = 3 needs model.seq_len = 128 divisible by "
                "2 * parallel.cp = 6"});
  expect_error("[model]\nseq_len = 12\n\n[parallel]\ncp = 4\n",
               {"deck.toml:5:1:", "parallel.cp = 4", "model.seq_len = 12", "= 8"});
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.cp=4"}));
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.cp=64"}));  // chunks of one token
  EXPECT_NO_THROW(parse_config("", "d.toml", {"model.seq_len=7"}));  // cp = 1: any length
  // The planner lays out cp = 1 only: parallel.layout = "auto" chooses cp like tp.
  expect_error("", {"parallel.layout=auto", "parallel.cp=2"},
               {"parallel.cp is chosen by parallel.layout = \"auto\""});
  // Ulysses splits each rank's heads over cp: n_head / tp and its kv heads divisible by cp.
  expect_error("", {"parallel.cp_mode=tree"}, {"parallel.cp_mode", "ring or ulysses"});
  expect_error("", {"parallel.cp=8", "parallel.cp_mode=ulysses"},
               {"parallel.cp_mode = \"ulysses\"", "parallel.cp = 8", "4 query heads"});
  expect_error("", {"parallel.cp=2", "parallel.tp=4", "parallel.cp_mode=ulysses"},
               {"parallel.cp_mode = \"ulysses\"", "1 query heads"});
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.cp=4", "parallel.cp_mode=ulysses"}));
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.cp=2", "parallel.tp=2",
                                               "parallel.cp_mode=ulysses"}));
  // cp = 1: any head count (no CP attention)
  EXPECT_NO_THROW(parse_config("", "d.toml", {"model.n_head=1", "model.d_model=8",
                                               "parallel.cp_mode=ulysses"}));
  expect_error("", {"parallel.layout=auto", "parallel.cp_mode=ulysses"},
               {"parallel.cp_mode", "plans ring attention only"});
  expect_error("", {"parallel.sequence_parallel=true", "parallel.tp=4", "model.seq_len=126"},
               {"parallel.sequence_parallel", "model.seq_len = 126", "parallel.tp = 4"});
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.sequence_parallel=true", "parallel.tp=4"}));
  // parallel.tp_mode: "1d" | "2d"; "2d" needs a square tp, and commands that do not run it
  // (parse_config's allow_tp2d false: trident plan) refuse it.
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.tp_mode=\"1d\"", "parallel.tp=2"}));
  expect_error("", {"parallel.tp_mode=\"3d\""},
               {"parallel.tp_mode: expected 1d or 2d", "got \"3d\""});
  expect_error("", {"parallel.tp_mode=\"2d\"", "parallel.tp=2"},
               {"parallel.tp_mode = \"2d\" needs parallel.tp a perfect square", "got 2"});
  expect_error("", {"parallel.tp_mode=\"2d\"", "parallel.tp=4"},
               {"parallel.tp_mode = \"2d\" is not supported yet", "expected \"1d\""});
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.tp_mode=\"2d\"", "parallel.tp=4"}, true));
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.tp_mode=\"2d\"", "parallel.tp=4",
                                              "parallel.pp=2", "parallel.schedule=\"gpipe\"",
                                              "parallel.zero_stage=1"}, true));
  // What the 2D model does not implement, one error each.
  expect_error("", {"parallel.tp_mode=\"2d\"", "parallel.tp=4", "parallel.recompute=\"full\""},
               {"parallel.tp_mode = \"2d\" does not recompute activations", "got \"full\""});
  expect_error("", {"parallel.tp_mode=\"2d\"", "parallel.tp=4", "parallel.pp=2", "parallel.vpp=2",
                    "parallel.schedule=\"interleaved-1f1b\"", "model.n_layer=4"},
               {"runs one model chunk per pipeline rank", "expected parallel.vpp = 1", "got 2"});
  expect_error("", {"parallel.tp_mode=\"2d\"", "parallel.tp=4", "parallel.pp=2",
                    "parallel.schedule=\"zb-h1\""},
               {"parallel.tp_mode = \"2d\" has no split backward", "got \"zb-h1\""});
  // zb-v places exactly two chunks per rank: any other vpp is refused naming the key.
  expect_error("", {"parallel.pp=2", "parallel.schedule=\"zb-v\""},
               {"parallel.vpp", "parallel.schedule = \"zb-v\" needs parallel.vpp = 2", "got 1"});
  expect_error("", {"parallel.pp=2", "parallel.vpp=4", "parallel.schedule=\"zb-v\"",
                    "model.n_layer=8"},
               {"parallel.schedule = \"zb-v\" needs parallel.vpp = 2", "got 4"});
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.pp=2", "parallel.vpp=2",
                                              "parallel.schedule=\"zb-v\"", "model.n_layer=4"},
                               true));
  expect_error("", {"parallel.tp_mode=\"2d\"", "parallel.tp=4", "parallel.schedule=\"pipedream\"",
                    "train.grad_clip=0"},
               {"does not run parallel.schedule = \"pipedream\"", "or pipedream-2bw"});
  EXPECT_NO_THROW(parse_config("", "d.toml", {"parallel.tp_mode=\"2d\"", "parallel.tp=4",
                                              "parallel.schedule=\"pipedream-2bw\""}, true));
  // What 2D refuses for good, and what its grid needs divisible by q (= 2 here).
  expect_error("", {"parallel.tp_mode=\"2d\"", "parallel.tp=4", "parallel.sequence_parallel=true"},
               {"parallel.tp_mode = \"2d\" does not combine with parallel.sequence_parallel",
                "expected parallel.sequence_parallel = false"});
  expect_error("", {"parallel.tp_mode=\"2d\"", "parallel.tp=4", "model.arch=\"llama\""},
               {"parallel.tp_mode = \"2d\" is built for model.arch = \"gpt2\" only"});
  expect_error("", {"parallel.tp_mode=\"2d\"", "parallel.tp=4", "runtime.device=\"cuda\""},
               {"parallel.tp_mode = \"2d\" runs on the CPU backend only",
                "expected runtime.device = \"cpu\""});
  expect_error("", {"parallel.tp_mode=\"2d\"", "parallel.tp=4", "parallel.micro_batch_size=3",
                    "train.global_batch_size=6"},
               {"on a 2 x 2 grid needs parallel.micro_batch_size divisible by 2", "got 3"});
  expect_error("", {"parallel.tp_mode=\"2d\"", "parallel.tp=4", "model.n_head=3",
                    "model.d_model=96"},
               {"needs model.n_head divisible by 2", "got 3"});
}

TEST(ConfigErrors, SetSyntax) {
  for (const std::string bad :
       {"lr", "train.lr", "=3", "train=3", "a.b.c=1", ".lr=1", "train.=1", "tr ain.lr=1",
        "--set train.lr=1"}) {
    SCOPED_TRACE(bad);
    expect_error("", {bad}, {"deck.toml (--set): --set expects section.key=value", bad});
  }
  expect_error("", {"train.lrr=1"}, {"deck.toml (--set): unknown key 'train.lrr'",
                                     "did you mean 'train.lr'"});
  expect_error("", {"trian.lr=1"}, {"unknown key 'trian.lr'", "did you mean 'train.lr'"});
  expect_error("", {"optim.beta=1"}, {"unknown section '[optim]'"});
  expect_error("", {"model.n_layer=abc"},
               {"deck.toml (--set): model.n_layer: expected an integer, got 'abc'"});
  expect_error("", {"model.n_layer=\"4\""}, {"model.n_layer: expected an integer, got a string"});
  expect_error("", {"train.lr="}, {"train.lr: expected a number, got ''"});
  expect_error("", {"parallel.sequence_parallel=yes"},
               {"parallel.sequence_parallel: expected a boolean"});
}

// The layout's choices are parsed once, to their enums and the schedule's registry entry,
// and everything the trainer and the memory model read is derived from that one value.
TEST(Config, LayoutIsParsedOnceIntoItsEnums) {
  const Config c = parse_config("", "d.toml", {"parallel.cp=2", "parallel.cp_mode=ulysses",
                                               "parallel.pp=2", "parallel.schedule=zb-h1",
                                               "parallel.recompute=selective"});
  EXPECT_EQ(c.parallel.cp_mode, model::CpMode::ulysses);
  EXPECT_EQ(c.parallel.tp_mode, model::TpMode::one_d);
  EXPECT_EQ(&c.parallel.schedule.kind(), pipeline::find_schedule("zb-h1"));
  EXPECT_STREQ(c.parallel.schedule.word(), "zb-h1");
  const parallel::GridShape g = c.parallel.grid();
  EXPECT_EQ(g.tp, 1);
  EXPECT_EQ(g.cp, 2);
  EXPECT_EQ(g.dp, 0);  // resolved by resolve_world
  EXPECT_EQ(g.pp, 2);
  const model::MemoryLayout ml = memory_layout(c, 1);
  EXPECT_EQ(ml.cp_mode, model::CpMode::ulysses);
  EXPECT_EQ(ml.recompute, model::Recompute::selective);
  EXPECT_EQ(ml.placement, pipeline::find_schedule("zb-h1")->placement);
  EXPECT_EQ(ml.pp_rank, 1);
  EXPECT_EQ(c.parallel.str(), "tp1 cp2 pp2 dp0 vpp1 zb-h1 mbs4 rc:selective sp:0 zero:0 split:even");
  // A word outside the registry is no schedule (the deck's loader names the key; here the
  // value type itself refuses).
  EXPECT_THROW(ScheduleChoice("2f2b"), Error);
}

TEST(ResolveWorld, FillsDpAndChecksTheLayout) {
  Config c = parse_config("[parallel]\ntp = 2\npp = 2\n", "deck.toml");
  resolve_world(c, 8);
  EXPECT_EQ(c.parallel.dp, 2);
  EXPECT_EQ(microbatches_per_rank(c), 4);  // 32 / (4 * 2)

  Config one = parse_config("", "deck.toml");
  resolve_world(one, 1);
  EXPECT_EQ(one.parallel.dp, 1);
  EXPECT_EQ(microbatches_per_rank(one), 8);

  Config explicit_dp = parse_config("", "deck.toml", {"parallel.dp=4", "parallel.tp=2"});
  resolve_world(explicit_dp, 8);
  EXPECT_EQ(explicit_dp.parallel.dp, 4);
  EXPECT_EQ(microbatches_per_rank(explicit_dp), 2);

  auto error_of_world = [](Config cfg, int world) -> std::string {
    try {
      resolve_world(cfg, world);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  std::string msg = error_of_world(parse_config("[parallel]\ntp = 2\npp = 2\n", "deck.toml"), 6);
  EXPECT_NE(msg.find("deck.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parallel.tp * parallel.pp = 2 * 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("world size 6"), std::string::npos) << msg;

  msg = error_of_world(parse_config("", "deck.toml", {"parallel.dp=2"}), 4);
  EXPECT_NE(msg.find("deck.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parallel.dp = 1 * 1 * 2 = 2"), std::string::npos) << msg;

  // 32 sequences over dp = 3 replicas of micro-batches of 4: 32 % 12 != 0.
  msg = error_of_world(parse_config("", "deck.toml"), 3);
  EXPECT_NE(msg.find("deck.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.global_batch_size = 32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parallel.micro_batch_size * parallel.dp = 4 * 3 = 12"),
            std::string::npos)
      << msg;

  // Interleaved 1F1B with vpp > 1 takes microbatches in groups of pp: 3 microbatches
  // (24 / (4 * 2)) on pp = 2 do not group; 4 do (looped-bfs takes any count).
  const std::vector<std::string> interleaved = {"parallel.pp=2", "parallel.vpp=2",
                                                "parallel.schedule=interleaved-1f1b",
                                                "train.global_batch_size=24"};
  msg = error_of_world(parse_config("", "deck.toml", interleaved), 4);
  EXPECT_NE(msg.find("deck.toml: parallel.schedule = \"interleaved-1f1b\" with parallel.vpp = 2"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("= 3) divisible by parallel.pp = 2"), std::string::npos) << msg;
  EXPECT_EQ(error_of_world(parse_config("", "deck.toml", interleaved), 2), "");  // 6 microbatches
  EXPECT_EQ(error_of_world(parse_config("", "deck.toml",
                                        {"parallel.pp=2", "parallel.vpp=2",
                                         "parallel.schedule=looped-bfs",
                                         "train.global_batch_size=24"}),
                           4),
            "");

  EXPECT_THROW(microbatches_per_rank(parse_config("", "deck.toml")), Error);  // dp unresolved

  // Context parallelism is a factor of the world: dp = world / (tp * cp * pp).
  Config cp = parse_config("", "deck.toml", {"parallel.cp=2", "parallel.tp=2"});
  resolve_world(cp, 8);
  EXPECT_EQ(cp.parallel.dp, 2);
  EXPECT_EQ(microbatches_per_rank(cp), 4);  // CP ranks share their sequences: 32 / (4 * 2)
  msg = error_of_world(parse_config("", "deck.toml", {"parallel.cp=2", "parallel.tp=2"}), 6);
  EXPECT_NE(msg.find("deck.toml: parallel.tp * parallel.cp * parallel.pp = 2 * 2 * 1 does not "
                     "divide the world size 6"),
            std::string::npos)
      << msg;
  msg = error_of_world(parse_config("", "deck.toml", {"parallel.cp=2", "parallel.dp=2"}), 2);
  EXPECT_NE(msg.find("parallel.tp * parallel.cp * parallel.pp * parallel.dp = 1 * 2 * 1 * 2 = "
                     "4 ranks, but the world has 2"),
            std::string::npos)
      << msg;
}

TEST(Config, ValidationIsDeterministic) {
  // Every rank parses the same text: same Config, same message.
  const std::string deck = "[model]\nn_layer = 6\n[parallel]\npp = 3\n";
  EXPECT_TRUE(parse_config(deck, "a.toml") == parse_config(deck, "a.toml"));
  EXPECT_EQ(error_of("[model]\nn_layer = 5\n", {"parallel.pp=2"}),
            error_of("[model]\nn_layer = 5\n", {"parallel.pp=2"}));
}

}  // namespace
}  // namespace trident::train
