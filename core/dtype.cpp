// Dtype properties, PyTorch's promotion rules and the float16 / bfloat16 conversions.
//
// The conversions are plain integer manipulation of IEEE bit patterns: they must give the same
// bits on every host compiler and in every floating-point environment, and they are the
// reference the generated kernels are tested against, so they use neither _Float16 nor F16C.
#include "core/dtype.h"

#include <bit>

#include "core/error.h"

namespace kiln {
namespace {

// Properties indexed by the enum value; the order must follow the enum.
struct DTypeInfo {
  std::string_view name;
  size_t itemsize;
};
constexpr DTypeInfo kInfo[kNumDTypes] = {
    {"bool", 1},  {"int8", 1},    {"uint8", 1},    {"int16", 2},   {"int32", 4},
    {"int64", 8}, {"float16", 2}, {"bfloat16", 2}, {"float32", 4}, {"float64", 8},
};

// An out-of-range enum value can only come from a cast of corrupt data (a bad file header, a
// stray integer); say so instead of reading past the table.
const DTypeInfo& info(DType dtype, const char* op) {
  auto index = static_cast<int>(dtype);
  if (index < 0 || index >= kNumDTypes) {
    throw DTypeError(std::string("[") + op + "] invalid dtype value " + std::to_string(index) +
                     ", expected 0.." + std::to_string(kNumDTypes - 1));
  }
  return kInfo[index];
}

constexpr int rank_of(DType dtype) { return static_cast<int>(dtype); }

}  // namespace

size_t itemsize(DType dtype) { return info(dtype, "itemsize").itemsize; }

std::string_view dtype_name(DType dtype) { return info(dtype, "dtype_name").name; }

bool is_floating(DType dtype) {
  return dtype == DType::Float16 || dtype == DType::BFloat16 || dtype == DType::Float32 ||
         dtype == DType::Float64;
}

bool is_integer(DType dtype) {
  return dtype == DType::Int8 || dtype == DType::UInt8 || dtype == DType::Int16 ||
         dtype == DType::Int32 || dtype == DType::Int64;
}

bool is_signed(DType dtype) {
  return is_floating(dtype) || (is_integer(dtype) && dtype != DType::UInt8);
}

// Written as rules rather than a 10x10 table so that the test's literal table is an independent
// check. The enum order is the lattice within each category, except that uint8 sits beside
// int8 and needs the signed/unsigned rule.
DType promote_types(DType a, DType b) {
  info(a, "promote_types");
  info(b, "promote_types");
  if (a == b) return a;
  if (a == DType::Bool) return b;
  if (b == DType::Bool) return a;
  const bool float_a = is_floating(a), float_b = is_floating(b);
  if (float_a != float_b) return float_a ? a : b;
  if (float_a) {
    // Neither half type holds the other: float16 has more mantissa, bfloat16 more range.
    const bool halves = (a == DType::Float16 || a == DType::BFloat16) &&
                        (b == DType::Float16 || b == DType::BFloat16);
    if (halves) return DType::Float32;
    return rank_of(a) > rank_of(b) ? a : b;
  }
  // Both integers. uint8 with int8 needs int16 to hold 0..255 and -128..-1; with any wider
  // signed type the wider type already holds it.
  if (a == DType::UInt8 || b == DType::UInt8) {
    const DType other = a == DType::UInt8 ? b : a;
    return other == DType::Int8 ? DType::Int16 : other;
  }
  return rank_of(a) > rank_of(b) ? a : b;
}

namespace {

// promote_types where kNone means "no operand in this tier yet".
int promote_skip_none(int a, int b) {
  if (a < 0) return b;
  if (b < 0) return a;
  return static_cast<int>(promote_types(static_cast<DType>(a), static_cast<DType>(b)));
}

// PyTorch's combine_categories: a lower tier only matters when it is of a higher category than
// the higher tier (bool < integer < floating); within the same category the higher tier's
// dtype is kept as is, so int8_tensor + 1000 stays int8.
int combine_categories(int higher, int lower) {
  if (higher >= 0 && is_floating(static_cast<DType>(higher))) return higher;
  if (higher == static_cast<int>(DType::Bool) ||
      (lower >= 0 && is_floating(static_cast<DType>(lower)))) {
    return promote_skip_none(higher, lower);
  }
  return higher >= 0 ? higher : lower;
}

}  // namespace

void ResultType::add_tensor(DType dtype, int rank) {
  info(dtype, "result_type");
  if (rank < 0) {
    throw ValueError("[result_type] tensor operand of dtype " + std::string(dtype_name(dtype)) +
                     " has rank " + std::to_string(rank) + ", expected rank >= 0");
  }
  int& tier = rank > 0 ? dim_ : zero_dim_;
  tier = promote_skip_none(tier, static_cast<int>(dtype));
}

void ResultType::add_scalar(DType scalar_kind) {
  info(scalar_kind, "result_type");
  // A C++ scalar carries only its kind: PyTorch wraps a double as the default dtype (float32)
  // and an integer as int64, whatever C++ type it came from.
  DType dtype = DType::Bool;
  if (is_floating(scalar_kind)) {
    dtype = DType::Float32;
  } else if (is_integer(scalar_kind)) {
    dtype = DType::Int64;
  }
  scalar_ = promote_skip_none(scalar_, static_cast<int>(dtype));
}

DType ResultType::result() const {
  const int combined = combine_categories(dim_, combine_categories(zero_dim_, scalar_));
  return combined >= 0 ? static_cast<DType>(combined) : DType::Float32;
}

// float32 layout: 1 sign, 8 exponent (bias 127), 23 mantissa.
// float16 layout: 1 sign, 5 exponent (bias 15), 10 mantissa; 13 mantissa bits are dropped.
uint16_t float_to_half_bits(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (f >> 16) & 0x8000u;
  const uint32_t abs = f & 0x7fffffffu;

  if (abs > 0x7f800000u) {
    // Keep the top payload bits and force the quiet bit, so a NaN whose payload lives only in
    // the dropped low bits cannot turn into inf.
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x03ffu));
  }
  // 65520 is halfway between the largest half (65504) and 2^16; the tie goes to the even
  // mantissa, which is the carry into the inf exponent. Everything above it, inf included,
  // overflows.
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);

  if (abs >= 0x38800000u) {
    // Normal half (>= 2^-14). Rebias the exponent by 127 - 15 = 112, then round the 13 dropped
    // bits to nearest even: adding 0xfff plus the kept lowest bit carries exactly when the
    // dropped part is above half, or exactly half with an odd kept part. A carry out of the
    // mantissa correctly bumps the exponent, and the overflow check above keeps it below inf.
    const uint32_t odd = (abs >> 13) & 1u;
    const uint32_t rounded = abs - (112u << 23) + 0x0fffu + odd;
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }

  // Subnormal half, in units of 2^-24. A float subnormal (biased exponent 0) is below 2^-126,
  // far under half of the smallest half subnormal, so it rounds to a signed zero.
  const uint32_t exponent = abs >> 23;
  if (exponent == 0) return static_cast<uint16_t>(sign);
  // value = mantissa * 2^(exponent-150) = mantissa / 2^shift units of 2^-24, with shift >= 14.
  const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;
  // Past 24 the value is below 2^-25 (mantissa < 2^24 <= halfway point): rounds to zero.
  if (shift > 24) return static_cast<uint16_t>(sign);
  uint32_t quotient = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (remainder > halfway || (remainder == halfway && (quotient & 1u))) {
    ++quotient;  // may reach 0x400, which is the encoding of the smallest normal: still right
  }
  return static_cast<uint16_t>(sign | quotient);
}

float half_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x03ffu;
  uint32_t f;
  if (exponent == 0x1f) {
    // inf stays inf; a NaN keeps its payload (and thus its quiet/signaling bit) in the top bits.
    f = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    f = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    f = sign;
  } else {
    // Half subnormals are normal floats: shift the leading one up to the implicit position,
    // lowering the exponent once per shift. 113 is the float exponent of 2^-14.
    uint32_t float_exponent = 113;
    while ((mantissa & 0x0400u) == 0) {
      mantissa <<= 1;
      --float_exponent;
    }
    f = sign | (float_exponent << 23) | ((mantissa & 0x03ffu) << 13);
  }
  return std::bit_cast<float>(f);
}

// bfloat16 is the top half of a float32, so only the rounding of the low 16 bits is needed.
uint16_t float_to_bfloat16_bits(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) {
    // Truncating could drop the whole payload and give inf, and rounding could carry into the
    // sign; set the quiet bit instead.
    return static_cast<uint16_t>((f >> 16) | 0x0040u);
  }
  // Round to nearest even as for half; a carry out of the largest finite value gives inf.
  const uint32_t odd = (f >> 16) & 1u;
  return static_cast<uint16_t>((f + 0x7fffu + odd) >> 16);
}

float bfloat16_bits_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

}  // namespace kiln
