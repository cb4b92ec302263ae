// Planning time of the recomputation planner on generated steps of 5,000 kernels (the
// harness's unrolled LSTM and MLP chain, tests/planner_harness.h) at 0.3 of the bytes
// above their start: simulate_step once, and the choice among kernel orders. This used to
// be a wall-clock assertion in the planner tests (under a second each); a time belongs in
// a benchmark, where a loaded machine shows as a slow row rather than a failed test.
#include <chrono>
#include <cstdio>

#include "memory/planner/recompute_planner.h"
#include "memory/planner/schedule_order.h"
#include "tests/planner_harness.h"

using namespace planner_test;

namespace {

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Times planning `g` at `fraction` of its bytes above the start; prints one row.
void time_plan(const char* name, const StepGraph& g, double fraction) {
  const size_t top = unbudgeted_peak(g);
  PlannerOptions o;
  o.budget = std::max(
      lower_bound(g),
      g.start_bytes + static_cast<size_t>(fraction * static_cast<double>(top - g.start_bytes)));
  auto start = std::chrono::steady_clock::now();
  const RecomputePlan p = simulate_step(g, o);
  const double plan_ms = ms_since(start);
  start = std::chrono::steady_clock::now();
  const kiln::memory::OrderChoice choice = choose_schedule_order(g, o, 0);
  const double orders_ms = ms_since(start);
  const bool sound = replay(g, p, o.budget).error.empty();
  std::printf("%-6s %7zu %9.2f %12.1f %14.1f %9.1f%% %10zu %6s %s\n", name, g.kernels.size(),
              fraction, plan_ms, orders_ms, 100.0 * p.extra_cost / p.base_cost, p.recomputes,
              p.feasible ? "yes" : "no", sound ? "replays" : "REPLAY FAILED");
  (void)choice;
}

}  // namespace

int main() {
  std::printf("planner time on generated 5,000-kernel steps (tests/planner_harness.h)\n");
  std::printf("%-6s %7s %9s %12s %14s %10s %10s %6s\n", "step", "kernels", "fraction",
              "simulate ms", "all orders ms", "extra", "rebuilds", "fits");
  time_plan("LSTM", lstm_step(714, 11), 0.3);
  time_plan("MLP", mlp_step(1666, 12), 0.3);
  return 0;
}
