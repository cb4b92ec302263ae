// Memory budgets as a user writes them (memory/pools/budget_spec.h): every accepted form, every
// refusal with its message, from each entry point (set_budget, KILN_MEMORY_BUDGET, the
// examples' --memory-budget; `kiln plan` in test_cli.cpp), and the KILN_PLAN_DUMP files and
// budget errors that tell a training step from an evaluation after it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "core/settings.h"
#include "examples/common/example_util.h"
#include "frontend/kiln.h"
#include "frontend/nn/nn.h"
#include "frontend/optim.h"
#include "memory/memory.h"
#include "memory/pools/budget_spec.h"
#include "memory/reports/step_graph_file.h"
#include "test_files.h"

using namespace kiln;
using Catch::Matchers::Contains;
using memory::BudgetContext;
using memory::BudgetSpec;

namespace {

constexpr size_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;

BudgetSpec pool_budget(const std::string& text) {
  return memory::parse_budget(text, "test", BudgetContext::Pool);
}
BudgetSpec plan_budget(const std::string& text) {
  return memory::parse_budget(text, "test", BudgetContext::PlanFile);
}

// The message parse_budget throws for `text`, or "" when it parses.
std::string refusal(const std::string& text, BudgetContext context) {
  try {
    (void)memory::parse_budget(text, "source", context);
  } catch (const memory::BudgetError& e) {
    return e.what();
  }
  return "";
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

struct BudgetGuard {
  ~BudgetGuard() { memory::clear_budget(); }
};

// An example's flags as parsed from `args` (after the program name).
example::Flags example_flags(std::vector<std::string> args) {
  example::Flags flags("prog", "test");
  example::add_memory_flags(flags);
  flags.add("save", "", "weights");
  std::vector<char*> argv = {const_cast<char*>("prog")};
  for (std::string& a : args) argv.push_back(a.data());
  int code = -1;
  REQUIRE(flags.parse(static_cast<int>(argv.size()), argv.data(), &code));
  return flags;
}

}  // namespace

TEST_CASE("budgets: sizes are whole bytes or carry KB/MB/GB/TB or KiB/MiB/GiB/TiB", "[memory]") {
  struct Case {
    const char* text;
    size_t bytes;
  };
  for (const Case& c : std::vector<Case>{{"4096", 4096},
                                         {"4096B", 4096},
                                         {" 4096 ", 4096},
                                         {"1", 1},
                                         {"2", 2},
                                         {"1KB", 1000},
                                         {"1kb", 1000},
                                         {"300MB", 300000000},
                                         {"2GB", 2000000000},
                                         {"1TB", 1000000000000},
                                         {"64KiB", 64 * kKiB},
                                         {"512MiB", 512 * kMiB},
                                         {"512 MiB", 512 * kMiB},
                                         {"512mib", 512 * kMiB},
                                         {"1.5GiB", 3 * kGiB / 2},
                                         {"0.5KiB", 512},
                                         {"1TiB", 1024 * kGiB}}) {
    INFO(c.text);
    for (BudgetContext context : {BudgetContext::Pool, BudgetContext::PlanFile}) {
      const BudgetSpec s = memory::parse_budget(c.text, "test", context);
      CHECK(s.kind == BudgetSpec::Kind::Bytes);
      CHECK(s.bytes == c.bytes);
      CHECK(s.bytes_of(123456789) == c.bytes);
    }
  }
  CHECK(pool_budget("512MiB").description() == "512.0 MiB");
}

TEST_CASE("budgets: shares are percentages and say of what", "[memory]") {
  const BudgetSpec half = pool_budget("50%");
  CHECK(half.kind == BudgetSpec::Kind::ShareOfMemory);
  CHECK(half.share == 0.5);
  CHECK(half.bytes_of(1000) == 500);
  CHECK(half.description() == "50% of device memory");
  CHECK(pool_budget("12.5%").description() == "12.5% of device memory");
  CHECK(pool_budget(" 100 % ").share == 1.0);

  const BudgetSpec released = plan_budget("50%releasable");
  CHECK(released.kind == BudgetSpec::Kind::ShareOfReleasable);
  CHECK(released.share == 0.5);
  CHECK(released.description() == "50% of the releasable bytes");
  CHECK(plan_budget("33% releasable").share == 0.33);
  CHECK(plan_budget("20%RELEASABLE").share == 0.2);

  CHECK(pool_budget("none").kind == BudgetSpec::Kind::None);
  CHECK(pool_budget("None").bytes_of(1000) == 0);
  CHECK(pool_budget("none").description() == "none");
}

TEST_CASE("budgets: refusals say why, suggest the spelling and list the forms", "[memory]") {
  const auto pool = BudgetContext::Pool, plan = BudgetContext::PlanFile;
  struct Case {
    const char* text;
    BudgetContext context;
    const char* why;
  };
  for (const Case& c : std::vector<Case>{
           // A bare fraction is never read as a share: the message gives the percentage.
           {"0.5", pool, "bytes are whole; for that share of device memory write 50%"},
           {"0.25", pool, "write 25%"},
           {"1.0", pool, "write 100%"},
           {"0.5", plan, "for that share of the releasable bytes write 50%releasable"},
           {"1.5", pool, "give a unit for a fraction (1.5GiB)"},
           {"2.5B", pool, "bytes are whole"},
           {"0", pool, "write none for no budget"},
           {"0MiB", pool, "below one byte"},
           {"0.0001KB", pool, "below one byte"},
           {"lots", pool, "it does not start with a number"},
           {"", pool, "it is empty"},
           {"-1", pool, "without a sign"},
           {"+5MiB", pool, "without a sign"},
           {"1e9", pool, "'e9' is not a unit"},
           {"2M", pool, "'m' is not a unit: write MB (powers of 1000) or MiB (powers of 1024)"},
           {"2gi", pool, "write GB (powers of 1000) or GiB"},
           {"5 furlongs", pool, "'furlongs' is not a unit"},
           {"0%", pool, "above 0%"},
           {"150%", pool, "at most 100%"},
           {"50%ram", pool, "'%ram' is not a share kiln knows; write 50% (of device memory)"},
           {"50%releasable", pool, "for kiln plan only"},
           {"50%", plan, "write 50%releasable"},
           {"none", plan, "leave BUDGET out"},
           {"99999999999TB", pool, "too large"}}) {
    INFO(c.text);
    const std::string what = refusal(c.text, c.context);
    CHECK_THAT(what, Contains(std::string("[source] '") + c.text + "' is not accepted: "));
    CHECK_THAT(what, Contains(c.why));
    CHECK_THAT(what,
               Contains(std::string("; expected ") + memory::accepted_budget_forms(c.context)));
  }
  // Each context lists its own forms.
  CHECK_THAT(memory::accepted_budget_forms(pool), Contains("50%") && Contains("none"));
  CHECK_THAT(memory::accepted_budget_forms(plan), Contains("50%releasable"));
  // BudgetError is a ValueError, as every bad argument in kiln.
  CHECK_THROWS_AS(pool_budget("0.5"), ValueError);
  CHECK_THROWS_AS(pool_budget("0.5"), Error);
}

TEST_CASE("budgets: set_budget reads the same text and names itself", "[memory]") {
  BudgetGuard guard;
  memory::set_budget(std::string("512MiB"));
  CHECK(memory::budget() == 512 * kMiB);
  memory::set_budget(std::string("2GB"));
  CHECK(memory::budget() == 2000000000);
  // A plain number is bytes, however small: "1" is one byte, not all of memory.
  memory::set_budget(std::string("1"));
  CHECK(memory::budget() == 1);
  memory::set_budget(std::string("50%"));
  const size_t half = memory::budget();
  memory::set_budget(std::string("25%"));
  CHECK(memory::budget() > 0);
  CHECK(half / 2 - memory::budget() <= 4096);
  CHECK_THAT(memory::budget_description(), Contains("25% of device memory"));
  memory::set_budget(std::string("none"));
  CHECK(memory::budget() == 0);
  CHECK(memory::budget_description() == "none");

  memory::set_budget(std::string("1MiB"));
  CHECK_THROWS_WITH(memory::set_budget(std::string("0.5")),
                    Contains("[set_budget] '0.5' is not accepted") && Contains("write 50%"));
  CHECK(memory::budget() == kMiB);  // a refused text leaves the budget as it was
  CHECK_THROWS_AS(memory::set_budget(std::string("50%releasable")), memory::BudgetError);
  CHECK_THROWS_AS(memory::set_budget(plan_budget("50%releasable")), memory::BudgetError);
  memory::set_budget(pool_budget("3KiB"));
  CHECK(memory::budget() == 3 * kKiB);
}

TEST_CASE("budgets: KILN_MEMORY_BUDGET's registered forms are the parser's", "[memory]") {
  CHECK(std::string(settings::variable("KILN_MEMORY_BUDGET").accepted) ==
        memory::accepted_budget_forms(BudgetContext::Pool));
}

// Body of the child process of the next test; does nothing unless run by it.
TEST_CASE("budgets: environment child", "[.][budget_env_child]") {
  const char* expect = std::getenv("KILN_BUDGET_CHILD_EXPECT");
  if (!expect) return;
  const std::string want = expect;
  if (want.rfind("bytes=", 0) == 0) {
    CHECK(memory::budget() == std::stoull(want.substr(6)));
    return;
  }
  for (int attempt = 0; attempt < 2; ++attempt) {  // from every call, not just the first
    try {
      (void)memory::budget();
      FAIL("expected BudgetError");
    } catch (const memory::BudgetError& e) {
      CHECK_THAT(e.what(), Contains("[KILN_MEMORY_BUDGET] '") && Contains(want) &&
                               Contains("unset KILN_MEMORY_BUDGET for no budget"));
    }
  }
}

TEST_CASE("budgets: KILN_MEMORY_BUDGET reads the same text and names itself", "[memory]") {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  struct Case {
    const char* value;
    const char* expect;  // "bytes=N", or a part of the refusal
  };
  for (const Case& c : std::vector<Case>{{"16MiB", "bytes=16777216"},
                                         {"2", "bytes=2"},
                                         {"none", "bytes=0"},
                                         {"0.5", "write 50%"},
                                         {"1.5", "give a unit"},
                                         {"50%releasable", "for kiln plan only"}}) {
    INFO(c.value);
    const std::string command = std::string("KILN_MEMORY_BUDGET='") + c.value +
                                "' KILN_BUDGET_CHILD_EXPECT='" + c.expect + "' '" + self +
                                "' '[budget_env_child]' >/dev/null 2>&1";
    CHECK(std::system(command.c_str()) == 0);
  }
}

TEST_CASE("budgets: --memory-budget reads the same text, a refusal is a usage error", "[memory]") {
  BudgetGuard guard;
  example::check_memory_flags(example_flags({"--memory-budget", "2MiB"}));
  try {
    example::check_memory_flags(example_flags({"--memory-budget", "0.5"}));
    FAIL("expected UsageError");
  } catch (const example::UsageError& e) {
    CHECK_THAT(e.what(), Contains("[--memory-budget] '0.5' is not accepted") &&
                             Contains("write 50%") && Contains("512MiB"));
  }
  CHECK(memory::budget() == 0);  // checking sets nothing
  example::apply_memory_flags(example_flags({"--memory-budget", "3MB"}));
  CHECK(memory::budget() == 3000000);
  example::apply_memory_flags(example_flags({"--memory-budget=25%"}));
  CHECK_THAT(memory::budget_description(), Contains("25% of device memory"));
}

TEST_CASE("budgets: examples check their output paths before any work", "[memory]") {
  test::TempDir tmp("kiln_budget_paths");
  const std::string ok = tmp.file("out.svg"), missing = tmp.file("no/such/dir/out.svg");
  example::check_memory_flags(
      example_flags({"--memory-timeline", ok, "--trace", tmp.file("t.json"), "--save", ok}),
      {"save"});
  CHECK_FALSE(std::filesystem::exists(ok));  // checking creates nothing
  for (const char* flag : {"--memory-timeline", "--trace", "--save"}) {
    INFO(flag);
    try {
      example::check_memory_flags(example_flags({flag, missing}), {"save"});
      FAIL("expected IOError");
    } catch (const IOError& e) {
      CHECK_THAT(e.what(), Contains(std::string("[") + flag + "] cannot write '" + missing) &&
                               Contains("does not exist") && Contains("nothing was run"));
    }
  }
  CHECK_THROWS_WITH(
      example::check_memory_flags(example_flags({"--save", tmp.path.string()}), {"save"}),
      Contains("it is a directory"));
  {
    ScopedEnv dump("KILN_PLAN_DUMP", tmp.file("missing/step-%n.graph"));
    CHECK_THROWS_WITH(example::check_memory_flags(example_flags({})),
                      Contains("[KILN_PLAN_DUMP] '") && Contains("is not accepted") &&
                          Contains("step-000000.graph") && Contains("does not exist"));
  }
  ScopedEnv dump("KILN_PLAN_DUMP", tmp.file("step-%n.graph"));
  example::check_memory_flags(example_flags({}));
}

TEST_CASE("budgets: KILN_PLAN_DUMP numbers files with six digits", "[memory]") {
  ScopedEnv dump("KILN_PLAN_DUMP", "/tmp/x/step-%n.graph");
  const std::string a = memory::plan_dump_path(true), b = memory::plan_dump_path(false);
  std::smatch ma, mb;
  const std::regex numbered("/tmp/x/step-([0-9]{6})\\.graph");
  REQUIRE(std::regex_match(a, ma, numbered));
  REQUIRE(std::regex_match(b, mb, numbered));
  CHECK(std::stoi(mb[1].str()) == std::stoi(ma[1].str()) + 1);
}

TEST_CASE("budgets: KILN_PLAN_DUMP without %n keeps the last training step", "[memory]") {
  test::TempDir tmp("kiln_plan_dump");
  const std::string path = tmp.file("step.graph");
  ScopedEnv dump("KILN_PLAN_DUMP", path);
  manual_seed(3);
  auto layer = std::make_shared<nn::Linear>(16, 8);
  optim::SGD opt(layer->parameters(), {.lr = 0.1});
  const Tensor x = randn({4, 16});
  opt.zero_grad();
  Tensor loss = sum(layer->forward(x));
  loss.backward();
  opt.step();
  (void)loss.item<float>();
  const memory::StepGraphFile trained = memory::load_step_graph(path);
  {
    // A test pass after it: an evaluation that updates nothing leaves the file alone.
    NoGradGuard no_grad;
    (void)sum(exp(layer->forward(randn({32, 16})))).item<float>();
  }
  const memory::StepGraphFile after = memory::load_step_graph(path);
  CHECK(after.graph.kernels.size() == trained.graph.kernels.size());
  CHECK(after.kernel_names == trained.kernel_names);
  CHECK(after.graph.start_bytes == trained.graph.start_bytes);
  // Another file holds no training step yet: an evaluation writes it.
  const std::string other = tmp.file("other.graph");
  ScopedEnv dump_other("KILN_PLAN_DUMP", other);
  {
    NoGradGuard no_grad;
    (void)sum(exp(layer->forward(randn({32, 16})))).item<float>();
  }
  CHECK(memory::load_step_graph(other).graph.kernels.size() < trained.graph.kernels.size());
}

TEST_CASE("budgets: a step over the budget says whether it is a training step", "[memory]") {
  BudgetGuard guard;
  manual_seed(4);
  auto layer = std::make_shared<nn::Linear>(64, 64);
  optim::SGD opt(layer->parameters(), {.lr = 0.1});
  const Tensor x = randn({64, 64});
  eval(layer->parameters());
  memory::set_budget(memory::host_pool().allocated() + 1024);
  opt.zero_grad();
  Tensor loss = sum(relu(layer->forward(x)));
  loss.backward();
  opt.step();
  CHECK_THROWS_WITH(loss.item<float>(), Contains("this evaluation (a training step: it updates") &&
                                            Contains("cannot run within the memory budget"));
  memory::clear_budget();
  (void)loss.item<float>();
  memory::set_budget(memory::host_pool().allocated() + 1024);
  NoGradGuard no_grad;
  Tensor test = sum(relu(layer->forward(randn({128, 64}))));
  try {
    (void)example::in_phase("the test pass after epoch 3", [&] { return test.item<float>(); });
    FAIL("expected OutOfMemoryError");
  } catch (const OutOfMemoryError& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Contains("the test pass after epoch 3 does not fit the memory budget that "
                              "training ran in: [memory] this evaluation (not a training step"));
    CHECK_THAT(what, Contains("evaluate in smaller batches"));
  }
}

TEST_CASE("budgets: a recorded training step knows its forward, backward and update kernels",
          "[memory]") {
  using Phase = memory::StepPhase;
  const bool was = memory::step_recording();
  memory::set_step_recording(true);
  manual_seed(5);
  auto layer = std::make_shared<nn::Linear>(16, 8);
  optim::SGD opt(layer->parameters(), {.lr = 0.1});
  opt.zero_grad();
  Tensor loss = sum(relu(layer->forward(randn({4, 16}))));
  loss.backward();
  opt.step();
  (void)loss.item<float>();
  const memory::StepRecord r = memory::last_step();
  // Adam, second step: the parameters are leaves now, and the moments updates too.
  optim::Adam adam(layer->parameters(), {.lr = 0.01});
  for (int step = 0; step < 2; ++step) {
    adam.zero_grad();
    Tensor l = sum(relu(layer->forward(randn({4, 16}))));
    l.backward();
    adam.step();
    (void)l.item<float>();
  }
  const memory::StepRecord second = memory::last_step();

  {
    NoGradGuard no_grad;
    (void)sum(layer->forward(randn({4, 16}))).item<float>();
  }
  const memory::StepRecord test_pass = memory::last_step();
  memory::set_step_recording(was);

  REQUIRE(r.phases.size() == r.kernels.size());
  CHECK(std::count(r.phases.begin(), r.phases.end(), Phase::Forward) > 0);
  CHECK(std::count(r.phases.begin(), r.phases.end(), Phase::Backward) > 0);
  // SGD updates the weight and the bias, at the end of the step.
  CHECK(std::count(r.phases.begin(), r.phases.end(), Phase::Update) == 2);
  CHECK(r.phases.back() == Phase::Update);
  // Adam: each parameter's two moments and its new value, after the backward pass.
  REQUIRE(second.phases.size() == second.kernels.size());
  CHECK(std::count(second.phases.begin(), second.phases.end(), Phase::Update) == 6);
  const auto first_update = std::find(second.phases.begin(), second.phases.end(), Phase::Update);
  CHECK(std::find(first_update, second.phases.end(), Phase::Backward) == second.phases.end());
  CHECK(std::find(first_update, second.phases.end(), Phase::Forward) == second.phases.end());
  // A test pass is all forward.
  REQUIRE_FALSE(test_pass.phases.empty());
  CHECK(std::count(test_pass.phases.begin(), test_pass.phases.end(), Phase::Forward) ==
        static_cast<long>(test_pass.phases.size()));
}
