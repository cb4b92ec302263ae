#pragma once
// DistributedSampler: each rank's shard of a dataset for data::DataLoader, as PyTorch's
// torch.utils.data.DistributedSampler shards it.
#include <cstdint>
#include <vector>

#include "../frontend/data.h"

namespace kiln::dist {

class Communicator;

/// How DistributedSampler orders and pads.
struct DistributedSamplerOptions {
  /// A new seeded order every epoch (the same order on every rank, before sharding).
  bool shuffle = true;
  uint64_t seed = 0;
  /// Drop the tail that does not divide evenly instead of padding it with repeated examples.
  bool drop_last = false;
};

/// Rank r of R visits positions r, r+R, r+2R, ... of the epoch's order (a seeded
/// permutation of the dataset with shuffle, 0..n-1 without), padded by repeating the
/// order's first examples to a multiple of R so that every rank runs the same number of
/// steps (or truncated with drop_last). The shards of one epoch are disjoint apart from
/// that padding; epoch e's order is data::random_permutation(n, seed, e), the order a
/// shuffling DataLoader with the same seed visits.
class DistributedSampler : public data::Sampler {
 public:
  /// Shards `dataset_size` examples over `num_replicas` ranks; throws ValueError for a rank
  /// outside [0, num_replicas) or a negative size.
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                     DistributedSamplerOptions options = {});
  /// The shard of `comm`'s rank.
  DistributedSampler(int64_t dataset_size, const Communicator& comm,
                     DistributedSamplerOptions options = {});

  /// Examples per rank and epoch.
  int64_t size() const override { return per_rank_; }
  /// This rank's indices for epoch `epoch`.
  std::vector<int64_t> indices(uint64_t epoch) const override;

 private:
  std::vector<int64_t> build_indices(uint64_t epoch) const;

  int64_t n_;
  int replicas_, rank_;
  DistributedSamplerOptions options_;
  int64_t per_rank_;
};

}  // namespace kiln::dist
