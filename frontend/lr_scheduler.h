#pragma once
// Learning-rate schedules with PyTorch's closed forms. A scheduler sets each parameter
// group's lr from the group's initial lr and the epoch (or iteration) counter: construction
// applies epoch 0, every step() advances one. The optimizer must outlive its schedulers.
// ReduceLROnPlateau, which reacts to a metric instead, stands apart. Every scheduler has
// state_dict()/load_state_dict(), so a resumed run continues its schedule.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optim.h"
#include "state_dict.h"

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
  /// The closed form: lr of group `group` at `epoch` (>= 0); IndexError for a group the
  /// optimizer does not have, ValueError for a negative epoch.
  double lr_at(size_t group, int64_t epoch) const;
  Optimizer& optimizer() const { return optimizer_; }

  /// "last_epoch" (int64) and "base_lrs" (float64 [groups]): what a resumed run needs, since
  /// every schedule is a closed form of the two.
  StateDict state_dict() const;
  /// Restores a state_dict() of a scheduler over as many parameter groups and writes that
  /// epoch's lrs (and momentum) into the optimizer; the next step() continues from there.
  /// Throws ValueError/ShapeError naming the entry that does not fit; changes nothing then.
  void load_state_dict(const StateDict& state);

 protected:
  /// Records each group's initial lr (the current lr, unless a scheduler already did).
  explicit LRScheduler(Optimizer& optimizer);
  /// Applies epoch 0; derived constructors call it last, once lr_at works.
  void start() { set_epoch(0); }
  /// Replaces the base lrs (OneCycleLR's start from max_lr / div_factor, not the current lr).
  void set_base_lrs(std::vector<double> lrs) { base_lrs_ = std::move(lrs); }
  /// Writes what the schedule sets beside the lrs at `epoch` (OneCycleLR: the momentum).
  virtual void write_extra(int64_t /*epoch*/) {}
  /// lr_at's closed form, called with a valid group and epoch.
  virtual double schedule_lr(size_t group, int64_t epoch) const = 0;

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

 protected:
  double schedule_lr(size_t group, int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2
/// (torch.optim.lr_scheduler.CosineAnnealingLR's closed form).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0);

 protected:
  double schedule_lr(size_t group, int64_t epoch) const override;

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

 protected:
  double schedule_lr(size_t group, int64_t epoch) const override;

 private:
  int64_t warmup_steps_;
  double start_factor_, end_factor_;
};

/// base_lr * gamma^(number of milestones <= epoch) (torch.optim.lr_scheduler.MultiStepLR);
/// a milestone given twice decays twice, as PyTorch's Counter does.
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);

 protected:
  double schedule_lr(size_t group, int64_t epoch) const override;

 private:
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

/// base_lr * gamma^epoch (torch.optim.lr_scheduler.ExponentialLR).
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);

 protected:
  double schedule_lr(size_t group, int64_t epoch) const override;

 private:
  double gamma_;
};

/// base_lr * lambda(epoch) (torch.optim.lr_scheduler.LambdaLR). The functions are not part
/// of state_dict() (PyTorch saves them only when they are objects); construct the resumed
/// scheduler with the same ones.
class LambdaLR : public LRScheduler {
 public:
  using Lambda = std::function<double(int64_t)>;
  /// One function for every group.
  LambdaLR(Optimizer& optimizer, Lambda lr_lambda);
  /// One function per group.
  LambdaLR(Optimizer& optimizer, std::vector<Lambda> lr_lambdas);

 protected:
  double schedule_lr(size_t group, int64_t epoch) const override;

 private:
  std::vector<Lambda> lambdas_;
};

/// OneCycleLR's options (torch.optim.lr_scheduler.OneCycleLR's keyword arguments).
struct OneCycleLROptions {
  /// Fraction of the steps spent raising the lr.
  double pct_start = 0.3;
  enum class Anneal { Cos, Linear };
  Anneal anneal_strategy = Anneal::Cos;
  /// Cycle the momentum inversely to the lr between max_momentum and base_momentum (SGD's
  /// and RMSprop's momentum, Adam's betas.first); needs an optimizer that has one.
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  /// initial lr = max_lr / div_factor.
  double div_factor = 25;
  /// final lr = initial lr / final_div_factor.
  double final_div_factor = 1e4;
  /// A third phase: up to max_lr, back down to the initial lr (symmetrically), then to
  /// the final lr; otherwise up, then straight down to the final lr.
  bool three_phase = false;
};

/// The 1cycle policy (Smith & Topin), torch.optim.lr_scheduler.OneCycleLR: the lr rises from
/// max_lr / div_factor to max_lr over pct_start of `total_steps`, then anneals to the final
/// lr, stepped once per batch. Writes each group's "initial_lr"; stepping past total_steps
/// raises ValueError, as PyTorch.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
             const OneCycleLROptions& options = {});
  /// One max_lr per group.
  OneCycleLR(Optimizer& optimizer, std::vector<double> max_lrs, int64_t total_steps,
             const OneCycleLROptions& options = {});
  /// The momentum (or betas.first) the schedule gives at `epoch`.
  double momentum_at(int64_t epoch) const;

 protected:
  double schedule_lr(size_t group, int64_t epoch) const override;
  void write_extra(int64_t epoch) override;

 private:
  struct Phase {
    double end_step;
    // The phase's lr runs between two of these per group: 0 initial, 1 max, 2 final.
    int start_lr, end_lr;
    double start_momentum, end_momentum;
  };
  // The phase containing `epoch` and the fraction of it done.
  std::pair<const Phase*, double> locate(int64_t epoch) const;
  double anneal(double start, double end, double pct) const;

  std::vector<std::array<double, 3>> lrs_;  // per group: initial, max, final
  int64_t total_steps_;
  OneCycleLROptions options_;
  std::vector<Phase> phases_;
};

/// Runs `schedulers` one after another: scheduler k (k >= 1) takes over at epoch
/// milestones[k-1] and sees epochs counted from there (torch.optim.lr_scheduler.SequentialLR).
/// All schedulers must drive `optimizer`.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);

 protected:
  double schedule_lr(size_t group, int64_t epoch) const override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

/// The usual transformer schedule: LinearWarmup from `start_factor` over `warmup_steps`,
/// then cosine annealing to `eta_min` over the remaining `total_steps - warmup_steps`.
/// ReduceLROnPlateau's options (torch.optim.lr_scheduler.ReduceLROnPlateau's arguments).
struct ReduceLROnPlateauOptions {
  /// Min: the metric should fall (a loss); Max: it should rise (an accuracy).
  enum class Mode { Min, Max };
  Mode mode = Mode::Min;
  /// new lr = lr * factor; must be < 1.
  double factor = 0.1;
  /// Epochs without improvement tolerated; the lr drops at the one after.
  int64_t patience = 10;
  /// How much better than the best a metric must be to count as an improvement.
  double threshold = 1e-4;
  /// Rel: better than best * (1 -/+ threshold); Abs: better than best -/+ threshold.
  enum class ThresholdMode { Rel, Abs };
  ThresholdMode threshold_mode = ThresholdMode::Rel;
  /// Epochs after a reduction during which bad epochs are not counted.
  int64_t cooldown = 0;
  /// Lower bound of every group's lr (one value for all, or min_lrs per group).
  double min_lr = 0;
  std::vector<double> min_lrs{};
  /// A reduction smaller than this is skipped.
  double eps = 1e-8;
};

/// Lowers the lr by `factor` when a metric has stopped improving for `patience` epochs
/// (torch.optim.lr_scheduler.ReduceLROnPlateau). Reads and writes the optimizer's lrs.
class ReduceLROnPlateau {
 public:
  ReduceLROnPlateau(Optimizer& optimizer, const ReduceLROnPlateauOptions& options = {});
  ReduceLROnPlateau(const ReduceLROnPlateau&) = delete;
  ReduceLROnPlateau& operator=(const ReduceLROnPlateau&) = delete;

  /// Records one epoch's metric (a NaN never improves) and reduces the lrs when due.
  void step(double metric);
  /// The lrs after the last step(), one per group.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }
  /// The best metric so far (+inf in Min mode, -inf in Max, before any).
  double best() const { return best_; }
  /// Epochs since the last improvement, as counted against patience.
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  /// Epochs of cooldown left.
  int64_t cooldown_counter() const { return cooldown_counter_; }
  Optimizer& optimizer() const { return optimizer_; }

  /// "best", "num_bad_epochs", "cooldown_counter", "last_epoch" and "last_lr" [groups].
  StateDict state_dict() const;
  /// Restores a state_dict() of a scheduler over as many groups and writes its last_lr into
  /// the optimizer; ValueError/ShapeError naming the entry that does not fit.
  void load_state_dict(const StateDict& state);

 private:
  bool is_better(double metric) const;

  Optimizer& optimizer_;
  ReduceLROnPlateauOptions options_;
  std::vector<double> min_lrs_;
  std::vector<double> last_lr_;
  double best_;
  int64_t num_bad_epochs_ = 0, cooldown_counter_ = 0, last_epoch_ = 0;
};

std::unique_ptr<SequentialLR> warmup_cosine(Optimizer& optimizer, int64_t warmup_steps,
                                            int64_t total_steps, double start_factor = 1e-3,
                                            double eta_min = 0);

}  // namespace kiln::optim
