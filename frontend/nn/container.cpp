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
  for (auto& m : modules_) y = (*m)(y);  // through operator(), so the modules' hooks run
  return y;
}

ModuleList::ModuleList(std::initializer_list<std::shared_ptr<Module>> modules) : ModuleList() {
  for (const auto& m : modules) push_back(m);
}

void ModuleList::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

void ModuleList::extend(const std::vector<std::shared_ptr<Module>>& modules) {
  for (const auto& m : modules) push_back(m);
}

std::shared_ptr<Module> ModuleList::operator[](size_t i) const {
  if (i >= modules_.size()) {
    throw IndexError("[ModuleList] index " + std::to_string(i) + " is out of range for " +
                     std::to_string(modules_.size()) + " modules");
  }
  return modules_[i];
}

ModuleDict::ModuleDict(std::initializer_list<std::pair<std::string, std::shared_ptr<Module>>> items)
    : ModuleDict() {
  for (const auto& [key, m] : items) insert(key, m);
}

void ModuleDict::insert(const std::string& key, std::shared_ptr<Module> module) {
  for (auto& [k, m] : items_) {
    if (k == key) {
      replace_module(key, module);  // throws for a null module before anything changes
      m = std::move(module);
      return;
    }
  }
  register_module(key, module);
  items_.emplace_back(key, std::move(module));
}

bool ModuleDict::contains(const std::string& key) const {
  for (const auto& [k, _] : items_)
    if (k == key) return true;
  return false;
}

std::shared_ptr<Module> ModuleDict::operator[](const std::string& key) const {
  for (const auto& [k, m] : items_)
    if (k == key) return m;
  std::string known;
  for (const auto& [k, _] : items_) known += (known.empty() ? "\"" : ", \"") + k + "\"";
  throw ValueError("[ModuleDict] no module under key \"" + key + "\"; the keys are " +
                   (known.empty() ? std::string("none") : known));
}

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, _] : items_) out.push_back(k);
  return out;
}

}  // namespace kiln::nn
