// Dtype properties, promotion against PyTorch's table, and the float16 / bfloat16 conversions
// against references that compute values in double instead of manipulating bits.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

using kiln::DType;

namespace {

constexpr DType kAll[kiln::kNumDTypes] = {
    DType::Bool,  DType::Int8,    DType::UInt8,    DType::Int16,   DType::Int32,
    DType::Int64, DType::Float16, DType::BFloat16, DType::Float32, DType::Float64,
};

uint32_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }
float bits_float(uint32_t b) { return std::bit_cast<float>(b); }

// --- float16 reference: values from the fields, rounding by comparison with midpoints. ---

double half_reference_value(uint16_t bits) {
  const int sign = bits >> 15, exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -24);
  } else {
    magnitude = std::ldexp(static_cast<double>(1024 + mantissa), exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

// Magnitudes of the non-negative halves 0x0000..0x7c00 in increasing order, with 0x7c00 standing
// for 2^16: the value the largest half would round up to if the exponent range went on, so
// that "nearest, ties to even" against it is exactly the overflow rule.
const std::vector<double>& half_ladder() {
  static const std::vector<double> ladder = [] {
    std::vector<double> v(0x7c01);
    for (int b = 0; b < 0x7c00; ++b) v[b] = half_reference_value(static_cast<uint16_t>(b));
    v[0x7c00] = 65536.0;
    return v;
  }();
  return ladder;
}

// Nearest half by search over the values; a tie goes to the pattern with an even mantissa.
uint16_t half_reference_round(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  const auto& ladder = half_ladder();
  if (a >= ladder.back()) return sign | 0x7c00;
  // First ladder entry > a; the candidates are the one before it and it.
  int hi = 0, lo_bound = 0, hi_bound = 0x7c00;
  while (lo_bound < hi_bound) {
    const int mid = (lo_bound + hi_bound) / 2;
    if (ladder[mid] > a) {
      hi_bound = mid;
    } else {
      lo_bound = mid + 1;
    }
  }
  hi = lo_bound;
  const int lo = hi - 1;
  if (ladder[lo] == a) return static_cast<uint16_t>(sign | lo);
  const double midpoint = (ladder[lo] + ladder[hi]) / 2;  // exact: one more bit than a half
  int pick;
  if (a < midpoint) {
    pick = lo;
  } else if (a > midpoint) {
    pick = hi;
  } else {
    pick = (lo % 2 == 0) ? lo : hi;
  }
  return static_cast<uint16_t>(sign | pick);
}

// --- bfloat16 reference. ---

double bf16_reference_value(uint16_t bits) {
  const int sign = bits >> 15, exponent = (bits >> 7) & 0xff, mantissa = bits & 0x7f;
  double magnitude;
  if (exponent == 0xff) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -133);
  } else {
    magnitude = std::ldexp(static_cast<double>(128 + mantissa), exponent - 134);
  }
  return sign ? -magnitude : magnitude;
}

// Nearest bfloat16 of a finite float: the candidates are the patterns just below and above in
// magnitude (0x7f80 standing for 2^128), compared with their midpoint in double.
uint16_t bf16_reference_round(float x) {
  const uint32_t abs = float_bits(x) & 0x7fffffffu;
  const uint16_t sign = static_cast<uint16_t>((float_bits(x) >> 16) & 0x8000u);
  const uint16_t lo = static_cast<uint16_t>(abs >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double v_lo = bf16_reference_value(lo);
  if (static_cast<double>(bits_float(abs)) == v_lo) return sign | lo;
  const double v_hi = hi == 0x7f80 ? std::ldexp(1.0, 128) : bf16_reference_value(hi);
  const double a = static_cast<double>(bits_float(abs));
  const double midpoint = (v_lo + v_hi) / 2;
  if (a < midpoint) return sign | lo;
  if (a > midpoint) return sign | hi;
  return sign | ((lo % 2 == 0) ? lo : hi);
}

bool half_is_nan(uint16_t b) { return (b & 0x7c00) == 0x7c00 && (b & 0x3ff) != 0; }
bool bf16_is_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// Floats worth checking around every value of a 16-bit format: each midpoint between adjacent
// values and its neighbours one float ulp away, for both signs.
void add_midpoints(const std::vector<double>& ascending, std::vector<float>& out) {
  for (size_t i = 0; i + 1 < ascending.size(); ++i) {
    const float mid = static_cast<float>((ascending[i] + ascending[i + 1]) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      out.push_back(f);
      out.push_back(-f);
    }
  }
}

}  // namespace

TEST_CASE("itemsize, names and categories of every dtype", "[dtype]") {
  const size_t sizes[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8};
  const char* names[] = {"bool",  "int8",    "uint8",    "int16",   "int32",
                         "int64", "float16", "bfloat16", "float32", "float64"};
  for (int i = 0; i < kiln::kNumDTypes; ++i) {
    INFO(names[i]);
    CHECK(kiln::itemsize(kAll[i]) == sizes[i]);
    CHECK(kiln::dtype_name(kAll[i]) == names[i]);
    CHECK(kiln::is_floating(kAll[i]) == (i >= 6));
    CHECK(kiln::is_integer(kAll[i]) == (i >= 1 && i <= 5));
    CHECK(kiln::is_signed(kAll[i]) == (i != 0 && i != 2));
  }
  CHECK(kiln::itemsize(kiln::dtype_of<kiln::Half>()) == sizeof(kiln::Half));
  CHECK(kiln::itemsize(kiln::dtype_of<kiln::BFloat16>()) == sizeof(kiln::BFloat16));
  CHECK(kiln::itemsize(kiln::dtype_of<double>()) == sizeof(double));
  CHECK_THROWS_AS(kiln::itemsize(static_cast<DType>(42)), kiln::DTypeError);
  CHECK_THROWS_WITH(kiln::dtype_name(static_cast<DType>(42)), Catch::StartsWith("[dtype_name]"));
}

TEST_CASE("promote_types matches torch.promote_types", "[dtype]") {
  constexpr DType b1 = DType::Bool, i1 = DType::Int8, u1 = DType::UInt8, i2 = DType::Int16,
                  i4 = DType::Int32, i8 = DType::Int64, f2 = DType::Float16, bf = DType::BFloat16,
                  f4 = DType::Float32, f8 = DType::Float64;
  // Rows and columns in enum order: b1 i1 u1 i2 i4 i8 f2 bf f4 f8.
  constexpr DType expected[10][10] = {
      /* b1 */ {b1, i1, u1, i2, i4, i8, f2, bf, f4, f8},
      /* i1 */ {i1, i1, i2, i2, i4, i8, f2, bf, f4, f8},
      /* u1 */ {u1, i2, u1, i2, i4, i8, f2, bf, f4, f8},
      /* i2 */ {i2, i2, i2, i2, i4, i8, f2, bf, f4, f8},
      /* i4 */ {i4, i4, i4, i4, i4, i8, f2, bf, f4, f8},
      /* i8 */ {i8, i8, i8, i8, i8, i8, f2, bf, f4, f8},
      /* f2 */ {f2, f2, f2, f2, f2, f2, f2, f4, f4, f8},
      /* bf */ {bf, bf, bf, bf, bf, bf, f4, bf, f4, f8},
      /* f4 */ {f4, f4, f4, f4, f4, f4, f4, f4, f4, f8},
      /* f8 */ {f8, f8, f8, f8, f8, f8, f8, f8, f8, f8},
  };
  for (int r = 0; r < 10; ++r) {
    for (int c = 0; c < 10; ++c) {
      INFO(kiln::dtype_name(kAll[r]) << " + " << kiln::dtype_name(kAll[c]));
      CHECK(kiln::promote_types(kAll[r], kAll[c]) == expected[r][c]);
    }
  }
}

TEST_CASE("ResultType ranks dimensioned tensors, zero-dim tensors and scalars", "[dtype]") {
  struct Operand {
    enum Kind { kTensor, kScalar } kind;
    DType dtype;
    int rank;
  };
  auto tensor = [](DType d, int rank) { return Operand{Operand::kTensor, d, rank}; };
  auto scalar = [](DType d) { return Operand{Operand::kScalar, d, 0}; };
  struct Case {
    const char* what;
    std::vector<Operand> operands;
    DType expected;
  };
  const std::vector<Case> cases = {
      {"int8 tensor + int scalar", {tensor(DType::Int8, 1), scalar(DType::Int64)}, DType::Int8},
      {"int32 tensor + float scalar",
       {tensor(DType::Int32, 2), scalar(DType::Float64)},
       DType::Float32},
      {"float16 tensor + float scalar",
       {tensor(DType::Float16, 1), scalar(DType::Float64)},
       DType::Float16},
      {"bool tensor + int scalar", {tensor(DType::Bool, 1), scalar(DType::Int64)}, DType::Int64},
      {"int8 tensor + int32 zero-dim",
       {tensor(DType::Int8, 1), tensor(DType::Int32, 0)},
       DType::Int8},
      {"int32 tensor + float64 zero-dim",
       {tensor(DType::Int32, 3), tensor(DType::Float64, 0)},
       DType::Float64},
      {"bool tensor + bool scalar", {tensor(DType::Bool, 1), scalar(DType::Bool)}, DType::Bool},
      {"uint8 tensor + int scalar", {tensor(DType::UInt8, 1), scalar(DType::Int64)}, DType::UInt8},
      {"float16 tensor + float64 zero-dim",
       {tensor(DType::Float16, 1), tensor(DType::Float64, 0)},
       DType::Float16},
      // Beyond the brief's cases: order does not matter, tiers promote among themselves, and
      // the scalar kind is all that counts.
      {"float scalar + int32 tensor",
       {scalar(DType::Float32), tensor(DType::Int32, 1)},
       DType::Float32},
      {"int8 scalar kind counts as int64", {scalar(DType::Int8)}, DType::Int64},
      {"float16 scalar kind counts as float32", {scalar(DType::Float16)}, DType::Float32},
      {"int scalar + float scalar", {scalar(DType::Int64), scalar(DType::Float64)}, DType::Float32},
      {"int8 + uint8 tensors", {tensor(DType::Int8, 1), tensor(DType::UInt8, 2)}, DType::Int16},
      {"zero-dim tensors alone", {tensor(DType::Int8, 0), tensor(DType::UInt8, 0)}, DType::Int16},
      {"float16 zero-dim + float scalar",
       {tensor(DType::Float16, 0), scalar(DType::Float64)},
       DType::Float16},
      {"int32 tensor + float16 zero-dim + float scalar",
       {tensor(DType::Int32, 1), tensor(DType::Float16, 0), scalar(DType::Float64)},
       DType::Float16},
      {"bool tensor + int8 zero-dim",
       {tensor(DType::Bool, 1), tensor(DType::Int8, 0)},
       DType::Int8},
      {"bfloat16 tensor + float16 zero-dim",
       {tensor(DType::BFloat16, 1), tensor(DType::Float16, 0)},
       DType::BFloat16},
      {"float16 + bfloat16 tensors",
       {tensor(DType::Float16, 1), tensor(DType::BFloat16, 1)},
       DType::Float32},
      {"nothing", {}, DType::Float32},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    kiln::ResultType state;
    for (const auto& op : c.operands) {
      if (op.kind == Operand::kTensor) {
        state.add_tensor(op.dtype, op.rank);
      } else {
        state.add_scalar(op.dtype);
      }
    }
    CHECK(kiln::dtype_name(state.result()) == kiln::dtype_name(c.expected));
  }
  kiln::ResultType state;
  CHECK_THROWS_AS(state.add_tensor(DType::Float32, -1), kiln::ValueError);
}

TEST_CASE("half_bits_to_float decodes all 65536 patterns exactly", "[dtype]") {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const double expected = half_reference_value(bits);
    const float got = kiln::half_bits_to_float(bits);
    if (std::isnan(expected)) {
      if (!std::isnan(got)) FAIL("pattern " << b << " is NaN but decodes to " << got);
      if (std::signbit(got) != (b >= 0x8000)) FAIL("pattern " << b << " loses the NaN sign");
      const uint16_t back = kiln::float_to_half_bits(got);
      if (!half_is_nan(back)) FAIL("NaN pattern " << b << " comes back as " << back);
      if ((back & 0x8000) != (b & 0x8000)) FAIL("NaN pattern " << b << " loses its sign");
      continue;
    }
    // Equality in double also distinguishes nothing for +-0, so check the sign separately.
    if (static_cast<double>(got) != expected || std::signbit(got) != (b >= 0x8000)) {
      FAIL("pattern " << b << " decodes to " << got << ", expected " << expected);
    }
    if (kiln::float_to_half_bits(got) != bits) FAIL("pattern " << b << " does not round-trip");
  }
  SUCCEED();
}

TEST_CASE("float_to_half_bits rounds to nearest even", "[dtype]") {
  std::vector<float> inputs;
  std::vector<double> ascending(half_ladder().begin(), half_ladder().end());
  add_midpoints(ascending, inputs);  // every halfway case, including 65520 and 2^-25
  for (float f : {0.0f, 1.0f, 65504.0f, 65519.996f, 65520.0f, 65536.0f, 1e10f, 5.9604645e-8f,
                  2.9802322e-8f, 2.9802326e-8f, 1e-30f, std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::max(), INFINITY}) {
    inputs.push_back(f);
    inputs.push_back(-f);
  }
  // Every float below the smallest half normal with a stride, then random bit patterns over the
  // whole float range (NaNs are checked separately below).
  for (uint32_t b = 0x33000000u; b < 0x38800000u; b += 0x35) inputs.push_back(bits_float(b));
  std::mt19937 rng(12345);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_int_distribution<uint32_t> near_half_range(0x30000000u, 0x48000000u);
  for (int i = 0; i < 1000000; ++i) {
    inputs.push_back(bits_float(any_bits(rng)));
    inputs.push_back(bits_float(near_half_range(rng) | (any_bits(rng) & 0x80000000u)));
  }
  size_t mismatches = 0;
  for (float f : inputs) {
    if (std::isnan(f)) {
      const uint16_t h = kiln::float_to_half_bits(f);
      if (!half_is_nan(h) || (h >> 15) != (float_bits(f) >> 31)) {
        FAIL("NaN " << std::hex << float_bits(f) << " converts to " << h);
      }
      continue;
    }
    const uint16_t got = kiln::float_to_half_bits(f);
    const uint16_t want = half_reference_round(f);
    if (got != want && ++mismatches <= 10) {
      FAIL_CHECK("float bits 0x" << std::hex << float_bits(f) << " (" << f << ") gives 0x" << got
                                 << ", expected 0x" << want);
    }
  }
  CHECK(mismatches == 0);
}

#if defined(__FLT16_MANT_DIG__)
TEST_CASE("float16 conversions agree with the compiler's _Float16", "[dtype]") {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float ours = kiln::half_bits_to_float(bits);
    const float theirs = static_cast<float>(std::bit_cast<_Float16>(bits));
    if (std::isnan(theirs) ? !std::isnan(ours) : float_bits(ours) != float_bits(theirs)) {
      FAIL("pattern " << b << " decodes to " << ours << ", _Float16 gives " << theirs);
    }
  }
  std::mt19937 rng(777);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 2000000; ++i) {
    const float f = bits_float(any_bits(rng) >> (i % 2));  // half the draws in small magnitudes
    if (std::isnan(f)) continue;
    const uint16_t ours = kiln::float_to_half_bits(f);
    const auto theirs = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    if (ours != theirs) FAIL("float " << f << " gives " << ours << ", _Float16 gives " << theirs);
  }
  SUCCEED();
}
#endif

TEST_CASE("bfloat16_bits_to_float decodes all 65536 patterns exactly", "[dtype]") {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const double expected = bf16_reference_value(bits);
    const float got = kiln::bfloat16_bits_to_float(bits);
    if (std::isnan(expected)) {
      if (!std::isnan(got)) FAIL("pattern " << b << " is NaN but decodes to " << got);
      const uint16_t back = kiln::float_to_bfloat16_bits(got);
      if (!bf16_is_nan(back) || (back & 0x8000) != (b & 0x8000) || (back & 0x40) == 0) {
        FAIL("NaN pattern " << b << " comes back as " << back);
      }
      continue;
    }
    if (static_cast<double>(got) != expected || std::signbit(got) != (b >= 0x8000)) {
      FAIL("pattern " << b << " decodes to " << got << ", expected " << expected);
    }
    if (kiln::float_to_bfloat16_bits(got) != bits) FAIL("pattern " << b << " does not round-trip");
  }
  SUCCEED();
}

TEST_CASE("float_to_bfloat16_bits rounds to nearest even", "[dtype]") {
  std::vector<float> inputs;
  // Every halfway case (low 16 bits exactly 0x8000) and its neighbours, for all patterns.
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    const uint32_t mid = (hi << 16) | 0x8000u;
    for (uint32_t b : {mid, mid - 1, mid + 1, hi << 16, (hi << 16) | 0xffffu}) {
      inputs.push_back(bits_float(b));
    }
  }
  std::mt19937 rng(4242);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 2000000; ++i) inputs.push_back(bits_float(any_bits(rng)));
  size_t mismatches = 0;
  for (float f : inputs) {
    const uint16_t got = kiln::float_to_bfloat16_bits(f);
    if (std::isnan(f)) {
      // Must stay NaN with the sign kept, and quiet, even when the payload was only in the low
      // bits that truncation drops.
      if (!bf16_is_nan(got) || (got >> 15) != (float_bits(f) >> 31) || (got & 0x40) == 0) {
        FAIL("NaN 0x" << std::hex << float_bits(f) << " converts to 0x" << got);
      }
      continue;
    }
    const uint16_t want = bf16_reference_round(f);
    if (got != want && ++mismatches <= 10) {
      FAIL_CHECK("float bits 0x" << std::hex << float_bits(f) << " (" << f << ") gives 0x" << got
                                 << ", expected 0x" << want);
    }
  }
  CHECK(mismatches == 0);
  CHECK(kiln::float_to_bfloat16_bits(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(kiln::float_to_bfloat16_bits(-INFINITY) == 0xff80);
  CHECK(kiln::float_to_bfloat16_bits(bits_float(0x7f800001u)) == 0x7fc0);  // sNaN, low payload
}

TEST_CASE("Half and BFloat16 storage types convert through float", "[dtype]") {
  CHECK(static_cast<float>(kiln::Half(1.5f)) == 1.5f);
  CHECK(kiln::Half(65520.0f).bits == 0x7c00);
  CHECK(kiln::Half(65519.0f).bits == 0x7bff);
  CHECK(kiln::Half(-0.0f).bits == 0x8000);
  CHECK(kiln::Half::from_bits(0x0001) == std::ldexp(1.0f, -24));
  CHECK(kiln::Half(std::ldexp(1.0f, -25)).bits == 0x0000);  // tie to even: zero
  CHECK(kiln::Half(std::ldexp(3.0f, -25)).bits == 0x0002);  // tie to even: 2 units
  CHECK(static_cast<float>(kiln::BFloat16(3.0f)) == 3.0f);
  CHECK(kiln::BFloat16(bits_float(0x3f808000u)).bits == 0x3f80);  // tie, even stays
  CHECK(kiln::BFloat16(bits_float(0x3f818000u)).bits == 0x3f82);  // tie, odd rounds up
  CHECK(kiln::BFloat16::from_bits(0x3f80) == 1.0f);
}
