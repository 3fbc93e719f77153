// The conjugate TP operators (see trident/parallel/tp_mappings.hpp).
#include "trident/parallel/tp_mappings.hpp"

#include <algorithm>

#include "trident/core/error.hpp"

namespace trident::parallel {

TpMappings::TpMappings(Comm& tp, bool sequence_parallel)
    : tp_(tp), sp_(sequence_parallel && tp.size() > 1) {}

std::int64_t TpMappings::local_rows(std::int64_t rows) const {
  if (!sp_) return rows;
  TRIDENT_CHECK(rows % tp_.size() == 0, "sequence parallelism: ", rows,
                " tokens do not split over ", tp_.size(), " tensor-parallel ranks");
  return rows / tp_.size();
}

float* TpMappings::local_part(float* full, std::int64_t local_n) const {
  return sp_ ? full + std::int64_t(tp_.rank()) * local_n : full;
}

void TpMappings::enter_forward(float* full, std::int64_t local_n) {
  if (sp_) tp_.all_gather_inplace(full, local_n);
}

const float* TpMappings::enter_backward(float* dfull, float* dlocal, std::int64_t local_n) {
  if (!sp_) {
    tp_.allreduce_sum(dfull, local_n);
    return dfull;
  }
  tp_.reduce_scatter_sum(dfull, dlocal, local_n);
  return dlocal;
}

void TpMappings::leave_forward(float* partial, float* local, std::int64_t local_n) {
  if (!sp_) {
    TRIDENT_CHECK(partial == local, "TpMappings::leave_forward without SP reduces in place");
    tp_.allreduce_sum(local, local_n);
    return;
  }
  tp_.reduce_scatter_sum(partial, local, local_n);
}

const float* TpMappings::leave_backward(const float* dlocal, float* dfull,
                                        std::int64_t local_n) {
  if (!sp_) return dlocal;
  tp_.all_gather(dlocal, dfull, local_n);  // not in place: dlocal may be device memory
  return dfull;
}

}  // namespace trident::parallel
