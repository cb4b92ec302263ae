#include "training_monitor.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

#include "../core/error.h"
#include "../memory/pools/budget.h"
#include "../memory/pools/caching_pool.h"
#include "../memory/pools/device_pools.h"
#include "../memory/pools/host_pool.h"
#include "../memory/reports/plan_report.h"
#include "optim.h"

namespace kiln {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// A terminal line is redrawn at most this often: drawing every step of a loop that runs
// hundreds of steps a second would cost more than the steps.
constexpr auto kRedrawInterval = std::chrono::milliseconds(100);

std::string format(const char* fmt, double value) {
  char text[64];
  std::snprintf(text, sizeof text, fmt, value);
  return text;
}

// The shortest text that reads back as the same double ("0.0002", "29384896"), or "nan" and
// "inf" (which Python's float() and pandas read) for the non-finite.
std::string csv_number(double value) {
  if (!std::isfinite(value)) return std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
  char text[32];
  const std::to_chars_result r = std::to_chars(text, text + sizeof text, value);
  return std::string(text, r.ptr);
}

// JSON has no NaN or infinity: those are null.
std::string json_number(double value) { return std::isfinite(value) ? csv_number(value) : "null"; }

bool stream_is_terminal(const std::ostream* stream) {
  if (stream == &std::cout) return ::isatty(STDOUT_FILENO) == 1;
  if (stream == &std::cerr || stream == &std::clog) return ::isatty(STDERR_FILENO) == 1;
  return false;
}

void open_log(std::ofstream& file, const std::string& path, const char* option) {
  if (path.empty()) return;
  file.open(path, std::ios::out | std::ios::trunc);
  if (!file.is_open())
    throw IOError(std::string("[TrainingMonitor] cannot write ") + option + " '" + path +
                  "': " + std::strerror(errno));
}

memory::CachingPool& pool_of(Device device) {
  if (device.is_cuda()) return memory::device_pool(device.index);
  return memory::host_pool();
}

// The logs' columns, each with how it reads a step: one table, so names and values cannot
// fall out of step.
struct Column {
  const char* name;
  double (*value)(const StepMetrics&);
};
// clang-format off
#define KILN_COLUMN(field) \
  {#field, [](const StepMetrics& m) { return static_cast<double>(m.field); }}
const Column kColumns[] = {
    KILN_COLUMN(step),         KILN_COLUMN(loss),           KILN_COLUMN(smoothed_loss),
    KILN_COLUMN(grad_norm),    KILN_COLUMN(lr),             KILN_COLUMN(samples),
    KILN_COLUMN(seconds),      KILN_COLUMN(throughput),     KILN_COLUMN(elapsed),
    KILN_COLUMN(memory_peak),  KILN_COLUMN(memory_current), KILN_COLUMN(memory_reserved),
    KILN_COLUMN(memory_limit), KILN_COLUMN(memory_fraction)};
#undef KILN_COLUMN
// clang-format on

}  // namespace

const std::vector<std::string>& TrainingMonitor::columns() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Column& c : kColumns) v.push_back(c.name);
    return v;
  }();
  return names;
}

TrainingMonitor::TrainingMonitor(std::vector<Tensor> params, TrainingMonitorOptions options)
    : params_(std::move(params)),
      options_(std::move(options)),
      device_(options_.device.value_or(default_device())) {
  const TrainingMonitorOptions& o = options_;
  auto reject = [](const std::string& what) { throw ValueError("[TrainingMonitor] " + what); };
  if (o.total_steps < 0) reject("expected total_steps >= 0, got " + std::to_string(o.total_steps));
  if (o.print_every < 0) reject("expected print_every >= 0, got " + std::to_string(o.print_every));
  if (!(o.loss_smoothing >= 0 && o.loss_smoothing < 1))
    reject("expected loss_smoothing in [0, 1), got " + format("%g", o.loss_smoothing));
  if (!(o.memory_warning >= 0 && o.memory_warning <= 1))
    reject("expected memory_warning in [0, 1] (a share of the limit; 0 turns it off), got " +
           format("%g", o.memory_warning));
  for (const Tensor& p : params_)
    if (!p.defined()) reject("a parameter is undefined");
  if (o.display != ProgressDisplay::Off) stream_ = o.stream;
  terminal_ = o.display == ProgressDisplay::Terminal ||
              (o.display == ProgressDisplay::Auto && stream_is_terminal(stream_));
  device_memory_ = memory::total_memory(device_);
  open_log(csv_, o.csv_path, "csv_path");
  open_log(jsonl_, o.jsonl_path, "jsonl_path");
  if (csv_.is_open()) {
    const std::vector<std::string>& names = columns();
    for (size_t i = 0; i < names.size(); ++i) csv_ << (i ? "," : "") << names[i];
    csv_ << '\n';
  }
  started_ = mark_ = Clock::now();
}

TrainingMonitor::~TrainingMonitor() {
  try {
    finish();
  } catch (...) {
    // A destructor must not throw; finish() only writes to streams.
  }
}

Tensor TrainingMonitor::grad_norm() {
  norm_ = optim::total_grad_norm(params_);
  return norm_;
}

void TrainingMonitor::watch_grad_norm(const Tensor& norm) {
  if (norm.defined() && norm.numel() != 1)
    throw ShapeError("[TrainingMonitor] watch_grad_norm expects one value, got a tensor of " +
                     std::to_string(norm.numel()) + " elements");
  norm_ = norm;
}

void TrainingMonitor::restart_clock() { mark_ = Clock::now(); }

const StepMetrics& TrainingMonitor::step(const Tensor& loss, int64_t samples) {
  // Normally both were evaluated with the step; otherwise one evaluation reads both.
  std::vector<Tensor> pending;
  for (const Tensor& t : {loss, norm_})
    if (t.defined() && !t.is_evaluated()) pending.push_back(t);
  if (!pending.empty()) {
    eval(pending);
    ++extra_evaluations_;
  }
  const Clock::time_point now = Clock::now();
  StepMetrics m;
  m.step = last_.step + 1;
  m.loss = loss.defined() ? loss.item<double>() : kNaN;
  const bool has_norm = norm_.defined();
  m.grad_norm = has_norm ? norm_.item<double>() : kNaN;
  norm_ = Tensor();  // the next step builds its own
  m.smoothed_loss = m.step == 1 ? m.loss
                                : options_.loss_smoothing * last_.smoothed_loss +
                                      (1 - options_.loss_smoothing) * m.loss;
  m.lr = options_.optimizer ? options_.optimizer->lr(0) : kNaN;
  m.samples = samples;
  m.seconds = std::chrono::duration<double>(now - mark_).count();
  m.throughput = m.seconds > 0 ? static_cast<double>(samples) / m.seconds : 0;
  m.elapsed = std::chrono::duration<double>(now - started_).count();
  mark_ = now;
  measure_memory(m);
  m.nonfinite_grad_norm = has_norm && !std::isfinite(m.grad_norm);
  m.over_memory_warning = options_.memory_warning > 0 && m.memory_limit > 0 &&
                          m.memory_fraction >= options_.memory_warning;

  samples_total_ += samples;
  seconds_total_ += m.seconds;
  nonfinite_steps_ += m.nonfinite_grad_norm ? 1 : 0;
  if (m.memory_peak >= peak_.memory_peak) peak_ = m;
  if (m.step == 1) first_ = m;
  last_ = m;
  display(m);  // before a warning, which then ends the line it drew
  check_warnings(m);
  write_logs(m);
  return last_;
}

void TrainingMonitor::measure_memory(StepMetrics& m) {
  memory::CachingPool& pool = pool_of(device_);
  const memory::PoolStats stats = pool.stats();
  m.memory_current = stats.allocated;
  m.memory_reserved = stats.reserved;
  // The planner measures every JIT evaluation's peak; the pool's own peak counts the whole
  // run, not the step.
  const memory::PlanSummary plan = memory::last_plan();
  m.memory_peak = std::max(plan.pool == pool.name() ? plan.measured_peak : 0, stats.allocated);
  if (const size_t budget = memory::budget(device_); budget > 0) {
    m.memory_limit = budget;
    limit_kind_ = "budget";
  } else if (stats.limit > 0) {
    m.memory_limit = stats.limit;
    limit_kind_ = "pool limit";
  } else {
    m.memory_limit = device_memory_;
    limit_kind_ = device_.is_cuda() ? "device memory" : "RAM";
  }
  m.memory_fraction = m.memory_limit > 0
                          ? static_cast<double>(m.memory_peak) / static_cast<double>(m.memory_limit)
                          : 0;
}

void TrainingMonitor::check_warnings(const StepMetrics& m) {
  // Each warns when the condition starts, not at every step it lasts.
  if (m.nonfinite_grad_norm && !norm_bad_)
    warn("step " + std::to_string(m.step) + ": the gradient norm is " + format("%g", m.grad_norm) +
         "; an update with these gradients spreads it into the parameters (lower the "
         "learning rate, clip gradients, or scale the loss with amp::GradScaler, which skips "
         "such steps)");
  norm_bad_ = m.nonfinite_grad_norm;
  if (m.over_memory_warning && !memory_high_)
    warn("step " + std::to_string(m.step) + ": the step's memory peak " +
         memory::format_bytes(m.memory_peak) + " is " + format("%.0f", 100 * m.memory_fraction) +
         "% of the " + memory::format_bytes(m.memory_limit) + " " + limit_kind_ + " (warning at " +
         format("%.0f", 100 * options_.memory_warning) + "%); " +
         (limit_kind_ == "budget"
              ? "kiln holds a budget by releasing values and recomputing them "
                "(memory::plan_report() says which, and what that costs)"
              : "a memory budget below it (memory::set_budget) makes kiln recompute values "
                "to stay within it"));
  memory_high_ = m.over_memory_warning;
}

void TrainingMonitor::warn(const std::string& message) {
  end_line();
  const std::string text = "[TrainingMonitor] warning: " + message;
  if (options_.warning_stream) *options_.warning_stream << text << std::endl;
  warnings_.push_back(text);
}

void TrainingMonitor::end_line() {
  if (line_open_ && stream_) *stream_ << '\n' << std::flush;
  line_open_ = false;
}

void TrainingMonitor::print(const std::string& line) {
  end_line();
  if (options_.stream) *options_.stream << line << '\n' << std::flush;
}

std::string TrainingMonitor::progress_line(const StepMetrics& m) const {
  std::ostringstream s;
  s << "step " << m.step;
  if (options_.total_steps > 0) s << '/' << options_.total_steps;
  if (!std::isnan(m.loss)) s << "  loss " << format("%.4f", m.smoothed_loss);
  if (!std::isnan(m.grad_norm) || m.nonfinite_grad_norm)
    s << "  grad norm " << format("%#.3g", m.grad_norm);
  if (!std::isnan(m.lr)) s << "  lr " << format("%.2e", m.lr);
  s << "  mem " << memory::format_bytes(m.memory_peak);
  if (m.memory_limit > 0)
    s << " (" << format("%.1f", 100 * m.memory_fraction) << "% of "
      << memory::format_bytes(m.memory_limit) << ' ' << limit_kind_ << ')';
  // Throughput over the steps since the last line, steadier than one step's.
  const double rate = shown_seconds_ > 0 ? static_cast<double>(shown_samples_) / shown_seconds_ : 0;
  s << "  " << format(rate < 100 ? "%.1f" : "%.0f", rate) << ' ' << options_.unit << "/s";
  if (!status_.empty()) s << "  " << status_;
  return s.str();
}

void TrainingMonitor::display(const StepMetrics& m) {
  shown_samples_ += m.samples;
  shown_seconds_ += m.seconds;
  if (!stream_) return;
  const bool last = options_.total_steps > 0 && m.step >= options_.total_steps;
  const Clock::time_point now = Clock::now();
  bool draw;
  if (terminal_) {
    draw = m.step == 1 || last || now - last_drawn_ >= kRedrawInterval;
  } else {
    const int64_t every =
        options_.print_every > 0
            ? options_.print_every
            : (options_.total_steps > 0 ? std::max<int64_t>(1, (options_.total_steps + 9) / 10)
                                        : 100);
    draw = m.step % every == 0 || last;
  }
  if (!draw) return;
  const std::string line = progress_line(m);
  if (terminal_) {
    // "\x1b[K" clears what a longer previous line left on the right.
    *stream_ << '\r' << line << "\x1b[K" << std::flush;
    line_open_ = true;
    if (last) end_line();
  } else {
    *stream_ << line << '\n' << std::flush;
  }
  last_drawn_ = now;
  shown_samples_ = 0;
  shown_seconds_ = 0;
}

void TrainingMonitor::write_logs(const StepMetrics& m) {
  if (csv_.is_open()) {
    const char* sep = "";
    for (const Column& c : kColumns) {
      csv_ << sep << csv_number(c.value(m));
      sep = ",";
    }
    csv_ << '\n' << std::flush;
  }
  if (jsonl_.is_open()) {
    const char* sep = "{";
    for (const Column& c : kColumns) {
      jsonl_ << sep << '"' << c.name << "\": " << json_number(c.value(m));
      sep = ", ";
    }
    jsonl_ << "}\n" << std::flush;
  }
}

void TrainingMonitor::finish() {
  if (finished_) return;
  finished_ = true;
  end_line();
  if (stream_ && last_.step > 0) {
    const double rate =
        seconds_total_ > 0 ? static_cast<double>(samples_total_) / seconds_total_ : 0;
    std::ostringstream s;
    s << "monitor: " << last_.step << " steps in " << format("%.1f", seconds_total_) << " s, "
      << format(rate < 100 ? "%.1f" : "%.0f", rate) << ' ' << options_.unit << "/s";
    if (!std::isnan(last_.grad_norm)) s << ", last grad norm " << format("%#.3g", last_.grad_norm);
    if (nonfinite_steps_ > 0) s << " (" << nonfinite_steps_ << " steps non-finite)";
    s << ", memory peak " << memory::format_bytes(peak_.memory_peak);
    if (peak_.memory_limit > 0)
      s << " (" << format("%.1f", 100 * peak_.memory_fraction) << "% of "
        << memory::format_bytes(peak_.memory_limit) << ' ' << limit_kind_ << ')';
    s << ", " << warnings_.size() << (warnings_.size() == 1 ? " warning" : " warnings");
    *stream_ << s.str() << '\n' << std::flush;
  }
  if (csv_.is_open()) csv_.close();
  if (jsonl_.is_open()) jsonl_.close();
}

}  // namespace kiln
