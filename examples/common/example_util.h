#pragma once
// What the training examples share: the flag parser (flags.h), a one-line progress bar,
// mixed precision (--amp), the training monitor's logs (--log-csv, --log-jsonl), the memory
// budget and pictures of a training step (--memory-budget, --memory-timeline, --trace), and
// the closing report (kernel cache, memory pools, budget and the last step's plan).
#include <kiln/kiln.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/settings.h"
#include "flags.h"
#include "memory/memory.h"
#include "memory/pools/budget_spec.h"
#include "memory/reports/step_record.h"

namespace example {

/// Redraws one terminal line: "label [#####.....] 12/40 text".
inline void progress(const std::string& label, int64_t done, int64_t total,
                     const std::string& text) {
  constexpr int kWidth = 30;
  int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::printf("\r%s [%s] %lld/%lld %s", label.c_str(), bar.c_str(), static_cast<long long>(done),
              static_cast<long long>(total), text.c_str());
  if (done >= total) std::printf("\n");
  std::fflush(stdout);
}

/// Seconds since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Declares --amp off|bf16|fp16 (default off).
inline void add_amp_flag(Flags& flags) {
  flags.add("amp", "off",
            "mixed precision: off (float32), bf16 (forward and loss under bfloat16 autocast) or "
            "fp16 (float16 autocast with dynamic loss scaling)");
}

/// What --amp asked for: whether autocast is on, its dtype, and whether the loss is scaled
/// (float16 only: bfloat16 has float32's range and needs no scaler, as in PyTorch).
struct AmpMode {
  bool enabled = false;
  kiln::DType dtype = kiln::DType::BFloat16;

  /// The GradScaler's settings for this mode: PyTorch's defaults, enabled for fp16 only.
  kiln::amp::GradScalerOptions scaler_options() const {
    return {.enabled = enabled && dtype == kiln::DType::Float16};
  }
};

/// Reads --amp; UsageError (exit 2) for anything but off, bf16 or fp16. Prints one line
/// saying what is on when it is not off.
inline AmpMode amp_mode(const Flags& flags) {
  const std::string value = flags.str("amp");
  AmpMode mode;
  if (value == "bf16") {
    mode = {true, kiln::DType::BFloat16};
    std::printf(
        "mixed precision: bf16 autocast (products in bfloat16, the rest in float32), "
        "float32 weights, no loss scaling\n");
  } else if (value == "fp16") {
    mode = {true, kiln::DType::Float16};
    std::printf(
        "mixed precision: fp16 autocast (products in float16, the rest in float32), "
        "float32 weights, GradScaler (initial scale 65536)\n");
  } else if (value != "off") {
    throw UsageError("--amp expects off, bf16 or fp16, got '" + value + "'");
  }
  return mode;
}

/// Declares --log-csv FILE and --log-jsonl FILE: kiln::TrainingMonitor's per-step metrics
/// (loss, gradient norm, memory, throughput) as CSV rows or JSON lines.
inline void add_monitor_flags(Flags& flags) {
  flags.add("log-csv", "", "write each training step's metrics to this CSV file");
  flags.add("log-jsonl", "", "write each training step's metrics to this file as JSON lines");
}

/// The TrainingMonitor of a run of `steps` steps that counts `unit` (samples, tokens), with
/// the logs --log-csv and --log-jsonl ask for (check_memory_flags checks their paths when
/// given "log-csv" and "log-jsonl") and the displayed loss averaged with `loss_smoothing`.
inline kiln::TrainingMonitorOptions monitor_options(const Flags& flags, int64_t steps,
                                                    const std::string& unit,
                                                    double loss_smoothing = 0) {
  return {.total_steps = steps,
          .unit = unit,
          .loss_smoothing = loss_smoothing,
          .csv_path = flags.str("log-csv"),
          .jsonl_path = flags.str("log-jsonl")};
}

/// Declares --memory-budget SPEC (as KILN_MEMORY_BUDGET, which it overrides), and
/// --memory-timeline FILE and --trace FILE (both off by default): the last training step's
/// bytes in use as an SVG picture, and its kernels as a Chrome trace.
inline void add_memory_flags(Flags& flags) {
  flags.add("memory-budget", "",
            "memory budget of every step: whole bytes, a size with a unit (KB MB GB = powers "
            "of 1000, KiB MiB GiB = powers of 1024: 300MB, 512MiB, 1.5GiB), a percentage of "
            "RAM (50%), or none (default: KILN_MEMORY_BUDGET, else none)");
  flags.add("memory-timeline", "",
            "write the last training step's memory timeline (SVG picture) to this file");
  flags.add("trace", "",
            "write the last training step as a Chrome trace (ui.perfetto.dev, chrome://tracing)");
}

/// Why nothing can be written to `path`, or "" when it can: its directory exists and takes
/// new files, and the file, when it exists, is a writable file. Creates nothing.
inline std::string unwritable_reason(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path file(path);
  if (fs::is_directory(file, ec)) return "it is a directory";
  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  if (!fs::exists(dir, ec)) return "directory '" + dir.string() + "' does not exist";
  if (!fs::is_directory(dir, ec)) return "'" + dir.string() + "' is not a directory";
  if (fs::exists(file, ec)) {
    if (::access(path.c_str(), W_OK) != 0) return "the file is not writable";
  } else if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return "directory '" + dir.string() + "' is not writable";
  }
  return "";
}

/// Checks the memory flags before any work, so a mistake costs no training: a malformed
/// --memory-budget is a usage error (exit 2, the parser's message naming the flag and the
/// accepted forms), and an output that cannot be written (--memory-timeline, --trace, the
/// flags in `outputs` such as "save", and KILN_PLAN_DUMP) an error (exit 1) naming it.
inline void check_memory_flags(const Flags& flags, const std::vector<std::string>& outputs = {}) {
  if (const std::string spec = flags.str("memory-budget"); !spec.empty()) {
    try {
      (void)kiln::memory::parse_budget(spec, "--memory-budget", kiln::memory::BudgetContext::Pool);
    } catch (const kiln::memory::BudgetError& e) {
      throw UsageError(e.what());
    }
  }
  std::vector<std::string> names = {"memory-timeline", "trace"};
  names.insert(names.end(), outputs.begin(), outputs.end());
  for (const std::string& name : names)
    if (const std::string path = flags.str(name); !path.empty())
      if (const std::string why = unwritable_reason(path); !why.empty())
        throw kiln::IOError("[--" + name + "] cannot write '" + path + "': " + why +
                            "; nothing was run");
  if (const std::optional<std::string> dump = kiln::settings::text("KILN_PLAN_DUMP")) {
    std::string first = *dump;  // the first file's name when it numbers them
    if (const size_t at = first.find("%n"); at != std::string::npos) first.replace(at, 2, "000000");
    if (const std::string why = unwritable_reason(first); !why.empty())
      kiln::settings::reject("KILN_PLAN_DUMP", *dump, "cannot write '" + first + "': " + why);
  }
}

/// Sets the budget --memory-budget asks for and turns step recording on when either picture
/// was asked for; call it before training (check_memory_flags has read the flags already).
inline void apply_memory_flags(const Flags& flags) {
  if (const std::string spec = flags.str("memory-budget"); !spec.empty())
    kiln::memory::set_budget(
        kiln::memory::parse_budget(spec, "--memory-budget", kiln::memory::BudgetContext::Pool));
  if (!flags.str("memory-timeline").empty() || !flags.str("trace").empty())
    kiln::memory::set_step_recording(true);
}

/// Runs an evaluation phase after training ("the test pass after epoch 30", "sampling after
/// step 400"): a step of it that does not fit the memory budget is reported as that phase's,
/// since the same budget held for training.
template <typename Run>
auto in_phase(const std::string& phase, Run&& run) {
  try {
    return run();
  } catch (const kiln::OutOfMemoryError& e) {
    throw kiln::OutOfMemoryError(
        phase + " does not fit the memory budget that training ran in: " + e.what());
  }
}

/// Prints the last training step's memory in one line when a budget is set (peak against
/// the budget, rebuilds and their share of the step's work), then writes the pictures asked
/// for; call it right after the last training step, before any evaluation or sampling
/// replaces the record.
inline void report_training_memory(const Flags& flags) {
  if (const kiln::memory::PlanSummary s = kiln::memory::last_plan(); s.budget > 0) {
    const bool held = s.within_budget && s.measured_peak <= s.budget;
    std::printf(
        "last training step: peak %s, %s a %s budget (lower bound %s), %zu rebuilds, "
        "+%.1f%% work\n",
        kiln::memory::format_bytes(s.measured_peak).c_str(), held ? "within" : "OVER",
        kiln::memory::format_bytes(s.budget).c_str(),
        kiln::memory::format_bytes(s.lower_bound).c_str(), s.recomputes,
        s.base_cost > 0 ? 100.0 * s.extra_cost / s.base_cost : 0.0);
  }
  if (const std::string path = flags.str("memory-timeline"); !path.empty()) {
    kiln::memory::write_memory_timeline(path);
    std::printf("wrote memory timeline to %s\n", path.c_str());
  }
  if (const std::string path = flags.str("trace"); !path.empty()) {
    kiln::memory::write_chrome_trace(path);
    std::printf("wrote Chrome trace to %s (open it in ui.perfetto.dev or chrome://tracing)\n",
                path.c_str());
  }
}

/// The closing report every example prints: what the JIT compiled or reused, what the memory
/// pools hold, the budget and the last step's plan.
inline void print_runtime_report() {
  kiln::jit::CacheStats s = kiln::jit::cache_stats();
  std::printf("\nkernel cache: %llu compiled (%.0f ms), %llu memory hits, %llu disk hits, %s\n",
              static_cast<unsigned long long>(s.kernels_compiled), s.compile_ms_total,
              static_cast<unsigned long long>(s.memory_hits),
              static_cast<unsigned long long>(s.disk_hits),
              s.disk_enabled ? ("directory " + s.directory).c_str() : "memory only");
  const kiln::jit::ReplayStats r = kiln::jit::replay_stats();
  auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf(
      "replay: %llu of %llu evaluations reused a plan (%llu with new sizes or draws), %llu "
      "kernel launches replayed\n",
      u(r.hits), u(r.hits + r.misses), u(r.hits_relowered), u(r.launches_replayed));
  std::printf(
      "plans made: %llu new graphs, %llu for another dtype, %llu device, %llu broadcast, %llu "
      "attributes, %llu outputs, %llu dropped from the cache\n",
      u(r.missed_new_graph), u(r.missed_dtype), u(r.missed_device), u(r.missed_broadcast),
      u(r.missed_attributes), u(r.missed_roles), u(r.missed_dropped));
  std::printf("\nmemory:\n%s\n", kiln::memory::report().c_str());
}

}  // namespace example
