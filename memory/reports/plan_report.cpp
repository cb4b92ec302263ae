#include "plan_report.h"

#include <cstdio>
#include <mutex>

#include "../pools/caching_pool.h"
#include "rank_bytes.h"

namespace kiln::memory {
namespace {

std::mutex g_mutex;
PlanSummary g_last;

std::string percent(double part, double whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return buf;
}

// Each line of `text` indented by four spaces.
std::string indent_lines(const std::string& text) {
  std::string out;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    out += "    " + text.substr(start, end - start) + "\n";
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

}  // namespace

void set_last_plan(PlanSummary summary) {
  std::lock_guard lock(g_mutex);
  g_last = std::move(summary);
}

PlanSummary last_plan() {
  std::lock_guard lock(g_mutex);
  return g_last;
}

std::string plan_report() {
  PlanSummary s = last_plan();
  std::string r =
      "memory plan of the last step (" + (s.pool.empty() ? "no step yet" : s.pool) + ")\n";
  auto line = [&](const char* label, const std::string& value) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "  %-22s ", label);
    r += buf + value + "\n";
  };
  line("budget", s.budget == 0 ? "none" : format_bytes(s.budget));
  line("at step start", format_bytes(s.start_bytes));
  line("lower bound", format_bytes(s.lower_bound));
  line("planned peak", format_bytes(s.planned_peak));
  line("measured peak", format_bytes(s.measured_peak) +
                            (s.within_budget ? "" : "  (over the budget: nothing left to evict)"));
  line("kept to the end", format_bytes(s.output_bytes) + " (results and held tensors)");
  line("kernel order", s.order);
  if (s.arena_bytes > 0)
    line("arena",
         format_bytes(s.arena_bytes) + " for " + format_bytes(s.arena_live_peak) +
             " alive at once, " + std::to_string(s.arena_values) + " values placed" +
             (s.arena_misses ? ", " + std::to_string(s.arena_misses) + " missed" : "") +
             (s.arena_strayed_at ? ", none after run " + std::to_string(s.arena_strayed_at) +
                                       " (the run left the plan)"
                                 : ""));
  if (s.budget > 0 && s.planned_reserve > 0)
    line("reserve",
         format_bytes(s.planned_reserve) + " planned (arena, blocks beside it and " +
             format_bytes(s.reserve_pinned) + " free in their segments)" +
             (!s.reserve_over_budget
                  ? ", planned for " + format_bytes(s.planned_for) + " allocated, " +
                        std::to_string(s.kept_in_gaps) + " releases kept in gaps, " +
                        percent(s.reserve_cost, s.base_cost) + " more work"
              : s.reserve_cost > 0 ? ", over the budget: holding it would take " +
                                         percent(s.reserve_cost, s.base_cost) + " more work"
                                   : ", over the budget: no tighter plan fits"));
  line("kernels", std::to_string(s.kernels) + " (" + std::to_string(s.in_place) + " in place, " +
                      std::to_string(s.donated) + " updates donated)");
  line("replaced values freed", std::to_string(s.released_leaves));
  line("never released early", std::to_string(s.kept_values) + " of " + std::to_string(s.values) +
                                   ", " + format_bytes(s.kept_bytes));
  line("released and rebuilt",
       std::to_string(s.evictions) + " releases, " + std::to_string(s.recomputes) + " rebuilds" +
           (s.inlined > 0 ? " (and " + std::to_string(s.inlined) + " inside their readers)" : "") +
           ", " + format_bytes(s.evicted_bytes) + " released");
  if (s.fallback_evictions > 0)
    line("run-time fallback", std::to_string(s.fallback_evictions) + " unplanned releases");
  line("extra work", percent(s.extra_cost, s.base_cost) + " of the step's estimated cost");
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.2f ms", s.planner_ms);
  line("planner time", std::string(ms) + (s.plan_reused ? " (the plan of an earlier step)" : ""));
  if (!s.recomputed.empty()) {
    r += "  released early (largest first):\n";
    size_t shown = 0;
    for (const RecomputedValue& v : s.recomputed) {
      if (++shown > 20) {
        r += "    ... and " + std::to_string(s.recomputed.size() - 20) + " more\n";
        break;
      }
      char buf[160];
      std::snprintf(buf, sizeof buf, "    %-28s %-26s %10s  released %dx, rebuilt %dx\n",
                    v.name.c_str(), v.shape.c_str(), format_bytes(v.bytes).c_str(), v.evictions,
                    v.rebuilds);
      r += buf;
    }
  }
  // The budget holds per process, so per rank: beside it, what this rank holds of the
  // training state (ZeRO shards it).
  const std::string ranks = rank_bytes_report();
  if (!ranks.empty()) r += "  training state held by this rank:\n" + indent_lines(ranks);
  return r;
}

}  // namespace kiln::memory
