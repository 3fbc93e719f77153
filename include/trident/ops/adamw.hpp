// trident/ops/adamw.hpp — the scalar factors of one AdamW step, formed on the host in double
// from the shortest decimal of each float hyperparameter, as Python (torch) forms them (see
// Ops::adamw). Backends that run the elementwise update on a device form them here.
// defines: trident::ops::AdamWScalars, adamw_scalars, float_decimal
#pragma once

#include <charconv>
#include <cmath>
#include <system_error>

namespace trident::ops {

// The decimal a float was most likely written as: the shortest digits that read back as the
// same float (0.999f -> 0.999), as a double.
inline double float_decimal(float x) {
  char buf[32];
  const auto w = std::to_chars(buf, buf + sizeof buf, x);
  double d = x;
  if (w.ec == std::errc()) std::from_chars(buf, w.ptr, d);
  return d;
}

// p = p * decay - step * m / (sqrt(v) / bc2_sqrt + eps), m and v updated with (beta, 1 - beta).
struct AdamWScalars {
  float decay;     // 1 - lr * weight_decay
  float omb1;      // 1 - beta1
  float omb2;      // 1 - beta2
  float step;      // lr / bc1
  float bc2_sqrt;  // sqrt(bc2)
};

inline AdamWScalars adamw_scalars(float lr, float beta1, float beta2, float weight_decay,
                                  float bc1, float bc2) {
  const double lr_d = float_decimal(lr);
  AdamWScalars s{};
  s.decay = static_cast<float>(1.0 - lr_d * float_decimal(weight_decay));
  s.omb1 = static_cast<float>(1.0 - float_decimal(beta1));
  s.omb2 = static_cast<float>(1.0 - float_decimal(beta2));
  s.step = static_cast<float>(lr_d / double(bc1));
  s.bc2_sqrt = static_cast<float>(std::sqrt(double(bc2)));
  return s;
}

}  // namespace trident::ops
