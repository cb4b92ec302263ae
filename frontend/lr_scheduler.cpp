// Schedules use closed forms of (base lr, epoch) rather than PyTorch's chained per-step
// updates: equal in exact arithmetic, free of accumulated rounding, and they make jumping
// to an epoch (resuming) and sequencing schedules trivial.
#include "lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "../ops/sources.h"

namespace kiln::optim {
namespace {

std::string num(double v) { return Scalar(v).str(); }

// A float64 [n] tensor of `values`.
Tensor doubles(const std::vector<double>& values) {
  return from_vector<double>(values, {static_cast<int64_t>(values.size())});
}

// Reads a scheduler state entry that must exist and hold `count` numbers (count 0: one
// number of any shape with one element). ValueError/ShapeError name the scheduler and key.
std::vector<double> read_entry(const StateDict& state, const std::string& key, size_t count,
                               const std::string& where) {
  auto it = state.find(key);
  if (it == state.end() || !it->second.defined()) {
    throw ValueError(where + "missing entry '" + key + "'");
  }
  const Tensor& t = it->second;
  const size_t want = count == 0 ? 1 : count;
  if (t.numel() != static_cast<int64_t>(want) || (count > 0 && t.ndim() != 1)) {
    throw ShapeError(where + "entry '" + key + "' is " + std::string(dtype_name(t.dtype())) +
                     shape_str(t.shape()) + "; expected " +
                     (count == 0 ? std::string("one number")
                                 : "[" + std::to_string(count) + "] (one per parameter group)"));
  }
  return t.to_vector<double>();
}

// Throws ValueError for a key outside `known`: a state_dict of another kind of scheduler.
void reject_unknown(const StateDict& state, const std::vector<std::string>& known,
                    const std::string& where) {
  for (const auto& [key, _] : state) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      throw ValueError(where + "unexpected entry '" + key + "'");
    }
  }
}

// A whole, non-negative epoch count read from a state entry.
int64_t read_count(const StateDict& state, const std::string& key, const std::string& where) {
  const double v = read_entry(state, key, 0, where)[0];
  if (!(v >= 0) || v != std::floor(v)) {
    throw ValueError(where + "entry '" + key + "' must be a whole number >= 0, got " + num(v));
  }
  return static_cast<int64_t>(v);
}

}  // namespace

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    if (!optimizer.initial_lr(g)) optimizer.set_initial_lr(g, optimizer.lr(g));
    base_lrs_.push_back(*optimizer.initial_lr(g));
  }
}

void LRScheduler::step() { set_epoch(last_epoch_ + 1); }

double LRScheduler::lr_at(size_t group, int64_t epoch) const {
  if (group >= base_lrs_.size()) {
    throw IndexError("[LRScheduler] parameter group " + std::to_string(group) +
                     " is out of range; the scheduler has " + std::to_string(base_lrs_.size()));
  }
  if (epoch < 0) {
    throw ValueError("[LRScheduler] expected epoch >= 0, got " + std::to_string(epoch));
  }
  return schedule_lr(group, epoch);
}

void LRScheduler::set_epoch(int64_t epoch) {
  if (epoch < 0) {
    throw ValueError("[LRScheduler] expected epoch >= 0, got " + std::to_string(epoch));
  }
  if (optimizer_.num_param_groups() != base_lrs_.size()) {
    throw ValueError(
        "[LRScheduler] the optimizer has " + std::to_string(optimizer_.num_param_groups()) +
        " parameter groups but the scheduler was created for " + std::to_string(base_lrs_.size()));
  }
  // Computed in full before anything is written, so an epoch a schedule refuses changes
  // nothing.
  std::vector<double> lrs;
  for (size_t g = 0; g < base_lrs_.size(); ++g) lrs.push_back(lr_at(g, epoch));
  last_epoch_ = epoch;
  last_lr_ = std::move(lrs);
  for (size_t g = 0; g < base_lrs_.size(); ++g) optimizer_.set_lr(g, last_lr_[g]);
  write_extra(epoch);
}

StateDict LRScheduler::state_dict() const {
  return {{"last_epoch", kiln::tensor(last_epoch_)}, {"base_lrs", doubles(base_lrs_)}};
}

void LRScheduler::load_state_dict(const StateDict& state) {
  const std::string where = "[LRScheduler] load_state_dict: ";
  reject_unknown(state, {"last_epoch", "base_lrs"}, where);
  const int64_t epoch = read_count(state, "last_epoch", where);
  std::vector<double> base = read_entry(state, "base_lrs", base_lrs_.size(), where);
  std::vector<double> saved = std::move(base_lrs_);
  base_lrs_ = std::move(base);
  try {
    set_epoch(epoch);  // a OneCycleLR past its total_steps refuses here
  } catch (...) {
    base_lrs_ = std::move(saved);
    throw;
  }
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  if (step_size < 1)
    throw ValueError("[StepLR] expected step_size >= 1, got " + std::to_string(step_size));
  start();
}

double StepLR::schedule_lr(size_t group, int64_t epoch) const {
  return base_lrs()[group] * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer), t_max_(T_max), eta_min_(eta_min) {
  if (T_max < 1)
    throw ValueError("[CosineAnnealingLR] expected T_max >= 1, got " + std::to_string(T_max));
  start();
}

double CosineAnnealingLR::schedule_lr(size_t group, int64_t epoch) const {
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

double LinearWarmup::schedule_lr(size_t group, int64_t epoch) const {
  const double progress =
      static_cast<double>(std::min(epoch, warmup_steps_)) / static_cast<double>(warmup_steps_);
  return base_lrs()[group] * (start_factor_ + (end_factor_ - start_factor_) * progress);
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
  for (int64_t m : milestones_) {
    if (m < 0) throw ValueError("[MultiStepLR] expected milestones >= 0, got " + std::to_string(m));
  }
  std::sort(milestones_.begin(), milestones_.end());
  start();
}

double MultiStepLR::schedule_lr(size_t group, int64_t epoch) const {
  const auto passed =
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin();
  return base_lrs()[group] * std::pow(gamma_, static_cast<double>(passed));
}

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma)
    : LRScheduler(optimizer), gamma_(gamma) {
  if (!(gamma >= 0)) throw ValueError("[ExponentialLR] expected gamma >= 0, got " + num(gamma));
  start();
}

double ExponentialLR::schedule_lr(size_t group, int64_t epoch) const {
  return base_lrs()[group] * std::pow(gamma_, static_cast<double>(epoch));
}

LambdaLR::LambdaLR(Optimizer& optimizer, Lambda lr_lambda)
    : LambdaLR(optimizer, std::vector<Lambda>(optimizer.num_param_groups(), lr_lambda)) {}

LambdaLR::LambdaLR(Optimizer& optimizer, std::vector<Lambda> lr_lambdas)
    : LRScheduler(optimizer), lambdas_(std::move(lr_lambdas)) {
  if (lambdas_.size() != base_lrs().size()) {
    throw ValueError("[LambdaLR] expected " + std::to_string(base_lrs().size()) +
                     " lr_lambdas (one per parameter group), got " +
                     std::to_string(lambdas_.size()));
  }
  for (size_t g = 0; g < lambdas_.size(); ++g) {
    if (!lambdas_[g]) throw ValueError("[LambdaLR] lr_lambda " + std::to_string(g) + " is empty");
  }
  start();
}

double LambdaLR::schedule_lr(size_t group, int64_t epoch) const {
  return base_lrs()[group] * lambdas_[group](epoch);
}

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
                       const OneCycleLROptions& options)
    : OneCycleLR(optimizer, std::vector<double>(optimizer.num_param_groups(), max_lr), total_steps,
                 options) {}

OneCycleLR::OneCycleLR(Optimizer& optimizer, std::vector<double> max_lrs, int64_t total_steps,
                       const OneCycleLROptions& o)
    : LRScheduler(optimizer), total_steps_(total_steps), options_(o) {
  const std::string tag = "[OneCycleLR] ";
  if (total_steps < 1)
    throw ValueError(tag + "expected total_steps >= 1, got " + std::to_string(total_steps));
  if (!(o.pct_start >= 0 && o.pct_start <= 1))
    throw ValueError(tag + "expected pct_start in [0, 1], got " + num(o.pct_start));
  if (!(o.div_factor > 0) || !(o.final_div_factor > 0)) {
    throw ValueError(tag + "expected div_factor > 0 and final_div_factor > 0, got " +
                     num(o.div_factor) + " and " + num(o.final_div_factor));
  }
  if (max_lrs.size() != optimizer.num_param_groups()) {
    throw ValueError(tag + "expected " + std::to_string(optimizer.num_param_groups()) +
                     " max_lrs (one per parameter group), got " + std::to_string(max_lrs.size()));
  }
  for (size_t g = 0; g < max_lrs.size(); ++g) {
    if (!(max_lrs[g] >= 0)) throw ValueError(tag + "expected max_lr >= 0, got " + num(max_lrs[g]));
  }
  if (o.cycle_momentum) {
    for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
      if (!optimizer.momentum(g)) {
        throw ValueError(tag +
                         "cycle_momentum needs an optimizer with a momentum or betas (SGD, "
                         "RMSprop, Adam, AdamW); pass cycle_momentum = false for this one");
      }
    }
  }
  // PyTorch's phase boundaries, float as there: the last step of each phase.
  const double total = static_cast<double>(total_steps);
  if (o.three_phase) {
    phases_ = {{o.pct_start * total - 1, 0, 1, o.max_momentum, o.base_momentum},
               {2 * o.pct_start * total - 2, 1, 0, o.base_momentum, o.max_momentum},
               {total - 1, 0, 2, o.max_momentum, o.max_momentum}};
  } else {
    phases_ = {{o.pct_start * total - 1, 0, 1, o.max_momentum, o.base_momentum},
               {total - 1, 1, 2, o.base_momentum, o.max_momentum}};
  }
  std::vector<double> initials;
  for (size_t g = 0; g < max_lrs.size(); ++g) {
    const double initial = max_lrs[g] / o.div_factor;
    lrs_.push_back({initial, max_lrs[g], initial / o.final_div_factor});
    // Later schedulers start from it, as from PyTorch's group["initial_lr"].
    optimizer.set_initial_lr(g, initial);
    initials.push_back(initial);
  }
  set_base_lrs(std::move(initials));
  start();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (options_.anneal_strategy == OneCycleLROptions::Anneal::Linear)
    return (end - start) * pct + start;
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
}

std::pair<const OneCycleLR::Phase*, double> OneCycleLR::locate(int64_t epoch) const {
  if (epoch > total_steps_) {
    throw ValueError("[OneCycleLR] tried to step " + std::to_string(epoch) +
                     " times; the schedule has total_steps " + std::to_string(total_steps_));
  }
  const double step = static_cast<double>(epoch);
  double start = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    const Phase& p = phases_[i];
    if (step <= p.end_step || i + 1 == phases_.size()) {
      return {&p, (step - start) / (p.end_step - start)};
    }
    start = p.end_step;
  }
  return {&phases_.back(), 1.0};  // not reached: the last phase always matches
}

double OneCycleLR::schedule_lr(size_t group, int64_t epoch) const {
  auto [phase, pct] = locate(epoch);
  return anneal(lrs_[group][phase->start_lr], lrs_[group][phase->end_lr], pct);
}

double OneCycleLR::momentum_at(int64_t epoch) const {
  auto [phase, pct] = locate(epoch);
  return anneal(phase->start_momentum, phase->end_momentum, pct);
}

void OneCycleLR::write_extra(int64_t epoch) {
  if (!options_.cycle_momentum) return;
  const double m = momentum_at(epoch);
  for (size_t g = 0; g < optimizer().num_param_groups(); ++g) optimizer().set_momentum(g, m);
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

double SequentialLR::schedule_lr(size_t group, int64_t epoch) const {
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

// ---------------------------------------------------------------------------------------
// ReduceLROnPlateau

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, const ReduceLROnPlateauOptions& o)
    : optimizer_(optimizer), options_(o) {
  const std::string tag = "[ReduceLROnPlateau] ";
  if (!(o.factor < 1.0 && o.factor >= 0))
    throw ValueError(tag + "expected factor in [0, 1), got " + num(o.factor));
  if (o.patience < 0)
    throw ValueError(tag + "expected patience >= 0, got " + std::to_string(o.patience));
  if (o.cooldown < 0)
    throw ValueError(tag + "expected cooldown >= 0, got " + std::to_string(o.cooldown));
  if (!(o.threshold >= 0))
    throw ValueError(tag + "expected threshold >= 0, got " + num(o.threshold));
  if (!(o.eps >= 0)) throw ValueError(tag + "expected eps >= 0, got " + num(o.eps));
  const size_t groups = optimizer.num_param_groups();
  if (o.min_lrs.empty()) {
    min_lrs_.assign(groups, o.min_lr);
  } else if (o.min_lrs.size() == groups) {
    min_lrs_ = o.min_lrs;
  } else {
    throw ValueError(tag + "expected " + std::to_string(groups) +
                     " min_lrs (one per parameter group), got " + std::to_string(o.min_lrs.size()));
  }
  for (double m : min_lrs_) {
    if (!(m >= 0)) throw ValueError(tag + "expected min_lr >= 0, got " + num(m));
  }
  best_ = o.mode == ReduceLROnPlateauOptions::Mode::Min ? INFINITY : -INFINITY;
  for (size_t g = 0; g < groups; ++g) last_lr_.push_back(optimizer.lr(g));
}

bool ReduceLROnPlateau::is_better(double a) const {
  using O = ReduceLROnPlateauOptions;
  const bool rel = options_.threshold_mode == O::ThresholdMode::Rel;
  const double t = options_.threshold;
  if (options_.mode == O::Mode::Min) return rel ? a < best_ * (1 - t) : a < best_ - t;
  return rel ? a > best_ * (t + 1) : a > best_ + t;
}

void ReduceLROnPlateau::step(double metric) {
  if (optimizer_.num_param_groups() != min_lrs_.size()) {
    throw ValueError(
        "[ReduceLROnPlateau] the optimizer has " + std::to_string(optimizer_.num_param_groups()) +
        " parameter groups but the scheduler was created for " + std::to_string(min_lrs_.size()));
  }
  ++last_epoch_;
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;  // bad epochs in cooldown do not count
  }
  if (num_bad_epochs_ > options_.patience) {
    for (size_t g = 0; g < min_lrs_.size(); ++g) {
      const double old_lr = optimizer_.lr(g);
      const double new_lr = std::max(old_lr * options_.factor, min_lrs_[g]);
      if (old_lr - new_lr > options_.eps) optimizer_.set_lr(g, new_lr);
    }
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  }
  for (size_t g = 0; g < min_lrs_.size(); ++g) last_lr_[g] = optimizer_.lr(g);
}

StateDict ReduceLROnPlateau::state_dict() const {
  return {{"best", kiln::tensor(best_)},
          {"num_bad_epochs", kiln::tensor(num_bad_epochs_)},
          {"cooldown_counter", kiln::tensor(cooldown_counter_)},
          {"last_epoch", kiln::tensor(last_epoch_)},
          {"last_lr", doubles(last_lr_)}};
}

void ReduceLROnPlateau::load_state_dict(const StateDict& state) {
  const std::string where = "[ReduceLROnPlateau] load_state_dict: ";
  reject_unknown(state, {"best", "num_bad_epochs", "cooldown_counter", "last_epoch", "last_lr"},
                 where);
  const double best = read_entry(state, "best", 0, where)[0];
  const int64_t bad = read_count(state, "num_bad_epochs", where);
  const int64_t cooldown = read_count(state, "cooldown_counter", where);
  const int64_t epoch = read_count(state, "last_epoch", where);
  std::vector<double> lrs = read_entry(state, "last_lr", min_lrs_.size(), where);
  best_ = best;
  num_bad_epochs_ = bad;
  cooldown_counter_ = cooldown;
  last_epoch_ = epoch;
  last_lr_ = std::move(lrs);
  for (size_t g = 0; g < last_lr_.size(); ++g) optimizer_.set_lr(g, last_lr_[g]);
}

}  // namespace kiln::optim
