#pragma once
// Containers as in PyTorch: Sequential (a chain of one-input modules), ModuleList and
// ModuleDict (holders whose modules' parameters appear under "0.weight" / "key.weight").
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "module.h"

namespace kiln::nn {

/// Applies its modules in order; each module's parameters appear under its index
/// ("0.weight") or the name given to push_back.
class Sequential : public UnaryModule {
 public:
  Sequential() : UnaryModule("Sequential") {}
  Sequential(std::initializer_list<std::shared_ptr<UnaryModule>> modules);

  /// Appends a module named by its position.
  void push_back(std::shared_ptr<UnaryModule> module);
  /// Appends a module under `name`.
  void push_back(const std::string& name, std::shared_ptr<UnaryModule> module);
  /// Appends a function as a parameter-free module.
  void push_back(std::function<Tensor(const Tensor&)> fn);

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  /// The module at position i (IndexError when out of range).
  std::shared_ptr<UnaryModule> operator[](size_t i) const;
  /// The module at position i as a T (ValueError when it is not one).
  template <typename T>
  std::shared_ptr<T> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<T>((*this)[i]);
    if (!m)
      throw ValueError("[Sequential] module " + std::to_string(i) + " is a " + (*this)[i]->name() +
                       ", not the requested type");
    return m;
  }

  /// Feeds x through every module in order (the identity when empty).
  Tensor forward(const Tensor& x) override;

 private:
  std::vector<std::shared_ptr<UnaryModule>> modules_;
};

/// A list of modules of any kind, registered as "0", "1", ... (torch.nn.ModuleList). It has
/// no forward: the owner iterates it.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  ModuleList(std::initializer_list<std::shared_ptr<Module>> modules);

  /// Appends a module named by its position (ValueError when null).
  void push_back(std::shared_ptr<Module> module);
  /// Appends every module of `modules`.
  void extend(const std::vector<std::shared_ptr<Module>>& modules);

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  /// The module at position i (IndexError when out of range).
  std::shared_ptr<Module> operator[](size_t i) const;
  /// The module at position i as a T (ValueError when it is not one).
  template <typename T>
  std::shared_ptr<T> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<T>((*this)[i]);
    if (!m)
      throw ValueError("[ModuleList] module " + std::to_string(i) + " is a " + (*this)[i]->name() +
                       ", not the requested type");
    return m;
  }
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

/// Modules by name, in insertion order (torch.nn.ModuleDict); parameters appear as
/// "name.weight". It has no forward: the owner looks modules up.
class ModuleDict : public Module {
 public:
  ModuleDict() : Module("ModuleDict") {}
  ModuleDict(std::initializer_list<std::pair<std::string, std::shared_ptr<Module>>> items);

  /// Adds `module` under `key`, or replaces the module there, keeping its position (PyTorch's
  /// dict[key] = module). ValueError for a null module or a key that is empty, contains '.'
  /// or names a parameter of the dict.
  void insert(const std::string& key, std::shared_ptr<Module> module);
  bool contains(const std::string& key) const;
  /// The module under `key` (ValueError naming the keys when there is none).
  std::shared_ptr<Module> operator[](const std::string& key) const;
  /// The module under `key` as a T (ValueError when it is not one).
  template <typename T>
  std::shared_ptr<T> at(const std::string& key) const {
    auto m = std::dynamic_pointer_cast<T>((*this)[key]);
    if (!m)
      throw ValueError("[ModuleDict] module \"" + key + "\" is a " + (*this)[key]->name() +
                       ", not the requested type");
    return m;
  }
  /// Keys in insertion order.
  std::vector<std::string> keys() const;
  /// (key, module) pairs in insertion order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& items() const {
    return items_;
  }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }

 private:
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> items_;
};

}  // namespace kiln::nn
