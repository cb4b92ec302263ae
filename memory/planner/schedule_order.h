#pragma once
// The order kernels run in decides what is alive together, so before planning memory the
// step's kernels may be put in another topological order. The fused schedule comes from a
// depth-first walk from the results, which puts each result's whole ancestry right before
// it: a training step's weight-gradient products all land after the backward pass, keeping
// every saved activation alive until then. Other orders run those consumers as soon as they
// can. No one order is best for every model, so the planner simulates a few and keeps the
// one that fits the budget with the least recomputation (XLA's scheduler picks among
// list, depth-first and post-order schedules the same way).
#include <cstddef>
#include <string>
#include <vector>

#include "recompute_planner.h"

namespace kiln::memory {

/// A way to order a step's kernels.
enum class ScheduleOrder {
  Given,    ///< as fused (depth-first from the results)
  Eager,    ///< as given, but a ready kernel that frees at least what it allocates runs at once
  Frees,    ///< list scheduling: the ready kernel that frees the most bytes net runs next
  Breadth,  ///< each kernel as soon as its inputs exist (first ready, first run)
};

/// "given", "eager", "frees" or "breadth".
const char* order_name(ScheduleOrder order);

/// Every order, Given first.
const std::vector<ScheduleOrder>& all_orders();

/// The kernels of `graph` in `order`: position i runs old kernel result[i]. The last
/// `fixed_tail` kernels (updates, which nothing in the step reads) keep their place at
/// the end. Always a topological order of the graph.
std::vector<int> schedule_order(const StepGraph& graph, ScheduleOrder order, size_t fixed_tail);

/// The permutation that undoes `perm`: result[perm[i]] == i.
std::vector<int> inverse_permutation(const std::vector<int>& perm);

/// `graph` with its kernels permuted by `perm` (from schedule_order); value ids unchanged.
StepGraph reorder(const StepGraph& graph, const std::vector<int>& perm);

/// reorder(graph, perm) with each kernel's in_place_input chosen again among its
/// in_place_candidates for the new last reads (assign_in_place): the tables of a step that
/// runs in that order.
StepGraph reorder_to_run(const StepGraph& graph, const std::vector<int>& perm);

/// The outcome of choose_schedule_order.
struct OrderChoice {
  ScheduleOrder order = ScheduleOrder::Given;
  std::vector<int> perm;  ///< schedule_order(graph, order, fixed_tail)
  RecomputePlan plan;     ///< simulate_step on the reordered graph
};

/// Plans the step in every order and keeps the best: without a budget the lowest peak;
/// under one a feasible plan with the least recomputation (then the lowest peak). Ties go
/// to the earlier order in all_orders(), so Given wins unless another does better.
/// `try_first` (the order chosen last time) is planned first, to bound the others early.
OrderChoice choose_schedule_order(const StepGraph& graph, const PlannerOptions& options,
                                  size_t fixed_tail,
                                  ScheduleOrder try_first = ScheduleOrder::Given);

/// A cheap stand-in for choose_schedule_order, for a step planned with estimated costs that
/// will choose again once its costs settle: every order is planned with at most
/// `work_per_kernel` × kernels of work (PlannerOptions::max_work). Of the orders whose plan
/// finished, the one choose_schedule_order would keep; when none finished, the one that got
/// furthest into the step before its limit (then the least recomputation so far). Near the
/// floor the orders that thrash each cost seconds to plan in full (the benchmark LSTM's
/// first step spent 1.8-5.7 s choosing the order that a few milliseconds of each show).
/// Each order is planned as a step runs it (reorder_to_run; the given order as given), so
/// `plan`, when feasible, is the plan of the winner's tables; infeasible when it did not
/// finish.
OrderChoice race_schedule_orders(const StepGraph& graph, const PlannerOptions& options,
                                 size_t fixed_tail, size_t work_per_kernel);

}  // namespace kiln::memory
