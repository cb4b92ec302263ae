#include "container.h"

#include "linear.h"

namespace kiln::nn {

Sequential::Sequential(std::initializer_list<std::shared_ptr<UnaryModule>> modules) : Sequential() {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<UnaryModule> module) {
  push_back(std::to_string(modules_.size()), std::move(module));
}

void Sequential::push_back(const std::string& name, std::shared_ptr<UnaryModule> module) {
  register_module(name, module);
  modules_.push_back(std::move(module));
}

void Sequential::push_back(std::function<Tensor(const Tensor&)> fn) {
  push_back(std::make_shared<Functional>(std::move(fn)));
}

std::shared_ptr<UnaryModule> Sequential::operator[](size_t i) const {
  if (i >= modules_.size()) {
    throw IndexError("[Sequential] index " + std::to_string(i) + " is out of range for " +
                     std::to_string(modules_.size()) + " modules");
  }
  return modules_[i];
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& m : modules_) y = m->forward(y);
  return y;
}

}  // namespace kiln::nn
