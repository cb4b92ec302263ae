#pragma once
// The memory budget of evaluations: how many bytes the pool of the device a step runs on
// may have allocated at once. kiln plans every step to stay under it by releasing values
// early and rebuilding them (memory/planner/recompute_planner.h). None by default.
#include <cstddef>
#include <string>

#include "../../core/device.h"
#include "budget_spec.h"

namespace kiln::memory {

/// Sets the budget in bytes for every device (0 removes it).
void set_budget(size_t bytes);
/// Sets the budget from text, read by parse_budget (memory/pools/budget_spec.h): plain bytes,
/// a size with a unit ("512MiB", "2GB", "1.5GiB"), a percentage of each device's total
/// memory ("50%"; physical RAM for the cpu), or "none". Throws BudgetError (a ValueError)
/// naming set_budget for anything else; "0.5" is refused, not read as a share. The
/// KILN_MEMORY_BUDGET variable and the examples' --memory-budget take the same text.
void set_budget(const std::string& spec);
/// Sets a budget parse_budget read (a share of releasable bytes throws BudgetError).
void set_budget(const BudgetSpec& spec);
/// Removes the budget (the same as set_budget(0)).
void clear_budget();
/// Bytes of memory `device` has: physical RAM for the cpu (0 when the OS does not say),
/// the driver's total for a CUDA device (DeviceError without one).
size_t total_memory(Device device);
/// The budget in bytes for `device`, or 0 when there is none.
size_t budget(Device device = Device::cpu());
/// Makes the static plan for budget × (1 + `fraction`) while execution still holds the
/// budget itself, so the run-time fallback has to make up the difference (tests use it to
/// exercise the fallback; 0 by default).
void set_plan_margin(double fraction);
/// The margin set by set_plan_margin().
double plan_margin();
/// How much more recomputation, as a share of a step's work, holding the pool's reserve (the
/// step's arena and the blocks beside it) within the budget may cost; beyond that only the
/// allocated bytes keep the budget (memory/planner/arena_fit.h). 0.05 by default; infinity holds it
/// wherever a plan can, 0 only where it costs nothing. KILN_RESERVE_WORK_LIMIT sets it at
/// start-up ("inf" or a number); a negative or NaN share throws ValueError.
void set_reserve_work_limit(double share);
/// The limit set by set_reserve_work_limit() or KILN_RESERVE_WORK_LIMIT.
double reserve_work_limit();
/// The budget as set, for reports: "none", "2.0 GiB", "50% of device memory".
std::string budget_description();

}  // namespace kiln::memory
