// test/unit/model/tiny_model.hpp — the model tests' tiny model: 2 layers over 8 positions of a
// 29-token vocabulary (odd: a vocabulary split pads), GPT-2 or Llama (SwiGLU of 24).
// defines: trident::model::tiny_model
#pragma once

#include <string>

#include "trident/model/spec.hpp"

namespace trident::model {

// n_kv_head: Llama's key/value heads (0: as many as the query heads).
inline ModelConfig tiny_model(const std::string& arch, int n_head, int d_model,
                              int n_kv_head = 0) {
  ModelConfig c;
  c.vocab_size = 29, c.seq_len = 8, c.n_layer = 2, c.n_head = n_head, c.d_model = d_model;
  c.arch = arch;
  if (arch == "llama") {
    c.ffn_hidden = 24;
    if (n_kv_head > 0) c.n_kv_head = n_kv_head;
  }
  return c;
}

}  // namespace trident::model
