#pragma once
// What the mixed-precision rows of bench_train and bench_plan share: the precision of a
// training step (float32, or forward and loss under bf16/fp16 autocast, fp16 with a
// GradScaler, as examples/ do), and the PyTorch run beside it (bench_train_torch.py, eager
// or torch.compile, float32 or torch.autocast).
#include <sys/wait.h>

#include <cctype>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.h"
#include "frontend/kiln.h"
#include "frontend/optim.h"

namespace kiln::bench {

/// The precision of a training step: float32, or forward and loss under autocast (bf16, or
/// fp16 with a GradScaler, as examples/ and bench_train_torch.py --amp do).
enum class Precision { Float32, BFloat16, Float16 };

/// "fp32", "bf16" or "fp16".
inline const char* precision_name(Precision p) {
  return p == Precision::Float32 ? "fp32" : p == Precision::BFloat16 ? "bf16" : "fp16";
}

/// The precisions named in `list` ("fp32,bf16,fp16"), or nothing when a name is not one.
inline std::optional<std::vector<Precision>> parse_precisions(const std::string& list) {
  std::vector<Precision> out;
  const std::string text = list + ",";
  for (size_t at = 0, end; (end = text.find(',', at)) != std::string::npos; at = end + 1) {
    const std::string p = text.substr(at, end - at);
    if (p == "fp32")
      out.push_back(Precision::Float32);
    else if (p == "bf16")
      out.push_back(Precision::BFloat16);
    else if (p == "fp16")
      out.push_back(Precision::Float16);
    else
      return std::nullopt;
  }
  return out;
}

/// One training step of `opt`'s model: zero_grad, `loss_fn` (forward and loss) under the
/// precision's autocast, backward (of the scaled loss for fp16 unless `loss_scaling` is
/// false), the update; returns the loss, unevaluated. With loss scaling the step is two
/// evaluations (the scaler's inf/NaN check reads the gradients before the update is built).
inline std::function<Tensor()> amp_step(std::shared_ptr<optim::Optimizer> opt, Precision p,
                                        std::function<Tensor()> loss_fn, bool loss_scaling = true) {
  auto scaler = std::make_shared<amp::GradScaler>(
      amp::GradScalerOptions{.enabled = loss_scaling && p == Precision::Float16});
  return [opt, p, loss_fn, scaler] {
    opt->zero_grad();
    Tensor loss;
    {
      amp::autocast scope(Device::cpu(), p == Precision::Float16 ? DType::Float16 : DType::BFloat16,
                          p != Precision::Float32);
      loss = loss_fn();
    }
    scaler->scale(loss).backward();
    scaler->step(*opt);
    scaler->update();
    return loss;
  };
}

/// One PyTorch run of a workload: the step's medians, the peak RSS growth and the bytes
/// autograd saved for backward (activations; everything), or a note.
struct TorchRun {
  Times step;
  double peak = -1, saved = -1, saved_all = -1;
  std::string note;  // empty on success
};

/// Runs bench_train_torch.py for one workload (eager, or with `compile` under torch.compile;
/// in `precision`) in its own process, so that each peak RSS starts from a fresh
/// interpreter. The run is bounded by BENCH_TORCH_TIMEOUT seconds (default 900), compiling
/// included.
inline TorchRun run_torch(const std::string& name, int threads, int reps, bool compile,
                          Precision precision) {
  TorchRun out;
  const std::string args = "--threads " + std::to_string(threads) + " --reps " +
                           std::to_string(reps) + " --only " + name +
                           (compile ? " --compile" : "") + " --amp " +
                           (precision == Precision::Float32 ? "off" : precision_name(precision));
  // Inductor's warnings would flood the table: only eager runs echo what they print.
  const TorchScriptRun run =
      run_torch_script("bench_train_torch.py", args, !compile, [&](const char* line) {
        char got[128];
        int used = 0;
        Times t;
        double peak = -1, saved = -1, saved_all = -1;
        if (std::sscanf(line, "RESULT %127s %lf %lf %lf %lf %lf", got, &t.wall_ms, &t.cpu_ms, &peak,
                        &saved, &saved_all) >= 4 &&
            name == got) {
          out.step = t;
          out.peak = peak;
          out.saved = saved;
          out.saved_all = saved_all;
          return true;
        }
        if (std::sscanf(line, "NOTE %127s %n", got, &used) == 1 && used > 0) {
          out.note = line + used;
          return true;
        }
        return false;
      });
  while (!out.note.empty() && std::isspace(static_cast<unsigned char>(out.note.back())))
    out.note.pop_back();
  if (out.step.wall_ms < 0 && out.note.empty())
    out.note = run.note.empty() ? "bench_train_torch.py gave no result" : run.note;
  return out;
}

}  // namespace kiln::bench
