// Optimizer updates as lazy graph. Everything here runs under NoGradGuard so that updates
// record no gradient history; every state change goes through assign() so that the graph
// of step k is never an input of step k+1 once evaluated.
#include "optim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <unordered_set>

#include "../ops/ops.h"

namespace kiln::optim {
namespace {

std::string num(double v) { return Scalar(v).str(); }

// A rank-0 constant holding a value that changes from step to step (lr, bias corrections).
// A C++ number would become a literal in the generated source and compile a new kernel
// every step; a constant is a kernel argument. float64 parameters get a float64 value,
// the others float32 (the operand is converted to the parameter's dtype in the kernel).
// It lives on the parameter's device, so a CUDA step reads it as a kernel argument too.
Tensor step_scalar(double value, const Tensor& param) {
  if (param.dtype() == DType::Float64) return kiln::tensor(value, param.device());
  return kiln::tensor(static_cast<float>(value), param.device());
}

// An evaluated all-zero constant shaped like `like`: the first update then has the same
// graph structure as the later ones and reuses their kernels.
Tensor zero_state(const Tensor& like) {
  std::vector<unsigned char> bytes(std::max<size_t>(1, like.node()->nbytes()), 0);
  return from_data(bytes.data(), like.shape(), like.dtype(), like.device());
}

// A new handle to the same value: assign() on it leaves the source handle alone.
Tensor own_handle(const Tensor& t) { return Tensor(t.node()); }

void require(bool ok, const std::string& tag, const std::string& what) {
  if (!ok) throw ValueError(tag + what);
}

// Parses a non-negative decimal index; nullopt for anything else.
std::optional<size_t> parse_index(const std::string& s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  size_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<size_t>(c - '0');
  }
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Optimizer

void Optimizer::zero_grad() {
  for (const auto& group : groups_) {
    for (Tensor p : group) p.set_grad(Tensor());
  }
}

const std::vector<Tensor>& Optimizer::params(size_t group) const {
  if (group >= groups_.size()) {
    throw IndexError(tag() + "parameter group " + std::to_string(group) + " does not exist (" +
                     std::to_string(groups_.size()) + " groups)");
  }
  return groups_[group];
}

std::vector<Tensor> Optimizer::parameters() const {
  std::vector<Tensor> all;
  for (const auto& group : groups_) all.insert(all.end(), group.begin(), group.end());
  return all;
}

std::optional<double> Optimizer::initial_lr(size_t group) const {
  params(group);
  return initial_lrs_[group];
}

void Optimizer::set_momentum(size_t group, double /*momentum*/) {
  params(group);
  throw ValueError(tag() + "has no momentum or betas to set (parameter group " +
                   std::to_string(group) + ")");
}

void Optimizer::set_initial_lr(size_t group, double lr) {
  params(group);
  initial_lrs_[group] = lr;
}

int64_t Optimizer::step_count(size_t index) const {
  if (index >= state_.size()) {
    throw IndexError(tag() + "parameter index " + std::to_string(index) + " out of range (" +
                     std::to_string(state_.size()) + " parameters)");
  }
  return state_[index].step;
}

void Optimizer::append_group(std::vector<Tensor> params) {
  std::unordered_set<const Node*> seen;
  for (const auto& group : groups_) {
    for (const Tensor& p : group) seen.insert(p.node().get());
  }
  // An empty list is almost always a module whose parameters were never registered; an
  // optimizer over nothing would silently train nothing.
  if (params.empty()) {
    throw ValueError(tag() + "got an empty parameter list for group " +
                     std::to_string(groups_.size()) +
                     "; expected at least one parameter (a module's parameters() is empty "
                     "when its layers were not registered)");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    std::string which =
        "parameter " + std::to_string(i) + " of group " + std::to_string(groups_.size());
    if (!p.defined()) throw ValueError(tag() + which + " is undefined");
    if (!is_floating(p.dtype())) {
      throw DTypeError(tag() + which + " is " + std::string(dtype_name(p.dtype())) +
                       shape_str(p.shape()) + "; only floating tensors can be optimized");
    }
    if (!p.is_leaf()) {
      throw ValueError(tag() + which + " (" + std::string(dtype_name(p.dtype())) +
                       shape_str(p.shape()) +
                       ") is computed from other tensors; only leaves can be optimized");
    }
    if (!seen.insert(p.node().get()).second) {
      throw ValueError(tag() + which + " appears more than once among the parameters");
    }
  }
  first_index_.push_back(state_.size());
  state_.resize(state_.size() + params.size());
  groups_.push_back(std::move(params));
  initial_lrs_.emplace_back();
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    out["param_groups." + std::to_string(g) + ".lr"] = kiln::tensor(lr(g));
  }
  for (size_t i = 0; i < state_.size(); ++i) {
    const ParamState& s = state_[i];
    if (s.step == 0) continue;
    std::string prefix = "state." + std::to_string(i) + ".";
    out[prefix + "step"] = kiln::tensor(s.step);
    for (const auto& [name, t] : s.tensors) out[prefix + name] = own_handle(t);
  }
  return out;
}

void Optimizer::update_through_master(
    const Tensor& param, const Tensor& grad, ParamState& s, bool master,
    const std::function<void(const Tensor&, const Tensor&)>& update) {
  const bool half = param.dtype() == DType::Float16 || param.dtype() == DType::BFloat16;
  if (!master || !half) return update(param, grad);
  auto [it, fresh] = s.tensors.try_emplace("master");
  if (fresh || !it->second.defined()) it->second = own_handle(cast(param, DType::Float32));
  Tensor weights = it->second;
  update(weights, cast(grad, DType::Float32));
  Tensor p = param;
  p.assign(cast(weights, param.dtype()));
}

void Optimizer::load_state_dict(const StateDict& dict) {
  const std::string where = tag() + "load_state_dict: ";
  std::vector<Tensor> flat = parameters();
  std::vector<size_t> group_of(flat.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t k = 0; k < groups_[g].size(); ++k) group_of[first_index_[g] + k] = g;
  }
  // Check everything before changing anything, so a bad dict leaves the optimizer as it was.
  std::vector<std::optional<double>> lrs(groups_.size());
  std::vector<ParamState> next(state_.size());
  std::vector<std::set<std::string>> present(state_.size());
  for (const auto& [key, value] : dict) {
    if (!value.defined()) throw ValueError(where + "entry '" + key + "' is undefined");
    size_t dot1 = key.find('.');
    size_t dot2 = dot1 == std::string::npos ? std::string::npos : key.find('.', dot1 + 1);
    if (dot2 == std::string::npos) throw ValueError(where + "unexpected entry '" + key + "'");
    std::string kind = key.substr(0, dot1);
    std::optional<size_t> index = parse_index(key.substr(dot1 + 1, dot2 - dot1 - 1));
    std::string field = key.substr(dot2 + 1);
    if (kind == "param_groups" && field == "lr") {
      if (!index || *index >= groups_.size()) {
        throw ValueError(where + "entry '" + key +
                         "' names a group this optimizer does not have (" +
                         std::to_string(groups_.size()) + " groups)");
      }
      if (value.numel() != 1) {
        throw ShapeError(where + "entry '" + key + "' must hold one number, got shape " +
                         shape_str(value.shape()));
      }
      lrs[*index] = value.item<double>();
      continue;
    }
    if (kind != "state") throw ValueError(where + "unexpected entry '" + key + "'");
    if (!index || *index >= flat.size()) {
      throw ValueError(where + "entry '" + key +
                       "' names a parameter this optimizer does not have (" +
                       std::to_string(flat.size()) + " parameters)");
    }
    const Tensor& p = flat[*index];
    if (field == "step") {
      if (value.numel() != 1 || is_floating(value.dtype()) || value.item<int64_t>() < 1) {
        throw ValueError(where + "entry '" + key + "' must be one positive integer, got " +
                         std::string(dtype_name(value.dtype())) + shape_str(value.shape()));
      }
      next[*index].step = value.item<int64_t>();
    } else {
      // With master weights a half parameter's state is float32 and includes its master.
      const bool mastered = master_weights(group_of[*index]) &&
                            (p.dtype() == DType::Float16 || p.dtype() == DType::BFloat16);
      std::vector<std::string> names = state_names(group_of[*index]);
      if (mastered) names.push_back("master");
      if (std::find(names.begin(), names.end(), field) == names.end()) {
        throw ValueError(where + "entry '" + key + "' is not state of this optimizer's group " +
                         std::to_string(group_of[*index]));
      }
      const DType want = mastered ? DType::Float32 : p.dtype();
      if (value.shape() != p.shape() || value.dtype() != want) {
        throw ShapeError(where + "entry '" + key + "' is " +
                         std::string(dtype_name(value.dtype())) + shape_str(value.shape()) +
                         " but parameter " + std::to_string(*index) + " is " +
                         std::string(dtype_name(p.dtype())) + shape_str(p.shape()) +
                         (mastered ? " (its state is float32: master weights)" : ""));
      }
      next[*index].tensors[field] = own_handle(value);
    }
    present[*index].insert(field);
  }
  for (size_t i = 0; i < next.size(); ++i) {
    if (present[i].empty()) continue;
    std::vector<std::string> names = state_names(group_of[i]);
    names.push_back("step");
    const Tensor& pi = flat[i];
    if (master_weights(group_of[i]) &&
        (pi.dtype() == DType::Float16 || pi.dtype() == DType::BFloat16))
      names.push_back("master");
    for (const std::string& name : names) {
      if (!present[i].count(name)) {
        throw ValueError(where + "parameter " + std::to_string(i) + " has state but no 'state." +
                         std::to_string(i) + "." + name + "' entry");
      }
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (lrs[g]) set_lr(g, *lrs[g]);
  }
  state_ = std::move(next);
}

// ---------------------------------------------------------------------------------------
// SGD

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : OptimizerWithOptions<SGDOptions>("SGD") {
  add_param_group(std::move(params), options);
}

void SGD::validate(const SGDOptions& o) const {
  require(o.lr >= 0, tag(), "expected lr >= 0, got " + num(o.lr));
  require(o.momentum >= 0, tag(), "expected momentum >= 0, got " + num(o.momentum));
  require(o.weight_decay >= 0, tag(), "expected weight_decay >= 0, got " + num(o.weight_decay));
  require(!o.nesterov || (o.momentum > 0 && o.dampening == 0), tag(),
          "Nesterov momentum needs momentum > 0 and dampening == 0, got momentum " +
              num(o.momentum) + " and dampening " + num(o.dampening));
}

std::vector<std::string> SGD::state_names(size_t group) const {
  if (options(group).momentum == 0) return {};
  return {"momentum_buffer"};
}

void SGD::step() {
  for_each_update([](Tensor p, Tensor d, ParamState& s, const SGDOptions& o) {
    ++s.step;
    if (o.weight_decay != 0) d = d + p * o.weight_decay;
    if (o.momentum != 0) {
      auto [it, fresh] = s.tensors.try_emplace("momentum_buffer");
      Tensor& buf = it->second;
      if (fresh || !buf.defined()) {
        buf = own_handle(d);
      } else {
        // momentum and dampening as kernel arguments: a scheduler cycling momentum would
        // otherwise compile (and keep) new kernels every step.
        const Tensor momentum = step_scalar(o.momentum, p);
        buf.assign(o.dampening == 0 ? buf * momentum + d
                                    : buf * momentum + d * step_scalar(1 - o.dampening, p));
      }
      d = o.nesterov ? d + buf * step_scalar(o.momentum, p) : buf;
    }
    p.assign(p - step_scalar(o.lr, p) * d);
  });
}

// ---------------------------------------------------------------------------------------
// Adam and AdamW

namespace {

template <typename Options>
void validate_adam(const Options& o, const std::string& tag) {
  require(o.lr >= 0, tag, "expected lr >= 0, got " + num(o.lr));
  require(o.eps >= 0, tag, "expected eps >= 0, got " + num(o.eps));
  require(o.betas.first >= 0 && o.betas.first < 1, tag,
          "expected betas.first in [0, 1), got " + num(o.betas.first));
  require(o.betas.second >= 0 && o.betas.second < 1, tag,
          "expected betas.second in [0, 1), got " + num(o.betas.second));
  require(o.weight_decay >= 0, tag, "expected weight_decay >= 0, got " + num(o.weight_decay));
}

std::vector<std::string> adam_state_names(bool amsgrad) {
  if (amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

// One Adam update of `p` (torch.optim.adam's single-tensor path). With `decoupled`, the
// weight decay scales the parameter (AdamW); otherwise it is added to the gradient.
template <typename Options>
void adam_update(Tensor p, Tensor g, std::map<std::string, Tensor>& state, int64_t step,
                 const Options& o, bool decoupled) {
  const auto [beta1, beta2] = o.betas;
  Tensor param = p;
  if (o.weight_decay != 0) {
    if (decoupled)
      param = param * step_scalar(1 - o.lr * o.weight_decay, p);
    else
      g = g + param * o.weight_decay;
  }
  for (const std::string& name : adam_state_names(o.amsgrad)) {
    Tensor& t = state[name];
    if (!t.defined()) t = zero_state(p);
  }
  Tensor& exp_avg = state["exp_avg"];
  Tensor& exp_avg_sq = state["exp_avg_sq"];
  // lerp with weight 1 - beta1 < 0.5; beta1 as a kernel argument, since OneCycleLR cycles it.
  exp_avg.assign(exp_avg + (g - exp_avg) * step_scalar(1 - beta1, p));
  exp_avg_sq.assign(exp_avg_sq * beta2 + g * g * (1 - beta2));
  const double s = static_cast<double>(step);
  const double bias_correction1 = 1 - std::pow(beta1, s);
  const double bias_correction2 = 1 - std::pow(beta2, s);
  const double step_size = o.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  Tensor second = exp_avg_sq;
  if (o.amsgrad) {
    Tensor& max_sq = state["max_exp_avg_sq"];
    max_sq.assign(maximum(max_sq, exp_avg_sq));
    second = max_sq;
  }
  Tensor denom = sqrt(second) / step_scalar(bias_correction2_sqrt, p) + o.eps;
  p.assign(param - step_scalar(step_size, p) * (exp_avg / denom));
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options)
    : OptimizerWithOptions<AdamOptions>("Adam") {
  add_param_group(std::move(params), options);
}

void Adam::validate(const AdamOptions& o) const { validate_adam(o, tag()); }

std::vector<std::string> Adam::state_names(size_t group) const {
  return adam_state_names(options(group).amsgrad);
}

void Adam::step() {
  for_each_update([](const Tensor& p, const Tensor& grad, ParamState& s, const auto& o) {
    adam_update(p, grad, s.tensors, ++s.step, o, false);
  });
}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : OptimizerWithOptions<AdamWOptions>("AdamW") {
  add_param_group(std::move(params), options);
}

void AdamW::validate(const AdamWOptions& o) const { validate_adam(o, tag()); }

std::vector<std::string> AdamW::state_names(size_t group) const {
  return adam_state_names(options(group).amsgrad);
}

void AdamW::step() {
  for_each_update([](const Tensor& p, const Tensor& grad, ParamState& s, const auto& o) {
    adam_update(p, grad, s.tensors, ++s.step, o, true);
  });
}

// ---------------------------------------------------------------------------------------
// RMSprop and Adagrad

namespace {

// An evaluated constant shaped like `like` with every element `value` (Adagrad's
// initial_accumulator_value): like zero_state, a constant keeps the first step's graph the
// shape of the later ones.
Tensor filled_state(const Tensor& like, double value) {
  if (value == 0) return zero_state(like);
  NoGradGuard no_grad;
  // Filled on the host, whose bytes from_data can read, then placed on the parameter's device.
  Tensor t = full(like.shape(), value, like.dtype(), Device::cpu()).eval();
  return from_data(t.raw_data(), t.shape(), t.dtype(), like.device());
}

}  // namespace

RMSprop::RMSprop(std::vector<Tensor> params, const RMSpropOptions& options)
    : OptimizerWithOptions<RMSpropOptions>("RMSprop") {
  add_param_group(std::move(params), options);
}

void RMSprop::validate(const RMSpropOptions& o) const {
  require(o.lr >= 0, tag(), "expected lr >= 0, got " + num(o.lr));
  require(o.eps >= 0, tag(), "expected eps >= 0, got " + num(o.eps));
  require(o.alpha >= 0, tag(), "expected alpha >= 0, got " + num(o.alpha));
  require(o.momentum >= 0, tag(), "expected momentum >= 0, got " + num(o.momentum));
  require(o.weight_decay >= 0, tag(), "expected weight_decay >= 0, got " + num(o.weight_decay));
}

std::vector<std::string> RMSprop::state_names(size_t group) const {
  std::vector<std::string> names{"square_avg"};
  if (options(group).momentum > 0) names.push_back("momentum_buffer");
  if (options(group).centered) names.push_back("grad_avg");
  return names;
}

void RMSprop::step() {
  for_each_update([](Tensor p, Tensor d, ParamState& s, const RMSpropOptions& o) {
    ++s.step;
    if (o.weight_decay != 0) d = d + p * o.weight_decay;
    // State starts at zero, as torch's; a name may be new when an option changed mid-run
    // (a scheduler cycling momentum), and then starts at zero too.
    auto state = [&](const char* name) -> Tensor& {
      Tensor& t = s.tensors[name];
      if (!t.defined()) t = zero_state(p);
      return t;
    };
    Tensor& square_avg = state("square_avg");
    square_avg.assign(square_avg * o.alpha + d * d * (1 - o.alpha));
    Tensor avg;
    if (o.centered) {
      Tensor& grad_avg = state("grad_avg");
      grad_avg.assign(grad_avg + (d - grad_avg) * (1 - o.alpha));  // torch's lerp
      avg = sqrt(square_avg - grad_avg * grad_avg) + o.eps;
    } else {
      avg = sqrt(square_avg) + o.eps;
    }
    if (o.momentum > 0) {
      Tensor& buf = state("momentum_buffer");
      buf.assign(buf * step_scalar(o.momentum, p) + d / avg);  // a cycled momentum: see SGD
      p.assign(p - step_scalar(o.lr, p) * buf);
    } else {
      p.assign(p - step_scalar(o.lr, p) * (d / avg));
    }
  });
}

Adagrad::Adagrad(std::vector<Tensor> params, const AdagradOptions& options)
    : OptimizerWithOptions<AdagradOptions>("Adagrad") {
  add_param_group(std::move(params), options);
}

void Adagrad::validate(const AdagradOptions& o) const {
  require(o.lr >= 0, tag(), "expected lr >= 0, got " + num(o.lr));
  require(o.lr_decay >= 0, tag(), "expected lr_decay >= 0, got " + num(o.lr_decay));
  require(o.weight_decay >= 0, tag(), "expected weight_decay >= 0, got " + num(o.weight_decay));
  require(o.initial_accumulator_value >= 0, tag(),
          "expected initial_accumulator_value >= 0, got " + num(o.initial_accumulator_value));
  require(o.eps >= 0, tag(), "expected eps >= 0, got " + num(o.eps));
}

std::vector<std::string> Adagrad::state_names(size_t /*group*/) const { return {"sum"}; }

void Adagrad::step() {
  for_each_update([](Tensor p, Tensor d, ParamState& s, const AdagradOptions& o) {
    const double clr = o.lr / (1 + static_cast<double>(s.step) * o.lr_decay);
    ++s.step;
    if (o.weight_decay != 0) d = d + p * o.weight_decay;
    Tensor& sum = s.tensors["sum"];
    if (!sum.defined()) sum = filled_state(p, o.initial_accumulator_value);
    sum.assign(sum + d * d);
    p.assign(p - step_scalar(clr, p) * (d / (sqrt(sum) + o.eps)));
  });
}

// ---------------------------------------------------------------------------------------
// Gradient clipping

namespace {

// Gradient norms accumulate in float32 at least (float16 squares overflow early).
Tensor widened(const Tensor& g) {
  return g.dtype() == DType::Float64 ? g : cast(g, DType::Float32);
}

// The norm_type-norm of all elements of x (rank-0); x is non-empty.
Tensor vector_norm(const Tensor& x, double norm_type) {
  Tensor a = abs(x);
  if (std::isinf(norm_type)) return max(a);
  if (norm_type == 0) return sum(cast(ne(x, 0), x.dtype()));
  if (norm_type == 1) return sum(a);
  if (norm_type == 2) return sqrt(sum(a * a));
  return pow(sum(pow(a, norm_type)), 1.0 / norm_type);
}

// The joint norm of the defined gradients of `params` (those are appended to `with_grad`
// when given); `op` names the caller in messages.
Tensor joint_grad_norm(const std::vector<Tensor>& params, double norm_type, const char* op,
                       std::vector<Tensor>* with_grad) {
  if (!(norm_type >= 0) || (std::isinf(norm_type) && norm_type < 0)) {
    throw ValueError(std::string("[") + op + "] expected norm_type >= 0 or inf, got " +
                     num(norm_type));
  }
  NoGradGuard no_grad;
  std::vector<Tensor> norms;
  for (const Tensor& p : params) {
    if (!p.defined()) throw ValueError(std::string("[") + op + "] a parameter is undefined");
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (with_grad) with_grad->push_back(p);
    if (g.numel() > 0) norms.push_back(vector_norm(widened(g), norm_type));
  }
  if (norms.empty()) return kiln::tensor(0.0f);
  return norms.size() == 1 ? norms[0] : vector_norm(stack(norms), norm_type);
}

}  // namespace

Tensor total_grad_norm(const std::vector<Tensor>& params, double norm_type) {
  return joint_grad_norm(params, norm_type, "total_grad_norm", nullptr);
}

Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type,
                      bool error_if_nonfinite) {
  if (!(max_norm >= 0)) {
    throw ValueError("[clip_grad_norm] expected max_norm >= 0, got " + num(max_norm));
  }
  std::vector<Tensor> with_grad;
  Tensor total = joint_grad_norm(params, norm_type, "clip_grad_norm", &with_grad);
  if (with_grad.empty()) return total;
  NoGradGuard no_grad;
  if (error_if_nonfinite) {
    const double value = total.item<double>();
    if (!std::isfinite(value)) {
      throw NonFiniteNormError("[clip_grad_norm] the total norm of order " + num(norm_type) +
                               " of the gradients of " + std::to_string(with_grad.size()) +
                               " parameters is " + num(value) +
                               ", so it cannot be clipped; expected a finite norm (pass "
                               "error_if_nonfinite = false to scale by it anyway)");
    }
  }
  Tensor coef = minimum(max_norm / (total + 1e-6), 1.0);
  for (Tensor p : with_grad) {
    Tensor g = p.grad();
    p.set_grad(g * cast(coef, g.dtype()));
  }
  return total;
}

void clip_grad_value(const std::vector<Tensor>& params, double clip_value) {
  if (!(clip_value >= 0)) {
    throw ValueError("[clip_grad_value] expected clip_value >= 0, got " + num(clip_value));
  }
  NoGradGuard no_grad;
  for (Tensor p : params) {
    if (!p.defined()) throw ValueError("[clip_grad_value] a parameter is undefined");
    Tensor g = p.grad();
    if (g.defined()) p.set_grad(clamp(g, -clip_value, clip_value));
  }
}

}  // namespace kiln::optim
