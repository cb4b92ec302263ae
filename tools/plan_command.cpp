// `kiln plan FILE [BUDGET...]`: replays the memory planner on a step's tables written by
// KILN_PLAN_DUMP, in every kernel order, at the budgets given, then runs the memory stage
// (plan_step) on it as a CPU step whose costs have settled: the order, plan, arena and
// reserve kiln would run. It answers "what budget could this
// step fit, and at what cost" without the model that produced it.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "memory/planner/plan_step.h"
#include "memory/planner/schedule_order.h"
#include "memory/planner/work_floor.h"
#include "memory/pools/budget.h"
#include "memory/pools/budget_spec.h"
#include "memory/pools/caching_pool.h"
#include "memory/pools/device_pools.h"
#include "memory/reports/step_graph_file.h"
#include "tools/cli.h"

namespace kiln::cli {
namespace {

using Json = nlohmann::json;
namespace mem = kiln::memory;

// Every BUDGET parsed before any planning; a malformed one is a command line that does not
// parse (exit 2 with the usage), as in the examples' --memory-budget.
std::vector<mem::BudgetSpec> parse_budgets(const std::vector<std::string>& texts) {
  std::vector<mem::BudgetSpec> specs;
  for (const std::string& text : texts) {
    try {
      specs.push_back(mem::parse_budget(text, "kiln plan BUDGET", mem::BudgetContext::PlanFile));
    } catch (const mem::BudgetError& e) {
      throw UsageError{e.what()};
    }
  }
  return specs;
}

}  // namespace

int run_plan_command(const Invocation& inv) {
  std::vector<std::string> budgets(inv.words.begin() + 2, inv.words.end());
  if (budgets.empty()) budgets = {"50%releasable", "33%releasable", "20%releasable"};
  const std::vector<mem::BudgetSpec> specs = parse_budgets(budgets);
  const mem::StepGraphFile file = mem::load_step_graph(inv.words[1]);
  const mem::StepGraph& g = file.graph;
  size_t kept = 0;
  for (const mem::PlanValue& v : g.values)
    if (v.output && v.producer >= 0) {
      const mem::PlanKernel& k = g.kernels[static_cast<size_t>(v.producer)];
      // An update written over the value it replaced adds nothing.
      if (k.in_place_input < 0 || !g.values[static_cast<size_t>(k.in_place_input)].releasable_leaf)
        kept += v.bytes;
    }
  struct Ordered {
    mem::ScheduleOrder order;
    mem::StepGraph graph;
    size_t peak, smallest;
  };
  std::vector<Ordered> orders;
  size_t unplanned = 0;
  for (mem::ScheduleOrder order : mem::all_orders()) {
    mem::StepGraph h = mem::reorder_to_run(g, mem::schedule_order(g, order, file.fixed_tail));
    const size_t peak = mem::simulate_step(h, mem::PlannerOptions{}).peak;
    // Without a budget kiln runs the order of the lowest peak: shares are of that step.
    unplanned = orders.empty() ? peak : std::min(unplanned, peak);
    const size_t smallest = mem::smallest_feasible_budget(h, mem::PlannerOptions{});
    orders.push_back({order, std::move(h), peak, smallest});
  }
  const size_t floor = g.start_bytes + kept;
  const size_t releasable = unplanned > floor ? unplanned - floor : 0;

  Json doc;
  doc["file"] = inv.words[1];
  doc["kernels"] = g.kernels.size();
  doc["values"] = g.values.size();
  doc["start_bytes"] = g.start_bytes;
  doc["kept_bytes"] = kept;
  doc["lower_bound"] = mem::lower_bound(g);
  doc["budget_when_written"] = file.budget;
  std::string text;
  char line[256];
  std::snprintf(line, sizeof line,
                "%s: %zu kernels, starts with %s, keeps %s, lower bound %s, budget when "
                "written %s\n",
                inv.words[1].c_str(), g.kernels.size(), mem::format_bytes(g.start_bytes).c_str(),
                mem::format_bytes(kept).c_str(), mem::format_bytes(mem::lower_bound(g)).c_str(),
                file.budget ? mem::format_bytes(file.budget).c_str() : "none");
  text += line;
  text += "order      unplanned peak   smallest budget\n";
  for (const Ordered& o : orders) {
    std::snprintf(line, sizeof line, "%-10s %14s %17s\n", mem::order_name(o.order),
                  mem::format_bytes(o.peak).c_str(), mem::format_bytes(o.smallest).c_str());
    text += line;
    doc["orders"].push_back({{"order", mem::order_name(o.order)},
                             {"unplanned_peak", o.peak},
                             {"smallest_budget", o.smallest}});
  }
  for (size_t b = 0; b < budgets.size(); ++b) {
    const std::string& spec = budgets[b];
    // A share is of the bytes the step releases, on top of what it starts with and keeps.
    const size_t budget = specs[b].kind == mem::BudgetSpec::Kind::ShareOfReleasable
                              ? floor + specs[b].bytes_of(releasable)
                              : specs[b].bytes_of(0);
    mem::PlannerOptions options;
    options.budget = budget;
    std::snprintf(line, sizeof line, "budget %s (%s):\n", spec.c_str(),
                  mem::format_bytes(budget).c_str());
    text += line;
    Json row{{"budget", spec}, {"budget_bytes", budget}};
    for (const Ordered& o : orders) {
      const mem::RecomputePlan p = mem::simulate_step(o.graph, options);
      const double extra = p.base_cost > 0 ? 100.0 * p.extra_cost / p.base_cost : 0;
      if (p.feasible)
        std::snprintf(line, sizeof line, "  %-10s peak %s, +%.1f%% work, %zu rebuilds\n",
                      mem::order_name(o.order), mem::format_bytes(p.peak).c_str(), extra,
                      p.recomputes);
      else
        std::snprintf(line, sizeof line, "  %-10s does not fit: %s\n", mem::order_name(o.order),
                      p.failure.c_str());
      text += line;
      row["orders"].push_back({{"order", mem::order_name(o.order)},
                               {"feasible", p.feasible},
                               {"peak", p.peak},
                               {"extra_work_pct", extra},
                               {"rebuilds", p.recomputes},
                               {"failure", p.failure}});
    }
    // What no plan can go below, in any order: how far the greedy could still improve.
    const mem::WorkFloor floor_at = mem::extra_work_floor(g, budget);
    const double floor_pct =
        floor_at.base_cost > 0 ? 100.0 * floor_at.extra_cost / floor_at.base_cost : 0;
    std::string at;  // " while kernel K (its ops) runs", or nothing
    if (floor_at.at_kernel >= 0) {
      const auto k = static_cast<size_t>(floor_at.at_kernel);
      at = " while kernel " + std::to_string(k) +
           (k < file.kernel_names.size() ? " " + file.kernel_names[k] : "") + " runs";
    }
    if (floor_at.feasible)
      std::snprintf(line, sizeof line, "  any plan needs at least +%.1f%% work%s\n", floor_pct,
                    at.empty() ? "" : (" (" + at.substr(1) + ")").c_str());
    else
      std::snprintf(line, sizeof line, "  no plan fits: what must be resident%s exceeds it\n",
                    at.c_str());
    text += line;
    row["work_floor_feasible"] = floor_at.feasible;
    row["work_floor_pct"] = floor_pct;
    row["work_floor_kernel"] = floor_at.at_kernel;
    // What the stage itself makes of the step (memory/planner/plan_step.h), as for a CPU step whose
    // costs have settled: the kernel order, the plan fitted so that the arena and the blocks
    // beside it keep the budget, and its placement. The file records the tables' block
    // sizes, not the pool: the arena gets those sizes, and no free space is pinned beside it.
    mem::PlanRequest request;
    request.budget = budget;
    request.fixed_tail = file.fixed_tail;
    request.arena = true;
    request.arena_bytes.resize(g.values.size());
    for (size_t v = 0; v < g.values.size(); ++v) request.arena_bytes[v] = g.values[v].bytes;
    request.pool = mem::PoolReserve{&mem::CachingPool::arena_segment, 0};
    request.reserve_limit = mem::reserve_work_limit();
    const mem::StepPlan stage = mem::plan_step(g, request);
    std::snprintf(line, sizeof line, "  kiln would run: %s%s\n", mem::order_name(stage.order),
                  stage.feasible ? "" : " (and refuse the budget)");
    text += line;
    row["chosen"] = mem::order_name(stage.order);
    row["chosen_feasible"] = stage.feasible;
    if (stage.feasible) {
      const mem::RecomputePlan& p = *stage.actions;
      const double stage_extra = p.base_cost > 0 ? 100.0 * p.extra_cost / p.base_cost : 0;
      const size_t reserved = request.pool.reserved(*stage.arena);
      const bool holds = reserved <= budget;
      std::string held = holds ? "held" : "over the budget";
      if (stage.fitted_for > 0 && holds)
        held += ", planned for " + mem::format_bytes(stage.fitted_for);
      std::snprintf(line, sizeof line,
                    "  arena %s for %s alive at once; reserve %s, %s; peak %s, +%.1f%% work, "
                    "%zu rebuilds\n",
                    mem::format_bytes(stage.arena->bytes).c_str(),
                    mem::format_bytes(stage.arena->live_peak).c_str(),
                    mem::format_bytes(reserved).c_str(), held.c_str(),
                    mem::format_bytes(p.peak).c_str(), stage_extra, p.recomputes);
      text += line;
      row["arena_bytes"] = stage.arena->bytes;
      row["arena_live_peak"] = stage.arena->live_peak;
      row["reserve_bytes"] = reserved;
      row["reserve_held"] = holds;
      row["planned_for"] = stage.fitted_for;
      row["kept_in_gaps"] = stage.kept_in_gaps;
      row["planned_peak"] = p.peak;
      row["planned_rebuilds"] = p.recomputes;
      row["fitted_extra_work_pct"] = stage_extra;
    }
    doc["budgets"].push_back(row);
  }
  if (inv.json)
    std::cout << doc.dump(2) << "\n";
  else
    std::cout << text;
  return 0;
}

}  // namespace kiln::cli
