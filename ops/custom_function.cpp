// Custom autograd functions (custom_function.h). An application records one FunctionRecord
// (its arguments, context and backward) shared by its outputs. Each output is a fresh
// identity reindex of the forward's value carrying Node::custom_grad, so that it is a node
// of its own even when forward returns an input or one value twice; fusion inlines it, and
// simplify leaves it alone (a replacement by the value it wraps would lose the edge to the
// backward). Autograd walks from such a node to the function's arguments, not through the
// forward's ops, which were built without history.
#include "custom_function.h"

#include <cxxabi.h>

#include <cstdlib>
#include <mutex>

#include "../core/error.h"
#include "reindex.h"
#include "sources.h"

namespace kiln {

namespace autograd {

struct FunctionRecord {
  std::string name;
  std::vector<NodePtr> args;         // per forward argument; null where not a tensor
  std::vector<NodePtr> grad_inputs;  // the arguments that need a gradient (autograd's edges)
  std::vector<NodePtr> values;       // the outputs as forward computed them (no history)
  std::vector<std::weak_ptr<Node>> outputs;  // the recorded outputs (weak: they own this)
  std::shared_ptr<AutogradContext> ctx;
  detail::BackwardFn backward;
  std::mutex mutex;  // one backward at a time per application (it uses ctx)
};

}  // namespace autograd

// What core's Node::custom_grad points to: the application and which of its outputs.
struct CustomGrad {
  std::shared_ptr<autograd::FunctionRecord> record;
  size_t output = 0;
};

namespace autograd {

// The context's fields stay private to users; this is the one friend.
struct detail_access {
  static std::vector<char>& needs(AutogradContext& c) { return c.needs_grad_; }
  static std::vector<NodePtr>& saved(AutogradContext& c) { return c.saved_; }
  static std::vector<int>& saved_output(AutogradContext& c) { return c.saved_output_; }
  static std::vector<NodePtr>& outputs(AutogradContext& c) { return c.outputs_; }
  static bool& in_backward(AutogradContext& c) { return c.in_backward_; }
};

void AutogradContext::save_for_backward(std::vector<Tensor> tensors) {
  saved_.clear();
  saved_output_.clear();
  for (const Tensor& t : tensors) {
    saved_.push_back(t.defined() ? t.node() : nullptr);
    saved_output_.push_back(-1);
  }
}

std::vector<Tensor> AutogradContext::get_saved_variables() const {
  if (!in_backward_)
    throw ValueError("[autograd::Function] get_saved_variables() is only valid inside backward()");
  std::vector<Tensor> out;
  for (size_t i = 0; i < saved_.size(); ++i) {
    const int k = saved_output_[i];
    const NodePtr& n = k >= 0 ? outputs_[static_cast<size_t>(k)] : saved_[i];
    out.push_back(n ? Tensor(n) : Tensor());
  }
  return out;
}

bool AutogradContext::needs_input_grad(size_t index) const {
  return index < needs_grad_.size() && needs_grad_[index] != 0;
}

namespace detail {

void begin_forward(AutogradContext& ctx, const ArgTensors& args) {
  std::vector<char>& needs = detail_access::needs(ctx);
  const bool mode = grad_mode_enabled();
  needs.clear();
  for (const Tensor& t : args) needs.push_back(mode && t.defined() && t.requires_grad() ? 1 : 0);
}

std::string type_name(const std::type_info& type) {
  int status = 0;
  char* name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : type.name();
  std::free(name);
  return out;
}

std::vector<Tensor> record_function(std::string name, const ArgTensors& args,
                                    const std::vector<Tensor>& outputs,
                                    std::shared_ptr<AutogradContext> ctx, BackwardFn backward) {
  for (size_t k = 0; k < outputs.size(); ++k)
    if (!outputs[k].defined())
      throw ValueError("[" + name + "] forward returned an undefined tensor as output " +
                       std::to_string(k));
  auto record = std::make_shared<FunctionRecord>();
  const std::vector<char>& needs = detail_access::needs(*ctx);
  for (size_t i = 0; i < args.size(); ++i) {
    record->args.push_back(args[i].defined() ? args[i].node() : nullptr);
    if (i < needs.size() && needs[i] && args[i].defined())
      record->grad_inputs.push_back(args[i].node());
  }
  if (record->grad_inputs.empty()) return outputs;  // nothing to differentiate
  // Saved outputs are resolved when backward runs (the recorded node if it is still alive,
  // else the value): holding the recorded node here would make it own itself.
  std::vector<NodePtr>& saved = detail_access::saved(*ctx);
  std::vector<int>& saved_output = detail_access::saved_output(*ctx);
  for (size_t i = 0; i < saved.size(); ++i)
    for (size_t k = 0; k < outputs.size(); ++k)
      if (saved[i] && saved[i] == outputs[k].node()) {
        saved_output[i] = static_cast<int>(k);
        saved[i] = nullptr;
        break;
      }
  record->name = std::move(name);
  record->ctx = std::move(ctx);
  record->backward = std::move(backward);
  std::vector<Tensor> recorded;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const Tensor& y = outputs[k];
    record->values.push_back(y.node());
    if (!is_floating(y.dtype())) {  // integer results (indices) carry no gradient
      record->outputs.emplace_back();
      recorded.push_back(y);
      continue;
    }
    std::vector<IndexExpr> identity;
    for (int d = 0; d < y.ndim(); ++d) identity.push_back(IndexExpr::var(d));
    Tensor w = reindex(y, y.shape(), std::move(identity), 0, {}, false, "custom_function");
    w.node()->requires_grad = true;
    w.node()->custom_grad = std::make_shared<const CustomGrad>(CustomGrad{record, k});
    record->outputs.push_back(w.node());
    recorded.push_back(std::move(w));
  }
  return recorded;
}

}  // namespace detail
}  // namespace autograd

namespace detail {

const std::vector<NodePtr>& gradient_inputs(const Node& n) {
  return n.custom_grad ? n.custom_grad->record->grad_inputs : n.inputs;
}

struct CustomFunctionGradients::Pending {
  std::vector<Tensor> grads;
  size_t expected = 0, seen = 0;
};

CustomFunctionGradients::CustomFunctionGradients(std::function<bool(Node*)> on_path)
    : on_path_(std::move(on_path)) {}

CustomFunctionGradients::~CustomFunctionGradients() = default;

namespace {

// Checks what backward returned and pairs each gradient with its argument.
std::vector<std::pair<Node*, Tensor>> argument_gradients(const autograd::FunctionRecord& r,
                                                         std::vector<Tensor> grads) {
  const std::string what = "[" + r.name + " backward] ";
  if (grads.size() != r.args.size())
    throw ValueError(what + "returned " + std::to_string(grads.size()) + " gradient" +
                     (grads.size() == 1 ? "" : "s") + "; expected " +
                     std::to_string(r.args.size()) +
                     ", one per forward argument (an undefined Tensor where there is none)");
  std::vector<std::pair<Node*, Tensor>> out;
  for (size_t i = 0; i < grads.size(); ++i) {
    Tensor& g = grads[i];
    if (!g.defined()) continue;
    const Node* arg = r.args[i].get();
    if (arg == nullptr)
      throw ValueError(what + "returned a gradient for argument " + std::to_string(i) +
                       ", which is not a tensor; return an undefined Tensor there");
    if (g.shape() != arg->shape)
      throw ShapeError(what + "the gradient of argument " + std::to_string(i) + " has shape " +
                       shape_str(g.shape()) + "; expected " + shape_str(arg->shape) +
                       ", the argument's shape");
    if (!is_floating(g.dtype()))
      throw DTypeError(what + "the gradient of argument " + std::to_string(i) + " is " +
                       std::string(dtype_name(g.dtype())) + "; expected a floating dtype");
    if (g.device() != arg->device)
      throw DeviceError(what + "the gradient of argument " + std::to_string(i) +
                        " is on another device than the argument");
    out.emplace_back(r.args[i].get(), std::move(g));
  }
  return out;
}

}  // namespace

std::vector<std::pair<Node*, Tensor>> CustomFunctionGradients::take(const Node& n,
                                                                    const Tensor& g) {
  autograd::FunctionRecord& r = *n.custom_grad->record;
  auto [it, fresh] = pending_.try_emplace(&r);
  if (fresh) {
    it->second = std::make_unique<Pending>();
    it->second->grads.resize(r.values.size());
    for (const std::weak_ptr<Node>& o : r.outputs)
      if (NodePtr w = o.lock(); w && on_path_(w.get())) ++it->second->expected;
  }
  Pending& p = *it->second;
  p.grads[n.custom_grad->output] = g;
  if (++p.seen < p.expected) return {};
  // Outputs that received no gradient get zeros, as libtorch's materialized grads.
  std::vector<Tensor> grads = std::move(p.grads);
  pending_.erase(it);
  for (size_t k = 0; k < grads.size(); ++k)
    if (!grads[k].defined()) {
      const Node& v = *r.values[k];
      grads[k] = zeros(v.shape, v.dtype, v.device);
    }
  std::vector<Tensor> result;
  {
    std::lock_guard lock(r.mutex);
    autograd::AutogradContext& ctx = *r.ctx;
    std::vector<NodePtr>& outputs = autograd::detail_access::outputs(ctx);
    outputs.clear();
    for (size_t k = 0; k < r.values.size(); ++k) {
      NodePtr w = r.outputs[k].lock();
      outputs.push_back(w ? w : r.values[k]);
    }
    autograd::detail_access::in_backward(ctx) = true;
    struct Done {
      autograd::AutogradContext& c;
      ~Done() {
        autograd::detail_access::in_backward(c) = false;
        autograd::detail_access::outputs(c).clear();  // they own the context
      }
    } done{ctx};
    result = r.backward(&ctx, std::move(grads));
  }
  return argument_gradients(r, std::move(result));
}

}  // namespace detail
}  // namespace kiln
