// The vocabulary-parallel cross-entropy forward (see trident/model/vocab_parallel_xent.hpp).
#include "trident/model/vocab_parallel_xent.hpp"

namespace trident::model {

void vocab_parallel_xent_forward(ops::Ops& ops, parallel::Comm& group, float* loss,
                                 float* row_max, float* stats, const float* logits,
                                 const std::int32_t* targets, int rows, int cols, int valid,
                                 int vocab_start) {
  float* sumexp = stats;
  float* target_logit = stats + rows;
  if (group.size() == 1) {  // nothing to reduce between the passes: the backend's one pass
    ops.xent_forward(loss, row_max, sumexp, target_logit, logits, targets, rows, cols, valid,
                     vocab_start);
    return;
  }
  // One read of this shard's logits (max, sum of exponentials at that max, target logit); the
  // global max from the shards' maxima, each shard's sum rescaled to it, then the sums.
  float* shard_max = loss;  // loss[rows] is written last: it holds the shard's max meanwhile
  ops.xent_shard_stats(shard_max, sumexp, target_logit, logits, targets, rows, cols, valid,
                       vocab_start);
  ops.copy(row_max, shard_max, rows);
  group.allreduce_max(row_max, rows);
  ops.xent_rescale_sumexp(sumexp, shard_max, row_max, rows);
  group.allreduce_sum(stats, 2 * std::int64_t(rows));  // both in one call
  ops.xent_loss(loss, row_max, sumexp, target_logit, rows);
}

}  // namespace trident::model
