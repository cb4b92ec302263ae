// kiln::TrainingMonitor: its gradient norm against a float64 norm of the gradients computed
// here from their values, that watching a step adds no evaluation (jit::replay_stats counts
// every JIT evaluation), that the CSV and JSON-lines logs parse with the documented columns,
// that warnings fire when the norm stops being finite and when memory crosses the warning
// share (once per crossing), and the progress display's two forms. Nothing here depends on
// how long a step takes.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "python_support.h"
#include "test_files.h"

using namespace kiln;

namespace {

// A two-layer MLP with a loss over random data: the gradients of every parameter are
// defined after backward().
struct SmallNet {
  std::shared_ptr<nn::Linear> l1 = std::make_shared<nn::Linear>(12, 20);
  std::shared_ptr<nn::Linear> l2 = std::make_shared<nn::Linear>(20, 5);
  std::vector<Tensor> params() const {
    std::vector<Tensor> p = l1->parameters();
    for (const Tensor& t : l2->parameters()) p.push_back(t);
    return p;
  }
  Tensor loss(int64_t batch) const {
    Tensor x = randn({batch, 12});
    Tensor y = randint(0, 5, {batch});
    return nn::cross_entropy(l2->forward(relu(l1->forward(x))), y);
  }
};

uint64_t evaluations() {
  const jit::ReplayStats r = jit::replay_stats();
  return r.hits + r.misses;
}

// The 2-norm of every gradient's elements, summed in float64 from their values.
double float64_norm(const std::vector<Tensor>& params) {
  double sq = 0;
  for (const Tensor& p : params) {
    if (!p.grad().defined()) continue;
    for (double g : p.grad().to_vector<double>()) sq += g * g;
  }
  return std::sqrt(sq);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, sep)) fields.push_back(field);
  return fields;
}

// Options that print nothing, so tests only see what they ask for.
TrainingMonitorOptions quiet() {
  return {.display = ProgressDisplay::Off, .warning_stream = nullptr};
}

}  // namespace

TEST_CASE("monitor grad norm equals a float64 norm of the gradients", "[monitor]") {
  for (uint64_t seed : {1u, 2u, 3u}) {
    manual_seed(seed);
    SmallNet net;
    TrainingMonitor monitor(net.params(), quiet());
    Tensor loss = net.loss(16) * 100.0;  // norms well above 1 as well as below
    loss.backward();
    Tensor norm = monitor.grad_norm();
    eval({loss, norm});
    const StepMetrics& m = monitor.step(loss, 16);
    const double expected = float64_norm(net.params());
    INFO("seed " << seed << ": monitor " << m.grad_norm << ", float64 " << expected);
    // float32 squares summed over 345 elements: a few ulps of float32 at most.
    REQUIRE(m.grad_norm == Approx(expected).epsilon(1e-5));
    REQUIRE(m.grad_norm == Approx(norm.item<double>()).epsilon(0));
  }
}

TEST_CASE("monitor grad norm skips parameters without gradients and reads float64 ones",
          "[monitor]") {
  Tensor a = randn({7, 3}, DType::Float64).eval().requires_grad_();
  Tensor b = randn({4}, DType::Float64).eval().requires_grad_();
  Tensor unused = randn({5}, DType::Float64).eval().requires_grad_();
  TrainingMonitor monitor({a, b, unused}, quiet());
  Tensor loss = sum(square(a)) * 3.0 + sum(exp(b));
  loss.backward();
  REQUIRE_FALSE(unused.grad().defined());
  Tensor norm = monitor.grad_norm();
  REQUIRE(norm.dtype() == DType::Float64);
  eval({loss, norm});
  // float64 throughout: agreement to rounding.
  REQUIRE(monitor.step(loss, 1).grad_norm == Approx(float64_norm({a, b})).epsilon(1e-12));
}

TEST_CASE("monitor adds no evaluation to a training step", "[monitor]") {
  manual_seed(5);
  SmallNet net;
  optim::Adam opt(net.params(), {.lr = 1e-3});
  TrainingMonitor monitor(net.params(), quiet());
  for (int step = 0; step < 4; ++step) {
    opt.zero_grad();
    Tensor loss = net.loss(8);
    loss.backward();
    Tensor norm = monitor.grad_norm();
    opt.step();
    const uint64_t before = evaluations();
    eval({loss, norm});  // forward, backward, update and the norm: one evaluation
    const uint64_t after_step = evaluations();
    const StepMetrics& m = monitor.step(loss, 8);
    REQUIRE(after_step - before == 1);
    REQUIRE(evaluations() == after_step);
    REQUIRE(std::isfinite(m.grad_norm));
  }
  REQUIRE(monitor.extra_evaluations() == 0);

  SECTION("a norm left out of the step's evaluation costs one more, and is counted") {
    opt.zero_grad();
    Tensor loss = net.loss(8);
    loss.backward();
    loss.eval();
    Tensor norm = monitor.grad_norm();  // built after the step ran: nothing evaluated it
    REQUIRE_FALSE(norm.is_evaluated());
    const uint64_t before = evaluations();
    monitor.step(loss, 8);
    REQUIRE(monitor.extra_evaluations() == 1);
    REQUIRE(evaluations() - before == 1);
  }
}

TEST_CASE("monitor uses the norm clip_grad_norm returns", "[monitor]") {
  manual_seed(9);
  SmallNet net;
  TrainingMonitor monitor(net.params(), quiet());
  Tensor loss = net.loss(16) * 50.0;
  loss.backward();
  const double unclipped = float64_norm(net.params());
  Tensor total = optim::clip_grad_norm(net.params(), 0.5);
  monitor.watch_grad_norm(total);
  eval({loss, total});
  const StepMetrics& m = monitor.step(loss, 16);
  REQUIRE(monitor.extra_evaluations() == 0);
  REQUIRE(m.grad_norm == Approx(unclipped).epsilon(1e-5));  // the norm before clipping
  REQUIRE(unclipped > 0.5);
  REQUIRE(float64_norm(net.params()) == Approx(0.5).epsilon(1e-4));
  REQUIRE_THROWS_AS(monitor.watch_grad_norm(zeros({2})), ShapeError);
}

TEST_CASE("monitor CSV and JSON-lines logs parse with the documented columns", "[monitor]") {
  test::TempDir dir("kiln_monitor_logs");
  const std::string csv = dir.file("steps.csv"), jsonl = dir.file("steps.jsonl");
  manual_seed(3);
  SmallNet net;
  optim::SGD opt(net.params(), {.lr = 0.05});
  const int steps = 3;
  {
    TrainingMonitorOptions o = quiet();
    o.total_steps = steps;
    o.csv_path = csv;
    o.jsonl_path = jsonl;
    o.optimizer = &opt;
    TrainingMonitor monitor(net.params(), o);
    for (int s = 1; s <= steps; ++s) {
      opt.zero_grad();
      Tensor loss = net.loss(4);
      loss.backward();
      Tensor norm = monitor.grad_norm();
      opt.step();
      eval({loss, norm});
      monitor.step(loss, 4);
    }
  }  // the destructor closes the logs

  const std::vector<std::string>& columns = TrainingMonitor::columns();
  const std::vector<std::string> expected = {
      "step",         "loss",           "smoothed_loss",  "grad_norm",
      "lr",           "samples",        "seconds",        "throughput",
      "elapsed",      "memory_peak",    "memory_current", "memory_reserved",
      "memory_limit", "memory_fraction"};
  REQUIRE(columns == expected);

  const std::vector<std::string> rows = lines_of(test::read_bytes(csv));
  REQUIRE(rows.size() == static_cast<size_t>(steps) + 1);
  REQUIRE(split(rows[0], ',') == columns);
  for (int s = 1; s <= steps; ++s) {
    const std::vector<std::string> fields = split(rows[static_cast<size_t>(s)], ',');
    REQUIRE(fields.size() == columns.size());
    std::vector<double> values;
    for (const std::string& f : fields) {
      char* end = nullptr;
      values.push_back(std::strtod(f.c_str(), &end));
      INFO("field '" << f << "'");
      REQUIRE(*end == '\0');
    }
    REQUIRE(values[0] == s);
    REQUIRE(std::isfinite(values[1]));
    REQUIRE(values[3] > 0);
    REQUIRE(values[4] == Approx(0.05));
    REQUIRE(values[5] == 4);
    REQUIRE(values[12] > 0);                 // a limit: the machine's RAM when there is no budget
    REQUIRE(values[9] >= values[10] - 0.5);  // the step's peak is at least what stays
  }

  const std::vector<std::string> objects = lines_of(test::read_bytes(jsonl));
  REQUIRE(objects.size() == static_cast<size_t>(steps));
  for (const std::string& line : objects) {
    REQUIRE(line.front() == '{');
    REQUIRE(line.back() == '}');
    for (const std::string& c : columns) REQUIRE(line.find('"' + c + "\": ") != std::string::npos);
  }
  if (test::python_has("json")) {
    // Every line is a JSON object with exactly the columns, in order, and numbers (or null).
    const std::string script =
        "import json,sys\n"
        "cols=sys.argv[2].split(',')\n"
        "for n,l in enumerate(open(sys.argv[1]),1):\n"
        "  o=json.loads(l)\n"
        "  assert list(o)==cols, list(o)\n"
        "  assert all(v is None or isinstance(v,(int,float)) for v in o.values())\n"
        "  assert o['step']==n and o['samples']==4\n";
    test::write_bytes(dir.file("check.py"), script);
    std::string cols;
    for (const std::string& c : columns) cols += (cols.empty() ? "" : ",") + c;
    REQUIRE(std::system((test::python3() + " " + dir.file("check.py") + " " + jsonl + " " + cols)
                            .c_str()) == 0);
  } else {
    WARN("python3 without json: the JSON lines were checked by their keys only");
  }
}

TEST_CASE("monitor writes null in JSON and nan in CSV for a missing loss", "[monitor]") {
  test::TempDir dir("kiln_monitor_null");
  TrainingMonitorOptions o = quiet();
  o.csv_path = dir.file("a.csv");
  o.jsonl_path = dir.file("a.jsonl");
  {
    TrainingMonitor monitor({}, o);
    monitor.step(Tensor(), 2);  // no loss, no norm
  }
  const std::string json = test::read_bytes(o.jsonl_path);
  REQUIRE(json.find("\"loss\": null") != std::string::npos);
  REQUIRE(json.find("\"grad_norm\": null") != std::string::npos);
  REQUIRE(split(lines_of(test::read_bytes(o.csv_path))[1], ',')[1] == "nan");
}

TEST_CASE("monitor warns when the gradient norm becomes non-finite", "[monitor]") {
  Tensor w = zeros({3}).requires_grad_();
  std::ostringstream warnings;
  TrainingMonitorOptions o = quiet();
  o.warning_stream = &warnings;
  TrainingMonitor monitor({w}, o);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  auto step_with_grad = [&](std::vector<double> g) {
    w.set_grad(from_vector<double>(g).to(DType::Float32));
    Tensor norm = monitor.grad_norm();
    norm.eval();
    return monitor.step(Tensor(), 1);
  };
  REQUIRE_FALSE(step_with_grad({1, 2, 2}).nonfinite_grad_norm);
  REQUIRE(monitor.last().grad_norm == Approx(3.0));
  REQUIRE(monitor.warnings().empty());

  REQUIRE(step_with_grad({1, nan, 2}).nonfinite_grad_norm);
  REQUIRE(monitor.warnings().size() == 1);
  REQUIRE(monitor.warnings()[0].find("step 2: the gradient norm is nan") != std::string::npos);
  REQUIRE(warnings.str() == monitor.warnings()[0] + "\n");

  REQUIRE(step_with_grad({inf, 0, 0}).nonfinite_grad_norm);
  REQUIRE(monitor.warnings().size() == 1);  // still non-finite: no new warning
  REQUIRE_FALSE(step_with_grad({0, 0, 1}).nonfinite_grad_norm);
  REQUIRE(step_with_grad({inf, 0, 0}).nonfinite_grad_norm);
  REQUIRE(monitor.warnings().size() == 2);
  REQUIRE(monitor.warnings()[1].find("step 5: the gradient norm is inf") != std::string::npos);
}

TEST_CASE("monitor warns when memory crosses the warning share", "[monitor]") {
  Tensor held = ones({256, 256}).eval();  // 256 KiB allocated while the steps run
  Tensor w = ones({8}).requires_grad_();
  auto run_step = [&](TrainingMonitor& monitor) {
    Tensor loss = sum(square(w));
    loss.backward();
    Tensor norm = monitor.grad_norm();
    eval({loss, norm});
    w.set_grad(Tensor());
    return monitor.step(loss, 1);
  };

  SECTION("against the device's memory, once per crossing") {
    TrainingMonitorOptions o = quiet();
    o.memory_warning = 1e-12;  // any allocation crosses it
    TrainingMonitor monitor({w}, o);
    const StepMetrics m = run_step(monitor);
    REQUIRE(m.memory_limit == memory::total_memory(Device::cpu()));
    REQUIRE(m.memory_peak >= static_cast<size_t>(held.numel()) * 4);
    REQUIRE(m.over_memory_warning);
    REQUIRE(monitor.warnings().size() == 1);
    REQUIRE(monitor.warnings()[0].find("step 1: the step's memory peak") != std::string::npos);
    REQUIRE(monitor.warnings()[0].find("RAM (warning at 0%)") != std::string::npos);
    run_step(monitor);
    REQUIRE(monitor.warnings().size() == 1);  // still over: no new warning
  }

  SECTION("against a budget, which is the limit once set") {
    struct ClearBudget {
      ~ClearBudget() { memory::clear_budget(); }
    } clear_at_end;  // also when a REQUIRE fails
    memory::set_budget(size_t{1} << 40);
    TrainingMonitorOptions o = quiet();
    TrainingMonitor monitor({w}, o);
    StepMetrics m = run_step(monitor);
    REQUIRE(m.memory_limit == size_t{1} << 40);
    REQUIRE_FALSE(m.over_memory_warning);
    REQUIRE(monitor.warnings().empty());
    // A budget the step's peak exceeds 85% of: just above the peak.
    memory::set_budget(m.memory_peak + m.memory_peak / 20 + 4096);
    m = run_step(monitor);
    INFO("peak " << m.memory_peak << " of " << m.memory_limit);
    REQUIRE(m.over_memory_warning);
    REQUIRE(monitor.warnings().size() == 1);
    REQUIRE(monitor.warnings()[0].find("budget (warning at 85%)") != std::string::npos);
  }

  SECTION("never with a warning share of 0") {
    TrainingMonitorOptions o = quiet();
    o.memory_warning = 0;
    TrainingMonitor monitor({w}, o);
    REQUIRE_FALSE(run_step(monitor).over_memory_warning);
    REQUIRE(monitor.warnings().empty());
  }
}

TEST_CASE("monitor prints plain lines every print_every steps", "[monitor]") {
  std::ostringstream out;
  TrainingMonitor monitor({}, {.total_steps = 5,
                               .unit = "tokens",
                               .stream = &out,
                               .display = ProgressDisplay::Lines,
                               .print_every = 2,
                               .warning_stream = nullptr});
  Tensor loss = tensor(1.5f);
  for (int s = 0; s < 5; ++s) {
    monitor.set_status("epoch " + std::to_string(s / 2 + 1));
    monitor.step(loss, 10);
  }
  monitor.print("a note");
  monitor.finish();
  const std::vector<std::string> lines = lines_of(out.str());
  REQUIRE(lines.size() == 5);  // steps 2, 4 and the last, the note and the summary
  REQUIRE(lines[0].rfind("step 2/5  loss 1.5000  mem ", 0) == 0);
  REQUIRE(lines[0].find(" tokens/s  epoch 1") != std::string::npos);
  REQUIRE(lines[1].rfind("step 4/5", 0) == 0);
  REQUIRE(lines[2].rfind("step 5/5", 0) == 0);
  REQUIRE(lines[2].find("epoch 3") != std::string::npos);
  REQUIRE(lines[3] == "a note");
  REQUIRE(lines[4].rfind("monitor: 5 steps in ", 0) == 0);
  REQUIRE(out.str().find('\r') == std::string::npos);
}

TEST_CASE("monitor redraws one line on a terminal and ends it before other text", "[monitor]") {
  std::ostringstream out;
  std::ostringstream warnings;
  Tensor w = zeros({1}).requires_grad_();
  TrainingMonitor monitor(
      {w}, {.stream = &out, .display = ProgressDisplay::Terminal, .warning_stream = &warnings});
  w.set_grad(from_vector<float>({std::numeric_limits<float>::quiet_NaN()}));
  monitor.grad_norm().eval();
  monitor.step(Tensor(), 1);  // the first step is drawn, then a warning ends its line
  REQUIRE(out.str().rfind("\rstep 1  grad norm nan  mem ", 0) == 0);
  REQUIRE(out.str().back() == '\n');
  REQUIRE(monitor.warnings().size() == 1);
  monitor.print("between steps");
  monitor.finish();
  REQUIRE(lines_of(out.str()).size() == 3);
  REQUIRE(lines_of(out.str())[1] == "between steps");
}

TEST_CASE("monitor rejects bad options and unwritable logs", "[monitor]") {
  REQUIRE_THROWS_AS(TrainingMonitor({}, {.total_steps = -1}), ValueError);
  REQUIRE_THROWS_AS(TrainingMonitor({}, {.print_every = -2}), ValueError);
  REQUIRE_THROWS_AS(TrainingMonitor({}, {.loss_smoothing = 1.0}), ValueError);
  REQUIRE_THROWS_AS(TrainingMonitor({}, {.memory_warning = 1.5}), ValueError);
  REQUIRE_THROWS_AS(TrainingMonitor({Tensor()}), ValueError);
  test::TempDir dir("kiln_monitor_bad");
  TrainingMonitorOptions o = quiet();
  o.csv_path = dir.file("missing/steps.csv");
  try {
    TrainingMonitor monitor({}, o);
    FAIL("no error for an unwritable csv_path");
  } catch (const IOError& e) {
    REQUIRE(std::string(e.what()).find("[TrainingMonitor] cannot write csv_path '" + o.csv_path +
                                       "'") == 0);
  }
}

TEST_CASE("total_grad_norm is clip_grad_norm's norm for every order", "[monitor][optim]") {
  for (double order : {1.0, 2.0, 3.0, std::numeric_limits<double>::infinity()}) {
    Tensor a = from_vector<float>({3, -4, 1}).requires_grad_();
    Tensor b = from_vector<float>({-2, 0.5}).requires_grad_();
    a.set_grad(from_vector<float>({3, -4, 1}));
    b.set_grad(from_vector<float>({-2, 0.5}));
    const double total = optim::total_grad_norm({a, b}, order).item<double>();
    double expected = 0;
    for (double g : {3.0, -4.0, 1.0, -2.0, 0.5})
      expected = std::isinf(order) ? std::max(expected, std::abs(g))
                                   : expected + std::pow(std::abs(g), order);
    if (!std::isinf(order)) expected = std::pow(expected, 1 / order);
    REQUIRE(total == Approx(expected).epsilon(1e-6));
    REQUIRE(optim::clip_grad_norm({a, b}, 1e9, order).item<double>() == Approx(total));
  }
  REQUIRE_THROWS_AS(optim::total_grad_norm({}, -1), ValueError);
}
