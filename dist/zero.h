#pragma once
// ZeRO (Rajbhandari et al.; DeepSpeed's flat partitioning, PyTorch's
// ZeroRedundancyOptimizer interface): the optimizer state, and at stage 2 the gradients, are
// sharded across ranks.
//
// The parameters of each dtype and device are laid end to end in one flat vector, padded to
// a multiple of the rank count; rank r owns the r-th of its N equal blocks. A rank's
// optimizer is made over its block only (one flat "shard" tensor per dtype and device), so
// it alone holds that block's state (Adam's moments, SGD's momentum, float32 master
// weights): 1/N of the whole, up to N-1 padding elements. step() updates the block and
// all-gathers the blocks into every rank's parameters.
//
// Stage 1: gradients are averaged in full; step() takes this rank's block of them. Stage 2:
// gradients are reduce-scattered instead; each rank keeps only the averaged gradient of its
// block and the full local gradients are dropped. Made from a DataParallel, the optimizer
// takes over its gradient synchronisation: each group's gradients are copied into one flat
// vector and all-reduced (stage 1) or reduce-scattered (stage 2) as one message.
//
//   dist::DataParallel ddp(*model);
//   dist::ZeroRedundancyOptimizer opt(ddp, [](std::vector<Tensor> ps) {
//     return std::make_unique<optim::Adam>(std::move(ps), optim::AdamOptions{.lr = 1e-3});
//   }, {.stage = 2});
//   ... opt.zero_grad(); ddp.backward(loss); opt.step();
//
// The optimizer must update elementwise (SGD, Adam, AdamW, RMSprop, Adagrad): it sees flat
// blocks, not the parameters' shapes, and one set of options for all of them. The update is
// the same arithmetic as the unsharded optimizer's; at stage 1 the parameters are
// bit-identical to it.
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "../frontend/optim.h"
#include "communicator.h"

namespace kiln::dist {

class DataParallel;

/// ZeroRedundancyOptimizer's settings.
struct ZeroOptions {
  /// 1: shard the optimizer state; 2: also reduce-scatter and shard the gradients.
  int stage = 1;
};

/// An optimizer whose state (stage 1) and gradients (stage 2) are sharded across the ranks
/// of a job; every rank holds the whole parameters (see the top of this file).
class ZeroRedundancyOptimizer {
 public:
  /// Makes the optimizer of one rank's blocks (one flat tensor per dtype and device).
  using Factory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;
  /// Shards `params` over `comm`'s ranks and makes this rank's optimizer with `make`. At
  /// stage 2 call reduce_gradients() after backward (or let step() do it). Throws ValueError
  /// for an empty list or a stage other than 1 or 2.
  ZeroRedundancyOptimizer(std::vector<Tensor> params, const Factory& make,
                          Communicator& comm = world(), ZeroOptions options = {});
  /// Shards `ddp`'s module parameters over its communicator; `ddp.backward()` then calls
  /// reduce_gradients() instead of its bucketed all-reduce. `ddp` must outlive this
  /// optimizer.
  ZeroRedundancyOptimizer(DataParallel& ddp, const Factory& make, ZeroOptions options = {});
  ~ZeroRedundancyOptimizer();
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  /// Averages the parameters' local gradients over the ranks, each dtype/device group as
  /// one flat message: stage 1 all-reduces and gives every parameter its averaged gradient;
  /// stage 2 reduce-scatters, adds this rank's block to its gradient shard and drops the
  /// full gradients. Does nothing when no parameter has a gradient. A collective: every
  /// rank calls it (DataParallel::backward does, for an optimizer made from it).
  void reduce_gradients();
  /// Updates this rank's blocks with its optimizer, then all-gathers every parameter from
  /// the blocks (one all-gather per dtype and device). Stage 2 reduces pending local
  /// gradients first; stage 1 expects averaged ones (reduce_gradients() or DataParallel).
  /// A collective: every rank calls it.
  void step();
  /// Clears every parameter's gradient and this rank's gradient shards.
  void zero_grad();

  /// 1 or 2.
  int stage() const { return options_.stage; }
  /// This rank's optimizer (learning rates, schedulers).
  optim::Optimizer* local() const { return local_.get(); }
  /// Bytes of optimizer state this rank holds (its optimizer's state tensors).
  size_t local_state_bytes() const;
  /// Bytes of gradients this rank holds: its shards at stage 2 (and any local gradients not
  /// yet reduced), the parameters' full gradients at stage 1.
  size_t local_gradient_bytes() const;
  /// Bytes of the parameters (every rank holds them whole).
  size_t parameter_bytes() const;
  /// Elements of this rank's block of dtype/device group `group` (all blocks are equal).
  int64_t shard_numel(size_t group) const { return groups_.at(group).shard; }
  /// Number of dtype/device groups (flat vectors).
  size_t num_groups() const { return groups_.size(); }

 private:
  // The parameters of one dtype and device, end to end: parameter k starts at offset[k];
  // `shard` elements per rank, the last block padded with zeros.
  struct FlatGroup {
    std::vector<size_t> members;  // indices into params_
    std::vector<int64_t> offsets;
    int64_t total = 0;
    int64_t shard = 0;
    Tensor block;  // this rank's block: the parameter its optimizer updates
    // Stage 1: the gradients reduce_gradients() gave the members, from which the block's
    // gradient was taken (a member's new gradient means it must be taken again).
    std::vector<std::weak_ptr<Node>> grads_given;
  };
  // Elements [start, start + count) of `pieces` (one per member) laid end to end and
  // padded with zeros, as a flat tensor of the group's dtype and device (dist/flat.h).
  Tensor flat_range(const FlatGroup& g, const std::vector<Tensor>& pieces, int64_t start,
                    int64_t count) const;
  // This rank's block of `pieces` laid end to end.
  Tensor my_block(const FlatGroup& g, const std::vector<Tensor>& pieces) const;
  // Rebuilds the blocks from the parameters when something else has assigned them.
  void refresh_blocks();
  // Records the parameters' current nodes (what refresh_blocks compares with).
  void remember_parameters();

  Communicator* comm_;
  ZeroOptions options_;
  DataParallel* ddp_ = nullptr;
  std::vector<Tensor> params_;
  std::vector<FlatGroup> groups_;
  std::unique_ptr<optim::Optimizer> local_;
  std::vector<std::weak_ptr<Node>> seen_;  // the parameters' nodes after the last step
  int report_id_ = 0;                      // memory::rank_bytes source
};

}  // namespace kiln::dist
