// test/unit/ops/cuda/emulate/device_copy.hpp — Dev<T>: a host vector's copy in the backend's
// device memory (allocated, uploaded, released with the object; host() reads it back), for the
// stand-in checks that call a backend's entry points directly (the stand-in checks that every
// pointer a kernel gets is device memory).
// defines: Dev
#pragma once

#include <cstddef>
#include <vector>

#include "trident/ops/ops.hpp"

template <typename T>
struct Dev {
  trident::ops::Ops& o;
  T* p;
  std::size_t n;
  Dev(trident::ops::Ops& ops, const std::vector<T>& h) : o(ops), n(h.size()) {
    p = static_cast<T*>(o.memory()->allocate(n * sizeof(T)));
    o.memory()->to_device(p, h.data(), n * sizeof(T));
  }
  ~Dev() { o.memory()->release(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> host() const {
    std::vector<T> h(n);
    o.memory()->to_host(h.data(), p, n * sizeof(T));
    return h;
  }
};
