#pragma once
// Sequential: a chain of one-input modules, named "0", "1", ... as in PyTorch.
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
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

}  // namespace kiln::nn
