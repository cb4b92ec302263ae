#pragma once
// Optimizers (SGD, Adam, AdamW, RMSprop, Adagrad) with PyTorch's update rules, and gradient
// clipping.
//
// An optimizer holds copies of the parameter handles. step() builds the update lazily and
// replaces each parameter's value with Tensor::assign, so the module that owns the
// parameters sees the new values, no graph grows across steps, and the next evaluation
// runs forward, backward and update together. Values that change every step (learning
// rate, bias corrections) enter kernels as rank-0 constant tensors, not as literals, so a
// training loop compiles its kernels once.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../core/tensor.h"
#include "../ops/autocast.h"
#include "state_dict.h"

namespace kiln::optim {

/// Base of every optimizer: parameter groups, their per-parameter state, zero_grad and
/// the learning-rate access that schedulers use. Not copyable (schedulers refer to it).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Builds one update of every parameter whose gradient is defined; evaluates nothing.
  virtual void step() = 0;
  /// Clears every parameter's gradient (leaves it undefined, PyTorch's set_to_none).
  void zero_grad();

  /// Number of parameter groups (the constructor's plus add_param_group's).
  size_t num_param_groups() const { return groups_.size(); }
  /// The parameters of group `group`, in the order they were given.
  const std::vector<Tensor>& params(size_t group) const;
  /// Every parameter, group after group; a parameter's position here is its state index.
  std::vector<Tensor> parameters() const;
  /// Learning rate of group `group` (what schedulers read and write).
  virtual double lr(size_t group) const = 0;
  /// Sets group `group`'s learning rate; the next step() uses it without recompiling.
  virtual void set_lr(size_t group, double lr) = 0;
  /// The momentum a scheduler may cycle (SGD's and RMSprop's momentum, Adam's betas.first);
  /// empty for optimizers without one (Adagrad).
  virtual std::optional<double> momentum(size_t /*group*/) const { return std::nullopt; }
  /// Sets what momentum() reads; ValueError for optimizers without a momentum.
  virtual void set_momentum(size_t group, double momentum);
  /// The lr a scheduler started from (PyTorch's "initial_lr"); empty until one attaches.
  std::optional<double> initial_lr(size_t group) const;
  /// Records group `group`'s initial lr (LRScheduler does, once per group).
  void set_initial_lr(size_t group, double lr);
  /// Updates applied so far to parameter `index` (state index, see parameters()).
  int64_t step_count(size_t index) const;

  /// A snapshot of the optimizer state: "state.<i>.<name>" tensors and "state.<i>.step"
  /// (int64) for every parameter that has been updated, plus "param_groups.<g>.lr"
  /// (float64). Later steps do not change the returned tensors.
  StateDict state_dict() const;
  /// Restores a state_dict() of an optimizer of the same kind over parameters of the same
  /// shapes; throws ValueError/ShapeError naming the entry that does not fit.
  void load_state_dict(const StateDict& state);

 protected:
  /// Per-parameter state: named tensors (momentum, moments) and the number of updates.
  struct ParamState {
    std::map<std::string, Tensor> tensors;
    int64_t step = 0;
  };

  /// `name` prefixes messages ("SGD").
  explicit Optimizer(const char* name) : name_(name) {}
  /// Validates and appends a group (floating leaf tensors, none already present).
  void append_group(std::vector<Tensor> params);
  /// The state of parameter `index` (state index).
  ParamState& state(size_t index) { return state_[index]; }
  /// The state index of the first parameter of `group`.
  size_t first_index(size_t group) const { return first_index_[group]; }
  /// The state tensor names an updated parameter of `group` carries.
  virtual std::vector<std::string> state_names(size_t group) const = 0;
  /// "[name] " for messages.
  std::string tag() const { return "[" + name_ + "] "; }
  /// Whether `group` keeps float32 master weights of its half parameters.
  virtual bool master_weights(size_t /*group*/) const { return false; }
  /// Runs `update(param, grad)` on the parameter itself, or, with master weights and a half
  /// parameter, on its float32 master copy (made on the first step) with the gradient in
  /// float32, then rounds the master into the parameter.
  void update_through_master(const Tensor& param, const Tensor& grad, ParamState& s, bool master,
                             const std::function<void(const Tensor&, const Tensor&)>& update);

 private:
  std::string name_;
  std::vector<std::vector<Tensor>> groups_;
  std::vector<size_t> first_index_;
  std::vector<std::optional<double>> initial_lrs_;
  std::vector<ParamState> state_;
};

/// An optimizer whose groups each carry an `Options` (a struct with at least `lr`).
template <typename Options>
class OptimizerWithOptions : public Optimizer {
 public:
  /// Adds parameters with their own hyperparameters (e.g. no weight decay for biases).
  void add_param_group(std::vector<Tensor> params, const Options& options) {
    validate(options);
    append_group(std::move(params));
    options_.push_back(options);
  }
  /// The hyperparameters of `group`; changing them takes effect at the next step().
  Options& options(size_t group) { return options_[checked(group)]; }
  const Options& options(size_t group) const { return options_[checked(group)]; }
  double lr(size_t group) const override { return options_[checked(group)].lr; }
  void set_lr(size_t group, double lr) override { options_[checked(group)].lr = lr; }
  bool master_weights(size_t group) const override {
    return options_[checked(group)].master_weights;
  }
  std::optional<double> momentum(size_t group) const override {
    const Options& o = options_[checked(group)];
    if constexpr (requires { o.betas.first; }) return o.betas.first;
    if constexpr (requires { o.momentum; }) return o.momentum;
    return std::nullopt;
  }
  void set_momentum(size_t group, double momentum) override {
    Options& o = options_[checked(group)];
    if constexpr (requires { o.betas.first; }) {
      o.betas.first = momentum;
    } else if constexpr (requires { o.momentum; }) {
      o.momentum = momentum;
    } else {
      Optimizer::set_momentum(group, momentum);
    }
  }

 protected:
  using Optimizer::Optimizer;
  /// `group`, after params(group) has thrown IndexError if the optimizer lacks it.
  size_t checked(size_t group) const {
    params(group);
    return group;
  }
  /// Throws ValueError for hyperparameters outside their domain.
  virtual void validate(const Options& options) const = 0;
  /// Calls update(param, grad, state, options) for every parameter that has a gradient,
  /// under NoGradGuard, after checking each group's options: the loop every step() shares.
  template <typename Update>
  void for_each_update(Update&& update) {
    NoGradGuard no_grad;
    amp::autocast_off no_autocast;  // updates run in the parameters' own dtypes
    for (size_t g = 0; g < num_param_groups(); ++g) {
      const Options& o = options(g);
      validate(o);
      const std::vector<Tensor>& ps = params(g);
      for (size_t k = 0; k < ps.size(); ++k) {
        Tensor grad = ps[k].grad();
        if (!grad.defined()) continue;
        ParamState& s = state(first_index(g) + k);
        update_through_master(ps[k], grad, s, o.master_weights,
                              [&](const Tensor& p, const Tensor& d) { update(p, d, s, o); });
      }
    }
  }

 private:
  std::vector<Options> options_;
};

/// torch.optim.SGD's hyperparameters.
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  /// L2 penalty added to the gradient.
  double weight_decay = 0;
  /// Nesterov momentum; needs momentum > 0 and dampening == 0.
  bool nesterov = false;
  /// float16/bfloat16 parameters are updated through a float32 master copy (state
  /// "master"), with float32 state, and take its rounded value after each step (O2 training:
  /// updates smaller than a half's precision are not lost).
  bool master_weights = false;
};

/// Stochastic gradient descent, exactly torch.optim.SGD: d = g + wd*p; with momentum the
/// buffer starts as d and then becomes momentum*buf + (1 - dampening)*d; p -= lr * d (or
/// lr * (d + momentum*buf) with Nesterov).
class SGD : public OptimizerWithOptions<SGDOptions> {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options = {});
  void step() override;

 protected:
  void validate(const SGDOptions& options) const override;
  std::vector<std::string> state_names(size_t group) const override;
};

/// torch.optim.Adam's hyperparameters.
struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  /// L2 penalty added to the gradient (Adam); decoupled decay in AdamW.
  double weight_decay = 0;
  /// Keep the running maximum of the second moment (Reddi et al., AMSGrad).
  bool amsgrad = false;
  /// float16/bfloat16 parameters are updated through a float32 master copy (state
  /// "master"), with float32 state, and take its rounded value after each step (O2 training:
  /// updates smaller than a half's precision are not lost).
  bool master_weights = false;
};

/// torch.optim.AdamW's hyperparameters: Adam's, with a default decoupled decay of 0.01.
struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  /// float16/bfloat16 parameters are updated through a float32 master copy (state
  /// "master"), with float32 state, and take its rounded value after each step (O2 training:
  /// updates smaller than a half's precision are not lost).
  bool master_weights = false;
};

/// Adam (Kingma & Ba) with torch.optim.Adam's bias correction: m = lerp(m, g, 1 - b1),
/// v = b2*v + (1 - b2)*g*g, p -= lr/(1 - b1^t) * m / (sqrt(v)/sqrt(1 - b2^t) + eps).
class Adam : public OptimizerWithOptions<AdamOptions> {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options = {});
  void step() override;

 protected:
  void validate(const AdamOptions& options) const override;
  std::vector<std::string> state_names(size_t group) const override;
};

/// AdamW (Loshchilov & Hutter): Adam whose weight decay scales the parameter,
/// p *= 1 - lr*wd, before the Adam update instead of adding to the gradient.
class AdamW : public OptimizerWithOptions<AdamWOptions> {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  void step() override;

 protected:
  void validate(const AdamWOptions& options) const override;
  std::vector<std::string> state_names(size_t group) const override;
};

/// torch.optim.RMSprop's hyperparameters.
struct RMSpropOptions {
  double lr = 1e-2;
  /// Smoothing constant of the running average of squared gradients.
  double alpha = 0.99;
  /// Added to the root of the average (outside the sqrt, as PyTorch).
  double eps = 1e-8;
  /// L2 penalty added to the gradient.
  double weight_decay = 0;
  /// Momentum of the normalised step (state "momentum_buffer" when > 0).
  double momentum = 0;
  /// Normalise by the centred second moment (an estimate of the variance; state "grad_avg").
  bool centered = false;
  /// float32 master copies of half parameters, as SGDOptions::master_weights.
  bool master_weights = false;
};

/// RMSprop, exactly torch.optim.RMSprop: d = g + wd*p; v = alpha*v + (1 - alpha)*d^2;
/// centred: m = lerp(m, d, 1 - alpha), v~ = v - m^2; a = sqrt(v~) + eps; with momentum
/// buf = momentum*buf + d/a and p -= lr*buf, else p -= lr * d/a.
class RMSprop : public OptimizerWithOptions<RMSpropOptions> {
 public:
  RMSprop(std::vector<Tensor> params, const RMSpropOptions& options = {});
  void step() override;

 protected:
  void validate(const RMSpropOptions& options) const override;
  std::vector<std::string> state_names(size_t group) const override;
};

/// torch.optim.Adagrad's hyperparameters.
struct AdagradOptions {
  double lr = 1e-2;
  /// The step t (from 1) uses lr / (1 + (t - 1) * lr_decay).
  double lr_decay = 0;
  /// L2 penalty added to the gradient.
  double weight_decay = 0;
  /// Starting value of the sum of squared gradients (state "sum").
  double initial_accumulator_value = 0;
  double eps = 1e-10;
  /// float32 master copies of half parameters, as SGDOptions::master_weights.
  bool master_weights = false;
};

/// Adagrad (Duchi et al.), exactly torch.optim.Adagrad: d = g + wd*p; sum += d^2;
/// p -= lr / (1 + (t - 1) lr_decay) * d / (sqrt(sum) + eps). Has no momentum, so
/// OneCycleLR needs cycle_momentum = false with it.
class Adagrad : public OptimizerWithOptions<AdagradOptions> {
 public:
  Adagrad(std::vector<Tensor> params, const AdagradOptions& options = {});
  void step() override;

 protected:
  void validate(const AdagradOptions& options) const override;
  std::vector<std::string> state_names(size_t group) const override;
};

/// clip_grad_norm found a NaN or infinite total norm with error_if_nonfinite set.
class NonFiniteNormError : public ValueError {
  using ValueError::ValueError;
};

/// The joint `norm_type`-norm (inf for the max norm) of the defined gradients of `params`,
/// as torch.nn.utils.get_total_norm of their gradients: lazy, rank-0, summed in float32 at
/// least; 0 when no parameter has a gradient. ValueError for a norm_type below 0.
Tensor total_grad_norm(const std::vector<Tensor>& params, double norm_type = 2.0);
/// Scales the gradients of `params` so that their joint `norm_type`-norm (inf for the max
/// norm) is at most `max_norm`, as torch.nn.utils.clip_grad_norm_: coefficient
/// min(max_norm / (total + 1e-6), 1). Returns the total norm before clipping (lazy,
/// rank-0). Parameters without a gradient are skipped. With `error_if_nonfinite` the norm is
/// evaluated now (a synchronisation point) and a NaN or infinite norm raises
/// NonFiniteNormError, leaving the gradients unscaled, as PyTorch.
Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = false);
/// Clamps every defined gradient of `params` to [-clip_value, clip_value].
void clip_grad_value(const std::vector<Tensor>& params, double clip_value);

}  // namespace kiln::optim
