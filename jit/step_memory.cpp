#include "step_memory.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <unordered_map>

#include "../core/error.h"
#include "../core/settings.h"
#include "../memory/memory.h"
#include "../memory/planner/plan_step.h"
#include "../memory/pools/budget.h"
#include "../memory/pools/caching_pool.h"
#include "../memory/pools/device_pools.h"
#include "../memory/pools/host_pool.h"
#include "../memory/reports/plan_report.h"
#include "../memory/reports/step_graph_file.h"
#include "../memory/reports/step_record.h"
#include "kernel_ir.h"

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
  // A long list ends with the root's op, so that a name says what the kernel writes (a
  // forward value's bits, pack_bits, whose sources are the forward ops it reads).
  if (names.size() > 4) {
    const std::string last = g.root->origin ? g.root->origin : std::string(op_name(g.root->op));
    const bool listed = std::find(names.begin(), names.begin() + 4, last) != names.begin() + 4;
    out += listed ? "+..." : "+...+" + last;
  }
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

// The nodes `group` may read at another element than the output's: every input of a
// reindex member, and what reaches it through elementwise members inside the group. A
// reduction inside the group is a row stage (lowering makes it one or refuses): it reads
// the row it is computed for, before the row's elements are written, and those elements
// share the output's shape, so through elementwise ops it reads only that row.
std::unordered_set<const Node*> read_off_index(const FusionGroup& group) {
  std::unordered_set<const Node*> inside(group.members.begin(), group.members.end());
  std::unordered_set<const Node*> read, seen;
  std::vector<const Node*> stack;
  for (const Node* m : group.members)
    if (op_family(m->op) != OpFamily::Elementwise && m->op != OpCode::ReindexReduce)
      stack.push_back(m);
  while (!stack.empty()) {
    const Node* m = stack.back();
    stack.pop_back();
    for (const NodePtr& in : m->inputs) {
      read.insert(in.get());
      if (inside.count(in.get()) && in->op != OpCode::ReindexReduce && seen.insert(in.get()).second)
        stack.push_back(in.get());
    }
  }
  return read;
}

// reads_at_output_index, with the group's read_off_index computed once for all its inputs
// (`off_index` holds it after the first call that needs it).
bool reads_at_output_index(const FusionGroup& group, const Node* input,
                           std::optional<std::unordered_set<const Node*>>& off_index) {
  const Node* root = group.root;
  // An accumulation adds the product into its input element by element.
  if (group.library)
    return group.gemm.sum && input == group.gemm.accumulate && input->nbytes() == root->nbytes();
  if (op_family(root->op) != OpFamily::Elementwise || input->shape != root->shape ||
      input->nbytes() != root->nbytes())
    return false;
  if (!off_index) off_index = read_off_index(group);
  return off_index->count(input) == 0;
}

// Lists, per kernel, the inputs whose buffer its output may take over if it reads them
// last: on its device, read only at its own output element, and not kept by anything.
// The planner picks among them for the order the kernels run in (memory::assign_in_place).
void list_in_place_candidates(StepTables& t, const Schedule& groups) {
  for (size_t k = 0; k < groups.size(); ++k) {
    const FusionGroup& g = *groups[k];
    if (g.root->op == OpCode::Transfer) continue;
    PlanKernel& pk = t.graph.kernels[k];
    std::optional<std::unordered_set<const Node*>> off_index;
    for (int v : pk.inputs) {
      const PlanValue& pv = t.graph.values[static_cast<size_t>(v)];
      Node* n = t.nodes[static_cast<size_t>(v)];
      if (pv.output || n->device != g.root->device || (pv.producer < 0 && !pv.releasable_leaf) ||
          !reads_at_output_index(g, n, off_index))
        continue;
      pk.in_place_candidates.push_back(v);
    }
  }
}

// Whether `group` is a generated kernel of elementwise and reindex members only (no
// reduction, library call, transfer or user kernel): what a reader can compute inside itself.
bool elementwise_group(const FusionGroup& g) {
  if (g.library) return false;
  for (const Node* m : g.members) {
    const OpFamily f = op_family(m->op);
    if (f != OpFamily::Elementwise && f != OpFamily::Reindex && f != OpFamily::Source) return false;
  }
  return true;
}

// Whether generated kernel `reader` may compute its input `v` itself: it reads v only at
// its own coordinates or fewer (never through a widening reindex, which would repeat the
// work per output, nor as an index tensor), and v rounds to nothing on being stored (a
// half-precision value computed inline would keep float32 bits the stored one drops).
bool can_compute_inside(const FusionGroup& reader, const Node* v) {
  if (reader.library || reader.root->op == OpCode::Transfer || reader.root->op == OpCode::Custom)
    return false;
  if (v->dtype == DType::Float16 || v->dtype == DType::BFloat16) return false;
  for (const Node* m : reader.members) {
    const OpFamily f = op_family(m->op);
    if (f == OpFamily::Transfer || f == OpFamily::Custom) return false;
    for (size_t i = 0; i < m->inputs.size(); ++i) {
      if (m->inputs[i].get() != v) continue;
      if (i > 0 && (f == OpFamily::Reindex || f == OpFamily::ReindexReduce)) return false;
      if (f == OpFamily::Reindex && m->numel() > v->numel()) return false;
    }
  }
  return true;
}

// Lists, per generated kernel on the CPU, the inputs it may rebuild inside itself (fused
// rebuilds, memory::InlineInput): made by an elementwise kernel on the same device, read as
// can_compute_inside allows. The share of the producer's cost charged for it is the traffic
// the fused kernel adds (the producer's inputs it does not read already, less the value it
// no longer reads) over the producer's own (its inputs and its output), and at least a
// quarter for the arithmetic. KILN_DISABLE_INLINE_REBUILD=1 lists none.
void list_inline_inputs(StepTables& t, const Schedule& groups) {
  if (t.device.is_cuda() || pass_disabled("INLINE_REBUILD")) return;
  std::vector<char> elementwise(groups.size(), 0);
  for (size_t k = 0; k < groups.size(); ++k)
    elementwise[k] = groups[k]->root->device == t.device && elementwise_group(*groups[k]);
  for (size_t k = 0; k < groups.size(); ++k) {
    const FusionGroup& g = *groups[k];
    if (g.root->device != t.device) continue;
    PlanKernel& pk = t.graph.kernels[k];
    for (int v : pk.inputs) {
      const PlanValue& pv = t.graph.values[static_cast<size_t>(v)];
      if (pv.producer < 0 || pv.output || !elementwise[static_cast<size_t>(pv.producer)]) continue;
      const Node* value = t.nodes[static_cast<size_t>(v)];
      if (!can_compute_inside(g, value)) continue;
      const FusionGroup& producer = *groups[static_cast<size_t>(pv.producer)];
      double read = 0, added = 0;
      for (const Node* in : producer.inputs) {
        read += static_cast<double>(in->nbytes());
        if (std::find(g.inputs.begin(), g.inputs.end(), in) == g.inputs.end())
          added += static_cast<double>(in->nbytes());
      }
      const double own = static_cast<double>(value->nbytes());
      const double share = std::max((added - own) / std::max(read + own, 1.0), 0.25);
      pk.inline_inputs.push_back({v, std::min(share, 1.0)});
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

  list_in_place_candidates(t, groups);
  list_inline_inputs(t, groups);
  memory::assign_in_place(t.graph);
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
std::vector<memory::StepPhase> kernel_phases(const memory::StepGraph& graph, const StepTables& t,
                                             const Schedule& groups) {
  const size_t n = groups.size();
  std::vector<memory::StepPhase> phases(n, memory::StepPhase::Forward);
  auto flows = [](const Node* node) { return node->requires_grad && !node->grad_leaf; };
  if (std::none_of(groups.begin(), groups.end(),
                   [&](const FusionGroup* g) { return flows(g->root); }))
    return phases;
  std::vector<char> after_gradients(n, 0), reads_replaced(n, 0);
  std::vector<std::vector<size_t>> readers(n);
  for (size_t k = 0; k < n; ++k) {
    for (int v : graph.kernels[k].inputs) {
      const int producer = graph.values[static_cast<size_t>(v)].producer;
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

// Runs the planner's actions on the real nodes and records what happened.
class JitMachine final : public memory::StepMachine {
 public:
  // `arena`, when given, places outputs at `plan`'s offsets in the arena at that base.
  // `graph` is the tables in the order `groups` run (the StepPlan's).
  JitMachine(const Schedule& groups, const memory::StepGraph& graph, const StepTables& t,
             const GroupRunner& run, bool record, const memory::ArenaPlan* plan = nullptr,
             void* arena = nullptr)
      : groups_(groups),
        graph_(graph),
        t_(t),
        run_(run),
        pool_(pool_of(t.device)),
        record_(record),
        arena_plan_(plan),
        arena_(arena),
        evictions_(t.nodes.size(), 0),
        rebuilds_(t.nodes.size(), 0),
        runs_(graph.kernels.size(), 0),
        seconds_(graph.kernels.size(), -1.0) {}

  size_t in_use() override { return pool_.allocated(); }

  size_t bytes_for(int v) override {
    const Node* n = t_.nodes[static_cast<size_t>(v)];
    return n->device == t_.device ? pool_.block_size_for(n->nbytes()) : 0;
  }

  void run(int k, bool recompute, bool in_place, const std::vector<int>& inlined) override {
    const FusionGroup& g = *groups_[static_cast<size_t>(k)];
    // With kernels inlined this run is another kernel (compiled on its first run): its time
    // is not recorded as k's.
    std::optional<FusionGroup> fused;
    if (!inlined.empty()) fused = with_inlined(g, inlined);
    const PlanKernel& pk = graph_.kernels[static_cast<size_t>(k)];
    Node* donor = in_place ? t_.nodes[static_cast<size_t>(pk.in_place_input)] : nullptr;
    follow_plan(k);
    bool reused = false;
    // A result kept past the step must not take over a part of the arena (only a run that
    // strayed from the plan would ask): it would hold the arena's block after the step.
    const bool arena_donor = donor && in_arena_[static_cast<size_t>(pk.in_place_input)];
    if (donor && donor->buffer && donor->buffer.use_count() == 1 && !g.root->device.is_cuda() &&
        !(arena_donor && graph_.values[static_cast<size_t>(pk.output)].output)) {
      g.root->buffer = donor->buffer;  // the donor still reads it during the kernel
      reused = true;
    }
    const bool placed = !reused && place_in_arena(k, g);
    in_arena_[static_cast<size_t>(pk.output)] = placed || (reused && arena_donor);
    ++runs_[static_cast<size_t>(k)];
    const double start = us();
    try {
      if (fused)
        run_inlined(*fused, g, inlined);
      else
        run_(g);
    } catch (...) {
      if (reused || placed) g.root->buffer.reset();
      throw;
    }
    if (reused) in_place_kernels_.push_back(k);
    if (donor) {
      donor->buffer.reset();  // taken over, or (on CUDA) released once the kernel has read it
      ++in_place_;
      if (graph_.values[static_cast<size_t>(pk.in_place_input)].producer < 0) {
        donor->donated = true;
        ++donated_;
        ++released_leaves_;
      }
    }
    if (recompute)
      ++rebuilds_[static_cast<size_t>(pk.output)];
    else if (!fused)
      seconds_[static_cast<size_t>(k)] = (us() - start) * 1e-6;
    if (record_)
      events_.push_back({recompute ? StepEvent::Kind::Recompute : StepEvent::Kind::Run, k,
                         pk.output, graph_.values[static_cast<size_t>(pk.output)].bytes,
                         pool_.allocated(), reused || (donor != nullptr), start, us()});
  }

  // Runs `fused` (kernel `g` with the kernels `inlined` inside it). Should lowering refuse
  // the merged group (a row stage it cannot place), the inlined kernels run on their own
  // first, into buffers released once `g` has read them: more memory for one kernel, the
  // same results.
  void run_inlined(const FusionGroup& fused, const FusionGroup& g,
                   const std::vector<int>& inlined) {
    try {
      run_(fused);
      return;
    } catch (const RowsUnsupported&) {
    }
    std::vector<Node*> made;
    try {
      for (int p : inlined) {
        const FusionGroup& producer = *groups_[static_cast<size_t>(p)];
        if (producer.root->buffer) continue;
        run_(producer);
        made.push_back(producer.root);
      }
      run_(g);
    } catch (...) {
      for (Node* n : made) n->buffer.reset();
      throw;
    }
    for (Node* n : made) n->buffer.reset();
  }

  // Kernel k's group with the kernels `inlined` computed inside it (a fused rebuild): their
  // members and k's, reading what they read but not their outputs.
  FusionGroup with_inlined(const FusionGroup& g, const std::vector<int>& inlined) {
    FusionGroup fused;
    fused.root = g.root;
    std::unordered_set<Node*> members, computed;
    for (int p : inlined) {
      const FusionGroup& from = *groups_[static_cast<size_t>(p)];
      computed.insert(from.root);
      ++rebuilds_[static_cast<size_t>(graph_.kernels[static_cast<size_t>(p)].output)];
      for (Node* m : from.members)
        if (members.insert(m).second) fused.members.push_back(m);
    }
    for (Node* m : g.members)
      if (members.insert(m).second) fused.members.push_back(m);
    auto read = [&](Node* in) {
      if (!computed.count(in) &&
          std::find(fused.inputs.begin(), fused.inputs.end(), in) == fused.inputs.end())
        fused.inputs.push_back(in);
    };
    for (Node* in : g.inputs) read(in);
    for (int p : inlined)
      for (Node* in : groups_[static_cast<size_t>(p)]->inputs) read(in);
    return fused;
  }

  void release(int v, bool evict) override {
    Node* n = t_.nodes[static_cast<size_t>(v)];
    n->buffer.reset();
    if (graph_.values[static_cast<size_t>(v)].producer < 0) {
      n->donated = true;
      ++released_leaves_;
    }
    if (evict) ++evictions_[static_cast<size_t>(v)];
    if (record_) {
      const double now = us();
      events_.push_back({evict ? StepEvent::Kind::Evict : StepEvent::Kind::Free, -1, v,
                         graph_.values[static_cast<size_t>(v)].bytes, pool_.allocated(), false, now,
                         now});
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
  const memory::StepGraph& graph_;
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

// The error for a budget the step cannot be planned within, with the planner's figures
// (memory::StepPlan) in terms of the step's kernels and values.
[[noreturn]] void raise_over_budget(const StepTables& t, const memory::StepPlan& step,
                                    const Schedule& groups, size_t budget) {
  const memory::StepGraph& graph = step.graph;
  const memory::RecomputePlan& plan = *step.actions;
  const size_t unplanned = step.unplanned_peak, smallest = step.smallest_budget;
  const int at = step.bound_kernel;
  const std::string pool = pool_of(t.device).name();
  std::string where;
  if (at >= 0) {
    const memory::PlanKernel& k = graph.kernels[static_cast<size_t>(at)];
    size_t in = 0;
    for (int v : k.inputs) in += graph.values[static_cast<size_t>(v)].bytes;
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
      memory::format_bytes(budget) + " on the " + pool + ": it needs at least " +
      memory::format_bytes(plan.lower_bound) + " (lower bound: what is resident when it starts, " +
      memory::format_bytes(graph.start_bytes) + ", plus the largest working set of one kernel" +
      where +
      "), and the smallest budget the planner "
      "fits it into is " +
      memory::format_bytes(smallest) + " (" + std::to_string(smallest) + " bytes; unplanned peak " +
      memory::format_bytes(unplanned) + ", " + std::to_string(graph.kernels.size()) +
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

// The bytes each value takes in the arena. The tables see the pool's size classes; offsets
// depend on the exact sizes too.
std::vector<size_t> arena_sizes(const StepTables& t) {
  std::vector<size_t> bytes(t.nodes.size(), 0);
  for (size_t v = 0; v < t.nodes.size(); ++v)
    if (const Node* n = t.nodes[v]; n->device == t.device && n->nbytes() > 0)
      bytes[v] = (n->nbytes() + 63) / 64 * 64;
  return bytes;
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

// What planning this step must respect: the budget, how kernels run on its device, and on
// the CPU the arena's sizes and what the pool reserves beside it.
memory::PlanRequest plan_request(const StepTables& t, size_t tail, size_t budget) {
  memory::PlanRequest request;
  request.budget = budget;
  request.margin = memory::plan_margin();
  request.fixed_tail = tail;
  // Kernels on a GPU run asynchronously: timing their launches would say nothing.
  request.timed = !t.device.is_cuda();
  request.reserve_limit = memory::reserve_work_limit();
  // Offline placement (CPU): the plan says when every value is allocated and freed.
  request.arena = !t.device.is_cuda() && arena_enabled();
  if (request.arena) request.arena_bytes = arena_sizes(t);
  if (request.arena && budget > 0) {
    // What the pool reserves beside the arena's own segment: the free space of the segments
    // that hold the parameters and state already there.
    memory::CachingPool& pool = pool_of(t.device);
    request.pool.arena_segment = &memory::CachingPool::arena_segment;
    const size_t in_use = pool.reserved_in_use();  // walks the free lists once
    request.pool.outside_slack = in_use - std::min(in_use, pool.allocated());
  }
  return request;
}

}  // namespace

bool reads_at_output_index(const FusionGroup& group, const Node* input) {
  std::optional<std::unordered_set<const Node*>> off_index;
  return reads_at_output_index(group, input, off_index);
}

void run_with_memory_plan(const FusionPlan& plan, const std::unordered_set<Node*>& outputs,
                          const std::vector<Node*>& original, const std::vector<Node*>& simplified,
                          const GroupRunner& run) {
  const auto planning_started = Clock::now();
  size_t tail = 0;
  const Schedule given = updates_last(plan, outputs, tail);
  const StepTables t = build_tables(given, outputs, original, simplified);
  const size_t budget = memory::budget(t.device);

  const memory::PlanRequest request = plan_request(t, tail, budget);
  const memory::StepPlan step = memory::plan_step(t.graph, request);
  Schedule groups;
  groups.reserve(given.size());
  for (int k : step.perm) groups.push_back(given[static_cast<size_t>(k)]);

  // The tables as given, with the costs the planner used.
  if (const std::string dump = memory::plan_dump_path(updated_tensors(t) > 0); !dump.empty()) {
    memory::StepGraphFile file{t.graph, {}, budget, tail};
    for (size_t i = 0; i < step.perm.size(); ++i)
      file.graph.kernels[static_cast<size_t>(step.perm[i])].cost = step.graph.kernels[i].cost;
    for (const FusionGroup* g : given) file.kernel_names.push_back(kernel_name(*g));
    memory::save_step_graph(file, dump);
  }
  if (!step.feasible) raise_over_budget(t, step, groups, budget);
  const memory::RecomputePlan& step_plan = *step.actions;
  const std::shared_ptr<const memory::ArenaPlan>& arena_plan = step.arena;
  const double planner_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - planning_started).count();

  const bool record = memory::step_recording();
  // Under a budget the plan counts the arena's own segment, so a bigger cached one (an
  // earlier unbudgeted step's) is not taken for it.
  OpenArena arena(pool_of(t.device), arena_plan ? arena_plan->bytes : 0, budget > 0);
  JitMachine machine(groups, step.graph, t, run, record, arena_plan.get(), arena.base());
  memory::RecomputePlan done = memory::execute_step(step.graph, step.execution(), machine);
  if (request.timed) memory::record_kernel_times(step, machine.seconds_);

  memory::PlanSummary s;
  s.pool = pool_of(t.device).name();
  s.budget = budget;
  s.start_bytes = step.graph.start_bytes;
  s.lower_bound = done.lower_bound;
  s.planned_peak = budget > 0 ? step_plan.peak : done.peak;
  s.measured_peak = done.peak;
  s.within_budget = budget == 0 || done.peak <= budget;
  s.kernels = step.graph.kernels.size();
  s.in_place = machine.in_place_;
  s.donated = machine.donated_;
  s.released_leaves = machine.released_leaves_;
  s.recomputes = done.recomputes;
  s.inlined = done.inlined;
  s.evictions = done.evictions;
  s.evicted_bytes = done.evicted_bytes;
  // Without a budget every eviction is a checkpoint's, none the fallback's.
  s.fallback_evictions =
      budget > 0 && done.evictions > step_plan.evictions ? done.evictions - step_plan.evictions : 0;
  s.base_cost = done.base_cost;
  s.extra_cost = done.extra_cost;
  s.planner_ms = planner_ms;
  s.plan_reused = step.reused;
  s.order = memory::order_name(step.order);
  if (arena.base() != nullptr) {
    s.arena_bytes = arena_plan->bytes;
    s.arena_live_peak = arena_plan->live_peak;
    s.arena_values = machine.arena_values_;
    s.arena_misses = machine.arena_misses_;
    s.arena_strayed_at = machine.strayed_ ? machine.next_run_ + 1 : 0;
    if (budget > 0 && step.fitted_for > 0) {
      s.planned_for = step.fitted_for;
      s.kept_in_gaps = step.kept_in_gaps;
      s.planned_reserve = step.planned_reserve;
      s.reserve_pinned = request.pool.outside_slack;
      s.reserve_over_budget = s.planned_reserve > step.planned_budget;
      s.reserve_cost = step.reserve_cost;
    }
  }
  std::unordered_set<int> in_place(machine.in_place_kernels_.begin(),
                                   machine.in_place_kernels_.end());
  for (size_t v = 0; v < t.nodes.size(); ++v) {
    const PlanValue& pv = step.graph.values[v];
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
    r.phases = kernel_phases(step.graph, t, groups);
    for (size_t v = 0; v < t.nodes.size(); ++v) {
      const PlanValue& pv = step.graph.values[v];
      r.values.push_back({pv.producer >= 0 ? r.kernels[static_cast<size_t>(pv.producer)] : "leaf",
                          value_shape(t.nodes[v]), pv.bytes, pv.producer, pv.output});
    }
    r.events = std::move(machine.events_);
  }
  memory::set_last_plan(std::move(s));
  memory::set_last_step(std::move(r));
}

}  // namespace kiln::jit
