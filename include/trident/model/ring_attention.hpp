// trident/model/ring_attention.hpp — causal attention over a context-parallel (CP) group
// (ring attention with Megatron's load-balanced split; docs/context_parallel.md). A sequence of
// T tokens is cut into 2·cp chunks of T/(2·cp); CP rank r holds chunks r and 2·cp−1−r, in
// that order, as its local t = T/cp rows. The forward passes the key/value blocks around the ring
// (rank r sends to r+1) while attending to the block already held, and merges the partial
// results through their log-sum-exps; the backward passes the same blocks again, their key/value
// gradients travelling one hop behind and ending at their owner; dq stays local.
// Under bf16_exact (Ops::BlockAttention: the CUDA bf16 block's hook) the key/value blocks travel
// as bf16 (its operands are bf16 values) and so does each key/value gradient's last hop (its
// owner only copies it to dk, dv, which the caller rounds to bf16); the partial gradients,
// summed hop by hop, stay fp32: the same results, bit for bit, for 5/8 of the bytes at cp 2
// (towards 2/3 at large cp). Made for bf16 (the CUDA bf16 block's default: forward_bf16 /
// backward_bf16 below) it works on the bf16 tensors themselves: the same messages, partials
// rounded to bf16 (within bf16's noise, not bit for bit), half a key/value block less.
// Every ring counts, always (a clock read around each wait), the time its calls take, the
// part of it blocked waiting for the ring's messages, and the bytes it sends: per ring and
// summed over the process (RingAttention::Stats), which the end-of-run report prints.
// defines: trident::model::cp_local_positions, check_cp_attention_shape, RingAttention
//          (and uses ops::cp_chunk, ops::CpSlice here)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/ops/cp_slice.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"

namespace trident::model {

// cp_chunk and CpSlice live in the ops layer (the coarse Llama block's RoPE takes a CpSlice).
using ops::cp_chunk;
using ops::CpSlice;

// The global positions (0..t-1) of CP rank `rank`'s t/cp local tokens, in local order (for
// position embeddings, RoPE angles and the data loader). t must be divisible by 2·cp.
std::vector<int> cp_local_positions(int t, int cp, int rank);

// What every context-parallel attention (ring, Ulysses) needs of a rank's local shape: causal,
// not accumulating, an even t (two chunks), lse packed, heads that group. `who` names the
// caller in the error.
void check_cp_attention_shape(const ops::Ops::AttentionShape& s, const char* who);

// Whether the CP attention (ring, Ulysses) is made for bf16 operands: the fused bf16 block
// calls its bf16 entry points (BlockContext::cp_bf16) and its rows move as float pairs (an
// even head size). GptChunk and model::predict_memory both ask here.
inline bool cp_bf16_operands(bool block_cp_bf16, int hs) { return block_cp_bf16 && hs % 2 == 0; }

class RingAttention {
 public:
  // Cumulative figures. *_s: wall seconds (steady_clock) inside forward() / backward();
  // *_wait_s: of which blocked in MPI waiting for the ring's messages once the tiles were done
  // (the part of the communication the tiles did not hide, plus waiting for a slower peer);
  // *_cpu_s: the same in this thread's CPU time (differs from wall time when the ranks share
  // cores or MPI sleeps). bytes: what this rank sent (key/value blocks and their gradients).
  struct Stats {
    std::int64_t forward_calls = 0, backward_calls = 0;
    double forward_s = 0, backward_s = 0;
    double forward_cpu_s = 0, backward_cpu_s = 0;
    double forward_wait_s = 0, backward_wait_s = 0;
    double forward_wait_cpu_s = 0, backward_wait_cpu_s = 0;
    std::int64_t messages = 0;
    double bytes = 0;
    std::int64_t buffer_bytes = 0;  // the rings' own buffers (made once, at construction)
    Stats& operator+=(const Stats& o);
    // One line: "ring attention: F forward and B backward passes over cp = C, sent S MiB in M
    // messages; blocked waiting W s of R s in the ring (forward ..., backward ...; CPU time:
    // the waits' Wc s of Rc s), buffers X MiB" (FORMAT.md)
    std::string describe(int cp) const;
  };

  // `local`: the shape of this rank's q, k, v, out as Ops::attention_forward takes it, with
  // t = T/cp local rows (even) per sequence, causal; lse is [B, NH, t] packed. The group is
  // the CP communicator (size 1: plain flash attention). Buffers are made here, once.
  // bf16: for forward_bf16 / backward_bf16 only (the key/value blocks held in bf16; needs
  // packed out rows, ld_o = nh * hs, and an even hs).
  RingAttention(ops::Ops& ops, parallel::Comm& group, const ops::Ops::AttentionShape& local,
                bool bf16 = false);
  ~RingAttention();
  RingAttention(const RingAttention&) = delete;
  RingAttention& operator=(const RingAttention&) = delete;

  // out, lse: causal attention of the local queries against the whole sequence's keys.
  // bf16_exact: k, v hold bf16 values and the caller rounds out to bf16 (bf16 on the wire).
  void forward(float* out, float* lse, const float* q, const float* k, const float* v,
               bool bf16_exact = false);
  // dq, dk, dv WRITTEN (this rank's rows; each key/value head summing its query heads) from
  // dout and the forward's out and lse. bf16_exact: k, v hold bf16 values and the caller
  // rounds dk, dv to bf16.
  void backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                const float* lse, const float* q, const float* k, const float* v,
                bool bf16_exact = false);

  // The same on bf16 tensors (Ops::BlockAttention's bf16 entry points: the CUDA bf16 block).
  // Forward: the key/value blocks held and sent as bf16 and attended to as they are
  // (Ops::attention_forward_bf16); each block's bf16 partial output (written into out, spent)
  // is widened and merged into an fp32 accumulator, rounded into out once at the end (one
  // rounding more than forward()'s: the partials'). Backward: each block's
  // attention_backward_bf16 gives bf16 dq, dk, dv partials, widened and added into the fp32
  // dq accumulator and the fp32 key/value gradients that travel hop by hop (fp32 on the wire:
  // sums); the last hop home in bf16, copied into dk, dv as it is. Only where made with bf16.
  void forward_bf16(std::uint16_t* out, float* lse, const std::uint16_t* q,
                    const std::uint16_t* k, const std::uint16_t* v);
  void backward_bf16(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                     const std::uint16_t* dout, const std::uint16_t* out, const float* lse,
                     const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v);
  bool bf16() const { return bf16_; }

  // The messages of one forward() or one backward(), alone: the same sizes to the same peers
  // in the same order, waited for at the same points, with no tiles between them (what they
  // take when nothing hides them; benchmarks). Collective over the CP group. Wall seconds;
  // cpu_s (optional): this thread's CPU seconds. Not counted in stats().
  double forward_messages_alone(double* cpu_s = nullptr, bool bf16_exact = false);
  double backward_messages_alone(double* cpu_s = nullptr, bool bf16_exact = false);

  const Stats& stats() const { return stats_; }
  // Every ring of this process (alive or gone) since start-up or the last reset.
  static Stats process_stats();
  static void reset_process_stats();

 private:
  // The attention shape of local query chunk `qa` against chunk `kc` of the travelling
  // key/value block, or false when the pair is skipped (key chunk later in the sequence).
  bool block_shape(int qa, int src, int kc, ops::Ops::AttentionShape& blk) const;
  void pack_kv(float* kv, const float* k, const float* v);
  // The key/value block travelling at `step`: kv_[step % 2] in fp32; as bf16, half
  // (step % 2) of kv_[1] (kv_[0] then holds the block attended to, widened), `floats` floats
  // of wire bits on the wire (a bf16 block fits in half an fp32 one: no buffer more).
  // A bf16 ring (bf16_): kv_[step % 2], each a bf16 block.
  float* travelling(int step, bool bf16) {
    if (bf16_) return kv_[step % 2].data();
    return bf16 ? kv_[1].data() + (step % 2) * (kv_floats_ / 2) : kv_[step % 2].data();
  }
  static std::uint16_t* bits(float* p) { return reinterpret_cast<std::uint16_t*>(p); }
  std::int64_t block_floats(bool bf16) const {
    return bf16 || bf16_ ? kv_floats_ / 2 : kv_floats_;
  }
  // acc (fp32) += the bf16 partial `part` (both [B, t, width] at sequence stride bs), rows
  // [row0, row0 + chunk_) of each sequence, widened through part_out_.
  void add_widened(float* acc, const std::uint16_t* part, std::int64_t width, std::int64_t row0);
  // The ring's messages, one copy for every precision (forward, backward and their bf16
  // entry points; bf16_wire: the key/value blocks travel as bf16, block_floats). Forward: at
  // each step the next block travels while attend(step, src) works on the one held (src's);
  // arrived(step + 1) once the next one is in.
  void forward_ring(Stats& call, bool bf16_wire, const std::function<void(int, int)>& attend,
                    const std::function<void(int)>& arrived);
  // Backward: the same blocks again, attend(step, src, dkv) adding src's key/value gradient
  // partials into dkv (fp32, zeroed), which then travels one hop behind, summed with what came
  // in; with bf16_wire its last hop home is bf16 too (in travelling(cp, true)). Ends with this
  // rank's own gradients in dkv_in_ (cp 1: none, they are in dkv_[0]); the last two gradient
  // sends are left in dkv_sent for the caller to wait for after its copies.
  void backward_ring(Stats& call, bool bf16_wire,
                     const std::function<void(int, int, float*)>& attend,
                     const std::function<void(int)>& arrived, parallel::Request (&dkv_sent)[2]);
  void count_send(Stats& call, std::int64_t floats) const {
    call.messages += 1;
    call.bytes += double(floats) * double(sizeof(float));
  }
  void record(const Stats& call);  // into stats_ and the process's totals

  ops::Ops& ops_;
  parallel::Comm& group_;
  ops::Ops::AttentionShape s_;
  bool bf16_ = false;
  int cp_ = 1, rank_ = 0, chunk_ = 0;  // chunk_: rows of one chunk (t / 2)
  std::int64_t width_kv_ = 0;          // nkv * hs: a packed key (or value) row
  std::int64_t kv_floats_ = 0;         // one packed block: keys then values, [B, t, width_kv] each
  // bf16_: kv_ hold bf16 blocks (half the floats), dkv16_ a bf16 block (the blocks' dk, dv
  // partials), q_packed_ the packed bf16 q then the blocks' bf16 dq partials; dq_acc_ is the
  // forward's fp32 output accumulator too.
  FloatBuffer kv_[2], dkv_[2], dkv_in_, part_out_, part_lse_, q_packed_, dq_acc_, dkv16_;
  Stats stats_;
};

}  // namespace trident::model
