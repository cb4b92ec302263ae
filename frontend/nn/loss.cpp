#include "loss.h"

#include "../../ops/autocast.h"
#include "../../ops/elementwise.h"
#include "../../ops/reduce_ops.h"
#include "../../ops/reindex.h"
#include "../../ops/shape_ops.h"
#include "detail.h"
#include "functional.h"

namespace kiln::nn {

using detail::describe;

namespace {

Tensor reduce(const Tensor& loss, Reduction reduction) {
  switch (reduction) {
    case Reduction::None:
      return loss;
    case Reduction::Sum:
      return sum(loss);
    case Reduction::Mean:
      return mean(loss);
  }
  return loss;
}

// The class axis of an input and the shape integer targets must have: [N, C, d...] -> 1 and
// [N, d...]; unbatched [C] -> 0 and [].
int class_axis(const Tensor& input) { return input.ndim() == 1 ? 0 : 1; }

Shape index_target_shape(const Tensor& input) {
  Shape s = input.shape();
  s.erase(s.begin() + class_axis(input));
  return s;
}

void check_input(const Tensor& input, const char* op) {
  detail::require_floating(input, op, "input");
  if (input.ndim() < 1) {
    throw ShapeError(std::string("[") + op +
                     "] expected input [N, C], [N, C, d1, ...] or [C], got " + describe(input));
  }
}

void check_weight(const Tensor& weight, const Tensor& input, const char* op) {
  if (!weight.defined()) return;
  detail::require_same_dtype(input, weight, op, "class weight");
  int64_t c = input.size(class_axis(input));
  if (weight.shape() != Shape{c}) {
    throw ShapeError(std::string("[") + op + "] expected class weights of shape [" +
                     std::to_string(c) + "] for input " + describe(input) + ", got " +
                     describe(weight));
  }
}

// [C] -> shaped to broadcast along the class axis of `input`.
Tensor along_classes(const Tensor& v, const Tensor& input) {
  Shape s(static_cast<size_t>(input.ndim()), 1);
  s[class_axis(input)] = v.size(0);
  return reshape(v, s);
}

// The loss of log-probabilities at integer targets (nll_loss), with smoothing when given.
Tensor indexed_loss(const Tensor& logp, const Tensor& target, const CrossEntropyOptions& o,
                    const char* op) {
  Shape want = index_target_shape(logp);
  if (target.shape() != want) {
    throw ShapeError(std::string("[") + op + "] expected class-index targets of shape " +
                     shape_str(want) + " for input " + describe(logp) + ", got " +
                     describe(target));
  }
  const int axis = class_axis(logp);
  Tensor valid = target != o.ignore_index;
  // Ignored positions read class 0, which always exists; their terms are masked below. Any
  // other index out of range raises IndexError from the gather.
  Tensor safe = where(valid, cast(target, DType::Int64), static_cast<int64_t>(0));
  Tensor picked = squeeze(gather(logp, axis, unsqueeze(safe, axis)), axis);
  Tensor target_weight =
      o.weight.defined()
          ? where(valid, reshape(index_select(o.weight, 0, flatten(safe)), want), 0.0)
          : cast(valid, logp.dtype());
  // where(), not a product with the zero weight: class 0 may have log-probability -inf.
  Tensor nll = where(valid, -picked * target_weight, 0.0);
  Tensor loss = nll;
  if (o.label_smoothing > 0.0) {
    Tensor per_class = o.weight.defined() ? logp * along_classes(o.weight, logp) : logp;
    Tensor smooth = where(valid, -sum(per_class, axis), 0.0);
    const double c = static_cast<double>(logp.size(axis));
    loss = nll * (1.0 - o.label_smoothing) + smooth * (o.label_smoothing / c);
  }
  if (o.reduction == Reduction::Mean) return sum(loss) / sum(target_weight);
  return reduce(loss, o.reduction);
}

void check_options(const CrossEntropyOptions& o, const char* op) {
  if (!(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0)) {
    throw ValueError(std::string("[") + op + "] label_smoothing must be in [0, 1], got " +
                     detail::num(o.label_smoothing));
  }
}

void check_same_shape(const Tensor& input, const Tensor& target, const char* op) {
  detail::require_floating(input, op, "input");
  detail::require_same_dtype(input, target, op, "target");
  if (input.shape() != target.shape()) {
    throw ShapeError(std::string("[") + op + "] expected target with the input's shape " +
                     shape_str(input.shape()) + ", got " + describe(target) +
                     "; reshape one of them (broadcasting here is almost always a bug)");
  }
}

}  // namespace

// Losses are on autocast's float32 list: half inputs (and targets) are widened in a scope.
Tensor cross_entropy(const Tensor& input_in, const Tensor& target_in,
                     const CrossEntropyOptions& o) {
  const char* op = "cross_entropy";
  const Tensor input = amp::full_precision(input_in), target = amp::full_precision(target_in);
  CompositeScope scope(op);  // the inner gather's index errors name cross_entropy
  check_input(input, op);
  detail::require_defined(target, op, "target");
  check_options(o, op);
  check_weight(o.weight, input, op);
  Tensor logp = log_softmax(input, class_axis(input));
  if (is_floating(target.dtype())) {
    if (target.shape() != input.shape()) {
      throw DTypeError("[cross_entropy] expected integer class indices of shape " +
                       shape_str(index_target_shape(input)) +
                       " (or class probabilities of the input's shape " + shape_str(input.shape()) +
                       "), got " + describe(target));
    }
    detail::require_same_dtype(input, target, op, "target probabilities");
    const int axis = class_axis(input);
    const double c = static_cast<double>(input.size(axis));
    Tensor p = o.label_smoothing > 0.0 ? target * (1.0 - o.label_smoothing) + o.label_smoothing / c
                                       : target;
    Tensor per_class = logp * p;
    if (o.weight.defined()) per_class = per_class * along_classes(o.weight, input);
    Tensor loss = -sum(per_class, axis);
    return reduce(loss, o.reduction);
  }
  if (!is_integer(target.dtype())) {
    throw DTypeError("[cross_entropy] expected integer class indices, got " + describe(target));
  }
  return indexed_loss(logp, target, o, op);
}

Tensor nll_loss(const Tensor& input_in, const Tensor& target, const CrossEntropyOptions& o) {
  const char* op = "nll_loss";
  const Tensor input = amp::full_precision(input_in);
  CompositeScope scope(op);  // the inner gather's index errors name nll_loss
  check_input(input, op);
  detail::require_defined(target, op, "target");
  check_weight(o.weight, input, op);
  if (o.label_smoothing != 0.0) {
    throw ValueError("[nll_loss] label_smoothing is a cross_entropy option; got " +
                     detail::num(o.label_smoothing));
  }
  if (!is_integer(target.dtype())) {
    throw DTypeError("[nll_loss] expected integer class indices, got " + describe(target));
  }
  return indexed_loss(input, target, o, op);
}

Tensor mse_loss(const Tensor& input_in, const Tensor& target_in, Reduction reduction) {
  const Tensor input = amp::full_precision(input_in), target = amp::full_precision(target_in);
  check_same_shape(input, target, "mse_loss");
  Tensor d = input - target;
  return reduce(d * d, reduction);
}

Tensor l1_loss(const Tensor& input_in, const Tensor& target_in, Reduction reduction) {
  const Tensor input = amp::full_precision(input_in), target = amp::full_precision(target_in);
  check_same_shape(input, target, "l1_loss");
  return reduce(abs(input - target), reduction);
}

Tensor smooth_l1_loss(const Tensor& input_in, const Tensor& target_in, Reduction reduction,
                      double beta) {
  const Tensor input = amp::full_precision(input_in), target = amp::full_precision(target_in);
  check_same_shape(input, target, "smooth_l1_loss");
  if (!(beta >= 0.0))
    throw ValueError("[smooth_l1_loss] beta must be >= 0, got " + detail::num(beta));
  Tensor d = abs(input - target);
  if (beta == 0.0) return reduce(d, reduction);
  return reduce(where(d < beta, d * d * (0.5 / beta), d - 0.5 * beta), reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input_in, const Tensor& target_in,
                                        const BCEWithLogitsOptions& o) {
  const char* op = "binary_cross_entropy_with_logits";
  const Tensor input = amp::full_precision(input_in), target = amp::full_precision(target_in);
  check_same_shape(input, target, op);
  // log(1 + e^-|x|) + max(-x, 0) is log(1 + e^-x) without overflow for either sign of x.
  // maximum, not relu: at x = 0 its tie splits the gradient (-1/2) where relu's gives 0, and
  // abs gives 0 there, so the sum keeps the true derivative -sigmoid(0) = -1/2.
  Tensor softplus_neg = log1p(exp(-abs(input))) + maximum(-input, 0.0);
  Tensor loss;
  if (o.pos_weight.defined()) {
    detail::require_same_dtype(input, o.pos_weight, op, "pos_weight");
    if (input.ndim() < 1 || o.pos_weight.ndim() != 1 || o.pos_weight.size(0) != input.size(-1)) {
      throw ShapeError("[binary_cross_entropy_with_logits] expected pos_weight of shape [" +
                       std::to_string(input.ndim() ? input.size(-1) : 0) +
                       "] (one per class, the last dimension of " + describe(input) + "), got " +
                       describe(o.pos_weight));
    }
    Tensor log_weight = (o.pos_weight - 1.0) * target + 1.0;
    loss = (1.0 - target) * input + log_weight * softplus_neg;
  } else {
    loss = (1.0 - target) * input + softplus_neg;
  }
  if (o.weight.defined()) {
    detail::require_same_dtype(input, o.weight, op, "weight");
    broadcast_to(o.weight, input.shape(), op);
    loss = loss * o.weight;
  }
  return reduce(loss, o.reduction);
}

namespace {

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::None:
      return "none";
    case Reduction::Sum:
      return "sum";
    case Reduction::Mean:
      return "mean";
  }
  return "?";
}

// log(x) clamped below at -100, as PyTorch's binary_cross_entropy. x == 0 reads log(1)
// inside the where so that neither the value nor the gradient meets log(0) = -inf
// (0 * inf would make the gradient NaN); the clamped branch is constant, so its gradient is
// 0. Negative x still gives NaN, flagging a probability out of range.
Tensor clamped_log(const Tensor& x) {
  Tensor zero = x == 0.0;
  return where(zero, -100.0, maximum(log(where(zero, 1.0, x)), -100.0));
}

}  // namespace

Tensor kl_div(const Tensor& input_in, const Tensor& target_in, const KLDivOptions& o) {
  const char* op = "kl_div";
  const Tensor input = amp::full_precision(input_in), target = amp::full_precision(target_in);
  check_same_shape(input, target, op);
  Tensor loss;
  if (o.log_target) {
    loss = exp(target) * (target - input);
  } else {
    // xlogy(t, t) - t * input: 0 log 0 is 0, so a zero target contributes nothing, and the
    // inner where keeps log(0) out of the gradient. A negative target stays NaN, as in torch.
    Tensor zero = target == 0.0;
    Tensor t_log_t = where(zero, 0.0, target * log(where(zero, 1.0, target)));
    loss = t_log_t - target * input;
  }
  switch (o.reduction) {
    case KLDivReduction::None:
      return loss;
    case KLDivReduction::Sum:
      return sum(loss);
    case KLDivReduction::Mean:
      return mean(loss);
    case KLDivReduction::BatchMean:
      // PyTorch divides by input.size(0), and a rank-0 input is its own batch of one.
      return input.ndim() == 0 ? sum(loss) : sum(loss) / static_cast<double>(input.size(0));
  }
  return loss;
}

Tensor huber_loss(const Tensor& input_in, const Tensor& target_in, Reduction reduction,
                  double delta) {
  const Tensor input = amp::full_precision(input_in), target = amp::full_precision(target_in);
  check_same_shape(input, target, "huber_loss");
  if (!(delta > 0.0)) throw ValueError("[huber_loss] delta must be > 0, got " + detail::num(delta));
  Tensor d = abs(input - target);
  return reduce(where(d < delta, d * d * 0.5, (d - 0.5 * delta) * delta), reduction);
}

Tensor binary_cross_entropy(const Tensor& input_in, const Tensor& target_in, const BCEOptions& o) {
  const char* op = "binary_cross_entropy";
  const Tensor input = amp::full_precision(input_in), target = amp::full_precision(target_in);
  check_same_shape(input, target, op);
  // The weighted sum, not y*log x + (1-y)*log(1-x) expanded: where y is 0 or 1 one term is
  // exactly 0 even when its log is clamped.
  const Tensor x = input.detach();
  Tensor loss = -(target * clamped_log(x) + (1.0 - target) * clamped_log(1.0 - x));
  if (input.requires_grad()) {
    // The input's gradient is PyTorch's, (x - y) / max(x (1 - x), 1e-12): a prediction
    // saturated at exactly 0 or 1 (sigmoid(20) is 1 in float32) on the wrong side keeps a
    // large gradient, where the clamped logs' derivative would be 0. It enters through
    // g * input - detach(g * input), exactly 0 in value.
    const Tensor g = ((x - target.detach()) / maximum(x * (1.0 - x), 1e-12)).detach();
    const Tensor gx = g * input;
    loss = loss + (gx - gx.detach());
  }
  if (o.weight.defined()) {
    Tensor weight = amp::full_precision(o.weight);
    detail::require_same_dtype(input, weight, op, "weight");
    broadcast_to(weight, input.shape(), op);
    loss = loss * weight;
  }
  return reduce(loss, o.reduction);
}

// ---------------------------------------------------------------------------------------
// Loss modules

KLDivLoss::KLDivLoss(const KLDivOptions& options) : Module("KLDivLoss"), options(options) {}

Tensor KLDivLoss::forward(const Tensor& input, const Tensor& target) {
  return kl_div(input, target, options);
}

std::string KLDivLoss::extra_repr() const {
  static const char* names[] = {"none", "mean", "sum", "batchmean"};
  return std::string("reduction=") + names[static_cast<int>(options.reduction)] +
         ", log_target=" + (options.log_target ? "true" : "false");
}

HuberLoss::HuberLoss(Reduction reduction, double delta)
    : Module("HuberLoss"), reduction(reduction), delta(delta) {
  if (!(delta > 0.0)) throw ValueError("[HuberLoss] delta must be > 0, got " + detail::num(delta));
}

Tensor HuberLoss::forward(const Tensor& input, const Tensor& target) {
  return huber_loss(input, target, reduction, delta);
}

std::string HuberLoss::extra_repr() const {
  return std::string("reduction=") + reduction_name(reduction) + ", delta=" + detail::num(delta);
}

BCELoss::BCELoss(const BCEOptions& options) : Module("BCELoss"), reduction(options.reduction) {
  // A new handle, as weight_buffer below makes: to() must not rebind the caller's tensor.
  if (options.weight.defined()) weight_ = register_buffer("weight", Tensor(options.weight.node()));
}

Tensor BCELoss::forward(const Tensor& input, const Tensor& target) {
  return binary_cross_entropy(input, target, {.reduction = reduction, .weight = weight_});
}

std::string BCELoss::extra_repr() const {
  return std::string("reduction=") + reduction_name(reduction);
}

namespace {

// A loss module's optional weight tensor, registered as a buffer so that it follows to()
// and appears in state_dict() under PyTorch's name; returns the registered handle. The
// buffer is a new handle on the caller's value, so the module's to() leaves the caller's
// tensor as it was (PyTorch's to() makes new tensors too).
Tensor weight_buffer(Module& m, const char* name, const Tensor& weight) {
  return weight.defined() ? m.register_buffer(name, Tensor(weight.node())) : weight;
}

std::string cross_entropy_repr(const CrossEntropyOptions& o) {
  return std::string("reduction=") + reduction_name(o.reduction) +
         ", ignore_index=" + std::to_string(o.ignore_index) +
         (o.label_smoothing != 0 ? ", label_smoothing=" + detail::num(o.label_smoothing) : "");
}

}  // namespace

CrossEntropyLoss::CrossEntropyLoss(const CrossEntropyOptions& o)
    : Module("CrossEntropyLoss"), options(o) {
  options.weight = weight_buffer(*this, "weight", o.weight);
}

Tensor CrossEntropyLoss::forward(const Tensor& input, const Tensor& target) {
  return cross_entropy(input, target, options);
}

std::string CrossEntropyLoss::extra_repr() const { return cross_entropy_repr(options); }

NLLLoss::NLLLoss(const CrossEntropyOptions& o) : Module("NLLLoss"), options(o) {
  options.weight = weight_buffer(*this, "weight", o.weight);
}

Tensor NLLLoss::forward(const Tensor& input, const Tensor& target) {
  return nll_loss(input, target, options);
}

std::string NLLLoss::extra_repr() const { return cross_entropy_repr(options); }

MSELoss::MSELoss(Reduction r) : Module("MSELoss"), reduction(r) {}

Tensor MSELoss::forward(const Tensor& input, const Tensor& target) {
  return mse_loss(input, target, reduction);
}

std::string MSELoss::extra_repr() const {
  return std::string("reduction=") + reduction_name(reduction);
}

L1Loss::L1Loss(Reduction r) : Module("L1Loss"), reduction(r) {}

Tensor L1Loss::forward(const Tensor& input, const Tensor& target) {
  return l1_loss(input, target, reduction);
}

std::string L1Loss::extra_repr() const {
  return std::string("reduction=") + reduction_name(reduction);
}

SmoothL1Loss::SmoothL1Loss(Reduction r, double beta)
    : Module("SmoothL1Loss"), reduction(r), beta(beta) {
  if (!(beta >= 0.0))
    throw ValueError("[SmoothL1Loss] beta must be >= 0, got " + detail::num(beta));
}

Tensor SmoothL1Loss::forward(const Tensor& input, const Tensor& target) {
  return smooth_l1_loss(input, target, reduction, beta);
}

std::string SmoothL1Loss::extra_repr() const {
  return std::string("reduction=") + reduction_name(reduction) + ", beta=" + detail::num(beta);
}

BCEWithLogitsLoss::BCEWithLogitsLoss(const BCEWithLogitsOptions& o)
    : Module("BCEWithLogitsLoss"), options(o) {
  options.weight = weight_buffer(*this, "weight", o.weight);
  options.pos_weight = weight_buffer(*this, "pos_weight", o.pos_weight);
}

Tensor BCEWithLogitsLoss::forward(const Tensor& input, const Tensor& target) {
  return binary_cross_entropy_with_logits(input, target, options);
}

std::string BCEWithLogitsLoss::extra_repr() const {
  return std::string("reduction=") + reduction_name(options.reduction);
}

}  // namespace kiln::nn
