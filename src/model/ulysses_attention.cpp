// Ulysses attention over the CP group (see trident/model/ulysses_attention.hpp).
#include "trident/model/ulysses_attention.hpp"

#include <algorithm>

#include "trident/core/error.hpp"
#include "trident/model/ring_attention.hpp"

namespace trident::model {

std::int64_t ulysses_floats(std::int64_t rows, int nh, int nkv, int hs) {
  const std::int64_t qkv = std::int64_t(nh + 2 * nkv) * hs, od = 2 * std::int64_t(nh) * hs;
  return 2 * rows * std::max(qkv, od) + rows * qkv + rows * od;
}

UlyssesAttention::UlyssesAttention(ops::Ops& ops, parallel::Comm& group,
                                   const ops::Ops::AttentionShape& local, bool bf16)
    : ops_(ops), group_(group), s_(local), cp_(group.size()), u_(bf16 ? 2 : 1) {
  check_cp_attention_shape(s_, "ulysses attention");
  TRIDENT_CHECK(s_.nh % cp_ == 0 && s_.nkv % cp_ == 0, "parallel.cp_mode = \"ulysses\": the ",
                s_.nh, " query and ", s_.nkv, " key/value heads of the rank must be divisible by "
                "parallel.cp = ", cp_);
  // bf16 rows move as float pairs: every width, offset and stride is a multiple of hs
  TRIDENT_CHECK(!bf16 || s_.hs % 2 == 0, "internal: ulysses attention in bf16 needs an even "
                "head size (", s_.hs, ")");
  chunk_ = s_.t / 2;
  const std::int64_t rows = std::int64_t(s_.b) * s_.t;
  const std::int64_t qkv = std::int64_t(s_.nh + 2 * s_.nkv) * s_.hs;
  const std::int64_t od = 2 * std::int64_t(s_.nh) * s_.hs;
  DeviceMemory* mem = ops.memory();
  send_ = FloatBuffer(std::size_t(rows * std::max(qkv, od) / u_), mem);
  recv_ = FloatBuffer(std::size_t(rows * std::max(qkv, od) / u_), mem);
  qkv_full_ = FloatBuffer(std::size_t(rows * qkv / u_), mem);
  od_full_ = FloatBuffer(std::size_t(rows * od / u_), mem);
  buffer_bytes_ =
      ulysses_floats(rows, s_.nh, s_.nkv, s_.hs) / u_ * std::int64_t(sizeof(float));
}

ops::Ops::AttentionShape UlyssesAttention::full_shape() const {
  ops::Ops::AttentionShape f;
  f.b = s_.b;
  f.t = s_.t * cp_;
  f.nh = s_.nh / cp_;
  f.nkv = s_.nkv / cp_;
  f.hs = s_.hs;
  f.ld_q = f.ld_o = std::int64_t(f.nh) * f.hs;
  f.ld_k = f.ld_v = std::int64_t(f.nkv) * f.hs;
  return f;
}

// The copies below count elements (floats, or bf16 in the bf16 buffers) and move them as
// floats: every count divided by u_ (bf16: an element pair per float; all even).
void UlyssesAttention::pack(const float* x, std::int64_t ld, std::int64_t bs, int heads,
                            std::int64_t col) {
  const std::int64_t w = std::int64_t(heads / cp_) * s_.hs / u_, rw = row_w_ / u_;
  ld /= u_, bs /= u_, col /= u_;
  for (int j = 0; j < cp_; j++) {
    float* dst = send_.data() + j * block_ / u_ + col;
    if (bs == s_.t * ld) {
      ops_.copy_rows(dst, rw, x + j * w, ld, std::int64_t(s_.b) * s_.t, w);
      continue;
    }
    for (int bb = 0; bb < s_.b; bb++)
      ops_.copy_rows(dst + std::int64_t(bb) * s_.t * rw, rw, x + bb * bs + j * w, ld, s_.t, w);
  }
}

void UlyssesAttention::unpack(float* x, std::int64_t ld, std::int64_t bs, int heads,
                              std::int64_t col) {
  const std::int64_t w = std::int64_t(heads / cp_) * s_.hs / u_, rw = row_w_ / u_;
  ld /= u_, bs /= u_, col /= u_;
  for (int j = 0; j < cp_; j++) {
    const float* src = recv_.data() + j * block_ / u_ + col;
    if (bs == s_.t * ld) {
      ops_.copy_rows(x + j * w, ld, src, rw, std::int64_t(s_.b) * s_.t, w);
      continue;
    }
    for (int bb = 0; bb < s_.b; bb++)
      ops_.copy_rows(x + bb * bs + j * w, ld, src + std::int64_t(bb) * s_.t * rw, rw, s_.t, w);
  }
}

void UlyssesAttention::unpack_full(float* full, int heads, std::int64_t col) {
  const std::int64_t w = std::int64_t(heads / cp_) * s_.hs / u_, T = std::int64_t(s_.t) * cp_;
  const std::int64_t rw = row_w_ / u_;
  col /= u_;
  for (int i = 0; i < cp_; i++)
    for (int bb = 0; bb < s_.b; bb++)
      for (int which = 0; which < 2; which++) {
        const std::int64_t local_row = std::int64_t(bb) * s_.t + std::int64_t(which) * chunk_;
        const std::int64_t global_row =
            std::int64_t(bb) * T + std::int64_t(cp_chunk(cp_, i, which)) * chunk_;
        ops_.copy_rows(full + global_row * w, w,
                       recv_.data() + i * block_ / u_ + local_row * rw + col, rw, chunk_, w);
      }
}

void UlyssesAttention::pack_full(const float* full, int heads, std::int64_t col) {
  const std::int64_t w = std::int64_t(heads / cp_) * s_.hs / u_, T = std::int64_t(s_.t) * cp_;
  const std::int64_t rw = row_w_ / u_;
  col /= u_;
  for (int j = 0; j < cp_; j++)
    for (int bb = 0; bb < s_.b; bb++)
      for (int which = 0; which < 2; which++) {
        const std::int64_t local_row = std::int64_t(bb) * s_.t + std::int64_t(which) * chunk_;
        const std::int64_t global_row =
            std::int64_t(bb) * T + std::int64_t(cp_chunk(cp_, j, which)) * chunk_;
        ops_.copy_rows(send_.data() + j * block_ / u_ + local_row * rw + col, rw,
                       full + global_row * w, w, chunk_, w);
      }
}

void UlyssesAttention::exchange(bool bf16) {
  if (cp_ == 1) return ops_.copy(recv_.data(), send_.data(), block_ / u_);  // device memory too
  if (u_ == 2 || !bf16) return group_.all_to_all(send_.data(), recv_.data(), block_ / u_);
  // block_ is even (t is), so each block's bf16 travels as block_ / 2 floats of bits
  const std::int64_t n = block_ * cp_;
  ops_.to_bf16(reinterpret_cast<std::uint16_t*>(recv_.data()), send_.data(), n);
  group_.all_to_all(recv_.data(), send_.data(), block_ / 2);
  ops_.from_bf16(recv_.data(), reinterpret_cast<const std::uint16_t*>(send_.data()), n);
}

void UlyssesAttention::gather_qkv(const float* q, const float* k, const float* v, bool bf16) {
  const ops::Ops::AttentionShape f = full_shape();
  const std::int64_t full_rows = std::int64_t(s_.b) * s_.t * cp_;
  // q | k | v of each rank's heads for that rank, each rank's rows in one block
  row_w_ = f.ld_q + 2 * f.ld_k;
  block_ = std::int64_t(s_.b) * s_.t * row_w_;
  pack(q, s_.ld_q, s_.batch_q(), s_.nh, 0);
  pack(k, s_.ld_k, s_.batch_k(), s_.nkv, f.ld_q);
  pack(v, s_.ld_v, s_.batch_v(), s_.nkv, f.ld_q + f.ld_k);
  exchange(bf16);
  float* Q = qkv_full_.data();
  unpack_full(Q, s_.nh, 0);
  unpack_full(Q + full_rows * f.ld_q / u_, s_.nkv, f.ld_q);
  unpack_full(Q + full_rows * (f.ld_q + f.ld_k) / u_, s_.nkv, f.ld_q + f.ld_k);
}

namespace {
// The element types the moves below see as floats (bf16: pairs of elements, u_ == 2), and the
// attention of each type.
float* as_floats(float* p) { return p; }
const float* as_floats(const float* p) { return p; }
float* as_floats(std::uint16_t* p) { return reinterpret_cast<float*>(p); }
const float* as_floats(const std::uint16_t* p) { return reinterpret_cast<const float*>(p); }
void attend(ops::Ops& ops, float* o, float* lse, const float* q, const float* k, const float* v,
            const ops::Ops::AttentionShape& f) {
  ops.attention_forward(o, lse, q, k, v, f);
}
void attend(ops::Ops& ops, std::uint16_t* o, float* lse, const std::uint16_t* q,
            const std::uint16_t* k, const std::uint16_t* v, const ops::Ops::AttentionShape& f) {
  ops.attention_forward_bf16(o, lse, q, k, v, f);
}
void attend_backward(ops::Ops& ops, float* dq, float* dk, float* dv, const float* dout,
                     const float* out, const float* lse, const float* q, const float* k,
                     const float* v, const ops::Ops::AttentionShape& f) {
  ops.attention_backward(dq, dk, dv, dout, out, lse, q, k, v, f);
}
void attend_backward(ops::Ops& ops, std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                     const std::uint16_t* dout, const std::uint16_t* out, const float* lse,
                     const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                     const ops::Ops::AttentionShape& f) {
  ops.attention_backward_bf16(dq, dk, dv, dout, out, lse, q, k, v, f);
}
}  // namespace

// fp32 (T float; wire16: bf16 on the wire, exact under the bf16 block's hook) or bf16 (T
// uint16_t, u_ 2: every buffer bf16, nothing widened or rounded on the way).
template <class T>
void UlyssesAttention::forward_as(T* out, float* lse, const T* q, const T* k, const T* v,
                                  bool wire16) {
  const ops::Ops::AttentionShape f = full_shape();
  const std::int64_t rows = std::int64_t(s_.b) * s_.t, full_rows = rows * cp_;
  gather_qkv(as_floats(q), as_floats(k), as_floats(v), wire16);
  T* Q = reinterpret_cast<T*>(qkv_full_.data());
  T* K = Q + full_rows * f.ld_q;
  T* V = K + full_rows * f.ld_k;
  T* O = reinterpret_cast<T*>(od_full_.data());
  attend(ops_, O, lse, Q, K, V, f);
  // the output back to the rows it belongs to
  row_w_ = f.ld_o;
  block_ = rows * row_w_;
  pack_full(as_floats(O), s_.nh, 0);
  exchange(wire16);
  unpack(as_floats(out), s_.ld_o, s_.batch_o(), s_.nh, 0);
}

template <class T>
void UlyssesAttention::backward_as(T* dq, T* dk, T* dv, const T* dout, const T* out,
                                   const float* lse, const T* q, const T* k, const T* v,
                                   bool wire16) {
  const ops::Ops::AttentionShape f = full_shape();
  const std::int64_t rows = std::int64_t(s_.b) * s_.t, full_rows = rows * cp_;
  // out | dout, then q | k | v, as the forward sent them
  row_w_ = 2 * f.ld_o;
  block_ = rows * row_w_;
  pack(as_floats(out), s_.ld_o, s_.batch_o(), s_.nh, 0);
  pack(as_floats(dout), s_.ld_o, s_.batch_o(), s_.nh, f.ld_o);
  exchange(wire16);
  T* O = reinterpret_cast<T*>(od_full_.data());
  T* dO = O + full_rows * f.ld_o;
  unpack_full(as_floats(O), s_.nh, 0);
  unpack_full(as_floats(dO), s_.nh, f.ld_o);
  gather_qkv(as_floats(q), as_floats(k), as_floats(v), wire16);
  T* Q = reinterpret_cast<T*>(qkv_full_.data());
  T* K = Q + full_rows * f.ld_q;
  T* V = K + full_rows * f.ld_k;
  // the received blocks are spent: the whole-sequence gradients go there
  T* dQ = reinterpret_cast<T*>(recv_.data());
  T* dK = dQ + full_rows * f.ld_q;
  T* dV = dK + full_rows * f.ld_k;
  attend_backward(ops_, dQ, dK, dV, dO, O, lse, Q, K, V, f);
  pack_full(as_floats(dQ), s_.nh, 0);
  pack_full(as_floats(dK), s_.nkv, f.ld_q);
  pack_full(as_floats(dV), s_.nkv, f.ld_q + f.ld_k);
  exchange(wire16);
  unpack(as_floats(dq), s_.ld_q, s_.batch_q(), s_.nh, 0);
  unpack(as_floats(dk), s_.ld_k, s_.batch_k(), s_.nkv, f.ld_q);
  unpack(as_floats(dv), s_.ld_v, s_.batch_v(), s_.nkv, f.ld_q + f.ld_k);
}

void UlyssesAttention::forward(float* out, float* lse, const float* q, const float* k,
                               const float* v, bool bf16_exact) {
  TRIDENT_CHECK(u_ == 1, "internal: ulysses attention made for bf16 called on fp32");
  forward_as(out, lse, q, k, v, bf16_exact);
}

void UlyssesAttention::backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* lse, const float* q,
                                const float* k, const float* v, bool bf16_exact) {
  TRIDENT_CHECK(u_ == 1, "internal: ulysses attention made for bf16 called on fp32");
  backward_as(dq, dk, dv, dout, out, lse, q, k, v, bf16_exact);
}

void UlyssesAttention::forward_bf16(std::uint16_t* out, float* lse, const std::uint16_t* q,
                                    const std::uint16_t* k, const std::uint16_t* v) {
  TRIDENT_CHECK(u_ == 2, "internal: ulysses attention made for fp32 called on bf16");
  forward_as(out, lse, q, k, v, true);
}

void UlyssesAttention::backward_bf16(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                                     const std::uint16_t* dout, const std::uint16_t* out,
                                     const float* lse, const std::uint16_t* q,
                                     const std::uint16_t* k, const std::uint16_t* v) {
  TRIDENT_CHECK(u_ == 2, "internal: ulysses attention made for fp32 called on bf16");
  backward_as(dq, dk, dv, dout, out, lse, q, k, v, true);
}

}  // namespace trident::model
