// Invalid inputs to elementwise ops, sources, reindex and core: each raises the right
// exception type when the op is built (or, for data-dependent indices, when it runs), and
// the message names the op in brackets and the offending shapes/dtypes. Shape ops,
// reductions and linalg have their own [errors] tests next to them.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/settings.h"
#include "frontend/kiln.h"
#include "memory/pools/host_pool.h"

using kiln::DType;
using kiln::IndexExpr;
using kiln::Shape;
using kiln::Tensor;

namespace {

// Runs `fn`, expecting a kiln::Error whose message contains every one of `parts`.
template <typename Fn>
void check_message(Fn&& fn, std::initializer_list<const char*> parts) {
  try {
    fn();
    FAIL_CHECK("no exception was thrown");
  } catch (const kiln::Error& e) {
    std::string msg = e.what();
    INFO("message: " << msg);
    for (const char* p : parts) {
      INFO("expected to contain: " << p);
      CHECK(msg.find(p) != std::string::npos);
    }
  }
}

}  // namespace

// Asserts the exception type, then the message contents.
#define CHECK_KILN_ERROR(expr, Type, ...)                \
  do {                                                   \
    CHECK_THROWS_AS(expr, Type);                         \
    check_message([&] { (void)(expr); }, {__VA_ARGS__}); \
  } while (0)

namespace {
Tensor f32(const Shape& s) { return kiln::full(s, 1.5f); }
Tensor i32(const Shape& s) { return kiln::full(s, 3, DType::Int32); }
Tensor boolean(const Shape& s) { return kiln::full(s, true, DType::Bool); }
size_t pool_allocated() { return kiln::memory::host_pool().stats().allocated; }
}  // namespace

TEST_CASE("errors: broadcasting mismatches name the op and both shapes", "[errors]") {
  CHECK_KILN_ERROR(kiln::add(f32({2, 3}), f32({4})), kiln::ShapeError, "[add]", "[2, 3]", "[4]");
  CHECK_KILN_ERROR(f32({3, 1, 2}) * f32({4, 3}), kiln::ShapeError, "[mul]", "[3, 1, 2]", "[4, 3]");
  CHECK_KILN_ERROR(f32({2}) < i32({3}), kiln::ShapeError, "[lt]", "[2]", "[3]");
  CHECK_KILN_ERROR(kiln::where(boolean({2, 3}), f32({3}), f32({4})), kiln::ShapeError, "[where]",
                   "[4]");
  CHECK_KILN_ERROR(kiln::clamp(f32({5}), f32({2}), Tensor()), kiln::ShapeError, "[clamp]", "[5]",
                   "[2]");
  CHECK_KILN_ERROR(f32({0, 3}) + f32({2, 3}), kiln::ShapeError, "[add]", "[0, 3]", "[2, 3]");
}

TEST_CASE("errors: dtypes an op does not accept", "[errors]") {
  SECTION("where needs a bool condition") {
    CHECK_KILN_ERROR(kiln::where(f32({2, 3}), f32({2, 3}), f32({2, 3})), kiln::DTypeError,
                     "[where]", "bool", "float32[2, 3]");
    CHECK_KILN_ERROR(kiln::where(i32({2}), 1.0, 0.0), kiln::DTypeError, "[where]", "int32[2]");
  }
  SECTION("bitwise ops need integers or bool") {
    CHECK_KILN_ERROR(kiln::bitwise_and(f32({2, 3}), f32({2, 3})), kiln::DTypeError, "[bitwise_and]",
                     "float32[2, 3]");
    CHECK_KILN_ERROR(i32({4}) | 1.5, kiln::DTypeError, "[bitwise_or]", "int32[4]");
    CHECK_KILN_ERROR(kiln::bitwise_xor(kiln::full({2}, 1.0, DType::Float64), i32({2})),
                     kiln::DTypeError, "[bitwise_xor]", "float64[2]");
    CHECK_KILN_ERROR(kiln::bitwise_not(f32({3})), kiln::DTypeError, "[bitwise_not]", "float32[3]");
    CHECK_KILN_ERROR(~kiln::full({1}, 1.0, DType::Float16), kiln::DTypeError, "[bitwise_not]",
                     "float16[1]");
  }
  SECTION("arithmetic that is undefined on bool") {
    CHECK_KILN_ERROR(kiln::sub(boolean({2}), boolean({2})), kiln::DTypeError, "[sub]", "bool[2]");
    CHECK_KILN_ERROR(-boolean({3}), kiln::DTypeError, "[neg]", "bool[3]");
    CHECK_KILN_ERROR(kiln::floor_div(boolean({2}), boolean({2})), kiln::DTypeError, "[floor_div]",
                     "bool[2]");
    CHECK_KILN_ERROR(boolean({2}) % boolean({2}), kiln::DTypeError, "[mod]", "bool[2]");
    CHECK_KILN_ERROR(kiln::pow(boolean({2}), true), kiln::DTypeError, "[pow]", "bool[2]");
    CHECK_KILN_ERROR(kiln::floor(boolean({2})), kiln::DTypeError, "[floor]", "bool[2]");
    CHECK_KILN_ERROR(kiln::round(boolean({1, 2})), kiln::DTypeError, "[round]", "bool[1, 2]");
  }
}

TEST_CASE("errors: elementwise() checks the number of operands", "[errors]") {
  // A binary op given one operand (or three) must not build a node that reads zeros.
  CHECK_THROWS_AS(kiln::elementwise(kiln::OpCode::Add, {f32({2})}), kiln::ValueError);
  CHECK_THROWS_AS(kiln::elementwise(kiln::OpCode::Add, {f32({2}), f32({2}), f32({2})}),
                  kiln::ValueError);
  CHECK_THROWS_AS(kiln::elementwise(kiln::OpCode::Where, {boolean({2}), f32({2})}),
                  kiln::ValueError);
  // Not an elementwise op at all.
  CHECK_KILN_ERROR(kiln::elementwise(kiln::OpCode::Reindex, {f32({2})}), kiln::ValueError,
                   "[elementwise]", "reindex");
}

TEST_CASE("errors: broadcast_to a smaller rank or an incompatible shape", "[errors]") {
  CHECK_KILN_ERROR(kiln::broadcast_to(f32({2, 3}), {3}), kiln::ShapeError, "[broadcast_to]",
                   "[2, 3]", "[3]");
  CHECK_KILN_ERROR(kiln::broadcast_to(f32({2, 3}), {2, 4}), kiln::ShapeError, "[broadcast_to]",
                   "[2, 3]", "[2, 4]");
  CHECK_KILN_ERROR(kiln::broadcast_to(f32({3, 1}), {5, 2, 2}), kiln::ShapeError, "[broadcast_to]",
                   "[3, 1]", "[5, 2, 2]");
}

TEST_CASE("errors: malformed reindex and reindex_reduce maps", "[errors]") {
  Tensor x = f32({2, 3});
  IndexExpr i0 = IndexExpr::var(0), i1 = IndexExpr::var(1);
  SECTION("reindex: one expression per input dimension") {
    CHECK_KILN_ERROR(kiln::reindex(x, {2, 3}, {i0}), kiln::ShapeError, "[reindex]", "[2, 3]",
                     "1 expressions");
    CHECK_KILN_ERROR(kiln::reindex(x, {2, 3}, {i0, i1, i0}), kiln::ShapeError, "[reindex]",
                     "[2, 3]");
  }
  SECTION("reindex: a coordinate beyond the loop domain") {
    CHECK_KILN_ERROR(kiln::reindex(x, {2, 3}, {i0, IndexExpr::var(5)}), kiln::ValueError,
                     "[reindex]", "i5", "rank 2");
    CHECK_KILN_ERROR(kiln::reindex(x, {6}, {i0, i1 + IndexExpr::constant(1)}), kiln::ValueError,
                     "[reindex]", "i1", "rank 1");
  }
  SECTION("reindex: index tensors must be integers, exist, and match the read's rank") {
    auto read = [](std::vector<IndexExpr> at) { return IndexExpr::load(1, std::move(at)); };
    Tensor fidx = f32({4});
    CHECK_KILN_ERROR(kiln::reindex(x, {4}, {IndexExpr::constant(0), read({i0})}, 0, {fidx}),
                     kiln::DTypeError, "[reindex]", "float32[4]");
    CHECK_KILN_ERROR(kiln::reindex(x, {4}, {IndexExpr::constant(0), read({i0})}, 0, {boolean({4})}),
                     kiln::DTypeError, "[reindex]", "bool[4]");
    CHECK_KILN_ERROR(
        kiln::reindex(x, {4}, {IndexExpr::constant(0), IndexExpr::load(2, {i0})}, 0, {i32({4})}),
        kiln::ValueError, "[reindex]", "idx2", "1 index tensor");
    CHECK_KILN_ERROR(kiln::reindex(x, {4}, {IndexExpr::constant(0), read({i0, i0})}, 0, {i32({4})}),
                     kiln::ShapeError, "[reindex]", "idx1", "[4]");
    CHECK_KILN_ERROR(kiln::reindex(x, {4}, {IndexExpr::constant(0), read({i0})}, 0, {Tensor()}),
                     kiln::ValueError, "[reindex]", "undefined");
  }
  SECTION("reindex: negative output size") {
    CHECK_KILN_ERROR(kiln::reindex(x, {2, -3}, {i0, i1}), kiln::ValueError, "[reindex]", "[2, -3]");
  }
  SECTION("reindex_reduce: and/or need bool, map length and rank") {
    CHECK_KILN_ERROR(kiln::reindex_reduce(x, kiln::ReduceOp::And, {2}, {i0}), kiln::DTypeError,
                     "[reindex_reduce]", "and", "float32");
    CHECK_KILN_ERROR(kiln::reindex_reduce(i32({2, 3}), kiln::ReduceOp::Or, {2}, {i0}),
                     kiln::DTypeError, "[reindex_reduce]", "or", "int32");
    CHECK_KILN_ERROR(kiln::reindex_reduce(x, kiln::ReduceOp::Sum, {2, 1}, {i0}), kiln::ShapeError,
                     "[reindex_reduce]", "[2, 1]");
    CHECK_KILN_ERROR(kiln::reindex_reduce(x, kiln::ReduceOp::Max, {2}, {IndexExpr::var(3)}),
                     kiln::ValueError, "[reindex_reduce]", "i3", "rank 2");
    CHECK_KILN_ERROR(kiln::reindex_reduce(x, kiln::ReduceOp::Sum, {-1}, {i0}), kiln::ValueError,
                     "[reindex_reduce]", "[-1]");
  }
  SECTION("an origin names the user-level op") {
    CHECK_KILN_ERROR(kiln::reindex(x, {2}, {i0}, 0, {}, false, "gather"), kiln::ShapeError,
                     "[gather]", "[2, 3]");
  }
}

TEST_CASE("errors: bad arguments to sources", "[errors]") {
  SECTION("negative sizes") {
    // zeros/ones are fills: the message may name either, but must show the shape.
    check_message([] { (void)kiln::zeros({-1}); }, {"[-1]", "negative"});
    CHECK_THROWS_AS(kiln::zeros({-1}), kiln::ValueError);
    CHECK_KILN_ERROR(kiln::full({2, -3}, 1.0), kiln::ValueError, "[full]", "[2, -3]");
    CHECK_THROWS_AS(kiln::ones({4, -1}, DType::Int32), kiln::ValueError);
    CHECK_KILN_ERROR(kiln::index({3, -2}, 0), kiln::ValueError, "[index]", "[3, -2]");
    CHECK_KILN_ERROR(kiln::rand({-5}), kiln::ValueError, "[rand]", "[-5]");
  }
  SECTION("arange") {
    CHECK_KILN_ERROR(kiln::arange(0, 10, 0), kiln::ValueError, "[arange]", "step", "0");
    CHECK_KILN_ERROR(kiln::arange(0.0, 1.0, 0.0), kiln::ValueError, "[arange]", "step");
    CHECK_KILN_ERROR(kiln::arange(0.0, INFINITY), kiln::ValueError, "[arange]", "inf");
  }
  SECTION("index axis out of range") {
    CHECK_KILN_ERROR(kiln::index({2, 3}, 2), kiln::ShapeError, "[index]", "axis 2", "[2, 3]");
    CHECK_KILN_ERROR(kiln::index({2, 3}, -3), kiln::ShapeError, "[index]", "axis -3");
    CHECK_KILN_ERROR(kiln::index({}, 0), kiln::ShapeError, "[index]", "[]");
  }
  SECTION("random sources") {
    CHECK_KILN_ERROR(kiln::rand({2}, DType::Int32), kiln::DTypeError, "[rand]", "int32");
    CHECK_KILN_ERROR(kiln::randn({2}, DType::Bool), kiln::DTypeError, "[randn]", "bool");
    CHECK_KILN_ERROR(kiln::randint(5, 5, {2}), kiln::ValueError, "[randint]", "low=5", "high=5");
    CHECK_KILN_ERROR(kiln::randint(3, -1, {2}), kiln::ValueError, "[randint]", "low=3", "high=-1");
    CHECK_KILN_ERROR(kiln::bernoulli({2}, 1.5), kiln::ValueError, "[bernoulli]", "1.5");
    CHECK_KILN_ERROR(kiln::bernoulli({2}, -0.25), kiln::ValueError, "[bernoulli]", "-0.25");
    CHECK_KILN_ERROR(kiln::bernoulli({2}, NAN), kiln::ValueError, "[bernoulli]", "nan");
  }
  SECTION("a device that is not available") {
    CHECK_KILN_ERROR(kiln::zeros({2}, DType::Float32, kiln::Device::cuda(0)), kiln::DeviceError,
                     "cuda:0", "Device::cpu()");
    CHECK_KILN_ERROR(kiln::full({2}, 1, DType::Int32, kiln::Device::cuda(1)), kiln::DeviceError,
                     "[full]", "cuda:1");
  }
}

TEST_CASE("errors: from_vector checks the value count against the shape", "[errors]") {
  std::vector<float> three = {1, 2, 3};
  three.reserve(64);  // keeps the test memory-safe if the check is missing
  CHECK_THROWS_AS(kiln::from_vector<float>(three, {2, 2}), kiln::Error);
  std::vector<int32_t> five = {1, 2, 3, 4, 5};
  CHECK_THROWS_AS(kiln::from_vector<int32_t>(five, {2, 2}), kiln::Error);
}

TEST_CASE("errors: operands on different devices", "[errors]") {
  // Nodes holding data on cuda:0 are made by hand, so the checks are reached without a GPU.
  // The cpu operands hold data too: pending fills have none and would simply be built on
  // the other operand's device.
  auto on_gpu = [](DType dtype) {
    return Tensor(std::make_shared<kiln::Node>(kiln::OpCode::Constant, std::vector<kiln::NodePtr>{},
                                               Shape{2}, dtype, kiln::Device::cuda(0)));
  };
  Tensor cpu = kiln::from_vector<float>({1.5f, 2.5f});
  CHECK_KILN_ERROR(cpu + on_gpu(DType::Float32), kiln::DeviceError, "[add]", "cpu", "cuda:0");
  Tensor mask = kiln::from_vector<bool>({true, false});
  CHECK_KILN_ERROR(kiln::where(mask, on_gpu(DType::Float32), cpu), kiln::DeviceError, "[where]",
                   "cuda:0");
  CHECK_KILN_ERROR(
      kiln::reindex(kiln::from_vector<float>({1, 2, 3, 4}), {2},
                    {IndexExpr::load(1, {IndexExpr::var(0)})}, 0, {on_gpu(DType::Int64)}),
      kiln::DeviceError, "[reindex]", "cuda:0", "cpu");
}

TEST_CASE("errors: reading values the wrong way", "[errors]") {
  CHECK_KILN_ERROR(f32({2, 3}).item<float>(), kiln::ValueError, "[item]", "[2, 3]");
  CHECK_KILN_ERROR(f32({0}).item<float>(), kiln::ValueError, "[item]", "[0]");
  Tensor ints = kiln::from_vector<int32_t>({1, 2});
  CHECK_KILN_ERROR(ints.data<float>(), kiln::DTypeError, "[data]", "float32", "int32");
  CHECK_KILN_ERROR(f32({2}).data<kiln::Half>(), kiln::DTypeError, "[data]", "float16", "float32");
  CHECK_KILN_ERROR(f32({2, 3}).size(2), kiln::ShapeError, "[size]", "axis 2", "[2, 3]");
  CHECK_KILN_ERROR(kiln::tensor(1.0f).size(0), kiln::ShapeError, "[size]");
}

TEST_CASE("errors: undefined tensors", "[errors]") {
  Tensor u;
  CHECK_FALSE(u.defined());
  CHECK_KILN_ERROR(kiln::add(u, f32({2})), kiln::ValueError, "[add]", "undefined");
  CHECK_KILN_ERROR(u * 2.0f, kiln::ValueError, "[mul]", "undefined");
  CHECK_KILN_ERROR(kiln::exp(u), kiln::ValueError, "[exp]", "undefined");
  CHECK_KILN_ERROR(kiln::where(boolean({2}), u, 0.0), kiln::ValueError, "[where]", "undefined");
  CHECK_KILN_ERROR(kiln::cast(u, DType::Int32), kiln::ValueError, "[cast]", "undefined");
  CHECK_KILN_ERROR(kiln::reindex(u, {2}, {IndexExpr::var(0)}), kiln::ValueError, "[reindex]",
                   "undefined");
  CHECK_KILN_ERROR(u.eval(), kiln::ValueError, "[eval]", "undefined");
  CHECK_KILN_ERROR(kiln::eval({f32({1}), u}), kiln::ValueError, "[eval]", "undefined");
  CHECK_KILN_ERROR(u.item<float>(), kiln::ValueError, "[item]", "undefined");
  CHECK_KILN_ERROR(u.shape(), kiln::ValueError, "undefined");
  CHECK_KILN_ERROR(u.to_vector<float>(), kiln::ValueError, "undefined");
}

TEST_CASE("errors: undefined tensors are reported by the op that received them", "[errors]") {
  // Ops that look at the input's dtype/shape before validating it report "[dtype]" or
  // "[shape]" instead of their own name.
  Tensor u;
  CHECK_KILN_ERROR(kiln::isnan(u), kiln::ValueError, "[isnan]", "undefined");
  CHECK_KILN_ERROR(kiln::relu(u), kiln::ValueError, "[relu]", "undefined");
  CHECK_KILN_ERROR(kiln::broadcast_to(u, {2}), kiln::ValueError, "[broadcast_to]", "undefined");
  CHECK_THROWS_AS(kiln::zeros_like(u), kiln::ValueError);
}

TEST_CASE("errors: an out-of-range gathered index raises IndexError at evaluation, without leaks",
          "[errors]") {
  std::vector<float> xv = {1.5f, -2.0f, 3.25f, 4.0f};
  Tensor x = kiln::from_vector<float>(xv);
  Tensor bad_idx = kiln::from_vector<int64_t>({0, 2, 7});
  Tensor neg_idx = kiln::from_vector<int64_t>({-1, 0, 1});
  std::vector<IndexExpr> gather = {IndexExpr::load(1, {IndexExpr::var(0)})};
  size_t before = pool_allocated();
  int64_t live_before = kiln::Node::live_count();
  {
    Tensor doubled = x * 2.0f;  // an intermediate that does get computed before the failure
    Tensor g = kiln::reindex(doubled + 1.0f, {3}, gather, 0, {bad_idx}, true);
    CHECK(g.shape() == Shape{3});  // building succeeds: the index values are data
    CHECK_KILN_ERROR(g.eval(), kiln::IndexError, "[reindex]", "7", "size 4", "[4]");
    CHECK_FALSE(g.is_evaluated());
    CHECK_THROWS_AS(g.eval(), kiln::IndexError);  // still raises, never garbage
    Tensor h = kiln::reindex(x, {3}, gather, 0, {neg_idx}, true, "gather");
    CHECK_KILN_ERROR(h.to_vector<float>(), kiln::IndexError, "[gather]", "-1");
  }
  CHECK(pool_allocated() == before);
  CHECK(kiln::Node::live_count() == live_before);
  SECTION("the graph stays usable") {
    Tensor ok =
        kiln::reindex(x * 2.0f, {3}, gather, 0, {kiln::from_vector<int64_t>({3, 1, 0})}, true);
    CHECK(ok.to_vector<float>() == std::vector<float>{8.0f, -4.0f, 3.0f});
    // Without check_indices an out-of-range read gives the fill.
    Tensor filled = kiln::reindex(x, {3}, gather, -9.5, {bad_idx});
    CHECK(filled.to_vector<float>() == std::vector<float>{1.5f, 3.25f, -9.5f});
  }
  SECTION("scatter with reindex_reduce checks its targets the same way") {
    Tensor src = kiln::from_vector<float>({1, 2, 3});
    Tensor s = kiln::reindex_reduce(src, kiln::ReduceOp::Sum, {4}, gather, {bad_idx}, true);
    CHECK_KILN_ERROR(s.eval(), kiln::IndexError, "[reindex_reduce]", "7", "size 4");
    Tensor good = kiln::reindex_reduce(src, kiln::ReduceOp::Sum, {4}, gather,
                                       {kiln::from_vector<int64_t>({3, 3, 0})}, true);
    CHECK(good.to_vector<float>() == std::vector<float>{3, 0, 0, 3});
  }
}

TEST_CASE("errors: an unknown executor is reported at evaluation", "[errors]") {
  std::string saved = kiln::current_executor();
  kiln::set_executor("no_such_executor");
  Tensor y = f32({2}) + 1.0f;
  check_message([&] { y.eval(); }, {"[eval]", "no_such_executor", "reference"});
  CHECK_THROWS_AS(y.eval(), kiln::ValueError);
  kiln::set_executor(saved.c_str());
  CHECK(y.to_vector<float>() == std::vector<float>{2.5f, 2.5f});
}

// Body of the child process of the next test; does nothing unless run by it. The variable
// under test is set in the child's environment before kiln reads it, and every call that
// needs it must raise the same ValueError (never std::terminate, never only the first time).
TEST_CASE("errors: environment child: a bad variable raises from every call that needs it",
          "[.][errors_env_child]") {
  const char* which = std::getenv("KILN_ERRORS_ENV_CHILD");
  if (!which) return;
  const std::string var = which;
  auto needs_it = [&] {
    if (var == "KILN_SEED") return (void)kiln::randn({2});
    (void)(kiln::full({3}, 1.5f) + 1.0f).to_vector<float>();  // threads, budget, cache
  };
  for (int attempt = 0; attempt < 3; ++attempt) {
    INFO("attempt " << attempt);
    CHECK_KILN_ERROR(needs_it(), kiln::ValueError, ("[" + var + "]").c_str(), "is not accepted",
                     "expected");
  }
}

TEST_CASE(
    "errors: bad KILN_NUM_THREADS, KILN_SEED, KILN_MEMORY_BUDGET, KILN_CACHE_MAX_MB are typed "
    "errors",
    "[errors]") {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"KILN_NUM_THREADS", "lots"},   {"KILN_NUM_THREADS", "0"},
      {"KILN_NUM_THREADS", "99999"},  {"KILN_SEED", "-1"},
      {"KILN_SEED", "12abc"},         {"KILN_SEED", "99999999999999999999"},
      {"KILN_MEMORY_BUDGET", "lots"}, {"KILN_MEMORY_BUDGET", "1.5"},
      {"KILN_MEMORY_BUDGET", "0.5"},  {"KILN_CACHE_MAX_MB", "lots"},
      {"KILN_CACHE_MAX_MB", "-5"}};
  for (const auto& [var, value] : cases) {
    INFO(var << "='" << value << "'");
    const std::string command = var + "='" + value + "' KILN_ERRORS_ENV_CHILD=" + var + " '" +
                                self + "' '[errors_env_child]' >/dev/null 2>&1";
    CHECK(std::system(command.c_str()) == 0);
  }
}

TEST_CASE("errors: every KILN_ variable kiln reads is registered once", "[errors]") {
  std::set<std::string> names;
  for (const kiln::settings::Variable& v : kiln::settings::variables()) {
    INFO(v.name);
    CHECK(std::string(v.name).rfind("KILN_", 0) == 0);
    CHECK(names.insert(v.name).second);
    CHECK(std::string(v.accepted).size() > 0);
  }
  CHECK(names.count("KILN_NUM_THREADS") == 1);
  CHECK(names.count("KILN_SEED") == 1);
  CHECK(names.count("KILN_MEMORY_BUDGET") == 1);
  CHECK_THROWS_AS(kiln::settings::variable("KILN_NOT_A_VARIABLE"), kiln::ValueError);
}

TEST_CASE("errors: shapes whose size overflows int64 are rejected when built", "[errors]") {
  const int64_t big = int64_t{1} << 32;
  CHECK_KILN_ERROR(kiln::ones({big, big}), kiln::ValueError, "[full]", "[4294967296, 4294967296]",
                   "int64");
  CHECK_KILN_ERROR(kiln::zeros({3037000500, 3037000500}), kiln::ValueError, "[full]", "int64");
  // The element count fits, the byte count does not.
  CHECK_KILN_ERROR(kiln::zeros({int64_t{1} << 62}, DType::Int32), kiln::ValueError, "[full]",
                   "bytes");
  // A zero size makes any shape empty, like numpy.
  CHECK(kiln::zeros({big, big, 0}).numel() == 0);
  CHECK_KILN_ERROR(kiln::zeros({big, 1}) + kiln::zeros({1, big}), kiln::ValueError, "[add]",
                   "int64");
  CHECK_KILN_ERROR(kiln::broadcast_to(kiln::zeros({1, 1}), {big, big}), kiln::ValueError,
                   "[broadcast_to]", "int64");
  CHECK_KILN_ERROR(kiln::matmul(kiln::zeros({big, 2}), kiln::zeros({2, big})), kiln::ValueError,
                   "[matmul]");
  const Tensor half = kiln::zeros({INT64_MAX / 2 + 1}, DType::Bool);
  CHECK_KILN_ERROR(kiln::concat({half, half}), kiln::Error, "[concat]");
  CHECK_KILN_ERROR(kiln::reshape(kiln::zeros({4}), {big, big}), kiln::ValueError, "[reshape]",
                   "int64");
  CHECK_KILN_ERROR(kiln::cast(kiln::zeros({int64_t{1} << 61}, DType::Bool), DType::Float64),
                   kiln::ValueError, "[cast]", "bytes");
  // A shape that fits still works.
  CHECK(kiln::zeros({big, 0}).shape() == Shape{big, 0});
}

TEST_CASE("errors: from_data, arange and an empty optimizer name the value", "[errors]") {
  CHECK_KILN_ERROR(kiln::from_data(nullptr, {2, 3}, DType::Float32), kiln::ValueError,
                   "[from_data]", "null", "float32[2, 3]", "24");
  CHECK(kiln::from_data(nullptr, {0, 3}, DType::Float32).numel() == 0);
  CHECK_KILN_ERROR(kiln::arange(0, 1e30), kiln::ValueError, "[arange]", "1e+30");
  CHECK_KILN_ERROR(kiln::arange(INT64_MIN, INT64_MAX, 1), kiln::ValueError, "[arange]");
  CHECK_KILN_ERROR(kiln::optim::SGD(std::vector<Tensor>{}, {}), kiln::ValueError, "[SGD]",
                   "empty parameter list");
  CHECK_KILN_ERROR(kiln::optim::AdamW(std::vector<Tensor>{}, {}), kiln::ValueError, "[AdamW]",
                   "empty parameter list");
}

TEST_CASE("errors: composite ops name themselves, not their inner ops", "[errors]") {
  Tensor logits = kiln::full({2, 3}, 0.5f);
  Tensor bad = kiln::from_vector<int64_t>({0, 7});
  CHECK_KILN_ERROR(kiln::nn::F::cross_entropy(logits, bad).eval(), kiln::IndexError,
                   "[cross_entropy]", "7");
  CHECK_KILN_ERROR(kiln::nn::F::nll_loss(logits, bad).eval(), kiln::IndexError, "[nll_loss]", "7");
  CHECK_KILN_ERROR(kiln::nn::F::embedding(bad, kiln::full({5, 2}, 1.0f)).eval(), kiln::IndexError,
                   "[embedding]", "7");
  CHECK_KILN_ERROR(kiln::one_hot(bad, 3).eval(), kiln::IndexError, "[one_hot]", "7");
  // The same kernels under the reference executor name the same op.
  std::string saved = kiln::current_executor();
  kiln::set_executor("reference");
  CHECK_KILN_ERROR(kiln::nn::F::cross_entropy(logits, bad).eval(), kiln::IndexError,
                   "[cross_entropy]", "7");
  kiln::set_executor(saved.c_str());
  // A plain gather outside any composite still names itself.
  CHECK_KILN_ERROR(kiln::gather(logits, 1, kiln::from_vector<int64_t>({0, 9}, {2, 1})).eval(),
                   kiln::IndexError, "[gather]", "9");
}
