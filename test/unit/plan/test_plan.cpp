// The planner: machine files (validation), the cost model against Megatron-LM's published
// weak-scaling table, and the ranked enumeration. Pure arithmetic, no MPI: ~1 s.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "trident/core/error.hpp"
#include "trident/plan/calibrate.hpp"
#include "trident/pipeline/schedule.hpp"
#include "trident/pipeline/simulator.hpp"
#include "trident/pipeline/stage_memory.hpp"
#include "trident/plan/planner.hpp"

namespace trident::plan {
namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::string kMachine = R"([machine]
name = "test"
ranks_per_node = 4
memory_gib = 1
peak_flops = 1e11
[compute]
gemm_flops = 5e10
attention_flops = 2e10
kernel_bytes_per_s = 1e10
[intra]
alpha_s = 1e-5
bytes_per_s = 1e9
[inter]
alpha_s = 1e-4
bytes_per_s = 1e8
)";

std::string error_of(const std::string& text) {
  try {
    parse_machine(text, "m.toml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string replace(std::string s, const std::string& a, const std::string& b) {
  const auto at = s.find(a);
  EXPECT_NE(at, std::string::npos) << a;
  return s.replace(at, a.size(), b);
}

TEST(Machine, ParsesAndRoundTrips) {
  const Machine m = parse_machine(kMachine, "m.toml");
  EXPECT_EQ(m.ranks_per_node, 4);
  EXPECT_DOUBLE_EQ(m.inter.bytes_per_s, 1e8);
  Machine with_p2p = m;
  with_p2p.inter.p2p_alpha_s = 2e-5, with_p2p.inter.p2p_bytes_per_s = 3e8;
  const Machine again = parse_machine(machine_toml(with_p2p), "again");
  EXPECT_DOUBLE_EQ(again.inter.p2p_bytes_per_s, 3e8);
  EXPECT_DOUBLE_EQ(again.inter.p2p_time(3e8), 1 + 2e-5);
  EXPECT_DOUBLE_EQ(again.intra.p2p_time(1e9), 1 + 1e-5);  // the collective figures
  EXPECT_DOUBLE_EQ(again.gemm_flops, m.gemm_flops);
  EXPECT_DOUBLE_EQ(again.intra.alpha_s, m.intra.alpha_s);
  EXPECT_DOUBLE_EQ(m.library_mib, 0);  // optional
  Machine with_lib = m;
  with_lib.library_mib = 6.5;
  EXPECT_DOUBLE_EQ(parse_machine(machine_toml(with_lib), "again").library_mib, 6.5);
  EXPECT_DOUBLE_EQ(m.nonblocking_temp_ratio, model::kNonblockingTempRatio);  // optional
  with_lib.nonblocking_temp_ratio = 2.5;
  EXPECT_DOUBLE_EQ(parse_machine(machine_toml(with_lib), "again").nonblocking_temp_ratio, 2.5);
}

TEST(Machine, BadFiguresAreOneClearError) {
  EXPECT_EQ(error_of(replace(kMachine, "peak_flops = 1e11", "peak_flops = 1e11\nlibrary_mib = -2")),
            "m.toml:6:15: machine.library_mib: expected a number >= 0 (MiB)");
  EXPECT_EQ(error_of(replace(kMachine, "gemm_flops = 5e10\n", "")),
            "m.toml: missing compute.gemm_flops (see docs/FORMAT.md, \"Machine files\")");
  EXPECT_EQ(error_of(replace(kMachine, "gemm_flops = 5e10", "gemm_flops = -5e10")),
            "m.toml:7:14: compute.gemm_flops: must be > 0, got -5e+10");
  EXPECT_EQ(error_of(replace(kMachine, "alpha_s = 1e-5", "alpha_s = \"fast\"")),
            "m.toml:11:11: intra.alpha_s: expected a number");
  EXPECT_EQ(error_of(replace(kMachine, "[inter]\nalpha_s = 1e-4\nbytes_per_s = 1e8\n", "")),
            "m.toml: missing section [inter]");
  EXPECT_EQ(error_of(replace(kMachine, "memory_gib = 1", "memory_gb = 1")),
            "m.toml:4:13: unknown key 'machine.memory_gb'");
  EXPECT_EQ(error_of(replace(kMachine, "bytes_per_s = 1e9", "bytes_per_s = 1e9\np2p_alpha_s = 0")),
            "m.toml: [intra] needs both p2p_alpha_s and p2p_bytes_per_s, or neither");
  EXPECT_EQ(error_of(replace(kMachine, "bytes_per_s = 1e9", "bytes_per_s = nan")),
            "m.toml:12:15: intra.bytes_per_s: must be > 0, got nan");
  EXPECT_EQ(error_of(replace(kMachine, "peak_flops = 1e11", "peak_flops = 1e11\nnonblocking_temp_ratio = -1")),
            "m.toml:6:26: machine.nonblocking_temp_ratio: must be >= 0, got -1");
}

TEST(Machine, ShippedFilesLoad) {
  for (const char* f : {"a100-80gb-dgx.toml", "h100-sxm-dgx.toml", "h200-sxm-node.toml"}) {
    const Machine m = load_machine(std::string(TRIDENT_SOURCE_DIR) + "/input/machines/" + f);
    EXPECT_EQ(m.ranks_per_node, 8) << f;
    EXPECT_GT(m.peak_flops, m.gemm_flops) << f;
  }
}

TEST(Machine, GemmRateTakesTheMeasuredShape) {
  Machine m = parse_machine(kMachine, "m.toml");
  m.gemms.push_back({512, 768, 256, 3e10});
  EXPECT_DOUBLE_EQ(m.gemm_rate(512, 768, 256), 3e10);
  EXPECT_DOUBLE_EQ(m.gemm_rate(512, 768, 300), 3e10);  // near: within 2x
  EXPECT_DOUBLE_EQ(m.gemm_rate(4096, 4096, 4096), 5e10);  // far: the large-shape rate
}

// Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM"), Table 1: GPT models of 1.7B to 1T parameters on 32 to 3072 A100s (vocabulary
// 51200, sequence 2048), with the tensor- and pipeline-parallel sizes and batch they used and
// the TFLOP/s per GPU they achieved. Their FLOP count includes full activation recomputation:
// 96 B s l h^2 (1 + s / 6h + V / 16 l h). Micro-batch size 1 with the 1F1B schedule (the
// table does not list them; the paper's scaling runs use small micro-batches).
struct MegatronRow {
  double billions;
  int heads, hidden, layers, tp, pp, gpus, batch;
  double tflops;
};
const MegatronRow kTable1[] = {
    {1.7, 24, 2304, 24, 1, 1, 32, 512, 137},       {3.6, 32, 3072, 30, 2, 1, 64, 512, 138},
    {7.5, 32, 4096, 36, 4, 1, 128, 512, 142},      {18.4, 48, 6144, 40, 8, 1, 256, 1024, 135},
    {39.1, 64, 8192, 48, 8, 2, 512, 1536, 138},    {76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140},
    {145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148}, {310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155},
    {529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163}, {1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163},
};

TEST(Megatron, Table1FromTheA100MachineFile) {
  const Machine a100 = load_machine(std::string(TRIDENT_SOURCE_DIR) + "/input/machines/a100-80gb-dgx.toml");
  int within = 0;
  std::printf("%8s %4s %4s %6s %10s %10s %7s  %s\n", "params", "tp", "pp", "gpus", "published",
              "predicted", "ratio", "dominant");
  for (const MegatronRow& r : kTable1) {
    model::ModelConfig cfg;
    cfg.vocab_size = 51200, cfg.seq_len = 2048, cfg.n_layer = r.layers;
    cfg.n_head = r.heads, cfg.d_model = r.hidden;
    Layout l;
    l.tp = r.tp, l.pp = r.pp, l.dp = r.gpus / (r.tp * r.pp);
    l.micro_batch_size = 1, l.recompute = model::Recompute::full;
    const StepPrediction p = predict(cfg, r.batch, l, a100, false);
    const double B = r.batch, s = 2048, L = r.layers, h = r.hidden, V = 51200;
    const double flops = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h));
    const double tflops = flops / (p.step_s * r.gpus) / 1e12;
    const double ratio = tflops / r.tflops;
    within += std::fabs(ratio - 1) <= 0.20;
    std::printf("%7.1fB %4d %4d %6d %10.0f %10.1f %7.3f  %s\n", r.billions, r.tp, r.pp, r.gpus,
                r.tflops, tflops, ratio, p.dominant.c_str());
  }
  EXPECT_GE(within, 7) << "rows within 20% of the published TFLOP/s per GPU";
}

model::ModelConfig tiny() {
  model::ModelConfig m;
  m.vocab_size = 256, m.seq_len = 64, m.n_layer = 4, m.n_head = 4, m.d_model = 64;
  return m;
}

TEST(Plan, EveryLayoutIsValidAndTheBestComesFirst) {
  train::Config deck = train::parse_config(
      "[model]\nvocab_size = 256\nseq_len = 64\nn_layer = 4\nn_head = 4\nd_model = 64\n"
      "[train]\nglobal_batch_size = 8\n", "deck.toml");
  Machine m = parse_machine(kMachine, "m.toml");
  PlanOptions opt;
  opt.ranks_per_node = 4;
  const std::vector<Layout> all = enumerate_layouts(deck, opt);
  std::set<std::string> seen;
  for (const Layout& l : all) {
    EXPECT_EQ(l.tp * l.cp * l.pp * l.dp, 4) << l.str();
    EXPECT_EQ(deck.model.n_layer % (l.pp * l.vpp), 0) << l.str();  // 4 layers: all even
    EXPECT_TRUE(seen.insert(l.str()).second) << "twice: " << l.str();
  }
  EXPECT_GT(all.size(), 100u);
  const std::vector<StepPrediction> plan = make_plan(deck, m, opt);
  ASSERT_FALSE(plan.empty());
  for (std::size_t i = 1; i < plan.size(); ++i)
    if (plan[i].fits && plan[i - 1].fits) EXPECT_LE(plan[i - 1].step_s, plan[i].step_s);
  // A slower link between nodes: the same ranks on 4 nodes of 1 never beat 1 node of 4.
  PlanOptions spread = opt;
  spread.nodes = 4, spread.ranks_per_node = 1;
  EXPECT_GE(make_plan(deck, m, spread).front().step_s, plan.front().step_s);
}

// Every registered schedule is a planner candidate with pp > 1 (a schedule added to the
// registry without the planner seeing it fails here); asynchronous ones (PipeDream) only
// when the deck names them, and then enumerate_layouts plans them.
TEST(Plan, EveryRegisteredScheduleIsACandidate) {
  for (const pipeline::ScheduleKind& k : pipeline::schedule_kinds()) {
    const auto sync = schedule_candidates(2, 4, "1f1b");
    const auto asked = schedule_candidates(2, 4, k.name);
    auto has = [&](const std::vector<std::pair<int, std::string>>& c, int vpp) {
      return std::count(c.begin(), c.end(), std::make_pair(vpp, std::string(k.name))) == 1;
    };
    const int vpp = k.multi_chunk ? 2 : 1;  // pp 2 * vpp 2 divides 4 layers
    EXPECT_TRUE(has(asked, vpp)) << k.name;
    EXPECT_EQ(has(sync, vpp), !k.asynchronous()) << k.name;
    EXPECT_NE(has(asked, 1), k.multi_chunk) << k.name;  // vpp 1: the one-chunk schedule
    EXPECT_FALSE(has(asked, 3)) << k.name;              // 6 does not
  }
  EXPECT_EQ(schedule_candidates(1, 4, "pipedream"),
            (std::vector<std::pair<int, std::string>>{{1, "1f1b"}}));
  train::Config deck = train::parse_config(
      "[model]\nvocab_size = 256\nseq_len = 64\nn_layer = 4\nn_head = 4\nd_model = 64\n"
      "[train]\nglobal_batch_size = 8\n[parallel]\nschedule = \"pipedream-2bw\"\n",
      "deck.toml");
  PlanOptions opt;
  opt.ranks_per_node = 2;
  std::set<std::string> scheds;
  for (const Layout& l : enumerate_layouts(deck, opt)) scheds.insert(l.schedule.word());
  EXPECT_EQ(scheds.count("pipedream-2bw"), 1u);
  EXPECT_EQ(scheds.count("pipedream"), 0u);
  EXPECT_EQ(scheds.count("zb-h1"), 1u);
}

// zb-v places exactly two chunks per rank (its misfit rule): a candidate at vpp 2 only, where
// interleaved-1f1b is planned at every vpp whose virtual stages divide the layers.
TEST(Plan, ZeroBubbleVIsACandidateAtVpp2Only) {
  const auto c = schedule_candidates(2, 24, "1f1b");  // 24 layers: vpp 2, 3, 4, 6 divide
  std::vector<int> zbv, interleaved;
  for (const auto& [vpp, name] : c) {
    if (name == "zb-v") zbv.push_back(vpp);
    if (name == "interleaved-1f1b") interleaved.push_back(vpp);
  }
  EXPECT_EQ(zbv, std::vector<int>{2});
  EXPECT_EQ(interleaved, (std::vector<int>{2, 3, 4, 6}));
  for (const auto& [vpp, name] : schedule_candidates(2, 6, "1f1b"))  // 2 * 2 does not divide 6
    EXPECT_NE(name, "zb-v") << vpp;
}

// n_layer 3 at 2 ranks: pp 2 is planned with the balanced split (2 + 1 with the head's
// stage the lighter), its slowest chunk the 2-layer one; vpp only where it divides.
TEST(Plan, UnevenPipelineSplitsArePlanned) {
  train::Config deck = train::parse_config(
      "[model]\nvocab_size = 256\nseq_len = 64\nn_layer = 3\nn_head = 4\nd_model = 64\n"
      "[train]\nglobal_batch_size = 8\n", "deck.toml");
  Machine m = parse_machine(kMachine, "m.toml");
  PlanOptions opt;
  opt.ranks_per_node = 2;
  bool pp2 = false;
  for (const Layout& l : enumerate_layouts(deck, opt)) {
    EXPECT_EQ(l.vpp, 1) << l.str();
    pp2 = pp2 || l.pp == 2;
  }
  EXPECT_TRUE(pp2);
  Layout l;
  l.pp = 2, l.dp = 1, l.micro_batch_size = 2, l.schedule = "1f1b";
  const StepPrediction p = predict(deck.model, 8, l, m, true);
  // Its slowest chunk (2 layers + the embedding) is slower than 1 layer + the head (n_layer
  // 2 at pp 2) and faster than 2 layers + the head (n_layer 4).
  model::ModelConfig other = deck.model;
  other.n_layer = 4;
  const double four = predict(other, 8, l, m, true).compute_s;
  other.n_layer = 2;
  const double two = predict(other, 8, l, m, true).compute_s;
  EXPECT_LT(p.compute_s, four);
  EXPECT_GT(p.compute_s, two);
}

// A head that costs several blocks (vocabulary 32k, d_model 512): at pp 4 the even split's
// last stage carries 4 layers + the head, and the step model simulates every virtual stage
// at its own cost: the other stages wait on it, so the predicted bubble is above the
// uniform-cost simulation's (the old model, the slowest chunk for every action, predicted
// exactly the uniform bubble), and the planner's "auto" split, which moves layers off the
// head's stage, is planned faster.
TEST(Plan, UnequalStagesAreSimulatedAndTheAutoSplitIsProposed) {
  train::Config deck = train::parse_config(
      "[model]\nvocab_size = 32000\nseq_len = 256\nn_layer = 16\nn_head = 8\nd_model = 512\n"
      "[train]\nglobal_batch_size = 8\n", "deck.toml");
  const model::ModelConfig& cfg = deck.model;
  Machine m = parse_machine(kMachine, "m.toml");
  EXPECT_EQ(split_candidates(cfg, 4, 1, 1), (std::vector<std::string>{"even", "auto"}));
  EXPECT_EQ(split_candidates(cfg, 1, 1, 1), std::vector<std::string>{"even"});
  EXPECT_EQ(split_candidates(cfg, 3, 1, 1), std::vector<std::string>{"auto"});  // 16 % 3
  Layout l;
  l.pp = 4, l.dp = 1, l.micro_batch_size = 1, l.schedule = "1f1b";
  const StepPrediction even = predict(cfg, 8, l, m, true);
  l.pipeline_layers = "auto";
  const StepPrediction bal = predict(cfg, 8, l, m, true);
  EXPECT_EQ(even.stage_layers, (std::vector<int>{4, 4, 4, 4}));
  EXPECT_EQ(bal.stage_layers, model::balanced_stage_layers(cfg, 4, 1));
  EXPECT_LT(bal.stage_layers.back(), 4);
  const double uniform =
      pipeline::simulate(pipeline::make_schedule("1f1b", 4, 1, 8)).bubble_fraction;
  std::printf("pp 4, m 8, 1f1b: even %.4f s bubble %.3f; auto [%d, %d, %d, %d] %.4f s bubble "
              "%.3f; uniform-cost bubble %.3f\n",
              even.step_s, even.bubble_fraction, bal.stage_layers[0], bal.stage_layers[1],
              bal.stage_layers[2], bal.stage_layers[3], bal.step_s, bal.bubble_fraction, uniform);
  EXPECT_GT(even.bubble_fraction, uniform + 0.1);
  EXPECT_LT(bal.step_s, 0.85 * even.step_s);
  // The step is the makespan: at least the critical rank's work, which is the head's.
  EXPECT_GE(even.step_s, even.compute_s + even.tp_comm_s);
  EXPECT_LT(bal.compute_s, even.compute_s);
  // The planner ranks both; the deck it writes for a layout names its split.
  PlanOptions opt;
  opt.ranks_per_node = 4;
  std::set<std::string> splits;
  for (const Layout& k : enumerate_layouts(deck, opt))
    if (k.pp == 4 && k.vpp == 1 && k.schedule == "1f1b" && k.micro_batch_size == 1 &&
        k.recompute == model::Recompute::none)
      splits.insert(k.pipeline_layers);
  EXPECT_EQ(splits, (std::set<std::string>{"even", "auto"}));
  EXPECT_EQ(with_layout(deck, l).parallel.pipeline_layers, "auto");
  EXPECT_NE(layout_deck_lines(l).find("pipeline_layers = \"auto\"\n"), std::string::npos);
  EXPECT_EQ(train::pipeline_stage_layers(with_layout(deck, l)), bal.stage_layers);
  // The layout's cp replaces the deck's (here 1: the layout has no context parallelism).
  train::Config cp_deck = deck;
  cp_deck.parallel.cp = 2;
  EXPECT_EQ(with_layout(cp_deck, l).parallel.cp, 1);
}

// A layout reaches a deck three ways: with_layout (typed, for parallel.layout = "auto"), the
// deck lines `plan` prints and the --set lines `plan --validate` runs. All three give the
// same configuration.
TEST(Plan, LayoutTextParsesBackToWithLayout) {
  const std::string deck_text =
      "[model]\nvocab_size = 64\nseq_len = 16\nn_layer = 8\nn_head = 4\nd_model = 32\n"
      "[train]\nglobal_batch_size = 16\n";
  const train::Config deck = train::parse_config(deck_text, "deck.toml");
  Layout a;
  a.tp = 2, a.pp = 2, a.dp = 1, a.vpp = 2, a.schedule = "interleaved-1f1b", a.micro_batch_size = 2;
  a.recompute = model::Recompute::selective, a.sequence_parallel = true, a.pipeline_layers = "auto";
  Layout b;
  b.tp = 1, b.pp = 4, b.dp = 2, b.schedule = "zb-h1", b.zero_stage = 1, b.micro_batch_size = 1;
  Layout c;  // context parallelism: seq_len 16 splits in 2 * cp = 4 chunks
  c.tp = 2, c.cp = 2, c.pp = 2, c.dp = 2, c.micro_batch_size = 2, c.sequence_parallel = true;
  c.zero_stage = 1, c.recompute = model::Recompute::full;
  EXPECT_EQ(with_layout(deck, c).parallel.cp, 2);
  EXPECT_NE(layout_deck_lines(c).find("\ncp = 2\n"), std::string::npos);
  const std::vector<std::string> sets = layout_set_lines(c);
  EXPECT_EQ(std::count(sets.begin(), sets.end(), "parallel.cp=2"), 1);
  EXPECT_EQ(c.str(), "tp2 cp2 pp2 dp2 vpp1 1f1b mbs2 rc:full sp:1 zero:1 split:even");
  EXPECT_EQ(b.str(), "tp1 pp4 dp2 vpp1 zb-h1 mbs1 rc:none sp:0 zero:1 split:even");  // cp 1: as before
  for (const Layout& l : {a, b, c}) {
    const std::string want = train::to_toml(with_layout(deck, l));
    EXPECT_EQ(train::to_toml(train::parse_config(deck_text, "deck.toml", layout_set_lines(l))),
              want) << l.str();
    // The printed lines replace the deck's [parallel] table (it has none here).
    EXPECT_EQ(train::to_toml(train::parse_config(deck_text + layout_deck_lines(l), "deck.toml")),
              want) << l.str();
    // The deck is the layout: it reads back as the same value.
    EXPECT_EQ(static_cast<const Layout&>(train::parse_config(want, "deck.toml").parallel), l)
        << l.str();
  }
  // [parallel]'s keys outside the layout stay the deck's.
  train::Config tuned = deck;
  tuned.parallel.grad_bucket_mb = 7.5;
  EXPECT_EQ(with_layout(tuned, b).parallel.grad_bucket_mb, 7.5);
  EXPECT_EQ(with_layout(tuned, b).parallel.layout, "deck");
}

// Context parallelism is planned where the sequence splits in 2 * cp chunks and the ranks
// tp leaves divide: powers of two only.
TEST(Plan, ContextParallelSizesAreCandidates) {
  EXPECT_EQ(cp_candidates(64, 4), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(cp_candidates(64, 1), std::vector<int>{1});
  EXPECT_EQ(cp_candidates(12, 8), (std::vector<int>{1, 2}));  // 12 % 8 and 12 % 16
  EXPECT_EQ(cp_candidates(64, 6), (std::vector<int>{1, 2}));  // 4 does not divide 6
  EXPECT_EQ(cp_candidates(66, 4), std::vector<int>{1});       // 66 % 4
  train::Config deck = train::parse_config(
      "[model]\nvocab_size = 256\nseq_len = 64\nn_layer = 4\nn_head = 4\nd_model = 64\n"
      "[train]\nglobal_batch_size = 8\n", "deck.toml");
  PlanOptions opt;
  opt.ranks_per_node = 4;
  std::set<std::pair<int, int>> tp_cp;
  bool zero_over_cp = false;
  for (const Layout& l : enumerate_layouts(deck, opt)) {
    tp_cp.insert({l.tp, l.cp});
    zero_over_cp = zero_over_cp || (l.zero1() && l.dp == 1 && l.cp > 1);  // shards over DP x CP
  }
  EXPECT_EQ(tp_cp, (std::set<std::pair<int, int>>{{1, 1}, {1, 2}, {1, 4}, {2, 1}, {2, 2}, {4, 1}}));
  EXPECT_TRUE(zero_over_cp);
  opt.max_cp = 2;  // `plan --max-cp 2`
  std::set<int> cps;
  for (const Layout& l : enumerate_layouts(deck, opt)) cps.insert(l.cp);
  EXPECT_EQ(cps, (std::set<int>{1, 2}));
}

// The step of a cp layout: each rank computes 1/cp of every sequence's work (the products
// and kernels per token row, the causal attention balanced over the ring), the gradients are
// reduced over DP x CP, and the ring's transfers count where the attention tiles do not hide
// them: on a link too slow for the tiles every hop (a layer: cp - 1 forward; backward
// 2 (cp - 1) while the tiles run plus the last gradient hop), on a fast one that last hop
// alone. The memory is predict_memory's at that cp.
TEST(Plan, ContextParallelComputesASliceAndRingsTheRest) {
  model::ModelConfig cfg = tiny();
  cfg.seq_len = 256;
  Machine m = parse_machine(kMachine, "m.toml");
  Layout one;
  one.dp = 1, one.micro_batch_size = 2;  // global batch 4: 2 microbatches
  const StepPrediction p1 = predict(cfg, 4, one, m, true);
  Layout two = one;
  two.cp = 2;
  const StepPrediction p2 = predict(cfg, 4, two, m, true);
  // Half of every product, kernel and the causal attention, plus the ring's own copies at
  // kernel_bytes_per_s (1e10): a layer's forward packs K, V (2 kv) and merges the partial
  // outputs (3 q a step), its backward packs K, V and q, clears dq, clears and adds the
  // gradient block every step and unpacks dq, dk, dv (4 kv + 5 q + 4 kv a step);
  // kv = 2 x 2 x 128 x 64 floats, q = 2 x 128 x 64 floats, 4 layers x 2 microbatches.
  const double kv = 2.0 * 2 * 128 * 64 * 4, q = 2.0 * 128 * 64 * 4;
  const double copies = 4 * 2 * ((2 * kv + 3 * 2 * q) + (4 * kv + 5 * q + 4 * 2 * kv)) / 1e10;
  EXPECT_NEAR(p2.compute_s, p1.compute_s / 2 + copies, 1e-9 * p1.compute_s);
  EXPECT_EQ(p1.cp_comm_s, 0);
  EXPECT_EQ(p1.dp_exposed_s, 0);
  EXPECT_GT(p2.dp_exposed_s, 0);  // the gradients are reduced over the 2 CP ranks
  EXPECT_GT(p2.cp_comm_s, 0);
  EXPECT_NEAR(p2.step_s, p2.compute_s + p2.cp_comm_s + p2.dp_exposed_s + p2.optimizer_s +
                             p2.bubble_s, 1e-3 * p2.step_s);  // the simulator's slots
  EXPECT_DOUBLE_EQ(p2.tokens_per_s * p2.step_s, 4.0 * 256);  // the same tokens per step
  // A key/value block: 2 (K, V) x B 2 x T/cp 128 rows x nkv * hd = 64 floats.
  const double block = 2.0 * 2 * 128 * 64 * 4;
  const int layers = 4, microbatches = 2;
  m.intra.alpha_s = 0, m.intra.bytes_per_s = 1e3;  // slow: the tiles hide almost nothing
  const double slow_hop = block / 1e3;
  EXPECT_NEAR(predict(cfg, 4, two, m, true).cp_comm_s,
              layers * microbatches * (1 + 2 + 1) * slow_hop, 1e-3 * slow_hop);
  m.intra.bytes_per_s = 1e15;  // fast: every hop but the last gradient one hidden
  EXPECT_NEAR(predict(cfg, 4, two, m, true).cp_comm_s,
              layers * microbatches * block / 1e15, 1e-9 * block / 1e15);
  // Full recomputation runs the ring's forward again in the backward.
  m.intra.bytes_per_s = 1e3;
  Layout rc = two;
  rc.recompute = model::Recompute::full;
  EXPECT_NEAR(predict(cfg, 4, rc, m, true).cp_comm_s,
              layers * microbatches * (1 + 2 + 1 + 1) * slow_hop, 1e-3 * slow_hop);

  model::MemoryLayout ml;
  ml.cp = 2, ml.micro_batch = 2;
  pipeline::set_schedule_memory(ml, pipeline::make_schedule("1f1b", 1, 1, 2), 0);
  EXPECT_EQ(p2.rank0_peak_bytes, model::predict_memory(cfg, ml).peak());
  EXPECT_GT(p2.memory.ring, 0);
  EXPECT_EQ(p2.memory.collectives, p2.memory.gradients);  // dp 1, cp 2: the buckets in flight
  EXPECT_LT(p2.memory.activations, p1.memory.activations);
}

// A long sequence on 4 ranks with one sequence per step (no data parallelism to spread it):
// under a memory limit between the smallest cp = 1 layout and the smallest cp > 1 one, the
// planner's choice splits the sequence, and no cp = 1 layout is said to fit.
TEST(Plan, LongSequencesThatFitOnlySplitAreContextParallel) {
  train::Config deck = train::parse_config(
      "[model]\narch = \"llama\"\nvocab_size = 256\nseq_len = 16384\nn_layer = 2\n"
      "n_head = 8\nn_kv_head = 2\nd_model = 256\n"
      "[train]\nglobal_batch_size = 1\n[parallel]\nmicro_batch_size = 1\n", "deck.toml");
  Machine m = parse_machine(kMachine, "m.toml");
  m.memory_gib = 1000;
  PlanOptions opt;
  opt.ranks_per_node = 4;
  std::int64_t least_whole = std::numeric_limits<std::int64_t>::max(), least_split = least_whole;
  for (const StepPrediction& p : make_plan(deck, m, opt))
    (p.layout.cp == 1 ? least_whole : least_split) =
        std::min(p.layout.cp == 1 ? least_whole : least_split, p.memory.peak());
  std::printf("seq_len 16384 on 4 ranks: the smallest peak at cp 1 %s, at cp > 1 %s\n",
              model::format_bytes(least_whole).c_str(), model::format_bytes(least_split).c_str());
  ASSERT_LT(least_split, least_whole);
  m.memory_gib = double(least_split + least_whole) / 2 / 1073741824.0;
  const std::vector<StepPrediction> tight = make_plan(deck, m, opt);
  ASSERT_FALSE(tight.empty());
  EXPECT_TRUE(tight.front().fits);
  EXPECT_GT(tight.front().layout.cp, 1) << tight.front().layout.str();
  std::printf("under %s: %s, %s\n", model::format_bytes(m.memory_bytes()).c_str(),
              tight.front().layout.str().c_str(), tight.front().memory.describe().c_str());
  for (const StepPrediction& p : tight)
    if (p.layout.cp == 1) EXPECT_FALSE(p.fits) << p.layout.str();
  EXPECT_EQ(with_layout(deck, tight.front().layout).parallel.cp, tight.front().layout.cp);
}

// The asynchronous schedules run 1F1B's lists, drained at each step's end: pipedream-2bw's
// step is 1F1B's (one update per step; its second weight version is not a second
// gradient to reduce), pipedream's adds an optimizer update and a DP reduction after every
// backward on the rank's timeline (m of each per step).
TEST(Plan, AsynchronousSchedulesAreOneFOneBWithTheirUpdates) {
  const model::ModelConfig cfg = tiny();
  Machine m = parse_machine(kMachine, "m.toml");
  Layout l;
  l.pp = 2, l.dp = 2, l.micro_batch_size = 1;
  const StepPrediction flush = predict(cfg, 16, l, m, true);  // m = 8
  l.schedule = "pipedream-2bw";
  const StepPrediction two = predict(cfg, 16, l, m, true);
  EXPECT_GT(two.memory.weights, flush.memory.weights);  // the second version
  EXPECT_DOUBLE_EQ(two.step_s, flush.step_s);
  EXPECT_DOUBLE_EQ(two.dp_exposed_s, flush.dp_exposed_s);
  l.schedule = "pipedream";
  const StepPrediction per_mb = predict(cfg, 16, l, m, true);
  EXPECT_NEAR(per_mb.optimizer_s, 8 * flush.optimizer_s, 1e-12);
  EXPECT_GT(per_mb.dp_exposed_s, 7 * flush.dp_exposed_s);
  EXPECT_GE(per_mb.step_s, flush.step_s + 7 * flush.optimizer_s);
  // The parts add up to the step (the updates are not counted as bubble).
  EXPECT_NEAR(per_mb.step_s, per_mb.compute_s + per_mb.tp_comm_s + per_mb.bubble_s +
                                 per_mb.dp_exposed_s + per_mb.optimizer_s + per_mb.embed_sync_s,
              1e-9);
}

TEST(Plan, MemoryIsTheStartupReportsPrediction) {
  const model::ModelConfig cfg = tiny();
  Machine m = parse_machine(kMachine, "m.toml");
  Layout l;
  l.pp = 2, l.dp = 1, l.micro_batch_size = 2, l.schedule = "gpipe";
  const StepPrediction p = predict(cfg, 8, l, m, true);
  model::MemoryLayout ml;
  ml.pp = 2, ml.pp_rank = 0, ml.micro_batch = 2;
  pipeline::set_schedule_memory(ml, pipeline::make_schedule("gpipe", 2, 1, 4), 0);
  EXPECT_EQ(ml.peak_stash, 4);  // gpipe: all 4 in flight
  EXPECT_GE(ml.message_buffers, 2);
  EXPECT_EQ(p.rank0_peak_bytes, model::predict_memory(cfg, ml).peak());
  EXPECT_EQ(model::predict_memory(cfg, ml).messages,
            ml.message_buffers * 2 * 64 * 64 * 4);  // a [mb, T, C] boundary tensor each
  // Plus the libraries' working memory (the machine file's), on host ranks and on a device.
  m.library_mib = 3;
  EXPECT_EQ(predict(cfg, 8, l, m, true).rank0_peak_bytes, p.rank0_peak_bytes + 3 * 1048576);
  model::MemoryLayout on_device = ml;
  on_device.host_memory = false;
  EXPECT_EQ(predict(cfg, 8, l, m, false).rank0_peak_bytes,
            model::predict_memory(cfg, on_device).peak() + 3 * 1048576);
  m.library_mib = 0;
  // HDF5's metadata cache of each file world rank 0 holds open (host memory only).
  const OpenFiles files{3, 2};
  EXPECT_EQ(predict(cfg, 8, l, m, true, ops::Precision::fp32, files).rank0_peak_bytes,
            p.rank0_peak_bytes + 3 * model::kHdf5FileBytes);
  EXPECT_EQ(predict(cfg, 8, l, m, false, ops::Precision::fp32, files).memory.files, 0);
  // MPI's temporaries of the DP buckets in flight (CPU ranks, dp > 1): ratio x gradient bytes.
  m.nonblocking_temp_ratio = 1;
  EXPECT_EQ(predict(cfg, 8, l, m, true).rank0_peak_bytes, p.rank0_peak_bytes);  // dp 1
  Layout dp2;
  dp2.dp = 2, dp2.micro_batch_size = 2;
  const StepPrediction with_temp = predict(cfg, 8, dp2, m, true);
  EXPECT_EQ(with_temp.memory.collectives, with_temp.memory.gradients);
  EXPECT_EQ(with_temp.memory.libraries, 0);
  m.nonblocking_temp_ratio = 0;
  EXPECT_EQ(predict(cfg, 8, dp2, m, true).rank0_peak_bytes,
            with_temp.rank0_peak_bytes - with_temp.memory.gradients);
  // ZeRO-1 reduce-scatters the same buckets: the temporaries are the whole gradient's, not the
  // shard's (gradients counts the shard's copy on top).
  m.nonblocking_temp_ratio = 1;
  Layout z1 = dp2;
  z1.zero_stage = 1;
  const StepPrediction zero1 = predict(cfg, 8, z1, m, true);
  EXPECT_EQ(zero1.memory.collectives, zero1.memory.weights);
  // The start-up report's figure (predict_memory with the default ratio) is plan's, less the
  // libraries, when the machine file has the default ratio.
  model::MemoryLayout ml_z1 = ml;
  ml_z1.pp = 1, ml_z1.dp = 2, ml_z1.micro_batch = 2, ml_z1.zero1 = true;
  ml_z1.message_buffers = 0;  // no pipeline
  ml_z1.peak_stash = zero1.memory.activations / zero1.memory.activations_per_microbatch;
  EXPECT_EQ(model::predict_memory(cfg, ml_z1).peak(), zero1.rank0_peak_bytes);
  m.nonblocking_temp_ratio = 0;
  // Full recomputation trades memory for time.
  Layout rc = l;
  rc.recompute = model::Recompute::full;
  const StepPrediction q = predict(cfg, 8, rc, m, true);
  EXPECT_LT(q.memory.activations, p.memory.activations);
  EXPECT_GT(q.compute_s, p.compute_s);
}

// runtime.precision = "bf16" on a device: the plan predicts what the start-up report does
// (Trainer: MemoryLayout::set_precision, the rule GptChunk stores its stash by): the layers'
// stash at 2 bytes an element, the backend's bf16 product scratch, the cuBLAS workspace.
TEST(Plan, Bf16DeviceDeckIsTheStartupReports) {
  train::Config deck = train::parse_config(
      "[model]\nvocab_size = 256\nseq_len = 64\nn_layer = 4\nn_head = 4\nd_model = 64\n"
      "[parallel]\npp = 2\nmicro_batch_size = 2\nschedule = \"gpipe\"\n"
      "[train]\nglobal_batch_size = 8\n[runtime]\ndevice = \"cuda\"\nprecision = \"bf16\"\n",
      "deck.toml");
  Machine m = parse_machine(kMachine, "m.toml");
  m.library_mib = 32;
  PlanOptions opt;
  opt.ranks_per_node = 2;
  opt.host_memory = deck.runtime.device != "cuda";
  opt.precision = deck.runtime.precision.get();
  ASSERT_FALSE(opt.host_memory);
  Layout l;
  l.pp = 2, l.dp = 1, l.micro_batch_size = 2, l.schedule = "gpipe";
  const std::vector<StepPrediction> plan = make_plan(deck, m, opt);
  const auto it = std::find_if(plan.begin(), plan.end(),
                               [&](const StepPrediction& p) { return p.layout.str() == l.str(); });
  ASSERT_NE(it, plan.end());
  // The report of world rank 0 (Trainer's MemoryLayout): gpipe stashes all 4 microbatches.
  model::MemoryLayout report;
  report.pp = 2, report.pp_rank = 0, report.micro_batch = 2;
  pipeline::set_schedule_memory(report, pipeline::make_schedule("gpipe", 2, 1, 4), 0);
  report.host_memory = false;
  report.set_precision(ops::Precision::bf16);
  EXPECT_TRUE(report.bf16_activations);
  EXPECT_TRUE(report.bf16_products);
  EXPECT_EQ(report.bf16_activations,
            model::stores_bf16(ops::Precision::bf16, model::Recompute::none));
  model::MemoryEstimate e = model::predict_memory(tiny(), report);
  e.libraries = 32 * 1048576;  // the cuBLAS workspace the arena holds before the model
  EXPECT_EQ(it->rank0_peak_bytes, e.peak());
  // Not the fp32 prediction: the stash is about half, the product scratch is there.
  model::MemoryLayout fp32 = report;
  fp32.bf16_activations = fp32.bf16_products = false;
  const model::MemoryEstimate f = model::predict_memory(tiny(), fp32);
  EXPECT_LT(e.activations, f.activations * 3 / 4);
  EXPECT_GT(e.scratch, f.scratch);
  // With recomputation the stash stays fp32 (GptChunk packs only without it); the products
  // still convert their inputs.
  Layout rc = l;
  rc.recompute = model::Recompute::full;
  report.recompute = model::Recompute::full;
  report.set_precision(ops::Precision::bf16);
  EXPECT_FALSE(report.bf16_activations);
  EXPECT_TRUE(report.bf16_products);
  model::MemoryEstimate r = model::predict_memory(tiny(), report);
  r.libraries = 32 * 1048576;
  EXPECT_EQ(predict(tiny(), 8, rc, m, false, ops::Precision::bf16).rank0_peak_bytes, r.peak());
}

TEST(Plan, PipelineBubbleShrinksWithMicrobatches) {
  const model::ModelConfig cfg = tiny();
  Machine m = parse_machine(kMachine, "m.toml");
  Layout l;
  l.pp = 4, l.dp = 1, l.micro_batch_size = 1;
  const StepPrediction few = predict(cfg, 4, l, m, true), many = predict(cfg, 32, l, m, true);
  EXPECT_GT(few.bubble_fraction, many.bubble_fraction);
  // 1F1B with equal f and b: (p-1)/(m+p-1) = 3/7 at m = 4 (TP-free, p2p adds a little).
  EXPECT_NEAR(few.bubble_fraction, 3.0 / 7.0, 0.08);
}

TEST(Plan, SharedCoresShrinkTheBubbleNotTheWork) {
  const model::ModelConfig cfg = tiny();
  Machine m = parse_machine(kMachine, "m.toml");
  Layout l;
  l.pp = 2, l.dp = 1, l.micro_batch_size = 1, l.schedule = "naive";
  const StepPrediction dedicated = predict(cfg, 4, l, m, true);
  EXPECT_GT(dedicated.bubble_s, 0.3 * dedicated.step_s);  // naive: one stage at a time
  m.solo_speedup = 2;  // a waiting rank gives its core to the other
  const StepPrediction shared = predict(cfg, 4, l, m, true);
  EXPECT_LT(shared.step_s, dedicated.step_s);
  EXPECT_GE(shared.step_s, shared.compute_s);
  m.solo_speedup = 100;  // never below the rank's own work
  EXPECT_NEAR(predict(cfg, 4, l, m, true).bubble_s, 0.0, 1e-9);
}

TEST(Calibrate, ShapesAreTheCostModels) {
  const auto s = linear_shapes(tiny(), 2, 4);
  ASSERT_EQ(s.size(), 15u);
  // q|k|v at tp 2: forward (n, 3C/2, C), input gradient (n, C, 3C/2), weight (C, 3C/2, n).
  EXPECT_EQ(s[0], (std::array<std::int64_t, 3>{256, 96, 64}));
  EXPECT_EQ(s[1], (std::array<std::int64_t, 3>{256, 64, 96}));
  EXPECT_EQ(s[2], (std::array<std::int64_t, 3>{64, 96, 256}));
  // A cp rank's linears take micro_batch * seq_len / cp rows.
  const auto c = linear_shapes(tiny(), 2, 1, 4);
  EXPECT_EQ(c[0], (std::array<std::int64_t, 3>{16, 96, 64}));
  EXPECT_EQ(c[2], (std::array<std::int64_t, 3>{64, 96, 16}));
}

}  // namespace
}  // namespace trident::plan
