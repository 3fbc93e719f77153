// trident/train/layout.hpp — the parallel layout of a run, one value: the grid, the virtual
// pipeline, the schedule, the layer split, the micro-batch, recomputation, SP, ZeRO and the
// TP and CP modes. The deck's [parallel] section holds it (train::Config::Parallel, its keys
// as parsed), the planner enumerates and ranks it (trident plan), and everything else is
// derived from it: the memory model's MemoryLayout (train::memory_layout), the grid
// (grid()), the planner's deck and --set lines (plan::layout_keys) and its one-line name
// (str()). Its choices are parsed once, when the deck is read (Choice, core/choice.hpp;
// ScheduleChoice), and printed back by one name each (word()).
// defines: trident::train::Layout, ScheduleChoice; the words of model::Recompute, TpMode,
//          CpMode and ops::Precision (choice_words)
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "trident/core/choice.hpp"
#include "trident/core/error.hpp"
#include "trident/model/stage_model.hpp"
#include "trident/model/ulysses_attention.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/grid.hpp"
#include "trident/pipeline/schedule.hpp"

namespace trident::model {

// The words of the choices the [parallel] section makes of other modules' enums, in the
// enum's namespace, where Choice (core/choice.hpp) finds them; in FORMAT.md's order.
inline const ChoiceWords<Recompute>& choice_words(Recompute) {
  static const ChoiceWords<Recompute> w = {
      {Recompute::none, "none"}, {Recompute::selective, "selective"}, {Recompute::full, "full"}};
  return w;
}
inline const ChoiceWords<TpMode>& choice_words(TpMode) {
  static const ChoiceWords<TpMode> w = {{TpMode::one_d, "1d"}, {TpMode::two_d, "2d"}};
  return w;
}
inline const ChoiceWords<CpMode>& choice_words(CpMode) {
  static const ChoiceWords<CpMode> w = {{CpMode::ring, "ring"}, {CpMode::ulysses, "ulysses"}};
  return w;
}

}  // namespace trident::model

namespace trident::ops {

inline const ChoiceWords<Precision>& choice_words(Precision) {
  static const ChoiceWords<Precision> w = {
      {Precision::fp32, "fp32"}, {Precision::tf32, "tf32"}, {Precision::bf16, "bf16"}};
  return w;
}

}  // namespace trident::ops

namespace trident::train {

// parallel.schedule: its entry in the schedule registry (pipeline::schedule_kinds), found
// once when the deck is read. Code asks the entry (->placement, ->update, ...); files and
// messages get its name (word(), <<).
class ScheduleChoice : public ChoiceKey {
 public:
  ScheduleChoice(const char* name) : kind_(parse(name)) {}         // NOLINT
  ScheduleChoice(const std::string& name) : kind_(parse(name)) {}  // NOLINT

  const pipeline::ScheduleKind& kind() const { return *kind_; }
  const pipeline::ScheduleKind* operator->() const { return kind_; }
  const char* word() const { return kind_->name; }

  std::vector<std::string> choices() const override { return pipeline::schedule_names(); }
  std::string current() const override { return word(); }
  void choose(const std::string& name) override { kind_ = parse(name); }

  bool operator==(const ScheduleChoice& o) const { return kind_ == o.kind_; }
  bool operator!=(const ScheduleChoice& o) const { return kind_ != o.kind_; }
  // Against a name: for tests and tools that read decks as text, not for code paths.
  friend bool operator==(const ScheduleChoice& c, const char* name) {
    return std::string(c.word()) == name;
  }
  friend std::ostream& operator<<(std::ostream& os, const ScheduleChoice& c) {
    return os << c.word();
  }

 private:
  static const pipeline::ScheduleKind* parse(const std::string& name) {
    const pipeline::ScheduleKind* k = pipeline::find_schedule(name);
    if (!k) fail("'", name, "' is not one of the schedules");
    return k;
  }
  const pipeline::ScheduleKind* kind_;
};

// The layout keys of [parallel] (FORMAT.md), with the deck's defaults. Set the grid by name
// (`l.tp = 2; l.pp = 4;`), never by position.
struct Layout {
  // The grid, in its rank order (tp fastest, then cp, dp, pp; parallel/grid.hpp).
  int tp = 1;
  // Context parallelism: each sequence split over cp ranks (model.seq_len divisible by
  // 2 * cp).
  int cp = 1;
  int dp = 0;  // 0: world size / (tp * cp * pp), filled in by resolve_world
  int pp = 1;
  int vpp = 1;  // model chunks per pipeline rank (interleaved-1f1b, looped-bfs, zb-v)
  ScheduleChoice schedule = "1f1b";
  // Layers per virtual stage: "even" (n_layer / (pp * vpp); "auto" where that does not
  // divide), "auto" (balanced by predicted cost, model::balanced_stage_layers) or a TOML
  // list of pp * vpp counts in virtual-stage order, kept as its text ("[1, 2, 2]").
  std::string pipeline_layers = "even";
  int micro_batch_size = 4;
  Choice<model::Recompute> recompute = model::Recompute::none;
  bool sequence_parallel = false;
  int zero_stage = 0;  // 0 | 1
  // "1d" (Megatron) | "2d" (SUMMA, tp = q*q; docs/tp2d.md)
  Choice<model::TpMode> tp_mode = model::TpMode::one_d;
  // How attention runs over the CP group: "ring" (ring attention) | "ulysses" (all-to-all
  // over heads; n_head / tp and the rank's kv heads divisible by cp).
  Choice<model::CpMode> cp_mode = model::CpMode::ring;

  // The grid's shape, for make_parallel_state.
  parallel::GridShape grid() const {
    parallel::GridShape g;
    g.tp = tp, g.cp = cp, g.dp = dp, g.pp = pp;
    return g;
  }
  bool zero1() const { return zero_stage == 1; }

  // "tp2 pp2 dp1 vpp1 1f1b mbs4 rc:none sp:0 zero:0 split:even" ("tp2 cp2 pp2 ..." where
  // cp > 1; trident plan's table)
  std::string str() const;

  bool operator==(const Layout& o) const;
  bool operator!=(const Layout& o) const { return !(*this == o); }
};

}  // namespace trident::train
