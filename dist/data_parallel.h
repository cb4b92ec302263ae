#pragma once
// Data parallelism: every rank holds the whole model, trains on its own shard of each batch,
// and averages gradients with the other ranks before the optimizer step, so all ranks take
// the same step (that of one process on the concatenated batch) and keep the same weights.
//
//   dist::Session session;                       // MPI under mpiexec, one process otherwise
//   dist::DataParallel ddp(*model);              // rank 0's initial weights everywhere
//   for (...) {
//     opt.zero_grad();
//     ddp.backward(loss);                        // backward + bucketed gradient all-reduce
//     opt.step();
//   }
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "../frontend/nn/module.h"
#include "communicator.h"

namespace kiln::dist {

/// DataParallel's settings.
struct DataParallelOptions {
  /// Gradients are averaged in buckets of about this many bytes (PyTorch DDP's 25 MB):
  /// fewer, larger messages, several in flight at once. A larger tensor is a bucket alone.
  size_t bucket_bytes = 25u << 20;
  /// The first bucket (the last layers' gradients, the first a backward pass produces)
  /// closes at min(this, bucket_bytes), so its all-reduce starts early (PyTorch DDP's 1 MiB).
  size_t first_bucket_bytes = 1u << 20;
  /// Broadcast the module's buffers (BatchNorm statistics) from rank 0 at construction.
  bool broadcast_buffers = true;
};

/// Wraps a module for data-parallel training over `comm`'s ranks. Construction broadcasts
/// rank 0's parameters (and buffers) into every rank's module (a collective: every rank
/// constructs it); every rank must hold a module with the same parameter shapes and dtypes
/// (checked: DistError otherwise).
class DataParallel {
 public:
  explicit DataParallel(nn::Module& module, Communicator& comm = world(),
                        DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// loss.backward(), then synchronize_gradients() unless a no_sync() guard is alive.
  void backward(const Tensor& loss);
  /// Replaces every parameter's gradient by its average over the ranks, bucket by bucket: a
  /// host bucket's all-reduce starts as soon as the evaluation has produced its gradients,
  /// while the rest of the backward pass runs (without a memory budget), and the buckets'
  /// all-reduces run concurrently. A
  /// parameter without a gradient on this rank contributes zeros and gets the average.
  /// Does nothing while a no_sync() guard is alive. With a gradient reducer set, calls it
  /// instead.
  void synchronize_gradients();
  /// Hands gradient synchronisation to `reduce` (ZeRO stage 2 reduce-scatters into its
  /// shards); nullptr restores the bucketed all-reduce.
  void set_gradient_reducer(std::function<void()> reduce) { reducer_ = std::move(reduce); }

  /// While alive, backward() accumulates gradients locally without communicating (gradient
  /// accumulation); the first backward() after it averages what was accumulated.
  class NoSync {
   public:
    explicit NoSync(DataParallel& owner) : owner_(&owner) { ++owner_->no_sync_depth_; }
    ~NoSync() {
      if (owner_) --owner_->no_sync_depth_;
    }
    NoSync(NoSync&& other) noexcept : owner_(other.owner_) { other.owner_ = nullptr; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    DataParallel* owner_;
  };
  /// A guard that turns gradient synchronisation off while it lives.
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  /// True unless a no_sync() guard is alive.
  bool synchronizing() const { return no_sync_depth_ == 0; }

  /// Broadcasts rank 0's buffers again (e.g. BatchNorm running statistics before evaluating).
  void broadcast_buffers();
  /// A hash of this rank's parameter values (their bytes), for comparing ranks.
  uint64_t parameter_hash() const;
  /// All-gathers parameter_hash() and throws DistError naming the ranks whose parameters
  /// differ from rank 0's (a collective).
  void check_parameters_in_sync();

  /// Parameter indices (into module.parameters()) of each bucket, in reduction order.
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }
  Communicator& communicator() const { return *comm_; }
  /// What one gradient synchronisation did: the buckets it all-reduced, and how many of
  /// them started while the evaluation of the gradients (the backward pass) still ran.
  struct SyncStats {
    size_t buckets = 0;
    size_t started_during_backward = 0;
  };
  /// The last synchronize_gradients()'s figures (zeros before the first, with one rank or
  /// under a gradient reducer).
  SyncStats last_sync() const { return last_sync_; }
  /// The wrapped module's parameters (the handles the optimizer updates).
  const std::vector<Tensor>& parameters() const { return params_; }

 private:
  void check_same_model();

  // Sets the gradients of the parameters of `bucket` from their averaged flat message.
  void set_bucket_gradients(size_t bucket, const Tensor& average);

  nn::Module* module_;
  Communicator* comm_;
  DataParallelOptions options_;
  std::vector<Tensor> params_;
  std::vector<std::vector<size_t>> buckets_;
  int no_sync_depth_ = 0;
  std::function<void()> reducer_;
  int report_id_ = 0;  // memory::rank_bytes source
  SyncStats last_sync_;
};

}  // namespace kiln::dist
