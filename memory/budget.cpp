#include "budget.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "../core/cuda_driver.h"
#include "../core/error.h"
#include "../core/settings.h"
#include "caching_pool.h"
#include "device_pools.h"

namespace kiln::memory {
namespace {

struct Budget {
  size_t bytes = 0;     // an absolute budget, or
  double fraction = 0;  // a share of each device's memory (0: not a fraction)
};

std::mutex g_mutex;
Budget g_budget;
bool g_loaded = false;
double g_margin = 0;

Budget parse(const std::string& spec, const std::string& what) {
  // A bare number with a decimal point, or any number <= 1, is a fraction of the device.
  char* end = nullptr;
  double v = std::strtod(spec.c_str(), &end);
  bool bare = end != spec.c_str();
  while (bare && *end == ' ') ++end;
  if (bare && *end == '\0' && (spec.find('.') != std::string::npos || v <= 1)) {
    if (!(v > 0 && v <= 1) || !std::isfinite(v))
      throw ValueError("[memory] " + what + " '" + spec +
                       "' is not a budget; a fraction of device memory must be in (0, 1]");
    return {0, v};
  }
  try {
    return {parse_memory_size(spec, what), 0};
  } catch (const ValueError& e) {
    // The size parser names the units; a budget may also be a share of the device.
    throw ValueError(std::string(e.what()) + ", or a fraction of device memory such as 0.5");
  }
}

// Loaded only once it parsed: a bad KILN_MEMORY_BUDGET raises from every call that needs
// the budget (each evaluation), not just the first one.
void load_environment_locked() {
  if (g_loaded) return;
  if (std::optional<std::string> text = settings::text("KILN_MEMORY_BUDGET")) {
    try {
      g_budget = parse(*text, "KILN_MEMORY_BUDGET");
    } catch (const ValueError&) {
      settings::reject("KILN_MEMORY_BUDGET", *text);
    }
  }
  g_loaded = true;
}

size_t total_memory(Device device) {
  if (device.is_cuda()) return cuda::memory_info(device.index).second;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

}  // namespace

void set_budget(size_t bytes) {
  std::lock_guard lock(g_mutex);
  g_loaded = true;
  g_budget = {bytes, 0};
}

void set_budget(const std::string& spec) {
  Budget b = parse(spec, "memory budget");
  std::lock_guard lock(g_mutex);
  g_loaded = true;
  g_budget = b;
}

void clear_budget() { set_budget(size_t{0}); }

size_t budget(Device device) {
  Budget b;
  {
    std::lock_guard lock(g_mutex);
    load_environment_locked();
    b = g_budget;
  }
  if (b.fraction == 0) return b.bytes;
  return static_cast<size_t>(b.fraction * static_cast<double>(total_memory(device)));
}

void set_plan_margin(double fraction) {
  std::lock_guard lock(g_mutex);
  g_margin = fraction;
}

double plan_margin() {
  std::lock_guard lock(g_mutex);
  return g_margin;
}

namespace {

double checked_limit(double share, const std::string& what) {
  if (!(share >= 0))
    throw ValueError("[memory] " + what +
                     ": a reserve work limit must be a share >= 0 (or inf), got " +
                     std::to_string(share));
  return share;
}

double& reserve_limit_locked() {
  static double limit = settings::real("KILN_RESERVE_WORK_LIMIT", 0.0).value_or(0.05);
  return limit;
}

}  // namespace

void set_reserve_work_limit(double share) {
  checked_limit(share, "set_reserve_work_limit");
  std::lock_guard lock(g_mutex);
  reserve_limit_locked() = share;
}

double reserve_work_limit() {
  std::lock_guard lock(g_mutex);
  return reserve_limit_locked();
}

std::string budget_description() {
  std::lock_guard lock(g_mutex);
  load_environment_locked();
  if (g_budget.fraction > 0)
    return std::to_string(static_cast<int>(std::lround(g_budget.fraction * 100))) +
           "% of device memory";
  return g_budget.bytes == 0 ? "none" : format_bytes(g_budget.bytes);
}

}  // namespace kiln::memory
