#pragma once
// kiln::nn::Module: a tree of named parameters, buffers and submodules, in the manner of
// torch.nn.Module. Parameters are Tensor handles: every copy (the module's member, the
// vector parameters() returns, an optimizer's list) shares one handle, so an update made
// through assign() on any copy is seen by the module.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../core/tensor.h"
#include "../state_dict.h"

namespace kiln::nn {

/// What load_state_dict found besides what it loaded (PyTorch's _IncompatibleKeys).
struct LoadStateDictResult {
  /// The module's keys the dict lacks (left unchanged).
  std::vector<std::string> missing_keys;
  /// The dict's keys the module lacks (ignored).
  std::vector<std::string> unexpected_keys;
};

/// Base of every layer. Modules are held through std::shared_ptr (see make()).
class Module {
 public:
  /// `name` is the module's type name used in messages and printing ("Linear").
  explicit Module(std::string name);
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The type name given at construction ("Linear", "Conv2d", ...).
  const std::string& name() const { return name_; }

  /// Registers `value` as a trainable parameter (a leaf with requires_grad_() when
  /// `requires_grad`) and returns a copy that shares its handle.
  Tensor register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  /// Registers a buffer: state saved in state_dict() but not trained (running statistics).
  Tensor register_buffer(const std::string& name, Tensor value);
  /// Registers a submodule under `name`; its parameters appear as "name.param".
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  /// Replaces the tensor of a registered parameter or buffer by another handle (libtorch's
  /// `register_parameter` on an existing name); used when a layer rebinds a member.
  void replace_tensor(const std::string& name, Tensor value);

  /// All parameters (recursively, registration order): copies sharing the module's handles.
  std::vector<Tensor> parameters(bool recurse = true) const;
  /// Parameters with dotted names ("layers.0.weight").
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  /// All buffers (recursively).
  std::vector<Tensor> buffers(bool recurse = true) const;
  /// Buffers with dotted names.
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  /// Direct submodules in registration order.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  /// Every submodule below this one (depth first), with dotted names.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;

  /// Sets training mode on this module and every submodule (affects Dropout, BatchNorm).
  void train(bool on = true);
  /// train(false).
  void eval() { train(false); }
  bool is_training() const { return training_; }

  /// Calls `fn` on every submodule and then on this one, children before their parent and
  /// in registration order (torch's Module.apply; e.g. a custom initialisation).
  Module& apply(const std::function<void(Module&)>& fn);
  /// Sets whether every parameter (recursively) requires a gradient: false freezes them, so
  /// backward leaves their gradients undefined and optimizers skip them. Tied parameters
  /// follow their first owner. Throws DTypeError for true on an integer parameter.
  Module& requires_grad_(bool requires_grad = true);

  /// Parameters and buffers by dotted name; the tensors share the module's handles.
  StateDict state_dict() const;
  /// Copies the values of `dict` into the parameters and buffers. Every missing key,
  /// unexpected key and shape/dtype mismatch is reported in one error (ValueError, or
  /// ShapeError/DTypeError when mismatches are present); nothing is loaded on error. With
  /// `strict` false, missing and unexpected keys are returned instead (the keys present are
  /// loaded) but mismatches still throw.
  LoadStateDictResult load_state_dict(const StateDict& dict, bool strict = true);

  /// Casts every floating parameter and buffer to `dtype` (integer buffers keep theirs).
  /// To float16/bfloat16, modules whose stays_float32() is true (the norm layers) keep
  /// float32: their statistics need its range, and they take half inputs (O2 training).
  void to(DType dtype);
  /// True for layers that keep float32 parameters in a half model (BatchNorm, LayerNorm).
  virtual bool stays_float32() const { return false; }
  /// Moves every parameter and buffer to `device` (gradients are dropped, as the values are
  /// new tensors there); tied tensors stay tied.
  void to(Device device);
  /// Clears the accumulated gradients of every parameter.
  void zero_grad();
  /// Total number of elements over all parameters.
  int64_t num_parameters() const;

  /// The layer's settings for printing, e.g. "in_features=4, out_features=2, bias=true".
  virtual std::string extra_repr() const { return {}; }

 protected:
  /// Rebinds the submodule registered under `name` (ModuleDict's assignment to a key).
  void replace_module(const std::string& name, std::shared_ptr<Module> module);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name, const char* what) const;
  void collect(const std::string& prefix, bool recurse, bool params,
               std::vector<std::pair<std::string, Tensor>>& out) const;
  // Sets every parameter and buffer that `wanted` picks to `replacement` of it (tied
  // tensors once), under no_grad; the backbone of both to() overloads.
  void replace_all(const std::function<bool(const Tensor&)>& wanted,
                   const std::function<Tensor(const Tensor&)>& replacement, bool drop_grad);
  friend std::ostream& operator<<(std::ostream& os, const Module& m);
  void print(std::ostream& os, int indent) const;

  std::string name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

/// Unregisters the hook it was returned for (torch's RemovableHandle). Copies remove the
/// same hook; removing twice, or after the module is gone, does nothing.
class HookHandle {
 public:
  HookHandle() = default;
  void remove();

 private:
  friend class UnaryModule;
  explicit HookHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  std::function<void()> remover_;
};

/// A module whose forward maps one tensor to one tensor; Sequential chains these.
class UnaryModule : public Module {
 public:
  using Module::Module;
  /// Computes the module's output (builds graph; nothing runs).
  virtual Tensor forward(const Tensor& x) = 0;
  /// forward(x) with the hooks: pre-hooks, forward, then forward hooks, each in registration
  /// order. As in PyTorch, calling forward() directly runs no hooks; Sequential calls its
  /// modules through this operator.
  Tensor operator()(const Tensor& x);

  /// Called as hook(module, input, output) after forward; a returned tensor replaces the
  /// output (later hooks see the replacement).
  using ForwardHook =
      std::function<std::optional<Tensor>(Module&, const Tensor& input, const Tensor& output)>;
  /// Called as hook(module, input) before forward; a returned tensor replaces the input.
  using ForwardPreHook = std::function<std::optional<Tensor>(Module&, const Tensor& input)>;
  /// Registers a forward hook (torch's register_forward_hook); ValueError when empty.
  HookHandle register_forward_hook(ForwardHook hook);
  /// Registers a forward pre-hook (torch's register_forward_pre_hook); ValueError when empty.
  HookHandle register_forward_pre_hook(ForwardPreHook hook);

 private:
  // Shared with the handles (weakly), so a handle outliving the module is harmless.
  struct Hooks {
    uint64_t next_id = 0;
    std::vector<std::pair<uint64_t, ForwardPreHook>> pre;
    std::vector<std::pair<uint64_t, ForwardHook>> post;
  };
  std::shared_ptr<Hooks> hooks_ = std::make_shared<Hooks>();
};

/// std::make_shared<T>(args...): kiln modules live behind shared pointers.
template <typename T, typename... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

/// Prints the module tree as PyTorch does: "Sequential(\n  (0): Linear(in_features=...)...".
std::ostream& operator<<(std::ostream& os, const Module& m);

}  // namespace kiln::nn
