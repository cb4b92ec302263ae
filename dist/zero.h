#pragma once
// ZeRO stage 1 (Rajbhandari et al.; PyTorch's ZeroRedundancyOptimizer): the optimizer state
// is sharded across ranks. Each parameter is owned by one rank, which alone keeps its
// optimizer state (Adam's moments, SGD's momentum, master weights) and updates it; the
// updated parameters are then broadcast from their owners. Per-rank optimizer state is about
// 1/N of the whole (parameters are not split, so the balance is as even as their sizes
// allow). Gradients must already be averaged (DataParallel); the update is the same
// arithmetic as the unsharded optimizer's, so the parameters are bit-identical to it.
//
//   dist::DataParallel ddp(*model);
//   dist::ZeroRedundancyOptimizer opt(model->parameters(), [](std::vector<Tensor> ps) {
//     return std::make_unique<optim::Adam>(std::move(ps), optim::AdamOptions{.lr = 1e-3});
//   });
//   ... opt.zero_grad(); ddp.backward(loss); opt.step();
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "../frontend/optim.h"
#include "communicator.h"

namespace kiln::dist {

class ZeroRedundancyOptimizer {
 public:
  /// Makes the optimizer of one rank's shard from its parameters.
  using Factory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;
  /// Partitions `params` over `comm`'s ranks (largest first, each to the rank holding the
  /// fewest bytes so far; the same on every rank) and makes this rank's optimizer over its
  /// share with `make` (none when it owns no parameter). Throws ValueError for an empty list.
  ZeroRedundancyOptimizer(std::vector<Tensor> params, const Factory& make,
                          Communicator& comm = world());

  /// Updates this rank's parameters with its optimizer, then broadcasts every parameter from
  /// its owner (one broadcast per owner and dtype). A collective: every rank calls it.
  void step();
  /// Clears every parameter's gradient (not only this rank's).
  void zero_grad();

  /// The rank that owns parameter `index` (position in the constructor's list).
  int owner(size_t index) const { return owners_.at(index); }
  /// This rank's optimizer (for learning rates and schedulers); null when it owns nothing.
  optim::Optimizer* local() const { return local_.get(); }
  /// Bytes of optimizer state this rank holds (its optimizer's state tensors).
  size_t local_state_bytes() const;

 private:
  Communicator* comm_;
  std::vector<Tensor> params_;
  std::vector<int> owners_;
  std::unique_ptr<optim::Optimizer> local_;
  // Parameters broadcast together: one owner, one dtype and device.
  std::vector<std::vector<size_t>> groups_;
};

}  // namespace kiln::dist
