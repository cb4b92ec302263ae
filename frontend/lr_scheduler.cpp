// Schedules use closed forms of (base lr, epoch) rather than PyTorch's chained per-step
// updates: equal in exact arithmetic, free of accumulated rounding, and they make jumping
// to an epoch (resuming) and sequencing schedules trivial.
#include "lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace kiln::optim {
namespace {

std::string num(double v) { return Scalar(v).str(); }

}  // namespace

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    if (!optimizer.initial_lr(g)) optimizer.set_initial_lr(g, optimizer.lr(g));
    base_lrs_.push_back(*optimizer.initial_lr(g));
  }
}

void LRScheduler::step() { set_epoch(last_epoch_ + 1); }

void LRScheduler::set_epoch(int64_t epoch) {
  if (epoch < 0) {
    throw ValueError("[LRScheduler] expected epoch >= 0, got " + std::to_string(epoch));
  }
  if (optimizer_.num_param_groups() != base_lrs_.size()) {
    throw ValueError(
        "[LRScheduler] the optimizer has " + std::to_string(optimizer_.num_param_groups()) +
        " parameter groups but the scheduler was created for " + std::to_string(base_lrs_.size()));
  }
  last_epoch_ = epoch;
  last_lr_.clear();
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    last_lr_.push_back(lr_at(g, epoch));
    optimizer_.set_lr(g, last_lr_.back());
  }
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  if (step_size < 1)
    throw ValueError("[StepLR] expected step_size >= 1, got " + std::to_string(step_size));
  start();
}

double StepLR::lr_at(size_t group, int64_t epoch) const {
  return base_lrs()[group] * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer), t_max_(T_max), eta_min_(eta_min) {
  if (T_max < 1)
    throw ValueError("[CosineAnnealingLR] expected T_max >= 1, got " + std::to_string(T_max));
  start();
}

double CosineAnnealingLR::lr_at(size_t group, int64_t epoch) const {
  const double phase = std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(t_max_);
  return eta_min_ + (base_lrs()[group] - eta_min_) * (1 + std::cos(phase)) / 2;
}

LinearWarmup::LinearWarmup(Optimizer& optimizer, int64_t warmup_steps, double start_factor,
                           double end_factor)
    : LRScheduler(optimizer),
      warmup_steps_(warmup_steps),
      start_factor_(start_factor),
      end_factor_(end_factor) {
  if (warmup_steps < 1) {
    throw ValueError("[LinearWarmup] expected warmup_steps >= 1, got " +
                     std::to_string(warmup_steps));
  }
  if (!(start_factor > 0 && start_factor <= 1)) {
    throw ValueError("[LinearWarmup] expected start_factor in (0, 1], got " + num(start_factor));
  }
  if (!(end_factor >= 0 && end_factor <= 1)) {
    throw ValueError("[LinearWarmup] expected end_factor in [0, 1], got " + num(end_factor));
  }
  start();
}

double LinearWarmup::lr_at(size_t group, int64_t epoch) const {
  const double progress =
      static_cast<double>(std::min(epoch, warmup_steps_)) / static_cast<double>(warmup_steps_);
  return base_lrs()[group] * (start_factor_ + (end_factor_ - start_factor_) * progress);
}

SequentialLR::SequentialLR(Optimizer& optimizer,
                           std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer),
      schedulers_(std::move(schedulers)),
      milestones_(std::move(milestones)) {
  if (schedulers_.empty()) throw ValueError("[SequentialLR] expected at least one scheduler");
  if (milestones_.size() + 1 != schedulers_.size()) {
    throw ValueError("[SequentialLR] expected " + std::to_string(schedulers_.size() - 1) +
                     " milestones for " + std::to_string(schedulers_.size()) + " schedulers, got " +
                     std::to_string(milestones_.size()));
  }
  for (size_t k = 0; k < schedulers_.size(); ++k) {
    if (!schedulers_[k])
      throw ValueError("[SequentialLR] scheduler " + std::to_string(k) + " is null");
    if (&schedulers_[k]->optimizer() != &optimizer) {
      throw ValueError("[SequentialLR] scheduler " + std::to_string(k) +
                       " drives a different optimizer than the one given");
    }
    if (schedulers_[k]->base_lrs().size() != base_lrs().size()) {
      throw ValueError("[SequentialLR] scheduler " + std::to_string(k) + " was created for " +
                       std::to_string(schedulers_[k]->base_lrs().size()) +
                       " parameter groups, the optimizer has " + std::to_string(base_lrs().size()));
    }
  }
  for (size_t k = 0; k < milestones_.size(); ++k) {
    if (milestones_[k] < 1 || (k > 0 && milestones_[k] <= milestones_[k - 1])) {
      throw ValueError("[SequentialLR] milestones must be positive and increasing; milestone " +
                       std::to_string(k) + " is " + std::to_string(milestones_[k]));
    }
  }
  start();
}

double SequentialLR::lr_at(size_t group, int64_t epoch) const {
  const auto k = static_cast<size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin());
  const int64_t local = k == 0 ? epoch : epoch - milestones_[k - 1];
  return schedulers_[k]->lr_at(group, local);
}

std::unique_ptr<SequentialLR> warmup_cosine(Optimizer& optimizer, int64_t warmup_steps,
                                            int64_t total_steps, double start_factor,
                                            double eta_min) {
  if (total_steps <= warmup_steps) {
    throw ValueError("[warmup_cosine] expected total_steps > warmup_steps, got " +
                     std::to_string(total_steps) + " and " + std::to_string(warmup_steps));
  }
  auto warmup = std::make_shared<LinearWarmup>(optimizer, warmup_steps, start_factor);
  auto cosine = std::make_shared<CosineAnnealingLR>(optimizer, total_steps - warmup_steps, eta_min);
  return std::make_unique<SequentialLR>(optimizer,
                                        std::vector<std::shared_ptr<LRScheduler>>{warmup, cosine},
                                        std::vector<int64_t>{warmup_steps});
}

}  // namespace kiln::optim
