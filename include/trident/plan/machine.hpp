// trident/plan/machine.hpp — a machine as the planner sees it (docs/FORMAT.md, "Machine
// files"): what one rank computes per second and what its links cost, read from a TOML file
// that `trident calibrate` writes or that ships in input/machines/ from published figures.
//   [machine]  name, ranks_per_node, memory_gib (per rank), peak_flops (per rank: what MFU
//              divides by)
//   [compute]  gemm_flops (sustained matrix-product rate at large shapes), attention_flops
//              (the attention core, forward and backward), kernel_bytes_per_s (memory-bound
//              kernels: norms, GELU, softmax, AdamW), [[compute.gemm]] measured shapes,
//              solo_speedup (optional, default 1: how much faster one rank computes while
//              the other ranks of its node wait; > 1 where ranks share cores)
//   [intra], [inter]  links inside a node / between nodes: alpha_s (latency per message
//              or ring step), bytes_per_s (bus bandwidth per rank, nccl-tests' "busbw") of
//              the collectives; optionally p2p_alpha_s, p2p_bytes_per_s of one send
//              (pipeline stages), else the collective figures
// Every figure must be present, finite and > 0 (alpha_s >= 0); a file that is not says
// which key, in one line.
// defines: trident::plan::Link, GemmRate, Machine, load_machine, parse_machine, machine_toml
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trident/model/memory.hpp"

namespace trident::plan {

struct Link {
  double alpha_s = 0;     // seconds per message (per step of a ring)
  double bytes_per_s = 0; // bus bandwidth per rank
  // Point-to-point (pipeline sends), when measured apart (0: the collective figures).
  double p2p_alpha_s = 0, p2p_bytes_per_s = 0;
  // Time of one point-to-point message of `bytes`.
  double p2p_time(double bytes) const {
    return p2p_bytes_per_s > 0 ? p2p_alpha_s + bytes / p2p_bytes_per_s
                               : alpha_s + bytes / bytes_per_s;
  }
};

// A measured matrix product: C[m,n] = A[m,k] B[k,n] at `flops_per_s`.
struct GemmRate {
  std::int64_t m = 0, n = 0, k = 0;
  double flops_per_s = 0;
};

struct Machine {
  std::string name;
  std::string source;  // the file it came from (messages)
  int ranks_per_node = 1;
  double memory_gib = 0;
  double peak_flops = 0;
  // Memory per rank the libraries hold beyond trident's buffers, added to every predicted
  // peak: on CPU ranks the host memory OpenBLAS and MPI touch in a step (calibrate measures
  // it), on a device the backend's own arena blocks (the cuBLAS workspace; calibrate reads
  // the arena). Optional, default 0.
  double library_mib = 0;
  // Bytes MPI's non-blocking collectives hold per byte in flight (calibrate measures it; Open
  // MPI's libnbc: one temporary copy of each in-place allreduce or reduce-scatter, 1.0): the
  // DP gradient buckets, all in flight at once at the end of a step, so a CPU rank with
  // dp > 1 holds this times its gradient bytes more. Optional, default model::kNonblockingTempRatio
  // (what `trident train`'s start-up report counts).
  double nonblocking_temp_ratio = model::kNonblockingTempRatio;
  // The same for the reduce-scatters of ZeRO-1 over 3 or more ranks (libnbc: two temporaries,
  // 2.0; calibrate measures it where it runs on 3 or more ranks). Optional, default
  // model::kReduceScatterTempRatio.
  double reduce_scatter_temp_ratio = model::kReduceScatterTempRatio;
  double gemm_flops = 0;
  double attention_flops = 0;
  double kernel_bytes_per_s = 0;
  double solo_speedup = 1;
  std::vector<GemmRate> gemms;  // measured shapes (calibrate); may be empty
  Link intra, inter;

  std::int64_t memory_bytes() const { return std::int64_t(memory_gib * 1073741824.0); }
  std::int64_t library_bytes() const { return std::int64_t(library_mib * 1048576.0); }
  // The rate of a product of this shape: the measured entry of the same shape, else the
  // entry with the nearest flop count within 2x whose smallest side is within 2x, else
  // gemm_flops.
  double gemm_rate(std::int64_t m, std::int64_t n, std::int64_t k) const;
};

// Reads and validates a machine file; an Error names the file and the key.
Machine load_machine(const std::string& path);
Machine parse_machine(const std::string& toml_text, const std::string& source_name);
// The machine as TOML (what calibrate writes); parse_machine(machine_toml(m)) == m's figures.
std::string machine_toml(const Machine& m, const std::string& header_comment = "");

}  // namespace trident::plan
