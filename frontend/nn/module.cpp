#include "module.h"

#include <algorithm>
#include <functional>
#include <ostream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "../../ops/elementwise.h"
#include "../../ops/sources.h"

namespace kiln::nn {
namespace {

std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape());
}

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + ("\"" + items[i] + "\"");
  return s;
}

// An independent copy of `value`'s data: loading must not make the module's parameter and
// the caller's dict share one node, or marking the parameter as a leaf (and later gradient
// accumulation) would reach the caller's tensor too.
// It is placed on `device`, the receiving tensor's, as torch's load_state_dict copies.
Tensor fresh_copy(const Tensor& value, Device device) {
  value.eval();
  return from_data(value.raw_data(), value.shape(), value.dtype(), device);
}

}  // namespace

Module::Module(std::string name) : name_(std::move(name)) {}

void Module::check_new_name(const std::string& name, const char* what) const {
  if (name.empty() || name.find('.') != std::string::npos) {
    throw ValueError("[" + name_ + "] " + what + " name \"" + name +
                     "\" is invalid; expected a non-empty name without '.'");
  }
  auto taken = [&](const auto& list) {
    for (const auto& [n, _] : list)
      if (n == name) return true;
    return false;
  };
  if (taken(parameters_) || taken(buffers_) || taken(children_)) {
    throw ValueError("[" + name_ + "] cannot register " + what + " \"" + name +
                     "\": the name is already used by a parameter, buffer or submodule");
  }
}

Tensor Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_new_name(name, "parameter");
  if (!value.defined()) {
    throw ValueError("[" + name_ + "] parameter \"" + name + "\" is undefined");
  }
  if (requires_grad) value.requires_grad_();
  parameters_.emplace_back(name, value);
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name, "buffer");
  if (!value.defined()) throw ValueError("[" + name_ + "] buffer \"" + name + "\" is undefined");
  buffers_.emplace_back(name, value);
  return value;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "submodule");
  if (!module) throw ValueError("[" + name_ + "] submodule \"" + name + "\" is null");
  children_.emplace_back(name, std::move(module));
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> module) {
  if (!module) throw ValueError("[" + name_ + "] submodule \"" + name + "\" is null");
  for (auto& [n, child] : children_) {
    if (n == name) {
      child = std::move(module);
      return;
    }
  }
  throw ValueError("[" + name_ + "] replace_module: no submodule named \"" + name + "\"");
}

void Module::replace_tensor(const std::string& name, Tensor value) {
  for (auto* list : {&parameters_, &buffers_}) {
    for (auto& [n, t] : *list) {
      if (n == name) {
        t = std::move(value);
        return;
      }
    }
  }
  throw ValueError("[" + name_ + "] replace_tensor: no parameter or buffer named \"" + name + "\"");
}

void Module::collect(const std::string& prefix, bool recurse, bool params,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [n, t] : params ? parameters_ : buffers_) out.emplace_back(prefix + n, t);
  if (!recurse) return;
  for (const auto& [n, child] : children_) child->collect(prefix + n + ".", true, params, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> all, unique;
  collect("", recurse, true, all);
  // A tied parameter (one node registered twice) is listed once, under its first name, so
  // that an optimizer does not step it twice.
  std::unordered_set<const Node*> seen;
  for (auto& item : all)
    if (seen.insert(item.second.node().get()).second) unique.push_back(std::move(item));
  return unique;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [_, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", recurse, false, out);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [_, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const auto& [n, child] : children_) {
    out.emplace_back(n, child);
    for (auto& [sub, m] : child->named_modules()) out.emplace_back(n + "." + sub, m);
  }
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [_, child] : children_) child->train(on);
}

StateDict Module::state_dict() const {
  StateDict dict;
  std::vector<std::pair<std::string, Tensor>> all;
  collect("", true, true, all);
  collect("", true, false, all);
  for (auto& [n, t] : all) dict.emplace(n, t);
  return dict;
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  // Over a copy of the children (owners included): `fn` may register or replace children,
  // which would invalidate an iterator into children_; those it adds are not visited.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>> children = children_;
  for (const auto& [_, child] : children) child->apply(fn);
  fn(*this);
  return *this;
}

Module& Module::requires_grad_(bool requires_grad) {
  for (const Tensor& p : parameters()) p.requires_grad_(requires_grad);
  return *this;
}

LoadStateDictResult Module::load_state_dict(const StateDict& dict, bool strict) {
  StateDict own = state_dict();
  std::vector<std::string> missing, unexpected, mismatched;
  bool shape_mismatch = false;
  for (const auto& [n, t] : own) {
    auto it = dict.find(n);
    if (it == dict.end()) {
      missing.push_back(n);
      continue;
    }
    const Tensor& v = it->second;
    if (!v.defined()) {
      mismatched.push_back("\"" + n + "\" is undefined in the state_dict");
      continue;
    }
    bool shape_ok = v.shape() == t.shape(), dtype_ok = v.dtype() == t.dtype();
    if (!shape_ok || !dtype_ok) {
      shape_mismatch = shape_mismatch || !shape_ok;
      mismatched.push_back("\"" + n + "\": expected " + describe(t) + ", got " + describe(v));
    }
  }
  for (const auto& [n, _] : dict)
    if (!own.count(n)) unexpected.push_back(n);

  bool fail = !mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()));
  if (fail) {
    std::string msg = "[" + name_ + "::load_state_dict] error(s) loading the state_dict:";
    if (strict && !missing.empty()) msg += " missing keys: " + join(missing) + ";";
    if (strict && !unexpected.empty()) msg += " unexpected keys: " + join(unexpected) + ";";
    if (!mismatched.empty()) {
      msg += " shape/dtype mismatch for";
      for (size_t i = 0; i < mismatched.size(); ++i) msg += (i ? ", " : " ") + mismatched[i];
      msg += ";";
    }
    msg.pop_back();
    if (shape_mismatch) throw ShapeError(msg);
    if (!mismatched.empty()) throw DTypeError(msg);
    throw ValueError(msg);
  }
  NoGradGuard no_grad;
  for (auto& [n, t] : own) {
    auto it = dict.find(n);
    if (it != dict.end()) t.assign(fresh_copy(it->second, t.device()));
  }
  return {std::move(missing), std::move(unexpected)};
}

// ---------------------------------------------------------------------------------------
// Hooks

void HookHandle::remove() {
  if (remover_) std::exchange(remover_, nullptr)();
}

namespace {

// Erases the entry `id` from hooks->*list if the module (its hook lists) still exists.
template <typename List, typename Hooks>
std::function<void()> remover(const std::shared_ptr<Hooks>& hooks, List Hooks::*list, uint64_t id) {
  return [weak = std::weak_ptr<Hooks>(hooks), list, id] {
    if (auto h = weak.lock()) {
      auto& v = (*h).*list;
      std::erase_if(v, [&](const auto& entry) { return entry.first == id; });
    }
  };
}

}  // namespace

HookHandle UnaryModule::register_forward_hook(ForwardHook hook) {
  if (!hook) throw ValueError("[" + name() + "] register_forward_hook: the hook is empty");
  const uint64_t id = hooks_->next_id++;
  hooks_->post.emplace_back(id, std::move(hook));
  return HookHandle(remover(hooks_, &Hooks::post, id));
}

HookHandle UnaryModule::register_forward_pre_hook(ForwardPreHook hook) {
  if (!hook) throw ValueError("[" + name() + "] register_forward_pre_hook: the hook is empty");
  const uint64_t id = hooks_->next_id++;
  hooks_->pre.emplace_back(id, std::move(hook));
  return HookHandle(remover(hooks_, &Hooks::pre, id));
}

Tensor UnaryModule::operator()(const Tensor& x) {
  // Copies of the lists: a hook may remove itself (or another) while they run.
  Tensor input = x;
  if (!hooks_->pre.empty()) {
    for (auto& [_, hook] : std::vector(hooks_->pre)) {
      if (std::optional<Tensor> r = hook(*this, input)) input = *r;
    }
  }
  Tensor output = forward(input);
  if (!hooks_->post.empty()) {
    for (auto& [_, hook] : std::vector(hooks_->post)) {
      if (std::optional<Tensor> r = hook(*this, input, output)) output = *r;
    }
  }
  return output;
}

// ---------------------------------------------------------------------------------------

void Module::replace_all(const std::function<bool(const Tensor&)>& wanted,
                         const std::function<Tensor(const Tensor&)>& replacement, bool drop_grad) {
  NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> all;
  collect("", true, true, all);
  collect("", true, false, all);
  // Tied tensors (two handles on one node) get the same new value, so they stay tied.
  std::unordered_map<const Node*, Tensor> done;
  for (auto& [_, t] : all) {
    if (!wanted(t)) continue;
    auto [it, fresh] = done.try_emplace(t.node().get());
    if (fresh) it->second = replacement(t);
    t.set_data(it->second);
    if (drop_grad) t.set_grad(Tensor());
  }
}

void Module::to(DType dtype) {
  std::unordered_set<const Node*> kept;  // the norm layers' tensors, in a half model
  if (dtype == DType::Float16 || dtype == DType::BFloat16) {
    std::vector<std::pair<std::string, std::shared_ptr<Module>>> all = named_modules();
    std::vector<const Module*> modules{this};
    for (const auto& [_, m] : all) modules.push_back(m.get());
    for (const Module* m : modules) {
      if (!m->stays_float32()) continue;
      for (const Tensor& t : m->parameters(false)) kept.insert(t.node().get());
      for (const Tensor& t : m->buffers(false)) kept.insert(t.node().get());
    }
  }
  replace_all(
      [&](const Tensor& t) {
        return is_floating(t.dtype()) && t.dtype() != dtype && !kept.count(t.node().get());
      },
      [&](const Tensor& t) { return cast(t, dtype); }, false);
}

void Module::to(Device device) {
  // A gradient stays on the device where it was computed, so it is dropped.
  replace_all([&](const Tensor& t) { return t.device() != device; },
              [&](const Tensor& t) { return t.to(device).eval(); }, true);
}

void Module::zero_grad() {
  for (Tensor& p : parameters()) p.set_grad(Tensor());
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

void Module::print(std::ostream& os, int indent) const {
  os << name_ << "(" << extra_repr();
  if (!children_.empty()) {
    os << "\n";
    for (const auto& [n, child] : children_) {
      os << std::string(static_cast<size_t>(indent + 2), ' ') << "(" << n << "): ";
      child->print(os, indent + 2);
      os << "\n";
    }
    os << std::string(static_cast<size_t>(indent), ' ');
  }
  os << ")";
}

std::ostream& operator<<(std::ostream& os, const Module& m) {
  m.print(os, 0);
  return os;
}

}  // namespace kiln::nn
