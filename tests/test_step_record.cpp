// The step record's renderings: the Chrome trace (parsed back with nlohmann), the memory
// timeline SVG (checked for well-formed tags and escaped text), the decimated curve, the
// stored last step, the recording switch and the file writers. Steps are built by hand.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "memory/pools/caching_pool.h"
#include "memory/reports/step_record.h"
#include "test_files.h"

using kiln::memory::StepEvent;
using kiln::memory::StepRecord;
using kiln::memory::StepValue;
using Kind = kiln::memory::StepEvent::Kind;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Appends events with the bytes in use, clock and peak kept consistent.
struct StepBuilder {
  StepRecord step;
  std::mt19937_64 rng;
  size_t in_use;
  double clock = 0;

  StepBuilder(uint64_t seed, size_t start_bytes) : rng(seed), in_use(start_bytes) {
    step.pool = "host pool";
    step.start_bytes = start_bytes;
    step.measured_peak = start_bytes;
  }
  size_t random_bytes() {
    return 64 * std::uniform_int_distribution<size_t>(kMiB / 64, 48 * kMiB / 64)(rng);
  }
  int add_value(const std::string& name, int producer) {
    StepValue v;
    v.name = name;
    v.shape = "[" + std::to_string(rng() % 4096 + 1) + ", 256] float32";
    v.bytes = random_bytes();
    v.producer = producer;
    step.values.push_back(v);
    return static_cast<int>(step.values.size()) - 1;
  }
  void push(StepEvent e) {
    e.in_use = in_use;
    step.measured_peak = std::max(step.measured_peak, in_use);
    step.events.push_back(e);
  }
  void kernel(Kind kind, int k, int value, bool in_place = false) {
    StepEvent e;
    e.kind = kind;
    e.kernel = k;
    e.value = value;
    e.bytes = step.values[static_cast<size_t>(value)].bytes;
    e.in_place = in_place;
    e.start_us = clock;
    clock += std::uniform_real_distribution<double>(5, 500)(rng);
    e.end_us = clock;
    clock += 1;
    in_use += e.bytes;
    if (kind == Kind::Recompute) ++step.recomputed_kernels;
    push(e);
  }
  void release(Kind kind, int value) {
    StepEvent e;
    e.kind = kind;
    e.value = value;
    e.bytes = step.values[static_cast<size_t>(value)].bytes;
    e.start_us = e.end_us = clock;
    in_use -= e.bytes;
    if (kind == Kind::Evict) ++step.evicted_values;
    push(e);
  }
};

// Six kernels; two outputs are evicted and rebuilt. Kernel 2's name needs escaping.
StepRecord sample_step(uint64_t seed) {
  StepBuilder b(seed, 3 * kMiB + 17);
  b.step.kernels = {"matmul+relu", "add", "<&>", "sum", "mul", "exp"};
  b.add_value("leaf", -1);
  for (int k = 0; k < 6; ++k) b.add_value(b.step.kernels[static_cast<size_t>(k)], k);
  b.kernel(Kind::Run, 0, 1);
  b.kernel(Kind::Run, 1, 2);
  b.release(Kind::Evict, 1);
  b.kernel(Kind::Run, 2, 3);
  b.release(Kind::Evict, 3);
  b.kernel(Kind::Recompute, 0, 1);
  b.kernel(Kind::Run, 3, 4, true);
  b.release(Kind::Free, 1);
  b.kernel(Kind::Recompute, 2, 3);
  b.kernel(Kind::Run, 4, 5);
  b.release(Kind::Free, 3);
  b.release(Kind::Free, 2);
  b.kernel(Kind::Run, 5, 6);
  b.step.budget = b.step.measured_peak + 5 * kMiB;
  b.step.planned_peak = b.step.measured_peak - kMiB;
  b.step.lower_bound = b.step.measured_peak / 2;
  b.step.base_cost = 0.0125;
  b.step.extra_cost = 0.0031;
  b.step.planner_ms = 1.75;
  b.step.step_ms = b.clock / 1000.0;
  return b.step;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Empty when `svg` is one well-formed element tree whose text has only the five XML
// entities; otherwise what is wrong.
std::string xml_problem(const std::string& svg) {
  std::vector<std::string> open;
  size_t roots = 0;
  for (size_t i = 0; i < svg.size(); ++i) {
    if (svg[i] == '&') {
      bool known = false;
      for (const char* entity : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
        known = known || svg.compare(i, std::strlen(entity), entity) == 0;
      if (!known) return "bare & at " + std::to_string(i);
      continue;
    }
    if (svg[i] == '>') return "bare > at " + std::to_string(i);
    if (svg[i] != '<') continue;
    size_t end = svg.find('>', i);
    if (end == std::string::npos) return "unclosed tag at " + std::to_string(i);
    std::string tag = svg.substr(i + 1, end - i - 1);
    if (tag.find('<') != std::string::npos) return "< inside tag at " + std::to_string(i);
    if (count(tag, "\"") % 2 != 0) return "unbalanced quotes in <" + tag + ">";
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return "mismatched </" + tag + ">";
      open.pop_back();
    } else {
      if (open.empty()) ++roots;
      if (tag.back() != '/') open.push_back(tag.substr(0, tag.find_first_of(" \n")));
    }
    i = end;
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  if (roots != 1) return std::to_string(roots) + " root elements";
  return "";
}

// True when an attribute value holds a number that is not finite.
bool has_bad_number(const std::string& svg) {
  return std::regex_search(svg, std::regex("=\"[^\"]*(nan|inf)", std::regex::icase));
}

// The byte-axis labels ("0 B", "64.0 MiB", ...) of a timeline, in bytes, bottom to top.
std::vector<double> byte_ticks(const std::string& svg) {
  static const std::regex label("text-anchor=\"end\">([0-9.]+) (B|KiB|MiB|GiB|TiB|PiB)<");
  std::vector<double> out;
  for (std::sregex_iterator it(svg.begin(), svg.end(), label), end; it != end; ++it) {
    double scale = 1;
    for (const char* unit : {"B", "KiB", "MiB", "GiB", "TiB", "PiB"}) {
      if ((*it)[2] == unit) break;
      scale *= 1024;
    }
    out.push_back(std::stod((*it)[1]) * scale);
  }
  return out;
}

// Four to six labels from 0 up, evenly spaced (to the labels' rounding), the top one over
// `highest`.
void check_byte_axis(const std::string& svg, double highest) {
  const std::vector<double> ticks = byte_ticks(svg);
  INFO("byte ticks " << ticks.size());
  REQUIRE(ticks.size() >= 4);
  CHECK(ticks.size() <= 6);
  CHECK(ticks[0] == 0);
  for (size_t i = 1; i < ticks.size(); ++i)
    CHECK(ticks[i] == Approx(ticks[1] * static_cast<double>(i)).epsilon(0.05));
  CHECK(ticks.back() >= highest * 0.999);
}

// A step of `n` kernel runs whose bytes in use wander randomly, with one spike planted.
StepRecord long_step(uint64_t seed, size_t n, size_t* spike_at) {
  std::mt19937_64 rng(seed);
  StepRecord s;
  s.pool = "cuda:0 pool";
  s.start_bytes = 100 * kMiB;
  size_t in_use = s.start_bytes;
  *spike_at = std::uniform_int_distribution<size_t>(n / 4, 3 * n / 4)(rng);
  for (size_t i = 0; i < n; ++i) {
    StepEvent e;
    e.kind = i % 7 == 3 ? Kind::Recompute : Kind::Run;
    e.kernel = static_cast<int>(i);
    e.start_us = static_cast<double>(i);
    e.end_us = e.start_us + 0.5;
    in_use = std::clamp<size_t>(in_use + rng() % (8 * kMiB), 4 * kMiB, 400 * kMiB) - 4 * kMiB;
    e.in_use = i == *spike_at ? 900 * kMiB + rng() % kMiB : in_use;
    s.measured_peak = std::max(s.measured_peak, e.in_use);
    if (e.kind == Kind::Recompute) ++s.recomputed_kernels;
    s.events.push_back(e);
  }
  s.budget = 1024 * kMiB;
  return s;
}

// Restores the stored step and the recording switch when a test ends.
struct GlobalStepGuard {
  StepRecord saved = kiln::memory::last_step();
  bool recording = kiln::memory::step_recording();
  ~GlobalStepGuard() {
    kiln::memory::set_last_step(saved);
    kiln::memory::set_step_recording(recording);
  }
};

}  // namespace

TEST_CASE("chrome trace has a slice per kernel, an instant per release, a counter per event",
          "[trace]") {
  const uint64_t seed = GENERATE(1u, 2u, 3u);
  const StepRecord step = sample_step(seed);
  const std::string text = kiln::memory::chrome_trace_json(step);
  nlohmann::json trace = nlohmann::json::parse(text);

  CHECK(trace["displayTimeUnit"] == "ms");
  std::vector<nlohmann::json> slices, instants, counters, metadata;
  for (const auto& e : trace["traceEvents"]) {
    const std::string ph = e["ph"];
    CHECK(e["pid"] == 1);
    if (ph == "X") slices.push_back(e);
    if (ph == "i") instants.push_back(e);
    if (ph == "C") counters.push_back(e);
    if (ph == "M") metadata.push_back(e);
  }
  CHECK(slices.size() == 8);
  CHECK(instants.size() == 5);
  CHECK(counters.size() == step.events.size() + 1);
  CHECK(slices.size() + instants.size() + counters.size() + metadata.size() ==
        trace["traceEvents"].size());
  REQUIRE(!metadata.empty());
  CHECK(metadata[0]["name"] == "process_name");
  CHECK(metadata[0]["args"]["name"] == "kiln step (host pool)");

  // Slices, instants and counter samples follow the events in order.
  CHECK(counters[0]["args"]["in_use"] == step.start_bytes);
  size_t slice = 0, instant = 0;
  for (size_t i = 0; i < step.events.size(); ++i) {
    const StepEvent& e = step.events[i];
    INFO("event " << i);
    CHECK(counters[i + 1]["args"]["in_use"] == e.in_use);
    CHECK(counters[i + 1]["args"]["budget"] == step.budget);
    CHECK(counters[i + 1]["ts"].get<double>() == Approx(e.start_us));
    if (e.kind == Kind::Run || e.kind == Kind::Recompute) {
      REQUIRE(slice < slices.size());
      const auto& s = slices[slice++];
      const bool rebuild = e.kind == Kind::Recompute;
      CHECK(s["name"] == step.kernels[static_cast<size_t>(e.kernel)]);
      CHECK(s["cat"] == (rebuild ? "recompute" : "kernel"));
      CHECK(s["tid"] == (rebuild ? 2 : 1));
      CHECK(s["ts"].get<double>() == Approx(e.start_us));
      CHECK(s["dur"].get<double>() == Approx(e.end_us - e.start_us));
      CHECK(s["args"]["kernel"] == e.kernel);
      CHECK(s["args"]["bytes"] == e.bytes);
      CHECK(s["args"]["in_place"] == e.in_place);
      CHECK(s["args"]["shape"] == step.values[static_cast<size_t>(e.value)].shape);
    } else {
      REQUIRE(instant < instants.size());
      const auto& s = instants[instant++];
      CHECK(s["s"] == "t");
      CHECK(s["cat"] == (e.kind == Kind::Evict ? "evict" : "free"));
      CHECK(s["args"]["bytes"] == e.bytes);
      CHECK(s["args"]["value_name"] == step.values[static_cast<size_t>(e.value)].name);
    }
  }
  // The rebuilt kernels are 0 and 2, on the recompute lane, named by their source ops.
  std::vector<std::string> rebuilt;
  for (const auto& s : slices)
    if (s["cat"] == "recompute") rebuilt.push_back(s["name"]);
  CHECK(rebuilt == std::vector<std::string>{"matmul+relu", "<&>"});

  const auto& other = trace["otherData"];
  CHECK(other["budget"] == step.budget);
  CHECK(other["planned_peak"] == step.planned_peak);
  CHECK(other["measured_peak"] == step.measured_peak);
  CHECK(other["lower_bound"] == step.lower_bound);
  CHECK(other["start_bytes"] == step.start_bytes);
  CHECK(other["recomputed_kernels"] == 2);
  CHECK(other["evicted_values"] == 2);
  CHECK(other["planner_ms"].get<double>() == Approx(1.75));
  CHECK(other["base_cost"].get<double>() == Approx(0.0125));
  CHECK(other["extra_cost"].get<double>() == Approx(0.0031));
}

TEST_CASE("chrome trace names unknown kernels, widens empty slices and omits a zero budget",
          "[trace]") {
  StepRecord step = sample_step(7);
  step.budget = 0;
  step.kernels.resize(2);  // kernels 2.. have no recorded name
  step.events[0].end_us = step.events[0].start_us;
  step.pool = "weird \"pool\"\n\xff";  // quotes, a newline and a byte that is not UTF-8
  nlohmann::json trace = nlohmann::json::parse(kiln::memory::chrome_trace_json(step));
  std::vector<std::string> names;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "C") CHECK_FALSE(e["args"].contains("budget"));
    if (e["ph"] == "X") names.push_back(e["name"]);
    if (e["ph"] == "X" && e["ts"] == step.events[0].start_us) CHECK(e["dur"].get<double>() > 0);
  }
  CHECK(names == std::vector<std::string>{"matmul+relu", "add", "kernel 2", "matmul+relu",
                                          "kernel 3", "kernel 2", "kernel 4", "kernel 5"});
  CHECK(trace["otherData"]["budget"] == 0);
}

TEST_CASE("memory timeline svg is well formed and shows budget, peaks and recomputations",
          "[trace]") {
  const uint64_t seed = GENERATE(11u, 12u);
  StepRecord step = sample_step(seed);
  step.pool = "host \"pool\" & <co>";
  const std::string svg = kiln::memory::memory_timeline_svg(step);

  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(xml_problem(svg) == "");
  CHECK_FALSE(has_bad_number(svg));
  CHECK(count(svg, "<script") == 0);
  CHECK(svg.find("budget " + kiln::memory::format_bytes(step.budget)) != std::string::npos);
  CHECK(svg.find("planned peak " + kiln::memory::format_bytes(step.planned_peak)) !=
        std::string::npos);
  CHECK(svg.find("lower bound " + kiln::memory::format_bytes(step.lower_bound)) !=
        std::string::npos);
  CHECK(svg.find("measured peak " + kiln::memory::format_bytes(step.measured_peak)) !=
        std::string::npos);
  CHECK(svg.find("2 recomputations") != std::string::npos);
  CHECK(svg.find("schedule (events)") != std::string::npos);
  CHECK(count(svg, "class=\"recompute\"") == 2);
  CHECK(count(svg, "class=\"budget\"") == 1);
  // The recomputed kernel "<&>" and the pool name appear escaped, never raw.
  CHECK(svg.find("recompute &lt;&amp;&gt;") != std::string::npos);
  CHECK(svg.find("<&>") == std::string::npos);
  CHECK(svg.find("host &quot;pool&quot; &amp; &lt;co&gt;") != std::string::npos);
  CHECK(svg.find("no events recorded") == std::string::npos);
  check_byte_axis(svg, static_cast<double>(step.budget));
}

TEST_CASE("memory timeline without budget or events still draws its axes", "[trace]") {
  StepRecord empty;
  const std::string svg = kiln::memory::memory_timeline_svg(empty);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(xml_problem(svg) == "");
  CHECK_FALSE(has_bad_number(svg));
  CHECK(svg.find("no events recorded") != std::string::npos);
  CHECK(svg.find("schedule (events)") != std::string::npos);
  CHECK(svg.find("class=\"budget\"") == std::string::npos);
  CHECK(svg.find("no budget") != std::string::npos);
  check_byte_axis(svg, 0);

  nlohmann::json trace = nlohmann::json::parse(kiln::memory::chrome_trace_json(empty));
  size_t counters = 0;
  for (const auto& e : trace["traceEvents"]) counters += e["ph"] == "C";
  CHECK(counters == 1);
  CHECK(trace["traceEvents"].size() == 4);
}

TEST_CASE("memory timeline survives sizes near the top of size_t", "[trace]") {
  StepRecord step = sample_step(5);
  const size_t huge = SIZE_MAX - 1000;
  for (StepEvent& e : step.events) e.in_use = huge - (e.in_use % 1000);
  step.measured_peak = huge;
  step.budget = SIZE_MAX;
  step.planned_peak = SIZE_MAX / 2;
  const std::string svg = kiln::memory::memory_timeline_svg(step);
  CHECK(xml_problem(svg) == "");
  CHECK_FALSE(has_bad_number(svg));
  CHECK(svg.find("budget " + kiln::memory::format_bytes(SIZE_MAX)) != std::string::npos);
  check_byte_axis(svg, 1.8e19);
}

TEST_CASE("memory timeline fits its axis to the data and notes a budget far above it",
          "[trace][memory]") {
  StepRecord step = sample_step(13);
  step.budget = 100 * step.measured_peak;
  const std::string svg = kiln::memory::memory_timeline_svg(step);
  CHECK(xml_problem(svg) == "");
  CHECK_FALSE(has_bad_number(svg));
  CHECK(count(svg, "class=\"budget\"") == 0);
  CHECK(count(svg, "class=\"budget-note\"") == 1);
  CHECK(svg.find("budget " + kiln::memory::format_bytes(step.budget) + " is far above the plot") !=
        std::string::npos);
  // The axis ends just above the measured peak, not at the budget.
  check_byte_axis(svg, static_cast<double>(step.measured_peak));
  CHECK(byte_ticks(svg).back() < 2.0 * static_cast<double>(step.measured_peak));
  // A budget near the data is drawn at its place.
  step.budget = step.measured_peak + step.measured_peak / 4;
  const std::string near = kiln::memory::memory_timeline_svg(step);
  CHECK(count(near, "class=\"budget\"") == 1);
  CHECK(count(near, "class=\"budget-note\"") == 0);
  check_byte_axis(near, static_cast<double>(step.budget));
}

TEST_CASE("memory timeline shades the forward, backward and update phases", "[trace][memory]") {
  using Phase = kiln::memory::StepPhase;
  StepRecord step = sample_step(14);
  step.phases = {Phase::Forward,  Phase::Forward,  Phase::Forward,
                 Phase::Backward, Phase::Backward, Phase::Update};
  const std::string svg = kiln::memory::memory_timeline_svg(step);
  CHECK(xml_problem(svg) == "");
  CHECK_FALSE(has_bad_number(svg));
  // One band per run of a phase: the rebuild of kernel 0 (forward) during the backward pass
  // stays in the backward band.
  CHECK(count(svg, "class=\"phase-forward\"") == 1);
  CHECK(count(svg, "class=\"phase-backward\"") == 1);
  CHECK(count(svg, "class=\"phase-update\"") == 1);
  for (const char* name : {">forward<", ">backward<", ">update<"})
    CHECK(svg.find(name) != std::string::npos);
  // Without phases (an old record, a hand-built one) there are no bands.
  step.phases.clear();
  CHECK(kiln::memory::memory_timeline_svg(step).find("class=\"phase-") == std::string::npos);
}

TEST_CASE("memory timeline draws an unbudgeted step's curve beside the budgeted one",
          "[trace][memory]") {
  StepRecord budgeted = sample_step(15);
  StepRecord unbudgeted = sample_step(16);
  unbudgeted.budget = 0;
  const std::string svg = kiln::memory::memory_timeline_svg(budgeted, unbudgeted);
  CHECK(xml_problem(svg) == "");
  CHECK_FALSE(has_bad_number(svg));
  CHECK(count(svg, "class=\"unbudgeted\"") == 1);
  CHECK(count(svg, "class=\"in-use\"") == 1);
  CHECK(svg.find("without a budget: peak " +
                 kiln::memory::format_bytes(unbudgeted.measured_peak)) != std::string::npos);
  check_byte_axis(svg, static_cast<double>(std::max(unbudgeted.measured_peak, budgeted.budget)));
  CHECK(kiln::memory::memory_timeline_svg(budgeted).find("class=\"unbudgeted\"") ==
        std::string::npos);
}

TEST_CASE("timeline decimation keeps the peak, the ends and the order", "[trace]") {
  const uint64_t seed = GENERATE(21u, 22u, 23u);
  size_t spike = 0;
  const StepRecord step = long_step(seed, 20000, &spike);
  const auto points = kiln::memory::timeline_points(step, 2000);
  REQUIRE(points.size() <= 2000);
  CHECK(points.size() >= 1500);
  CHECK(points.front().event == 0);
  CHECK(points.front().in_use == step.start_bytes);
  CHECK(points.back().event == step.events.size());
  size_t lowest = step.start_bytes;
  for (const StepEvent& e : step.events) lowest = std::min(lowest, e.in_use);
  bool has_peak = false, has_low = false;
  for (size_t i = 0; i < points.size(); ++i) {
    if (i > 0) REQUIRE(points[i].event > points[i - 1].event);
    // Every kept point is a real one.
    if (points[i].event > 0) REQUIRE(points[i].in_use == step.events[points[i].event - 1].in_use);
    has_peak =
        has_peak || (points[i].event == spike + 1 && points[i].in_use == step.events[spike].in_use);
    has_low = has_low || points[i].in_use == lowest;
  }
  CHECK(has_peak);
  CHECK(has_low);

  // A short step keeps every point.
  const StepRecord small = sample_step(seed);
  const auto all = kiln::memory::timeline_points(small, 2000);
  REQUIRE(all.size() == small.events.size() + 1);
  for (size_t i = 1; i < all.size(); ++i) CHECK(all[i].in_use == small.events[i - 1].in_use);

  // The picture of the long step stays small and marks the spike as its peak.
  const std::string svg = kiln::memory::memory_timeline_svg(step);
  CHECK(svg.size() < 256 * 1024);
  CHECK(xml_problem(svg) == "");
  CHECK(svg.find("peak " + kiln::memory::format_bytes(step.events[spike].in_use) + " after event " +
                 std::to_string(spike + 1)) != std::string::npos);
  const size_t markers = count(svg, "class=\"recompute\"");
  CHECK(markers > 100);
  CHECK(markers <= 1000);
}

TEST_CASE("last step round-trips and the recording switch toggles", "[trace]") {
  GlobalStepGuard guard;
  const StepRecord step = sample_step(31);
  kiln::memory::set_last_step(step);
  const StepRecord back = kiln::memory::last_step();
  CHECK(back.pool == step.pool);
  CHECK(back.budget == step.budget);
  CHECK(back.measured_peak == step.measured_peak);
  CHECK(back.kernels == step.kernels);
  REQUIRE(back.events.size() == step.events.size());
  for (size_t i = 0; i < step.events.size(); ++i) {
    CHECK(back.events[i].in_use == step.events[i].in_use);
    CHECK(back.events[i].kind == step.events[i].kind);
  }
  CHECK(kiln::memory::chrome_trace_json(back) == kiln::memory::chrome_trace_json(step));

  kiln::memory::set_step_recording(true);
  CHECK(kiln::memory::step_recording());
  kiln::memory::set_step_recording(false);
  CHECK_FALSE(kiln::memory::step_recording());
}

TEST_CASE("write functions store the last step and throw IOError naming the path", "[trace]") {
  GlobalStepGuard guard;
  const StepRecord step = sample_step(41);
  kiln::memory::set_last_step(step);
  kiln::test::TempDir dir("kiln_trace");
  kiln::memory::write_memory_timeline(dir.file("step.svg"));
  kiln::memory::write_chrome_trace(dir.file("step.json"));
  CHECK(kiln::test::read_bytes(dir.file("step.svg")) == kiln::memory::memory_timeline_svg(step));
  CHECK(kiln::test::read_bytes(dir.file("step.json")) == kiln::memory::chrome_trace_json(step));

  const std::string bad = "/nonexistent-dir/x.svg";
  try {
    kiln::memory::write_memory_timeline(bad);
    FAIL("no IOError");
  } catch (const kiln::IOError& e) {
    const std::string message = e.what();
    CHECK(message.find("[write_memory_timeline]") != std::string::npos);
    CHECK(message.find(bad) != std::string::npos);
    CHECK(message.find(std::strerror(ENOENT)) != std::string::npos);
  }
  CHECK_THROWS_AS(kiln::memory::write_chrome_trace("/nonexistent-dir/x.json"), kiln::IOError);
}

// Body of the child process of the next test; does nothing unless run by it.
TEST_CASE("step recording child: reports the switch read from the environment",
          "[.][trace_child]") {
  const char* expect = std::getenv("KILN_TRACE_TEST_EXPECT");
  if (!expect) return;
  CHECK(kiln::memory::step_recording() == (std::string(expect) == "on"));
}

TEST_CASE("KILN_RECORD_STEPS is a switch: 1, true, on or yes turn recording on", "[trace]") {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"1", "on"},      {"true", "on"}, {"TRUE", "on"}, {"0", "off"},
      {"false", "off"}, {"", "off"},    {"yes", "on"}};
  for (const auto& [value, expect] : cases) {
    INFO("KILN_RECORD_STEPS='" << value << "'");
    const std::string command = "KILN_RECORD_STEPS='" + value +
                                "' KILN_TRACE_TEST_EXPECT=" + expect + " '" + self +
                                "' '[trace_child]' >/dev/null 2>&1";
    CHECK(std::system(command.c_str()) == 0);
  }
  const std::string unset = "env -u KILN_RECORD_STEPS KILN_TRACE_TEST_EXPECT=off '" + self +
                            "' '[trace_child]' >/dev/null 2>&1";
  CHECK(std::system(unset.c_str()) == 0);
}
