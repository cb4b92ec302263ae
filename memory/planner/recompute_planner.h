#pragma once
// The RecomputePlanner: fits one evaluation (a whole training step) into a memory budget by
// choosing which values to release early and rebuild just before their next use. It works
// on a table view of the fused schedule (kernels reading and writing values), so it knows
// nothing of nodes or kernels' code and is tested on its own.
//
// The policy is a Belady-style greedy over the static schedule (../shared/RECOMPUTE.md §2a):
// while running the next kernel would exceed the budget, evict the resident value with the
// lowest cost to rebuild it (each distinct kernel of its missing ancestry counted once)
// over its bytes times the distance to its next use, scoring only a sample (the furthest
// next uses plus random ones). Missing inputs are rebuilt immediately before the kernel
// that reads them, ancestors first, on an explicit stack.
//
// The same engine runs in two modes. Planning simulates the bytes in use; executing drives
// a StepMachine that runs the kernels and reports the bytes the pool really has allocated,
// so rounding, fragmentation of sizes and anything else the simulation missed is corrected
// as it happens (the run-time fallback) with the same scores.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::memory {

/// An input that a kernel can compute inside itself from what its producer reads, instead
/// of reading it (a fused rebuild): the producer is elementwise, so a released value need
/// not be made again on its own, in memory of its own, before this kernel reads it.
struct InlineInput {
  int value = -1;      ///< One of the kernel's inputs.
  double share = 1.0;  ///< The fused kernel's extra time, as a share of the producer's cost.
  bool operator==(const InlineInput&) const = default;
};

/// One kernel of the step as the planner sees it.
struct PlanKernel {
  std::vector<int> inputs;   ///< Value ids read (distinct).
  int output = -1;           ///< Value id written.
  double cost = 0;           ///< Estimated run time in seconds.
  bool recomputable = true;  ///< False for kernels that must not run twice (side effects).
  /// A value this kernel may overwrite with its output when it reads it for the last time
  /// (same bytes, read only at the output's own index), or -1.
  int in_place_input = -1;
  /// The inputs this kernel could overwrite were it their last reader, in input order: the
  /// caller knows which ones it reads only at the output's element. assign_in_place picks
  /// in_place_input among them for the order the kernels run in.
  std::vector<int> in_place_candidates = {};
  /// Inputs this kernel can compute inside itself when they are not resident (see
  /// InlineInput); empty where the caller knows of none.
  std::vector<InlineInput> inline_inputs = {};
  /// Nonzero for values made inside kiln::checkpoint: released as soon as their next
  /// reader lies outside that checkpoint region, and rebuilt there.
  uint32_t region = 0;
  /// The output is a result of its checkpoint region: kept like a value made outside it.
  bool region_result = false;

  bool operator==(const PlanKernel&) const = default;
};

/// One value of the step: the output of a kernel, or a leaf resident when the step starts.
struct PlanValue {
  size_t bytes = 0;     ///< Bytes it occupies in the budgeted pool (0 if elsewhere).
  int producer = -1;    ///< Kernel id, or -1 for a leaf.
  bool output = false;  ///< Must be resident at the end; never released.
  /// Leaf whose memory the step may take over after its last read (donation): nothing
  /// outside the step can read it again. Other leaves stay resident throughout.
  bool releasable_leaf = false;

  bool operator==(const PlanValue&) const = default;
};

/// The step: kernels in schedule order, and the values they read and write.
struct StepGraph {
  std::vector<PlanKernel> kernels;
  std::vector<PlanValue> values;
  /// Bytes allocated in the budgeted pool when the step starts (leaves included).
  size_t start_bytes = 0;

  bool operator==(const StepGraph&) const = default;
};

/// Sets each kernel's in_place_input to the first of its in_place_candidates that it reads
/// last in the graph's order (-1 when none): a reorder changes which reads are last.
/// Kernels without candidates keep theirs.
void assign_in_place(StepGraph& graph);

/// What the planner does, in order.
struct PlanAction {
  enum class Kind : uint8_t {
    Run,        ///< run kernel `id` for the first time
    Recompute,  ///< run kernel `id` again, to rebuild its output
    Free,       ///< value `id` is not read again: release it
    Evict,      ///< value `id` is released to make room; it is rebuilt before its next use
    /// kernel `id`'s output is computed inside the Run that follows (a fused rebuild): it is
    /// never allocated, and what kernel `id` reads stays resident through that Run
    Inline,
  };
  Kind kind;
  int id;
  bool in_place = false;  ///< Run: the output takes over its in_place_input's memory.

  bool operator==(const PlanAction&) const = default;
};

/// An eviction made to make room: before the `nth` run (from 0) of kernel `kernel` while the
/// step is at kernel `at` (its own run, or rebuilds for it), value `value` was released.
/// `action` is its index in the plan's actions.
struct ChosenEviction {
  int at = 0, kernel = 0, nth = 0, value = 0, action = 0;
  bool operator==(const ChosenEviction&) const = default;
};

/// The last kernel position at which the step, run unplanned in its given order, holds
/// more than `budget` bytes (values alive from their kernel to their last read, leaves
/// until theirs), or -1 when it never does.
int pressure_end(const StepGraph& graph, size_t budget);

/// How the planner chooses victims: tuning that a plan keeps with it (a stored plan is
/// executed with the tuning it was made with). Plain values only, so it is safe to copy
/// into a cache.
struct PlannerTuning {
  int sample_furthest = 16;     ///< Candidates scored: the furthest next uses ...
  int sample_random = 16;       ///< ... plus this many random others.
  uint64_t seed = 0x6b696c6e;   ///< For the random sample (plans are reproducible).
  double max_extra_cost = 3.0;  ///< Abort when recomputation exceeds this × the step's cost.
  /// Kernel position after which the step no longer exceeds the budget unplanned (see
  /// pressure_end), or -1: a release lasting past it relieves nothing more, so the score's
  /// distance to the next use is counted only up to it.
  int pressure_end = -1;
  /// The score divides the rebuild cost by bytes × distance^distance_power: 1 weighs a
  /// value's distance to its next use like its bytes; below 1 favours cheap rebuilds over
  /// distant ones, above 1 the reverse (simulate_best tries 0.5 and 2 as well).
  double distance_power = 1.0;
};

/// One planning or execution: the tuning plus the constraints of this call. The pointers
/// borrow the caller's lists for the call only; never store a PlannerOptions.
struct PlannerOptions : PlannerTuning {
  size_t budget = 0;  ///< Bytes; 0 means no budget (only liveness and reuse).
  /// Evictions to make where they are listed (those whose value is resident and not in use
  /// there), instead of choosing victims by score; the score still chooses whatever more
  /// the budget needs. Following a plan's own `chosen` reproduces it.
  const std::vector<ChosenEviction>* follow = nullptr;
  /// Evictions the score must not choose: at its place, the listed value is passed over
  /// (search_evictions makes a plan's choices again with one of them avoided).
  const std::vector<ChosenEviction>* avoid = nullptr;
  /// Planning gives up (feasible = false) once its work (RecomputePlan::work) passes this;
  /// 0: no limit. A bound on the cost of a plan that does not read a clock, so the same
  /// tables always give the same answer. Execution ignores it.
  size_t max_work = 0;

  PlannerOptions() = default;
  /// Options for `budget` bytes chosen with `tuning`, following and avoiding nothing.
  PlannerOptions(size_t budget_bytes, const PlannerTuning& tuning)
      : PlannerTuning(tuning), budget(budget_bytes) {}
};

/// The outcome of planning or executing a step.
struct RecomputePlan {
  bool feasible = true;  ///< False when the budget could not be held.
  std::string failure;   ///< Why not, when infeasible.
  std::vector<PlanAction> actions;
  size_t peak = 0;           ///< Highest bytes in use (simulated, or measured in execution).
  size_t lower_bound = 0;    ///< lower_bound(graph).
  double base_cost = 0;      ///< Σ cost of the kernels, once each.
  double extra_cost = 0;     ///< Σ cost of the recomputations (fused rebuilds at their share).
  size_t recomputes = 0;     ///< Recompute actions.
  size_t inlined = 0;        ///< Inline actions (values rebuilt inside their reader).
  size_t evictions = 0;      ///< Evict actions.
  size_t evicted_bytes = 0;  ///< Σ bytes of evicted values.
  /// The evictions made to make room (not those of checkpoint regions), in order.
  std::vector<ChosenEviction> chosen;
  /// Kernels visited while pricing rebuilds of eviction candidates: what planning cost,
  /// counted without a clock. A step that thrashes near its floor visits thousands per
  /// kernel; one with room to spare, a few.
  size_t work = 0;
  bool over_work = false;  ///< Infeasible because max_work was reached.
};

/// Where an executing plan's actions happen: the executor runs kernels and releases buffers
/// and says how many bytes its pool has allocated.
class StepMachine {
 public:
  virtual ~StepMachine() = default;
  /// Bytes allocated in the budgeted pool now.
  virtual size_t in_use() = 0;
  /// Runs kernel `k`; `in_place` asks it to write into its in_place_input's buffer.
  /// `inlined` lists kernels whose outputs `k` computes itself from their inputs (those
  /// outputs are not resident; see InlineInput); empty for a plain run.
  virtual void run(int k, bool recompute, bool in_place, const std::vector<int>& inlined) = 0;
  /// Bytes the pool will hand out for value `v` if it is allocated now.
  virtual size_t bytes_for(int v) = 0;
  /// Releases value `v` (a free after its last read, or an eviction).
  virtual void release(int v, bool evict) = 0;
};

/// Bytes that every schedule of the step needs: what is allocated at the start, and at
/// each kernel what cannot be released by then, plus the outputs made so far, plus the
/// kernel's own inputs and output (less those it can compute itself, InlineInput). No
/// budget below it can work. `at_kernel`, when given, receives
/// the kernel where the bound is reached (-1 when it is the start).
size_t lower_bound(const StepGraph& graph, int* at_kernel = nullptr);

/// Simulates the step under `options.budget` and returns the actions and figures. An
/// infeasible budget gives feasible = false, never a plan that overshoots.
RecomputePlan simulate_step(const StepGraph& graph, const PlannerOptions& options);

/// Runs the step on `machine` with the same policy, deciding against the machine's real
/// bytes in use. When nothing can be evicted the kernel runs anyway: the result has
/// feasible = false and the overshoot is in `peak`.
RecomputePlan execute_step(const StepGraph& graph, const PlannerOptions& options,
                           StepMachine& machine);

/// simulate_step in a few ways, keeping the feasible plan with the least recomputation (then
/// the lower peak, then the first tried): as `options` say, with every candidate scored
/// rather than a sample, with two other sampling seeds, with the distance counted only
/// while the step exceeds the budget, and with distance_power 0.5 and 2. For a plan made
/// once and reused (about eight plannings more). `*chosen` receives the tuning of the plan
/// kept: execution must decide with it to follow it.
RecomputePlan simulate_best(const StepGraph& graph, const PlannerOptions& options,
                            PlannerTuning* chosen);

/// `plan` (made with `options`) with each of its evictions made otherwise in turn
/// (PlannerOptions::avoid; the choices before it followed, the score's after it), keeping
/// whatever needs less recomputation, within a bounded number of plannings. Never more
/// recomputation than `plan`; execute the result following its `chosen` evictions.
RecomputePlan search_evictions(const StepGraph& graph, RecomputePlan plan,
                               const PlannerOptions& options);

/// The smallest budget (in steps of 1/64 of the range above the lower bound) for which
/// simulate_step finds a plan, by bisection between the lower bound and the unbudgeted peak.
size_t smallest_feasible_budget(const StepGraph& graph, const PlannerOptions& options);

}  // namespace kiln::memory
