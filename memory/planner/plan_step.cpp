#include "plan_step.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

namespace kiln::memory {

// What identifies a step: its tables as given (estimated costs included) and what the plan
// depends on beyond them. The bytes resident at the start are left out: they change with
// what the program holds, not with the step, whose measured costs and order stay valid (a
// stored plan is for one start; stored_plan checks it). Compared whole on a lookup: a hash
// only finds candidates.
struct StepKey {
  std::vector<PlanKernel> kernels;
  std::vector<PlanValue> values;
  size_t budget = 0, tail = 0;
  double reserve_limit = 0;

  bool matches(const StepGraph& g, size_t b, size_t t, double limit) const {
    return budget == b && tail == t && reserve_limit == limit && kernels == g.kernels &&
           values == g.values;
  }
};

// What a stored plan was made for besides the step's key: the kernel order, the bytes
// resident at the start (which the key leaves out) and the budget planned for.
struct PlanMadeFor {
  ScheduleOrder order = ScheduleOrder::Given;
  size_t start = 0, budget = 0;
  bool operator==(const PlanMadeFor&) const = default;
};

// What an arena placement was made for: exactly these actions and sizes in this order.
struct PlacementMadeFor {
  ScheduleOrder order = ScheduleOrder::Given;
  std::vector<PlanAction> actions;
  std::vector<size_t> bytes;
  bool refined = false;
  bool matches(ScheduleOrder o, const std::vector<PlanAction>& a, const std::vector<size_t>& b,
               bool r) const {
    return order == o && refined == r && actions == a && bytes == b;
  }
};

// What kiln learns about a step that repeats (a training loop). Costs estimated from bytes
// and flops miss launch and threading overheads, which dominate small kernels; plans made
// with measured times choose better victims and report extra work truthfully.
struct StepProfile {
  std::vector<double> seconds;  // per kernel in the given order: fastest run seen
  int measured = 0;             // steps that contributed to `seconds`
  ScheduleOrder order = ScheduleOrder::Given;
  // When `order` was chosen: not yet, before the costs settled (by a race of the orders, or
  // near the floor by planning every order), or with the settled costs.
  enum class Ordered { Not, Unsettled, Settled } ordered = Ordered::Not;
  // The plan made once the costs stopped changing: the same tables, costs and budget always
  // give the same plan, so later steps run it again.
  std::optional<std::pair<PlanMadeFor, PlanDecision>> plan;
  // The arena placement of the plan that ran last: placing thousands of values takes
  // milliseconds, and a training loop repeats the same plan.
  std::optional<std::pair<PlacementMadeFor, std::shared_ptr<const ArenaPlan>>> arena;
};

struct StepProfileEntry {
  explicit StepProfileEntry(StepKey k) : key(std::move(k)) {}
  const StepKey key;
  std::mutex mutex;  // guards `profile`
  StepProfile profile;
};

namespace {

using Clock = std::chrono::steady_clock;

// Steps timed before the costs are final. Later steps are not timed, so their plans and
// arena placements are made once and reused (a minimum over three runs is close enough:
// the plan only needs to know which kernels are cheap).
constexpr int kTimedSteps = 3;
// Profiles kept at most: a long run of ever-new shapes starts the cache afresh.
constexpr size_t kMaxProfiles = 1024;
// The work each order may take in the race of a step's first plan, per kernel
// (PlannerOptions::max_work): the benchmark LSTM's order finishes within 55 at half its
// releasable bytes, where each other order needs thousands.
constexpr size_t kRaceWorkPerKernel = 64;

// FNV-1a over 64-bit words: the key only needs to find candidates within one process.
struct KeyHash {
  uint64_t h = 0xcbf29ce484222325ULL;
  void operator()(uint64_t x) { h = (h ^ x) * 0x100000001b3ULL; }
  void operator()(double x) {
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    (*this)(bits);
  }
};

uint64_t hash_key(const StepGraph& g, size_t budget, size_t tail, double reserve_limit) {
  KeyHash mix;
  mix(static_cast<uint64_t>(budget)), mix(static_cast<uint64_t>(tail));
  mix(reserve_limit);
  for (const PlanValue& v : g.values)
    mix(static_cast<uint64_t>(v.bytes)), mix(static_cast<uint64_t>(v.producer)),
        mix(static_cast<uint64_t>(v.output * 2u + v.releasable_leaf));
  for (const PlanKernel& k : g.kernels) {
    mix(static_cast<uint64_t>(k.output)), mix(static_cast<uint64_t>(k.in_place_input));
    mix(static_cast<uint64_t>(k.region)), mix(k.cost);
    for (int in : k.inputs) mix(static_cast<uint64_t>(in));
    for (const InlineInput& f : k.inline_inputs) mix(static_cast<uint64_t>(f.value)), mix(f.share);
  }
  return mix.h;
}

// The profiles of the steps seen, found by hash and confirmed by comparing keys.
class ProfileCache {
 public:
  // The profile of the step with tables `g` planned with these settings, made empty when
  // there is none yet.
  std::shared_ptr<StepProfileEntry> entry(const StepGraph& g, size_t budget, size_t tail,
                                          double reserve_limit) {
    const uint64_t h = hash_key(g, budget, tail, reserve_limit);
    std::lock_guard<std::mutex> lock(mutex_);
    auto& bucket = buckets_[h];
    for (const auto& e : bucket)
      if (e->key.matches(g, budget, tail, reserve_limit)) return e;
    if (size_ >= kMaxProfiles) {
      buckets_.clear();
      size_ = 0;
    }
    auto e = std::make_shared<StepProfileEntry>(
        StepKey{g.kernels, g.values, budget, tail, reserve_limit});
    buckets_[h].push_back(e);
    ++size_;
    return e;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<uint64_t, std::vector<std::shared_ptr<StepProfileEntry>>> buckets_;
  size_t size_ = 0;
};

ProfileCache& profiles() {
  static ProfileCache cache;
  return cache;
}

// Puts the measured costs into `graph` (given order) and returns the kernel order to use.
// Before the costs settle the order comes from a race of the orders (each planned with a
// bounded amount of work), chosen once: the estimated costs of the first steps would not
// choose the order the step keeps anyway. The step whose costs settle chooses it by
// planning every order in full, as does `choose_again`. `*settled`: the costs are final.
// `*raced` receives the race's plan for the order returned when it ran and finished (else
// it is left alone).
ScheduleOrder measured_order(StepProfileEntry& e, StepGraph& graph, const PlannerOptions& planned,
                             size_t tail, bool timed, bool* settled, bool choose_again,
                             std::optional<RecomputePlan>* raced = nullptr) {
  using Ordered = StepProfile::Ordered;
  std::vector<double> seconds;
  int measured;
  Ordered ordered;
  ScheduleOrder order;
  {
    std::lock_guard<std::mutex> lock(e.mutex);
    seconds = e.profile.seconds;
    measured = e.profile.measured, ordered = e.profile.ordered;
    order = e.profile.order;
  }
  const bool sized = seconds.size() == graph.kernels.size();
  if (measured > 0 && sized)
    for (size_t k = 0; k < graph.kernels.size(); ++k) graph.kernels[k].cost = seconds[k];
  *settled = !timed || (measured >= kTimedSteps && sized);
  if (!choose_again &&
      (ordered == Ordered::Settled || (ordered == Ordered::Unsettled && !*settled)))
    return order;
  if (*settled || choose_again) {
    order = choose_schedule_order(graph, planned, tail,
                                  ordered != Ordered::Not ? order : ScheduleOrder::Given)
                .order;
  } else {
    OrderChoice race = race_schedule_orders(graph, planned, tail, kRaceWorkPerKernel);
    order = race.order;
    if (raced && race.plan.feasible) raced->emplace(std::move(race.plan));
  }
  ordered = *settled ? Ordered::Settled : Ordered::Unsettled;
  std::lock_guard<std::mutex> lock(e.mutex);
  e.profile.order = order;
  e.profile.ordered = ordered;
  return order;
}

// The tables in `order`: `*perm` receives the permutation.
StepGraph in_order(const StepGraph& given, ScheduleOrder order, size_t tail,
                   std::vector<int>* perm) {
  *perm = schedule_order(given, order, tail);
  if (order == ScheduleOrder::Given) return given;
  return reorder_to_run(given, *perm);
}

// The arena placement of `actions` in the step's run order, placed once per plan: `made`,
// when given, is a placement of these actions made already (by fit_to_budget).
std::shared_ptr<const ArenaPlan> arena_for(StepProfileEntry& e, ScheduleOrder order,
                                           const StepGraph& graph,
                                           const std::vector<PlanAction>& actions,
                                           const std::vector<size_t>& bytes, bool refine,
                                           const ArenaPlan* made) {
  if (made == nullptr) {
    std::lock_guard<std::mutex> lock(e.mutex);
    if (e.profile.arena && e.profile.arena->first.matches(order, actions, bytes, refine))
      return e.profile.arena->second;
  }
  auto placed =
      std::make_shared<const ArenaPlan>(made ? *made : plan_arena(graph, actions, bytes, refine));
  std::lock_guard<std::mutex> lock(e.mutex);
  e.profile.arena.emplace(PlacementMadeFor{order, actions, bytes, refine}, placed);
  return placed;
}

// Stores the plan made once the costs settled, for later steps to run again.
void store_plan(StepProfileEntry& e, const StepPlan& out, size_t start_bytes) {
  std::lock_guard<std::mutex> lock(e.mutex);
  e.profile.plan.emplace(PlanMadeFor{out.order, start_bytes, out.planned_budget}, out);
}

// The plan stored for this order, start and planned budget, copied into `out`; false when
// there is none.
bool stored_plan(StepProfileEntry& e, size_t start_bytes, StepPlan& out) {
  std::lock_guard<std::mutex> lock(e.mutex);
  const auto& stored = e.profile.plan;
  if (!stored || !(stored->first == PlanMadeFor{out.order, start_bytes, out.planned_budget}))
    return false;
  static_cast<PlanDecision&>(out) = stored->second;
  return true;
}

// The figures an over-budget error gives: the unplanned peak, the smallest budget any
// order fits, and where the lower bound is reached.
void explain_failure(StepPlan& out, size_t tail) {
  out.unplanned_peak = simulate_step(out.graph, PlannerOptions(0, out.tuning)).peak;
  const PlannerOptions asked(out.planned_budget, PlannerTuning{});
  out.smallest_budget = std::numeric_limits<size_t>::max();
  for (ScheduleOrder order : all_orders())
    out.smallest_budget =
        std::min(out.smallest_budget,
                 smallest_feasible_budget(
                     reorder(out.graph, schedule_order(out.graph, order, tail)), asked));
  lower_bound(out.graph, &out.bound_kernel);
}

}  // namespace

PlannerOptions StepPlan::execution() const {
  PlannerOptions o(executes_at, tuning);
  // Execution makes the plan's evictions where the plan made them (a plan kept values in
  // the arena's gaps that the budget's own choice would release), and chooses by score
  // only what the real allocations need more.
  o.follow = &actions->chosen;
  return o;
}

StepPlan plan_step(const StepGraph& given, const PlanRequest& request) {
  const auto started = Clock::now();
  const size_t tail = request.fixed_tail;
  StepPlan out;
  // The static plan may be made for more than the budget (set_plan_margin, for tests).
  const double margin = 1.0 + std::max(request.margin, 0.0);
  out.planned_budget =
      request.budget > 0 ? static_cast<size_t>(static_cast<double>(request.budget) * margin) : 0;
  out.executes_at = request.budget;
  const PlannerOptions planned(out.planned_budget, PlannerTuning{});

  // 1. The step's profile: measured costs replace the estimates, and the kernel order.
  std::shared_ptr<StepProfileEntry> profile =
      profiles().entry(given, request.budget, tail, request.reserve_limit);
  out.profile = profile;
  StepGraph graph = given;
  bool settled = false;
  std::optional<RecomputePlan> raced;  // the order race's plan, when it made one
  out.order =
      measured_order(*profile, graph, planned, tail, request.timed, &settled, false, &raced);
  out.graph = in_order(graph, out.order, tail, &out.perm);

  // 2. A plan made once the costs settled runs again as it is.
  out.reused = settled && stored_plan(*profile, graph.start_bytes, out);
  RecomputePlan made;  // planned now, when no stored plan applies
  std::optional<ArenaFit> fit;
  if (!out.reused && request.budget > 0) {
    // 3. Under a budget. With an arena the plan is fitted so that the arena and the blocks
    // beside it keep the budget too (arena_fit.h); without one, a plan made once is the
    // best of a few policies, searched for better evictions.
    if (request.arena) {
      fit = fit_to_budget(out.graph, planned, request.arena_bytes, settled, request.reserve_limit,
                          request.pool, raced ? &*raced : nullptr);
      if (settled && fit->plan.feasible && !fit->holds) {
        // 3a. The order was chosen for the least recomputation, not for packing: another
        // order may hold the reserve where this one cannot. Take the one that does with
        // the least recomputation, within this order's plan plus the reserve's limit.
        double limit = fit->plan.extra_cost + request.reserve_limit * fit->plan.base_cost;
        const ScheduleOrder chosen = out.order;
        for (ScheduleOrder other : all_orders()) {
          if (other == chosen) continue;
          std::vector<int> perm;
          StepGraph ordered = in_order(graph, other, tail, &perm);
          // An order is fitted only when its plain plan for the whole budget needs at most
          // twice the limit: a fitted plan is made for less than the budget, and fitting
          // orders that could not plan the budget at all took 26 of the 30 s the LSTM's
          // settling step spent at a third of its releasable bytes.
          PlannerOptions screen = planned;
          screen.max_extra_cost = 2 * limit / std::max(fit->plan.base_cost, 1e-30);
          if (!simulate_step(ordered, screen).feasible) continue;
          ArenaFit tried = fit_to_budget(ordered, planned, request.arena_bytes, true,
                                         request.reserve_limit, request.pool);
          if (tried.plan.feasible && tried.holds && tried.plan.extra_cost <= limit) {
            limit = tried.plan.extra_cost, fit = std::move(tried);
            out.order = other, out.perm = std::move(perm), out.graph = std::move(ordered);
          }
        }
        if (out.order != chosen) {  // the step's order from now on
          std::lock_guard<std::mutex> lock(profile->mutex);
          profile->profile.order = out.order;
        }
      }
      made = fit->plan;
      out.tuning = fit->policy;
    } else if (settled) {
      made = simulate_best(out.graph, planned, &out.tuning);
      made =
          search_evictions(out.graph, std::move(made), PlannerOptions(planned.budget, out.tuning));
    } else {
      made = raced ? std::move(*raced) : simulate_step(out.graph, planned);
    }
    if (!made.feasible) {
      // 3b. Near the floor an order chosen with earlier costs may no longer fit with
      // today's measured ones: choose again.
      out.order = measured_order(*profile, graph, planned, tail, request.timed, &settled, true);
      out.graph = in_order(graph, out.order, tail, &out.perm);
      out.tuning = PlannerTuning{};
      fit.reset();
      made = simulate_step(out.graph, planned);
    }
    if (fit) {
      out.fitted_for = fit->planned_for;
      out.kept_in_gaps = fit->kept_in_gaps;
      out.reserve_cost = fit->reserve_cost;
    }
    if (!made.feasible) {
      // 3c. No plan: the caller raises the error with these figures.
      out.feasible = false;
      out.actions = std::make_shared<const RecomputePlan>(std::move(made));
      explain_failure(out, tail);
      out.planner_ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
      return out;
    }
    out.actions = std::make_shared<const RecomputePlan>(std::move(made));
    if (settled) store_plan(*profile, out, graph.start_bytes);
  } else if (!out.reused) {
    // 4. No budget: the plan is liveness alone, simulated for the arena's placement (on a
    // CUDA pool, without an arena, execution needs no plan at all).
    if (request.arena) made = simulate_step(out.graph, PlannerOptions(0, PlannerTuning{}));
    out.actions = std::make_shared<const RecomputePlan>(std::move(made));
    if (settled && request.arena) store_plan(*profile, out, graph.start_bytes);
  }

  // 5. The arena placement of the plan that runs.
  if (request.arena) {
    out.arena = arena_for(*profile, out.order, out.graph, out.actions->actions, request.arena_bytes,
                          settled, fit ? &fit->arena : nullptr);
    if (request.budget > 0 && out.fitted_for > 0)
      out.planned_reserve = request.pool.reserved(*out.arena);
  }
  out.planner_ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
  return out;
}

void record_kernel_times(const StepPlan& plan, const std::vector<double>& seconds) {
  if (!plan.profile) return;
  std::lock_guard<std::mutex> lock(plan.profile->mutex);
  StepProfile& p = plan.profile->profile;
  if (p.seconds.size() != seconds.size()) p.seconds.assign(seconds.size(), -1.0), p.measured = 0;
  if (p.measured >= kTimedSteps) return;
  for (size_t i = 0; i < seconds.size(); ++i) {
    if (seconds[i] < 0) continue;
    double& best = p.seconds[static_cast<size_t>(plan.perm[i])];
    best = best < 0 ? seconds[i] : std::min(best, seconds[i]);
  }
  for (double& t : p.seconds) t = std::max(t, 1e-7);
  ++p.measured;
}

}  // namespace kiln::memory
