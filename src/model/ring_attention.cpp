// Ring attention over the CP group (see trident/model/ring_attention.hpp).
#include "trident/model/ring_attention.hpp"

#include <time.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "trident/core/error.hpp"

namespace trident::model {

namespace {

constexpr int kTagKv = 3001;   // key/value blocks, forward and backward
constexpr int kTagDkv = 3002;  // their gradients, one hop behind

// dst rows = src rows (b sequences of t rows of `width` floats; row strides ld, sequence
// strides bs): one copy when both are packed, one strided copy (Ops::copy_rows) when the
// sequences follow each other at the row stride, else one per sequence.
void copy_rows(ops::Ops& ops, float* dst, std::int64_t ld_dst, std::int64_t bs_dst,
               const float* src, std::int64_t ld_src, std::int64_t bs_src, int b, int t,
               std::int64_t width) {
  const std::int64_t packed = std::int64_t(t) * width;
  if (ld_dst == width && ld_src == width && bs_dst == packed && bs_src == packed) {
    ops.copy(dst, src, std::int64_t(b) * packed);
    return;
  }
  if (bs_dst == t * ld_dst && bs_src == t * ld_src) {
    ops.copy_rows(dst, ld_dst, src, ld_src, std::int64_t(b) * t, width);
    return;
  }
  for (int bb = 0; bb < b; bb++)
    ops.copy_rows(dst + bb * bs_dst, ld_dst, src + bb * bs_src, ld_src, t, width);
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Adds the wall and CPU seconds of its scope to two totals (a ring's waits).
class Waiting {
 public:
  Waiting(double& wall, double& cpu) : wall_(wall), cpu_(cpu), cpu0_(thread_cpu_s()) {}
  ~Waiting() {
    wall_ += seconds_since(t0_);
    cpu_ += thread_cpu_s() - cpu0_;
  }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  double &wall_, &cpu_;
  Clock::time_point t0_ = Clock::now();
  double cpu0_;
};

// Every ring's figures in this process (one thread runs the model).
RingAttention::Stats& process_totals() {
  static RingAttention::Stats totals;
  return totals;
}

std::string ring_step(const char* what, int step, const parallel::Comm& group) {
  return std::string("ring attention: ") + what + " of step " + std::to_string(step) +
         " on communicator " + group.name() + " (rank " + std::to_string(group.rank()) + " of " +
         std::to_string(group.size()) + ")";
}

}  // namespace

std::vector<int> cp_local_positions(int t, int cp, int rank) {
  TRIDENT_CHECK(cp >= 1 && rank >= 0 && rank < cp && t % (2 * cp) == 0,
                "cp_local_positions: sequence length ", t, " must be divisible by 2 * cp = ",
                2 * cp, " (rank ", rank, ")");
  const int chunk = t / (2 * cp);
  std::vector<int> pos;
  pos.reserve(2 * std::size_t(chunk));
  for (int which = 0; which < 2; which++)
    for (int i = 0; i < chunk; i++) pos.push_back(cp_chunk(cp, rank, which) * chunk + i);
  return pos;
}

void check_cp_attention_shape(const ops::Ops::AttentionShape& s, const char* who) {
  TRIDENT_CHECK(s.t > 0 && s.t % 2 == 0, who, ": the local sequence length ", s.t,
                " must be even (two chunks of the 2 * cp)");
  TRIDENT_CHECK(s.causal && !s.accumulate, who, ": the shape must be causal and not accumulate");
  TRIDENT_CHECK(s.lse_row() == s.t, who, ": lse must be [B, NH, t] packed");
  TRIDENT_CHECK(s.nh > 0 && s.nkv > 0 && s.nh % s.nkv == 0 && s.hs > 0, who, ": bad heads (nh ",
                s.nh, ", nkv ", s.nkv, ", hs ", s.hs, ")");
}

RingAttention::RingAttention(ops::Ops& ops, parallel::Comm& group,
                             const ops::Ops::AttentionShape& local, bool bf16)
    : ops_(ops), group_(group), s_(local), bf16_(bf16), cp_(group.size()), rank_(group.rank()) {
  check_cp_attention_shape(s_, "ring attention");
  // bf16: rows move as float pairs (hs even); out is narrowed in one call (packed rows)
  TRIDENT_CHECK(!bf16 || (s_.hs % 2 == 0 && s_.ld_o == std::int64_t(s_.nh) * s_.hs &&
                          s_.batch_o() == s_.t * s_.ld_o),
                "internal: ring attention in bf16 needs an even head size and packed out rows");
  chunk_ = s_.t / 2;
  width_kv_ = std::int64_t(s_.nkv) * s_.hs;
  const std::int64_t rows = std::int64_t(s_.b) * s_.t;
  kv_floats_ = 2 * rows * width_kv_;
  DeviceMemory* mem = ops.memory();
  for (auto& buf : kv_) buf = FloatBuffer(std::size_t(bf16 ? kv_floats_ / 2 : kv_floats_), mem);
  if (bf16) dkv16_ = FloatBuffer(std::size_t(kv_floats_ / 2), mem);
  for (auto& buf : dkv_) buf = FloatBuffer(std::size_t(kv_floats_), mem);
  dkv_in_ = FloatBuffer(std::size_t(kv_floats_), mem);
  part_out_ = FloatBuffer(std::size_t(s_.b * s_.batch_o()), mem);
  part_lse_ = FloatBuffer(std::size_t(rows) * s_.nh, mem);
  q_packed_ = FloatBuffer(std::size_t(rows) * s_.nh * s_.hs, mem);
  dq_acc_ = FloatBuffer(std::size_t(rows) * s_.nh * s_.hs, mem);
  std::size_t floats = 0;
  for (const FloatBuffer* b : {&kv_[0], &kv_[1], &dkv_[0], &dkv_[1], &dkv_in_, &part_out_,
                               &part_lse_, &q_packed_, &dq_acc_, &dkv16_})
    floats += b->size();
  stats_.buffer_bytes = std::int64_t(floats * sizeof(float));
  process_totals().buffer_bytes += stats_.buffer_bytes;
}

RingAttention::~RingAttention() { process_totals().buffer_bytes -= stats_.buffer_bytes; }

RingAttention::Stats& RingAttention::Stats::operator+=(const Stats& o) {
  forward_calls += o.forward_calls;
  backward_calls += o.backward_calls;
  forward_s += o.forward_s;
  backward_s += o.backward_s;
  forward_cpu_s += o.forward_cpu_s;
  backward_cpu_s += o.backward_cpu_s;
  forward_wait_s += o.forward_wait_s;
  backward_wait_s += o.backward_wait_s;
  forward_wait_cpu_s += o.forward_wait_cpu_s;
  backward_wait_cpu_s += o.backward_wait_cpu_s;
  messages += o.messages;
  bytes += o.bytes;
  buffer_bytes += o.buffer_bytes;
  return *this;
}

std::string RingAttention::Stats::describe(int cp) const {
  char line[400];
  std::snprintf(line, sizeof line,
                "ring attention: %lld forward and %lld backward passes over cp = %d, sent %.1f "
                "MiB in %lld messages; blocked waiting %.3f s of %.3f s in the ring (forward "
                "%.3f of %.3f s, backward %.3f of %.3f s; CPU time: the waits' %.3f s of "
                "%.3f s), buffers %.1f MiB",
                static_cast<long long>(forward_calls), static_cast<long long>(backward_calls),
                cp, bytes / 1048576.0, static_cast<long long>(messages),
                forward_wait_s + backward_wait_s, forward_s + backward_s, forward_wait_s,
                forward_s, backward_wait_s, backward_s, forward_wait_cpu_s + backward_wait_cpu_s,
                forward_cpu_s + backward_cpu_s, double(buffer_bytes) / 1048576.0);
  return line;
}

RingAttention::Stats RingAttention::process_stats() { return process_totals(); }

void RingAttention::reset_process_stats() {
  const std::int64_t buffers = process_totals().buffer_bytes;  // of the rings alive
  process_totals() = Stats{};
  process_totals().buffer_bytes = buffers;
}

void RingAttention::record(const Stats& call) {
  stats_ += call;
  process_totals() += call;
}

bool RingAttention::block_shape(int qa, int src, int kc, ops::Ops::AttentionShape& blk) const {
  const int gq = cp_chunk(cp_, rank_, qa), gk = cp_chunk(cp_, src, kc);
  if (gk > gq) return false;  // keys after every query of the chunk
  blk = s_;
  blk.t = chunk_;
  blk.causal = gk == gq;  // the diagonal block; an earlier chunk is seen whole
  blk.ld_k = blk.ld_v = width_kv_;
  blk.bs_k = blk.bs_v = std::int64_t(s_.t) * width_kv_;
  blk.bs_q = s_.batch_q();
  blk.bs_o = s_.batch_o();
  blk.bs_lse = s_.t;
  return true;
}

void RingAttention::pack_kv(float* kv, const float* k, const float* v) {
  const std::int64_t bs = std::int64_t(s_.t) * width_kv_;
  copy_rows(ops_, kv, width_kv_, bs, k, s_.ld_k, s_.batch_k(), s_.b, s_.t, width_kv_);
  copy_rows(ops_, kv + kv_floats_ / 2, width_kv_, bs, v, s_.ld_v, s_.batch_v(), s_.b, s_.t,
            width_kv_);
}

void RingAttention::forward_ring(Stats& call, bool bf16_wire,
                                 const std::function<void(int, int)>& attend,
                                 const std::function<void(int)>& arrived) {
  const std::int64_t msg = block_floats(bf16_wire);
  const int next = (rank_ + 1) % cp_, prev = (rank_ + cp_ - 1) % cp_;
  for (int step = 0; step < cp_; step++) {
    const int src = (rank_ - step + cp_) % cp_;  // whose keys and values are held now
    parallel::Request send, recv;
    if (step + 1 < cp_) {  // the next block travels while this one is attended to
      recv = group_.irecv(travelling(step + 1, bf16_wire), msg, prev, kTagKv);
      send = group_.isend(travelling(step, bf16_wire), msg, next, kTagKv);
      count_send(call, msg);
    }
    attend(step, src);
    {
      Waiting waiting(call.forward_wait_s, call.forward_wait_cpu_s);
      send.wait([&] { return ring_step("forward send", step, group_); });
      recv.wait([&] { return ring_step("forward receive", step, group_); });
    }
    if (step + 1 < cp_) arrived(step + 1);
  }
}

void RingAttention::backward_ring(Stats& call, bool bf16_wire,
                                  const std::function<void(int, int, float*)>& attend,
                                  const std::function<void(int)>& arrived,
                                  parallel::Request (&dkv_sent)[2]) {
  const std::int64_t msg = block_floats(bf16_wire);
  double &wait_s = call.backward_wait_s, &wait_cpu_s = call.backward_wait_cpu_s;
  const int next = (rank_ + 1) % cp_, prev = (rank_ + cp_ - 1) % cp_;
  for (int step = 0; step < cp_; step++) {
    const int src = (rank_ - step + cp_) % cp_;
    parallel::Request send, recv, dkv_recv;
    if (step + 1 < cp_) {
      recv = group_.irecv(travelling(step + 1, bf16_wire), msg, prev, kTagKv);
      send = group_.isend(travelling(step, bf16_wire), msg, next, kTagKv);
      count_send(call, msg);
    }
    // src's gradients so far: finished by the previous rank at its previous step
    if (step > 0) dkv_recv = group_.irecv(dkv_in_.data(), kv_floats_, prev, kTagDkv);
    float* dkv = dkv_[step % 2].data();
    {
      Waiting waiting(wait_s, wait_cpu_s);
      dkv_sent[step % 2].wait([&] { return ring_step("gradient send", step - 2, group_); });
    }
    ops_.fill(dkv, 0.0f, kv_floats_);
    attend(step, src, dkv);
    if (step > 0) {
      {
        Waiting waiting(wait_s, wait_cpu_s);
        dkv_recv.wait([&] { return ring_step("gradient receive", step, group_); });
      }
      ops_.add(dkv, dkv, dkv_in_.data(), kv_floats_);
    }
    // on to the next holder of src's block; after the last step that is src itself, which
    // only copies it to dk, dv: a bf16 wire rounds it here as the caller would there (the
    // travelling block it goes in is free: sent and waited for at the last step)
    if (cp_ > 1 && bf16_wire && step == cp_ - 1) {
      float* wire = travelling(step + 1, true);
      ops_.to_bf16(bits(wire), dkv, kv_floats_);
      dkv_sent[step % 2] = group_.isend(wire, kv_floats_ / 2, next, kTagDkv);
      count_send(call, kv_floats_ / 2);
    } else if (cp_ > 1) {
      dkv_sent[step % 2] = group_.isend(dkv, kv_floats_, next, kTagDkv);
      count_send(call, kv_floats_);
    }
    {
      Waiting waiting(wait_s, wait_cpu_s);
      send.wait([&] { return ring_step("backward send", step, group_); });
      recv.wait([&] { return ring_step("backward receive", step, group_); });
    }
    if (step + 1 < cp_) arrived(step + 1);
  }
  if (cp_ > 1) {
    Waiting waiting(wait_s, wait_cpu_s);
    group_.irecv(dkv_in_.data(), msg, prev, kTagDkv)
        .wait([&] { return ring_step("gradient return", cp_, group_); });
  }
}

void RingAttention::forward(float* out, float* lse, const float* q, const float* k,
                            const float* v, bool bf16_exact) {
  TRIDENT_CHECK(!bf16_, "internal: ring attention made for bf16 called on fp32");
  const auto t0 = Clock::now();
  const double cpu0 = thread_cpu_s();
  Stats call;
  call.forward_calls = 1;
  ops_.fill(lse, -std::numeric_limits<float>::infinity(), std::int64_t(s_.b) * s_.nh * s_.t);
  pack_kv(kv_[0].data(), k, v);
  if (bf16_exact) ops_.to_bf16(bits(travelling(0, true)), kv_[0].data(), kv_floats_);
  const auto attend = [&](int step, int src) {
    const float* cur = bf16_exact ? kv_[0].data() : kv_[step % 2].data();
    for (int qa = 0; qa < 2; qa++)
      for (int kc = 0; kc < 2; kc++) {
        ops::Ops::AttentionShape blk;
        if (!block_shape(qa, src, kc, blk)) continue;
        const std::int64_t orow = std::int64_t(qa) * chunk_ * s_.ld_o, lrow = qa * chunk_;
        const std::int64_t krow = std::int64_t(kc) * chunk_ * width_kv_;
        ops_.attention_forward(part_out_.data() + orow, part_lse_.data() + lrow,
                               q + std::int64_t(qa) * chunk_ * s_.ld_q, cur + krow,
                               cur + kv_floats_ / 2 + krow, blk);
        ops_.attention_merge(out + orow, lse + lrow, part_out_.data() + orow,
                             part_lse_.data() + lrow, blk);
      }
  };
  const auto arrived = [&](int step) {  // the next block, exactly (its values are bf16)
    if (bf16_exact) ops_.from_bf16(kv_[0].data(), bits(travelling(step, true)), kv_floats_);
  };
  forward_ring(call, bf16_exact, attend, arrived);
  call.forward_s = seconds_since(t0);
  call.forward_cpu_s = thread_cpu_s() - cpu0;
  record(call);
}

void RingAttention::backward(float* dq, float* dk, float* dv, const float* dout,
                             const float* out, const float* lse, const float* q, const float* k,
                             const float* v, bool bf16_exact) {
  TRIDENT_CHECK(!bf16_, "internal: ring attention made for bf16 called on fp32");
  const auto t0 = Clock::now();
  const double cpu0 = thread_cpu_s();
  Stats call;
  call.backward_calls = 1;
  const std::int64_t width_q = std::int64_t(s_.nh) * s_.hs;
  const std::int64_t bs_q = std::int64_t(s_.t) * width_q;
  // q packed, so that dq accumulates in a packed buffer of the same layout
  copy_rows(ops_, q_packed_.data(), width_q, bs_q, q, s_.ld_q, s_.batch_q(), s_.b, s_.t, width_q);
  ops_.fill(dq_acc_.data(), 0.0f, s_.b * bs_q);
  pack_kv(kv_[0].data(), k, v);
  if (bf16_exact) ops_.to_bf16(bits(travelling(0, true)), kv_[0].data(), kv_floats_);
  const auto attend = [&](int step, int src, float* dkv) {
    const float* cur = bf16_exact ? kv_[0].data() : kv_[step % 2].data();
    for (int qa = 0; qa < 2; qa++)
      for (int kc = 0; kc < 2; kc++) {
        ops::Ops::AttentionShape blk;
        if (!block_shape(qa, src, kc, blk)) continue;
        blk.ld_q = width_q;
        blk.bs_q = bs_q;
        blk.accumulate = true;
        const std::int64_t qrow = std::int64_t(qa) * chunk_ * width_q;
        const std::int64_t orow = std::int64_t(qa) * chunk_ * s_.ld_o, lrow = qa * chunk_;
        const std::int64_t krow = std::int64_t(kc) * chunk_ * width_kv_;
        ops_.attention_backward(dq_acc_.data() + qrow, dkv + krow, dkv + kv_floats_ / 2 + krow,
                                dout + orow, out + orow, lse + lrow, q_packed_.data() + qrow,
                                cur + krow, cur + kv_floats_ / 2 + krow, blk);
      }
  };
  const auto arrived = [&](int step) {  // the next block, exactly (its values are bf16)
    if (bf16_exact) ops_.from_bf16(kv_[0].data(), bits(travelling(step, true)), kv_floats_);
  };
  parallel::Request dkv_sent[2];  // the gradient block sent at the last two steps
  backward_ring(call, bf16_exact, attend, arrived, dkv_sent);
  const float* mine = dkv_[(cp_ - 1) % 2].data();  // cp 1: this rank's own, never sent
  if (cp_ > 1) {
    mine = dkv_in_.data();
    if (bf16_exact) {  // widened into kv_[0], spent after the last step's tiles
      ops_.from_bf16(kv_[0].data(), bits(dkv_in_.data()), kv_floats_);
      mine = kv_[0].data();
    }
  }
  copy_rows(ops_, dq, s_.ld_q, s_.batch_q(), dq_acc_.data(), width_q, bs_q, s_.b, s_.t, width_q);
  const std::int64_t bs_kv = std::int64_t(s_.t) * width_kv_;
  copy_rows(ops_, dk, s_.ld_k, s_.batch_k(), mine, width_kv_, bs_kv, s_.b, s_.t, width_kv_);
  copy_rows(ops_, dv, s_.ld_v, s_.batch_v(), mine + kv_floats_ / 2, width_kv_, bs_kv, s_.b, s_.t,
            width_kv_);
  {
    Waiting waiting(call.backward_wait_s, call.backward_wait_cpu_s);
    for (auto& r : dkv_sent) r.wait([&] { return ring_step("gradient send", cp_, group_); });
  }
  call.backward_s = seconds_since(t0);
  call.backward_cpu_s = thread_cpu_s() - cpu0;
  record(call);
}

void RingAttention::add_widened(float* acc, const std::uint16_t* part, std::int64_t width,
                                std::int64_t row0) {
  const std::int64_t bs = std::int64_t(s_.t) * width, n = std::int64_t(chunk_) * width;
  for (int bb = 0; bb < s_.b; bb++) {
    const std::int64_t at = bb * bs + row0 * width;
    ops_.from_bf16(part_out_.data(), part + at, n);
    ops_.add(acc + at, acc + at, part_out_.data(), n);
  }
}

void RingAttention::forward_bf16(std::uint16_t* out, float* lse, const std::uint16_t* q,
                                 const std::uint16_t* k, const std::uint16_t* v) {
  TRIDENT_CHECK(bf16_, "internal: ring attention made for fp32 called on bf16");
  const auto t0 = Clock::now();
  const double cpu0 = thread_cpu_s();
  Stats call;
  call.forward_calls = 1;
  const std::int64_t half = kv_floats_ / 2;  // elements of keys (values) in a block
  ops_.fill(lse, -std::numeric_limits<float>::infinity(), std::int64_t(s_.b) * s_.nh * s_.t);
  // this rank's keys and values into the first travelling block, as bf16 pairs of floats
  const std::int64_t bs = std::int64_t(s_.t) * width_kv_ / 2;
  copy_rows(ops_, kv_[0].data(), width_kv_ / 2, bs, reinterpret_cast<const float*>(k),
            s_.ld_k / 2, s_.batch_k() / 2, s_.b, s_.t, width_kv_ / 2);
  copy_rows(ops_, kv_[0].data() + half / 2, width_kv_ / 2, bs, reinterpret_cast<const float*>(v),
            s_.ld_v / 2, s_.batch_v() / 2, s_.b, s_.t, width_kv_ / 2);
  float* acc = dq_acc_.data();  // out's layout (packed), fp32
  const auto attend = [&](int step, int src) {
    const std::uint16_t* cur = bits(kv_[step % 2].data());
    for (int qa = 0; qa < 2; qa++)
      for (int kc = 0; kc < 2; kc++) {
        ops::Ops::AttentionShape blk;
        if (!block_shape(qa, src, kc, blk)) continue;
        const std::int64_t orow = std::int64_t(qa) * chunk_ * s_.ld_o, lrow = qa * chunk_;
        const std::int64_t krow = std::int64_t(kc) * chunk_ * width_kv_;
        // the partial in out (spent until the end), widened into part_out_, merged into acc
        ops_.attention_forward_bf16(out + orow, part_lse_.data() + lrow,
                                    q + std::int64_t(qa) * chunk_ * s_.ld_q, cur + krow,
                                    cur + half + krow, blk);
        for (int bb = 0; bb < s_.b; bb++) {
          const std::int64_t at = bb * s_.batch_o() + orow;
          ops_.from_bf16(part_out_.data() + at, out + at, std::int64_t(chunk_) * s_.ld_o);
        }
        ops_.attention_merge(acc + orow, lse + lrow, part_out_.data() + orow,
                             part_lse_.data() + lrow, blk);
      }
  };
  forward_ring(call, true, attend, [](int) {});  // the blocks are attended to as they come
  ops_.to_bf16(out, acc, std::int64_t(s_.b) * s_.batch_o());
  call.forward_s = seconds_since(t0);
  call.forward_cpu_s = thread_cpu_s() - cpu0;
  record(call);
}

void RingAttention::backward_bf16(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                                  const std::uint16_t* dout, const std::uint16_t* out,
                                  const float* lse, const std::uint16_t* q,
                                  const std::uint16_t* k, const std::uint16_t* v) {
  TRIDENT_CHECK(bf16_, "internal: ring attention made for fp32 called on bf16");
  const auto t0 = Clock::now();
  const double cpu0 = thread_cpu_s();
  Stats call;
  call.backward_calls = 1;
  const std::int64_t width_q = std::int64_t(s_.nh) * s_.hs;
  const std::int64_t bs_q = std::int64_t(s_.t) * width_q;
  const std::int64_t half = kv_floats_ / 2;
  const std::int64_t bs_kv = std::int64_t(s_.t) * width_kv_;
  // q packed (bf16, the first half of q_packed_), the blocks' dq partials in the second
  std::uint16_t* q16 = bits(q_packed_.data());
  std::uint16_t* dq16 = q16 + std::int64_t(s_.b) * bs_q;
  copy_rows(ops_, q_packed_.data(), width_q / 2, bs_q / 2, reinterpret_cast<const float*>(q),
            s_.ld_q / 2, s_.batch_q() / 2, s_.b, s_.t, width_q / 2);
  ops_.fill(dq_acc_.data(), 0.0f, s_.b * bs_q);
  copy_rows(ops_, kv_[0].data(), width_kv_ / 2, bs_kv / 2, reinterpret_cast<const float*>(k),
            s_.ld_k / 2, s_.batch_k() / 2, s_.b, s_.t, width_kv_ / 2);
  copy_rows(ops_, kv_[0].data() + half / 2, width_kv_ / 2, bs_kv / 2,
            reinterpret_cast<const float*>(v), s_.ld_v / 2, s_.batch_v() / 2, s_.b, s_.t,
            width_kv_ / 2);
  std::uint16_t* dkv16 = bits(dkv16_.data());
  const auto attend = [&](int step, int src, float* dkv) {
    const std::uint16_t* cur = bits(kv_[step % 2].data());
    for (int qa = 0; qa < 2; qa++)
      for (int kc = 0; kc < 2; kc++) {
        ops::Ops::AttentionShape blk;
        if (!block_shape(qa, src, kc, blk)) continue;
        blk.ld_q = width_q;
        blk.bs_q = bs_q;
        const std::int64_t qrow = std::int64_t(qa) * chunk_ * width_q;
        const std::int64_t orow = std::int64_t(qa) * chunk_ * s_.ld_o, lrow = qa * chunk_;
        const std::int64_t krow = std::int64_t(kc) * chunk_ * width_kv_;
        // this block's partials in bf16, widened and added into the fp32 sums
        ops_.attention_backward_bf16(dq16 + qrow, dkv16 + krow, dkv16 + half + krow,
                                     dout + orow, out + orow, lse + lrow, q16 + qrow,
                                     cur + krow, cur + half + krow, blk);
        add_widened(dq_acc_.data(), dq16, width_q, std::int64_t(qa) * chunk_);
        add_widened(dkv, dkv16, width_kv_, std::int64_t(kc) * chunk_);
        add_widened(dkv + half, dkv16 + half, width_kv_, std::int64_t(kc) * chunk_);
      }
  };
  parallel::Request dkv_sent[2];  // the gradient block sent at the last two steps
  backward_ring(call, true, attend, [](int) {}, dkv_sent);
  // this rank's own key/value gradients, bf16: home from the ring (cp 1: narrowed here)
  const float* mine = dkv_in_.data();
  if (cp_ == 1) {
    ops_.to_bf16(dkv16, dkv_[0].data(), kv_floats_);
    mine = dkv16_.data();
  }
  ops_.to_bf16(q16, dq_acc_.data(), s_.b * bs_q);
  copy_rows(ops_, reinterpret_cast<float*>(dq), s_.ld_q / 2, s_.batch_q() / 2, q_packed_.data(),
            width_q / 2, bs_q / 2, s_.b, s_.t, width_q / 2);
  copy_rows(ops_, reinterpret_cast<float*>(dk), s_.ld_k / 2, s_.batch_k() / 2, mine,
            width_kv_ / 2, bs_kv / 2, s_.b, s_.t, width_kv_ / 2);
  copy_rows(ops_, reinterpret_cast<float*>(dv), s_.ld_v / 2, s_.batch_v() / 2, mine + half / 2,
            width_kv_ / 2, bs_kv / 2, s_.b, s_.t, width_kv_ / 2);
  {
    Waiting waiting(call.backward_wait_s, call.backward_wait_cpu_s);
    for (auto& r : dkv_sent) r.wait([&] { return ring_step("gradient send", cp_, group_); });
  }
  call.backward_s = seconds_since(t0);
  call.backward_cpu_s = thread_cpu_s() - cpu0;
  record(call);
}

// forward()'s messages without its tiles (keep the two in step).
double RingAttention::forward_messages_alone(double* cpu_s, bool bf16_exact) {
  const auto t0 = Clock::now();
  const double cpu0 = thread_cpu_s();
  const int next = (rank_ + 1) % cp_, prev = (rank_ + cp_ - 1) % cp_;
  const std::int64_t msg = block_floats(bf16_exact);
  for (int step = 0; step + 1 < cp_; step++) {
    parallel::Request recv = group_.irecv(travelling(step + 1, bf16_exact), msg, prev, kTagKv);
    parallel::Request send = group_.isend(travelling(step, bf16_exact), msg, next, kTagKv);
    send.wait([&] { return ring_step("forward send (alone)", step, group_); });
    recv.wait([&] { return ring_step("forward receive (alone)", step, group_); });
  }
  if (cpu_s) *cpu_s = thread_cpu_s() - cpu0;
  return seconds_since(t0);
}

// backward()'s messages without its tiles (keep the two in step).
double RingAttention::backward_messages_alone(double* cpu_s, bool bf16_exact) {
  const auto t0 = Clock::now();
  const double cpu0 = thread_cpu_s();
  if (cp_ > 1) {
    const int next = (rank_ + 1) % cp_, prev = (rank_ + cp_ - 1) % cp_;
    const std::int64_t msg = block_floats(bf16_exact);
    parallel::Request dkv_sent[2];
    for (int step = 0; step < cp_; step++) {
      parallel::Request send, recv, dkv_recv;
      if (step + 1 < cp_) {
        recv = group_.irecv(travelling(step + 1, bf16_exact), msg, prev, kTagKv);
        send = group_.isend(travelling(step, bf16_exact), msg, next, kTagKv);
      }
      if (step > 0) dkv_recv = group_.irecv(dkv_in_.data(), kv_floats_, prev, kTagDkv);
      dkv_sent[step % 2].wait([&] { return ring_step("gradient send (alone)", step - 2, group_); });
      dkv_recv.wait([&] { return ring_step("gradient receive (alone)", step, group_); });
      // the last hop at backward()'s size (bf16_exact: bf16)
      const std::int64_t dkv_msg = step + 1 < cp_ ? kv_floats_ : msg;
      dkv_sent[step % 2] = group_.isend(dkv_[step % 2].data(), dkv_msg, next, kTagDkv);
      send.wait([&] { return ring_step("backward send (alone)", step, group_); });
      recv.wait([&] { return ring_step("backward receive (alone)", step, group_); });
    }
    group_.irecv(dkv_in_.data(), msg, prev, kTagDkv)
        .wait([&] { return ring_step("gradient return (alone)", cp_, group_); });
    for (auto& r : dkv_sent)
      r.wait([&] { return ring_step("gradient send (alone)", cp_, group_); });
  }
  if (cpu_s) *cpu_s = thread_cpu_s() - cpu0;
  return seconds_since(t0);
}

}  // namespace trident::model
