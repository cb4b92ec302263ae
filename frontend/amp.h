#pragma once
// Loss scaling for float16 training (PyTorch's torch.amp.GradScaler): the loss is multiplied
// by a scale before backward() so small float16 gradients do not flush to zero; before the
// update the gradients are divided by it again, and a step whose gradients hold an inf or
// NaN is skipped and the scale lowered. bfloat16 has float32's range and needs no scaler
// (construct it with enabled = false and every call passes through). autocast itself is in
// ops/autocast.h (kiln::amp::autocast).
#include <cstdint>
#include <map>

#include "../core/tensor.h"
#include "../ops/autocast.h"
#include "optim.h"
#include "state_dict.h"

namespace kiln::amp {

/// GradScaler's settings, with PyTorch's defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

/// Dynamic loss scaling with PyTorch's semantics: scale(loss), then unscale_(opt) (for
/// gradient clipping) or directly step(opt), then update() once per iteration.
class GradScaler {
 public:
  /// Throws ValueError for a non-positive or non-finite scale, a growth factor <= 1, a
  /// backoff factor outside (0, 1) or a growth interval < 1.
  explicit GradScaler(const GradScalerOptions& options = {});

  /// loss * scale (the loss itself when disabled); builds, evaluates nothing.
  Tensor scale(const Tensor& loss) const;
  /// Divides the gradients of `opt`'s parameters by the scale (lazily: the division is fused
  /// into whatever reads them next, the update's kernels included) and records whether any
  /// of them holds an inf or NaN (this evaluates the gradients). At most once per optimizer
  /// between update() calls; ValueError otherwise.
  void unscale_(optim::Optimizer& opt);
  /// Unscales if unscale_ was not called, then runs opt.step() unless a gradient was not
  /// finite, in which case parameters and optimizer state are left as they are. Returns
  /// whether the step ran.
  bool step(optim::Optimizer& opt);
  /// Ends the iteration: the scale is multiplied by backoff_factor if any step since the
  /// last update() was skipped, by growth_factor after growth_interval steps in a row that
  /// were not, and is otherwise kept.
  void update();
  /// Sets the scale for the next iteration (PyTorch's update(new_scale)).
  void update(double new_scale);

  /// The current scale (1.0 when disabled).
  double get_scale() const { return options_.enabled ? scale_ : 1.0; }
  bool is_enabled() const { return options_.enabled; }
  /// Steps in a row without an inf or NaN since the scale last changed.
  int64_t growth_tracker() const { return growth_tracker_; }

  /// "scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker" (as
  /// PyTorch names them), float64 / int64 scalars; empty when disabled.
  StateDict state_dict() const;
  /// Restores a state_dict(); throws ValueError naming a missing or malformed entry.
  void load_state_dict(const StateDict& state);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  // Per optimizer since the last update(): whether its gradients were unscaled and whether
  // one of them was not finite.
  struct Record {
    bool unscaled = false;
    bool found_inf = false;
  };
  std::map<const optim::Optimizer*, Record> records_;
};

}  // namespace kiln::amp
