#pragma once
// The memory stage's one entry point. jit/ describes an evaluation as a StepGraph (kernels
// reading and writing values, in the fused order) and says what this call must respect
// (a PlanRequest); plan_step returns everything the executor needs to run it (a StepPlan):
// the kernel order, the planner's actions, how execution chooses further victims, and the
// arena placement. Nothing else crosses between jit/ and the planner.
//
// plan_step owns what a repeating step learns (its profile: measured kernel times, the
// kernel order, the plan and placement made once the times settled), the cache those live
// in, and the whole ladder of retries (fit the pool's reserve, try other orders, choose the
// order again near the floor) in one function that reads top to bottom.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "arena_fit.h"
#include "arena_plan.h"
#include "recompute_planner.h"
#include "schedule_order.h"

namespace kiln::memory {

/// The constraints of one planning call: what the step must fit and how it will run.
struct PlanRequest {
  size_t budget = 0;      ///< Bytes the budgeted pool may hold; 0: no budget.
  double margin = 0;      ///< Plan for budget × (1 + margin) (set_plan_margin, for tests).
  size_t fixed_tail = 0;  ///< The last kernels (updates) keep their place in every order.
  /// The caller times each kernel's first run and reports it (record_kernel_times): the
  /// measured times replace the estimates once they settle, and only then is a plan stored.
  bool timed = false;
  /// Place the step's values in one arena (CPU pools): `arena_bytes[v]` is value v's size
  /// there, and `pool` says what an arena and the blocks beside it reserve.
  bool arena = false;
  std::vector<size_t> arena_bytes;
  PoolReserve pool;
  double reserve_limit = 0.05;  ///< Work holding the reserve may add (set_reserve_work_limit).
};

/// Opaque: what plan_step remembers about one step's tables (defined in plan_step.cpp).
struct StepProfileEntry;

/// The part of a plan that a step stores and runs again: the actions and how execution
/// follows them.
struct PlanDecision {
  std::shared_ptr<const RecomputePlan> actions;  ///< The planned actions; never null.
  PlannerTuning tuning;                          ///< How execution chooses further victims.
  /// The budget execution decides against: the request's, without the plan margin.
  size_t executes_at = 0;
  /// With an arena under a budget: the allocated bytes the plan was fitted for (0: not
  /// fitted), the releases kept in the arena's gaps, and the work holding the reserve adds.
  size_t fitted_for = 0, kept_in_gaps = 0;
  double reserve_cost = 0;
};

/// How to run one step: plan_step's answer.
struct StepPlan : PlanDecision {
  /// False when the budget cannot be held; the figures below say why (`actions->failure`).
  bool feasible = true;
  ScheduleOrder order = ScheduleOrder::Given;  ///< The kernel order chosen.
  std::vector<int> perm;  ///< Run position i runs kernel perm[i] of the given tables.
  /// The tables in run order, with the costs the planner used and the in-place inputs of
  /// this order: what execute_step runs.
  StepGraph graph;
  std::shared_ptr<const ArenaPlan> arena;  ///< Where values go; null without an arena.
  size_t planned_budget = 0;   ///< The budget planned for (request budget × (1 + margin)).
  bool reused = false;         ///< The plan of an earlier, identical step.
  size_t planned_reserve = 0;  ///< The pool's planned reserve, when fitted.
  double planner_ms = 0;       ///< Time plan_step took.
  /// When infeasible: the unplanned peak, the smallest budget any order fits, and the run
  /// position where the lower bound is reached (-1: at the start).
  size_t unplanned_peak = 0, smallest_budget = 0;
  int bound_kernel = -1;
  std::shared_ptr<StepProfileEntry> profile;  ///< Where record_kernel_times writes.

  /// The options execute_step runs with: the tuning, `executes_at`, and the plan's own
  /// evictions followed. They borrow this plan's actions: use them while it lives.
  PlannerOptions execution() const;
};

/// Plans one evaluation whose tables are `given` (kernels in fused order, estimated costs)
/// under `request`. Never throws for an infeasible budget: feasible is false instead.
StepPlan plan_step(const StepGraph& given, const PlanRequest& request);

/// Records the run times of `plan`'s first runs (`seconds[i]` for run position i, negative
/// when not measured) into the step's profile; later plans of the step use them.
void record_kernel_times(const StepPlan& plan, const std::vector<double>& seconds);

}  // namespace kiln::memory
