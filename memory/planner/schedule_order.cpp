#include "schedule_order.h"

#include <algorithm>
#include <deque>
#include <iterator>
#include <set>

namespace kiln::memory {
namespace {

// Kernel dependencies: successors, predecessor counts, and each value's readers.
struct Dependencies {
  std::vector<std::vector<int>> successors;
  std::vector<int> predecessors;
  std::vector<std::vector<int>> readers;
};

Dependencies dependencies(const StepGraph& g) {
  Dependencies d;
  const size_t nk = g.kernels.size();
  d.successors.resize(nk);
  d.predecessors.assign(nk, 0);
  d.readers.resize(g.values.size());
  std::vector<int> last_pred(nk, -1);
  for (size_t k = 0; k < nk; ++k) {
    for (int in : g.kernels[k].inputs) {
      d.readers[static_cast<size_t>(in)].push_back(static_cast<int>(k));
      const int p = g.values[static_cast<size_t>(in)].producer;
      if (p < 0 || last_pred[static_cast<size_t>(p)] == static_cast<int>(k)) continue;
      last_pred[static_cast<size_t>(p)] = static_cast<int>(k);
      d.successors[static_cast<size_t>(p)].push_back(static_cast<int>(k));
      ++d.predecessors[k];
    }
  }
  return d;
}

bool releasable(const PlanValue& v) { return !v.output && (v.producer >= 0 || v.releasable_leaf); }

std::vector<int> breadth_first(const StepGraph& g, size_t movable) {
  Dependencies d = dependencies(g);
  std::deque<int> ready;
  std::vector<int> order;
  order.reserve(g.kernels.size());
  for (size_t k = 0; k < movable; ++k)
    if (d.predecessors[k] == 0) ready.push_back(static_cast<int>(k));
  while (!ready.empty()) {
    const int k = ready.front();
    ready.pop_front();
    order.push_back(k);
    for (int s : d.successors[static_cast<size_t>(k)])
      if (static_cast<size_t>(s) < movable && --d.predecessors[static_cast<size_t>(s)] == 0)
        ready.push_back(s);
  }
  return order;
}

// List scheduling over the ready kernels. `eager`: the given order, except that a ready
// kernel freeing at least what it allocates runs first; otherwise the kernel with the
// largest net free runs next. Ties go to the given order.
std::vector<int> by_frees(const StepGraph& g, size_t movable, bool eager) {
  Dependencies d = dependencies(g);
  const size_t nk = g.kernels.size();
  std::vector<int> remaining(g.values.size());
  for (size_t v = 0; v < g.values.size(); ++v) remaining[v] = static_cast<int>(d.readers[v].size());
  auto net_free = [&](int k) {
    const PlanKernel& pk = g.kernels[static_cast<size_t>(k)];
    long long freed = 0;
    for (int in : pk.inputs) {
      const PlanValue& v = g.values[static_cast<size_t>(in)];
      if (remaining[static_cast<size_t>(in)] == 1 && releasable(v))
        freed += static_cast<long long>(v.bytes);
    }
    return freed - static_cast<long long>(g.values[static_cast<size_t>(pk.output)].bytes);
  };
  std::set<std::pair<long long, int>> by_key;  // (-net free, kernel)
  std::set<int> by_index;
  std::vector<long long> key(nk, 0);
  std::vector<char> state(nk, 0);  // 1 ready, 2 placed
  auto add = [&](int k) {
    key[static_cast<size_t>(k)] = -net_free(k);
    by_key.insert({key[static_cast<size_t>(k)], k});
    by_index.insert(k);
    state[static_cast<size_t>(k)] = 1;
  };
  auto remove = [&](int k) {
    by_key.erase({key[static_cast<size_t>(k)], k});
    by_index.erase(k);
  };
  for (size_t k = 0; k < movable; ++k)
    if (d.predecessors[k] == 0) add(static_cast<int>(k));
  std::vector<int> order;
  order.reserve(nk);
  while (!by_key.empty()) {
    int k = by_key.begin()->second;
    if (eager && by_key.begin()->first > 0) k = *by_index.begin();
    remove(k);
    state[static_cast<size_t>(k)] = 2;
    order.push_back(k);
    for (int in : g.kernels[static_cast<size_t>(k)].inputs) {
      // The last reader left now frees the value: its score changes.
      if (--remaining[static_cast<size_t>(in)] != 1) continue;
      for (int r : d.readers[static_cast<size_t>(in)])
        if (state[static_cast<size_t>(r)] == 1) remove(r), add(r);
    }
    for (int s : d.successors[static_cast<size_t>(k)])
      if (static_cast<size_t>(s) < movable && --d.predecessors[static_cast<size_t>(s)] == 0) add(s);
  }
  return order;
}

}  // namespace

const char* order_name(ScheduleOrder order) {
  switch (order) {
    case ScheduleOrder::Given:
      return "given";
    case ScheduleOrder::Eager:
      return "eager";
    case ScheduleOrder::Frees:
      return "frees";
    case ScheduleOrder::Breadth:
      return "breadth";
  }
  return "?";
}

const std::vector<ScheduleOrder>& all_orders() {
  static const std::vector<ScheduleOrder> orders{ScheduleOrder::Given, ScheduleOrder::Eager,
                                                 ScheduleOrder::Frees, ScheduleOrder::Breadth};
  return orders;
}

std::vector<int> schedule_order(const StepGraph& graph, ScheduleOrder order, size_t fixed_tail) {
  const size_t nk = graph.kernels.size();
  const size_t movable = nk - std::min(fixed_tail, nk);
  std::vector<int> perm;
  switch (order) {
    case ScheduleOrder::Given:
      for (size_t k = 0; k < movable; ++k) perm.push_back(static_cast<int>(k));
      break;
    case ScheduleOrder::Eager:
      perm = by_frees(graph, movable, true);
      break;
    case ScheduleOrder::Frees:
      perm = by_frees(graph, movable, false);
      break;
    case ScheduleOrder::Breadth:
      perm = breadth_first(graph, movable);
      break;
  }
  for (size_t k = movable; k < nk; ++k) perm.push_back(static_cast<int>(k));
  return perm;
}

std::vector<int> inverse_permutation(const std::vector<int>& perm) {
  std::vector<int> at(perm.size(), -1);
  for (size_t i = 0; i < perm.size(); ++i) at[static_cast<size_t>(perm[i])] = static_cast<int>(i);
  return at;
}

StepGraph reorder(const StepGraph& graph, const std::vector<int>& perm) {
  StepGraph out;
  out.start_bytes = graph.start_bytes;
  out.values = graph.values;
  out.kernels.reserve(perm.size());
  for (int k : perm) out.kernels.push_back(graph.kernels[static_cast<size_t>(k)]);
  const std::vector<int> at = inverse_permutation(perm);
  for (PlanValue& v : out.values)
    if (v.producer >= 0) v.producer = at[static_cast<size_t>(v.producer)];
  return out;
}

StepGraph reorder_to_run(const StepGraph& graph, const std::vector<int>& perm) {
  StepGraph out = reorder(graph, perm);
  assign_in_place(out);
  return out;
}

OrderChoice choose_schedule_order(const StepGraph& graph, const PlannerOptions& options,
                                  size_t fixed_tail, ScheduleOrder try_first) {
  OrderChoice best;
  bool have = false;
  // try_first goes first so that its plan bounds the others; ties still go to the
  // earlier order in all_orders().
  std::vector<ScheduleOrder> orders{try_first};
  for (ScheduleOrder order : all_orders())
    if (order != try_first) orders.push_back(order);
  auto rank = [](ScheduleOrder order) {
    const auto& all = all_orders();
    return std::find(all.begin(), all.end(), order) - all.begin();
  };
  std::vector<std::vector<int>> perms;
  for (ScheduleOrder order : orders) perms.push_back(schedule_order(graph, order, fixed_tail));
  // Near the floor an order may thrash up to the extra-work cap, which costs far more than
  // planning: each order stops once it recomputes more than the best so far, and a first
  // round allows at most half a step's work again (the cap itself only when none fits).
  const double caps[] = {std::min(options.max_extra_cost, 0.5), options.max_extra_cost};
  for (double cap : caps) {
    PlannerOptions o = options;
    o.max_extra_cost = cap;
    for (size_t i = 0; i < perms.size(); ++i) {
      RecomputePlan plan = simulate_step(reorder(graph, perms[i]), o);
      bool better;
      if (!have) {
        better = true;
      } else if (plan.feasible != best.plan.feasible) {
        better = plan.feasible;
      } else if (!plan.feasible) {
        better = false;  // neither fits: the given order's failure is the one to report
      } else if (options.budget > 0) {
        better = plan.extra_cost < best.plan.extra_cost ||
                 (plan.extra_cost == best.plan.extra_cost &&
                  (plan.peak < best.plan.peak ||
                   (plan.peak == best.plan.peak && rank(orders[i]) < rank(best.order))));
      } else {
        better = plan.peak < best.plan.peak ||
                 (plan.peak == best.plan.peak && rank(orders[i]) < rank(best.order));
      }
      if (better) best = {orders[i], perms[i], std::move(plan)}, have = true;
      if (options.budget > 0 && best.plan.feasible && best.plan.base_cost > 0)
        o.max_extra_cost = std::min(o.max_extra_cost, best.plan.extra_cost / best.plan.base_cost);
    }
    if (best.plan.feasible || options.budget == 0 || cap >= options.max_extra_cost) break;
    have = false;
  }
  return best;
}

OrderChoice race_schedule_orders(const StepGraph& graph, const PlannerOptions& options,
                                 size_t fixed_tail, size_t work_per_kernel) {
  PlannerOptions limited = options;
  limited.max_work = std::max<size_t>(work_per_kernel * graph.kernels.size(), 1);
  // How far a plan got: the kernels it ran (all of them when it finished).
  auto reached = [](const RecomputePlan& plan) {
    return std::count_if(plan.actions.begin(), plan.actions.end(),
                         [](const PlanAction& a) { return a.kind == PlanAction::Kind::Run; });
  };
  OrderChoice best;
  bool have = false;
  for (ScheduleOrder order : all_orders()) {
    std::vector<int> perm = schedule_order(graph, order, fixed_tail);
    RecomputePlan plan =
        simulate_step(order == ScheduleOrder::Given ? graph : reorder_to_run(graph, perm), limited);
    bool better;
    if (!have) {
      better = true;
    } else if (plan.feasible != best.plan.feasible) {
      better = plan.feasible;
    } else if (plan.feasible) {  // as choose_schedule_order; ties to the earlier order
      better = options.budget > 0
                   ? plan.extra_cost < best.plan.extra_cost ||
                         (plan.extra_cost == best.plan.extra_cost && plan.peak < best.plan.peak)
                   : plan.peak < best.plan.peak;
    } else {
      const auto a = reached(plan), b = reached(best.plan);
      better = a > b || (a == b && plan.extra_cost < best.plan.extra_cost);
    }
    if (better) best = {order, std::move(perm), std::move(plan)}, have = true;
    // A finished plan bounds the others' recomputation, as in choose_schedule_order.
    if (options.budget > 0 && best.plan.feasible && best.plan.base_cost > 0)
      limited.max_extra_cost =
          std::min(limited.max_extra_cost, best.plan.extra_cost / best.plan.base_cost);
  }
  return best;
}

}  // namespace kiln::memory
