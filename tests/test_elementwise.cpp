// Elementwise ops and sources: the op registry over dtypes and shapes, then the rules the
// registry cannot express generically (promotion, integer corner cases, casts, operators),
// then fills, ranges, host data and counter-based random numbers.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "op_harness.h"

using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

bool accepts(const std::vector<DType>& list, DType d) {
  return std::find(list.begin(), list.end(), d) != list.end();
}

// Exact element comparison with NaN == NaN.
void check_values(const Tensor& t, const std::vector<double>& want, double tol = 0.0) {
  std::vector<double> got = t.to_vector<double>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", expected " << want[i]);
    if (std::isnan(want[i])) {
      CHECK(std::isnan(got[i]));
    } else if (tol == 0.0 || std::isinf(want[i])) {
      CHECK(got[i] == want[i]);
    } else {
      CHECK(std::fabs(got[i] - want[i]) <= tol * (1.0 + std::fabs(want[i])));
    }
  }
}

void check_ints(const Tensor& t, const std::vector<int64_t>& want) {
  CHECK(t.to_vector<int64_t>() == want);
}

std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -5, float hi = 5) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) {
    do x = u(rng);
    while (std::fabs(x) < 0.125f);
  }
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The registry
// ---------------------------------------------------------------------------------------

TEST_CASE("registry: every unary op matches its float64 reference over dtypes and shapes",
          "[elementwise][registry]") {
  uint64_t seed = 1000;
  for (const auto& c : kiln::test::unary_cases()) {
    for (DType d : kiln::test::registry_dtypes()) {
      if (!accepts(c.dtypes, d)) continue;
      for (const Shape& s : kiln::test::unary_shapes()) {
        std::string failure = kiln::test::check_unary(c, d, s, ++seed);
        CHECK(failure == "");
      }
    }
  }
}

TEST_CASE("float32 exp holds 2 ulp down to subnormal results and maps -inf to 0", "[elementwise]") {
  // Generated kernels compute float exp inline (jit/cpp_prelude.inc) so loops vectorize;
  // inputs whose result rounds to 0 take a shortcut that avoids subnormal products (a
  // masked score's -inf). Checked against float64 exp rounded to float, one ulp being the
  // spacing at the expected value (2^-149 among subnormals).
  std::vector<float> x;
  for (float v = -110.0f; v < 90.0f; v += 0.0137f) x.push_back(v);
  for (float v : {-103.97208f, -103.9f, -103.0f, -87.34f, -87.33f, 88.7f, 88.72283935546875f,
                  88.73f, 0.0f, -0.0f})
    x.push_back(v);
  const float inf = std::numeric_limits<float>::infinity();
  x.push_back(-inf);
  x.push_back(inf);
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  kiln::set_executor("jit");
  std::vector<float> got =
      exp(kiln::from_vector<float>(x) * 1.0f).to_vector<float>();  // * 1: a fused kernel
  kiln::set_executor("");
  REQUIRE(got.size() == x.size());
  int subnormal = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("exp(" << x[i] << ") = " << got[i]);
    const auto want = static_cast<float>(std::exp(static_cast<double>(x[i])));
    if (std::isnan(x[i])) {
      CHECK(std::isnan(got[i]));
      continue;
    }
    if (std::isinf(want) || want == 0.0f) {
      CHECK(got[i] == want);
      continue;
    }
    subnormal += std::fpclassify(want) == FP_SUBNORMAL;
    const float ulp = std::nextafter(want, inf) - want;
    CHECK(std::fabs(got[i] - want) <= 2 * ulp);
  }
  CHECK(subnormal > 100);
}

TEST_CASE("registry: every binary op matches its float64 reference with broadcasting",
          "[elementwise][registry]") {
  uint64_t seed = 2000;
  for (const auto& c : kiln::test::binary_cases()) {
    for (DType d : kiln::test::registry_dtypes()) {
      if (!accepts(c.dtypes, d)) continue;
      for (const auto& [sa, sb] : kiln::test::binary_shapes()) {
        std::string failure = kiln::test::check_binary(c, d, sa, sb, ++seed);
        CHECK(failure == "");
      }
    }
  }
}

TEST_CASE("registry: binary ops with a C++ scalar on either side keep the tensor's dtype",
          "[elementwise][registry]") {
  uint64_t seed = 3000;
  for (const auto& c : kiln::test::binary_cases()) {
    for (DType d : kiln::test::registry_dtypes()) {
      if (!accepts(c.dtypes, d)) continue;
      for (int side : {1, 2}) {
        for (const Shape& s : {Shape{}, Shape{5}, Shape{2, 3}, Shape{0, 2}}) {
          std::string failure = kiln::test::check_binary(c, d, s, s, ++seed, side);
          CHECK(failure == "");
        }
      }
    }
  }
}

TEST_CASE("registry: the harness itself detects a wrong op", "[elementwise][registry]") {
  // A registry that cannot fail proves nothing: swap the builder and expect a mismatch.
  kiln::test::BinaryCase wrong = kiln::test::binary_cases()[0];  // add
  wrong.build = [](const Tensor& a, const Tensor& b) { return a - b; };
  CHECK(kiln::test::check_binary(wrong, DType::Float32, {3}, {3}, 1) != "");
  kiln::test::UnaryCase wrong_dtype = kiln::test::unary_cases()[3];  // exp
  wrong_dtype.build = [](const Tensor& x) { return kiln::exp(kiln::cast(x, DType::Float64)); };
  CHECK(kiln::test::check_unary(wrong_dtype, DType::Float32, {3}, 1) != "");
}

// ---------------------------------------------------------------------------------------
// Type promotion
// ---------------------------------------------------------------------------------------

TEST_CASE("promotion: results of public ops follow PyTorch's rules", "[elementwise][promotion]") {
  Tensor i32 = kiln::from_vector<int32_t>({1, -2, 3});
  Tensor i8 = kiln::from_vector<int8_t>({1, -2, 3});
  Tensor u8 = kiln::from_vector<uint8_t>({1, 2, 3});
  Tensor f16 =
      kiln::from_vector<kiln::Half>({kiln::Half(1.0f), kiln::Half(-2.0f), kiln::Half(0.5f)});
  Tensor bf16 = kiln::from_vector<kiln::BFloat16>(
      {kiln::BFloat16(1.0f), kiln::BFloat16(2.0f), kiln::BFloat16(4.0f)});
  Tensor f32 = kiln::from_vector<float>({0.5f, 1.5f, -2.5f});
  Tensor b = kiln::from_vector<bool>({true, false, true});

  SECTION("int32 tensor + float scalar gives float32") {
    Tensor y = i32 + 2.5;
    CHECK(y.dtype() == DType::Float32);
    check_values(y, {3.5, 0.5, 5.5});
  }
  SECTION("int8 tensor + int64 scalar stays int8") {
    Tensor y = i8 + int64_t{3};
    CHECK(y.dtype() == DType::Int8);
    check_ints(y, {4, 1, 6});
  }
  SECTION("float16 tensor + float scalar stays float16") {
    Tensor y = f16 + 0.25;
    CHECK(y.dtype() == DType::Float16);
    check_values(y, {1.25, -1.75, 0.75});
  }
  SECTION("int / int is true division in float32") {
    Tensor y = kiln::from_vector<int32_t>({7, -7, 1}) / kiln::from_vector<int32_t>({2, 2, 3});
    CHECK(y.dtype() == DType::Float32);
    check_values(y, {3.5, -3.5, 1.0 / 3.0}, 1e-7);
    CHECK((i32 / 2).dtype() == DType::Float32);
    CHECK((b / b).dtype() == DType::Float32);
  }
  SECTION("comparisons give bool") {
    CHECK((i32 < 2).dtype() == DType::Bool);
    CHECK((f32 == f32).dtype() == DType::Bool);
    CHECK((f16 >= 0.5).dtype() == DType::Bool);
    check_ints(i32 < 2, {1, 1, 0});
    check_ints(f16 >= 0.5, {1, 0, 1});
  }
  SECTION("bitwise ops on bool stay bool") {
    Tensor c = kiln::from_vector<bool>({true, true, false});
    CHECK((b & c).dtype() == DType::Bool);
    check_ints(b & c, {1, 0, 0});
    check_ints(b | c, {1, 1, 1});
    check_ints(b ^ c, {0, 1, 1});
    check_ints(~b, {0, 1, 0});
  }
  SECTION("logical ops accept floats and give bool") {
    Tensor z = kiln::from_vector<float>({0.0f, 2.0f, -0.0f});
    CHECK(kiln::logical_and(f32, z).dtype() == DType::Bool);
    check_ints(kiln::logical_and(f32, z), {0, 1, 0});
    check_ints(kiln::logical_or(z, z), {0, 1, 0});
    check_ints(kiln::logical_xor(f32, z), {1, 0, 1});
    check_ints(!z, {1, 0, 1});
  }
  SECTION("mixed tensor dtypes promote to the smallest common type") {
    CHECK((i8 + u8).dtype() == DType::Int16);
    CHECK((f16 + bf16).dtype() == DType::Float32);
    CHECK((i32 + kiln::from_vector<int64_t>({1, 2, 3})).dtype() == DType::Int64);
    CHECK((f16 + i32).dtype() == DType::Float16);
    CHECK((b + i8).dtype() == DType::Int8);
    check_ints(i8 + u8, {2, 0, 6});
  }
  SECTION("zero-dimensional tensors rank between dimensioned tensors and scalars") {
    CHECK((f32 + kiln::tensor(2.0)).dtype() == DType::Float32);  // same category: dims win
    CHECK((i32 + kiln::tensor(int64_t{2})).dtype() == DType::Int32);
    CHECK((i32 + kiln::tensor(2.5)).dtype() == DType::Float64);  // higher category: its dtype
    CHECK((kiln::tensor(int8_t{1}) + kiln::tensor(int32_t{1})).dtype() == DType::Int32);
    CHECK((kiln::tensor(int8_t{1}) + 1000).dtype() == DType::Int8);
  }
  SECTION("bool tensors take the scalar's category") {
    CHECK((b + 1).dtype() == DType::Int64);
    CHECK((b + 1.5).dtype() == DType::Float32);
    CHECK((b + true).dtype() == DType::Bool);
    CHECK((u8 + 1).dtype() == DType::UInt8);
  }
  SECTION("floating unary ops promote integers and bool to float32") {
    CHECK(kiln::exp(i32).dtype() == DType::Float32);
    CHECK(kiln::sqrt(b).dtype() == DType::Float32);
    CHECK(kiln::exp(f16).dtype() == DType::Float16);
    CHECK(kiln::exp(kiln::from_vector<double>({1.0})).dtype() == DType::Float64);
    CHECK(kiln::floor(i32).dtype() == DType::Int32);
  }
  SECTION("where promotes its value operands, not the condition") {
    CHECK(kiln::where(b, i32, 0.5).dtype() == DType::Float32);
    CHECK(kiln::where(b, i8, int64_t{7}).dtype() == DType::Int8);
    CHECK(kiln::where(b, 1.0, 0).dtype() == DType::Float32);
  }
}

TEST_CASE("promotion: an unevaluated fill of an integer dtype keeps its converted value",
          "[elementwise][promotion]") {
  // full({3}, 2.7, int32) holds 2; promoting it to float32 in an op must give 2.0, exactly as
  // when the fill has already been evaluated (a buffer is only a cache of the node's value).
  Tensor fill = kiln::full({3}, 2.7, DType::Int32);
  Tensor lazy = fill + kiln::zeros({3}, DType::Float32);
  Tensor evaluated_fill = kiln::full({3}, 2.7, DType::Int32);
  evaluated_fill.eval();
  Tensor eager = evaluated_fill + kiln::zeros({3}, DType::Float32);
  check_values(eager, {2, 2, 2});
  check_values(lazy, {2, 2, 2});
  // Same with wrapping: 300 stored as int8 is 44.
  Tensor wrapped = kiln::full({2}, 300, DType::Int8) + 0.5;
  check_values(wrapped, {44.5, 44.5});
}

// ---------------------------------------------------------------------------------------
// Integer corner cases
// ---------------------------------------------------------------------------------------

TEST_CASE("integers: arithmetic wraps around in two's complement", "[elementwise][integer]") {
  check_ints(kiln::from_vector<int8_t>({127, -128, 100}) + int8_t{1}, {-128, -127, 101});
  check_ints(kiln::from_vector<int8_t>({-128}) - 1, {127});
  check_ints(kiln::from_vector<int8_t>({64, -128}) * 2, {-128, 0});
  check_ints(kiln::from_vector<uint8_t>({255, 0}) + 1, {0, 1});
  check_ints(kiln::from_vector<uint8_t>({3}) - kiln::from_vector<uint8_t>({5}), {254});
  check_ints(-kiln::from_vector<int8_t>({-128, 5}), {-128, -5});
  check_ints(kiln::abs(kiln::from_vector<int8_t>({-128})), {-128});
  check_ints(kiln::from_vector<int32_t>({2147483647}) + 1, {-2147483648LL});
  check_ints(kiln::from_vector<int64_t>({std::numeric_limits<int64_t>::max()}) + 1,
             {std::numeric_limits<int64_t>::min()});
  check_ints(kiln::from_vector<int32_t>({65536}) * kiln::from_vector<int32_t>({65536}), {0});
}

TEST_CASE("integers: floor_div and mod follow Python with negative operands, and x // 0 == 0",
          "[elementwise][integer]") {
  std::vector<int64_t> a = {7, -7, 7, -7, 0, 5, -5, 6, -6};
  std::vector<int64_t> b = {2, 2, -2, -2, 3, 0, 0, 3, -3};
  std::vector<int64_t> q = {3, -4, -4, 3, 0, 0, 0, 2, 2};
  std::vector<int64_t> r = {1, 1, -1, -1, 0, 0, 0, 0, 0};
  SECTION("int64") {
    Tensor ta = kiln::from_vector<int64_t>(a), tb = kiln::from_vector<int64_t>(b);
    check_ints(kiln::floor_div(ta, tb), q);
    check_ints(ta % tb, r);
  }
  SECTION("int32") {
    std::vector<int32_t> a32(a.begin(), a.end()), b32(b.begin(), b.end());
    Tensor ta = kiln::from_vector<int32_t>(a32), tb = kiln::from_vector<int32_t>(b32);
    CHECK(kiln::floor_div(ta, tb).dtype() == DType::Int32);
    check_ints(kiln::floor_div(ta, tb), q);
    check_ints(kiln::mod(ta, tb), r);
  }
  SECTION("int8 including -128 // -1, which wraps") {
    std::vector<int8_t> a8(a.begin(), a.end()), b8(b.begin(), b.end());
    Tensor ta = kiln::from_vector<int8_t>(a8), tb = kiln::from_vector<int8_t>(b8);
    check_ints(kiln::floor_div(ta, tb), q);
    check_ints(ta % tb, r);
    check_ints(kiln::floor_div(kiln::from_vector<int8_t>({-128}), int8_t{-1}), {-128});
    check_ints(kiln::from_vector<int8_t>({-128}) % -1, {0});
  }
  SECTION("scalars on either side") {
    check_ints(kiln::floor_div(-7, kiln::from_vector<int32_t>({2, -2, 0})), {-4, 3, 0});
    check_ints(kiln::mod(kiln::from_vector<int32_t>({-7, 7}), 3), {2, 1});
    check_ints(7 % kiln::from_vector<int32_t>({-3, 3, 0}), {-2, 1, 0});
  }
  SECTION("random operands against Python's definition") {
    std::mt19937_64 rng(5);
    std::uniform_int_distribution<int32_t> u(-1000, 1000);
    std::vector<int32_t> x(500), y(500);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = u(rng);
      do y[i] = u(rng) / 10;
      while (y[i] == 0);
    }
    std::vector<int64_t> wq(x.size()), wr(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      wq[i] = static_cast<int64_t>(std::floor(static_cast<double>(x[i]) / y[i]));
      wr[i] = x[i] - wq[i] * y[i];
    }
    Tensor tx = kiln::from_vector<int32_t>(x), ty = kiln::from_vector<int32_t>(y);
    check_ints(kiln::floor_div(tx, ty), wq);
    check_ints(tx % ty, wr);
  }
}

TEST_CASE("floats: floor_div and mod follow Python", "[elementwise][float]") {
  Tensor a = kiln::from_vector<double>({7.5, -7.5, 7.5, -7.5, 6.0, -0.0});
  Tensor b = kiln::from_vector<double>({2.0, 2.0, -2.0, -2.0, 3.0, 2.0});
  check_values(kiln::floor_div(a, b), {3, -4, -4, 3, 2, 0});
  check_values(a % b, {1.5, 0.5, -0.5, -1.5, 0, 0});
  SECTION("float32 and float16 give the same answers") {
    for (DType d : {DType::Float32, DType::Float16, DType::BFloat16}) {
      check_values(kiln::floor_div(kiln::cast(a, d), kiln::cast(b, d)), {3, -4, -4, 3, 2, 0});
      check_values(kiln::cast(a, d) % kiln::cast(b, d), {1.5, 0.5, -0.5, -1.5, 0, 0});
    }
  }
  SECTION("1 // 0.1 is 9 and 1 % 0.1 is just under 0.1, as in Python") {
    Tensor one = kiln::from_vector<double>({1.0});
    check_values(kiln::floor_div(one, 0.1), {9.0});
    check_values(one % 0.1, {0.09999999999999995});
  }
  SECTION("division by zero gives IEEE results, not an exception") {
    Tensor x = kiln::from_vector<float>({1.0f, -1.0f, 0.0f});
    check_values(kiln::floor_div(x, 0.0), {kInf, -kInf, kNaN});
    check_values(x / 0.0, {kInf, -kInf, kNaN});
    check_values(x % 0.0, {kNaN, kNaN, kNaN});
  }
}

TEST_CASE("integers: pow with a negative exponent is 1/a^n truncated toward zero",
          "[elementwise][integer]") {
  Tensor base = kiln::from_vector<int32_t>({2, -2, 1, -1, -1, 3, 5, 0});
  Tensor e = kiln::from_vector<int32_t>({-1, -1, -5, -3, -2, 0, -2, 2});
  Tensor y = kiln::pow(base, e);
  CHECK(y.dtype() == DType::Int32);
  check_ints(y, {0, 0, 1, -1, 1, 1, 0, 0});
  check_ints(
      kiln::pow(kiln::from_vector<int64_t>({-2, 3, 2}), kiln::from_vector<int64_t>({3, 4, 62})),
      {-8, 81, int64_t{1} << 62});
  check_ints(kiln::pow(kiln::from_vector<int8_t>({3}), 5), {243 - 256});  // wraps like repeated *
  check_ints(kiln::pow(2, kiln::from_vector<int64_t>({10, 64})), {1024, 0});
  CHECK(kiln::pow(base, 0.5).dtype() == DType::Float32);
}

// ---------------------------------------------------------------------------------------
// Rounding, NaN, where, cast, clamp, isnan/isinf
// ---------------------------------------------------------------------------------------

TEST_CASE("round: halves go to the even neighbour", "[elementwise][float]") {
  std::vector<double> x = {0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999, 2.5001, 3.5, -3.5, 1e15 + 0.5};
  std::vector<double> want = {0, 2, 2, -0.0, -2, -2, 2, 3, 4, -4, 1e15};
  check_values(kiln::round(kiln::from_vector<double>(x)), want);
  for (DType d : {DType::Float32, DType::Float16, DType::BFloat16}) {
    Tensor t = kiln::round(
        kiln::cast(kiln::from_vector<double>({0.5, 1.5, 2.5, -0.5, -2.5, 3.5, 4.5}), d));
    CHECK(t.dtype() == d);
    check_values(t, {0, 2, 2, 0, -2, 4, 4});
  }
  check_values(kiln::floor(kiln::from_vector<float>({-1.5f, 1.5f, -0.0f})), {-2, 1, 0});
  check_values(kiln::ceil(kiln::from_vector<float>({-1.5f, 1.5f})), {-1, 2});
  check_values(kiln::trunc(kiln::from_vector<float>({-1.7f, 1.7f})), {-1, 1});
}

TEST_CASE("maximum and minimum propagate NaN from either side", "[elementwise][float]") {
  for (DType d : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    Tensor a = kiln::cast(kiln::from_vector<double>({kNaN, 1, 2, kNaN, -kInf}), d);
    Tensor b = kiln::cast(kiln::from_vector<double>({0, kNaN, 1, kNaN, 3}), d);
    check_values(kiln::maximum(a, b), {kNaN, kNaN, 2, kNaN, 3});
    check_values(kiln::minimum(a, b), {kNaN, kNaN, 1, kNaN, -kInf});
    check_values(kiln::maximum(a, 1.5), {kNaN, 1.5, 2, kNaN, 1.5});
    check_values(kiln::relu(a), {kNaN, 1, 2, kNaN, 0});
  }
}

TEST_CASE("where: bool condition, broadcasting of all three operands", "[elementwise][where]") {
  std::vector<bool> c = {true, false, true};
  Tensor cond = kiln::from_vector<bool>(c, {3, 1});
  std::vector<float> av = random_floats(4, 11);
  Tensor a = kiln::from_vector<float>(av, {1, 4});
  Tensor y = kiln::where(cond, a, 0.5);
  CHECK(y.shape() == Shape{3, 4});
  CHECK(y.dtype() == DType::Float32);
  std::vector<double> want;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) want.push_back(c[i] ? av[j] : 0.5);
  check_values(y, want);

  Tensor ib = kiln::from_vector<int32_t>({10, 20}, {2, 1, 1});
  Tensor z = kiln::where(cond, a, ib);  // [3,1] [1,4] [2,1,1] -> [2,3,4], float32
  CHECK(z.shape() == Shape{2, 3, 4});
  CHECK(z.dtype() == DType::Float32);
  std::vector<double> zw;
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) zw.push_back(c[i] ? av[j] : (k ? 20.0 : 10.0));
  check_values(z, zw);
  check_ints(kiln::where(kiln::from_vector<bool>({true, false}), true, false), {1, 0});
  check_ints(kiln::where(kiln::from_vector<bool>({false, true}), int64_t{3}, int64_t{-4}), {-4, 3});
}

TEST_CASE("cast: truncation, saturation, NaN, bool and half rounding", "[elementwise][cast]") {
  Tensor f = kiln::from_vector<double>({-2.7, 2.7, -0.5, 1e10, -1e10, kNaN, kInf, -kInf});
  SECTION("float to int truncates toward zero and saturates; NaN gives 0") {
    check_ints(kiln::cast(f, DType::Int32),
               {-2, 2, 0, 2147483647, -2147483648LL, 0, 2147483647, -2147483648LL});
    check_ints(kiln::cast(f, DType::Int8), {-2, 2, 0, 127, -128, 0, 127, -128});
    check_ints(kiln::cast(f, DType::UInt8), {0, 2, 0, 255, 0, 0, 255, 0});
    check_ints(kiln::cast(kiln::cast(f, DType::Float32), DType::Int64),
               {-2, 2, 0, 10000000000LL, -10000000000LL, 0, std::numeric_limits<int64_t>::max(),
                std::numeric_limits<int64_t>::min()});
    check_ints(kiln::cast(kiln::from_vector<float>({12.9f, 300.0f, -5.5f}), DType::UInt8),
               {12, 255, 0});
  }
  SECTION("float to bool is x != 0 (NaN is true)") {
    check_ints(kiln::cast(kiln::from_vector<float>({0.0f, -0.0f, 0.5f, -3.0f, NAN}), DType::Bool),
               {0, 0, 1, 1, 1});
  }
  SECTION("int to int wraps, int to bool tests non-zero") {
    check_ints(kiln::cast(kiln::from_vector<int64_t>({300, -129, 128, -1}), DType::Int8),
               {44, 127, -128, -1});
    check_ints(kiln::cast(kiln::from_vector<int32_t>({-1, 256}), DType::UInt8), {255, 0});
    check_ints(kiln::cast(kiln::from_vector<int32_t>({0, 2, -3}), DType::Bool), {0, 1, 1});
    check_values(kiln::cast(kiln::from_vector<bool>({true, false}), DType::Float32), {1, 0});
  }
  SECTION("int to float16 rounds to nearest even and overflows to inf") {
    Tensor i = kiln::from_vector<int32_t>({2049, 2051, 4097, 65519, 65520, -65520, 1000, -3});
    Tensor h = kiln::cast(i, DType::Float16);
    CHECK(h.dtype() == DType::Float16);
    check_values(h, {2048, 2052, 4096, 65504, kInf, -kInf, 1000, -3});
    Tensor bf = kiln::cast(kiln::from_vector<int32_t>({257, 259, 1000}), DType::BFloat16);
    check_values(bf, {256, 260, 1000});
  }
  SECTION("float32 to float16 / bfloat16 rounds to nearest even") {
    float t = 1.0f + std::ldexp(1.0f, -11);  // halfway between 1 and the next half
    check_values(kiln::cast(kiln::from_vector<float>({t, 1e-8f, 1e5f, -1e5f}), DType::Float16),
                 {1.0, 0, kInf, -kInf});
    float bt = 1.0f + std::ldexp(1.0f, -8), bt3 = 1.0f + 3 * std::ldexp(1.0f, -8);
    check_values(kiln::cast(kiln::from_vector<float>({bt, bt3}), DType::BFloat16), {1.0, 1.015625});
  }
  SECTION("half to float is exact, casting to the same dtype is the identity") {
    Tensor h = kiln::from_vector<kiln::Half>(
        {kiln::Half::from_bits(0x3c01), kiln::Half::from_bits(0x0001)});
    check_values(kiln::cast(h, DType::Float32), {1.0 + std::ldexp(1.0, -10), std::ldexp(1.0, -24)});
    CHECK(kiln::cast(h, DType::Float16).node() == h.node());
  }
}

TEST_CASE("kernels decode all 65536 float16 patterns as the host does", "[elementwise][cast]") {
  // The kernel prelude's h2f is written with selects (so that loops over float16 vectorize);
  // it must give the host decoder's bits for every number, signed zeros, subnormals and
  // infinities included, and a NaN of the same sign for every NaN. The reductions read it too: min
  // and max over every non-NaN pattern are -inf and +inf, and one NaN makes them NaN.
  std::vector<kiln::Half> all, numbers;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    all.push_back(kiln::Half::from_bits(static_cast<uint16_t>(b)));
    if (!std::isnan(kiln::half_bits_to_float(static_cast<uint16_t>(b))))
      numbers.push_back(all.back());
  }
  const std::vector<float> got =
      kiln::cast(kiln::from_vector<kiln::Half>(all), DType::Float32).to_vector<float>();
  REQUIRE(got.size() == all.size());
  size_t mismatches = 0;
  for (size_t b = 0; b < got.size(); ++b) {
    const float want = kiln::half_bits_to_float(static_cast<uint16_t>(b));
    // A NaN keeps its sign; its payload may be quieted on the way (the host's is).
    const bool same = std::isnan(want) ? std::isnan(got[b]) && std::signbit(got[b]) == (b >= 0x8000)
                                       : std::memcmp(&got[b], &want, sizeof want) == 0;
    if (!same && ++mismatches <= 5)
      FAIL_CHECK("pattern " << b << " decodes to " << got[b] << ", the host gives " << want);
  }
  CHECK(mismatches == 0);
  Tensor x = kiln::from_vector<kiln::Half>(numbers);
  CHECK(kiln::min(x).item<double>() == -kInf);
  CHECK(kiln::max(x).item<double>() == kInf);
  CHECK(std::isnan(kiln::max(kiln::from_vector<kiln::Half>(all)).item<double>()));
  CHECK(std::isnan(kiln::min(kiln::from_vector<kiln::Half>(all)).item<double>()));
}

TEST_CASE("cast: float64 and int64 to half types round once, not through float32",
          "[elementwise][cast]") {
  // 1 + 2^-11 + 2^-40 is just above the midpoint between 1 and 1 + 2^-10: nearest is 1 + 2^-10.
  // Rounding to float32 first lands exactly on the midpoint, and ties-to-even then gives 1.
  double above_mid = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  check_values(kiln::cast(kiln::from_vector<double>({above_mid}), DType::Float16),
               {1.0 + std::ldexp(1.0, -10)});
  // 2^24 + 2^16 + 1 is just above the bfloat16 midpoint between 2^24 and 2^24 + 2^17.
  check_values(kiln::cast(kiln::from_vector<int64_t>({(1 << 24) + (1 << 16) + 1}), DType::BFloat16),
               {double((1 << 24) + (1 << 17))});
}

TEST_CASE("clamp: scalar, tensor and one-sided bounds", "[elementwise]") {
  std::vector<float> v = random_floats(64, 21, -3, 3);
  Tensor x = kiln::from_vector<float>(v, {8, 8});
  std::vector<double> want(v.size()), lo_only(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    want[i] = std::min(std::max<double>(v[i], -1.0), 1.0);
    lo_only[i] = std::max<double>(v[i], 0.5);
  }
  check_values(kiln::clamp(x, -1.0, 1.0), want);
  check_values(kiln::clamp(x, kiln::from_vector<float>({0.5f}), Tensor()), lo_only);
  CHECK(kiln::clamp(x, Tensor(), Tensor()).node() == x.node());
  std::vector<float> lov = {-1, -2, -3, -4, 0, 0, 0, 0};
  Tensor lo = kiln::from_vector<float>(lov, {8, 1});
  Tensor y = kiln::clamp(x, lo, kiln::from_vector<float>({1.0f}));
  std::vector<double> yw(v.size());
  for (size_t i = 0; i < v.size(); ++i) yw[i] = std::min(std::max<double>(v[i], lov[i / 8]), 1.0);
  check_values(y, yw);
  check_ints(kiln::clamp(kiln::from_vector<int32_t>({-10, 0, 10}), -3, 3), {-3, 0, 3});
  CHECK(kiln::clamp(kiln::from_vector<int32_t>({-10, 0, 10}), -3, 3).dtype() == DType::Int32);
  check_values(kiln::clamp(kiln::from_vector<float>({NAN, 5.0f}), 0.0, 1.0), {kNaN, 1.0});
}

TEST_CASE("isnan and isinf for every dtype", "[elementwise]") {
  for (DType d : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    Tensor x = kiln::cast(kiln::from_vector<double>({kNaN, kInf, -kInf, 1.0, 0.0, 65504.0}), d);
    CHECK(kiln::isnan(x).dtype() == DType::Bool);
    check_ints(kiln::isnan(x), {1, 0, 0, 0, 0, 0});
    check_ints(kiln::isinf(x), {0, 1, 1, 0, 0, 0});
  }
  for (DType d : {DType::Int32, DType::UInt8, DType::Bool}) {
    Tensor x = kiln::cast(kiln::from_vector<int32_t>({0, 1, 2}, {3}), d);
    CHECK(kiln::isnan(x).dtype() == DType::Bool);
    check_ints(kiln::isnan(x), {0, 0, 0});
    check_ints(kiln::isinf(x), {0, 0, 0});
  }
}

TEST_CASE("operators: arithmetic, comparison and bitwise, scalars on either side",
          "[elementwise][operators]") {
  std::vector<float> av = random_floats(24, 31), bv = random_floats(24, 32);
  Tensor a = kiln::from_vector<float>(av, {4, 6}), b = kiln::from_vector<float>(bv, {4, 6});
  auto each = [&](auto f) {
    std::vector<double> w(av.size());
    for (size_t i = 0; i < av.size(); ++i) w[i] = f(double(av[i]), double(bv[i]));
    return w;
  };
  const double tol = 2e-6;
  check_values(a + b, each([](double x, double y) { return x + y; }), tol);
  check_values(a - b, each([](double x, double y) { return x - y; }), tol);
  check_values(a * b, each([](double x, double y) { return x * y; }), tol);
  check_values(a / b, each([](double x, double y) { return x / y; }), tol);
  check_values(a % b, each([](double x, double y) { return x - y * std::floor(x / y); }), 1e-5);
  check_values(-a, each([](double x, double) { return -x; }));
  check_values(2.0f - a, each([](double x, double) { return 2.0 - x; }), tol);
  check_values(1.0 / a, each([](double x, double) { return 1.0 / x; }), tol);
  check_values(3 * a, each([](double x, double) { return 3.0 * x; }), tol);
  check_values(a - 0.5, each([](double x, double) { return x - 0.5; }), tol);
  check_values(a == a, std::vector<double>(av.size(), 1.0));
  check_values(a < b, each([](double x, double y) { return double(x < y); }));
  check_values(a <= b, each([](double x, double y) { return double(x <= y); }));
  check_values(a > 0, each([](double x, double) { return double(x > 0); }));
  check_values(0 >= a, each([](double x, double) { return double(0 >= x); }));
  check_values(a != b, std::vector<double>(av.size(), 1.0));
  check_values(!(a > 0), each([](double x, double) { return double(!(x > 0)); }));
  check_values((a > 0) && (b > 0), each([](double x, double y) { return double(x > 0 && y > 0); }));
  check_values((a > 0) || (b > 0), each([](double x, double y) { return double(x > 0 || y > 0); }));
  CHECK((2.0f - a).dtype() == DType::Float32);

  Tensor i = kiln::from_vector<int32_t>({12, -7, 0, 255}),
         j = kiln::from_vector<int32_t>({10, 3, -1, 15});
  check_ints(i & j, {8, 1, 0, 15});
  check_ints(i | j, {14, -5, -1, 255});
  check_ints(i ^ j, {6, -6, -1, 240});
  check_ints(~i, {-13, 6, -1, -256});
  check_ints(0xF0 & i, {0, 0xF0 & -7, 0, 0xF0});
  check_ints(i ^ 1, {13, -8, 1, 254});
  check_ints(10 - i, {-2, 17, 10, -245});
  check_ints(i % 5, {2, 3, 0, 0});
  check_ints(!i, {0, 0, 1, 0});
  CHECK((10 - i).dtype() == DType::Int32);
}

// ---------------------------------------------------------------------------------------
// Sources
// ---------------------------------------------------------------------------------------

TEST_CASE("sources: full, zeros, ones and *_like", "[elementwise][sources]") {
  Tensor f = kiln::full({2, 3}, 2.5);
  CHECK(f.dtype() == DType::Float32);
  CHECK(f.shape() == Shape{2, 3});
  check_values(f, std::vector<double>(6, 2.5));
  check_ints(kiln::full({2}, 2.5, DType::Int32), {2, 2});       // truncates
  check_ints(kiln::full({2}, -1, DType::UInt8), {255, 255});    // integers wrap
  check_ints(kiln::full({2}, 300.0, DType::Int8), {127, 127});  // floats saturate
  check_ints(kiln::full({1}, NAN, DType::Int32), {0});
  check_ints(kiln::full({2}, true, DType::Bool), {1, 1});
  check_values(kiln::full({}, -0.75, DType::Float16), {-0.75});
  CHECK(kiln::full({}, 1).numel() == 1);
  check_values(kiln::zeros({2, 2}, DType::Float64), {0, 0, 0, 0});
  check_ints(kiln::ones({3}, DType::Int8), {1, 1, 1});
  check_ints(kiln::ones({2}, DType::Bool), {1, 1});
  CHECK(kiln::zeros({0, 4}).numel() == 0);
  CHECK(kiln::zeros({0, 4}).to_vector<float>().empty());
  Tensor like = kiln::from_vector<int16_t>({1, 2, 3, 4}, {2, 2});
  Tensor z = kiln::zeros_like(like), o = kiln::ones_like(like), v = kiln::full_like(like, 9);
  CHECK(z.dtype() == DType::Int16);
  CHECK(o.shape() == Shape{2, 2});
  check_ints(z, {0, 0, 0, 0});
  check_ints(o, {1, 1, 1, 1});
  check_ints(v, {9, 9, 9, 9});
}

TEST_CASE("sources: arange with int and float bounds, negative steps and empty ranges",
          "[elementwise][sources]") {
  Tensor r = kiln::arange(5);
  CHECK(r.dtype() == DType::Int64);
  check_ints(r, {0, 1, 2, 3, 4});
  check_ints(kiln::arange(2, 11, 3), {2, 5, 8});
  check_ints(kiln::arange(5, 0, -2), {5, 3, 1});
  check_ints(kiln::arange(-3, 2), {-3, -2, -1, 0, 1});
  Tensor fr = kiln::arange(0.0, 1.0, 0.25);
  CHECK(fr.dtype() == DType::Float32);
  check_values(fr, {0, 0.25, 0.5, 0.75});
  check_values(kiln::arange(1.0, 0.0, -0.3), {1.0, 0.7, 0.4, 0.1}, 1e-6);
  CHECK(kiln::arange(0, 5, 1, DType::Float64).dtype() == DType::Float64);
  check_values(kiln::arange(0, 5, 2, DType::Float16), {0, 2, 4});
  check_ints(kiln::arange(0, 10, 4, DType::Int8), {0, 4, 8});
  CHECK(kiln::arange(0, 1, 0.5).dtype() == DType::Float32);
  // Lengths: ceil((stop - start) / step), 0 when the range is empty.
  CHECK(kiln::arange(0.0, 1.0, 0.1).numel() == 10);
  CHECK(kiln::arange(3, 3).numel() == 0);
  CHECK(kiln::arange(5, 0, 1).numel() == 0);
  CHECK(kiln::arange(0, 5, -1).numel() == 0);
  CHECK(kiln::arange(0).numel() == 0);
  CHECK(kiln::arange(5, 0, 1).to_vector<int64_t>().empty());
  // Values far beyond 2^53 stay exact on the integer path.
  int64_t big = (int64_t{1} << 53) + 1;
  check_ints(kiln::arange(big, big + 3), {big, big + 1, big + 2});
}

TEST_CASE("sources: index is the coordinate along an axis", "[elementwise][sources]") {
  Tensor t = kiln::index({2, 3}, 1);
  CHECK_FALSE(t.is_evaluated());  // a lazy source, not a constant
  CHECK(t.dtype() == DType::Int64);
  check_ints(t, {0, 1, 2, 0, 1, 2});
  check_ints(kiln::index({2, 3}, 0), {0, 0, 0, 1, 1, 1});
  check_ints(kiln::index({2, 3}, -1), {0, 1, 2, 0, 1, 2});
  Tensor f = kiln::index({2, 2, 2}, 1, DType::Float32);
  CHECK(f.dtype() == DType::Float32);
  check_values(f, {0, 0, 1, 1, 0, 0, 1, 1});
  CHECK(kiln::index({0, 3}, 1).numel() == 0);
}

namespace {
template <typename T>
void round_trip(const std::vector<T>& v, const Shape& shape) {
  Tensor t = kiln::from_vector<T>(v, shape);
  CHECK(t.dtype() == kiln::dtype_of<T>());
  CHECK(t.shape() == shape);
  CHECK(t.is_evaluated());
  std::vector<T> back = t.template to_vector<T>();
  REQUIRE(back.size() == v.size());
  const T* p = t.template data<T>();
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, kiln::Half> || std::is_same_v<T, kiln::BFloat16>) {
      CHECK(back[i].bits == v[i].bits);
      CHECK(p[i].bits == v[i].bits);
    } else {
      CHECK(back[i] == v[i]);
      CHECK(p[i] == v[i]);
    }
  }
}
}  // namespace

TEST_CASE("sources: from_vector round-trips every dtype", "[elementwise][sources]") {
  round_trip<bool>({true, false, false, true, true, false}, {2, 3});
  round_trip<int8_t>({-128, 127, 0, -1}, {4});
  round_trip<uint8_t>({0, 255, 7, 128}, {2, 2});
  round_trip<int16_t>({-32768, 32767, 3}, {3, 1});
  round_trip<int32_t>(
      {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), -5}, {3});
  round_trip<int64_t>({std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 1},
                      {1, 3});
  round_trip<kiln::Half>({kiln::Half::from_bits(0x3c00), kiln::Half::from_bits(0x7bff),
                          kiln::Half::from_bits(0x0001), kiln::Half::from_bits(0xfc00)},
                         {2, 2});
  round_trip<kiln::BFloat16>({kiln::BFloat16::from_bits(0x3f80), kiln::BFloat16::from_bits(0xff7f)},
                             {2});
  round_trip<float>({1.5f, -0.0f, std::numeric_limits<float>::denorm_min(), 3.4e38f}, {2, 1, 2});
  round_trip<double>({1e-300, -2.5, 1e300}, {3});
  round_trip<float>({42.0f}, {});
  round_trip<double>({}, {0, 5});
  Tensor s = kiln::tensor(int32_t{-9});
  CHECK(s.shape().empty());
  CHECK(s.item<int32_t>() == -9);
}

// ---------------------------------------------------------------------------------------
// Random numbers
// ---------------------------------------------------------------------------------------

TEST_CASE("random: values are a pure function of (seed, offset, index)", "[elementwise][random]") {
  SECTION("the same generator state gives the same values whatever the shape") {
    kiln::manual_seed(7);
    std::vector<float> flat = kiln::rand({6}).to_vector<float>();
    kiln::manual_seed(7);
    std::vector<float> grid = kiln::rand({2, 3}).to_vector<float>();
    CHECK(flat == grid);
    kiln::manual_seed(7);
    CHECK(kiln::randn({6}).to_vector<float>() != flat);
    kiln::manual_seed(7);
    std::vector<double> n1 = kiln::randn({3, 2}, DType::Float64).to_vector<double>();
    kiln::manual_seed(7);
    CHECK(kiln::randn({6}, DType::Float64).to_vector<double>() == n1);
  }
  SECTION("consecutive calls draw different values") {
    kiln::manual_seed(7);
    std::vector<float> a = kiln::rand({100}).to_vector<float>();
    std::vector<float> b = kiln::rand({100}).to_vector<float>();
    int same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
    CHECK(same < 3);
  }
  SECTION("the node records (seed, offset) at creation; evaluation does not read the generator") {
    kiln::manual_seed(123);
    Tensor skip = kiln::rand({5});
    Tensor r = kiln::rand({4});
    CHECK(r.node()->seed == 123);
    CHECK(r.node()->offset == 5);
    CHECK(kiln::default_generator().offset() == 9);
    kiln::manual_seed(999);  // reseeding before evaluation changes nothing
    (void)kiln::rand({1000});
    std::vector<float> got = r.to_vector<float>();
    for (uint64_t i = 0; i < 4; ++i) CHECK(got[i] == kiln::uniform_float(123, 5, i));
    std::vector<double> d =
        kiln::rand({3}, DType::Float64, kiln::default_generator()).to_vector<double>();
    for (uint64_t i = 0; i < 3; ++i) CHECK(d[i] == kiln::uniform_double(999, 1000, i));
    Tensor n = kiln::randn({3}, DType::Float64);
    std::vector<double> nv = n.to_vector<double>();
    for (uint64_t i = 0; i < 3; ++i) CHECK(nv[i] == kiln::normal_double(999, 1003, i));
  }
  SECTION("low-precision dtypes stay in [0, 1)") {
    kiln::manual_seed(3);
    for (DType d : {DType::Float16, DType::BFloat16, DType::Float32, DType::Float64}) {
      Tensor r = kiln::rand({20000}, d);
      CHECK(r.dtype() == d);
      std::vector<double> v = r.to_vector<double>();
      CHECK(*std::min_element(v.begin(), v.end()) >= 0.0);
      CHECK(*std::max_element(v.begin(), v.end()) < 1.0);
    }
  }
}

TEST_CASE("random: distribution sanity", "[elementwise][random]") {
  kiln::manual_seed(2024);
  const size_t n = 100000;
  SECTION("uniform mean 0.5 and variance 1/12") {
    std::vector<double> v = kiln::rand({100, 1000}).to_vector<double>();
    double mean = std::accumulate(v.begin(), v.end(), 0.0) / n;
    double var = 0;
    for (double x : v) var += (x - mean) * (x - mean);
    var /= n;
    CHECK(std::fabs(mean - 0.5) < 0.01);
    CHECK(std::fabs(var - 1.0 / 12) < 0.003);
  }
  SECTION("normal mean 0 and variance 1") {
    std::vector<double> v = kiln::randn({static_cast<int64_t>(n)}).to_vector<double>();
    double mean = std::accumulate(v.begin(), v.end(), 0.0) / n;
    double var = 0;
    for (double x : v) var += (x - mean) * (x - mean);
    var /= n;
    CHECK(std::fabs(mean) < 0.015);
    CHECK(std::fabs(var - 1.0) < 0.03);
    CHECK(std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); }));
  }
  SECTION("bernoulli frequency is p") {
    for (double p : {0.1, 0.3, 0.5, 0.9}) {
      Tensor b = kiln::bernoulli({static_cast<int64_t>(n)}, p);
      CHECK(b.dtype() == DType::Bool);
      std::vector<int64_t> v = b.to_vector<int64_t>();
      double freq = std::accumulate(v.begin(), v.end(), 0.0) / n;
      CHECK(std::fabs(freq - p) < 0.01);
    }
    std::vector<int64_t> none = kiln::bernoulli({1000}, 0.0).to_vector<int64_t>();
    std::vector<int64_t> all = kiln::bernoulli({1000}, 1.0).to_vector<int64_t>();
    CHECK(std::accumulate(none.begin(), none.end(), int64_t{0}) == 0);
    CHECK(std::accumulate(all.begin(), all.end(), int64_t{0}) == 1000);
  }
  SECTION("randint covers [low, high) uniformly") {
    Tensor r = kiln::randint(-3, 5, {static_cast<int64_t>(n)});
    CHECK(r.dtype() == DType::Int64);
    std::vector<int64_t> v = r.to_vector<int64_t>();
    std::vector<int> count(8, 0);
    int64_t lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
    CHECK(lo == -3);
    REQUIRE(hi == 4);
    for (int64_t x : v) ++count[static_cast<size_t>(x + 3)];
    for (int c : count) CHECK(std::fabs(c / double(n) - 0.125) < 0.01);
    std::vector<int64_t> one = kiln::randint(7, 8, {50}).to_vector<int64_t>();
    CHECK(one == std::vector<int64_t>(50, 7));
    int64_t big = int64_t{1} << 40;
    std::vector<int64_t> wide = kiln::randint(-big, big, {1000}).to_vector<int64_t>();
    CHECK(*std::min_element(wide.begin(), wide.end()) >= -big);
    CHECK(*std::max_element(wide.begin(), wide.end()) < big);
  }
}

TEST_CASE("random: explicit generators are independent of the default one",
          "[elementwise][random]") {
  kiln::manual_seed(5);
  uint64_t before = kiln::default_generator().offset();
  kiln::Generator g(42), g2(42), other(43);
  std::vector<float> a = kiln::rand({8}, DType::Float32, g).to_vector<float>();
  CHECK(kiln::default_generator().offset() == before);
  CHECK(g.offset() == 8);
  CHECK(kiln::rand({8}, DType::Float32, g2).to_vector<float>() == a);
  CHECK(kiln::rand({8}, DType::Float32, other).to_vector<float>() != a);
  CHECK(kiln::rand({8}, DType::Float32, g).to_vector<float>() != a);  // g moved on
  kiln::manual_seed(42);
  CHECK(kiln::rand({8}).to_vector<float>() == a);  // same (seed, offset), same values
  g.manual_seed(42);
  CHECK(g.offset() == 0);
  CHECK(kiln::rand({2, 4}, DType::Float32, g).to_vector<float>() == a);
  kiln::Generator gi(9), gi2(9);
  CHECK(kiln::randint(0, 100, {30}, gi).to_vector<int64_t>() ==
        kiln::randint(0, 100, {30}, gi2).to_vector<int64_t>());
  CHECK(kiln::bernoulli({30}, 0.5, gi).to_vector<int64_t>() ==
        kiln::bernoulli({30}, 0.5, gi2).to_vector<int64_t>());
}
