#include "zero.h"

#include <string>

#include "../memory/reports/rank_bytes.h"
#include "../ops/ops.h"
#include "data_parallel.h"
#include "flat.h"

namespace kiln::dist {
namespace {

size_t bytes_of(const Tensor& t) { return t.defined() ? t.node()->nbytes() : 0; }

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, const Factory& make,
                                                 Communicator& comm, ZeroOptions options)
    : comm_(&comm), options_(options), params_(std::move(params)) {
  if (params_.empty()) {
    throw ValueError(
        "[ZeroRedundancyOptimizer] got an empty parameter list; expected the "
        "parameters of a module");
  }
  if (options_.stage != 1 && options_.stage != 2) {
    throw ValueError(
        "[ZeroRedundancyOptimizer] stage must be 1 (optimizer state) or 2 (and "
        "gradients), got " +
        std::to_string(options_.stage));
  }
  // One flat vector per dtype and device, in parameter order: a pure function of the
  // shapes, so every rank lays them out alike.
  for (size_t k = 0; k < params_.size(); ++k) {
    const Tensor& p = params_[k];
    FlatGroup* g = nullptr;
    for (FlatGroup& candidate : groups_) {
      const Tensor& first = params_[candidate.members.front()];
      if (first.dtype() == p.dtype() && first.device() == p.device()) g = &candidate;
    }
    if (g == nullptr) g = &groups_.emplace_back();
    g->members.push_back(k);
    g->offsets.push_back(g->total);
    g->total += p.numel();
  }
  const int64_t ranks = comm_->size();
  std::vector<Tensor> blocks;
  {
    NoGradGuard no_grad;
    for (FlatGroup& g : groups_) {
      g.shard = std::max<int64_t>(1, (g.total + ranks - 1) / ranks);
      const Tensor& first = params_[g.members.front()];
      g.block = zeros({g.shard}, first.dtype(), first.device());
      g.block.requires_grad_();
      blocks.push_back(g.block);
    }
  }
  refresh_blocks();
  local_ = make(std::move(blocks));
  if (!local_) {
    throw ValueError(
        "[ZeroRedundancyOptimizer] the optimizer factory returned no optimizer; expected it "
        "to build one over the parameter blocks it is given");
  }

  report_id_ = memory::add_rank_bytes_source([this] {
    memory::RankBytes b;
    b.holder = "ZeRO-" + std::to_string(options_.stage);
    b.rank = comm_->rank();
    b.ranks = comm_->size();
    b.parameters = parameter_bytes();
    b.gradients = local_gradient_bytes();
    b.optimizer_state = local_state_bytes();
    return b;
  });
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(DataParallel& ddp, const Factory& make,
                                                 ZeroOptions options)
    : ZeroRedundancyOptimizer(ddp.parameters(), make, ddp.communicator(), options) {
  ddp_ = &ddp;
  ddp.set_gradient_reducer([this] { reduce_gradients(); });
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() {
  memory::remove_rank_bytes_source(report_id_);
  if (ddp_) ddp_->set_gradient_reducer(nullptr);
}

Tensor ZeroRedundancyOptimizer::flat_range(const FlatGroup& g, const std::vector<Tensor>& pieces,
                                           int64_t start, int64_t count) const {
  const Tensor& first = params_[g.members.front()];
  return detail::flat_range(pieces, start, count, first.dtype(), first.device());
}

Tensor ZeroRedundancyOptimizer::my_block(const FlatGroup& g,
                                         const std::vector<Tensor>& pieces) const {
  return flat_range(g, pieces, g.shard * comm_->rank(), g.shard);
}

// The blocks are the optimizer's parameters; they equal this rank's slices of the
// parameters after every step(). Anything else that assigns a parameter (DataParallel's
// broadcast at construction, load_state_dict) replaces its node, which the weak pointers
// notice, so the blocks are rebuilt from the parameters before the next update.
void ZeroRedundancyOptimizer::refresh_blocks() {
  bool stale = seen_.size() != params_.size();
  for (size_t k = 0; !stale && k < params_.size(); ++k)
    stale = seen_[k].lock() != params_[k].node();
  if (!stale) return;
  NoGradGuard no_grad;
  for (FlatGroup& g : groups_) {
    std::vector<Tensor> pieces;
    for (size_t k : g.members) pieces.push_back(params_[k]);
    g.block.assign(my_block(g, pieces));
  }
  remember_parameters();
}

void ZeroRedundancyOptimizer::remember_parameters() {
  seen_.clear();
  for (const Tensor& p : params_) seen_.push_back(p.node());
}

void ZeroRedundancyOptimizer::zero_grad() {
  for (Tensor& p : params_) p.set_grad(Tensor());
  for (FlatGroup& g : groups_) g.block.set_grad(Tensor());
}

void ZeroRedundancyOptimizer::reduce_gradients() {
  NoGradGuard no_grad;
  // Each group's local gradients, end to end: a parameter without one contributes zeros
  // (as in DataParallel). Dropping the parameters' gradients before the evaluation leaves
  // the flat vectors as the only gradients kept after it.
  std::vector<std::vector<Tensor>> pending;
  std::vector<FlatGroup*> reduced;
  for (FlatGroup& g : groups_) {
    std::vector<Tensor> pieces;
    bool any = false;
    for (size_t k : g.members) {
      Tensor& p = params_[k];
      Tensor grad = p.grad();
      any = any || grad.defined();
      if (!grad.defined()) grad = zeros_like(p);
      if (grad.dtype() != p.dtype()) grad = cast(grad, p.dtype());
      pieces.push_back(grad);
    }
    if (!any) continue;
    for (size_t k : g.members) params_[k].set_grad(Tensor());
    pending.push_back(std::move(pieces));
    reduced.push_back(&g);
  }
  if (reduced.empty()) return;
  // One evaluation computes every group's gradients (the backward pass), then each group is
  // copied into its flat vector, whose reduce-scatter gives this rank its block.
  std::vector<Tensor> all;
  for (const auto& pieces : pending) all.insert(all.end(), pieces.begin(), pieces.end());
  eval(all);
  all.clear();
  std::vector<Tensor> flats;
  for (size_t i = 0; i < reduced.size(); ++i) {
    flats.push_back(flat_range(*reduced[i], pending[i], 0, reduced[i]->shard * comm_->size()));
    pending[i].clear();  // the parameters' gradients go back to the pool
  }
  for (size_t i = 0; i < flats.size(); ++i) {
    FlatGroup& g = *reduced[i];
    const bool alone = comm_->size() == 1;  // the flat vector is already the average
    if (options_.stage == 1) {
      // The whole average: every parameter gets its gradient back (as from DataParallel),
      // as a lazy slice that costs nothing unless read (gradient clipping reads it); the
      // block's gradient is copied out once, and step() uses it while the parameters still
      // hold these gradients.
      const Tensor average = alone ? flats[i] : comm_->all_reduce(flats[i], ReduceOp::Average);
      flats[i] = Tensor();
      g.grads_given.clear();
      for (size_t m = 0; m < g.members.size(); ++m) {
        Tensor& p = params_[g.members[m]];
        const int64_t start = g.offsets[m];
        p.set_grad(reshape(slice(average, 0, start, start + p.numel()), p.shape()));
        g.grads_given.push_back(p.grad().node());
      }
      g.block.set_grad(detail::flat_slice(average, g.shard * comm_->rank(), {g.shard}));
      continue;
    }
    const Tensor mine = alone ? flats[i] : comm_->reduce_scatter(flats[i], ReduceOp::Average);
    flats[i] = Tensor();  // the full flat gradient goes back to the pool here
    const Tensor held = g.block.grad();
    g.block.set_grad(held.defined() ? (held + mine).eval() : mine);
  }
}

void ZeroRedundancyOptimizer::step() {
  if (options_.stage == 2) reduce_gradients();
  refresh_blocks();
  {
    NoGradGuard no_grad;
    if (options_.stage == 1) {
      // This rank's block of the averaged gradients, unless reduce_gradients() made it from
      // the gradients the parameters still hold; groups where no parameter has one are not
      // updated (as the unsharded optimizer skips such parameters).
      for (FlatGroup& g : groups_) {
        bool given = g.grads_given.size() == g.members.size();
        for (size_t m = 0; given && m < g.members.size(); ++m)
          given = g.grads_given[m].lock() == params_[g.members[m]].grad().node();
        if (given) continue;
        std::vector<Tensor> pieces;
        bool any = false;
        for (size_t k : g.members) {
          const Tensor& p = params_[k];
          Tensor grad = p.grad();
          any = any || grad.defined();
          pieces.push_back(grad.defined() ? grad : zeros_like(p));
        }
        g.block.set_grad(any ? my_block(g, pieces) : Tensor());
      }
    }
  }
  local_->step();
  NoGradGuard no_grad;
  for (FlatGroup& g : groups_) {
    const Tensor whole = comm_->size() == 1 ? g.block : comm_->all_gather(g.block);
    for (size_t i = 0; i < g.members.size(); ++i) {
      Tensor& p = params_[g.members[i]];
      p.assign(detail::flat_slice(whole, g.offsets[i], p.shape()));
    }
  }
  remember_parameters();
}

size_t ZeroRedundancyOptimizer::local_state_bytes() const {
  size_t bytes = 0;
  for (const auto& [name, t] : local_->state_dict()) {
    if (name.rfind("state.", 0) == 0 && name.size() > 5 &&
        name.compare(name.size() - 5, 5, ".step") != 0) {
      bytes += bytes_of(t);
    }
  }
  return bytes;
}

size_t ZeroRedundancyOptimizer::local_gradient_bytes() const {
  size_t bytes = 0;
  for (const Tensor& p : params_) bytes += bytes_of(p.grad());
  if (options_.stage == 2) {
    for (const FlatGroup& g : groups_) bytes += bytes_of(g.block.grad());
  }
  return bytes;
}

size_t ZeroRedundancyOptimizer::parameter_bytes() const {
  size_t bytes = 0;
  for (const Tensor& p : params_) bytes += bytes_of(p);
  return bytes;
}

}  // namespace kiln::dist
