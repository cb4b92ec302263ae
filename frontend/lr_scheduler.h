#pragma once
// Learning-rate schedules with PyTorch's closed forms. A scheduler sets each parameter
// group's lr from the group's initial lr and the epoch (or iteration) counter: construction
// applies epoch 0, every step() advances one. The optimizer must outlive its schedulers.
#include <cstdint>
#include <memory>
#include <vector>

#include "optim.h"

namespace kiln::optim {

/// Base of the schedules: the epoch counter, the groups' base lrs and the update.
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances one epoch and writes the new lr into every group.
  void step();
  /// Jumps to `epoch` (e.g. when resuming training) and writes that epoch's lrs.
  void set_epoch(int64_t epoch);
  /// The lrs this scheduler last wrote, one per group.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  /// Epochs stepped since construction (0 right after it).
  int64_t last_epoch() const { return last_epoch_; }
  /// The lr each group started from (its "initial_lr").
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  /// The closed form: lr of group `group` at `epoch` (>= 0).
  virtual double lr_at(size_t group, int64_t epoch) const = 0;
  Optimizer& optimizer() const { return optimizer_; }

 protected:
  /// Records each group's initial lr (the current lr, unless a scheduler already did).
  explicit LRScheduler(Optimizer& optimizer);
  /// Applies epoch 0; derived constructors call it last, once lr_at works.
  void start() { set_epoch(0); }

 private:
  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = 0;
};

/// base_lr * gamma^floor(epoch / step_size) (torch.optim.lr_scheduler.StepLR).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2
/// (torch.optim.lr_scheduler.CosineAnnealingLR's closed form).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0);
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

/// Linear warmup: the factor goes linearly from start_factor to end_factor over
/// `warmup_steps` epochs and stays there (torch.optim.lr_scheduler.LinearLR).
class LinearWarmup : public LRScheduler {
 public:
  LinearWarmup(Optimizer& optimizer, int64_t warmup_steps, double start_factor = 1.0 / 3,
               double end_factor = 1.0);
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  int64_t warmup_steps_;
  double start_factor_, end_factor_;
};

/// Runs `schedulers` one after another: scheduler k (k >= 1) takes over at epoch
/// milestones[k-1] and sees epochs counted from there (torch.optim.lr_scheduler.SequentialLR).
/// All schedulers must drive `optimizer`.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

/// The usual transformer schedule: LinearWarmup from `start_factor` over `warmup_steps`,
/// then cosine annealing to `eta_min` over the remaining `total_steps - warmup_steps`.
std::unique_ptr<SequentialLR> warmup_cosine(Optimizer& optimizer, int64_t warmup_steps,
                                            int64_t total_steps, double start_factor = 1e-3,
                                            double eta_min = 0);

}  // namespace kiln::optim
