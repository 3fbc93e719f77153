// What every architecture's block shares, and the factory of blocks (see
// trident/model/block.hpp).
#include "trident/model/block.hpp"

#include "trident/core/error.hpp"
#include "trident/model/gpt2_block.hpp"
#include "trident/model/llama_block.hpp"

namespace trident::model {

namespace {
template <class B>
const BlockKind& kind_of() {
  static const BlockKind kind{&B::size, [](const BlockContext& ctx) -> std::unique_ptr<Block> {
                                return std::make_unique<B>(ctx);
                              }};
  return kind;
}
}  // namespace

const BlockKind& block_kind(Arch arch) {
  switch (arch) {  // one line per architecture
    case Arch::gpt2: return kind_of<Gpt2Block>();
    case Arch::llama: return kind_of<LlamaBlock>();
  }
  throw Error(str("internal: model.arch #", int(arch), " has no transformer block"));
}

Block::Block(const BlockContext& ctx)
    : ctx_(ctx),
      cfg_(ctx.cfg),
      ops_(ctx.ops),
      tpm_(ctx.tpm),
      d_(ctx.dims),
      tp_rank_(ctx.tp_rank),
      B_(int(d_.B)),
      T_(int(d_.T)),
      C_(int(d_.C)),
      NH_(int(d_.NH)),
      Ca_(int(d_.Ca)),
      C3_(int(d_.C3)),
      F_(int(d_.F)),
      F1_(int(d_.F1)),
      Nr_(int(d_.Nr)),
      slice_{ctx.cp_group ? ctx.cp_group->size() : 1, ctx.cp_group ? ctx.cp_group->rank() : 0} {}

void Block::make_ring(const ops::Ops::AttentionShape& local) {
  if (slice_.cp <= 1) return;
  const bool bf16 = cp_bf16_operands(ctx_.cp_bf16, local.hs);
  if (ctx_.cp_mode == CpMode::ulysses)
    ulysses_ = std::make_unique<UlyssesAttention>(ops_, *ctx_.cp_group, local, bf16);
  else
    ring_ = std::make_unique<RingAttention>(ops_, *ctx_.cp_group, local, bf16);
}

bool Block::CpAttention::takes_bf16() const {
  return block.ulysses_ ? block.ulysses_->bf16() : block.ring_ && block.ring_->bf16();
}

void Block::CpAttention::forward_bf16(std::uint16_t* out, float* lse, const std::uint16_t* q,
                                     const std::uint16_t* k, const std::uint16_t* v,
                                     const ops::Ops::AttentionShape& shape) {
  TRIDENT_CHECK(shape.b == block.B_ && shape.t == block.T_, "internal: CP attention over ",
                shape.b, " x ", shape.t, " rows, made for the microbatch's ", block.B_, " x ",
                block.T_);
  if (block.ulysses_) return block.ulysses_->forward_bf16(out, lse, q, k, v);
  block.ring_->forward_bf16(out, lse, q, k, v);
}

void Block::CpAttention::backward_bf16(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                                      const std::uint16_t* dout, const std::uint16_t* out,
                                      const float* lse, const std::uint16_t* q,
                                      const std::uint16_t* k, const std::uint16_t* v,
                                      const ops::Ops::AttentionShape& shape) {
  TRIDENT_CHECK(shape.b == block.B_ && shape.t == block.T_, "internal: CP attention backward "
                "over ", shape.b, " x ", shape.t, " rows, made for the microbatch's ", block.B_,
                " x ", block.T_);
  if (block.ulysses_) return block.ulysses_->backward_bf16(dq, dk, dv, dout, out, lse, q, k, v);
  block.ring_->backward_bf16(dq, dk, dv, dout, out, lse, q, k, v);
}

// The ring is made for the microbatch's shape; other shapes (inference) are refused where
// cp > 1 before they reach here (GptChunk: "the whole model on one rank").
void Block::CpAttention::forward(float* out, float* lse, const float* q, const float* k,
                                 const float* v, const ops::Ops::AttentionShape& shape,
                                 bool bf16_exact) {
  TRIDENT_CHECK(shape.b == block.B_ && shape.t == block.T_, "internal: CP attention over ",
                shape.b, " x ", shape.t, " rows, made for the microbatch's ", block.B_, " x ",
                block.T_);
  if (block.ulysses_) return block.ulysses_->forward(out, lse, q, k, v, bf16_exact);
  block.ring_->forward(out, lse, q, k, v, bf16_exact);
}

void Block::CpAttention::backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* out, const float* lse, const float* q,
                                  const float* k, const float* v,
                                  const ops::Ops::AttentionShape& shape, bool bf16_exact) {
  TRIDENT_CHECK(shape.b == block.B_ && shape.t == block.T_, "internal: CP attention backward "
                "over ", shape.b, " x ", shape.t, " rows, made for the microbatch's ", block.B_,
                " x ", block.T_);
  if (block.ulysses_)
    return block.ulysses_->backward(dq, dk, dv, dout, out, lse, q, k, v, bf16_exact);
  block.ring_->backward(dq, dk, dv, dout, out, lse, q, k, v, bf16_exact);
}

void Block::check_layer(const std::function<const ShardSpec*(Role)>&) const {}

void Block::leave(float* partial, float* y, int n, int out) {
  tpm_.leave_forward(partial, y, tpm_.local_rows(n) * out);
}

float* Block::TpCollectives::local_part(float* full, std::int64_t local_n) {
  return ctx.tpm.local_part(full, local_n);
}
void Block::TpCollectives::enter_forward(float* full, std::int64_t local_n) {
  ctx.tpm.enter_forward(full, local_n);
}
float* Block::TpCollectives::partial_of(float* y) {
  return ctx.tpm.sequence_parallel() ? ctx.full : y;
}
void Block::TpCollectives::leave_forward(float* partial, float* local, std::int64_t local_n) {
  ctx.tpm.leave_forward(partial, local, local_n);
}
const float* Block::TpCollectives::enter_backward(float* dfull, std::int64_t local_n) {
  return ctx.tpm.enter_backward(dfull, ctx.local, local_n);
}
const float* Block::TpCollectives::leave_backward(const float* dlocal, std::int64_t local_n) {
  return ctx.tpm.leave_backward(dlocal, ctx.full, local_n);
}

// decode's scratch: one token's activations in LayerActivations' order, then the scores.
std::int64_t Block::decode_scratch_floats() const {
  return 3 * d_.C + 4 + d_.C3 + d_.Ca + d_.F1 + d_.F +
         ops::Ops::decode_scratch_floats(1, NH_, T_);
}

LayerActivations Block::decode_views() const {
  TRIDENT_CHECK(decode_scratch_, "internal: Block::decode without set_decode_scratch");
  float* p = decode_scratch_;
  auto take = [&p](std::int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  LayerActivations la{};
  la.ln1 = take(C_), la.ln1_mean = take(1), la.ln1_rstd = take(1), la.qkv = take(C3_);
  la.atty = take(Ca_), la.res2 = take(C_), la.ln2 = take(C_), la.ln2_mean = take(1);
  la.ln2_rstd = take(1), la.fch = take(F1_), la.fch_gelu = take(F_);
  return la;
}

void Block::attend_cached(LayerActivations& la, const KvCache& c, int kv_heads,
                          std::int64_t k_col) {
  const std::int64_t W = kv_width();
  float* scores = decode_scratch_ + (decode_scratch_floats() -
                                     ops::Ops::decode_scratch_floats(1, NH_, T_));
  ops_.copy(c.k + std::int64_t(c.pos) * W, la.qkv + k_col, W);
  ops_.copy(c.v + std::int64_t(c.pos) * W, la.qkv + k_col + W, W);
  ops_.attention_decode(la.atty, scores, la.qkv, c.k, c.v, 1, c.pos + 1, NH_, kv_heads,
                        cfg_.head_dim(), C3_, W, 0, Ca_);
}

}  // namespace trident::model
