// Planning time of the memory stage.
//
// Without arguments: the recomputation planner on generated steps of 5,000 kernels (the
// harness's unrolled LSTM and MLP chain, tests/planner_harness.h) at 0.3 of the bytes
// above their start: simulate_step once, and the choice among kernel orders. This used to
// be a wall-clock assertion in the planner tests (under a second each); a time belongs in
// a benchmark, where a loaded machine shows as a slow row rather than a failed test.
//
// `bench_planner FIRST [TIMED...] SETTLED`: one step's settling replayed through
// memory::plan_step from the tables KILN_PLAN_DUMP wrote for its budgeted evaluations (the
// first, the timed ones after it, and the one whose costs settled): each file's costs are
// recorded as the kernel times the step before it measured, as a CPU step with an arena
// records them, so every plan is the one kiln made in the run that wrote the files. One row
// per step: its planning time and the plan it made.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "memory/planner/plan_step.h"
#include "memory/planner/recompute_planner.h"
#include "memory/planner/schedule_order.h"
#include "memory/pools/budget.h"
#include "memory/pools/caching_pool.h"
#include "memory/reports/step_graph_file.h"
#include "tests/planner_harness.h"

using namespace planner_test;
namespace mem = kiln::memory;

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

int generated_steps() {
  std::printf("planner time on generated 5,000-kernel steps (tests/planner_harness.h)\n");
  std::printf("%-6s %7s %9s %12s %14s %10s %10s %6s\n", "step", "kernels", "fraction",
              "simulate ms", "all orders ms", "extra", "rebuilds", "fits");
  time_plan("LSTM", lstm_step(714, 11), 0.3);
  time_plan("MLP", mlp_step(1666, 12), 0.3);
  return 0;
}

// FNV-1a over a plan's actions: two plans print the same hash when they do the same.
uint64_t actions_hash(const std::vector<PlanAction>& actions) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const PlanAction& a : actions)
    for (uint64_t x : {uint64_t(a.kind), uint64_t(uint32_t(a.id)), uint64_t(a.in_place)})
      h = (h ^ x) * 0x100000001b3ULL;
  return h;
}

// CPU time of this thread: on a machine shared with other work, what planning cost apart
// from the time it waited for a core.
double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

// Replays the settling of the step whose budgeted evaluations wrote `files`, in order.
int settling(const std::vector<std::string>& files) {
  std::vector<mem::StepGraphFile> steps;
  for (const std::string& f : files) steps.push_back(mem::load_step_graph(f));
  const mem::StepGraphFile& first = steps.front();
  const mem::StepGraph& g = first.graph;
  mem::PlanRequest request;
  request.budget = first.budget;
  request.fixed_tail = first.fixed_tail;
  // One file: a step whose costs have settled, as `kiln plan` replays it.
  request.timed = steps.size() > 1;
  request.arena = true;
  request.arena_bytes.resize(g.values.size());
  for (size_t v = 0; v < g.values.size(); ++v) request.arena_bytes[v] = g.values[v].bytes;
  request.pool = mem::PoolReserve{&mem::CachingPool::arena_segment, 0};
  request.reserve_limit = mem::reserve_work_limit();
  std::printf("%s: %zu kernels, budget %s\n", files.front().c_str(), g.kernels.size(),
              mem::format_bytes(first.budget).c_str());
  std::printf("%-5s %10s %7s %-8s %9s %9s %8s %10s %10s %5s %16s\n", "step", "planner ms", "cpu ms",
              "order", "extra", "rebuilds", "reused", "peak", "reserve", "held", "actions");
  for (size_t s = 0; s < steps.size(); ++s) {
    const double cpu_start = thread_cpu_ms();
    const mem::StepPlan plan = mem::plan_step(g, request);
    const double cpu_ms = thread_cpu_ms() - cpu_start;
    const mem::RecomputePlan& p = *plan.actions;
    const size_t reserve = request.pool.reserved(*plan.arena);
    std::printf("%-5zu %10.1f %7.1f %-8s %8.2f%% %9zu %8s %10s %10s %5s %016llx\n", s + 1,
                plan.planner_ms, cpu_ms, mem::order_name(plan.order),
                p.base_cost > 0 ? 100.0 * p.extra_cost / p.base_cost : 0.0, p.recomputes,
                plan.reused ? "yes" : "no", mem::format_bytes(p.peak).c_str(),
                mem::format_bytes(reserve).c_str(), reserve <= request.budget ? "yes" : "no",
                static_cast<unsigned long long>(actions_hash(p.actions)));
    // The kernel times this step measured: what the next file's tables were planned with.
    if (s + 1 < steps.size()) {
      const mem::StepGraph& next = steps[s + 1].graph;
      std::vector<double> seconds(plan.perm.size());
      for (size_t i = 0; i < plan.perm.size(); ++i)
        seconds[i] = next.kernels[static_cast<size_t>(plan.perm[i])].cost;
      mem::record_kernel_times(plan, seconds);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return generated_steps();
  return settling(std::vector<std::string>(argv + 1, argv + argc));
}
