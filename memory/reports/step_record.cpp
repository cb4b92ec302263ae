#include "step_record.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "../../core/error.h"
#include "../../core/settings.h"
#include "../pools/caching_pool.h"

namespace kiln::memory {
namespace {

bool recording_from_environment() { return settings::flag("KILN_RECORD_STEPS"); }

// Function-local, so that a static initialiser elsewhere that asks before this file's
// globals are set up still sees the environment.
std::atomic<bool>& recording_flag() {
  static std::atomic<bool> flag{recording_from_environment()};
  return flag;
}

struct LastStepSlot {
  std::mutex mutex;
  StepRecord record;
};

// Never destroyed: an evaluation on another thread may still store its step while static
// destructors run at exit.
LastStepSlot& last_step_slot() {
  static auto* slot = new LastStepSlot;
  return *slot;
}

std::string kernel_name(const StepRecord& step, int kernel) {
  if (kernel >= 0 && static_cast<size_t>(kernel) < step.kernels.size() &&
      !step.kernels[static_cast<size_t>(kernel)].empty())
    return step.kernels[static_cast<size_t>(kernel)];
  return "kernel " + std::to_string(kernel);
}

const StepValue* value_of(const StepRecord& step, int value) {
  if (value < 0 || static_cast<size_t>(value) >= step.values.size()) return nullptr;
  return &step.values[static_cast<size_t>(value)];
}

std::string value_name(const StepRecord& step, int value) {
  const StepValue* v = value_of(step, value);
  return v && !v->name.empty() ? v->name : "value " + std::to_string(value);
}

bool is_kernel(const StepEvent& e) {
  return e.kind == StepEvent::Kind::Run || e.kind == StepEvent::Kind::Recompute;
}

// A trace viewer rejects the whole file over one null timestamp.
double finite(double x) { return std::isfinite(x) ? x : 0.0; }

void write_text(const char* op, const std::string& path, const std::string& text) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (!file)
    throw IOError(std::string("[") + op + "] cannot open " + path + " (" + std::strerror(errno) +
                  ")");
  size_t written = std::fwrite(text.data(), 1, text.size(), file);
  int error = written == text.size() ? 0 : errno;
  if (std::fclose(file) != 0 && error == 0) error = errno;
  if (written != text.size() || error != 0)
    throw IOError(std::string("[") + op + "] " + path + ": writing failed (" +
                  std::strerror(error != 0 ? error : EIO) + ")");
}

// ---- SVG ----------------------------------------------------------------------------------

// The picture's frame: the plot area, with room for the title above, the byte labels on the
// left and the event axis and legend below.
constexpr double kWidth = 960, kHeight = 400;
constexpr double kLeft = 86, kRight = 940, kTop = 56, kBottom = 334;
constexpr size_t kMaxCurvePoints = 2000;

// Text for SVG content and attributes. Control characters are not allowed in XML at all.
std::string escape_xml(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const char* entity = c == '&'    ? "&amp;"
                         : c == '<'  ? "&lt;"
                         : c == '>'  ? "&gt;"
                         : c == '"'  ? "&quot;"
                         : c == '\'' ? "&apos;"
                                     : nullptr;
    if (entity)
      out += entity;
    else
      out += static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' ? '?' : c;
  }
  return out;
}

// A tick value back to bytes; the top tick can be 2^64, one past SIZE_MAX.
size_t to_bytes(double x) {
  return x >= 18446744073709551615.0 ? SIZE_MAX : static_cast<size_t>(x);
}

std::string num(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", x);
  return text;
}

// A step of 2^k units (bytes, KiB, MiB, ...) that puts 3 to 5 steps under `top`.
double byte_tick(double top) {
  double raw = std::max(top / 5.0, 1.0);
  double unit = 1;
  while (unit * 1024.0 <= raw) unit *= 1024.0;
  double step = unit;
  while (step < raw) step *= 2.0;
  return step;
}

// 1, 2 or 5 times a power of ten that puts 3 to 5 steps under `top` events.
double event_tick(double top) {
  double raw = std::max(top / 5.0, 1.0);
  double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * power >= raw) return m * power;
  return 10.0 * power;
}

struct Frame {
  double x_max = 1, y_max = 1;
  double x(double event) const { return kLeft + event / x_max * (kRight - kLeft); }
  double y(double bytes) const { return kBottom - bytes / y_max * (kBottom - kTop); }
};

void horizontal_line(std::string& svg, const Frame& f, size_t bytes, const char* cls,
                     const char* color, const char* dash, const std::string& label,
                     const char* anchor, double label_x) {
  const std::string y = num(f.y(static_cast<double>(bytes)));
  svg += "<line class=\"" + std::string(cls) + "\" x1=\"" + num(kLeft) + "\" y1=\"" + y +
         "\" x2=\"" + num(kRight) + "\" y2=\"" + y + "\" stroke=\"" + color +
         "\" stroke-width=\"1.5\" stroke-dasharray=\"" + dash + "\"/>\n";
  // The label is drawn twice, a white outline under the colour, so that it stays legible
  // where it crosses the curve.
  const std::string text = "<text x=\"" + num(label_x) + "\" y=\"" +
                           num(f.y(static_cast<double>(bytes)) - 4) + "\" text-anchor=\"" + anchor +
                           "\" fill=\"";
  svg += text + "white\" stroke=\"white\" stroke-width=\"3\">" + escape_xml(label) + "</text>\n";
  svg += text + color + "\">" + escape_xml(label) + "</text>\n";
}

void axes(std::string& svg, const Frame& f, size_t events) {
  const double y_step = byte_tick(f.y_max);
  for (double b = 0; b <= f.y_max * (1 + 1e-9); b += y_step) {
    const std::string y = num(f.y(b));
    svg += "<line x1=\"" + num(kLeft) + "\" y1=\"" + y + "\" x2=\"" + num(kRight) + "\" y2=\"" + y +
           "\" stroke=\"#e5e5e5\"/>\n";
    svg += "<text x=\"" + num(kLeft - 6) + "\" y=\"" + num(f.y(b) + 4) + "\" text-anchor=\"end\">" +
           escape_xml(format_bytes(to_bytes(b))) + "</text>\n";
  }
  const double x_step = event_tick(f.x_max);
  for (double e = 0; e <= f.x_max * (1 + 1e-9) && (events > 0 || e == 0); e += x_step) {
    svg += "<line x1=\"" + num(f.x(e)) + "\" y1=\"" + num(kBottom) + "\" x2=\"" + num(f.x(e)) +
           "\" y2=\"" + num(kBottom + 4) + "\" stroke=\"#333\"/>\n";
    svg += "<text x=\"" + num(f.x(e)) + "\" y=\"" + num(kBottom + 17) +
           "\" text-anchor=\"middle\">" + std::to_string(static_cast<long long>(e)) + "</text>\n";
  }
  svg += "<path d=\"M" + num(kLeft) + " " + num(kTop) + "V" + num(kBottom) + "H" + num(kRight) +
         "\" fill=\"none\" stroke=\"#333\"/>\n";
  svg += "<text x=\"" + num((kLeft + kRight) / 2) + "\" y=\"" + num(kBottom + 36) +
         "\" text-anchor=\"middle\">schedule (events)</text>\n";
  svg += "<text transform=\"translate(14 " + num((kTop + kBottom) / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">bytes in use</text>\n";
}

// Orange triangles on the event axis, one per recomputation, at the position where its
// bytes join the curve (event i + 1 on the axis, as in the tooltip); those that land on the
// same pixel share a marker (its tooltip counts them), so a long step stays a small file.
void recompute_markers(std::string& svg, const StepRecord& step, const Frame& f) {
  struct Marker {
    size_t event;
    int kernel;
    size_t count;
  };
  std::map<long, Marker> by_pixel;
  for (size_t i = 0; i < step.events.size(); ++i) {
    if (step.events[i].kind != StepEvent::Kind::Recompute) continue;
    auto it = by_pixel
                  .try_emplace(std::lround(f.x(static_cast<double>(i + 1))),
                               Marker{i, step.events[i].kernel, 0})
                  .first;
    ++it->second.count;
  }
  for (const auto& [pixel, m] : by_pixel) {
    std::string tip =
        "recompute " + kernel_name(step, m.kernel) + " (event " + std::to_string(m.event + 1) + ")";
    if (m.count > 1) tip += " and " + std::to_string(m.count - 1) + " more here";
    svg += "<path class=\"recompute\" d=\"M" + num(f.x(static_cast<double>(m.event + 1))) + " " +
           num(kBottom - 9) + "l4.5 8h-9z\" fill=\"#ff7f0e\"><title>" + escape_xml(tip) +
           "</title></path>\n";
  }
}

const char* phase_name(StepPhase p) {
  return p == StepPhase::Forward ? "forward" : p == StepPhase::Backward ? "backward" : "update";
}
const char* phase_color(StepPhase p) {
  return p == StepPhase::Forward ? "#e8f1fa" : p == StepPhase::Backward ? "#fbeee0" : "#e6f4e6";
}

void legend(std::string& svg, const StepRecord& step, bool budget, bool unbudgeted) {
  struct Item {
    const char* label;
    const char* color;
    const char* dash;
  };
  std::vector<Item> items = {{"bytes in use", "#1f77b4", "none"}};
  if (unbudgeted) items.push_back({"without a budget", "#7f7f7f", "none"});
  if (budget) items.push_back({"budget", "#d62728", "6 4"});
  if (step.planned_peak > 0) items.push_back({"planned peak", "#555555", "4 3"});
  if (step.lower_bound > 0) items.push_back({"lower bound", "#2ca02c", "1.5 3"});
  double x = kLeft;
  const std::string y = num(kHeight - 12);
  for (const Item& item : items) {
    svg += "<line x1=\"" + num(x) + "\" y1=\"" + num(kHeight - 16) + "\" x2=\"" + num(x + 22) +
           "\" y2=\"" + num(kHeight - 16) + "\" stroke=\"" + item.color +
           "\" stroke-width=\"2\" stroke-dasharray=\"" + item.dash + "\"/>\n";
    svg += "<text x=\"" + num(x + 27) + "\" y=\"" + y + "\">" + item.label + "</text>\n";
    x += 40 + 6.5 * static_cast<double>(std::strlen(item.label));
  }
  if (std::any_of(step.events.begin(), step.events.end(),
                  [](const StepEvent& e) { return e.kind == StepEvent::Kind::Recompute; })) {
    svg +=
        "<path d=\"M" + num(x + 11) + " " + num(kHeight - 20) + "l4.5 8h-9z\" fill=\"#ff7f0e\"/>\n";
    svg += "<text x=\"" + num(x + 21) + "\" y=\"" + y + "\">recomputation</text>\n";
    x += 40 + 6.5 * 13;
  }
  // The phases shaded behind the curve, those the step has.
  for (StepPhase p : {StepPhase::Forward, StepPhase::Backward, StepPhase::Update}) {
    if (std::find(step.phases.begin(), step.phases.end(), p) == step.phases.end()) continue;
    svg += "<rect x=\"" + num(x) + "\" y=\"" + num(kHeight - 21) +
           "\" width=\"14\" height=\"10\" fill=\"" + phase_color(p) + "\" stroke=\"#bbb\"/>\n";
    svg += "<text x=\"" + num(x + 19) + "\" y=\"" + y + "\">" + phase_name(p) + "</text>\n";
    x += 30 + 6.5 * static_cast<double>(std::strlen(phase_name(p)));
  }
}

}  // namespace

void set_step_recording(bool on) { recording_flag().store(on, std::memory_order_relaxed); }

bool step_recording() { return recording_flag().load(std::memory_order_relaxed); }

StepRecord last_step() {
  LastStepSlot& slot = last_step_slot();
  std::lock_guard<std::mutex> lock(slot.mutex);
  return slot.record;
}

void set_last_step(StepRecord record) {
  LastStepSlot& slot = last_step_slot();
  std::lock_guard<std::mutex> lock(slot.mutex);
  slot.record = std::move(record);
}

std::string chrome_trace_json(const StepRecord& step) {
  using nlohmann::json;
  constexpr int kPid = 1, kKernelLane = 1, kRecomputeLane = 2;
  std::vector<json> events;
  events.reserve(2 * step.events.size() + 4);
  events.push_back(
      {{"name", "process_name"},
       {"ph", "M"},
       {"pid", kPid},
       {"args", {{"name", step.pool.empty() ? "kiln step" : "kiln step (" + step.pool + ")"}}}});
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", kPid},
                    {"tid", kKernelLane},
                    {"args", {{"name", "kernels"}}}});
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", kPid},
                    {"tid", kRecomputeLane},
                    {"args", {{"name", "recomputations"}}}});
  // The counter is drawn at each event's start: a kernel's output is allocated before it
  // runs. The first sample is what the step started with.
  auto counter = [&](double ts, size_t in_use) {
    json args = {{"in_use", in_use}};
    if (step.budget > 0) args["budget"] = step.budget;
    events.push_back({{"name", "memory"}, {"ph", "C"}, {"pid", kPid}, {"ts", ts}, {"args", args}});
  };
  counter(0.0, step.start_bytes);
  for (const StepEvent& e : step.events) {
    const double start = finite(e.start_us);
    json args = {{"bytes", e.bytes}, {"value", e.value}};
    if (const StepValue* v = value_of(step, e.value)) {
      args["value_name"] = v->name;
      args["shape"] = v->shape;
    }
    if (is_kernel(e)) {
      const bool rebuild = e.kind == StepEvent::Kind::Recompute;
      args["kernel"] = e.kernel;
      args["in_place"] = e.in_place;
      events.push_back({{"name", kernel_name(step, e.kernel)},
                        {"cat", rebuild ? "recompute" : "kernel"},
                        {"ph", "X"},
                        {"pid", kPid},
                        {"tid", rebuild ? kRecomputeLane : kKernelLane},
                        {"ts", start},
                        {"dur", std::max(finite(e.end_us) - start, 0.001)},
                        {"args", args}});
    } else {
      const bool evict = e.kind == StepEvent::Kind::Evict;
      events.push_back({{"name", (evict ? "evict " : "free ") + value_name(step, e.value)},
                        {"cat", evict ? "evict" : "free"},
                        {"ph", "i"},
                        {"s", "t"},
                        {"pid", kPid},
                        {"tid", kKernelLane},
                        {"ts", start},
                        {"args", args}});
    }
    counter(start, e.in_use);
  }
  json other = {{"pool", step.pool},
                {"budget", step.budget},
                {"start_bytes", step.start_bytes},
                {"planned_peak", step.planned_peak},
                {"measured_peak", step.measured_peak},
                {"lower_bound", step.lower_bound},
                {"recomputed_kernels", step.recomputed_kernels},
                {"evicted_values", step.evicted_values},
                {"base_cost", finite(step.base_cost)},
                {"extra_cost", finite(step.extra_cost)},
                {"planner_ms", finite(step.planner_ms)},
                {"step_ms", finite(step.step_ms)}};
  // One trace event per line keeps a large trace readable and diffable. Names are whatever
  // the graph was given, so bytes that are not UTF-8 are replaced rather than thrown on.
  const auto dump = [](const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
  };
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  for (size_t i = 0; i < events.size(); ++i) out += (i ? ",\n" : "") + dump(events[i]);
  out += "\n],\"otherData\":" + dump(other) + "}\n";
  return out;
}

std::vector<TimelinePoint> timeline_points(const StepRecord& step, size_t max_points) {
  const size_t n = step.events.size() + 1;
  auto at = [&](size_t i) {
    return TimelinePoint{i, i == 0 ? step.start_bytes : step.events[i - 1].in_use};
  };
  std::vector<TimelinePoint> out;
  max_points = std::max<size_t>(max_points, 4);
  if (n <= max_points) {
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) out.push_back(at(i));
    return out;
  }
  // The inner points [1, n - 1) have more than 2 * buckets members, so every run has two.
  const size_t buckets = (max_points - 2) / 2, inner = n - 2;
  out.reserve(2 * buckets + 2);
  out.push_back(at(0));
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = 1 + inner * b / buckets, end = 1 + inner * (b + 1) / buckets;
    size_t low = begin, high = begin;
    for (size_t i = begin + 1; i < end; ++i) {
      const size_t bytes = at(i).in_use;
      if (bytes < at(low).in_use) low = i;
      if (bytes > at(high).in_use) high = i;
    }
    out.push_back(at(std::min(low, high)));
    if (low != high) out.push_back(at(std::max(low, high)));
  }
  out.push_back(at(n - 1));
  return out;
}

namespace {

// A budget more than this many times the highest curve or line is written above the plot
// rather than drawn: a bytes axis up to it would flatten the step into the bottom rows.
constexpr double kBudgetFarAbove = 1.5;

// The phase of each event: its kernel's for a run; a rebuild, free or eviction belongs to
// the phase of the run before it (a rebuild made for the backward pass is part of it).
std::vector<StepPhase> event_phases(const StepRecord& step) {
  std::vector<StepPhase> out(step.events.size(), StepPhase::Forward);
  StepPhase now = StepPhase::Forward;
  for (size_t i = 0; i < step.events.size(); ++i) {
    const StepEvent& e = step.events[i];
    if (e.kind == StepEvent::Kind::Run && e.kernel >= 0 &&
        static_cast<size_t>(e.kernel) < step.phases.size())
      now = step.phases[static_cast<size_t>(e.kernel)];
    out[i] = now;
  }
  return out;
}

// Shaded bands behind the curve, one per run of events in the same phase, named at the top
// where there is room. Bands narrower than a pixel join the one before, so an interleaved
// schedule stays a small file.
void phase_bands(std::string& svg, const StepRecord& step, const Frame& f) {
  if (step.phases.empty() || step.events.empty()) return;
  const std::vector<StepPhase> phases = event_phases(step);
  struct Band {
    size_t begin, end;  // events [begin, end): x from begin to end
    StepPhase phase;
  };
  std::vector<Band> bands;
  for (size_t i = 0; i < phases.size(); ++i) {
    if (!bands.empty() && bands.back().phase == phases[i]) {
      bands.back().end = i + 1;
    } else if (!bands.empty() &&
               f.x(static_cast<double>(i)) - f.x(static_cast<double>(bands.back().begin)) < 1.0) {
      bands.back().end = i + 1;  // too narrow to see: part of the one before
    } else {
      bands.push_back({i, i + 1, phases[i]});
    }
  }
  for (const Band& b : bands) {
    // Event i's bytes hold from x = i + 1 (the curve's steps); a band covers its events.
    const double x0 = f.x(static_cast<double>(b.begin) + (b.begin == 0 ? 0.0 : 1.0));
    const double x1 = f.x(std::min(static_cast<double>(b.end) + 1.0, f.x_max));
    svg += "<rect class=\"phase-" + std::string(phase_name(b.phase)) + "\" x=\"" + num(x0) +
           "\" y=\"" + num(kTop) + "\" width=\"" + num(std::max(x1 - x0, 0.5)) + "\" height=\"" +
           num(kBottom - kTop) + "\" fill=\"" + phase_color(b.phase) + "\"><title>" +
           phase_name(b.phase) + ", events " + std::to_string(b.begin + 1) + " to " +
           std::to_string(b.end) + "</title></rect>\n";
    if (x1 - x0 >= 60)
      svg += "<text x=\"" + num((x0 + x1) / 2) + "\" y=\"" + num(kTop + 12) +
             "\" text-anchor=\"middle\" fill=\"#777\">" + phase_name(b.phase) + "</text>\n";
  }
}

// The step curve: the bytes after event i hold from x = i until the next event.
std::string curve_path(const std::vector<TimelinePoint>& curve, const Frame& f, double x_end) {
  std::string d = "M" + num(f.x(0)) + " " + num(f.y(static_cast<double>(curve[0].in_use)));
  for (size_t i = 1; i < curve.size(); ++i)
    d += "H" + num(f.x(static_cast<double>(curve[i].event))) + "V" +
         num(f.y(static_cast<double>(curve[i].in_use)));
  return d + "H" + num(f.x(x_end));
}

size_t curve_peak(const std::vector<TimelinePoint>& curve) {
  size_t top = 0;
  for (const TimelinePoint& p : curve) top = std::max(top, p.in_use);
  return top;
}

std::string timeline_svg(const StepRecord& step, const StepRecord* unbudgeted) {
  const std::vector<TimelinePoint> curve = timeline_points(step, kMaxCurvePoints);
  const std::vector<TimelinePoint> other = unbudgeted && !unbudgeted->events.empty()
                                               ? timeline_points(*unbudgeted, kMaxCurvePoints)
                                               : std::vector<TimelinePoint>{};
  const TimelinePoint* peak = &curve.front();
  for (const TimelinePoint& p : curve)
    if (p.in_use > peak->in_use) peak = &p;
  // The axis fits what is drawn: the curves and the lines near them.
  size_t top = std::max({step.planned_peak, step.lower_bound, step.measured_peak, peak->in_use,
                         other.empty() ? size_t{0} : curve_peak(other)});
  const bool budget_drawn =
      step.budget > 0 &&
      (top == 0 || static_cast<double>(step.budget) <= kBudgetFarAbove * static_cast<double>(top));
  if (budget_drawn) top = std::max(top, step.budget);

  Frame f;
  f.x_max = std::max<double>({1.0, static_cast<double>(step.events.size()),
                              unbudgeted ? static_cast<double>(unbudgeted->events.size()) : 0.0});
  // Headroom above the highest line, rounded up to a whole tick.
  // At most 2^64, which a power-of-two tick divides, so no tick passes what size_t holds.
  const double wanted = top > 0 ? std::min(static_cast<double>(top) * 1.06, 0x1p64) : 1024.0;
  const double y_step = byte_tick(wanted);
  f.y_max = std::ceil(wanted / y_step) * y_step;

  std::string svg;
  svg.reserve(64 * 1024);
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(kWidth) + "\" height=\"" +
         num(kHeight) + "\" viewBox=\"0 0 " + num(kWidth) + " " + num(kHeight) +
         "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + num(kLeft) + "\" y=\"20\" font-size=\"14\" font-weight=\"bold\">" +
         escape_xml(step.pool.empty() ? "kiln step memory" : "kiln step memory: " + step.pool) +
         "</text>\n";
  std::string summary = "measured peak " + format_bytes(step.measured_peak) + ", planned peak " +
                        format_bytes(step.planned_peak) + ", lower bound " +
                        format_bytes(step.lower_bound) + ", " +
                        (step.budget > 0 ? "budget " + format_bytes(step.budget) : "no budget") +
                        ", " + std::to_string(step.recomputed_kernels) + " recomputations, " +
                        std::to_string(step.evicted_values) + " evictions, " +
                        std::to_string(step.events.size()) + " events";
  if (unbudgeted)
    summary += "; without a budget: peak " + format_bytes(unbudgeted->measured_peak) + ", " +
               std::to_string(unbudgeted->events.size()) + " events";
  svg += "<text x=\"" + num(kLeft) + "\" y=\"38\">" + escape_xml(summary) + "</text>\n";
  if (step.budget > 0 && !budget_drawn)
    svg += "<text class=\"budget-note\" x=\"" + num(kRight) + "\" y=\"" + num(kTop - 5) +
           "\" text-anchor=\"end\" fill=\"#d62728\">" +
           escape_xml("budget " + format_bytes(step.budget) + " is far above the plot (" +
                      num(static_cast<double>(step.budget) / static_cast<double>(top)) +
                      " times its top)") +
           "</text>\n";
  phase_bands(svg, step, f);
  axes(svg, f, static_cast<size_t>(f.x_max));

  if (step.events.empty()) {
    svg += "<text x=\"" + num((kLeft + kRight) / 2) + "\" y=\"" + num((kTop + kBottom) / 2) +
           "\" text-anchor=\"middle\" fill=\"#777\">no events recorded (turn recording on: "
           "KILN_RECORD_STEPS=1 or kiln::memory::set_step_recording(true))</text>\n";
  } else {
    if (!other.empty())
      svg += "<path class=\"unbudgeted\" d=\"" +
             curve_path(other, f, static_cast<double>(unbudgeted->events.size())) +
             "\" fill=\"none\" stroke=\"#7f7f7f\" stroke-width=\"1.5\"/>\n";
    const std::string d = curve_path(curve, f, static_cast<double>(step.events.size()));
    svg += "<path d=\"" + d + "V" + num(kBottom) + "H" + num(kLeft) +
           "Z\" fill=\"#1f77b4\" fill-opacity=\"0.15\" stroke=\"none\"/>\n";
    svg += "<path class=\"in-use\" d=\"" + d +
           "\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\"/>\n";
    svg += "<circle class=\"peak\" cx=\"" + num(f.x(static_cast<double>(peak->event))) +
           "\" cy=\"" + num(f.y(static_cast<double>(peak->in_use))) +
           "\" r=\"3\" fill=\"#1f77b4\"><title>" +
           escape_xml("peak " + format_bytes(peak->in_use) + " after event " +
                      std::to_string(peak->event)) +
           "</title></circle>\n";
    recompute_markers(svg, step, f);
  }
  if (step.lower_bound > 0)
    horizontal_line(svg, f, step.lower_bound, "lower-bound", "#2ca02c", "1.5 3",
                    "lower bound " + format_bytes(step.lower_bound), "middle",
                    (kLeft + kRight) / 2);
  if (step.planned_peak > 0)
    horizontal_line(svg, f, step.planned_peak, "planned-peak", "#555555", "4 3",
                    "planned peak " + format_bytes(step.planned_peak), "start", kLeft + 4);
  if (budget_drawn)
    horizontal_line(svg, f, step.budget, "budget", "#d62728", "6 4",
                    "budget " + format_bytes(step.budget), "end", kRight - 4);
  legend(svg, step, budget_drawn, !other.empty());
  svg += "</svg>\n";
  return svg;
}

}  // namespace

std::string memory_timeline_svg(const StepRecord& step) { return timeline_svg(step, nullptr); }

std::string memory_timeline_svg(const StepRecord& step, const StepRecord& unbudgeted) {
  return timeline_svg(step, &unbudgeted);
}

void write_chrome_trace(const std::string& path) {
  write_text("write_chrome_trace", path, chrome_trace_json(last_step()));
}

void write_memory_timeline(const std::string& path) {
  write_text("write_memory_timeline", path, memory_timeline_svg(last_step()));
}

void write_memory_timeline(const std::string& path, const StepRecord& unbudgeted) {
  write_text("write_memory_timeline", path, memory_timeline_svg(last_step(), unbudgeted));
}

}  // namespace kiln::memory
