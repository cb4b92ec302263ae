#include "budget.h"

#include <unistd.h>

#include <mutex>
#include <optional>

#include "../../core/cuda_driver.h"
#include "../../core/error.h"
#include "../../core/settings.h"
#include "caching_pool.h"
#include "device_pools.h"

namespace kiln::memory {
namespace {

std::mutex g_mutex;
BudgetSpec g_budget;
bool g_loaded = false;
double g_margin = 0;

// Loaded only once it parsed: a bad KILN_MEMORY_BUDGET raises from every call that needs
// the budget (each evaluation), not just the first one.
void load_environment_locked() {
  if (g_loaded) return;
  if (std::optional<std::string> text = settings::text("KILN_MEMORY_BUDGET")) {
    try {
      g_budget = parse_budget(*text, "KILN_MEMORY_BUDGET", BudgetContext::Pool);
    } catch (const BudgetError& e) {
      throw BudgetError(std::string(e.what()) + "; unset KILN_MEMORY_BUDGET for no budget");
    }
  }
  g_loaded = true;
}

}  // namespace

size_t total_memory(Device device) {
  if (device.is_cuda()) return cuda::memory_info(device.index).second;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

void set_budget(size_t bytes) {
  std::lock_guard lock(g_mutex);
  g_loaded = true;
  g_budget = bytes == 0 ? BudgetSpec{} : BudgetSpec{BudgetSpec::Kind::Bytes, bytes, 0};
}

void set_budget(const std::string& spec) {
  set_budget(parse_budget(spec, "set_budget", BudgetContext::Pool));
}

void set_budget(const BudgetSpec& spec) {
  if (spec.kind == BudgetSpec::Kind::ShareOfReleasable)
    throw BudgetError("[set_budget] " + spec.description() +
                      " is not a budget of evaluations: a share of a step's releasable bytes is "
                      "for kiln plan only");
  std::lock_guard lock(g_mutex);
  g_loaded = true;
  g_budget = spec;
}

void clear_budget() { set_budget(size_t{0}); }

size_t budget(Device device) {
  BudgetSpec b;
  {
    std::lock_guard lock(g_mutex);
    load_environment_locked();
    b = g_budget;
  }
  return b.kind == BudgetSpec::Kind::ShareOfMemory ? b.bytes_of(total_memory(device))
                                                   : b.bytes_of(0);
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
  return g_budget.description();
}

}  // namespace kiln::memory
