// trident/core/placement.hpp — where the virtual stages of a pipeline live: the one place
// that answers "which virtual stage is chunk c of pipeline rank r" and "which rank and chunk
// hold virtual stage v". A schedule chooses its placement (pipeline::ScheduleKind); the
// lowering, the simulator, the layer split (model::chunk_layouts) and the tied-embedding
// group (parallel::make_parallel_state) all ask a StageMap. Plain arithmetic, in core so
// that model, parallel and pipeline can all read it.
//
// With pp ranks and vpp chunks per rank there are V = pp * vpp virtual stages:
//   round_robin  Megatron's: chunk c of rank r is virtual stage c * pp + r; the last
//                virtual stage (the LM head) is on rank pp - 1.
//   v_shape      zero-bubble V (Qi et al. 2024): even chunks run down the ranks, odd chunks
//                back up: chunk c of rank r is c * pp + r for even c, c * pp + pp - 1 - r
//                for odd c. With vpp = 2 (ZB-V): chunk 0 of rank r is r, chunk 1 is
//                2 pp - 1 - r, so rank 0 holds the embedding and the head.
// defines: trident::Placement, trident::StageSlot, trident::StageMap, placement_name
#pragma once

namespace trident {

enum class Placement { round_robin, v_shape };

inline const char* placement_name(Placement p) {
  return p == Placement::v_shape ? "v-shape" : "round-robin";
}

struct StageSlot {
  int rank = 0;   // pipeline rank
  int chunk = 0;  // chunk on that rank
};

struct StageMap {
  Placement placement = Placement::round_robin;
  int pp = 1, vpp = 1;

  int stages() const { return pp * vpp; }
  // Virtual stage of chunk `chunk` on pipeline rank `rank`.
  int virtual_stage(int rank, int chunk) const {
    const bool back_up = placement == Placement::v_shape && chunk % 2 == 1;
    return chunk * pp + (back_up ? pp - 1 - rank : rank);
  }
  // Rank and chunk that hold virtual stage v.
  StageSlot slot(int v) const {
    const int chunk = v / pp, pos = v % pp;
    const bool back_up = placement == Placement::v_shape && chunk % 2 == 1;
    return {back_up ? pp - 1 - pos : pos, chunk};
  }
  int rank_of(int v) const { return slot(v).rank; }
  // The ranks that hold the embedding (virtual stage 0) and the head (virtual stage V - 1).
  int embedding_rank() const { return rank_of(0); }
  int head_rank() const { return rank_of(stages() - 1); }
};

}  // namespace trident
