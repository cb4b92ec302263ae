#pragma once
// What one evaluation (a training step, usually) did to memory: every kernel run, rebuild,
// free and eviction in order, with the bytes in use after it. The executor fills it; the
// Chrome trace, the memory-timeline picture and the plan report are drawn from it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::memory {

/// One thing the executor did during a step.
struct StepEvent {
  enum class Kind : uint8_t {
    Run,        ///< a kernel ran for the first time in the step
    Recompute,  ///< a kernel ran again to rebuild a value that had been evicted
    Free,       ///< a value's buffer went back to the pool after its last use
    Evict,      ///< a value's buffer was released early to stay within the budget
  };
  Kind kind = Kind::Run;
  int kernel = -1;        ///< Position of the kernel in the step's schedule.
  int value = -1;         ///< The value (buffer id) written (Run/Recompute) or released.
  size_t bytes = 0;       ///< Bytes allocated (Run/Recompute) or released (Free/Evict).
  size_t in_use = 0;      ///< Bytes allocated in the budgeted pool after the event.
  bool in_place = false;  ///< Run/Recompute wrote into the buffer of a dying input.
  double start_us = 0;    ///< Microseconds since the step began.
  double end_us = 0;      ///< Equal to start_us for Free/Evict.
};

/// One value of the step: a kernel's output or a leaf the step read.
struct StepValue {
  std::string name;     ///< Source ops of the producing kernel ("matmul+relu"), or "leaf".
  std::string shape;    ///< "[256, 1024] float32".
  size_t bytes = 0;     ///< Pool block bytes.
  int producer = -1;    ///< Kernel position, or -1 for a leaf.
  bool output = false;  ///< Kept to the end of the step (a result or a held tensor).
};

/// The part of a training step a kernel belongs to, as its nodes were built: the forward
/// pass (nodes that gradients flow through, and every kernel of a step that has none), the
/// backward pass (the other nodes), or the update (kernels at the end of the step that read
/// a tensor the step replaces, as an optimizer's do).
enum class StepPhase : uint8_t { Forward, Backward, Update };

/// Everything recorded about one evaluation.
struct StepRecord {
  std::string pool;                  ///< The budgeted pool: "host pool", "cuda:0 pool".
  size_t budget = 0;                 ///< Bytes; 0 when no budget was set.
  size_t start_bytes = 0;            ///< Allocated bytes when the step began.
  size_t planned_peak = 0;           ///< The planner's simulated peak.
  size_t measured_peak = 0;          ///< Highest allocated bytes seen after any event.
  size_t lower_bound = 0;            ///< No schedule of this step fits in fewer bytes.
  size_t recomputed_kernels = 0;     ///< Recompute events.
  size_t evicted_values = 0;         ///< Evict events.
  double base_cost = 0;              ///< Estimated seconds of the kernels run once.
  double extra_cost = 0;             ///< Estimated seconds of the recomputations.
  double planner_ms = 0;             ///< Time spent planning.
  double step_ms = 0;                ///< Time from the first to the last event.
  std::vector<std::string> kernels;  ///< Per kernel position: its source ops.
  std::vector<StepPhase> phases;     ///< Per kernel position: forward, backward or update.
  std::vector<StepValue> values;     ///< Per value id.
  std::vector<StepEvent> events;
};

/// Turns recording on or off (default off; the KILN_RECORD_STEPS=1 environment variable
/// turns it on). While off only the summary figures are kept, not names and events.
void set_step_recording(bool on);
/// Whether steps are being recorded.
bool step_recording();
/// The record of the most recent JIT evaluation (summary figures only unless recording).
StepRecord last_step();
/// Stores `record` as the most recent step (the executor calls it after every evaluation).
void set_last_step(StepRecord record);

/// The step as Chrome trace JSON (Perfetto, chrome://tracing): a slice per kernel run and
/// rebuild (named by its source ops), instants for frees and evictions, a counter track of
/// bytes in use and the budget.
std::string chrome_trace_json(const StepRecord& step);
/// The step's memory timeline as an SVG picture: bytes in use over the schedule, the budget
/// line, the planned peak, recomputations marked, and the forward, backward and update
/// phases shaded. The bytes axis fits the curves and lines drawn; a budget far above them
/// (more than 1.5 times their top) is written above the plot instead of drawn.
std::string memory_timeline_svg(const StepRecord& step);
/// The same picture with the curve of `unbudgeted` (the same step run without a budget,
/// e.g. last_step() saved before set_budget) drawn beside the budgeted one, on the same axes.
std::string memory_timeline_svg(const StepRecord& step, const StepRecord& unbudgeted);
/// Writes chrome_trace_json(last_step()) to `path`; throws IOError.
void write_chrome_trace(const std::string& path);
/// Writes memory_timeline_svg(last_step()) to `path`; throws IOError.
void write_memory_timeline(const std::string& path);
/// Writes memory_timeline_svg(last_step(), unbudgeted) to `path`; throws IOError.
void write_memory_timeline(const std::string& path, const StepRecord& unbudgeted);

/// One point of the timeline's bytes-in-use curve: `event` 0 is the step's start, `event` i
/// the state after events[i - 1].
struct TimelinePoint {
  size_t event = 0;
  size_t in_use = 0;
};
/// The curve memory_timeline_svg draws: every point, or when there are more than
/// `max_points` (at least 4), the first and last point and the lowest and highest point of
/// each of (max_points - 2) / 2 equal runs between them, so that the peak stays on the
/// picture however long the step.
std::vector<TimelinePoint> timeline_points(const StepRecord& step, size_t max_points);

}  // namespace kiln::memory
