#include "memory/planner/work_floor.h"

#include <algorithm>
#include <vector>

namespace kiln::memory {

WorkFloor extra_work_floor(const StepGraph& graph, size_t budget) {
  const size_t n_kernels = graph.kernels.size();
  const size_t n_values = graph.values.size();
  WorkFloor floor;
  for (const PlanKernel& k : graph.kernels) floor.base_cost += k.cost;

  std::vector<std::vector<int>> readers(n_values);
  for (size_t k = 0; k < n_kernels; ++k)
    for (int v : graph.kernels[k].inputs)
      readers[static_cast<size_t>(v)].push_back(static_cast<int>(k));
  // A value some reader can compute inside itself (InlineInput) may be rebuilt there at the
  // smallest such share of its kernel's cost: the least a rebuild of it can cost.
  std::vector<double> cheapest(n_values, 1.0);
  for (const PlanKernel& k : graph.kernels)
    for (const InlineInput& f : k.inline_inputs)
      cheapest[static_cast<size_t>(f.value)] =
          std::min(cheapest[static_cast<size_t>(f.value)], f.share);
  // Allocated when the step starts and never released: all but the releasable leaves.
  size_t always = graph.start_bytes;
  for (const PlanValue& v : graph.values)
    if (v.producer < 0 && v.releasable_leaf) always -= std::min(always, v.bytes);

  // Generation marks, so that each kernel's walks need no clearing.
  std::vector<uint32_t> ancestor(n_kernels, 0), descendant(n_kernels, 0), forced(n_values, 0);
  std::vector<int> stack;
  std::vector<uint32_t> crossing(n_values, 0), share_mark(n_values, 0);
  std::vector<int> sharers(n_values, 0);  // candidates whose kernel reads a value, per value
  std::vector<int> candidates;
  struct Item {
    double cost;
    double bytes;
  };
  std::vector<Item> items, gone;
  for (size_t d = 0; d < n_kernels; ++d) {
    const uint32_t mark = static_cast<uint32_t>(d) + 1;
    const PlanKernel& kd = graph.kernels[d];
    // Ancestors: producers of d's inputs, transitively.
    for (int v : kd.inputs) stack.push_back(graph.values[static_cast<size_t>(v)].producer);
    while (!stack.empty()) {
      const int p = stack.back();
      stack.pop_back();
      if (p < 0 || ancestor[static_cast<size_t>(p)] == mark) continue;
      ancestor[static_cast<size_t>(p)] = mark;
      for (int v : graph.kernels[static_cast<size_t>(p)].inputs)
        stack.push_back(graph.values[static_cast<size_t>(v)].producer);
    }
    // Descendants: readers of d's output, transitively.
    if (kd.output >= 0)
      for (int r : readers[static_cast<size_t>(kd.output)]) stack.push_back(r);
    while (!stack.empty()) {
      const int r = stack.back();
      stack.pop_back();
      if (descendant[static_cast<size_t>(r)] == mark) continue;
      descendant[static_cast<size_t>(r)] = mark;
      const int out = graph.kernels[static_cast<size_t>(r)].output;
      if (out >= 0)
        for (int next : readers[static_cast<size_t>(out)]) stack.push_back(next);
    }

    // What must be resident while d runs: its inputs, its output (unless it may take over
    // an input's buffer), the leaves that stay or are read later, and the results made.
    size_t must = always;
    auto force = [&](int v) {
      if (forced[static_cast<size_t>(v)] == mark) return;
      forced[static_cast<size_t>(v)] = mark;
      crossing[static_cast<size_t>(v)] = mark;
      const PlanValue& pv = graph.values[static_cast<size_t>(v)];
      if (pv.producer >= 0 || pv.releasable_leaf) must += pv.bytes;
    };
    // An input d can compute itself need not be resident: it is a candidate like any
    // value crossing d, rebuilt (inside d) at its share.
    for (int v : kd.inputs)
      if (std::none_of(kd.inline_inputs.begin(), kd.inline_inputs.end(),
                       [&](const InlineInput& f) { return f.value == v; }))
        force(v);
    if (kd.output >= 0 && kd.in_place_input < 0) force(kd.output);
    candidates.clear();
    size_t candidate_bytes = 0;
    for (size_t v = 0; v < n_values; ++v) {
      const PlanValue& pv = graph.values[v];
      if (pv.bytes == 0 || forced[v] == mark) continue;
      bool read_later = false;
      for (int r : readers[v])
        if (r == static_cast<int>(d) || descendant[static_cast<size_t>(r)] == mark) {
          read_later = true;
          break;
        }
      if (pv.producer < 0) {
        if (pv.releasable_leaf && read_later) force(static_cast<int>(v));
        continue;
      }
      if (ancestor[static_cast<size_t>(pv.producer)] != mark) continue;
      const PlanKernel& producer = graph.kernels[static_cast<size_t>(pv.producer)];
      if (pv.output || (read_later && !producer.recomputable)) {
        force(static_cast<int>(v));
      } else if (read_later) {
        candidates.push_back(static_cast<int>(v));
        crossing[v] = mark;
        candidate_bytes += pv.bytes;
      }
    }
    if (must > budget) {
      floor.feasible = false;
      floor.at_kernel = static_cast<int>(d);
      return floor;
    }
    if (must + candidate_bytes <= budget) continue;
    double over = static_cast<double>(must + candidate_bytes - budget);
    // Rebuilding a dropped value runs its kernel, which reads inputs of its own. One that
    // no longer exists at d (an earlier value, read only before d: a relu's input, written
    // over in place) must be kept past d or made again: its bytes or its cost, shared
    // evenly among the dropped values whose kernels read it, so that nothing is counted
    // more than once. Each way of choosing keep or rebuild per input is an item; allowing
    // several items of one value only relaxes the problem, so the floor stays a floor.
    for (int v : candidates)
      for (int u : graph.kernels[static_cast<size_t>(graph.values[static_cast<size_t>(v)].producer)]
                       .inputs) {
        if (crossing[static_cast<size_t>(u)] == mark ||
            graph.values[static_cast<size_t>(u)].producer < 0)
          continue;
        if (share_mark[static_cast<size_t>(u)] != mark) {
          share_mark[static_cast<size_t>(u)] = mark;
          sharers[static_cast<size_t>(u)] = 0;
        }
        ++sharers[static_cast<size_t>(u)];
      }
    items.clear();
    constexpr size_t kMostChoices = 4;  // 2^4 items per value at most
    for (int v : candidates) {
      const PlanValue& pv = graph.values[static_cast<size_t>(v)];
      const PlanKernel& producer = graph.kernels[static_cast<size_t>(pv.producer)];
      gone.clear();  // per input that no longer exists: its share of cost and bytes
      for (int u : producer.inputs) {
        const PlanValue& pu = graph.values[static_cast<size_t>(u)];
        if (crossing[static_cast<size_t>(u)] == mark || pu.producer < 0) continue;
        const double n = static_cast<double>(sharers[static_cast<size_t>(u)]);
        gone.push_back({graph.kernels[static_cast<size_t>(pu.producer)].cost / n,
                        static_cast<double>(pu.bytes) / n});
      }
      const double own = producer.cost * cheapest[static_cast<size_t>(v)];
      if (gone.size() > kMostChoices) {  // rebuilding costs at least its own kernel's share
        items.push_back({own, static_cast<double>(pv.bytes)});
        continue;
      }
      for (size_t keep = 0; keep < (size_t{1} << gone.size()); ++keep) {
        Item item{own, static_cast<double>(pv.bytes)};
        for (size_t i = 0; i < gone.size(); ++i) {
          if (keep >> i & 1)
            item.bytes -= gone[i].bytes;
          else
            item.cost += gone[i].cost;
        }
        if (item.bytes > 0) items.push_back(item);
      }
    }
    // Cheapest bytes first; a fraction of the last item stands for the rest.
    std::sort(items.begin(), items.end(),
              [](const Item& a, const Item& b) { return a.cost * b.bytes < b.cost * a.bytes; });
    double cost = 0;
    for (const Item& c : items) {
      if (c.bytes >= over) {
        cost += c.cost * over / c.bytes;
        over = 0;
        break;
      }
      cost += c.cost;
      over -= c.bytes;
    }
    if (cost > floor.extra_cost) {
      floor.extra_cost = cost;
      floor.at_kernel = static_cast<int>(d);
    }
  }
  return floor;
}

}  // namespace kiln::memory
