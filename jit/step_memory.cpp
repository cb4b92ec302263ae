#include "step_memory.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "../core/error.h"
#include "../core/settings.h"
#include "../memory/arena_fit.h"
#include "../memory/arena_plan.h"
#include "../memory/budget.h"
#include "../memory/caching_pool.h"
#include "../memory/device_pools.h"
#include "../memory/host_pool.h"
#include "../memory/memory.h"
#include "../memory/plan_report.h"
#include "../memory/recompute_planner.h"
#include "../memory/schedule_order.h"
#include "../memory/step_graph_file.h"
#include "../memory/step_record.h"

namespace kiln::jit {
namespace {

using Clock = std::chrono::steady_clock;
using memory::PlanKernel;
using memory::PlanValue;
using memory::StepEvent;

// Rough seconds for one kernel: whichever of arithmetic and memory traffic dominates.
double kernel_cost(const FusionGroup& g) {
  double bytes = static_cast<double>(g.root->nbytes());
  for (const Node* in : g.inputs) bytes += static_cast<double>(in->nbytes());
  double flops = 0;
  if (g.library && g.conv.root)
    flops = 2.0 * static_cast<double>(g.conv.product->inputs[0]->numel());
  else if (g.library && g.gemm.reduce && !g.gemm.reduce->inputs.empty())
    flops = 2.0 * static_cast<double>(g.gemm.reduce->inputs[0]->numel());
  else
    for (const Node* m : g.members) flops = std::max(flops, static_cast<double>(m->numel()));
  return std::max(flops / 1e11, bytes / 2e10) + 2e-6;  // plus a launch
}

std::string kernel_name(const FusionGroup& g) {
  std::vector<std::string> names;
  for (const Node* m : g.members) {
    std::string n = m->origin ? m->origin : std::string(op_name(m->op));
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  std::string out;
  for (size_t i = 0; i < names.size() && i < 4; ++i) out += (i ? "+" : "") + names[i];
  if (names.size() > 4) out += "+...";
  return out;
}

std::string value_shape(const Node* n) {
  return shape_str(n->shape) + " " + std::string(dtype_name(n->dtype));
}

memory::CachingPool& pool_of(Device d) {
  return d.is_cuda() ? memory::device_pool(d.index) : memory::host_pool();
}

// The tables, plus the node behind every value.
struct StepTables {
  memory::StepGraph graph;
  std::vector<Node*> nodes;
  Device device = Device::cpu();
};

// The groups in the order they run (see updates_last).
using Schedule = std::vector<const FusionGroup*>;

// Marks, per kernel, an input whose buffer its output may take over: one it reads for the
// last time, only at its own output element, on its device, that nothing must keep.
void assign_in_place(StepTables& t, const Schedule& groups) {
  std::vector<int> last_read(t.nodes.size(), -1);
  for (size_t k = 0; k < groups.size(); ++k)
    for (int v : t.graph.kernels[k].inputs) last_read[static_cast<size_t>(v)] = static_cast<int>(k);
  for (size_t k = 0; k < groups.size(); ++k) {
    const FusionGroup& g = *groups[k];
    if (g.root->op == OpCode::Transfer) continue;
    for (int v : t.graph.kernels[k].inputs) {
      const PlanValue& pv = t.graph.values[static_cast<size_t>(v)];
      Node* n = t.nodes[static_cast<size_t>(v)];
      if (pv.output || last_read[static_cast<size_t>(v)] != static_cast<int>(k) ||
          n->device != g.root->device || (pv.producer < 0 && !pv.releasable_leaf) ||
          !reads_at_output_index(g, n))
        continue;
      t.graph.kernels[k].in_place_input = v;
      break;
    }
  }
}

StepTables build_tables(const Schedule& groups, const std::unordered_set<Node*>& outputs,
                        const std::vector<Node*>& original, const std::vector<Node*>& simplified) {
  StepTables t;
  for (const FusionGroup* g : groups)
    if (g->root->device.is_cuda()) {
      t.device = g->root->device;
      break;
    }
  std::unordered_map<Node*, int> id;
  id.reserve(groups.size() * 2);
  auto value_of = [&](Node* n, int producer) {
    auto [it, fresh] = id.try_emplace(n, static_cast<int>(t.nodes.size()));
    if (fresh) {
      t.nodes.push_back(n);
      PlanValue v;
      v.bytes = n->device == t.device ? memory::block_size(n->nbytes()) : 0;
      v.producer = producer;
      v.output = outputs.count(n) > 0 || n->handles.load(std::memory_order_relaxed) > 0;
      t.graph.values.push_back(v);
    }
    return it->second;
  };
  for (const FusionGroup* g : groups) value_of(g->root, -1);  // ids first, producers below
  for (size_t k = 0; k < groups.size(); ++k)
    t.graph.values[static_cast<size_t>(id.at(groups[k]->root))].producer = static_cast<int>(k);
  for (size_t k = 0; k < groups.size(); ++k) {
    PlanKernel pk;
    for (Node* in : groups[k]->inputs) {
      int v = value_of(in, -1);
      if (std::find(pk.inputs.begin(), pk.inputs.end(), v) == pk.inputs.end())
        pk.inputs.push_back(v);
    }
    pk.output = id.at(groups[k]->root);
    pk.cost = kernel_cost(*groups[k]);
    pk.region = groups[k]->root->checkpoint_region & ~kCheckpointResultBit;
    pk.region_result = (groups[k]->root->checkpoint_region & kCheckpointResultBit) != 0;
    t.graph.kernels.push_back(std::move(pk));
  }

  // A leaf may be donated only when it was replaced (assign) and nothing outside this step
  // can reach it: no handle, no other owner of its buffer, and every reference to the node
  // is an edge of a node of this evaluation.
  std::unordered_map<Node*, int> edges;
  for (size_t v = 0; v < t.nodes.size(); ++v) {
    Node* n = t.nodes[v];
    if (t.graph.values[v].producer < 0 && n->replaced && !t.graph.values[v].output && n->buffer &&
        n->buffer.use_count() == 1)
      edges.emplace(n, 0);
  }
  if (!edges.empty()) {
    // The nodes that read a candidate, each counted once though it may be in both lists.
    // Only those are collected: a set of every node of the step took half of the tables'
    // time on the benchmark LSTM (tens of thousands of nodes, a few dozen candidates).
    std::vector<Node*> readers;
    for (const auto* list : {&original, &simplified})
      for (Node* n : *list)
        for (const NodePtr& in : n->inputs)
          if (in->replaced && edges.count(in.get())) {
            readers.push_back(n);
            break;
          }
    std::sort(readers.begin(), readers.end());
    readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
    for (Node* n : readers)
      for (const NodePtr& in : n->inputs)
        if (auto it = edges.find(in.get()); it != edges.end()) ++it->second;
    for (auto [n, count] : edges)
      if (n->weak_from_this().use_count() == count)
        t.graph.values[static_cast<size_t>(id.at(n))].releasable_leaf = true;
  }

  assign_in_place(t, groups);
  t.graph.start_bytes = pool_of(t.device).allocated();
  return t;
}

// How many tensors the step assigns a new value to (an optimizer's updates read the values
// they replace, leaves or, in a first step that also initialises them, values made in the
// step): more than none makes it a training step, as the budget error and KILN_PLAN_DUMP
// tell it from a test pass or sampling.
size_t updated_tensors(const StepTables& t) {
  size_t n = 0;
  for (const Node* node : t.nodes) n += node->replaced ? 1 : 0;
  return n;
}

// Per kernel, the phase of the step it belongs to (memory::StepPhase), from how its nodes
// were built. The update: kernels that read a value the step replaces and make either a
// parameter's new value (a leaf of differentiation) or, without gradients flowing through
// them, values only other update kernels read in the step (an Adam moment). The backward
// pass: other kernels that gradients do not flow through but that read what they do,
// directly or through such kernels. The rest, data and initial values made for the step
// included, is the forward pass. A step through which no gradient flows is all forward.
std::vector<memory::StepPhase> kernel_phases(const StepTables& t, const Schedule& groups) {
  const size_t n = groups.size();
  std::vector<memory::StepPhase> phases(n, memory::StepPhase::Forward);
  auto flows = [](const Node* node) { return node->requires_grad && !node->grad_leaf; };
  if (std::none_of(groups.begin(), groups.end(),
                   [&](const FusionGroup* g) { return flows(g->root); }))
    return phases;
  std::vector<char> after_gradients(n, 0), reads_replaced(n, 0);
  std::vector<std::vector<size_t>> readers(n);
  for (size_t k = 0; k < n; ++k) {
    for (int v : t.graph.kernels[k].inputs) {
      const int producer = t.graph.values[static_cast<size_t>(v)].producer;
      const Node* node = t.nodes[static_cast<size_t>(v)];
      reads_replaced[k] |= node->replaced;
      after_gradients[k] |=
          node->requires_grad || (producer >= 0 && after_gradients[static_cast<size_t>(producer)]);
      if (producer >= 0) readers[static_cast<size_t>(producer)].push_back(k);
    }
  }
  // Readers run after their producers, so a backward walk knows theirs already.
  for (size_t k = n; k-- > 0;) {
    const Node* root = groups[k]->root;
    const bool feeds_updates = std::all_of(readers[k].begin(), readers[k].end(), [&](size_t r) {
      return phases[r] == memory::StepPhase::Update;
    });
    if (reads_replaced[k] && (root->grad_leaf || (!root->requires_grad && feeds_updates)))
      phases[k] = memory::StepPhase::Update;
    else if (!root->requires_grad && after_gradients[k])
      phases[k] = memory::StepPhase::Backward;
  }
  return phases;
}

// The tables for the same kernels run in another order (`perm` from schedule_order; the
// groups already permuted): value ids stay, producers move, in-place candidates change
// with the last reads.
void reorder_tables(StepTables& t, const Schedule& groups, const std::vector<int>& perm) {
  const std::vector<int> old_ids = memory::inverse_permutation(perm);
  std::vector<PlanKernel> kernels;
  kernels.reserve(perm.size());
  for (int k : perm) kernels.push_back(std::move(t.graph.kernels[static_cast<size_t>(k)]));
  t.graph.kernels = std::move(kernels);
  for (PlanValue& v : t.graph.values)
    if (v.producer >= 0) v.producer = old_ids[static_cast<size_t>(v.producer)];
  for (PlanKernel& k : t.graph.kernels) k.in_place_input = -1;
  assign_in_place(t, groups);
}

// Runs the planner's actions on the real nodes and records what happened.
class JitMachine final : public memory::StepMachine {
 public:
  // `arena`, when given, places outputs at `plan`'s offsets in the arena at that base.
  JitMachine(const Schedule& groups, const StepTables& t, const GroupRunner& run, bool record,
             const memory::ArenaPlan* plan = nullptr, void* arena = nullptr)
      : groups_(groups),
        t_(t),
        run_(run),
        pool_(pool_of(t.device)),
        record_(record),
        arena_plan_(plan),
        arena_(arena),
        evictions_(t.nodes.size(), 0),
        rebuilds_(t.nodes.size(), 0),
        runs_(t.graph.kernels.size(), 0),
        seconds_(t.graph.kernels.size(), -1.0) {}

  size_t in_use() override { return pool_.allocated(); }

  size_t bytes_for(int v) override {
    const Node* n = t_.nodes[static_cast<size_t>(v)];
    return n->device == t_.device ? pool_.block_size_for(n->nbytes()) : 0;
  }

  void run(int k, bool recompute, bool in_place) override {
    const FusionGroup& g = *groups_[static_cast<size_t>(k)];
    const PlanKernel& pk = t_.graph.kernels[static_cast<size_t>(k)];
    Node* donor = in_place ? t_.nodes[static_cast<size_t>(pk.in_place_input)] : nullptr;
    follow_plan(k);
    bool reused = false;
    // A result kept past the step must not take over a part of the arena (only a run that
    // strayed from the plan would ask): it would hold the arena's block after the step.
    const bool arena_donor = donor && in_arena_[static_cast<size_t>(pk.in_place_input)];
    if (donor && donor->buffer && donor->buffer.use_count() == 1 && !g.root->device.is_cuda() &&
        !(arena_donor && t_.graph.values[static_cast<size_t>(pk.output)].output)) {
      g.root->buffer = donor->buffer;  // the donor still reads it during the kernel
      reused = true;
    }
    const bool placed = !reused && place_in_arena(k, g);
    in_arena_[static_cast<size_t>(pk.output)] = placed || (reused && arena_donor);
    ++runs_[static_cast<size_t>(k)];
    const double start = us();
    try {
      run_(g);
    } catch (...) {
      if (reused || placed) g.root->buffer.reset();
      throw;
    }
    if (reused) in_place_kernels_.push_back(k);
    if (donor) {
      donor->buffer.reset();  // taken over, or (on CUDA) released once the kernel has read it
      ++in_place_;
      if (t_.graph.values[static_cast<size_t>(pk.in_place_input)].producer < 0) {
        donor->donated = true;
        ++donated_;
        ++released_leaves_;
      }
    }
    if (recompute)
      ++rebuilds_[static_cast<size_t>(pk.output)];
    else
      seconds_[static_cast<size_t>(k)] = (us() - start) * 1e-6;
    if (record_)
      events_.push_back({recompute ? StepEvent::Kind::Recompute : StepEvent::Kind::Run, k,
                         pk.output, t_.graph.values[static_cast<size_t>(pk.output)].bytes,
                         pool_.allocated(), reused || (donor != nullptr), start, us()});
  }

  void release(int v, bool evict) override {
    Node* n = t_.nodes[static_cast<size_t>(v)];
    n->buffer.reset();
    if (t_.graph.values[static_cast<size_t>(v)].producer < 0) {
      n->donated = true;
      ++released_leaves_;
    }
    if (evict) ++evictions_[static_cast<size_t>(v)];
    if (record_) {
      const double now = us();
      events_.push_back({evict ? StepEvent::Kind::Evict : StepEvent::Kind::Free, -1, v,
                         t_.graph.values[static_cast<size_t>(v)].bytes, pool_.allocated(), false,
                         now, now});
    }
  }

  double us() const {
    return std::chrono::duration<double, std::micro>(Clock::now() - begin_).count();
  }

  // Notes whether the runs so far are the plan's. Once they are not (the run-time fallback
  // evicted what the plan kept), the planned places describe lifetimes that no longer hold,
  // so nothing more is placed: every later value comes from the pool.
  void follow_plan(int k) {
    if (arena_ == nullptr || strayed_) return;
    const std::vector<int>& planned = arena_plan_->runs;
    if (next_run_ < planned.size() && planned[next_run_] == k)
      ++next_run_;
    else
      strayed_ = true;
  }

  // Gives the output of this run of kernel `k` its planned place in the arena; false when it
  // has none or the place is still taken (the run then allocates from the pool).
  bool place_in_arena(int k, const FusionGroup& g) {
    if (arena_ == nullptr || strayed_ || g.root->buffer || g.root->op == OpCode::Transfer ||
        g.root->device != t_.device)
      return false;
    const int64_t offset = arena_plan_->offset(k, runs_[static_cast<size_t>(k)]);
    if (offset < 0) return false;
    const size_t bytes = g.root->nbytes();
    void* p = pool_.allocate_in_arena(arena_, static_cast<size_t>(offset), bytes);
    if (p == nullptr) {
      ++arena_misses_;
      return false;
    }
    try {
      g.root->buffer = std::make_shared<Buffer>(p, bytes, pool_);
    } catch (...) {
      pool_.deallocate(p);
      throw;
    }
    ++arena_values_;
    return true;
  }

  const Schedule& groups_;
  const StepTables& t_;
  const GroupRunner& run_;
  memory::CachingPool& pool_;
  bool record_;
  const memory::ArenaPlan* arena_plan_;
  void* arena_;
  Clock::time_point begin_ = Clock::now();
  std::vector<StepEvent> events_;
  std::vector<int> evictions_, rebuilds_;
  std::vector<int> runs_;  // per kernel, runs so far (the index into the arena plan)
  std::vector<char> in_arena_ = std::vector<char>(t_.nodes.size(), 0);  // per value, now
  size_t next_run_ = 0;   // runs of the plan done so far, while they follow it
  bool strayed_ = false;  // a run that was not the plan's next one happened
  size_t arena_values_ = 0, arena_misses_ = 0;
  std::vector<double> seconds_;  // per kernel, its first run (compile time included)
  size_t in_place_ = 0, donated_ = 0, released_leaves_ = 0;
  std::vector<int> in_place_kernels_;
};

[[noreturn]] void raise_over_budget(const StepTables& t, const Schedule& groups,
                                    const memory::PlannerOptions& options,
                                    const memory::StepPlan& plan, size_t tail) {
  memory::PlannerOptions none = options;
  none.budget = 0;
  const size_t unplanned = memory::plan_step(t.graph, none).peak;
  // Any kernel order may be the one that fits.
  size_t smallest = std::numeric_limits<size_t>::max();
  for (memory::ScheduleOrder order : memory::all_orders())
    smallest = std::min(
        smallest,
        memory::smallest_feasible_budget(
            memory::reorder(t.graph, memory::schedule_order(t.graph, order, tail)), options));
  const std::string pool = pool_of(t.device).name();
  int at = -1;
  memory::lower_bound(t.graph, &at);
  std::string where;
  if (at >= 0) {
    const memory::PlanKernel& k = t.graph.kernels[static_cast<size_t>(at)];
    size_t in = 0;
    for (int v : k.inputs) in += t.graph.values[static_cast<size_t>(v)].bytes;
    where = "; the bound is reached at kernel " + std::to_string(at) + " (" +
            kernel_name(*groups[static_cast<size_t>(at)]) + ", " + std::to_string(k.inputs.size()) +
            " inputs of " + memory::format_bytes(in) + ", output " +
            value_shape(t.nodes[static_cast<size_t>(k.output)]) + ")";
  }
  const size_t updated = updated_tensors(t);
  const std::string what =
      updated > 0
          ? "this evaluation (a training step: it updates " + std::to_string(updated) + " tensors)"
          : "this evaluation (not a training step: it updates no tensor, as a test pass "
            "or sampling does)";
  throw OutOfMemoryError(
      "[memory] " + what + " cannot run within the memory budget of " +
      memory::format_bytes(options.budget) + " on the " + pool + ": it needs at least " +
      memory::format_bytes(plan.lower_bound) + " (lower bound: what is resident when it starts, " +
      memory::format_bytes(t.graph.start_bytes) + ", plus the largest working set of one kernel" +
      where +
      "), and the smallest budget the planner "
      "fits it into is " +
      memory::format_bytes(smallest) + " (" + std::to_string(smallest) + " bytes; unplanned peak " +
      memory::format_bytes(unplanned) + ", " + std::to_string(t.graph.kernels.size()) +
      " kernels; at this budget: " + plan.failure +
      "). Raise the budget (kiln::memory::set_budget, KILN_MEMORY_BUDGET) or make "
      "the step smaller" +
      (updated > 0 ? std::string() : std::string(" (evaluate in smaller batches)")) + ".\n" +
      memory::report());
}

// The schedule with updates last: a kernel whose result nothing in the step reads and whose
// inputs are all kept anyway (results, held tensors, leaves) moves to the end. Parameter
// updates are such kernels; run early, they would release the replaced parameter while the
// backward pass still has values computed from it, which could then no longer be rebuilt.
// Moving them frees nothing later, since everything they read is kept.
Schedule updates_last(const FusionPlan& plan, const std::unordered_set<Node*>& outputs,
                      size_t& tail) {
  std::unordered_set<const Node*> read, roots;
  for (const FusionGroup& g : plan.groups) {
    roots.insert(g.root);
    for (const Node* in : g.inputs) read.insert(in);
  }
  auto kept = [&](const Node* n) {
    return !roots.count(n) || outputs.count(const_cast<Node*>(n)) ||
           n->handles.load(std::memory_order_relaxed) > 0;
  };
  Schedule order, last;
  for (const FusionGroup& g : plan.groups) {
    bool sink =
        !read.count(g.root) && kept(g.root) && std::all_of(g.inputs.begin(), g.inputs.end(), kept);
    (sink ? last : order).push_back(&g);
  }
  tail = last.size();
  order.insert(order.end(), last.begin(), last.end());
  return order;
}

// What kiln learns about a step that repeats (a training loop): the kernels' measured run
// times and the kernel order chosen with them, keyed by the step's tables. Costs estimated
// from bytes and flops miss launch and threading overheads, which dominate small kernels;
// plans made with measured times choose better victims and report extra work truthfully.
struct StepProfile {
  std::vector<double> seconds;  ///< Per kernel in the given order: fastest run seen.
  int measured = 0;             ///< Steps that contributed to `seconds`.
  int ordered_with = -1;        ///< `measured` when `order` was chosen (-1: not yet).
  memory::ScheduleOrder order = memory::ScheduleOrder::Given;
  uint64_t arena_for = 0;  ///< Hash of the actions and sizes `arena` was planned for.
  std::shared_ptr<const memory::ArenaPlan> arena;
  /// The plan made once the costs stopped changing, and the kernel order it is for: the
  /// same tables, costs and budget always give the same plan, so later steps reuse it.
  std::shared_ptr<const memory::StepPlan> plan;
  memory::ScheduleOrder plan_order = memory::ScheduleOrder::Given;
  /// What else the plan was made for: the bytes resident at the start and the budget planned
  /// against (the plan margin included), which the tables do not say.
  size_t plan_start = 0, plan_budget = 0;
  /// The budget execution decides against with this plan: the user's, or a tighter one
  /// the plan was found at (see run_with_memory_plan).
  size_t plan_executes_at = 0;
  /// How the plan's victims were chosen (sampling and seed): execution decides the same way.
  memory::PlannerOptions plan_policy;
  /// The budget of allocated bytes the plan was made for, and the releases it keeps in the
  /// arena's gaps (memory/arena_fit.h); 0 and 0 when it was not fitted.
  size_t plan_fitted_for = 0, plan_kept_in_gaps = 0;
  double plan_reserve_cost = 0;  ///< ArenaFit::reserve_cost
};

// Steps timed before the costs are final. Later steps are not timed, so their plans and
// arena placements are made once and reused (a minimum over three runs is close enough:
// the plan only needs to know which kernels are cheap).
constexpr int kTimedSteps = 3;

// FNV-1a over 64-bit words: the step keys below only need to tell steps of one process
// apart, so a fast in-memory hash is enough (jit/hash.h's is for bytes shared on disk).
struct KeyHash {
  uint64_t h = 0xcbf29ce484222325ULL;
  void operator()(uint64_t x) { h = (h ^ x) * 0x100000001b3ULL; }
};

uint64_t tables_key(const memory::StepGraph& g, size_t budget, size_t tail, double reserve_limit) {
  KeyHash mix;
  mix(budget);
  mix(tail);
  uint64_t limit_bits;
  std::memcpy(&limit_bits, &reserve_limit, sizeof limit_bits);
  mix(limit_bits);
  for (const PlanValue& v : g.values)
    mix(v.bytes), mix(static_cast<uint64_t>(v.producer)), mix(v.output * 2u + v.releasable_leaf);
  for (const PlanKernel& k : g.kernels) {
    mix(static_cast<uint64_t>(k.output)), mix(static_cast<uint64_t>(k.in_place_input));
    mix(k.region), mix(k.region_result), mix(k.recomputable);
    uint64_t bits;
    std::memcpy(&bits, &k.cost, sizeof bits);
    mix(bits);
    for (int in : k.inputs) mix(static_cast<uint64_t>(in));
  }
  return mix.h;
}

std::mutex g_profiles_mutex;
std::unordered_map<uint64_t, StepProfile> g_profiles;

// Puts measured costs into `g` (in the given order) and returns the kernel order to use,
// choosing it again once the first two steps have been timed (the first includes compiling).
// `settled` says whether the costs are final (kTimedSteps timed, or never timed).
memory::ScheduleOrder profile_and_order(uint64_t key, memory::StepGraph& g,
                                        const memory::PlannerOptions& options, size_t tail,
                                        bool timed, bool* settled, bool choose_again = false) {
  StepProfile p;
  {
    std::lock_guard<std::mutex> lock(g_profiles_mutex);
    if (auto it = g_profiles.find(key); it != g_profiles.end()) p = it->second;
  }
  if (p.measured > 0 && p.seconds.size() == g.kernels.size())
    for (size_t k = 0; k < g.kernels.size(); ++k) g.kernels[k].cost = p.seconds[k];
  *settled = !timed || (p.measured >= kTimedSteps && p.seconds.size() == g.kernels.size());
  if (!choose_again && p.ordered_with >= 0 && (p.ordered_with >= 2 || p.measured < 2))
    return p.order;
  const memory::ScheduleOrder order =
      memory::choose_schedule_order(g, options, tail,
                                    p.ordered_with >= 0 ? p.order : memory::ScheduleOrder::Given)
          .order;
  std::lock_guard<std::mutex> lock(g_profiles_mutex);
  if (g_profiles.size() >= 1024) g_profiles.clear();  // a long run of ever-new shapes
  StepProfile& stored = g_profiles[key];
  stored.order = order;
  stored.ordered_with = p.measured;
  return order;
}

// Makes `order` the step's kernel order from now on.
void remember_order(uint64_t key, memory::ScheduleOrder order) {
  std::lock_guard<std::mutex> lock(g_profiles_mutex);
  g_profiles[key].order = order;
}

// Records the run times of a step's first runs (`seconds` in run order, `perm` maps run
// order to the given order).
void remember_times(uint64_t key, const std::vector<double>& seconds,
                    const std::vector<int>& perm) {
  std::lock_guard<std::mutex> lock(g_profiles_mutex);
  StepProfile& p = g_profiles[key];
  if (p.seconds.size() != seconds.size()) p.seconds.assign(seconds.size(), -1.0), p.measured = 0;
  if (p.measured >= kTimedSteps) return;
  for (size_t i = 0; i < seconds.size(); ++i) {
    if (seconds[i] < 0) continue;
    double& best = p.seconds[static_cast<size_t>(perm[i])];
    best = best < 0 ? seconds[i] : std::min(best, seconds[i]);
  }
  for (double& t : p.seconds) t = std::max(t, 1e-7);
  ++p.measured;
}

// The plan stored for these tables in `order`, made for the same start and planned budget,
// or null.
std::shared_ptr<const memory::StepPlan> stored_plan(uint64_t key, memory::ScheduleOrder order,
                                                    const memory::StepGraph& g, size_t budget,
                                                    size_t* executes_at,
                                                    memory::PlannerOptions* policy,
                                                    size_t* fitted_for, size_t* kept_in_gaps,
                                                    double* reserve_cost) {
  std::lock_guard<std::mutex> lock(g_profiles_mutex);
  auto it = g_profiles.find(key);
  if (it == g_profiles.end()) return nullptr;
  const StepProfile& p = it->second;
  if (!p.plan || p.plan_order != order || p.plan_start != g.start_bytes || p.plan_budget != budget)
    return nullptr;
  *executes_at = p.plan_executes_at;
  *policy = p.plan_policy;
  *fitted_for = p.plan_fitted_for;
  *kept_in_gaps = p.plan_kept_in_gaps;
  *reserve_cost = p.plan_reserve_cost;
  return p.plan;
}

void store_plan(uint64_t key, memory::ScheduleOrder order, const memory::StepGraph& g,
                size_t budget, size_t executes_at, const memory::StepPlan& plan,
                const memory::PlannerOptions& policy, const memory::ArenaFit* fit) {
  auto stored = std::make_shared<const memory::StepPlan>(plan);
  std::lock_guard<std::mutex> lock(g_profiles_mutex);
  StepProfile& p = g_profiles[key];
  p.plan = std::move(stored);
  p.plan_order = order;
  p.plan_start = g.start_bytes;
  p.plan_budget = budget;
  p.plan_executes_at = executes_at;
  p.plan_policy = policy;
  p.plan_fitted_for = fit ? fit->planned_for : 0;
  p.plan_kept_in_gaps = fit ? fit->kept_in_gaps : 0;
  p.plan_reserve_cost = fit ? fit->reserve_cost : 0;
}

// The arena placement of a plan's values, planned once per step tables and plan: a
// training loop repeats the same plan, and placing thousands of values takes milliseconds.
// `refine` (for a plan made once and reused) spends more time on a smaller arena.
// The bytes each value takes in the arena. The tables see the pool's size classes; offsets
// depend on the exact sizes too.
std::vector<size_t> arena_sizes(const StepTables& t) {
  std::vector<size_t> bytes(t.nodes.size(), 0);
  for (size_t v = 0; v < t.nodes.size(); ++v)
    if (const Node* n = t.nodes[v]; n->device == t.device && n->nbytes() > 0)
      bytes[v] = (n->nbytes() + 63) / 64 * 64;
  return bytes;
}

// `made`, when given, is the placement of these actions made already (by fit_to_budget).
// `bytes` are arena_sizes(t).
std::shared_ptr<const memory::ArenaPlan> arena_for(uint64_t key, const StepTables& t,
                                                   const std::vector<memory::PlanAction>& actions,
                                                   const std::vector<size_t>& bytes, bool refine,
                                                   const memory::ArenaPlan* made = nullptr) {
  KeyHash mix;
  for (const memory::PlanAction& a : actions)
    mix(static_cast<uint64_t>(a.id) << 8 | static_cast<uint64_t>(a.kind) << 1 | a.in_place);
  for (size_t b : bytes) mix(b);
  mix(refine);
  const uint64_t plan_key = mix.h;
  {
    std::lock_guard<std::mutex> lock(g_profiles_mutex);
    if (auto it = g_profiles.find(key);
        it != g_profiles.end() && it->second.arena && it->second.arena_for == plan_key)
      return it->second.arena;
  }
  auto plan = std::make_shared<const memory::ArenaPlan>(
      made ? *made : memory::plan_arena(t.graph, actions, bytes, refine));
  std::lock_guard<std::mutex> lock(g_profiles_mutex);
  StepProfile& p = g_profiles[key];
  p.arena = plan;
  p.arena_for = plan_key;
  return plan;
}

// The arena of one step, handed back to the pool when the step ends (parts still held by
// tensors return to the pool when those go).
class OpenArena {
 public:
  OpenArena(memory::CachingPool& pool, size_t bytes, bool exact)
      : pool_(pool), base_(bytes > 0 ? pool.open_arena(bytes, exact) : nullptr) {}
  ~OpenArena() noexcept {
    try {
      if (base_ != nullptr) pool_.close_arena(base_);
    } catch (...) {  // not open: nothing to hand back
    }
  }
  OpenArena(const OpenArena&) = delete;
  OpenArena& operator=(const OpenArena&) = delete;
  void* base() const { return base_; }

 private:
  memory::CachingPool& pool_;
  void* base_;
};

// KILN_DISABLE_ARENA=1 gives every value a block of the pool's own choosing (read on every
// step, so a program can compare both).
bool arena_enabled() { return !settings::flag("KILN_DISABLE_ARENA"); }

}  // namespace

bool reads_at_output_index(const FusionGroup& group, const Node* input) {
  const Node* root = group.root;
  // An accumulation adds the product into its input element by element.
  if (group.library)
    return group.gemm.sum && input == group.gemm.accumulate && input->nbytes() == root->nbytes();
  if (op_family(root->op) != OpFamily::Elementwise || input->shape != root->shape ||
      input->nbytes() != root->nbytes())
    return false;
  // Any read through a reindex or a reduction may be at another element: none of those
  // members may reach the input.
  std::unordered_set<const Node*> inside(group.members.begin(), group.members.end());
  std::vector<const Node*> stack;
  std::unordered_set<const Node*> seen;
  // A reduction inside the group is a row stage (lowering makes it one or refuses): it
  // reads the row it is computed for, before the row's elements are written, and those
  // elements share the output's shape, so through elementwise ops it reads only that row.
  for (const Node* m : group.members)
    if (op_family(m->op) != OpFamily::Elementwise && m->op != OpCode::ReindexReduce)
      stack.push_back(m);
  while (!stack.empty()) {
    const Node* m = stack.back();
    stack.pop_back();
    for (const NodePtr& in : m->inputs) {
      if (in.get() == input) return false;
      if (inside.count(in.get()) && in->op != OpCode::ReindexReduce && seen.insert(in.get()).second)
        stack.push_back(in.get());
    }
  }
  return true;
}

void run_with_memory_plan(const FusionPlan& plan, const std::unordered_set<Node*>& outputs,
                          const std::vector<Node*>& original, const std::vector<Node*>& simplified,
                          const GroupRunner& run) {
  const auto planning_started = Clock::now();
  size_t tail = 0;
  Schedule groups = updates_last(plan, outputs, tail);
  StepTables t = build_tables(groups, outputs, original, simplified);
  memory::PlannerOptions options;
  options.budget = memory::budget(t.device);
  // The static plan may be made for more than the budget (set_plan_margin, for tests).
  const double margin = 1.0 + std::max(memory::plan_margin(), 0.0);
  memory::PlannerOptions planned = options;
  if (options.budget > 0)
    planned.budget = static_cast<size_t>(static_cast<double>(options.budget) * margin);
  // Kernels on a GPU run asynchronously: timing their launches would say nothing.
  const bool timed = !t.device.is_cuda();
  // How much work holding the pool's reserve within the budget may add (memory/arena_fit.h);
  // plans made under another limit are other plans.
  const double reserve_limit = memory::reserve_work_limit();
  const uint64_t key = tables_key(t.graph, options.budget, tail, reserve_limit);
  bool settled = false;
  memory::ScheduleOrder order = profile_and_order(key, t.graph, planned, tail, timed, &settled);
  // The tables as given, with the costs the planner uses.
  if (const std::string dump = memory::plan_dump_path(updated_tensors(t) > 0); !dump.empty()) {
    memory::StepGraphFile file{t.graph, {}, options.budget, tail};
    for (const FusionGroup* g : groups) file.kernel_names.push_back(kernel_name(*g));
    memory::save_step_graph(file, dump);
  }
  std::vector<int> perm;
  auto run_in = [&](memory::ScheduleOrder o) {
    perm = memory::schedule_order(t.graph, o, tail);
    if (o == memory::ScheduleOrder::Given) return;
    Schedule reordered;
    reordered.reserve(groups.size());
    for (int k : perm) reordered.push_back(groups[static_cast<size_t>(k)]);
    groups = std::move(reordered);
    reorder_tables(t, groups, perm);
  };
  run_in(order);
  // Back to the given order, then into `o`.
  auto switch_to = [&](memory::ScheduleOrder o) {
    if (order != memory::ScheduleOrder::Given) {
      const std::vector<int> back = memory::inverse_permutation(perm);
      Schedule given;
      given.reserve(groups.size());
      for (int k : back) given.push_back(groups[static_cast<size_t>(k)]);
      groups = std::move(given);
      reorder_tables(t, groups, back);
    }
    order = o;
    run_in(o);
  };
  // Execution decides against this budget: the user's, unless the plan was only found at a
  // tighter one (below).
  size_t executes_at = options.budget;
  // How victims are chosen; a plan made once is chosen among a few ways (plan_step_best).
  memory::PlannerOptions policy = planned;
  size_t fitted_for = 0, kept_in_gaps = 0;
  double reserve_cost = 0;
  std::shared_ptr<const memory::StepPlan> reused =
      settled ? stored_plan(key, order, t.graph, planned.budget, &executes_at, &policy, &fitted_for,
                            &kept_in_gaps, &reserve_cost)
              : nullptr;
  memory::StepPlan simulated;  // planned now, when no stored plan applies
  // Offline placement (CPU): the plan says when every value is allocated and freed.
  const bool place = !t.device.is_cuda() && arena_enabled();
  // With an arena, the plan is fitted so that the arena and the blocks beside it keep the
  // budget too (memory/arena_fit.h).
  std::optional<memory::ArenaFit> fit;
  // The values' sizes in the arena (a kernel order does not change them).
  const std::vector<size_t> sizes = place ? arena_sizes(t) : std::vector<size_t>{};
  // What the pool reserves for them: the arena's segment, and beside it the free space of
  // the segments that hold the parameters and state already there.
  memory::PoolReserve pool_reserve;
  if (place && options.budget > 0) {
    memory::CachingPool& pool = pool_of(t.device);
    pool_reserve.arena_segment = &memory::CachingPool::arena_segment;
    const size_t in_use = pool.reserved_in_use();  // walks the free lists once
    pool_reserve.outside_slack = in_use - std::min(in_use, pool.allocated());
  }
  if (options.budget > 0 && !reused) {
    if (place) {
      fit = memory::fit_to_budget(t.graph, planned, sizes, settled, reserve_limit, pool_reserve);
      if (settled && fit->plan.feasible && !fit->holds) {
        // The order was chosen for the least recomputation, not for packing: another order
        // may fit its reserve in the budget where this one cannot. The plan made once
        // takes the one of the others that does with the least recomputation, if that is
        // within the limit of this order's plan.
        const memory::ScheduleOrder chosen = order;
        std::optional<memory::ScheduleOrder> better;
        // As within one order: for at most a little more work than this order's plan.
        double limit = fit->plan.extra_cost + reserve_limit * fit->plan.base_cost;
        for (memory::ScheduleOrder other : memory::all_orders()) {
          if (other == chosen) continue;
          switch_to(other);
          memory::ArenaFit tried =
              memory::fit_to_budget(t.graph, planned, sizes, true, reserve_limit, pool_reserve);
          if (tried.plan.feasible && tried.holds && tried.plan.extra_cost <= limit)
            better = other, limit = tried.plan.extra_cost, fit = std::move(tried);
        }
        switch_to(better ? *better : chosen);
        if (better) remember_order(key, order);
      }
      simulated = fit->plan;
      policy = fit->policy;
    } else {
      if (settled) {
        simulated = memory::plan_step_best(t.graph, planned, &policy);
        simulated = memory::search_evictions(t.graph, std::move(simulated), policy);
      } else {
        simulated = memory::plan_step(t.graph, planned);
      }
    }
    if (!simulated.feasible) {
      // Near the floor an order chosen with earlier costs may no longer fit with today's
      // measured ones: back to the given order, and choose again before refusing.
      switch_to(memory::ScheduleOrder::Given);
      order = profile_and_order(key, t.graph, planned, tail, timed, &settled, true);
      run_in(order);
      // Near the floor the greedy may give up at this budget and fit a tighter one;
      // execution then decides against the tighter budget too, so that it takes the same
      // path.
      size_t used = planned.budget;
      policy = planned;
      fit.reset();
      simulated = memory::plan_within(t.graph, planned, &used);
      if (simulated.feasible && used < planned.budget)
        executes_at =
            std::min(options.budget, static_cast<size_t>(static_cast<double>(used) / margin));
    }
    if (!simulated.feasible) raise_over_budget(t, groups, options, simulated, tail);
    if (settled)
      store_plan(key, order, t.graph, planned.budget, executes_at, simulated, policy,
                 fit ? &*fit : nullptr);
    if (fit)
      fitted_for = fit->planned_for, kept_in_gaps = fit->kept_in_gaps,
      reserve_cost = fit->reserve_cost;
  }

  std::shared_ptr<const memory::ArenaPlan> arena_plan;
  if (place && options.budget == 0 && !reused) {
    simulated = memory::plan_step(t.graph, options);
    if (settled) store_plan(key, order, t.graph, planned.budget, 0, simulated, policy, nullptr);
  }
  const memory::StepPlan& step_plan = reused ? *reused : simulated;
  if (place)
    arena_plan = arena_for(key, t, step_plan.actions, sizes, settled, fit ? &fit->arena : nullptr);
  const double planner_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - planning_started).count();

  const bool record = memory::step_recording();
  // Under a budget the plan counts the arena's own segment, so a bigger cached one (an
  // earlier unbudgeted step's) is not taken for it.
  OpenArena arena(pool_of(t.device), arena_plan ? arena_plan->bytes : 0, options.budget > 0);
  JitMachine machine(groups, t, run, record, arena_plan.get(), arena.base());
  memory::PlannerOptions execution = policy;
  execution.budget = executes_at;
  // Execution makes the plan's evictions where the plan made them (a plan kept values in
  // the arena's gaps that the budget's own choice would release), and chooses by score only
  // what the real allocations need more.
  execution.follow = &step_plan.chosen;
  memory::StepPlan done = memory::execute_step(t.graph, execution, machine);
  if (timed) remember_times(key, machine.seconds_, perm);

  memory::PlanSummary s;
  s.pool = pool_of(t.device).name();
  s.budget = options.budget;
  s.start_bytes = t.graph.start_bytes;
  s.lower_bound = done.lower_bound;
  s.planned_peak = options.budget > 0 ? step_plan.peak : done.peak;
  s.measured_peak = done.peak;
  s.within_budget = options.budget == 0 || done.peak <= options.budget;
  s.kernels = t.graph.kernels.size();
  s.in_place = machine.in_place_;
  s.donated = machine.donated_;
  s.released_leaves = machine.released_leaves_;
  s.recomputes = done.recomputes;
  s.evictions = done.evictions;
  s.evicted_bytes = done.evicted_bytes;
  // Without a budget every eviction is a checkpoint's, none the fallback's.
  s.fallback_evictions = options.budget > 0 && done.evictions > step_plan.evictions
                             ? done.evictions - step_plan.evictions
                             : 0;
  s.base_cost = done.base_cost;
  s.extra_cost = done.extra_cost;
  s.planner_ms = planner_ms;
  s.plan_reused = reused != nullptr;
  s.order = memory::order_name(order);
  if (arena.base() != nullptr) {
    s.arena_bytes = arena_plan->bytes;
    s.arena_live_peak = arena_plan->live_peak;
    s.arena_values = machine.arena_values_;
    s.arena_misses = machine.arena_misses_;
    s.arena_strayed_at = machine.strayed_ ? machine.next_run_ + 1 : 0;
    if (options.budget > 0 && fitted_for > 0) {
      s.planned_for = fitted_for;
      s.kept_in_gaps = kept_in_gaps;
      s.planned_reserve = pool_reserve.reserved(*arena_plan);
      s.reserve_pinned = pool_reserve.outside_slack;
      s.reserve_over_budget = s.planned_reserve > planned.budget;
      s.reserve_cost = reserve_cost;
    }
  }
  std::unordered_set<int> in_place(machine.in_place_kernels_.begin(),
                                   machine.in_place_kernels_.end());
  for (size_t v = 0; v < t.nodes.size(); ++v) {
    const PlanValue& pv = t.graph.values[v];
    // What the step adds and keeps: results not written over a value they replaced.
    if (pv.output && pv.producer >= 0 && !in_place.count(pv.producer)) s.output_bytes += pv.bytes;
    if (pv.producer < 0) continue;
    ++s.values;
    if (machine.evictions_[v] == 0) {
      ++s.kept_values;
      s.kept_bytes += pv.bytes;
      continue;
    }
    s.recomputed.push_back({kernel_name(*groups[static_cast<size_t>(pv.producer)]),
                            value_shape(t.nodes[v]), pv.bytes, machine.evictions_[v],
                            machine.rebuilds_[v]});
  }
  std::stable_sort(s.recomputed.begin(), s.recomputed.end(),
                   [](const auto& a, const auto& b) { return a.bytes > b.bytes; });

  memory::StepRecord r;
  r.pool = s.pool;
  r.budget = s.budget;
  r.start_bytes = s.start_bytes;
  r.planned_peak = s.planned_peak;
  r.measured_peak = s.measured_peak;
  r.lower_bound = s.lower_bound;
  r.recomputed_kernels = s.recomputes;
  r.evicted_values = s.evictions;
  r.base_cost = s.base_cost;
  r.extra_cost = s.extra_cost;
  r.planner_ms = planner_ms;
  r.step_ms = machine.us() / 1000.0;
  if (record) {
    for (const FusionGroup* g : groups) r.kernels.push_back(kernel_name(*g));
    r.phases = kernel_phases(t, groups);
    for (size_t v = 0; v < t.nodes.size(); ++v) {
      const PlanValue& pv = t.graph.values[v];
      r.values.push_back({pv.producer >= 0 ? r.kernels[static_cast<size_t>(pv.producer)] : "leaf",
                          value_shape(t.nodes[v]), pv.bytes, pv.producer, pv.output});
    }
    r.events = std::move(machine.events_);
  }
  memory::set_last_plan(std::move(s));
  memory::set_last_step(std::move(r));
}

}  // namespace kiln::jit
