#pragma once
// Custom autograd functions in libtorch's shape: a class with
//   static Tensor forward(AutogradContext* ctx, <arguments>...);
//   static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs);
// applied with `kiln::autograd::Function<MyFn>::apply(args...)`. The forward is built from
// kiln ops (or custom kernels) without recording history; each returned tensor becomes a
// node whose gradient rule is the user's backward, so the lazy graph, fusion and memory
// planning see the forward ops as usual while autograd sees one function. A backward built
// from ops under `grad(..., create_graph = true)` records history and can be differentiated
// again.
#include <any>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../core/tensor.h"

namespace kiln::autograd {

/// What forward() hands to backward(): saved tensors, arbitrary saved values, and which
/// inputs need a gradient.
class AutogradContext {
 public:
  /// Keeps `tensors` for backward(). Saving an input or an output of this function keeps
  /// its history, so a backward built from it can be differentiated again.
  void save_for_backward(std::vector<Tensor> tensors);
  /// The tensors given to save_for_backward(), in order (outputs as the function returned
  /// them). Only valid inside backward().
  std::vector<Tensor> get_saved_variables() const;
  /// Whether the forward argument at `index` is a tensor that needs a gradient.
  bool needs_input_grad(size_t index) const;
  /// Values other than tensors that backward() needs (sizes, flags, options), by name.
  std::unordered_map<std::string, std::any> saved_data;

 private:
  friend struct detail_access;
  std::vector<NodePtr> saved_;
  std::vector<int> saved_output_;  // per saved tensor: the output it is, or -1
  std::vector<char> needs_grad_;   // per forward argument
  std::vector<NodePtr> outputs_;   // set after forward: resolves saved outputs
  bool in_backward_ = false;
};

namespace detail {

/// One forward argument: its tensor (undefined for non-tensor arguments).
using ArgTensors = std::vector<Tensor>;
/// The user's backward: grad_outputs in, one gradient per forward argument out.
using BackwardFn = std::function<std::vector<Tensor>(AutogradContext*, std::vector<Tensor>)>;

/// Makes `outputs` (computed without history) the outputs of one application of function
/// `name`: each gets a node whose gradient is `backward`, reached from `args` (one entry
/// per forward argument, undefined where it is not a tensor). Returns `outputs` unchanged
/// when no argument needs a gradient (or grad mode is off).
std::vector<Tensor> record_function(std::string name, const ArgTensors& args,
                                    const std::vector<Tensor>& outputs,
                                    std::shared_ptr<AutogradContext> ctx, BackwardFn backward);
/// Prepares `ctx` for a forward of `args`: which arguments need a gradient.
void begin_forward(AutogradContext& ctx, const ArgTensors& args);
/// The demangled name of a type, for messages ("MyScale").
std::string type_name(const std::type_info& type);

template <class A>
Tensor tensor_of(const A& a) {
  if constexpr (std::is_same_v<std::decay_t<A>, Tensor>)
    return a;
  else
    return Tensor();
}

inline std::vector<Tensor> as_list(const Tensor& t) { return {t}; }
inline std::vector<Tensor> as_list(std::vector<Tensor> ts) { return ts; }

}  // namespace detail

/// Base of a custom autograd function T (CRTP, as libtorch's torch::autograd::Function):
/// T defines static forward(AutogradContext*, args...) returning a Tensor or a
/// std::vector<Tensor>, and static backward(AutogradContext*, std::vector<Tensor>) returning
/// one gradient per forward argument (an undefined Tensor where there is none). Arguments
/// of type Tensor get gradients; any other argument is passed through as a value.
template <class T>
struct Function {
  /// Runs T::forward on `args` and returns its outputs, recorded so that autograd calls
  /// T::backward for them. Errors in what backward returns raise kiln::Error naming T.
  template <class... Args>
  static auto apply(Args&&... args) {
    auto ctx = std::make_shared<AutogradContext>();
    detail::ArgTensors tensors{detail::tensor_of(args)...};
    detail::begin_forward(*ctx, tensors);
    using Result = decltype(T::forward(ctx.get(), std::forward<Args>(args)...));
    std::vector<Tensor> outputs;
    {
      NoGradGuard no_grad;  // the forward's ops record no history: backward() is their rule
      outputs = detail::as_list(T::forward(ctx.get(), std::forward<Args>(args)...));
    }
    std::vector<Tensor> recorded = detail::record_function(
        detail::type_name(typeid(T)), tensors, outputs, ctx,
        [](AutogradContext* c, std::vector<Tensor> g) { return T::backward(c, std::move(g)); });
    if constexpr (std::is_same_v<std::decay_t<Result>, Tensor>)
      return recorded.at(0);
    else
      return recorded;
  }
};

}  // namespace kiln::autograd

namespace kiln::detail {

/// The nodes autograd walks to from `n`: a custom function output's tensor arguments that
/// need a gradient, else n's own inputs.
const std::vector<NodePtr>& gradient_inputs(const Node& n);

/// Gradients through custom function outputs during one backward pass (ops/autograd.cpp):
/// collects each output's gradient and runs the function's backward once, when the last
/// of its outputs on the pass's path has its gradient.
class CustomFunctionGradients {
 public:
  /// `on_path` tells which nodes the pass visits.
  explicit CustomFunctionGradients(std::function<bool(Node*)> on_path);
  ~CustomFunctionGradients();
  /// Takes output `n`'s gradient `g`; returns (argument, gradient) pairs once the function's
  /// backward has run, else nothing yet. Raises ValueError / ShapeError naming the function
  /// when backward returns the wrong number of gradients or a gradient of the wrong shape.
  std::vector<std::pair<Node*, Tensor>> take(const Node& n, const Tensor& g);

 private:
  struct Pending;
  std::function<bool(Node*)> on_path_;
  std::unordered_map<const void*, std::unique_ptr<Pending>> pending_;
};

}  // namespace kiln::detail
