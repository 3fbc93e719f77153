// Schedule generators (see trident/pipeline/schedule.hpp). Each generator is a function of
// (pp, vpp, m, rank) alone, so every rank computes every rank's list the same way.
#include "trident/pipeline/schedule.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "trident/core/error.hpp"

namespace trident::pipeline {

std::string Action::str() const {
  const char* t = type == ActionType::F ? "F" : type == ActionType::B ? "B" : "W";
  std::string s = t + std::to_string(mb);
  if (chunk != 0) s += "." + std::to_string(chunk);
  return s;
}

namespace {

constexpr ActionType F = ActionType::F, B = ActionType::B, W = ActionType::W;

// Naive model parallelism: a microbatch goes forward and backward through all stages before
// the next one enters. Every rank runs F0 B0 F1 B1 ...; F1 on stage 0 waits for B0 there,
// which waits for B0 on every later stage, so no two stages ever overlap.
std::vector<Action> naive_stage(int m) {
  std::vector<Action> a;
  for (int i = 0; i < m; ++i) {
    a.push_back({F, i, 0});
    a.push_back({B, i, 0});
  }
  return a;
}

// GPipe: all forwards, then all backwards (in the same microbatch order).
std::vector<Action> gpipe_stage(int m) {
  std::vector<Action> a;
  for (int i = 0; i < m; ++i) a.push_back({F, i, 0});
  for (int i = 0; i < m; ++i) a.push_back({B, i, 0});
  return a;
}

// PipeDream-Flush 1F1B: (pp - stage - 1) warm-up forwards, then one forward one backward,
// then the cool-down backwards.
std::vector<Action> one_f_one_b_stage(int pp, int stage, int m) {
  std::vector<Action> a;
  const int warmup = std::min(m, pp - stage - 1);
  int f = 0, b = 0;
  for (; f < warmup; ++f) a.push_back({F, f, 0});
  while (f < m) {
    a.push_back({F, f++, 0});
    a.push_back({B, b++, 0});
  }
  while (b < m) a.push_back({B, b++, 0});
  return a;
}

// Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_interleaving). The k-th
// forward of a rank takes microbatches in groups of pp per chunk: chunk (k mod pp*vpp) / pp,
// microbatch (k / (pp*vpp)) * pp + k mod pp; the k-th backward walks the chunks in reverse.
// Warm-up is Megatron's (pp - rank - 1) * 2 + (vpp - 1) * pp forwards. Without
// communication cost, (pp - rank - 1) warm-up forwards would give the same bubble with
// fewer live activations; the doubled warm-up is the slack Megatron keeps for p2p latency.
std::vector<Action> interleaved_stage(int pp, int vpp, int rank, int m) {
  const int total = m * vpp, group = pp * vpp;
  auto forward = [&](int k) {
    return Action{F, (k / group) * pp + k % pp, (k % group) / pp};
  };
  auto backward = [&](int k) {
    return Action{B, (k / group) * pp + k % pp, vpp - 1 - (k % group) / pp};
  };
  const int warmup = std::min(total, (pp - rank - 1) * 2 + (vpp - 1) * pp);
  std::vector<Action> a;
  for (int k = 0; k < warmup; ++k) a.push_back(forward(k));
  for (int i = 0; i < total - warmup; ++i) {
    a.push_back(forward(warmup + i));
    a.push_back(backward(i));
  }
  for (int k = total - warmup; k < total; ++k) a.push_back(backward(k));
  return a;
}

// Breadth-first looping: every microbatch through chunk 0, then through chunk 1, ...; then
// the backwards from the last chunk down. GPipe's order per chunk, so it holds all m * vpp
// chunk activations at the peak, and its bubble is (p-1)/(v*m+p-1) once m >= pp.
std::vector<Action> looped_bfs_stage(int vpp, int m) {
  std::vector<Action> a;
  for (int c = 0; c < vpp; ++c)
    for (int i = 0; i < m; ++i) a.push_back({F, i, c});
  for (int c = vpp - 1; c >= 0; --c)
    for (int i = 0; i < m; ++i) a.push_back({B, i, c});
  return a;
}

// ZB-H1: the 1F1B order of F and B (B = input gradient only), with a W after a B once the
// stage has `stage` W's outstanding. Deferring W lets each B go upstream after one B time
// instead of B + W, which shrinks the warm-up and cool-down waits from (p-1)(F+B+W) to
// (p-1)(F+B-W) per stage; the deferred W's fill the cool-down. Stage r then holds up to
// (pp - r - 1) + 1 + r = pp activations (live until W), the first stage's 1F1B peak, so
// the most loaded stage holds no more than under 1F1B.
std::vector<Action> zb_h1_stage(int pp, int stage, int m) {
  std::vector<Action> a;
  const int warmup = std::min(m, pp - stage - 1);
  const int deferred = stage;
  int f = 0, b = 0, w = 0;
  auto backward = [&] {
    a.push_back({B, b++, 0});
    if (b - w > deferred) a.push_back({W, w++, 0});
  };
  for (; f < warmup; ++f) a.push_back({F, f, 0});
  while (f < m) {
    a.push_back({F, f++, 0});
    backward();
  }
  while (b < m) backward();
  while (w < m) a.push_back({W, w++, 0});
  return a;
}

// ZB-V (Qi et al. 2024; the order of PyTorch's ScheduleZBVZeroBubble), V placement: chunk 0
// of rank r is virtual stage r, chunk 1 is 2 pp - 1 - r, so rank pp - 1 turns the
// microbatches around and rank 0 holds both ends. The list is built for
// n = max(m, 2 pp - 1) microbatches (the steady phase needs that many in flight) and the
// microbatches >= m are dropped afterwards: removing a microbatch from every rank leaves an
// order that still runs (its slots become idle). Phases of rank r:
//   warm-up  2 (pp - r) - 1 forwards of chunk 0; r pairs (F chunk 1, F chunk 0); pp - r
//            triples F B W of chunk 1 (rank pp - 1's chunk 1 follows its own chunk 0);
//   steady   F B W of chunk 0 (no F once the n forwards are done), then F B W of chunk 1,
//            while chunk 0 has forwards left or chunk 1 lags behind it;
//   cool-down r pairs (B chunk 0, B chunk 1), then pp - r pairs (B chunk 0, W chunk 0),
//            then the W's still owed, chunk 1's first: they fill the tail.
// Rank r holds at most 2 (pp - r) - 1 + r chunk-0 activations and r + 1 chunk-1 ones (live
// until W): 2 pp on every rank once m >= 2 pp - 1, i.e. pp whole stages, 1F1B's peak on its
// first stage (fewer microbatches: fewer, and never more than 1F1B's most loaded stage).
std::vector<Action> zb_v_stage(int pp, int rank, int m) {
  const int n = std::max(m, 2 * pp - 1);
  std::vector<Action> a;
  int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  auto push = [&](ActionType t, int mb, int chunk) {
    if (mb < m) a.push_back({t, mb, chunk});
  };
  for (int i = 0; i < 2 * (pp - rank) - 1; ++i) push(F, f0++, 0);
  for (int i = 0; i < rank; ++i) {
    push(F, f1++, 1);
    push(F, f0++, 0);
  }
  for (int i = 0; i < pp - rank; ++i) {
    push(F, f1++, 1);
    push(B, b1, 1);
    push(W, b1++, 1);
  }
  while (f1 < f0 || f0 < n) {
    if (f0 < n) push(F, f0++, 0);
    push(B, b0, 0);
    push(W, b0++, 0);
    push(F, f1++, 1);
    push(B, b1, 1);
    push(W, b1++, 1);
  }
  int w0 = b0, w1 = b1;
  for (int i = 0; i < rank; ++i) {
    push(B, b0++, 0);
    push(B, b1++, 1);
  }
  for (int i = 0; i < pp - rank; ++i) {
    push(B, b0++, 0);
    push(W, w0++, 0);
  }
  while (w1 < b1) push(W, w1++, 1);
  while (w0 < b0) push(W, w0++, 0);
  return a;
}

}  // namespace

const std::vector<ScheduleKind>& schedule_kinds() {
  // clang-format off
  static const std::vector<ScheduleKind> kinds = {
      // name               chunks  whole groups  one rank's actions
      {"naive",            false, false, [](int, int, int, int m) { return naive_stage(m); }},
      {"gpipe",            false, false, [](int, int, int, int m) { return gpipe_stage(m); }},
      {"1f1b",             false, false, [](int pp, int, int r, int m) { return one_f_one_b_stage(pp, r, m); }},
      // vpp = 1 is Megatron without a virtual pipeline: plain 1F1B.
      {"interleaved-1f1b", true,  true,  [](int pp, int vpp, int r, int m) {
         return vpp == 1 ? one_f_one_b_stage(pp, r, m) : interleaved_stage(pp, vpp, r, m); }},
      {"looped-bfs",       true,  false, [](int, int vpp, int, int m) { return looped_bfs_stage(vpp, m); }},
      {"zb-h1",            false, false, [](int pp, int, int r, int m) { return zb_h1_stage(pp, r, m); }},
      // Two chunks per rank in a V (core/placement.hpp), vpp = 2 only.
      {"zb-v",             true,  false, [](int pp, int, int r, int m) { return zb_v_stage(pp, r, m); },
       WeightUpdate::flush, Placement::v_shape, 2},
      // Asynchronous: the 1F1B order within a window; the rule is the trainer's.
      {"pipedream",        false, false, [](int pp, int, int r, int m) { return one_f_one_b_stage(pp, r, m); },
       WeightUpdate::per_microbatch},
      {"pipedream-2bw",    false, false, [](int pp, int, int r, int m) { return one_f_one_b_stage(pp, r, m); },
       WeightUpdate::delayed},
  };
  // clang-format on
  return kinds;
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const ScheduleKind& k : schedule_kinds()) n.push_back(k.name);
    return n;
  }();
  return names;
}

const ScheduleKind* find_schedule(const std::string& name) {
  for (const ScheduleKind& k : schedule_kinds())
    if (name == k.name) return &k;
  return nullptr;
}

std::vector<std::string> multi_chunk_schedule_names() {
  std::vector<std::string> n;
  for (const ScheduleKind& k : schedule_kinds())
    if (k.multi_chunk) n.push_back(k.name);
  return n;
}

ScheduleMisfit ScheduleKind::misfit(int pp, int vpp, int m) const {
  if (vpp > 1 && !multi_chunk) return ScheduleMisfit::chunks;
  if (fixed_vpp > 0 && vpp != fixed_vpp) return ScheduleMisfit::chunk_count;
  // Megatron's grouping of pp microbatches per chunk needs whole groups.
  if (m > 0 && vpp > 1 && whole_groups && m % pp != 0) return ScheduleMisfit::microbatches;
  return ScheduleMisfit::none;
}

Schedule make_schedule(const std::string& name, int pp, int vpp, int m) {
  const ScheduleKind* kind = find_schedule(name);
  TRIDENT_CHECK(kind, "unknown schedule '", name, "' (expected ", join_or(schedule_names()), ")");
  return make_schedule(*kind, pp, vpp, m);
}

Schedule make_schedule(const ScheduleKind& kind_ref, int pp, int vpp, int m) {
  const ScheduleKind* kind = &kind_ref;
  const std::string name = kind->name;
  TRIDENT_CHECK(pp >= 1 && vpp >= 1 && m >= 1, "schedule ", name, ": pp, vpp and microbatches "
                "must be positive (got ", pp, ", ", vpp, ", ", m, ")");
  const ScheduleMisfit misfit = kind->misfit(pp, vpp, m);
  TRIDENT_CHECK(misfit != ScheduleMisfit::chunks, "schedule ", name, " places one chunk per rank, "
                "so vpp must be 1 (got vpp = ", vpp, "); vpp > 1 needs ",
                join_or(multi_chunk_schedule_names()));
  TRIDENT_CHECK(misfit != ScheduleMisfit::chunk_count, "schedule ", name, " places exactly ",
                kind->fixed_vpp, " chunks per rank, so parallel.vpp must be ", kind->fixed_vpp,
                " (got vpp = ", vpp, ")");
  TRIDENT_CHECK(misfit != ScheduleMisfit::microbatches, "schedule ", name, " with vpp = ", vpp,
                " needs microbatches divisible by pp (got ", m, " microbatches, pp = ", pp, ")");
  Schedule s{name, pp, vpp, m, {}, kind->placement};
  for (int r = 0; r < pp; ++r) s.stages.push_back(kind->stage(pp, vpp, r, m));
  return s;
}

std::string join_or(const std::vector<std::string>& words, const char* quote) {
  std::string out;
  for (std::size_t i = 0; i < words.size(); ++i)
    out += std::string(i ? (i + 1 == words.size() ? " or " : ", ") : "") + quote + words[i] + quote;
  return out;
}

bool splits_weight_grad(const Schedule& s) {
  for (const auto& stage : s.stages)
    for (const auto& a : stage)
      if (a.type == ActionType::W) return true;
  return false;
}

int peak_activations(const std::vector<Action>& actions) {
  const bool split = std::any_of(actions.begin(), actions.end(),
                                 [](const Action& a) { return a.type == ActionType::W; });
  const ActionType frees = split ? ActionType::W : ActionType::B;
  std::map<std::pair<int, int>, bool> live_set;  // (mb, chunk) with a stashed activation
  int peak = 0;
  for (const auto& a : actions) {
    if (a.type == ActionType::F) live_set[{a.mb, a.chunk}] = true;
    if (a.type == frees) live_set.erase({a.mb, a.chunk});
    peak = std::max(peak, int(live_set.size()));
  }
  return peak;
}

int head_chunk_of(const Schedule& s, int rank) {
  const StageMap map = s.stage_map();
  const StageSlot head = map.slot(map.stages() - 1);
  return head.rank == rank ? head.chunk : -1;
}

bool head_gradient_waits(const std::vector<Action>& actions, std::size_t i, int head_chunk) {
  const Action& f = actions.at(i);
  if (f.type != ActionType::F || f.chunk != head_chunk) return false;
  return !(i + 1 < actions.size() && actions[i + 1] == Action{ActionType::B, f.mb, f.chunk});
}

int peak_head_gradients(const std::vector<Action>& actions, int head_chunk) {
  if (head_chunk < 0) return 0;
  std::set<int> waiting;  // microbatches whose head gradient is in a row, from F to B
  std::size_t peak = 0;
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (head_gradient_waits(actions, i, head_chunk)) waiting.insert(a.mb);
    if (a.type == ActionType::B && a.chunk == head_chunk) waiting.erase(a.mb);
    peak = std::max(peak, waiting.size());
  }
  return int(peak);
}

Placement placement_of(const std::string& name) {
  const ScheduleKind* kind = find_schedule(name);
  return kind ? kind->placement : Placement::round_robin;
}

WeightUpdate weight_update_of(const std::string& name) {
  const ScheduleKind* kind = find_schedule(name);
  return kind ? kind->update : WeightUpdate::flush;
}

int weight_versions(const std::vector<Action>& actions, WeightUpdate update) {
  if (update == WeightUpdate::flush) return 1;
  if (update == WeightUpdate::delayed) return 2;  // whatever the order inside the window
  std::map<int, int> version_of;  // microbatch between its F and B -> the version its F used
  int live = 0, peak = 1;
  auto held = [&] {
    std::set<int> v{live};
    for (const auto& [mb, ver] : version_of) v.insert(ver);
    return int(v.size());
  };
  for (const Action& a : actions) {
    if (a.type == ActionType::F) version_of[a.mb] = live;
    if (a.type != ActionType::B) continue;
    version_of.erase(a.mb);
    ++live;  // the update after the backward
    peak = std::max(peak, held());
  }
  return peak;
}

std::string format_actions(const std::vector<Action>& actions) {
  std::string out;
  for (const auto& a : actions) out += (out.empty() ? "" : " ") + a.str();
  return out;
}

std::vector<Action> parse_actions(const std::string& text) {
  std::istringstream in(text);
  std::vector<Action> out;
  for (std::string tok; in >> tok;) {
    const char t = tok[0];
    TRIDENT_CHECK(t == 'F' || t == 'B' || t == 'W', "bad action '", tok,
                  "' (expected F, B or W, a microbatch and an optional .chunk, like F3.1)");
    int mb = -1, chunk = 0;
    char rest = 0;
    const std::string body = tok.substr(1);
    const auto dot = body.find('.');
    std::istringstream mb_in(body.substr(0, dot));
    const bool mb_ok = bool(mb_in >> mb) && !(mb_in >> rest) && mb >= 0;
    bool chunk_ok = true;
    if (dot != std::string::npos) {
      std::istringstream chunk_in(body.substr(dot + 1));
      chunk_ok = bool(chunk_in >> chunk) && !(chunk_in >> rest) && chunk >= 0;
    }
    TRIDENT_CHECK(mb_ok && chunk_ok, "bad action '", tok,
                  "' (expected F, B or W, a microbatch and an optional .chunk, like F3.1)");
    out.push_back({t == 'F' ? ActionType::F : t == 'B' ? ActionType::B : ActionType::W, mb,
                   chunk});
  }
  return out;
}

}  // namespace trident::pipeline
