// trident/model/ulysses_attention.hpp — causal attention over a context-parallel (CP) group
// by all-to-all over heads (DeepSpeed Ulysses; parallel.cp_mode = "ulysses",
// docs/context_parallel.md). Each rank holds t = T/cp rows of every sequence (chunks r and
// 2·cp−1−r of 2·cp, as the ring has them) and all its heads. One all-to-all gives each rank
// the whole sequence for cp-th of the heads (query heads [r·NH/cp, (r+1)·NH/cp), key/value
// heads [r·nkv/cp, (r+1)·nkv/cp)), rows back in global order; the ordinary causal flash
// attention runs on it; one all-to-all brings the output back to the local rows and all
// heads. The backward redoes the all-to-alls of q, k, v, out and dout (nothing stashed beyond
// what the block keeps), runs the flash backward and sends dq, dk, dv back. Needs
// NH % cp == 0 and nkv % cp == 0 (the deck checks parallel.cp_mode). Under bf16_exact
// (Ops::BlockAttention: the CUDA bf16 block's hook) every all-to-all moves bf16: q, k, v, out
// and dout are bf16 values, and out, dq, dk, dv are only permuted after they are computed, so
// rounding them before the all-to-all is the caller's rounding after it; half the bytes, the
// same bits. Made for bf16 (the CUDA bf16 block's default, forward_bf16 / backward_bf16), it
// does the same on bf16 tensors and buffers of half the size, with no fp32 copy.
// defines: trident::model::CpMode, UlyssesAttention, ulysses_floats
#pragma once

#include <cstdint>
#include <string>

#include "trident/core/buffer.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"

namespace trident::model {

// parallel.cp_mode: how attention runs over the CP group (its words: train/layout.hpp).
enum class CpMode { ring, ulysses };

// Floats of the buffers UlyssesAttention's constructor allocates for a local shape of
// rows = B·t rows, nh query heads and nkv key/value heads of hs (send and receive buffers of
// max(nh + 2·nkv, 2·nh)·hs per row each, the whole-sequence q|k|v of (nh + 2·nkv)·hs per row
// and out|dout of 2·nh·hs per row).
std::int64_t ulysses_floats(std::int64_t rows, int nh, int nkv, int hs);

class UlyssesAttention {
 public:
  // `local`: the shape of this rank's q, k, v, out as Ops::attention_forward takes it, with
  // t = T/cp local rows (even) per sequence, causal; lse is [B, NH, t] packed (it holds the
  // head-split whole-sequence lse, [B, NH/cp, T]: only backward() reads it). The group is the
  // CP communicator. Buffers are made here, once.
  // bf16: for forward_bf16 / backward_bf16 only (buffers of bf16, half the bytes; hs even).
  UlyssesAttention(ops::Ops& ops, parallel::Comm& group, const ops::Ops::AttentionShape& local,
                   bool bf16 = false);
  UlyssesAttention(const UlyssesAttention&) = delete;
  UlyssesAttention& operator=(const UlyssesAttention&) = delete;

  // out: causal attention of the local queries against the whole sequence's keys.
  // bf16_exact: q, k, v hold bf16 values and the caller rounds out to bf16.
  void forward(float* out, float* lse, const float* q, const float* k, const float* v,
               bool bf16_exact = false);
  // dq, dk, dv WRITTEN (this rank's rows; each key/value head summing its query heads) from
  // dout and the forward's out and lse. bf16_exact: q, k, v, dout, out hold bf16 values and
  // the caller rounds dq, dk, dv to bf16.
  void backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                const float* lse, const float* q, const float* k, const float* v,
                bool bf16_exact = false);

  // The same on bf16 tensors (Ops::BlockAttention's bf16 entry points: the CUDA bf16 block),
  // each all-to-all moving bf16 and the attention in Ops::attention_forward_bf16 /
  // backward_bf16 on the whole sequence: no fp32 copy anywhere. Only where made with bf16.
  void forward_bf16(std::uint16_t* out, float* lse, const std::uint16_t* q,
                    const std::uint16_t* k, const std::uint16_t* v);
  void backward_bf16(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                     const std::uint16_t* dout, const std::uint16_t* out, const float* lse,
                     const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v);
  bool bf16() const { return u_ == 2; }

  std::int64_t buffer_bytes() const { return buffer_bytes_; }

 private:
  // (ld, bs, col count elements: floats, or bf16 on a bf16 object's buffers and tensors.)
  // One tensor of the local rows (row stride ld, sequence stride bs; `heads` heads of hs)
  // into the send buffer: the cp-th of its heads for rank j at column `col` of j's block.
  void pack(const float* x, std::int64_t ld, std::int64_t bs, int heads, std::int64_t col);
  // The received blocks' columns [col, col + w) (w = heads/cp · hs) into whole-sequence rows
  // [B, T, w] at `full`, each source's two chunks at their global places.
  void unpack_full(float* full, int heads, std::int64_t col);
  // The reverse: whole-sequence rows [B, T, w] into the send buffer, rank j's chunks at
  // column `col` of j's block.
  void pack_full(const float* full, int heads, std::int64_t col);
  // The received blocks' columns [col, col + w) back into the local rows, source j's heads.
  void unpack(float* x, std::int64_t ld, std::int64_t bs, int heads, std::int64_t col);
  // send_ -> recv_: the all-to-all of blocks of block_ floats over the CP group. bf16: the
  // blocks rounded to bf16 into recv_ (spent), moved into send_ (spent), widened into recv_.
  void exchange(bool bf16);
  // q, k, v of the local rows to the ranks whose heads they are, and this rank's heads of
  // the whole sequence back into qkv_full_ (Q, then K, then V; packed rows).
  void gather_qkv(const float* q, const float* k, const float* v, bool bf16);
  // The whole-sequence shape of this rank's heads, packed rows.
  ops::Ops::AttentionShape full_shape() const;
  // forward / backward on either element type (float, or bf16 as std::uint16_t on a bf16
  // object): the same moves, the attention of that type (ulysses_attention.cpp).
  template <class T>
  void forward_as(T* out, float* lse, const T* q, const T* k, const T* v, bool wire16);
  template <class T>
  void backward_as(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                   const T* q, const T* k, const T* v, bool wire16);

  ops::Ops& ops_;
  parallel::Comm& group_;
  ops::Ops::AttentionShape s_;
  int cp_ = 1, chunk_ = 0;    // chunk_: rows of one chunk (t / 2)
  int u_ = 1;                 // elements per float of the buffers: 1 fp32, 2 bf16
  std::int64_t row_w_ = 0;    // elements of one row of a block in the current exchange
  std::int64_t block_ = 0;    // elements of one rank's block in the current exchange
  FloatBuffer send_, recv_, qkv_full_, od_full_;
  std::int64_t buffer_bytes_ = 0;
};

}  // namespace trident::model
