#include "amp.h"

#include <cmath>
#include <string>

#include "../core/error.h"
#include "../ops/elementwise.h"
#include "../ops/reduce_ops.h"
#include "../ops/sources.h"

namespace kiln::amp {
namespace {

std::string num(double v) {
  std::string s = std::to_string(v);
  while (s.size() > 1 && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

void check_options(const GradScalerOptions& o, double scale) {
  if (!(std::isfinite(scale) && scale > 0))
    throw ValueError("[GradScaler] the scale must be finite and > 0, got " + num(scale));
  if (!(o.growth_factor > 1.0 && std::isfinite(o.growth_factor)))
    throw ValueError("[GradScaler] growth_factor must be > 1, got " + num(o.growth_factor));
  if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0))
    throw ValueError("[GradScaler] backoff_factor must be in (0, 1), got " + num(o.backoff_factor));
  if (o.growth_interval < 1)
    throw ValueError("[GradScaler] growth_interval must be >= 1, got " +
                     std::to_string(o.growth_interval));
}

}  // namespace

GradScaler::GradScaler(const GradScalerOptions& options)
    : options_(options), scale_(options.init_scale) {
  check_options(options_, scale_);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!loss.defined()) throw ValueError("[GradScaler] scale() got an undefined loss");
  if (!options_.enabled) return loss;
  // The scale is a kernel parameter (value-generic kernels): a new scale compiles nothing.
  return loss * scale_;
}

void GradScaler::unscale_(optim::Optimizer& opt) {
  if (!options_.enabled) return;
  Record& r = records_[&opt];
  if (r.unscaled)
    throw ValueError(
        "[GradScaler] unscale_() has already been called on this optimizer since the last "
        "update()");
  const double inv = 1.0 / scale_;
  Tensor any_bad;
  for (Tensor p : opt.parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    // g - g is 0 for every finite value and NaN for inf and NaN: one compare per element,
    // no buffer; the unscaled gradient stays pending and fuses into its reader.
    Tensor bad = any(ne(g - g, 0.0));
    any_bad = any_bad.defined() ? logical_or(any_bad, bad) : bad;
    p.set_grad(g * inv);
  }
  r.unscaled = true;
  r.found_inf = any_bad.defined() && any_bad.item<bool>();
}

bool GradScaler::step(optim::Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    return true;
  }
  if (!records_[&opt].unscaled) unscale_(opt);
  if (records_[&opt].found_inf) return false;
  opt.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  bool found_inf = false;
  for (const auto& [o, r] : records_) found_inf = found_inf || r.found_inf;
  if (records_.empty()) {
    throw ValueError(
        "[GradScaler] update() without a step(): no optimizer was stepped or unscaled since "
        "the last update()");
  }
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval) {
    // float32 arithmetic as PyTorch's scale tensor does it, kept finite.
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(static_cast<float>(grown))) scale_ = grown;
    growth_tracker_ = 0;
  }
  records_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  check_options(options_, new_scale);
  scale_ = new_scale;
  growth_tracker_ = 0;
  records_.clear();
}

StateDict GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  return {{"scale", full({}, scale_, DType::Float64)},
          {"growth_factor", full({}, options_.growth_factor, DType::Float64)},
          {"backoff_factor", full({}, options_.backoff_factor, DType::Float64)},
          {"growth_interval", full({}, options_.growth_interval, DType::Int64)},
          {"_growth_tracker", full({}, growth_tracker_, DType::Int64)}};
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!options_.enabled) return;
  auto get = [&](const char* key) {
    auto it = state.find(key);
    if (it == state.end() || !it->second.defined() || it->second.numel() != 1)
      throw ValueError(std::string("[GradScaler] load_state_dict: entry '") + key +
                       "' is missing or not a scalar");
    return it->second.item<double>();
  };
  GradScalerOptions o = options_;
  const double scale = get("scale");
  o.growth_factor = get("growth_factor");
  o.backoff_factor = get("backoff_factor");
  o.growth_interval = static_cast<int64_t>(get("growth_interval"));
  const auto tracker = static_cast<int64_t>(get("_growth_tracker"));
  check_options(o, scale);
  if (tracker < 0 || tracker >= o.growth_interval)
    throw ValueError("[GradScaler] load_state_dict: _growth_tracker " + std::to_string(tracker) +
                     " is outside [0, growth_interval)");
  options_ = o;
  scale_ = scale;
  growth_tracker_ = tracker;
  records_.clear();
}

}  // namespace kiln::amp
