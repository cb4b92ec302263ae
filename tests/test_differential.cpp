// Differential tests: seeded random graphs (tests/random_graph.h) evaluated by the
// reference evaluator and by another executor must agree (STYLE item 8; issue 3 §7).
//
// Protocol: the graph of a seed is built twice (the generator is deterministic, including
// its random data), one copy is evaluated with set_executor("reference"), the other with
// set_executor(X), all outputs of a copy together with kiln::eval. Every output must have
// the same dtype and shape and agree element-wise:
//   integers and bool     exact
//   float64               |got - want| <= 1e-12 + 1e-9 * |want| + err
//   float32               |got - want| <= 1e-5  + 1e-4 * |want| + err
//   float16               |got - want| <= 1e-3  + 1e-2 * |want| + err
//   bfloat16              |got - want| <= 1e-2  + 5e-2 * |want| + err
//   NaN matches only NaN, an infinity only the same infinity.
// `err` is the generator's propagated bound for that output (see random_graph.h): zero for
// values every correct executor computes bit-exactly, otherwise a first-order bound from a
// few units of roundoff per op and, for reductions over n terms, roundoff * sqrt(n) * n *
// max|term| (reassociated sums); it keeps the check meaningful after cancellation and long
// float16 chains without loosening it for simple graphs.
//
// Executors compared: "reference" against itself (determinism; exact), against a
// test-only "perturbed reference" that moves every rounded float result by up to 1 ulp
// (a stand-in for a JIT that rounds differently; it validates the tolerance model before
// the JIT exists), and "jit" when registered. The jit runs once per CPU compiler: since the
// compiler choice may be read once per process, the test re-runs this binary with
// KILN_CPU_COMPILER=llvm and =external (KILN_DIFF_COMPILERS overrides the list, e.g.
// "external" for a -DKILN_WITH_LLVM=OFF build); the child runs the graphs in-process.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/cuda_driver.h"
#include "frontend/kiln.h"
#include "jit/compiler.h"
#include "jit/executor.h"
#include "random_graph.h"

using kiln::DType;
using kiln::Tensor;
using kiln::test::build_random_graph;
using kiln::test::RandomGraph;

namespace {

struct Tolerance {
  double rel, abs;
};

/// The stated per-dtype tolerance (file comment); integers and bool are exact.
Tolerance stated_tolerance(DType d) {
  switch (d) {
    case DType::Float64:
      return {1e-9, 1e-12};
    case DType::Float32:
      return {1e-4, 1e-5};
    case DType::Float16:
      return {1e-2, 1e-3};
    case DType::BFloat16:
      return {5e-2, 1e-2};
    default:
      return {0, 0};
  }
}

/// Restores the default executor when a test leaves, whatever happened.
struct ExecutorGuard {
  ~ExecutorGuard() { kiln::set_executor(""); }
};

std::string coords_of(const kiln::Shape& shape, size_t flat) {
  std::vector<int64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = static_cast<int64_t>(flat) % std::max<int64_t>(shape[d], 1);
    flat /= static_cast<size_t>(std::max<int64_t>(shape[d], 1));
  }
  return kiln::test::detail_graph::vec_txt(c);
}

/// "" when `got` matches `want` (exact: bit-for-bit, NaN == NaN), else the first mismatch.
std::string compare(const Tensor& want, const Tensor& got, double err, bool exact) {
  std::ostringstream os;
  os.precision(17);
  if (want.dtype() != got.dtype() || want.shape() != got.shape()) {
    os << "dtype/shape " << kiln::dtype_name(got.dtype()) << kiln::shape_str(got.shape())
       << ", expected " << kiln::dtype_name(want.dtype()) << kiln::shape_str(want.shape());
    return os.str();
  }
  DType d = want.dtype();
  if (!kiln::is_floating(d)) {
    std::vector<int64_t> w = want.to_vector<int64_t>(), g = got.to_vector<int64_t>();
    for (size_t i = 0; i < w.size(); ++i) {
      if (w[i] != g[i]) {
        os << "element " << i << " " << coords_of(want.shape(), i) << " of " << kiln::dtype_name(d)
           << kiln::shape_str(want.shape()) << ": got " << g[i] << ", expected " << w[i]
           << " (exact)";
        return os.str();
      }
    }
    return "";
  }
  Tolerance tol = exact ? Tolerance{0, 0} : stated_tolerance(d);
  if (exact) err = 0;
  std::vector<double> w = want.to_vector<double>(), g = got.to_vector<double>();
  for (size_t i = 0; i < w.size(); ++i) {
    double a = g[i], b = w[i];
    bool ok;
    if (std::isnan(a) || std::isnan(b))
      ok = std::isnan(a) && std::isnan(b);
    else if (std::isinf(a) || std::isinf(b))
      ok = a == b;
    else
      ok = std::fabs(a - b) <= tol.abs + tol.rel * std::fabs(b) + err;
    if (!ok) {
      os << "element " << i << " " << coords_of(want.shape(), i) << " of " << kiln::dtype_name(d)
         << kiln::shape_str(want.shape()) << ": got " << a << ", expected " << b << ", |diff| "
         << std::fabs(a - b) << " > allowed " << tol.abs + tol.rel * std::fabs(b) + err << " (abs "
         << tol.abs << ", rel " << tol.rel << ", propagated bound " << err << ")";
      return os.str();
    }
  }
  return "";
}

/// Text that reproduces a failing seed: the build log and kiln's graph dump.
std::string describe(uint64_t seed) {
  RandomGraph g = build_random_graph(seed);
  return "seed " + std::to_string(seed) + "\n" + kiln::test::graph_log(g) +
         kiln::dump_graph(g.outputs);
}

struct RunStats {
  int graphs = 0, ops = 0, outputs = 0, elements = 0, graphs_with_build_errors = 0, failures = 0;
};

/// Evaluates seeds [first, first + count) under "reference" and `executor`, CHECKing each
/// output; stops reporting after a few failing graphs to keep the log readable.
/// With `device` a CUDA device, the tested copy is built there (default_device), so the jit
/// runs it with CUDA kernels while the reference copy stays on the CPU.
RunStats run_differential(const char* executor, uint64_t first, int count, bool exact,
                          kiln::Device device = kiln::Device::cpu()) {
  ExecutorGuard guard;
  // KILN_DIFF_SCALE=k runs k times as many graphs (a longer soak of the same protocol).
  if (const char* scale = std::getenv("KILN_DIFF_SCALE")) count *= std::max(1, std::atoi(scale));
  RunStats st;
  for (int k = 0; k < count; ++k) {
    uint64_t seed = first + static_cast<uint64_t>(k);
    // Reported if the executor crashes (Catch prints live INFO messages on a fatal signal).
    INFO("evaluating seed " << seed << " under " << executor);
    RandomGraph ref = build_random_graph(seed);
    kiln::set_default_device(device);
    RandomGraph test;
    try {
      test = build_random_graph(seed);
    } catch (...) {
      kiln::set_default_device(kiln::Device::cpu());
      throw;
    }
    kiln::set_default_device(kiln::Device::cpu());
    ++st.graphs;
    st.ops += ref.ops;
    st.outputs += static_cast<int>(ref.outputs.size());
    if (ref.build_errors) ++st.graphs_with_build_errors;
    REQUIRE(ref.outputs.size() == test.outputs.size());
    // Take the text before evaluation: evaluated nodes drop their input edges.
    std::string failure;
    try {
      kiln::set_executor("reference");
      kiln::eval(ref.outputs);
    } catch (const std::exception& e) {
      failure = std::string("reference evaluator threw: ") + e.what();
    }
    if (failure.empty()) {
      try {
        kiln::set_executor(executor);
        kiln::eval(test.outputs);
      } catch (const std::exception& e) {
        failure = std::string(executor) + " threw: " + e.what();
      }
    }
    kiln::set_executor("");
    for (size_t o = 0; failure.empty() && o < ref.outputs.size(); ++o) {
      st.elements += static_cast<int>(ref.outputs[o].numel());
      std::string m = compare(ref.outputs[o], test.outputs[o], ref.output_err[o], exact);
      if (!m.empty()) failure = "output " + std::to_string(o) + ": " + m;
    }
    if (!failure.empty()) {
      ++st.failures;
      if (st.failures <= 3) {
        std::string graph = describe(seed);
        INFO("executor " << executor << ", seed " << seed << "\n" << failure << "\n" << graph);
        CHECK(failure.empty());
      }
    }
  }
  if (std::getenv("KILN_DIFF_VERBOSE")) {
    WARN(executor << ": " << st.graphs << " graphs, " << st.ops << " ops, " << st.outputs
                  << " outputs, " << st.elements << " elements compared, "
                  << st.graphs_with_build_errors << " graphs with a skipped step, " << st.failures
                  << " disagree");
  }
  INFO("executor " << executor << ": " << st.failures << " of " << st.graphs << " graphs disagree");
  CHECK(st.failures == 0);
  return st;
}

/// True when `name` is registered: an evaluation under it does not throw "no executor named".
bool executor_available(const char* name) {
  ExecutorGuard guard;
  kiln::set_executor(name);
  try {
    Tensor t = kiln::add(kiln::from_vector<float>({1, 2}), 1);
    t.eval();
  } catch (const kiln::ValueError& e) {
    if (std::strstr(e.what(), "no executor named")) return false;
    throw;
  }
  return true;
}

// --- the perturbed reference: every rounded float result moved by up to 1 ulp ---

// Nodes whose float result is rounded (arithmetic, transcendental, sums, narrowing casts).
// Exact ops (neg, abs, floor, max, where, reindex, max/min reductions, widening casts,
// sources other than randn) are left alone: every executor must reproduce them bit-exactly.
bool rounds(const kiln::Node& n) {
  using kiln::OpCode;
  if (!kiln::is_floating(n.dtype)) return false;
  switch (n.op) {
    case OpCode::Exp:
    case OpCode::Exp2:
    case OpCode::Log:
    case OpCode::Log2:
    case OpCode::Log1p:
    case OpCode::Expm1:
    case OpCode::Sqrt:
    case OpCode::Rsqrt:
    case OpCode::Reciprocal:
    case OpCode::Sin:
    case OpCode::Cos:
    case OpCode::Tan:
    case OpCode::Tanh:
    case OpCode::Sigmoid:
    case OpCode::Erf:
    case OpCode::Add:
    case OpCode::Sub:
    case OpCode::Mul:
    case OpCode::Div:
    case OpCode::Pow:
    case OpCode::RandNormal:
      return true;
    case OpCode::ReindexReduce:
      return n.reduce == kiln::ReduceOp::Sum || n.reduce == kiln::ReduceOp::Prod;
    case OpCode::Cast: {
      DType from = n.inputs[0]->dtype;
      return kiln::is_floating(from) && kiln::test::detail_graph::unit_roundoff(n.dtype) >
                                            kiln::test::detail_graph::unit_roundoff(from);
    }
    default:
      return false;
  }
}

template <typename Bits>
Bits step_bits(Bits bits, int k, Bits magnitude_mask, Bits max_finite) {
  Bits sign = bits & ~magnitude_mask, mag = bits & magnitude_mask;
  if (mag == 0 || mag > max_finite) return bits;  // zero, inf, NaN stay
  int64_t m = static_cast<int64_t>(mag) + k;
  if (m <= 0 || m > static_cast<int64_t>(max_finite)) return bits;
  return static_cast<Bits>(sign | static_cast<Bits>(m));
}

void perturb(kiln::Node& n, std::mt19937_64& rng) {
  char* p = static_cast<char*>(n.buffer->data());
  // A cast that did not round (the value is representable) is exact in every executor.
  const kiln::Node* cast_src = n.op == kiln::OpCode::Cast ? n.inputs[0].get() : nullptr;
  for (int64_t i = 0; i < n.numel(); ++i) {
    int k = static_cast<int>(rng() % 3) - 1;
    if (cast_src && kiln::detail::load_as_double(cast_src->buffer->data(), cast_src->dtype, i) ==
                        kiln::detail::load_as_double(p, n.dtype, i)) {
      continue;
    }
    switch (n.dtype) {
      case DType::Float64: {
        uint64_t b;
        std::memcpy(&b, p + 8 * i, 8);
        b = step_bits<uint64_t>(b, k, 0x7FFFFFFFFFFFFFFFull, 0x7FEFFFFFFFFFFFFFull);
        std::memcpy(p + 8 * i, &b, 8);
        break;
      }
      case DType::Float32: {
        uint32_t b;
        std::memcpy(&b, p + 4 * i, 4);
        b = step_bits<uint32_t>(b, k, 0x7FFFFFFFu, 0x7F7FFFFFu);
        std::memcpy(p + 4 * i, &b, 4);
        break;
      }
      case DType::Float16:
      case DType::BFloat16: {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        b = step_bits<uint16_t>(b, k, 0x7FFF, n.dtype == DType::Float16 ? 0x7BFF : 0x7F7F);
        std::memcpy(p + 2 * i, &b, 2);
        break;
      }
      default:
        return;
    }
  }
}

// Runs the reference one node at a time, keeping every value, and perturbs rounded results.
void perturbed_execute(const std::vector<kiln::Node*>& schedule,
                       const std::vector<kiln::Node*>& requested) {
  std::vector<kiln::Node*> keep = requested;
  for (kiln::Node* n : schedule) {
    keep.push_back(n);
    for (const kiln::NodePtr& in : n->inputs) keep.push_back(in.get());
  }
  std::mt19937_64 rng(schedule.size());
  for (kiln::Node* n : schedule) {
    kiln::reference_execute({n}, keep);
    if (rounds(*n)) perturb(*n, rng);
  }
}

const bool kPerturbedRegistered = [] {
  kiln::register_executor("differential-perturbed", -1000, &perturbed_execute);
  return true;
}();

}  // namespace

TEST_CASE("differential: the generator is deterministic, valid and covers the op families",
          "[differential]") {
  ExecutorGuard guard;
  kiln::set_executor("reference");
  const int n = 300;
  int clean = 0, ops = 0, rejected = 0;
  int64_t max_numel = 0;
  std::map<std::string, int> seen;
  std::vector<std::string> errors;
  for (int s = 0; s < n; ++s) {
    RandomGraph a = build_random_graph(static_cast<uint64_t>(s));
    RandomGraph b = build_random_graph(static_cast<uint64_t>(s));
    REQUIRE(a.log == b.log);
    CHECK(a.ops >= 3);
    CHECK(a.ops <= 25);
    if (a.build_errors == 0)
      ++clean;
    else
      errors.insert(errors.end(), a.error_messages.begin(), a.error_messages.end());
    ops += a.ops;
    rejected += a.rejected;
    for (const Tensor& t : a.outputs) max_numel = std::max(max_numel, t.numel());
    for (const std::string& line : a.log) {
      size_t eq = line.find(" = ");
      if (eq == std::string::npos) continue;
      size_t end = line.find_first_of("( ", eq + 3);
      seen[line.substr(eq + 3, end - eq - 3)]++;
    }
  }
  std::string errs;
  for (size_t i = 0; i < std::min<size_t>(errors.size(), 10); ++i) errs += errors[i] + "\n";
  INFO(clean << " of " << n << " graphs built without a kiln::Error; first errors:\n" << errs);
  CHECK(clean >= n * 95 / 100);
  CHECK(max_numel <= 2000);
  std::string coverage;
  for (const auto& [k, v] : seen) coverage += k + ":" + std::to_string(v) + " ";
  INFO("coverage: " << coverage);
  for (const char* family : {"input",        "add",         "mul",
                             "div",          "exp",         "log",
                             "sqrt",         "cast",        "permute",
                             "transpose",    "slice",       "flip",
                             "pad",          "reshape",     "broadcast_to",
                             "concat/stack", "gather",      "index_select",
                             "sum",          "mean",        "prod",
                             "max",          "min",         "argmax/argmin",
                             "softmax",      "log_softmax", "logsumexp",
                             "var",          "matmul",      "where",
                             "clamp",        "reindex",     "reindex_reduce",
                             "floor_div",    "mod",         "any/all"}) {
    INFO("family " << family);
    CHECK(seen[family] > 0);
  }
  if (std::getenv("KILN_DIFF_VERBOSE")) {
    WARN("generator: " << n << " graphs, " << ops << " ops, " << clean << " without build errors, "
                       << rejected << " results rejected as too large\ncoverage: " << coverage);
  }
}

TEST_CASE("differential: reference vs reference on 200 graphs (deterministic, bit-exact)",
          "[differential]") {
  RunStats st = run_differential("reference", 1, 200, /*exact=*/true);
  CHECK(st.graphs >= 200);
  CHECK(st.graphs_with_build_errors * 20 <= st.graphs);
}

TEST_CASE(
    "differential: reference vs a 1-ulp-perturbed reference on 1,000 graphs (tolerance model)",
    "[differential]") {
  RunStats st = run_differential("differential-perturbed", 100000, 1000, /*exact=*/false);
  CHECK(st.graphs >= 1000);
}

namespace {

std::string self_exe() {
  std::array<char, 4096> buf{};
  ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string();
}

// Runs this binary's "[differential][jit]" test with KILN_CPU_COMPILER=`compiler`.
int run_child(const std::string& compiler, std::string& output) {
  std::string cmd = "KILN_CPU_COMPILER=" + compiler + " KILN_DIFF_CHILD=1 '" + self_exe() +
                    "' '[differential][jit]' 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return -1;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) output.append(buf.data(), n);
  int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The parent runs one child per compiler (the compiler is chosen once per process); the
// two compilers are separate test cases so that CTest runs them side by side.
void run_jit_differential(const std::string& compiler) {
  if (!executor_available("jit")) {
    WARN("jit executor not built; skipping the jit differential test");
    return;
  }
  if (std::getenv("KILN_DIFF_CHILD") != nullptr) {
    const char* selected = std::getenv("KILN_CPU_COMPILER");
    if (selected == nullptr || compiler != selected) return;  // the other compiler's case
    int count = 1000;
    if (const char* g = std::getenv("KILN_DIFF_GRAPHS")) count = std::max(1, std::atoi(g));
    INFO("KILN_CPU_COMPILER=" << compiler);
    RunStats st = run_differential("jit", 1000000, count, /*exact=*/false);
    CHECK(st.graphs >= count);
    return;
  }
  if (const char* list = std::getenv("KILN_DIFF_COMPILERS")) {
    if (std::string(",").append(list).append(",").find("," + compiler + ",") == std::string::npos)
      return;
  }
  if (compiler == "llvm" && !kiln::jit::have_llvm()) {
    WARN("kiln built without LLVM: no llvm differential run");
    return;
  }
  std::string out;
  int rc = run_child(compiler, out);
  INFO("KILN_CPU_COMPILER=" << compiler << " child exit " << rc << ", output tail:\n"
                            << out.substr(out.size() > 6000 ? out.size() - 6000 : 0));
  CHECK(rc == 0);
}

}  // namespace

TEST_CASE("differential: jit (llvm) vs reference on 1,000 graphs", "[differential][jit][llvm]") {
  run_jit_differential("llvm");
}

// Three-bit plan signatures: nearly every graph finds some other graph's cached plan, and
// the exact check behind each hit (jit/executor.cpp, "replay") must turn all of them away.
// The corpus runs twice, so a graph may also find its own plan (a true hit) and replay it.
TEST_CASE("differential: jit with colliding plan signatures vs reference on 200 graphs",
          "[differential][jit][replay]") {
  kiln::jit::set_plan_signature_bits_for_testing(3);
  const kiln::jit::ReplayStats before = kiln::jit::replay_stats();
  RunStats first = run_differential("jit", 7000, 200, /*exact=*/false);
  RunStats again = run_differential("jit", 7000, 200, /*exact=*/false);
  kiln::jit::set_plan_signature_bits_for_testing(64);
  const kiln::jit::ReplayStats after = kiln::jit::replay_stats();
  CHECK(first.failures == 0);
  CHECK(again.failures == 0);
  INFO("collisions " << after.collisions - before.collisions << ", hits "
                     << after.hits - before.hits);
  CHECK(after.collisions - before.collisions >= 100);
}

TEST_CASE("differential: jit (external compiler) vs reference on 1,000 graphs",
          "[differential][jit][external]") {
  run_jit_differential("external");
}

// 100 graphs (about 700 distinct kernels): NVRTC takes ~0.15 s a kernel, and the GPU check
// runs in one call of a few minutes; KILN_DIFF_SCALE=10 runs the whole corpus.
TEST_CASE("differential: jit on cuda:0 vs reference on the cpu, 100 graphs",
          "[differential][jit][cuda]") {
  if (kiln::cuda::device_count() == 0) {
    WARN("SKIPPED: no CUDA device (" << kiln::cuda::driver_status() << ")");
    return;
  }
  run_differential("jit", 0, 100, false, kiln::Device::cuda(0));
}

TEST_CASE(
    "differential: an out-of-range gather raises IndexError under every executor and leaves it "
    "usable",
    "[differential][errors]") {
  ExecutorGuard guard;
  std::vector<const char*> executors = {"reference", "differential-perturbed"};
  if (executor_available("jit"))
    executors.push_back("jit");
  else
    WARN("jit executor not built; checking the reference only");
  for (const char* ex : executors) {
    INFO("executor " << ex);
    kiln::set_executor(ex);
    for (int variant = 0; variant < 4; ++variant) {
      INFO("variant " << variant);
      Tensor x = kiln::exp(kiln::from_vector<float>({0.5f, 1.f, 1.5f, 2.f, 2.5f, 3.f}, {2, 3}));
      Tensor bad;
      switch (variant) {
        case 0:
          bad = kiln::gather(x, 1, kiln::from_vector<int64_t>({0, 3, 1, 2}, {2, 2}));
          break;
        case 1:
          bad = kiln::gather(x, 0, kiln::from_vector<int32_t>({-1, 0, 1}, {1, 3}));
          break;
        case 2:
          bad = kiln::index_select(x, 1, kiln::from_vector<int64_t>({2, 7}));
          break;
        default: {
          // The bad index is computed inside the graph and the gather feeds a reduction.
          Tensor idx = kiln::add(kiln::from_vector<int64_t>({0, 1, 2, 0}, {2, 2}), 2);
          bad = kiln::sum(kiln::mul(kiln::gather(x, 1, idx), 2.0f), 1);
        }
      }
      Tensor good = kiln::sum(kiln::mul(x, 2.0f));
      CHECK_THROWS_AS(bad.eval(), kiln::IndexError);
      // The executor stays usable: the same inputs and a fresh graph still evaluate.
      CHECK(good.item<float>() == Approx(2 * (std::exp(0.5) + std::exp(1.0) + std::exp(1.5) +
                                              std::exp(2.0) + std::exp(2.5) + std::exp(3.0)))
                                      .epsilon(1e-5));
      RandomGraph g = build_random_graph(42 + static_cast<uint64_t>(variant));
      CHECK_NOTHROW(kiln::eval(g.outputs));
    }
  }
}

// Reproduces one seed: KILN_DIFF_SEED=N [KILN_DIFF_EXECUTOR=jit] kiln_tests "[differential-repro]"
// prints the graph and compares it under the executor (hidden: not part of the default run).
TEST_CASE("differential: reproduce one seed", "[.][differential-repro]") {
  const char* seed_text = std::getenv("KILN_DIFF_SEED");
  const char* ex = std::getenv("KILN_DIFF_EXECUTOR");
  if (!seed_text) {
    WARN("set KILN_DIFF_SEED (and optionally KILN_DIFF_EXECUTOR, default jit)");
    return;
  }
  uint64_t seed = std::strtoull(seed_text, nullptr, 10);
  std::fprintf(stderr, "%s\n", describe(seed).c_str());
  run_differential(ex ? ex : "jit", seed, 1, /*exact=*/false);
}
