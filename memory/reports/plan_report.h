#pragma once
// What the memory planner decided for the most recent evaluation, in figures a user can act
// on: the budget, the lower bound, planned and measured peaks, which values were kept and
// which were released and rebuilt, the bytes that saved and the extra work it cost.
#include <cstddef>
#include <string>
#include <vector>

namespace kiln::memory {

/// A value the planner released early and rebuilt (or released for good).
struct RecomputedValue {
  std::string name;   ///< Source ops of its kernel ("matmul+relu").
  std::string shape;  ///< "[256, 1024] float32".
  size_t bytes = 0;   ///< Pool block bytes.
  int evictions = 0;  ///< Times it was released early.
  int rebuilds = 0;   ///< Times its kernel ran again.
};

/// The planner's figures for one evaluation.
struct PlanSummary {
  std::string pool;           ///< The budgeted pool.
  size_t budget = 0;          ///< Bytes; 0: none.
  size_t start_bytes = 0;     ///< Allocated when the step began.
  size_t lower_bound = 0;     ///< No schedule fits in fewer bytes.
  size_t planned_peak = 0;    ///< The simulated peak (equal to the measured one without a budget).
  size_t measured_peak = 0;   ///< Highest allocated bytes seen during the step.
  bool within_budget = true;  ///< False when the run-time fallback could not hold the budget.
  /// Bytes of the results the step adds and keeps (gradients, the loss, held tensors), not
  /// counting updates written over the values they replace.
  size_t output_bytes = 0;
  size_t kernels = 0;          ///< Kernels of the step.
  size_t values = 0;           ///< Values the kernels produced.
  size_t kept_values = 0;      ///< Of those, the ones never released early.
  size_t kept_bytes = 0;       ///< Their bytes.
  size_t in_place = 0;         ///< Kernels that wrote into a dying input's buffer.
  size_t donated = 0;          ///< Of those, updates that took over a replaced value.
  size_t released_leaves = 0;  ///< Replaced values (old parameters, states) released in the step.
  size_t recomputes = 0;       ///< Kernels run again.
  size_t inlined = 0;          ///< Values rebuilt inside the kernel that reads them.
  size_t evictions = 0;        ///< Values released early.
  size_t evicted_bytes = 0;    ///< Σ bytes released early (what recomputation saved).
  size_t fallback_evictions = 0;  ///< Evictions the plan did not foresee (run-time fallback).
  double base_cost = 0;           ///< Estimated seconds of the step's kernels.
  double extra_cost = 0;          ///< Estimated seconds of the rebuilds.
  double planner_ms = 0;          ///< Planning time.
  bool plan_reused = false;       ///< The plan of an earlier, identical step was run again.
  std::string order = "given";    ///< The kernel order chosen (memory/planner/schedule_order.h).
  size_t arena_bytes = 0;      ///< Size of the step's arena (memory/planner/arena_plan.h); 0: none.
  size_t arena_live_peak = 0;  ///< Highest bytes of the arena's values alive at once.
  size_t arena_values = 0;     ///< Values written at their planned place in the arena.
  /// Runs before execution strayed from the plan (the run-time fallback evicted what the plan
  /// kept), after which nothing more was placed; 0 when it never strayed.
  size_t arena_strayed_at = 0;
  size_t arena_misses = 0;  ///< Planned places still taken at run time (allocated from the pool).
  /// The budget of allocated bytes the plan was made for: below the budget by what the arena's
  /// packing and the blocks outside it need (memory/planner/arena_fit.h); 0 without a budget.
  size_t planned_for = 0;
  /// The arena's segment, the most bytes outside it at once and `reserve_pinned`, as
  /// planned: the pool's reserve for the step. Within the budget unless `reserve_over_budget`.
  size_t planned_reserve = 0;
  /// Free bytes in the pool's segments that hold live blocks (parameters, state) when the
  /// step starts: part of the reserve that no plan of the step can release.
  size_t reserve_pinned = 0;
  /// The reserve is over the budget: no tighter plan fitted it, or the one that did cost more
  /// than memory::reserve_work_limit() of the step's work in rebuilds (memory/planner/arena_fit.h).
  bool reserve_over_budget = false;
  /// Estimated seconds of rebuilds that holding the reserve added (or, when it is over the
  /// budget, would have added; 0: no plan that holds it was found).
  double reserve_cost = 0;
  size_t kept_in_gaps = 0;  ///< Releases dropped: the value stayed in a gap of the arena.
  std::vector<RecomputedValue> recomputed;  ///< Largest first.
};

/// Stores the summary of the evaluation that just ran (the executor calls it).
void set_last_plan(PlanSummary summary);
/// The summary of the most recent evaluation run by the JIT.
PlanSummary last_plan();
/// last_plan() as readable text: figures, then the released-and-rebuilt values.
std::string plan_report();

}  // namespace kiln::memory
