// Enumerating and ranking layouts (see trident/plan/planner.hpp).
#include "trident/plan/planner.hpp"

#include "trident/pipeline/schedule.hpp"

#include <algorithm>
#include <exception>
#include <set>

#include "trident/core/error.hpp"
#include "trident/train/trainer.hpp"

namespace trident::plan {

namespace {

std::vector<int> divisors(std::int64_t n) {
  std::vector<int> d;
  for (std::int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(int(i));
  return d;
}

}  // namespace

train::Config with_layout(const train::Config& deck, const Layout& l) {
  train::Config c = deck;
  static_cast<Layout&>(c.parallel) = l;
  return c;
}

// Not tp_mode or cp_mode: the planner's layouts keep their defaults (with_layout).
std::vector<std::pair<std::string, std::string>> layout_keys(const Layout& l) {
  auto quoted = [](const std::string& v) { return "\"" + v + "\""; };
  return {{"tp", str(l.tp)},
          {"pp", str(l.pp)},
          {"dp", str(l.dp)},
          {"cp", str(l.cp)},
          {"vpp", str(l.vpp)},
          {"schedule", quoted(l.schedule.word())},
          {"pipeline_layers", quoted(l.pipeline_layers)},
          {"micro_batch_size", str(l.micro_batch_size)},
          {"sequence_parallel", l.sequence_parallel ? "true" : "false"},
          {"zero_stage", str(l.zero_stage)},
          {"recompute", quoted(l.recompute.word())}};
}

std::string layout_deck_lines(const Layout& l) {
  std::string lines = "[parallel]\n";
  for (const auto& [key, value] : layout_keys(l)) lines += key + " = " + value + "\n";
  return lines;
}

std::vector<std::string> layout_set_lines(const Layout& l) {
  std::vector<std::string> sets;
  for (const auto& [key, value] : layout_keys(l)) sets.push_back("parallel." + key + "=" + value);
  return sets;
}

std::string memory_dominant(const model::MemoryEstimate& e) {
  const std::pair<std::int64_t, const char*> parts[] = {
      {e.weights, "weights"},         {e.gradients, "gradients"}, {e.optimizer, "optimizer"},
      {std::max(e.activations, e.staging), "activations"},
      {e.scratch + e.ring, "scratch"}};  // the ring attention's buffers are working memory too
  return std::max_element(std::begin(parts), std::end(parts))->second;
}

std::vector<std::pair<int, std::string>> schedule_candidates(
    int pp, int n_layer, const train::ScheduleChoice& deck_schedule) {
  std::vector<std::pair<int, std::string>> out;  // (vpp, schedule)
  if (pp == 1) return {{1, "1f1b"}};  // no pipeline: every schedule is the same step
  for (const pipeline::ScheduleKind& k : pipeline::schedule_kinds()) {
    // Asynchronous updates (PipeDream) change what is trained, not only how fast: a
    // Megatron user expects the plan to keep the serial run's semantics, so those are
    // candidates only when the deck already names one.
    if (k.asynchronous() && &k != &deck_schedule.kind()) continue;
    // A multi-chunk schedule at vpp = 1 repeats a one-chunk one (interleaved-1f1b is 1f1b):
    // planned with vpp > 1 only.
    if (!k.multi_chunk) {
      out.push_back({1, k.name});
      continue;
    }
    for (int v = 2; v <= 8; ++v)
      // virtual stages: even splits only; zb-v: vpp = 2 only (its misfit rule)
      if (n_layer % (pp * v) == 0 && k.misfit(pp, v, 0) == pipeline::ScheduleMisfit::none)
        out.push_back({v, k.name});
  }
  return out;
}

std::vector<std::string> split_candidates(const model::ModelConfig& cfg, int pp, int vpp, int tp,
                                          const train::ScheduleChoice& schedule) {
  const int stages = pp * vpp;
  if (cfg.n_layer % stages != 0) return {"auto"};  // "even" would be the balanced split too
  if (pp == 1) return {"even"};                      // one stage: nothing to move
  const std::vector<int> balanced =
      model::balanced_stage_layers(cfg, stages, tp, schedule->placement);
  const bool even = std::all_of(balanced.begin(), balanced.end(),
                                [&](int n) { return n == cfg.n_layer / stages; });
  if (even) return {"even"};
  return {"even", "auto"};
}

std::vector<int> cp_candidates(int seq_len, int ranks) {
  std::vector<int> out;
  for (int cp = 1; cp <= ranks; cp *= 2)
    if (ranks % cp == 0 && (cp == 1 || seq_len % (2 * cp) == 0)) out.push_back(cp);
  return out;
}

std::vector<Layout> enumerate_layouts(const train::Config& deck, const PlanOptions& opt) {
  const int world = opt.nodes * opt.ranks_per_node;
  const std::int64_t G = deck.train.global_batch_size;
  const model::ModelConfig& m = deck.model;
  std::vector<Layout> out;
  for (int tp : divisors(world)) {
    if (m.n_head % tp) continue;
    for (int cp : cp_candidates(m.seq_len, world / tp))
    for (int pp : divisors(world / (tp * cp))) {
      if ((opt.max_cp > 0 && cp > opt.max_cp) || cp < opt.min_cp) continue;
      // pp need not divide n_layer (the balanced split); every stage needs a layer.
      if (m.n_layer < pp) continue;
      const int dp = world / (tp * cp * pp);
      if (G % dp) continue;
      std::set<int> mbs_set{deck.parallel.micro_batch_size};
      for (int b = 1; b <= G / dp; b *= 2) mbs_set.insert(b);
      const std::vector<std::pair<int, std::string>> scheds =
          schedule_candidates(pp, m.n_layer, deck.parallel.schedule);
      for (int mbs : mbs_set) {
        if ((G / dp) % mbs) continue;
        for (const auto& [vpp, sched] : scheds)
          for (const std::string& split : split_candidates(m, pp, vpp, tp, sched))
          for (auto rc : {model::Recompute::none, model::Recompute::selective,
                          model::Recompute::full})
            for (bool sp : {false, true}) {
              if (sp && tp == 1) continue;
              for (bool zero : {false, true}) {
                if (zero && dp * cp == 1) continue;  // ZeRO-1 shards over DP x CP
                Layout l;
                l.tp = tp, l.cp = cp, l.pp = pp, l.dp = dp, l.vpp = vpp, l.schedule = sched;
                l.micro_batch_size = mbs, l.recompute = rc, l.sequence_parallel = sp;
                l.zero_stage = zero ? 1 : 0, l.pipeline_layers = split;
                // The deck's own validation decides what `trident train` would accept.
                try {
                  train::Config c = train::parse_config(train::to_toml(with_layout(deck, l)),
                                                        deck.source);
                  train::resolve_world(c, world);
                } catch (const Error&) {
                  continue;
                }
                out.push_back(l);
              }
            }
      }
    }
  }
  return out;
}

std::vector<StepPrediction> make_plan(const train::Config& deck, const Machine& machine,
                                      const PlanOptions& opt) {
  TRIDENT_CHECK(deck.model.vocab_size > 0, deck.source, ": plan needs model.vocab_size");
  Machine mc = machine;
  mc.ranks_per_node = opt.ranks_per_node;
  const OpenFiles files{train::files_held_open(deck, true), train::files_held_open(deck, false)};
  std::vector<StepPrediction> out;
  for (const Layout& l : enumerate_layouts(deck, opt)) {
    try {
      out.push_back(predict(deck.model, deck.train.global_batch_size, l, mc, opt.host_memory,
                            opt.precision, files));
    } catch (const Error&) {
      // A schedule that cannot be made for this microbatch count: not a layout.
    }
  }
  // Ties go to the smaller cp: context parallelism only where it fits or runs faster.
  std::stable_sort(out.begin(), out.end(), [](const StepPrediction& a, const StepPrediction& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits && a.step_s != b.step_s) return a.step_s < b.step_s;
    if (!a.fits && a.memory.peak() != b.memory.peak()) return a.memory.peak() < b.memory.peak();
    return a.layout.cp < b.layout.cp;
  });
  return out;
}

}  // namespace trident::plan
