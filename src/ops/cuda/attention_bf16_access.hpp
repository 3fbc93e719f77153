// ops/cuda/attention_bf16_access.hpp — the bf16 attention entry points (private CudaOps
// members, cuda_ops.hpp's friend AttentionBf16Access) for the GPU op test, the attention
// benchmark and the stand-in's check, which call them on a CudaOps made by make_ops.
// defines: trident::ops::cuda::AttentionBf16Access
#pragma once

#include <cstdint>

#include "cuda_ops.hpp"

namespace trident::ops::cuda {

struct AttentionBf16Access {
  static void forward(Ops& o, std::uint16_t* out, float* lse, const std::uint16_t* q,
                      const std::uint16_t* k, const std::uint16_t* v,
                      const Ops::AttentionShape& s) {
    dynamic_cast<CudaOps&>(o).attention_forward_bf16(out, lse, q, k, v, s);
  }
  static void backward(Ops& o, std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                       const std::uint16_t* dout, const std::uint16_t* out, const float* lse,
                       const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                       const Ops::AttentionShape& s) {
    dynamic_cast<CudaOps&>(o).attention_backward_bf16(dq, dk, dv, dout, out, lse, q, k, v, s);
  }
};

}  // namespace trident::ops::cuda
