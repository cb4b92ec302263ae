#include "zero.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "../ops/ops.h"

namespace kiln::dist {

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, const Factory& make,
                                                 Communicator& comm)
    : comm_(&comm), params_(std::move(params)) {
  if (params_.empty()) {
    throw ValueError(
        "[ZeroRedundancyOptimizer] got an empty parameter list; expected the "
        "parameters of a module");
  }
  // Largest first, to the least loaded rank (ties: the lower rank), as PyTorch partitions:
  // a pure function of the shapes, so every rank computes the same owners.
  std::vector<size_t> order(params_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return params_[a].node()->nbytes() > params_[b].node()->nbytes();
  });
  std::vector<size_t> load(static_cast<size_t>(comm_->size()), 0);
  owners_.assign(params_.size(), 0);
  for (size_t k : order) {
    const auto least = std::min_element(load.begin(), load.end()) - load.begin();
    owners_[k] = static_cast<int>(least);
    load[static_cast<size_t>(least)] += params_[k].node()->nbytes();
  }
  std::vector<Tensor> mine;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (owners_[k] == comm_->rank()) mine.push_back(params_[k]);
  }
  if (!mine.empty()) local_ = make(std::move(mine));

  for (size_t k = 0; k < params_.size(); ++k) {
    auto same = std::find_if(groups_.begin(), groups_.end(), [&](const std::vector<size_t>& g) {
      const Tensor& first = params_[g.front()];
      return owners_[g.front()] == owners_[k] && first.dtype() == params_[k].dtype() &&
             first.device() == params_[k].device();
    });
    if (same == groups_.end()) {
      groups_.push_back({k});
    } else {
      same->push_back(k);
    }
  }
}

void ZeroRedundancyOptimizer::zero_grad() {
  for (Tensor& p : params_) p.set_grad(Tensor());
}

void ZeroRedundancyOptimizer::step() {
  if (local_) local_->step();
  NoGradGuard no_grad;
  for (const auto& group : groups_) {
    const int owner = owners_[group.front()];
    const Tensor& first = params_[group.front()];
    int64_t total = 0;
    for (size_t k : group) total += params_[k].numel();
    // The owner sends its updated values; the others only need a buffer of the same shape.
    Tensor flat;
    if (owner == comm_->rank()) {
      std::vector<Tensor> pieces;
      for (size_t k : group) pieces.push_back(reshape(params_[k], {params_[k].numel()}));
      flat = pieces.size() == 1 ? pieces[0] : concat(pieces, 0);
    } else {
      flat = zeros({total}, first.dtype(), first.device());
    }
    const Tensor updated = comm_->broadcast(flat, owner);
    int64_t offset = 0;
    for (size_t k : group) {
      Tensor& p = params_[k];
      p.assign(reshape(slice(updated, 0, offset, offset + p.numel()), p.shape()));
      offset += p.numel();
    }
  }
}

size_t ZeroRedundancyOptimizer::local_state_bytes() const {
  if (!local_) return 0;
  size_t bytes = 0;
  for (const auto& [name, t] : local_->state_dict()) {
    if (name.rfind("state.", 0) == 0 && name.size() > 5 &&
        name.compare(name.size() - 5, 5, ".step") != 0) {
      bytes += t.node()->nbytes();
    }
  }
  return bytes;
}

}  // namespace kiln::dist
