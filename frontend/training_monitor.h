#pragma once
// Watching a training run: per step, the loss, the gradient norm, memory against the budget
// (or the device) and throughput, shown as one progress line, optionally logged as CSV and
// JSON lines, with a warning when the norm stops being finite or memory crosses a share of
// the limit.
//
// The monitor adds no evaluation to a step. The gradient norm is a lazy tensor built into
// the step's graph (grad_norm(), or the norm clip_grad_norm already returns), requested in
// the same kiln::eval as the loss; memory comes from the pool's counters and the planner's
// measurement of the step; time from the wall clock.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "../core/device.h"
#include "../core/tensor.h"

namespace kiln::optim {
class Optimizer;
}

namespace kiln {

/// How TrainingMonitor shows progress.
enum class ProgressDisplay {
  Auto,      ///< Terminal when the stream is std::cout or std::cerr on a terminal, else Lines.
  Terminal,  ///< One line redrawn in place with a carriage return (at most ten times a second).
  Lines,     ///< A plain line every `print_every` steps (logs, CI, pipes).
  Off,       ///< Nothing but warnings.
};

/// TrainingMonitor's settings (designated initializers, in this order).
struct TrainingMonitorOptions {
  /// Steps the run will take, for "step 12/400" (0: unknown).
  int64_t total_steps = 0;
  /// What step()'s count counts: the display shows "<unit>/s".
  std::string unit = "samples";
  /// Where the progress line goes (nullptr: nowhere, as Off).
  std::ostream* stream = &std::cout;
  ProgressDisplay display = ProgressDisplay::Auto;
  /// Steps between plain lines (0: ten lines over total_steps, or every 100 without it).
  int64_t print_every = 0;
  /// Weight of the past in the displayed loss (an exponential average; 0: the step's own).
  double loss_smoothing = 0;
  /// Writes one CSV row per step here ("" : no file); the header names the columns.
  std::string csv_path{};
  /// Writes one JSON object per step and line here ("" : no file).
  std::string jsonl_path{};
  /// Warn when a step's memory peak reaches this share of the limit (0: never).
  double memory_warning = 0.85;
  /// Where warnings go (nullptr: only warnings() keeps them).
  std::ostream* warning_stream = &std::cerr;
  /// The device whose pool is watched (default_device() when empty).
  std::optional<Device> device{};
  /// Logs the learning rate of its first parameter group when given (must outlive the
  /// monitor).
  const optim::Optimizer* optimizer = nullptr;
};

/// One step as the monitor saw it.
struct StepMetrics {
  int64_t step = 0;            ///< 1-based.
  double loss = 0;             ///< NaN without a loss.
  double smoothed_loss = 0;    ///< The displayed loss (see loss_smoothing).
  double grad_norm = 0;        ///< Total 2-norm of the gradients; NaN without one.
  double lr = 0;               ///< NaN without an optimizer.
  int64_t samples = 0;         ///< step()'s count.
  double seconds = 0;          ///< Wall time since the previous step (or restart_clock()).
  double throughput = 0;       ///< samples / seconds.
  double elapsed = 0;          ///< Wall time since construction.
  size_t memory_peak = 0;      ///< Highest bytes allocated during the step's evaluation.
  size_t memory_current = 0;   ///< Bytes allocated after it.
  size_t memory_reserved = 0;  ///< Bytes the pool holds (allocated and cached).
  size_t memory_limit = 0;     ///< The budget, else the pool's limit, else the device's memory.
  double memory_fraction = 0;  ///< memory_peak / memory_limit.
  bool nonfinite_grad_norm = false;  ///< The norm is NaN or infinite.
  bool over_memory_warning = false;  ///< memory_fraction reached the warning share.
};

/// Watches a training loop. Typical use, one evaluation per step:
///
///     TrainingMonitor monitor(model->parameters(), {.total_steps = n, .unit = "tokens"});
///     loss.backward();
///     Tensor norm = monitor.grad_norm();   // or monitor.watch_grad_norm(clip_grad_norm(...))
///     opt.step();
///     eval({loss, norm});                  // the norm is computed with the step
///     monitor.step(loss, tokens_in_batch);
class TrainingMonitor {
 public:
  /// Watches the gradients of `params`. Opens the log files (IOError when one cannot be
  /// written); ValueError for a negative total_steps or print_every, a loss_smoothing outside
  /// [0, 1) or a memory_warning outside [0, 1].
  explicit TrainingMonitor(std::vector<Tensor> params, TrainingMonitorOptions options = {});
  /// Ends the progress line and closes the logs (finish()).
  ~TrainingMonitor();
  TrainingMonitor(const TrainingMonitor&) = delete;
  TrainingMonitor& operator=(const TrainingMonitor&) = delete;

  /// The total 2-norm of the parameters' current gradients as a lazy rank-0 tensor (float32,
  /// or float64 for float64 gradients), remembered for the next step(). Call it after
  /// backward() (after GradScaler::unscale_ under loss scaling) and evaluate it with the loss.
  Tensor grad_norm();
  /// Uses `norm` (e.g. clip_grad_norm's result, the norm before clipping) as this step's
  /// gradient norm instead of building another.
  void watch_grad_norm(const Tensor& norm);
  /// Records a step once its evaluation ran: reads `loss` (may be undefined) and the norm,
  /// the pool's memory and the time since the previous step, then displays, logs and warns.
  /// A loss or norm that is not evaluated yet is evaluated here, both at once, and counted
  /// in extra_evaluations().
  const StepMetrics& step(const Tensor& loss, int64_t samples);
  /// Starts the next step's clock now, so that work between steps (a test pass, sampling)
  /// does not count as the next step's time.
  void restart_clock();
  /// Text shown after the metrics on the progress line (e.g. "epoch 3, train acc 97.1%").
  void set_status(std::string text) { status_ = std::move(text); }
  /// Prints a line of text, ending the progress line first so the two do not overwrite.
  void print(const std::string& line);
  /// Ends the progress line, prints a one-line summary of the run when any step was
  /// recorded, and closes the logs; later calls do nothing.
  void finish();

  /// The last step recorded (all zeros before the first).
  const StepMetrics& last() const { return last_; }
  /// The first step recorded.
  const StepMetrics& first() const { return first_; }
  /// Every warning issued so far, in order.
  const std::vector<std::string>& warnings() const { return warnings_; }
  /// Evaluations step() had to run because the loss or norm was not evaluated with the step.
  int64_t extra_evaluations() const { return extra_evaluations_; }
  /// The CSV and JSON-lines columns, in order.
  static const std::vector<std::string>& columns();

 private:
  void measure_memory(StepMetrics& m);
  void check_warnings(const StepMetrics& m);
  void warn(const std::string& message);
  void display(const StepMetrics& m);
  void end_line();
  std::string progress_line(const StepMetrics& m) const;
  void write_logs(const StepMetrics& m);

  using Clock = std::chrono::steady_clock;
  std::vector<Tensor> params_;
  TrainingMonitorOptions options_;
  Device device_;
  size_t device_memory_ = 0;        // the device's total bytes, read once
  std::ostream* stream_ = nullptr;  // the progress line's stream; null when Off
  bool terminal_ = false;
  std::ofstream csv_, jsonl_;
  Tensor norm_;
  Clock::time_point started_, mark_, last_drawn_;
  StepMetrics first_, last_, peak_;  // peak_: the step with the highest memory peak
  std::string status_;
  std::string limit_kind_;  // what memory_limit is: "budget", "pool limit", "RAM", ...
  bool line_open_ = false;  // a Terminal line is drawn and not ended
  bool finished_ = false;
  bool norm_bad_ = false;      // the previous step's norm was not finite
  bool memory_high_ = false;   // the previous step was over the memory warning
  int64_t shown_samples_ = 0;  // samples and seconds since the last line drawn
  double shown_seconds_ = 0;
  int64_t samples_total_ = 0;
  double seconds_total_ = 0;
  int64_t nonfinite_steps_ = 0;
  int64_t extra_evaluations_ = 0;
  std::vector<std::string> warnings_;
};

}  // namespace kiln
