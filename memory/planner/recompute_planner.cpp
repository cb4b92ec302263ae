#include "recompute_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <tuple>

namespace kiln::memory {
namespace {

constexpr int kNever = std::numeric_limits<int>::max();
constexpr double kUnrebuildable = std::numeric_limits<double>::infinity();
// simulate_best scores every candidate only on steps up to this many kernels (an LSTM
// step's ~3,300 take 25-50 ms so).
constexpr size_t kScoreAllKernels = 10000;
// search_evictions: at most this many passes over the plan's
// evictions, and plannings until they have taken this many actions in all.
constexpr int kSearchRounds = 2;
constexpr size_t kSearchActions = 400000;

// Orders evictions by where they are made (PlannerOptions::follow's key).
bool earlier_place(const ChosenEviction& a, const ChosenEviction& b) {
  return std::tie(a.at, a.kernel, a.nth) < std::tie(b.at, b.kernel, b.nth);
}

// One planning or execution of a step. Values are resident or missing; a missing value with
// a producer can be rebuilt, a missing leaf is gone for good (it was donated after its
// last read).
class Engine {
 public:
  Engine(const StepGraph& g, const PlannerOptions& o, StepMachine* machine)
      : g_(g), o_(o), machine_(machine), rng_(o.seed | 1) {
    const size_t nv = g.values.size();
    uses_.resize(nv);
    for (size_t k = 0; k < g.kernels.size(); ++k)
      for (int v : g.kernels[k].inputs)
        uses_[static_cast<size_t>(v)].push_back(static_cast<int>(k));
    resident_.assign(nv, 0);
    lock_.assign(nv, 0);
    pos_.assign(nv, -1);
    next_.assign(nv, kNever);
    kstamp_.assign(g.kernels.size(), 0);
    horizon_.assign(nv, kNever);
    for (size_t v = 0; v < nv; ++v)
      if (g.values[v].producer < 0) resident_[v] = 1;
    // A value can only be rebuilt while everything it comes from can still be had: the
    // horizon is the earliest last read among the released leaves and the outputs of
    // non-recomputable kernels it depends on (producers run in order).
    for (const PlanKernel& k : g.kernels) {
      int h = kNever;
      for (int in : k.inputs) {
        const PlanValue& pv = g.values[static_cast<size_t>(in)];
        if (pv.producer < 0 ? pv.releasable_leaf
                            : !g.kernels[static_cast<size_t>(pv.producer)].recomputable)
          h = std::min(h, last_use(in));  // gone for good after its last read
        else if (pv.producer >= 0)
          h = std::min(h, horizon_[static_cast<size_t>(in)]);
      }
      if (k.output >= 0) horizon_[static_cast<size_t>(k.output)] = h;
    }
    cur_ = g.start_bytes;
    for (const PlanKernel& k : g.kernels) plan_.base_cost += k.cost;
    runs_here_.assign(g.kernels.size(), 0);
    if (o.follow) {
      follow_ = *o.follow;
      std::stable_sort(follow_.begin(), follow_.end(), earlier_place);
    }
    if (o.avoid) {
      avoid_ = *o.avoid;
      std::stable_sort(avoid_.begin(), avoid_.end(), earlier_place);
    }
  }

  RecomputePlan run() {
    plan_.lower_bound = lower_bound(g_);
    peak_ = usage();  // the step starts with all of it, even what it releases at once
    if (o_.budget > 0 && peak_ > o_.budget && !machine_) {
      fail("the step starts with " + std::to_string(peak_) + " bytes allocated");
      return finish();
    }
    const int nk = static_cast<int>(g_.kernels.size());
    // Leaves nothing reads can go at once.
    for (size_t v = 0; v < g_.values.size(); ++v)
      if (g_.values[v].producer < 0 && g_.values[v].releasable_leaf && uses_[v].empty() &&
          !g_.values[v].output)
        release(static_cast<int>(v), false);
    for (p_ = 0; p_ < nk; ++p_) {
      const PlanKernel& k = g_.kernels[static_cast<size_t>(p_)];
      for (int r : ran_here_) runs_here_[static_cast<size_t>(r)] = 0;
      ran_here_.clear();
      missing_.clear();
      inlined_.clear();
      inline_locks_.clear();
      for (int in : k.inputs) {
        if (resident_[static_cast<size_t>(in)])
          ++lock_[static_cast<size_t>(in)];
        else if (inline_share(k, in) >= 0 && producer_inputs_resident(in))
          inline_input(in);
        else
          missing_.push_back(in);
      }
      // rebuild() locks its target, also when an earlier rebuild already brought it back.
      for (int in : missing_) {
        if (!rebuild(in)) return finish();
        // Ancestors rebuilt only for this input go again now that it is back. Under a
        // budget they stay while there is room: the next rebuild (the backward pass walking
        // a recurrence) usually needs them again, and with nothing ahead reading them they
        // are the first values evicted when room is needed.
        if (o_.budget > 0) {
          temps_.clear();
          continue;
        }
        for (int v : temps_) {
          const PlanValue& pv = g_.values[static_cast<size_t>(v)];
          if (resident_[static_cast<size_t>(v)] && lock_[static_cast<size_t>(v)] == 0 &&
              pv.producer >= 0 && !pv.output && next_use(v, p_) == kNever)
            release(v, false);
        }
        temps_.clear();
      }
      bool in_place = false;
      if (int d = k.in_place_input; d >= 0) {
        const PlanValue& dv = g_.values[static_cast<size_t>(d)];
        in_place = resident_[static_cast<size_t>(d)] && lock_[static_cast<size_t>(d)] == 1 &&
                   !dv.output && next_use(d, p_ + 1) == kNever &&
                   (dv.producer >= 0 || dv.releasable_leaf) &&
                   dv.bytes == g_.values[static_cast<size_t>(k.output)].bytes;
      }
      if (!execute(p_, false, in_place) && !machine_) return finish();
      for (int in : k.inputs)
        if (std::find(inlined_.begin(), inlined_.end(), in) == inlined_.end())
          --lock_[static_cast<size_t>(in)];
      for (int in : inline_locks_) --lock_[static_cast<size_t>(in)];
      for (int in : k.inputs) refresh_next(in);
      for (int in : k.inputs) after_read(in);
      for (int in : inline_locks_) after_read(in);
      after_read(k.output);
    }
    return finish();
  }

 private:
  size_t usage() { return machine_ ? machine_->in_use() : cur_; }

  int last_use(int v) const {
    const auto& u = uses_[static_cast<size_t>(v)];
    return u.empty() ? -1 : u.back();
  }
  // The first read of v at or after position `from`.
  int next_use(int v, int from) const {
    const auto& u = uses_[static_cast<size_t>(v)];
    auto it = std::lower_bound(u.begin(), u.end(), from);
    return it == u.end() ? kNever : *it;
  }
  // The share of its producer's cost at which kernel `k` computes input v itself, or -1
  // when it cannot (InlineInput).
  static double inline_share(const PlanKernel& k, int v) {
    for (const InlineInput& f : k.inline_inputs)
      if (f.value == v) return f.share;
    return -1;
  }
  bool producer_inputs_resident(int v) const {
    const int producer = g_.values[static_cast<size_t>(v)].producer;
    if (producer < 0 || !g_.kernels[static_cast<size_t>(producer)].recomputable) return false;
    for (int in : g_.kernels[static_cast<size_t>(producer)].inputs)
      if (!resident_[static_cast<size_t>(in)]) return false;
    return true;
  }
  // Kernel p_ computes missing input v itself: what v's producer reads stays resident (and
  // locked) until p_ has run, and v is never allocated.
  void inline_input(int v) {
    inlined_.push_back(v);
    for (int in :
         g_.kernels[static_cast<size_t>(g_.values[static_cast<size_t>(v)].producer)].inputs) {
      ++lock_[static_cast<size_t>(in)];
      inline_locks_.push_back(in);
    }
  }
  // What rebuilding v inside its reader at `next` costs, when that reader can and what v's
  // producer reads is resident now; -1 otherwise.
  double inline_cost(int v, int next) const {
    if (next == kNever) return -1;
    const double share = inline_share(g_.kernels[static_cast<size_t>(next)], v);
    if (share < 0 || !producer_inputs_resident(v)) return -1;
    return share * g_.kernels[static_cast<size_t>(g_.values[static_cast<size_t>(v)].producer)].cost;
  }

  bool evictable(int v) const {
    const PlanValue& pv = g_.values[static_cast<size_t>(v)];
    return pv.producer >= 0 && !pv.output && pv.bytes > 0 &&
           g_.kernels[static_cast<size_t>(pv.producer)].recomputable;
  }
  // Candidates are kept twice: in a vector (random draws) and ordered by their next use
  // (the furthest ones), so that picking a victim never scans every resident value. A
  // value's next use only changes when the schedule reads it (refresh_next).
  void add_candidate(int v) {
    if (!evictable(v) || pos_[static_cast<size_t>(v)] >= 0) return;
    pos_[static_cast<size_t>(v)] = static_cast<int>(cand_.size());
    cand_.push_back(v);
    next_[static_cast<size_t>(v)] = next_use(v, p_);
    by_next_.insert({next_[static_cast<size_t>(v)], v});
  }
  void remove_candidate(int v) {
    int at = pos_[static_cast<size_t>(v)];
    if (at < 0) return;
    int last = cand_.back();
    cand_[static_cast<size_t>(at)] = last;
    pos_[static_cast<size_t>(last)] = at;
    cand_.pop_back();
    pos_[static_cast<size_t>(v)] = -1;
    by_next_.erase({next_[static_cast<size_t>(v)], v});
  }
  // Kernel p_ has read v: its next use moves on.
  void refresh_next(int v) {
    if (pos_[static_cast<size_t>(v)] < 0) return;
    const int next = next_use(v, p_ + 1);
    if (next == next_[static_cast<size_t>(v)]) return;
    by_next_.erase({next_[static_cast<size_t>(v)], v});
    next_[static_cast<size_t>(v)] = next;
    by_next_.insert({next, v});
  }

  void release(int v, bool evict) {
    resident_[static_cast<size_t>(v)] = 0;
    remove_candidate(v);
    const size_t bytes = g_.values[static_cast<size_t>(v)].bytes;
    plan_.actions.push_back({evict ? PlanAction::Kind::Evict : PlanAction::Kind::Free, v});
    if (evict) ++plan_.evictions, plan_.evicted_bytes += bytes;
    if (machine_)
      machine_->release(v, evict);
    else
      cur_ -= bytes;
  }

  // After kernel p_ read or wrote v: release it when nothing reads it again, or when it was
  // made inside a checkpoint and its next reader is outside that checkpoint.
  void after_read(int v) {
    if (v < 0 || !resident_[static_cast<size_t>(v)] || lock_[static_cast<size_t>(v)] > 0) return;
    const PlanValue& pv = g_.values[static_cast<size_t>(v)];
    if (pv.output) return;
    const int next = next_use(v, p_ + 1);
    if (pv.producer < 0) {
      if (pv.releasable_leaf && next == kNever) release(v, false);
      return;
    }
    if (next == kNever) return release(v, false);
    const PlanKernel& producer = g_.kernels[static_cast<size_t>(pv.producer)];
    const uint32_t region = producer.region;
    // Released only when something runs before that reader: rebuilding it at once would
    // gain nothing.
    if (region != 0 && !producer.region_result && next > p_ + 1 &&
        g_.kernels[static_cast<size_t>(next)].region != region &&
        next <= horizon_[static_cast<size_t>(v)] && evictable(v))
      release(v, true);
  }

  // Σ cost of the distinct kernels that rebuilding v now would run (v's producer and every
  // missing ancestor), or infinity when a missing ancestor cannot be rebuilt. The walk stops
  // once the sum passes `limit` (the candidate can no longer win) and returns that sum.
  double rebuild_cost(int v, double limit = kUnrebuildable) {
    if (++stamp_ == 0) std::fill(kstamp_.begin(), kstamp_.end(), 0), stamp_ = 1;
    double total = 0;
    stack_.clear();
    stack_.push_back(g_.values[static_cast<size_t>(v)].producer);
    while (!stack_.empty()) {
      int k = stack_.back();
      stack_.pop_back();
      if (kstamp_[static_cast<size_t>(k)] == stamp_) continue;
      kstamp_[static_cast<size_t>(k)] = stamp_;
      ++plan_.work;
      const PlanKernel& kernel = g_.kernels[static_cast<size_t>(k)];
      if (!kernel.recomputable) return kUnrebuildable;
      total += kernel.cost;
      if (total > limit) return total;
      for (int in : kernel.inputs) {
        if (resident_[static_cast<size_t>(in)]) continue;
        int producer = g_.values[static_cast<size_t>(in)].producer;
        if (producer < 0) return kUnrebuildable;
        stack_.push_back(producer);
      }
    }
    return total;
  }

  uint64_t next_random() {
    rng_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = rng_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // A candidate's bytes times the distance to its next use: the score's denominator, in
  // double so that large values far apart cannot overflow.
  double span_of(int v, int next) const {
    const double bytes = static_cast<double>(g_.values[static_cast<size_t>(v)].bytes);
    const int until = o_.pressure_end >= p_ ? std::min(next, o_.pressure_end + 1) : next;
    const double distance = static_cast<double>(until) - static_cast<double>(p_) + 1;
    return bytes * (o_.distance_power == 1.0 ? distance : std::pow(distance, o_.distance_power));
  }

  // The candidate to evict now, or -1. Only a sample is scored; when none of it can be
  // rebuilt in time, every candidate is.
  int pick() {
    int v = pick_from(true);
    return v >= 0 || !truncated_ ? v : pick_from(false);
  }

  int pick_from(bool sampled) {
    sample_.clear();
    const size_t far = static_cast<size_t>(std::max(o_.sample_furthest, 1));
    const size_t want = far + static_cast<size_t>(std::max(o_.sample_random, 0));
    truncated_ = false;
    if (sampled && cand_.size() > want) {
      // The furthest next uses, from the ordered index ...
      for (auto it = by_next_.rbegin(); it != by_next_.rend() && sample_.size() < far; ++it)
        if (lock_[static_cast<size_t>(it->second)] == 0) sample_.push_back(*it);
      // ... and random others (a value drawn twice is scored twice: harmless).
      const size_t draws = want - far;
      for (size_t i = 0; i < draws * 2 && sample_.size() < want; ++i) {
        const int v = cand_[static_cast<size_t>(next_random() % cand_.size())];
        if (lock_[static_cast<size_t>(v)] == 0)
          sample_.push_back({next_[static_cast<size_t>(v)], v});
      }
      truncated_ = true;
    } else {
      for (int v : cand_)
        if (lock_[static_cast<size_t>(v)] == 0)
          sample_.push_back({next_[static_cast<size_t>(v)], v});
    }
    // Score in the order of a lower bound (the producer's own cost): the first walks set a
    // tight limit, later ones stop as soon as they pass it, and once the bound alone loses
    // nothing further can win. Walking every long recurrence chain in full cost more than
    // planning everything else.
    ranked_.clear();
    for (auto [next, v] : sample_) {
      if (next != kNever && next > horizon_[static_cast<size_t>(v)]) continue;
      const double span = span_of(v, next);
      double own = g_.kernels[static_cast<size_t>(g_.values[static_cast<size_t>(v)].producer)].cost;
      // A value its next reader can rebuild inside itself costs that reader's share only.
      if (const double fused = inline_cost(v, next); fused >= 0) own = std::min(own, fused);
      ranked_.push_back({next == kNever ? -1.0 : own / span, next, v});
    }
    // A heap, not a sort: the walk usually stops after a few candidates, and sorting every
    // candidate at every eviction was a third of planning an LSTM step with all of them
    // scored. Popping gives the sorted order, so the choice is the same.
    auto later = [](const Ranked& a, const Ranked& b) {
      return a.bound > b.bound || (a.bound == b.bound && a.v > b.v);
    };
    std::make_heap(ranked_.begin(), ranked_.end(), later);
    int best = -1;
    double best_score = kUnrebuildable;
    size_t best_bytes = 0;
    while (!ranked_.empty()) {
      std::pop_heap(ranked_.begin(), ranked_.end(), later);
      const Ranked r = ranked_.back();
      ranked_.pop_back();
      if (r.bound > best_score) break;
      const int v = r.v;
      const size_t bytes = g_.values[static_cast<size_t>(v)].bytes;
      double score;
      if (r.next == kNever) {
        score = -1;  // read by nothing ahead: releasing it costs nothing
      } else {
        const double span = span_of(v, r.next);
        double cost = inline_cost(v, r.next);
        if (cost < 0) cost = rebuild_cost(v, best < 0 ? kUnrebuildable : best_score * span);
        if (cost == kUnrebuildable) continue;
        score = cost / span;
      }
      // Ties go to the bigger value, then the lower id, so plans are reproducible.
      if (score < best_score ||
          (score == best_score && (bytes > best_bytes || (bytes == best_bytes && v < best)))) {
        best = v, best_score = score, best_bytes = bytes;
      }
    }
    return best;
  }

  // Makes room for `need` more bytes; false when the budget cannot be held.
  // `value` (or -1) is what will be allocated: an executing machine says how many bytes
  // its pool will really hand out for it, which may exceed the planned size.
  bool make_room(size_t need, int value, int kernel, int nth) {
    auto evict = [&](int v) {
      plan_.chosen.push_back({p_, kernel, nth, v, static_cast<int>(plan_.actions.size())});
      release(v, true);
    };
    if (!follow_.empty()) {
      const ChosenEviction key{p_, kernel, nth, 0, 0};
      auto it = std::lower_bound(follow_.begin(), follow_.end(), key, earlier_place);
      for (; it != follow_.end() && it->at == p_ && it->kernel == kernel && it->nth == nth; ++it)
        if (resident_[static_cast<size_t>(it->value)] &&
            lock_[static_cast<size_t>(it->value)] == 0 && evictable(it->value))
          evict(it->value);
    }
    if (o_.budget == 0) return true;
    // Values to pass over here are locked while the score chooses (locked values are never
    // candidates).
    avoided_.clear();
    if (!avoid_.empty()) {
      const ChosenEviction key{p_, kernel, nth, 0, 0};
      auto it = std::lower_bound(avoid_.begin(), avoid_.end(), key, earlier_place);
      for (; it != avoid_.end() && it->at == p_ && it->kernel == kernel && it->nth == nth; ++it)
        if (resident_[static_cast<size_t>(it->value)]) {
          ++lock_[static_cast<size_t>(it->value)];
          avoided_.push_back(it->value);
        }
    }
    bool ok = true;
    while (usage() + (machine_ && value >= 0 ? machine_->bytes_for(value) : need) > o_.budget) {
      if (plan_.extra_cost > o_.max_extra_cost * plan_.base_cost) {
        ok = fail(over_cap());
        break;
      }
      if (o_.max_work > 0 && plan_.work > o_.max_work && !machine_) {
        plan_.over_work = plan_.feasible;
        ok = fail("planning stopped after " + std::to_string(plan_.work) + " steps of work");
        break;
      }
      int v = pick();
      if (v < 0) {
        ok = fail("nothing left to evict at kernel " + std::to_string(p_));
        break;
      }
      evict(v);
    }
    for (int v : avoided_) --lock_[static_cast<size_t>(v)];
    return ok;
  }

  std::string over_cap() const {
    char why[160];
    std::snprintf(why, sizeof why,
                  "recomputation would exceed %gx the step's own work (the budget is too close "
                  "to the lower bound)",
                  o_.max_extra_cost);
    return why;
  }

  bool fail(std::string why) {
    if (plan_.feasible) plan_.failure = std::move(why);
    plan_.feasible = false;
    return false;
  }

  // Runs kernel k (its inputs resident and locked). In execution a budget that cannot be
  // held is reported, and the kernel runs anyway.
  bool execute(int k, bool recompute, bool in_place) {
    const PlanKernel& kernel = g_.kernels[static_cast<size_t>(k)];
    const PlanValue& out = g_.values[static_cast<size_t>(kernel.output)];
    int& nth = runs_here_[static_cast<size_t>(k)];
    if (nth == 0) ran_here_.push_back(k);
    bool ok = make_room(in_place ? 0 : out.bytes, in_place ? -1 : kernel.output, k, nth++);
    const size_t need = in_place ? 0 : out.bytes;
    if (!ok && !machine_) return false;
    if (recompute && o_.budget > 0 && plan_.extra_cost > o_.max_extra_cost * plan_.base_cost) {
      fail(over_cap());
      if (!machine_) return false;
    }
    // Values this run rebuilds inside itself (only a kernel's own run, never a rebuild, has
    // them): charged at their share of the producer's cost.
    inline_kernels_.clear();
    if (!recompute)
      for (int v : inlined_) {
        const int producer = g_.values[static_cast<size_t>(v)].producer;
        inline_kernels_.push_back(producer);
        plan_.actions.push_back({PlanAction::Kind::Inline, producer});
        ++plan_.inlined;
        plan_.extra_cost +=
            inline_share(kernel, v) * g_.kernels[static_cast<size_t>(producer)].cost;
      }
    plan_.actions.push_back(
        {recompute ? PlanAction::Kind::Recompute : PlanAction::Kind::Run, k, in_place});
    if (recompute) ++plan_.recomputes, plan_.extra_cost += kernel.cost;
    if (machine_) {
      machine_->run(k, recompute, in_place, inline_kernels_);
      peak_ = std::max(peak_, machine_->in_use());
    } else {
      cur_ += need;
      peak_ = std::max(peak_, cur_);
    }
    if (in_place) {
      resident_[static_cast<size_t>(kernel.in_place_input)] = 0;
      remove_candidate(kernel.in_place_input);
    }
    resident_[static_cast<size_t>(kernel.output)] = 1;
    add_candidate(kernel.output);
    return ok;
  }

  // Rebuilds missing value `target` (an input of kernel p_), ancestors first, and leaves
  // it locked for p_. Returns false when the plan must stop.
  bool rebuild(int target) {
    struct Frame {
      int value;
      std::vector<int> children;  // inputs this frame had rebuilt; each holds a lock for it
    };
    std::vector<Frame> frames;
    frames.push_back({target, {}});
    while (!frames.empty()) {
      const size_t top = frames.size() - 1;
      const int v = frames[top].value;
      if (resident_[static_cast<size_t>(v)]) {
        ++lock_[static_cast<size_t>(v)];  // for whoever asked for it
        frames.pop_back();
        continue;
      }
      const int k = g_.values[static_cast<size_t>(v)].producer;
      if (k < 0 || !g_.kernels[static_cast<size_t>(k)].recomputable)
        return fail("value " + std::to_string(v) + " is gone and cannot be rebuilt");
      const PlanKernel& kernel = g_.kernels[static_cast<size_t>(k)];
      // Resident inputs are locked only while the kernel runs, not while the chain below
      // it is rebuilt: locking them then would pin every step of a long recurrence at once
      // and raise the floor. One evicted meanwhile is rebuilt again (the extra-work cap
      // bounds how often).
      bool all_here = true;
      for (int in : kernel.inputs) {
        if (resident_[static_cast<size_t>(in)]) continue;
        all_here = false;
        frames[top].children.push_back(in);
        frames.push_back({in, {}});
      }
      if (!all_here) continue;
      for (int in : kernel.inputs) ++lock_[static_cast<size_t>(in)];
      if (!execute(k, true, false) && !machine_) return false;
      for (int in : kernel.inputs) --lock_[static_cast<size_t>(in)];
      for (int c : frames[top].children) --lock_[static_cast<size_t>(c)];
      // Ancestors rebuilt only for this stay until the whole input is rebuilt: a sibling may
      // need them too (an LSTM's h and c both need the previous h and c, so releasing them
      // at once would rebuild the chain exponentially often). Meanwhile they are the first
      // candidates for eviction, since nothing ahead reads them.
      for (int in : kernel.inputs) temps_.push_back(in);
      ++lock_[static_cast<size_t>(v)];  // for whoever asked for it
      frames.pop_back();
    }
    return true;
  }

  RecomputePlan finish() {
    if (plan_.feasible || machine_) {
      // Rebuilt values kept for reuse that nothing read again.
      for (size_t v = 0; v < g_.values.size(); ++v) {
        const PlanValue& pv = g_.values[v];
        if (resident_[v] && pv.producer >= 0 && !pv.output && lock_[v] == 0 &&
            next_use(static_cast<int>(v), p_) == kNever)
          release(static_cast<int>(v), false);
      }
    }
    plan_.peak = peak_;
    return std::move(plan_);
  }

  const StepGraph& g_;
  const PlannerOptions& o_;
  StepMachine* machine_;
  uint64_t rng_;
  std::vector<std::vector<int>> uses_;
  std::vector<char> resident_;
  std::vector<int> lock_, pos_, cand_, next_, horizon_, stack_, missing_, temps_;
  // Kernel p_'s inputs it rebuilds inside itself, the inputs locked for them (what their
  // producers read, once per read), and those producers (the machine's list).
  std::vector<int> inlined_, inline_locks_, inline_kernels_;
  std::set<std::pair<int, int>> by_next_;  // (next use, value) of the candidates
  std::vector<uint32_t> kstamp_;
  uint32_t stamp_ = 0;
  bool truncated_ = false;
  std::vector<std::pair<int, int>> sample_;
  struct Ranked {
    double bound;
    int next, v;
  };
  std::vector<Ranked> ranked_;
  std::vector<ChosenEviction> follow_;  // o_.follow, by (at, kernel, nth)
  std::vector<ChosenEviction> avoid_;   // o_.avoid, likewise
  std::vector<int> avoided_;            // values locked while make_room chooses
  std::vector<int> runs_here_;          // per kernel: runs while at kernel p_
  std::vector<int> ran_here_;           // kernels with runs_here_ > 0
  size_t cur_ = 0, peak_ = 0;
  int p_ = 0;
  RecomputePlan plan_;
};

}  // namespace

size_t lower_bound(const StepGraph& g, int* at_kernel) {
  if (at_kernel) *at_kernel = -1;
  const size_t nv = g.values.size();
  std::vector<int> last(nv, -1);
  for (size_t k = 0; k < g.kernels.size(); ++k)
    for (int v : g.kernels[k].inputs) last[static_cast<size_t>(v)] = static_cast<int>(k);
  // Bytes of released leaves that go after each position.
  std::vector<size_t> leaf_gone(g.kernels.size() + 1, 0);
  size_t base = g.start_bytes;
  for (size_t v = 0; v < nv; ++v) {
    const PlanValue& pv = g.values[v];
    if (pv.producer >= 0 || !pv.releasable_leaf || pv.output) continue;
    if (last[v] < 0)
      base -= std::min(base, pv.bytes);
    else
      leaf_gone[static_cast<size_t>(last[v])] += pv.bytes;
  }
  size_t lb = g.start_bytes;  // allocated before anything runs
  for (size_t p = 0; p < g.kernels.size(); ++p) {
    const PlanKernel& k = g.kernels[p];
    const PlanValue& out = g.values[static_cast<size_t>(k.output)];
    size_t working = out.bytes;
    for (int in : k.inputs) {
      const PlanValue& pv = g.values[static_cast<size_t>(in)];
      // An input the kernel can compute itself need not be resident (what its producer
      // reads must be, but that may be resident anyway: counting nothing keeps the bound).
      const bool computable = std::any_of(k.inline_inputs.begin(), k.inline_inputs.end(),
                                          [&](const InlineInput& f) { return f.value == in; });
      if (pv.producer >= 0 && !pv.output && !computable) working += pv.bytes;
    }
    if (k.in_place_input >= 0 &&
        last[static_cast<size_t>(k.in_place_input)] == static_cast<int>(p)) {
      // The output takes over a dying input's memory: counted above (a value) or in base
      // (a leaf) already.
      const PlanValue& d = g.values[static_cast<size_t>(k.in_place_input)];
      if (!d.output && (d.producer >= 0 || d.releasable_leaf) && d.bytes == out.bytes)
        working -= std::min(working, d.bytes);
    }
    if (base + working > lb) {
      lb = base + working;
      if (at_kernel) *at_kernel = static_cast<int>(p);
    }
    base -= std::min(base, leaf_gone[p]);
    if (out.output) base += out.bytes;
  }
  return lb;
}

RecomputePlan simulate_step(const StepGraph& graph, const PlannerOptions& options) {
  return Engine(graph, options, nullptr).run();
}

RecomputePlan execute_step(const StepGraph& graph, const PlannerOptions& options,
                           StepMachine& machine) {
  return Engine(graph, options, &machine).run();
}

void assign_in_place(StepGraph& g) {
  std::vector<int> last_read(g.values.size(), -1);
  for (size_t k = 0; k < g.kernels.size(); ++k)
    for (int v : g.kernels[k].inputs) last_read[static_cast<size_t>(v)] = static_cast<int>(k);
  for (size_t k = 0; k < g.kernels.size(); ++k) {
    PlanKernel& pk = g.kernels[k];
    // Without candidates the tables were built by hand: the engine checks the last read of
    // in_place_input itself, so it stays as given.
    if (pk.in_place_candidates.empty()) continue;
    pk.in_place_input = -1;
    for (int v : pk.in_place_candidates)
      if (last_read[static_cast<size_t>(v)] == static_cast<int>(k)) {
        pk.in_place_input = v;
        break;
      }
  }
}

int pressure_end(const StepGraph& g, size_t budget) {
  const size_t nk = g.kernels.size();
  std::vector<int> last(g.values.size(), -1);
  for (size_t k = 0; k < nk; ++k)
    for (int v : g.kernels[k].inputs) last[static_cast<size_t>(v)] = static_cast<int>(k);
  // Bytes alive at each position: a difference array over [made, last read].
  std::vector<int64_t> delta(nk + 1, 0);
  for (size_t v = 0; v < g.values.size(); ++v) {
    const PlanValue& pv = g.values[v];
    const auto bytes = static_cast<int64_t>(pv.bytes);
    if (pv.producer < 0) {
      if (pv.releasable_leaf && !pv.output && last[v] >= 0)
        delta[static_cast<size_t>(last[v]) + 1] -= bytes;
      continue;
    }
    const int end = pv.output ? static_cast<int>(nk) - 1 : std::max(last[v], pv.producer);
    delta[static_cast<size_t>(pv.producer)] += bytes;
    delta[static_cast<size_t>(end) + 1] -= bytes;
  }
  int found = -1;
  auto alive = static_cast<int64_t>(g.start_bytes);
  for (size_t k = 0; k < nk; ++k) {
    alive += delta[k];
    if (budget > 0 && alive > static_cast<int64_t>(budget)) found = static_cast<int>(k);
  }
  return found;
}

RecomputePlan simulate_best(const StepGraph& graph, const PlannerOptions& options,
                            PlannerTuning* chosen) {
  *chosen = options;
  RecomputePlan best = simulate_step(graph, options);
  // Sampling scores 32 candidates per eviction; scoring all of them chose 19% less extra
  // work on the benchmark Transformer at half its releasable bytes, and the seed alone moves
  // the greedy by a few percent either way. On steps of tens of thousands of kernels
  // scoring every candidate is too slow, so only the seeds are tried there.
  std::vector<PlannerOptions> variants;
  if (graph.kernels.size() <= kScoreAllKernels) {
    PlannerOptions all = options;
    all.sample_furthest = std::numeric_limits<int>::max() / 2;
    all.sample_random = 0;
    variants.push_back(all);
  }
  for (uint64_t i = 1; i <= 2; ++i) {
    PlannerOptions seeded = options;
    seeded.seed = options.seed + i * 0x9e3779b97f4a7c15ULL;
    variants.push_back(seeded);
  }
  // The same with the distance to the next use counted only while the step, unplanned,
  // would exceed the budget: past that a release relieves nothing, and an early layer's
  // value rebuilt by a GEMM stops looking cheaper than a later one's rebuilt by a copy. On
  // the benchmark Transformer at half its releasable bytes it took the extra work from
  // 6.7% to 6.2% (the floor, memory/planner/work_floor.h: 4.4%).
  const int end = pressure_end(graph, options.budget);
  if (end >= 0 && options.pressure_end < 0) {
    // As given and, where it is tried, with every candidate scored: the seeds moved little.
    const size_t n = graph.kernels.size() <= kScoreAllKernels ? 1 : 0;
    for (size_t i = 0; i <= n; ++i) {
      PlannerOptions capped = i < n ? variants[i] : options;
      capped.pressure_end = end;
      variants.push_back(capped);
    }
  }
  // With the distance weighed less and more than the bytes: no power is best on every
  // step (weighing it by 0.5 took the benchmark MLP at a third of its releasable bytes
  // from 35.7% to 30.6% extra work, `kiln plan` on its tables; other steps kept theirs).
  for (double power : {0.5, 2.0}) {
    PlannerOptions weighed = options;
    weighed.distance_power = power;
    variants.push_back(weighed);
  }
  for (const PlannerOptions& o : variants) {
    RecomputePlan p = simulate_step(graph, o);
    if (!p.feasible) continue;
    if (!best.feasible || p.extra_cost < best.extra_cost ||
        (p.extra_cost == best.extra_cost && p.peak < best.peak)) {
      best = std::move(p);
      *chosen = o;  // the tuning only: `o` follows and avoids nothing
    }
  }
  return best;
}

RecomputePlan search_evictions(const StepGraph& graph, RecomputePlan best,
                               const PlannerOptions& options) {
  if (!best.feasible || options.budget == 0 || options.follow || options.avoid) return best;
  // Each eviction of the plan made otherwise: the same choices up to it, that victim passed
  // over there, the score's choices after it (a search of one discrepancy). A plan that
  // needs less is kept and searched on from the same eviction. On the benchmark
  // Transformer at a fifth of its releasable bytes it took the extra work from 22.6% to
  // 20.8% (the floor: 14.6%) in 168 plannings, 77 ms; at a third, and on the MLP, it found
  // nothing. The plannings are bounded by the actions they take, so the LSTM's (about
  // 20,000 actions each) get a few.
  size_t work = 0;
  bool improved = true;
  for (int round = 0; improved && round < kSearchRounds; ++round) {
    improved = false;
    for (size_t i = 0; i < best.chosen.size() && work < kSearchActions; ++i) {
      const std::vector<ChosenEviction> before(
          best.chosen.begin(), best.chosen.begin() + static_cast<std::ptrdiff_t>(i));
      const std::vector<ChosenEviction> avoid{best.chosen[i]};
      PlannerOptions o = options;
      o.follow = &before;
      o.avoid = &avoid;
      RecomputePlan p = simulate_step(graph, o);
      work += p.actions.size();
      if (p.feasible && p.extra_cost < best.extra_cost) {
        best = std::move(p);
        improved = true;
      }
    }
  }
  return best;
}

size_t smallest_feasible_budget(const StepGraph& graph, const PlannerOptions& options) {
  PlannerOptions o = options;
  o.budget = 0;
  const size_t top = simulate_step(graph, o).peak;
  size_t lo = lower_bound(graph), hi = std::max(top, lo);
  const size_t step = std::max<size_t>((hi - lo) / 64, 1);
  // Invariant: hi is feasible (the unbudgeted peak always is).
  while (hi - lo > step) {
    size_t mid = lo + (hi - lo) / 2;
    o.budget = mid;
    if (simulate_step(graph, o).feasible)
      hi = mid;
    else
      lo = mid;
  }
  return hi;
}

}  // namespace kiln::memory
