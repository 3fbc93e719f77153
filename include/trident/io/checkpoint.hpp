// trident/io/checkpoint.hpp — checkpoints (FORMAT.md): one file per checkpoint,
// <out_dir>/checkpoints/step-<NNNNNNNN>.h5, holding /model/<name>,
// /optimizer/exp_avg/<name> and /optimizer/exp_avg_sq/<name> (AdamW moments, same names
// and shapes), under PipeDream-2BW /previous_model/<name> (the older weight version the
// next step computes with), and root attributes format = "trident-checkpoint", format_version = 1,
// step, consumed_samples, seed, config (the resolved deck as TOML text) and the model
// attributes. Everything a bitwise resume needs: the data order and any RNG stream are
// functions of (seed, step), AdamW's bias correction of step.
// defines: trident::io::CheckpointState, checkpoint_path, write_checkpoint,
//          read_checkpoint, read_checkpoint_state, find_latest_checkpoint,
//          set_damaged_aside, prune_checkpoints
//
// Atomicity: a checkpoint is written as step-NNNNNNNN.h5.tmp, flushed and closed by every
// rank, then renamed by rank 0 (after a barrier). A crash leaves at worst a .tmp file,
// which no reader looks at; find_latest_checkpoint also skips a step-*.h5 that does not
// open or whose attributes are wrong (a truncated copy, a damaged disk). Each tensor
// carries a checksum (see tensor_io.hpp), verified when it is read.
//
// ZeRO-1: the moments are given as full local shards, indexed by the same specs as the
// parameters. A ZeRO-1 rank, which holds only a range of its moments, gathers them over its
// DP group first and keeps its range of what it reads (train/run.cpp, through
// GradSync::gather_full / scatter_full). (A per-rank flat range in this API would save the
// gather: the hyperslabs of a range are a few row pieces per block, and ShardRole would
// name the range's owner.)
#pragma once

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trident/io/shard_role.hpp"
#include "trident/model/spec.hpp"

namespace trident::io {

// The scalar state of a run at a checkpoint.
struct CheckpointState {
  std::int64_t step = 0;              // optimizer steps completed
  std::int64_t consumed_samples = 0;  // sequences drawn so far
  std::uint64_t seed = 0;             // train.seed
  std::string config;                 // the full resolved deck, TOML
  // AdamW updates taken (its bias correction): `step` less the steps skipped under
  // train.on_nonfinite = "skip". -1 when writing: the same as step. Attribute
  // `optimizer_steps`; a checkpoint without it has taken `step` updates.
  std::int64_t optimizer_steps = -1;
  // Read: whether the file holds /previous_model (a PipeDream-2BW run's W(t-1)).
  bool has_previous_params = false;
};

// <checkpoint_dir>/step-<8-digit step>.h5
std::string checkpoint_path(const std::string& checkpoint_dir, std::int64_t step);

// Writes checkpoint_path(checkpoint_dir, state.step) atomically, collectively over comm
// (MPI_COMM_NULL: one process): every rank gives its ShardSpecs, which index all of its
// flat buffers (parameters, both AdamW moments, and previous_params when not null:
// PipeDream-2BW's older weight version, /previous_model), and its role. Creates the
// directory. Returns the checkpoint's path.
std::string write_checkpoint(const std::string& checkpoint_dir, MPI_Comm comm,
                             const model::ModelConfig& cfg,
                             const std::vector<model::ShardSpec>& specs,
                             const CheckpointState& state, const float* params,
                             const float* exp_avg, const float* exp_avg_sq,
                             const ShardRole& role = {}, const float* previous_params = nullptr);

// Reads a checkpoint into any layout: this rank's shards of the parameters, and of the
// moments unless exp_avg / exp_avg_sq are nullptr, and of /previous_model into
// previous_params where both exist (has_previous_params says whether the file has it).
// Checks format, version, the model attributes against cfg, every tensor's presence, type,
// shape and checksum.
CheckpointState read_checkpoint(const std::string& path, MPI_Comm comm,
                                const model::ModelConfig& cfg,
                                const std::vector<model::ShardSpec>& specs, float* params,
                                float* exp_avg, float* exp_avg_sq, const ShardRole& role = {},
                                float* previous_params = nullptr);

// The scalar state alone (serial), after checking the format attributes and that the
// /model and /optimizer groups exist.
CheckpointState read_checkpoint_state(const std::string& path);

// The newest step-*.h5 in checkpoint_dir that opens and passes read_checkpoint_state (and
// whose `step` attribute matches its name); the others are skipped with a warning. None
// when the directory is missing or holds no usable checkpoint. Serial: call it on one
// rank and broadcast, or on every rank of a shared file system.
// set_damaged_aside: each skipped one is renamed (set_damaged_aside below), so that neither
// pruning nor a later save of the same step overwrites it.
std::optional<std::string> find_latest_checkpoint(const std::string& checkpoint_dir,
                                                  bool set_damaged_aside = false);

// Renames a damaged checkpoint to <path>.damaged (.damaged.1, ... when taken) with a
// warning that says why; returns the new name. Serial (rank 0).
std::string set_damaged_aside(const std::string& path, const std::string& why);

// Keeps the newest `keep` complete checkpoints (as find_latest_checkpoint judges them) and
// deletes every step-*.h5 and step-*.h5.tmp older than the oldest kept one; keep <= 0
// keeps everything. Returns the deleted paths. Serial (rank 0).
std::vector<std::string> prune_checkpoints(const std::string& checkpoint_dir, int keep);

}  // namespace trident::io
