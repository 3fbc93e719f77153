// The layout's name and comparison (see trident/train/layout.hpp).
#include "trident/train/layout.hpp"

#include <tuple>

namespace trident::train {

std::string Layout::str() const {
  // cp only where it is used, so that the cp = 1 layouts read as they always have.
  const std::string cp_part = cp > 1 ? trident::str(" cp", cp) : std::string();
  return trident::str("tp", tp, cp_part, " pp", pp, " dp", dp, " vpp", vpp, " ", schedule,
                      " mbs", micro_batch_size, " rc:", recompute, " sp:",
                      sequence_parallel ? 1 : 0, " zero:", zero_stage, " split:",
                      pipeline_layers);
}

bool Layout::operator==(const Layout& o) const {
  auto key = [](const Layout& l) {
    return std::tie(l.tp, l.cp, l.dp, l.pp, l.vpp, l.schedule, l.pipeline_layers,
                    l.micro_batch_size, l.recompute, l.sequence_parallel, l.zero_stage,
                    l.tp_mode, l.cp_mode);
  };
  return key(*this) == key(o);
}

}  // namespace trident::train
