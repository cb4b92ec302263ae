#include "sampler.h"

#include <new>
#include <stdexcept>
#include <string>

#include "communicator.h"

namespace kiln::dist {

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                                       DistributedSamplerOptions options)
    : n_(dataset_size), replicas_(num_replicas), rank_(rank), options_(options) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas) {
    throw ValueError("[DistributedSampler] rank " + std::to_string(rank) +
                     " is not in [0, num_replicas) for num_replicas " +
                     std::to_string(num_replicas));
  }
  if (dataset_size < 0) {
    throw ValueError("[DistributedSampler] expected a dataset size >= 0, got " +
                     std::to_string(dataset_size));
  }
  // As PyTorch: ceil(n / R) per rank when padding, floor(n / R) when dropping the tail.
  per_rank_ = options_.drop_last ? n_ / replicas_ : (n_ + replicas_ - 1) / replicas_;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, const Communicator& comm,
                                       DistributedSamplerOptions options)
    : DistributedSampler(dataset_size, comm.size(), comm.rank(), options) {}

std::vector<int64_t> DistributedSampler::indices(uint64_t epoch) const {
  try {
    return build_indices(epoch);
  } catch (const std::bad_alloc&) {
    // The whole epoch's order is built on every rank (as PyTorch's), 8 bytes per example.
    throw OutOfMemoryError("[DistributedSampler] cannot allocate the index list of an epoch over " +
                           std::to_string(n_) + " examples (8 bytes each, on every rank); " +
                           "expected a dataset size whose index list fits in memory");
  } catch (const std::length_error&) {
    throw OutOfMemoryError("[DistributedSampler] an epoch over " + std::to_string(n_) +
                           " examples needs more index entries than a vector can hold; "
                           "expected a dataset size whose index list fits in memory");
  }
}

std::vector<int64_t> DistributedSampler::build_indices(uint64_t epoch) const {
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = data::random_permutation(n_, options_.seed, epoch);
  } else {
    order.resize(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) order[static_cast<size_t>(i)] = i;
  }
  const int64_t total = per_rank_ * replicas_;
  // Padding repeats the order from its start (several times over when n < R).
  for (int64_t i = 0; static_cast<int64_t>(order.size()) < total; ++i) {
    order.push_back(order[static_cast<size_t>(i)]);
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank_));
  for (int64_t i = rank_; i < total; i += replicas_) mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace kiln::dist
