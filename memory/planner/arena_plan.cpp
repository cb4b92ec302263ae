#include "arena_plan.h"

#include <algorithm>
#include <limits>

namespace kiln::memory {
namespace {

constexpr int kKept = std::numeric_limits<int>::max();  // never freed: kept past the step

// One piece of arena memory: the value one run writes, and the in-place runs that take
// it over, alive from action `start` to action `end` (both included).
struct Slot {
  size_t bytes = 0;
  int start = 0;
  int end = kKept;
  int kernel = -1, run = -1;  // the run that allocates it
};

// Slots placed so far, by offset, as columns: finding a new slot's gap reads only the
// offsets and lifetimes.
struct PlacedSlots {
  std::vector<size_t> at, bytes;
  std::vector<int> start, end;

  void insert(size_t offset, const Slot& s) {
    const auto pos = std::lower_bound(at.begin(), at.end(), offset) - at.begin();
    at.insert(at.begin() + pos, offset);
    bytes.insert(bytes.begin() + pos, s.bytes);
    start.insert(start.begin() + pos, s.start);
    end.insert(end.begin() + pos, s.end);
  }

  // The smallest gap between the placed slots alive with `s` that `s` fits, else the top of
  // them. `alive` is scratch: the slots alive with `s` are collected in one branch-free pass
  // over the lifetimes first.
  size_t gap_for(const Slot& s, std::vector<uint32_t>& alive) const {
    const size_t n = at.size();
    if (alive.size() < n) alive.resize(n);
    size_t m = 0;
    for (size_t j = 0; j < n; ++j) {
      alive[m] = static_cast<uint32_t>(j);
      m += static_cast<size_t>((end[j] >= s.start) & (start[j] <= s.end));
    }
    size_t best = std::numeric_limits<size_t>::max(), best_gap = best, top = 0;
    for (size_t a = 0; a < m; ++a) {
      const size_t o = at[alive[a]];
      if (o >= top && o - top >= s.bytes && o - top < best_gap) best = top, best_gap = o - top;
      top = std::max(top, o + bytes[alive[a]]);
    }
    return best != std::numeric_limits<size_t>::max() ? best : top;
  }
};

// Places `order`'s slots one by one, each in the smallest gap between the slots placed
// before it that are alive at the same time, else above them all; returns the arena's size.
// Scanning every placed slot for each new one is quadratic (most of placing an LSTM step of
// thousands of rebuilds), so the placed slots are also kept per stretch of time: a slot that
// lies within one stretch only needs the slots that touch it, in the same offset order.
size_t place(const std::vector<Slot>& slots, const std::vector<int>& order,
             std::vector<int64_t>& offset) {
  constexpr int kStretches = 64;
  int horizon = 1;
  for (int i : order) horizon = std::max(horizon, slots[static_cast<size_t>(i)].end + 1);
  const int width = (horizon + kStretches - 1) / kStretches;
  PlacedSlots all;
  std::vector<PlacedSlots> stretch(kStretches);
  std::vector<uint32_t> alive;
  size_t size = 0;
  for (int i : order) {
    const Slot& s = slots[static_cast<size_t>(i)];
    const int first = s.start / width, last = s.end / width;
    const size_t at = (first == last ? stretch[static_cast<size_t>(first)] : all).gap_for(s, alive);
    offset[static_cast<size_t>(i)] = static_cast<int64_t>(at);
    size = std::max(size, at + s.bytes);
    all.insert(at, s);
    for (int t = first; t <= last; ++t) stretch[static_cast<size_t>(t)].insert(at, s);
  }
  return size;
}

// How place_skyline chooses among the values that fit the lowest stretch of time.
enum class SkylineRule { Largest, Longest, Area, Edge };

// Places `ids`' slots as a skyline (the best-fit heuristic of two-dimensional strip packing,
// with time as the fixed axis): the lowest stretch of the skyline takes, of the values alive
// only within it, the one `rule` prefers, on top of what is below; when none fits, the
// stretch rises to its lower neighbour and the bytes between are lost. Greedy by size
// scatters the many short lifetimes of a planned step (rebuilds between long-lived
// values) and leaves gaps nothing fits; filling the lowest stretch first keeps the top
// flat. Returns the arena's size.
size_t place_skyline(const std::vector<Slot>& slots, std::vector<int> ids, int horizon,
                     SkylineRule rule, std::vector<int64_t>& offset) {
  struct Stretch {
    int from, to;  // actions, both included
    size_t height;
  };
  std::vector<Stretch> sky{{0, horizon - 1, 0}};
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) {
    return slots[static_cast<size_t>(a)].start < slots[static_cast<size_t>(b)].start;
  });
  // The values by start, copied side by side, and for each position the next one not yet
  // placed (path-halving union-find): each stretch scans the values that start in it, and
  // on an LSTM step most of those were placed long before.
  struct Candidate {
    int start, end;
    size_t bytes;
  };
  std::vector<Candidate> by_start;
  by_start.reserve(ids.size());
  for (int i : ids) {
    const Slot& s = slots[static_cast<size_t>(i)];
    by_start.push_back({s.start, s.end, s.bytes});
  }
  std::vector<size_t> next_left(ids.size() + 1);
  for (size_t i = 0; i < next_left.size(); ++i) next_left[i] = i;
  auto first_left = [&](size_t i) {
    while (next_left[i] != i) i = next_left[i] = next_left[next_left[i]];
    return i;
  };
  size_t left = ids.size(), size = 0;
  auto score = [&](const Candidate& s, const Stretch& at) {
    const auto span = static_cast<double>(s.end - s.start + 1);
    const auto bytes = static_cast<double>(s.bytes);
    switch (rule) {
      case SkylineRule::Largest:
        return bytes * 1e7 + span;
      case SkylineRule::Longest:
        return span * 1e13 + bytes;
      case SkylineRule::Area:
        return bytes * span;
      case SkylineRule::Edge:
        break;
    }
    // A value that starts or ends with the stretch leaves one piece of it, not two.
    return static_cast<double>(s.start == at.from || s.end == at.to) * 1e30 + bytes * 1e7 + span;
  };
  while (left > 0) {
    size_t low = 0;
    for (size_t i = 1; i < sky.size(); ++i)
      if (sky[i].height < sky[low].height) low = i;
    const Stretch at = sky[low];
    size_t best_at = 0;
    int best = -1;
    double best_score = -1;
    const auto from = static_cast<size_t>(
        std::lower_bound(by_start.begin(), by_start.end(), at.from,
                         [](const Candidate& c, int f) { return c.start < f; }) -
        by_start.begin());
    for (size_t k = first_left(from); k < by_start.size() && by_start[k].start <= at.to;
         k = first_left(k + 1)) {
      const Candidate& c = by_start[k];
      if (c.end > at.to) continue;
      if (const double sc = score(c, at); sc > best_score)
        best_score = sc, best = ids[k], best_at = k;
    }
    size_t changed = 1;  // stretches from `low` on that changed
    if (best < 0) {
      // Nothing fits: raise the stretch to its lower neighbour (one exists: every value
      // fits the whole step, so the lowest stretch is never alone while values are left).
      size_t to = std::numeric_limits<size_t>::max();
      if (low > 0) to = sky[low - 1].height;
      if (low + 1 < sky.size()) to = std::min(to, sky[low + 1].height);
      sky[low].height = to;
    } else {
      const Slot& s = slots[static_cast<size_t>(best)];
      next_left[best_at] = best_at + 1;
      --left;
      offset[static_cast<size_t>(best)] = static_cast<int64_t>(at.height);
      size = std::max(size, at.height + s.bytes);
      std::vector<Stretch> parts;
      if (s.start > at.from) parts.push_back({at.from, s.start - 1, at.height});
      parts.push_back({s.start, s.end, at.height + s.bytes});
      if (s.end < at.to) parts.push_back({s.end + 1, at.to, at.height});
      sky.erase(sky.begin() + static_cast<std::ptrdiff_t>(low));
      sky.insert(sky.begin() + static_cast<std::ptrdiff_t>(low), parts.begin(), parts.end());
      changed = parts.size();
    }
    // Neighbours of equal height are one stretch. Only the changed stretches and their
    // neighbours can be: merging there alone keeps a step with thousands of stretches from
    // copying all of them on every value placed.
    const size_t from_i = low > 0 ? low - 1 : 0;
    const size_t to_i = std::min(sky.size(), low + changed + 1);
    size_t kept = from_i;
    for (size_t i = from_i; i < to_i; ++i) {
      if (kept > from_i && sky[kept - 1].height == sky[i].height)
        sky[kept - 1].to = sky[i].to;
      else
        sky[kept++] = sky[i];
    }
    sky.erase(sky.begin() + static_cast<std::ptrdiff_t>(kept),
              sky.begin() + static_cast<std::ptrdiff_t>(to_i));
  }
  return size;
}

// Places `ids`' slots at the offsets `hint` gives their runs; returns the arena's size, or
// the largest size_t when a run has no offset there or two slots alive together overlap.
size_t place_as_hinted(const std::vector<Slot>& slots, std::vector<int> ids,
                       const std::vector<std::vector<int64_t>>& hint,
                       std::vector<int64_t>& offset) {
  constexpr size_t kInvalid = std::numeric_limits<size_t>::max();
  size_t size = 0;
  for (int i : ids) {
    const Slot& s = slots[static_cast<size_t>(i)];
    if (static_cast<size_t>(s.kernel) >= hint.size() ||
        static_cast<size_t>(s.run) >= hint[static_cast<size_t>(s.kernel)].size())
      return kInvalid;
    const int64_t at = hint[static_cast<size_t>(s.kernel)][static_cast<size_t>(s.run)];
    if (at < 0) return kInvalid;
    offset[static_cast<size_t>(i)] = at;
    size = std::max(size, static_cast<size_t>(at) + s.bytes);
  }
  // Sweep by start: each slot against those started before it and still alive.
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) {
    return slots[static_cast<size_t>(a)].start < slots[static_cast<size_t>(b)].start;
  });
  std::vector<int> alive;
  for (int i : ids) {
    const Slot& s = slots[static_cast<size_t>(i)];
    const int64_t lo = offset[static_cast<size_t>(i)], hi = lo + static_cast<int64_t>(s.bytes);
    size_t kept = 0;
    for (int j : alive) {
      const Slot& o = slots[static_cast<size_t>(j)];
      if (o.end < s.start) continue;
      alive[kept++] = j;
      const int64_t olo = offset[static_cast<size_t>(j)];
      if (olo < hi && lo < olo + static_cast<int64_t>(o.bytes)) return kInvalid;
    }
    alive.resize(kept);
    alive.push_back(i);
  }
  return size;
}

// Refinement (plan_arena with `refine`): moves of one value to an earlier place in the
// placement order. Each try places every value again, so the tries are bounded by work:
// about 200 on a Transformer step's ~450 values, one to three on an LSTM's thousands.
constexpr double kRefineWork = 4e7;  // Σ values² over the tries
constexpr int kRefineMoves = 1000;

uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The arena's pieces of memory as a plan's actions use them.
struct Layout {
  std::vector<Slot> slots;
  std::vector<int> made;   // per action: the slot its run allocates, or -1
  std::vector<int> ended;  // per action: the slot its free or eviction ends, or -1
  size_t outside_peak = 0;
};

Layout lay_out(const StepGraph& graph, const std::vector<PlanAction>& actions,
               const std::vector<size_t>& bytes) {
  Layout l;
  l.made.assign(actions.size(), -1);
  l.ended.assign(actions.size(), -1);
  std::vector<int> holds(graph.values.size(), -1);  // the slot of each value's current copy
  std::vector<int> runs(graph.kernels.size(), 0);
  for (size_t t = 0; t < actions.size(); ++t) {
    const PlanAction& a = actions[t];
    const int now = static_cast<int>(t);
    if (a.kind == PlanAction::Kind::Run || a.kind == PlanAction::Kind::Recompute) {
      const PlanKernel& k = graph.kernels[static_cast<size_t>(a.id)];
      const int run = runs[static_cast<size_t>(a.id)]++;
      const auto out = static_cast<size_t>(k.output);
      if (a.in_place && k.in_place_input >= 0) {
        // The output takes over its input's memory, whichever it is.
        int& donor = holds[static_cast<size_t>(k.in_place_input)];
        holds[out] = donor;
        donor = -1;
        continue;
      }
      if (bytes[out] == 0) {
        holds[out] = -1;
        continue;
      }
      Slot s;
      s.bytes = bytes[out];
      s.start = now;
      s.kernel = a.id;
      s.run = run;
      holds[out] = static_cast<int>(l.slots.size());
      l.made[t] = holds[out];
      l.slots.push_back(s);
    } else {
      int& slot = holds[static_cast<size_t>(a.id)];
      if (slot >= 0) l.slots[static_cast<size_t>(slot)].end = now, l.ended[t] = slot;
      slot = -1;
    }
  }
  // The bytes held outside the arena (leaves, values kept past the step, in the plan's
  // sizes): the pool keeps those blocks beside the arena.
  std::vector<char> inside(graph.values.size(), 0);
  size_t outside = graph.start_bytes;
  l.outside_peak = outside;
  for (size_t t = 0; t < actions.size(); ++t) {
    const PlanAction& a = actions[t];
    if (a.kind == PlanAction::Kind::Run || a.kind == PlanAction::Kind::Recompute) {
      const PlanKernel& k = graph.kernels[static_cast<size_t>(a.id)];
      const auto out = static_cast<size_t>(k.output);
      if (a.in_place && k.in_place_input >= 0) {
        char& donor = inside[static_cast<size_t>(k.in_place_input)];
        inside[out] = donor;
        donor = 0;
        continue;
      }
      const int slot = l.made[t];
      inside[out] = slot >= 0 && l.slots[static_cast<size_t>(slot)].end != kKept;
      if (!inside[out]) outside += graph.values[out].bytes;
    } else {
      char& in = inside[static_cast<size_t>(a.id)];
      if (!in) outside -= std::min(outside, graph.values[static_cast<size_t>(a.id)].bytes);
      in = 0;
    }
    l.outside_peak = std::max(l.outside_peak, outside);
  }
  return l;
}

}  // namespace

int64_t ArenaPlan::offset(int k, int run) const {
  if (k < 0 || static_cast<size_t>(k) >= offsets.size()) return -1;
  const auto& runs = offsets[static_cast<size_t>(k)];
  return run >= 0 && static_cast<size_t>(run) < runs.size() ? runs[static_cast<size_t>(run)] : -1;
}

ArenaPlan plan_arena(const StepGraph& graph, const std::vector<PlanAction>& actions,
                     const std::vector<size_t>& bytes, bool refine,
                     const std::vector<std::vector<int64_t>>* hint) {
  ArenaPlan plan;
  plan.offsets.resize(graph.kernels.size());
  for (const PlanAction& a : actions) {
    if (a.kind != PlanAction::Kind::Run && a.kind != PlanAction::Kind::Recompute) continue;
    plan.offsets[static_cast<size_t>(a.id)].push_back(-1);
    plan.runs.push_back(a.id);
  }
  Layout layout = lay_out(graph, actions, bytes);
  plan.outside_peak = layout.outside_peak;
  const std::vector<Slot>& slots = layout.slots;

  std::vector<int> freed;  // slots kept past the step stay out of the arena
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i].end != kKept) freed.push_back(static_cast<int>(i));
  auto span = [&](int i) {
    return static_cast<size_t>(slots[static_cast<size_t>(i)].end -
                               slots[static_cast<size_t>(i)].start) +
           1;
  };
  auto bytes_of = [&](int i) { return slots[static_cast<size_t>(i)].bytes; };
  // Greedy by size: largest first, ties longest first (long-lived values settle low and
  // short ones fill the gaps above them). One order: the skyline and the refinement below
  // vary the placement, and other greedy orders beside them did not pay
  // (docs/benchmarks.md, "Memory planning as one stage, replayed").
  std::vector<int> by_size = freed;
  std::stable_sort(by_size.begin(), by_size.end(), [&](int a, int b) {
    return bytes_of(a) != bytes_of(b) ? bytes_of(a) > bytes_of(b) : span(a) > span(b);
  });
  // The bytes alive at once: no placement needs less.
  std::vector<int64_t> delta(actions.size() + 1, 0);
  for (int i : freed) {
    const Slot& s = slots[static_cast<size_t>(i)];
    delta[static_cast<size_t>(s.start)] += static_cast<int64_t>(s.bytes);
    delta[static_cast<size_t>(s.end) + 1] -= static_cast<int64_t>(s.bytes);
  }
  int64_t live = 0;
  for (int64_t d : delta) plan.live_peak = std::max(plan.live_peak, static_cast<size_t>(live += d));

  std::vector<int64_t> offset(slots.size(), -1);
  size_t best_bytes = place(slots, by_size, offset);
  std::vector<int64_t> best_offsets = offset;
  const size_t best_order_bytes = best_bytes;
  // The skyline rules: none is best on every step either, nor is greedy by size.
  for (SkylineRule rule :
       {SkylineRule::Largest, SkylineRule::Longest, SkylineRule::Area, SkylineRule::Edge}) {
    if (freed.empty() || best_bytes <= plan.live_peak) break;
    const size_t bytes =
        place_skyline(slots, freed, static_cast<int>(actions.size()), rule, offset);
    if (bytes < best_bytes) best_bytes = bytes, best_offsets = offset;
  }
  if (hint != nullptr && !freed.empty() && best_bytes > plan.live_peak) {
    const size_t bytes = place_as_hinted(slots, freed, *hint, offset);
    if (bytes < best_bytes) best_bytes = bytes, best_offsets = offset;
  }
  if (refine && best_bytes > plan.live_peak && freed.size() > 2) {
    // Hill climbing from the greedy order, sideways moves included (the arena's size is flat
    // over most moves). A fixed seed: the same plan always gets the same placement.
    const auto n = static_cast<double>(freed.size());
    const int moves = static_cast<int>(std::min<double>(kRefineMoves, kRefineWork / (n * n)));
    uint64_t state = 0x6b696c6e;
    std::vector<int> current = by_size;
    size_t current_bytes = best_order_bytes;
    for (int m = 0; m < moves && best_bytes > plan.live_peak; ++m) {
      std::vector<int> next = current;
      const size_t from = next_random(state) % next.size();
      const size_t to = next_random(state) % (from + 1);
      std::rotate(next.begin() + static_cast<std::ptrdiff_t>(to),
                  next.begin() + static_cast<std::ptrdiff_t>(from),
                  next.begin() + static_cast<std::ptrdiff_t>(from) + 1);
      const size_t bytes = place(slots, next, offset);
      if (bytes > current_bytes) continue;
      current = std::move(next);
      current_bytes = bytes;
      if (bytes < best_bytes) best_bytes = bytes, best_offsets = offset;
    }
  }
  for (int i : freed) {
    const Slot& s = slots[static_cast<size_t>(i)];
    plan.offsets[static_cast<size_t>(s.kernel)][static_cast<size_t>(s.run)] =
        best_offsets[static_cast<size_t>(i)];
    ++plan.values;
  }
  plan.bytes = freed.empty() ? 0 : best_bytes;
  return plan;
}

std::vector<ChosenEviction> evictions_past_gaps(const StepGraph& graph, const RecomputePlan& plan,
                                                const ArenaPlan& arena,
                                                const std::vector<size_t>& bytes) {
  Layout layout = lay_out(graph, plan.actions, bytes);
  std::vector<Slot>& slots = layout.slots;
  std::vector<int64_t> offset(slots.size(), -1);
  for (size_t i = 0; i < slots.size(); ++i) offset[i] = arena.offset(slots[i].kernel, slots[i].run);
  std::vector<char> dropped(slots.size(), 0), kept_on(plan.actions.size(), 0);
  for (const ChosenEviction& e : plan.chosen) {
    const auto at = static_cast<size_t>(e.action);
    if (at >= plan.actions.size() || layout.ended[at] < 0) continue;
    const int held = layout.ended[at];
    Slot& s = slots[static_cast<size_t>(held)];
    if (offset[static_cast<size_t>(held)] < 0) continue;
    // The rebuild of the evicted value: the next run of its producer.
    const int producer = graph.values[static_cast<size_t>(e.value)].producer;
    size_t r = at + 1;
    while (r < plan.actions.size() &&
           !(plan.actions[r].kind == PlanAction::Kind::Recompute && plan.actions[r].id == producer))
      ++r;
    if (r == plan.actions.size() || layout.made[r] < 0) continue;
    const int copy = layout.made[r];
    const Slot& c = slots[static_cast<size_t>(copy)];
    if (c.end == kKept || c.bytes != s.bytes) continue;
    // Kept in its place from the eviction until the copy's end: nothing else may be there
    // in that time (the copy itself goes).
    const int64_t lo = offset[static_cast<size_t>(held)];
    const int64_t hi = lo + static_cast<int64_t>(s.bytes);
    bool free = true;
    for (size_t j = 0; j < slots.size() && free; ++j) {
      const Slot& o = slots[j];
      if (static_cast<int>(j) == held || static_cast<int>(j) == copy || dropped[j] ||
          offset[j] < 0 || o.end <= s.end || o.start > c.end)
        continue;
      free = offset[j] + static_cast<int64_t>(o.bytes) <= lo || hi <= offset[j];
    }
    if (!free) continue;
    s.end = c.end;
    dropped[static_cast<size_t>(copy)] = 1;
    kept_on[at] = 1;
    // A later eviction of the copy now ends this slot.
    for (size_t t = r; t < plan.actions.size(); ++t)
      if (layout.ended[t] == copy) layout.ended[t] = held;
  }
  std::vector<ChosenEviction> needed;
  for (const ChosenEviction& e : plan.chosen)
    if (!(static_cast<size_t>(e.action) < kept_on.size() && kept_on[static_cast<size_t>(e.action)]))
      needed.push_back(e);
  return needed;
}

}  // namespace kiln::memory
