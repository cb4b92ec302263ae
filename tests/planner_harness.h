#pragma once
// The harness every planner test shares (tests/test_planner_*.cpp): steps built by hand,
// facts about a step computed independently of the planner, an independent replay of every
// plan (residency, release rules, in-place writes, bytes and peak, symbolic values), seeded
// random forward/backward steps, and two generated steps of thousands of kernels (an LSTM
// and an MLP, which bench/bench_planner.cpp times). It uses no test framework, so a bench
// can include it too.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "memory/planner/arena_fit.h"
#include "memory/planner/arena_plan.h"
#include "memory/planner/recompute_planner.h"
#include "memory/planner/schedule_order.h"
#include "memory/planner/work_floor.h"
#include "memory/reports/step_graph_file.h"

namespace planner_test {

using kiln::memory::all_orders;
using kiln::memory::ArenaFit;
using kiln::memory::ArenaPlan;
using kiln::memory::choose_schedule_order;
using kiln::memory::ChosenEviction;
using kiln::memory::evictions_past_gaps;
using kiln::memory::execute_step;
using kiln::memory::extra_work_floor;
using kiln::memory::fit_to_budget;
using kiln::memory::InlineInput;
using kiln::memory::load_step_graph;
using kiln::memory::lower_bound;
using kiln::memory::order_name;
using kiln::memory::plan_arena;
using kiln::memory::PlanAction;
using kiln::memory::PlanKernel;
using kiln::memory::PlannerOptions;
using kiln::memory::PlannerTuning;
using kiln::memory::PlanValue;
using kiln::memory::RecomputePlan;
using kiln::memory::reorder;
using kiln::memory::save_step_graph;
using kiln::memory::schedule_order;
using kiln::memory::ScheduleOrder;
using kiln::memory::search_evictions;
using kiln::memory::simulate_best;
using kiln::memory::simulate_step;
using kiln::memory::smallest_feasible_budget;
using kiln::memory::StepGraph;
using kiln::memory::StepGraphFile;
using kiln::memory::StepMachine;
using kiln::memory::WorkFloor;
using Kind = kiln::memory::PlanAction::Kind;

constexpr int kNone = -1;

// ---------------------------------------------------------------------------------------
// Building steps by hand.

struct Builder {
  StepGraph g;

  int leaf(size_t bytes, bool releasable = false, bool output = false) {
    PlanValue v;
    v.bytes = bytes;
    v.producer = -1;
    v.output = output;
    v.releasable_leaf = releasable;
    g.values.push_back(v);
    g.start_bytes += bytes;
    return static_cast<int>(g.values.size()) - 1;
  }
  // Appends a kernel reading `inputs` and writing a fresh value of `bytes`; returns the value.
  int op(std::vector<int> inputs, size_t bytes, double cost = 1.0, bool output = false) {
    PlanValue v;
    v.bytes = bytes;
    v.producer = static_cast<int>(g.kernels.size());
    v.output = output;
    g.values.push_back(v);
    PlanKernel k;
    k.inputs = std::move(inputs);
    k.output = static_cast<int>(g.values.size()) - 1;
    k.cost = cost;
    g.kernels.push_back(k);
    return k.output;
  }
  PlanKernel& last() { return g.kernels.back(); }
  PlanKernel& producer_of(int v) {
    return g.kernels[static_cast<size_t>(g.values[static_cast<size_t>(v)].producer)];
  }
};

// ---------------------------------------------------------------------------------------
// Facts about a step computed here, independently of the planner.

// Last kernel reading each value, or -1.
inline std::vector<int> last_readers(const StepGraph& g) {
  std::vector<int> last(g.values.size(), kNone);
  for (size_t k = 0; k < g.kernels.size(); ++k)
    for (int v : g.kernels[k].inputs) last[static_cast<size_t>(v)] = static_cast<int>(k);
  return last;
}

inline bool reads_at_or_after(const StepGraph& g, int v, int from) {
  for (size_t k = static_cast<size_t>(std::max(from, 0)); k < g.kernels.size(); ++k)
    for (int in : g.kernels[k].inputs)
      if (in == v) return true;
  return false;
}

inline bool contains(const std::vector<int>& xs, int x) {
  return std::find(xs.begin(), xs.end(), x) != xs.end();
}

// Whether kernel k may write over its in_place_input: it reads it for the last time, the
// value is not an output, has the output's size, and is not a leaf the step must keep.
inline bool may_run_in_place(const StepGraph& g, const std::vector<int>& last, int k) {
  const PlanKernel& kernel = g.kernels[static_cast<size_t>(k)];
  const int d = kernel.in_place_input;
  if (d < 0 || !contains(kernel.inputs, d)) return false;
  const PlanValue& dv = g.values[static_cast<size_t>(d)];
  return last[static_cast<size_t>(d)] == k && !dv.output &&
         dv.bytes == g.values[static_cast<size_t>(kernel.output)].bytes &&
         (dv.producer >= 0 || dv.releasable_leaf);
}

inline uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The symbolic value a kernel computes from its inputs' symbolic values.
inline uint64_t kernel_hash(int k, const std::vector<uint64_t>& inputs) {
  uint64_t h = mix(0x6b696c6e00000000ULL + static_cast<uint64_t>(k));
  for (uint64_t in : inputs) h = mix(h ^ in);
  return h;
}

// The symbolic value of every value in the original schedule.
inline std::vector<uint64_t> reference_hashes(const StepGraph& g) {
  std::vector<uint64_t> h(g.values.size(), 0);
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].producer < 0) h[v] = mix(0x1eafULL * (v + 1));
  for (size_t k = 0; k < g.kernels.size(); ++k) {
    std::vector<uint64_t> ins;
    for (int in : g.kernels[k].inputs) ins.push_back(h[static_cast<size_t>(in)]);
    h[static_cast<size_t>(g.kernels[k].output)] = kernel_hash(static_cast<int>(k), ins);
  }
  return h;
}

inline std::string render(const PlanAction& a) {
  switch (a.kind) {
    case Kind::Run:
      return (a.in_place ? "R*" : "R") + std::to_string(a.id);
    case Kind::Recompute:
      return "RC" + std::to_string(a.id);
    case Kind::Free:
      return "F" + std::to_string(a.id);
    case Kind::Evict:
      return "E" + std::to_string(a.id);
    case Kind::Inline:
      return "I" + std::to_string(a.id);
  }
  return "?";
}

inline std::string render(const std::vector<PlanAction>& actions) {
  std::string s;
  for (const PlanAction& a : actions) s += (s.empty() ? "" : " ") + render(a);
  return s;
}

// ---------------------------------------------------------------------------------------
// The independent replay.

struct ReplayResult {
  std::string error;  ///< The first violation, or empty.
  size_t peak = 0;
  size_t recomputes = 0, evictions = 0, evicted_bytes = 0, inlined = 0;
  double extra_cost = 0;
};

// Walks `plan.actions` over `g` and checks every rule a plan must keep. `budget` is the
// plan's budget (0: none). With `simulated_bytes` false (a plan from execute_step, whose
// peak the machine measured) the bytes are replayed but not compared with the plan.
inline ReplayResult replay(const StepGraph& g, const RecomputePlan& plan, size_t budget,
                           bool simulated_bytes = true) {
  ReplayResult r;
  const size_t nv = g.values.size();
  const int nk = static_cast<int>(g.kernels.size());
  const std::vector<int> last = last_readers(g);
  const std::vector<uint64_t> want = reference_hashes(g);
  std::vector<char> resident(nv, 0), made(nv, 0);
  std::vector<uint64_t> hash(nv, 0);
  for (size_t v = 0; v < nv; ++v)
    if (g.values[v].producer < 0) resident[v] = 1, hash[v] = want[v];
  size_t cur = g.start_bytes;
  r.peak = cur;
  int next_run = 0;
  auto fail = [&](size_t i, const std::string& why) {
    if (r.error.empty())
      r.error = "action " + std::to_string(i) + " (" + render(plan.actions[i]) + "): " + why;
  };
  // Values the next Run computes inside itself (Inline actions), with their symbolic value.
  std::vector<std::pair<int, uint64_t>> inlined;
  for (size_t i = 0; i < plan.actions.size() && r.error.empty(); ++i) {
    const PlanAction& a = plan.actions[i];
    if (a.kind == Kind::Inline) {
      if (a.id < 0 || a.id >= nk) {
        fail(i, "no such kernel");
        break;
      }
      const PlanKernel& p = g.kernels[static_cast<size_t>(a.id)];
      if (a.id >= next_run) fail(i, "Inline of a kernel that has not run yet");
      if (!p.recomputable) fail(i, "Inline of a non-recomputable kernel");
      if (i + 1 >= plan.actions.size() || (plan.actions[i + 1].kind != Kind::Run &&
                                           plan.actions[i + 1].kind != Kind::Inline))
        fail(i, "Inline not followed by the Run that computes it");
      std::vector<uint64_t> ins;
      for (int in : p.inputs) {
        if (!resident[static_cast<size_t>(in)])
          fail(i, "inlines a kernel whose input " + std::to_string(in) + " is not resident");
        ins.push_back(hash[static_cast<size_t>(in)]);
      }
      inlined.push_back({p.output, kernel_hash(a.id, ins)});
      ++r.inlined;
      continue;
    }
    if (a.kind == Kind::Run || a.kind == Kind::Recompute) {
      if (a.id < 0 || a.id >= nk) {
        fail(i, "no such kernel");
        break;
      }
      const PlanKernel& k = g.kernels[static_cast<size_t>(a.id)];
      if (a.kind == Kind::Run) {
        if (a.id != next_run)
          fail(i, "Run out of schedule order, expected kernel " + std::to_string(next_run));
        ++next_run;
      } else {
        if (a.id >= next_run) fail(i, "Recompute of a kernel that has not run yet");
        if (!k.recomputable) fail(i, "Recompute of a non-recomputable kernel");
        if (a.in_place) fail(i, "Recompute in place");
        ++r.recomputes;
        r.extra_cost += k.cost;
      }
      if (a.kind == Kind::Recompute && !inlined.empty()) fail(i, "Inline before a Recompute");
      std::vector<uint64_t> ins;
      size_t fused_reads = 0;
      for (int in : k.inputs) {
        auto fused = std::find_if(inlined.begin(), inlined.end(),
                                  [&](const auto& f) { return f.first == in; });
        if (fused != inlined.end()) {
          const auto f = std::find_if(k.inline_inputs.begin(), k.inline_inputs.end(),
                                      [&](const InlineInput& x) { return x.value == in; });
          if (f == k.inline_inputs.end())
            fail(i, "computes value " + std::to_string(in) + " inside, not an inline input");
          else
            r.extra_cost += f->share * g.kernels[static_cast<size_t>(
                                           g.values[static_cast<size_t>(in)].producer)].cost;
          ins.push_back(fused->second);
          ++fused_reads;
          continue;
        }
        if (!resident[static_cast<size_t>(in)])
          fail(i, "reads value " + std::to_string(in) + ", which is not resident");
        ins.push_back(hash[static_cast<size_t>(in)]);
      }
      if (fused_reads != inlined.size()) fail(i, "an Inline the Run does not read");
      inlined.clear();
      const size_t out = static_cast<size_t>(k.output);
      if (resident[out]) fail(i, "writes value " + std::to_string(out) + ", already resident");
      if (a.kind == Kind::Run && made[out]) fail(i, "first Run of an already made value");
      size_t add = g.values[out].bytes;
      if (a.in_place) {
        const int d = k.in_place_input;
        if (d < 0 || !contains(k.inputs, d)) {
          fail(i, "in place without an in_place_input it reads");
        } else {
          const PlanValue& dv = g.values[static_cast<size_t>(d)];
          if (last[static_cast<size_t>(d)] != a.id)
            fail(i, "in place over value " + std::to_string(d) + ", read again later");
          if (dv.output) fail(i, "in place over an output");
          if (dv.bytes != g.values[out].bytes) fail(i, "in place over a value of other size");
          if (dv.producer < 0 && !dv.releasable_leaf) fail(i, "in place over a kept leaf");
          resident[static_cast<size_t>(d)] = 0;
          add = 0;
        }
      }
      const uint64_t h = kernel_hash(a.id, ins);
      if (h != want[out]) fail(i, "computes a different value than the original schedule");
      resident[out] = 1, made[out] = 1, hash[out] = h;
      cur += add;
    } else {
      if (a.id < 0 || static_cast<size_t>(a.id) >= nv) {
        fail(i, "no such value");
        break;
      }
      const size_t v = static_cast<size_t>(a.id);
      const PlanValue& pv = g.values[v];
      if (!resident[v]) fail(i, "releases a value that is not resident");
      if (pv.output) fail(i, "releases an output");
      if (pv.producer < 0 && !pv.releasable_leaf) fail(i, "releases a leaf it must keep");
      if (a.kind == Kind::Evict) {
        if (pv.producer < 0)
          fail(i, "evicts a leaf, which cannot be rebuilt");
        else if (!g.kernels[static_cast<size_t>(pv.producer)].recomputable)
          fail(i, "evicts the output of a non-recomputable kernel");
        ++r.evictions;
        r.evicted_bytes += pv.bytes;
      } else if (reads_at_or_after(g, a.id, next_run)) {
        fail(i, "Free of a value a later kernel still reads");
      }
      if (cur < pv.bytes) fail(i, "bytes in use would go below zero");
      cur -= std::min(cur, pv.bytes);
      resident[v] = 0;
    }
    r.peak = std::max(r.peak, cur);
    if (simulated_bytes && budget > 0 && plan.feasible && cur > budget)
      fail(i,
           "bytes in use " + std::to_string(cur) + " exceed the budget " + std::to_string(budget));
  }
  if (!r.error.empty()) return r;
  if (plan.feasible) {
    if (next_run != nk)
      r.error = "feasible plan ran " + std::to_string(next_run) + " of " + std::to_string(nk) +
                " kernels";
    for (size_t v = 0; v < nv && r.error.empty(); ++v)
      if (g.values[v].output && !resident[v])
        r.error = "output " + std::to_string(v) + " is not resident at the end";
  } else if (plan.failure.empty()) {
    r.error = "infeasible plan without a failure message";
  }
  if (!r.error.empty()) return r;
  if (simulated_bytes && r.peak != plan.peak)
    r.error =
        "replayed peak " + std::to_string(r.peak) + " != plan.peak " + std::to_string(plan.peak);
  else if (simulated_bytes && plan.feasible && budget > 0 && plan.peak > budget)
    r.error = "feasible plan with peak " + std::to_string(plan.peak) + " above the budget " +
              std::to_string(budget);
  else if (r.recomputes != plan.recomputes || r.evictions != plan.evictions ||
           r.evicted_bytes != plan.evicted_bytes || r.inlined != plan.inlined)
    r.error = "plan counts (recomputes, evictions, evicted bytes) disagree with its actions";
  else if (std::abs(r.extra_cost - plan.extra_cost) > 1e-9 * (1 + r.extra_cost))
    r.error = "plan.extra_cost disagrees with its Recompute actions";
  return r;
}

// Checks a plan made without a budget on a step without checkpoint regions: exactly the
// schedule's Runs plus Frees, every released value freed right after its last read (or
// consumed in place there), in place exactly where allowed.
inline std::string check_unbudgeted(const StepGraph& g, const RecomputePlan& plan) {
  if (!plan.feasible) return "unbudgeted plan infeasible: " + plan.failure;
  if (plan.evictions || plan.recomputes) return "unbudgeted plan evicts or recomputes";
  const std::vector<int> last = last_readers(g);
  const int nk = static_cast<int>(g.kernels.size());
  // The Runs seen so far when each value was freed, and which kernels ran in place.
  std::vector<int> freed_after(g.values.size(), kNone), free_count(g.values.size(), 0);
  std::vector<char> in_place(g.kernels.size(), 0);
  int runs = 0;
  for (const PlanAction& a : plan.actions) {
    if (a.kind == Kind::Run) {
      if (a.id != runs) return "Run " + std::to_string(a.id) + " out of order";
      in_place[static_cast<size_t>(a.id)] = a.in_place;
      ++runs;
    } else if (a.kind == Kind::Free) {
      freed_after[static_cast<size_t>(a.id)] = runs;
      ++free_count[static_cast<size_t>(a.id)];
    } else {
      return "unbudgeted plan has " + render(a);
    }
  }
  if (runs != nk) return "not every kernel ran";
  for (int k = 0; k < nk; ++k)
    if (static_cast<bool>(in_place[static_cast<size_t>(k)]) != may_run_in_place(g, last, k))
      return "kernel " + std::to_string(k) +
             " in place: " + std::to_string(in_place[static_cast<size_t>(k)]) +
             ", allowed: " + std::to_string(may_run_in_place(g, last, k));
  for (size_t v = 0; v < g.values.size(); ++v) {
    const PlanValue& pv = g.values[v];
    const std::string name = "value " + std::to_string(v);
    const bool kept = pv.output || (pv.producer < 0 && !pv.releasable_leaf);
    if (kept) {
      if (free_count[v]) return name + " is kept but was freed";
      continue;
    }
    const int lr = last[v];
    if (lr >= 0 && g.kernels[static_cast<size_t>(lr)].in_place_input == static_cast<int>(v) &&
        in_place[static_cast<size_t>(lr)]) {
      if (free_count[v]) return name + " was consumed in place and also freed";
      continue;
    }
    // Freed once, after the Run of its last reader (or producer, or at the start for an
    // unread leaf) and before the next Run.
    const int after = lr >= 0 ? lr + 1 : (pv.producer >= 0 ? pv.producer + 1 : 0);
    if (free_count[v] != 1)
      return name + " freed " + std::to_string(free_count[v]) + " times, not once";
    if (freed_after[v] != after)
      return name + " freed after " + std::to_string(freed_after[v]) + " Runs, not after " +
             std::to_string(after);
  }
  return "";
}

// ---------------------------------------------------------------------------------------
// Random forward/backward steps.

struct StepShape {
  bool regions = false;          ///< Mark a stretch of the forward as a checkpoint region.
  bool non_recomputable = true;  ///< Some kernels must not run twice.
  bool ancestors_first = false;  ///< Order each kernel's inputs by value id.
  bool unread_donated = false;   ///< Leave donated parameters that nothing reads.
  int min_forward = 2, max_forward = 20;
};

// A training-step-like DAG: parameters and an input as leaves, a forward chain with skips
// (diamonds), dead values and values with many readers, a loss, a backward reading the
// forward activations in reverse with gradient accumulation for the parameters, and an
// update kernel per releasable parameter that may write the parameter in place.
inline StepGraph random_step(std::mt19937_64& rng, const StepShape& shape) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  auto cost = [&] { return std::uniform_real_distribution<double>(0.1, 5.0)(rng); };
  auto size = [&]() -> size_t { return chance(0.03) ? 0 : static_cast<size_t>(uniform(1, 100)); };
  Builder b;
  const int x = b.leaf(static_cast<size_t>(uniform(1, 64)), chance(0.25));  // donated input?
  std::vector<int> params;
  const int np = uniform(1, 4);
  for (int i = 0; i < np; ++i)
    params.push_back(b.leaf(static_cast<size_t>(uniform(1, 64)), chance(0.5)));
  auto finish_kernel = [&](int v) {
    PlanKernel& k = b.producer_of(v);
    k.recomputable = !shape.non_recomputable || !chance(0.08);
    if (shape.ancestors_first) std::sort(k.inputs.begin(), k.inputs.end());
    return v;
  };
  auto dedupe = [](std::vector<int> ins) {
    std::vector<int> out;
    for (int v : ins)
      if (!contains(out, v)) out.push_back(v);
    return out;
  };

  const int nf = uniform(shape.min_forward, shape.max_forward);
  std::vector<int> acts;
  std::vector<int> act_param(static_cast<size_t>(nf), kNone);
  const int region_lo = shape.regions ? uniform(0, nf - 1) : nf;
  const int region_hi = shape.regions ? uniform(region_lo, nf - 1) : -1;
  for (int i = 0; i < nf; ++i) {
    std::vector<int> ins{acts.empty() ? x : acts.back()};
    if (acts.size() > 1 && chance(0.3))
      ins.push_back(acts[static_cast<size_t>(uniform(0, static_cast<int>(acts.size()) - 2))]);
    if (chance(0.6)) {
      act_param[static_cast<size_t>(i)] = params[static_cast<size_t>(uniform(0, np - 1))];
      ins.push_back(act_param[static_cast<size_t>(i)]);
    }
    if (chance(0.1)) ins.push_back(x);  // x gets many readers
    std::shuffle(ins.begin(), ins.end(), rng);
    const int a = finish_kernel(b.op(dedupe(ins), size(), cost()));
    // Checkpoint region: its last kernel's result leaves the region (region 0).
    if (i >= region_lo && i < region_hi) b.last().region = 1;
    acts.push_back(a);
    if (chance(0.07)) finish_kernel(b.op({a}, size(), cost()));  // a dead value
  }
  if (!shape.unread_donated)
    for (int p : params)
      if (!contains(act_param, p)) b.g.values[static_cast<size_t>(p)].releasable_leaf = false;
  const int loss =
      finish_kernel(b.op({acts.back()}, static_cast<size_t>(uniform(1, 4)), cost(), true));

  // Backward, with a gradient accumulator per parameter.
  std::vector<int> grad_acc(static_cast<size_t>(np), kNone);
  int g = loss;
  for (int i = nf - 1; i >= 0; --i) {
    const int a = acts[static_cast<size_t>(i)];
    std::vector<int> ins{g, a};
    if (chance(0.2)) ins.push_back(acts[static_cast<size_t>(uniform(0, nf - 1))]);
    if (chance(0.1)) ins.push_back(x);
    ins = dedupe(ins);
    std::shuffle(ins.begin(), ins.end(), rng);
    const size_t bytes = chance(0.6) ? b.g.values[static_cast<size_t>(a)].bytes : size();
    const int ng = b.op(ins, bytes, cost(), i == 0 && chance(0.5));
    if (chance(0.4))
      b.last().in_place_input =
          ins[static_cast<size_t>(uniform(0, static_cast<int>(ins.size()) - 1))];
    finish_kernel(ng);
    if (const int p = act_param[static_cast<size_t>(i)]; p >= 0) {
      const size_t pi =
          static_cast<size_t>(std::find(params.begin(), params.end(), p) - params.begin());
      const size_t pbytes = b.g.values[static_cast<size_t>(p)].bytes;
      std::vector<int> gins{ng, i > 0 ? acts[static_cast<size_t>(i - 1)] : x};
      std::shuffle(gins.begin(), gins.end(), rng);
      const int dp = finish_kernel(b.op(dedupe(gins), pbytes, cost()));
      if (grad_acc[pi] < 0) {
        grad_acc[pi] = dp;
      } else {
        std::vector<int> ains{grad_acc[pi], dp};
        std::shuffle(ains.begin(), ains.end(), rng);
        const int acc = b.op(ains, pbytes, cost());
        b.last().in_place_input = grad_acc[pi];
        grad_acc[pi] = finish_kernel(acc);
      }
    }
    g = ng;
  }
  // Gradients are outputs, or feed an update that may overwrite a donated parameter.
  for (int i = 0; i < np; ++i) {
    const int p = params[static_cast<size_t>(i)];
    const int acc = grad_acc[static_cast<size_t>(i)];
    if (acc < 0) continue;
    if (b.g.values[static_cast<size_t>(p)].releasable_leaf) {
      std::vector<int> uins{p, acc};
      std::shuffle(uins.begin(), uins.end(), rng);
      const int np_ = b.op(uins, b.g.values[static_cast<size_t>(p)].bytes, cost(), true);
      b.last().in_place_input = p;
      finish_kernel(np_);
    } else {
      b.g.values[static_cast<size_t>(acc)].output = true;
    }
  }
  b.g.start_bytes += static_cast<size_t>(uniform(0, 1) * uniform(0, 50));  // other allocations
  return b.g;
}

inline size_t unbudgeted_peak(const StepGraph& g) {
  return simulate_step(g, PlannerOptions{}).peak;
}

inline RecomputePlan plan_with(const StepGraph& g, size_t budget) {
  PlannerOptions o;
  o.budget = budget;
  return simulate_step(g, o);
}

// What fuzzing found: the first violation, and how many budgeted plans were feasible and
// how many of those evicted something (so the budgets do bite).
struct FuzzResult {
  std::string error;
  int plans = 0, feasible = 0, evicting = 0;
};

// Fuzzes budgeted plans of `graphs` random steps of `shape`; returns the first violation.
inline std::string fuzz_into(const StepShape& shape, uint64_t seed, int graphs, FuzzResult& stats) {
  std::mt19937_64 rng(seed);
  for (int n = 0; n < graphs; ++n) {
    const StepGraph g = random_step(rng, shape);
    const std::string where = "graph " + std::to_string(n) + " of seed " + std::to_string(seed);
    const RecomputePlan free_plan = simulate_step(g, PlannerOptions{});
    if (auto r = replay(g, free_plan, 0); !r.error.empty())
      return where + ", no budget: " + r.error;
    if (!free_plan.feasible) return where + ": unbudgeted plan infeasible: " + free_plan.failure;
    const size_t lb = lower_bound(g), top = free_plan.peak;
    if (free_plan.lower_bound != lb) return where + ": plan.lower_bound != lower_bound(g)";
    if (lb > top)
      return where + ": lower bound " + std::to_string(lb) + " above the unbudgeted peak " +
             std::to_string(top);
    std::vector<size_t> budgets{top, lb};
    for (int i = 0; i < 4; ++i)
      budgets.push_back(std::uniform_int_distribution<size_t>(lb, top)(rng));
    for (size_t budget : budgets) {
      if (budget == 0) continue;
      const RecomputePlan p = plan_with(g, budget);
      if (auto r = replay(g, p, budget); !r.error.empty())
        return where + ", budget " + std::to_string(budget) + " (lb " + std::to_string(lb) +
               ", top " + std::to_string(top) + "): " + r.error;
      if (budget == top && !p.feasible)
        return where + ": infeasible at the unbudgeted peak: " + p.failure;
      ++stats.plans;
      if (p.feasible) ++stats.feasible, stats.evicting += p.evictions > 0;
    }
    const size_t best = smallest_feasible_budget(g, PlannerOptions{});
    if (best < lb) return where + ": smallest_feasible_budget below the lower bound";
    const RecomputePlan at_best = plan_with(g, best);
    if (!at_best.feasible)
      return where + ": smallest_feasible_budget " + std::to_string(best) +
             " is infeasible: " + at_best.failure;
    if (lb > 1) {
      const RecomputePlan below = plan_with(g, lb - 1);
      if (below.feasible)
        return where + ": feasible at lower_bound - 1 = " + std::to_string(lb - 1) + ", actions " +
               render(below.actions);
      if (below.failure.empty()) return where + ": infeasible below the bound without a message";
      if (auto r = replay(g, below, lb - 1); !r.error.empty())
        return where + ", below the bound: " + r.error;
    }
  }
  return "";
}

inline FuzzResult fuzz_budgets(const StepShape& shape, uint64_t seed, int graphs) {
  FuzzResult out;
  out.error = fuzz_into(shape, seed, graphs, out);
  return out;
}

// ---------------------------------------------------------------------------------------
// Hand-built and generated steps.

// X (8 bytes) -> a1..a4 (100 each) -> loss (1, output), then the backward g4..g1 (100 each,
// g1 an output) reading a4..a1 in reverse. Kernel k0 (a1) costs `c0`, k1 (a2) `c1`, the
// others 1.
struct Mlp {
  Builder b;
  int x, a1, a2, a3, a4, loss, g4, g3, g2, g1;
  explicit Mlp(double c0, double c1 = 1.0) {
    x = b.leaf(8);
    a1 = b.op({x}, 100, c0);
    a2 = b.op({a1}, 100, c1);
    a3 = b.op({a2}, 100);
    a4 = b.op({a3}, 100);
    loss = b.op({a4}, 1, 1.0, true);
    g4 = b.op({loss, a4}, 100);
    g3 = b.op({g4, a3}, 100);
    g2 = b.op({g3, a2}, 100);
    g1 = b.op({g2, a1}, 100, 1.0, true);
  }
};

// An unrolled LSTM: per step gates = f(x_t, h, W) (4H), c = f(gates, c) (H), h = f(gates,
// c) (H); the backward per step: dgates, dc, dh and an in-place weight-gradient
// accumulation. Seven kernels per step, sizes jittered.
inline StepGraph lstm_step(int steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto jitter = [&](size_t base) {
    return base + static_cast<size_t>(std::uniform_int_distribution<int>(0, 15)(rng));
  };
  auto cost = [&] { return std::uniform_real_distribution<double>(0.5, 2.0)(rng); };
  constexpr size_t kH = 1024;
  Builder b;
  const int w = b.leaf(16 * kH);
  std::vector<int> xs, hs, cs, gates;
  int h = b.leaf(kH), c = b.leaf(kH);
  hs.push_back(h), cs.push_back(c);
  for (int t = 0; t < steps; ++t) {
    xs.push_back(b.leaf(kH));
    const int g = b.op({xs.back(), h, w}, jitter(4 * kH), 4 * cost());
    c = b.op({g, c}, jitter(kH), cost());
    h = b.op({g, c}, jitter(kH), cost());
    gates.push_back(g), cs.push_back(c), hs.push_back(h);
  }
  int dh = b.op({h}, 64, cost(), true);  // the loss
  dh = b.op({dh, h}, b.g.values[static_cast<size_t>(h)].bytes, cost());
  int dc = kNone, dw = kNone;
  for (int t = steps - 1; t >= 0; --t) {
    std::vector<int> ins{dh, gates[static_cast<size_t>(t)], cs[static_cast<size_t>(t + 1)],
                         cs[static_cast<size_t>(t)]};
    if (dc >= 0) ins.push_back(dc);
    const int dg =
        b.op(ins, b.g.values[static_cast<size_t>(gates[static_cast<size_t>(t)])].bytes, 4 * cost());
    std::vector<int> cins{dg, gates[static_cast<size_t>(t)]};
    if (dc >= 0) cins.push_back(dc);
    dc = b.op(cins, jitter(kH), cost());
    dh = b.op({dg, w}, jitter(kH), 4 * cost());
    std::vector<int> wins{dg, hs[static_cast<size_t>(t)], xs[static_cast<size_t>(t)]};
    if (dw >= 0) wins.push_back(dw);
    const int ndw = b.op(wins, 16 * kH, 4 * cost(), t == 0);
    if (dw >= 0) b.last().in_place_input = dw;
    dw = ndw;
  }
  return b.g;
}

// An MLP chain of `layers` layers: forward activations, loss, backward reading them in
// reverse, weight gradients as outputs.
inline StepGraph mlp_step(int layers, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto bytes = [&] {
    return static_cast<size_t>(std::uniform_int_distribution<int>(512, 4096)(rng));
  };
  auto cost = [&] { return std::uniform_real_distribution<double>(0.5, 2.0)(rng); };
  Builder b;
  const int x = b.leaf(1024);
  std::vector<int> ws, acts{x};
  for (int i = 0; i < layers; ++i) ws.push_back(b.leaf(256));
  for (int i = 0; i < layers; ++i)
    acts.push_back(b.op({acts.back(), ws[static_cast<size_t>(i)]}, bytes(), cost()));
  int g = b.op({acts.back()}, 8, cost(), true);
  for (int i = layers - 1; i >= 0; --i) {
    b.op({g, acts[static_cast<size_t>(i)]}, 256, cost(), true);  // weight gradient
    g = b.op({g, ws[static_cast<size_t>(i)], acts[static_cast<size_t>(i + 1)]},
             b.g.values[static_cast<size_t>(acts[static_cast<size_t>(i)])].bytes, cost(), i == 0);
  }
  return b.g;
}

}  // namespace planner_test
