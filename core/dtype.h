#pragma once
// Element types, their sizes and names, PyTorch-style type promotion, and the float16 /
// bfloat16 storage types with round-to-nearest-even conversion.
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

namespace kiln {

/// Element type of a tensor. The order is the promotion lattice inside each category.
enum class DType : uint8_t {
  Bool,
  Int8,
  UInt8,
  Int16,
  Int32,
  Int64,
  Float16,
  BFloat16,
  Float32,
  Float64,
};
inline constexpr int kNumDTypes = 10;

/// Bytes per element.
size_t itemsize(DType dtype);
/// Lower-case name as PyTorch prints it: "float32", "int64", "bool", ...
std::string_view dtype_name(DType dtype);
/// Prints dtype_name(): `std::cout << t.dtype()` shows "float32".
std::ostream& operator<<(std::ostream& os, DType dtype);
/// True for float16, bfloat16, float32, float64.
bool is_floating(DType dtype);
/// True for int8..int64 and uint8 (not bool).
bool is_integer(DType dtype);
/// True for signed integers and floats.
bool is_signed(DType dtype);

/// promote_types(a, b) exactly as torch.promote_types: the smallest type that holds both
/// (int8 + uint8 -> int16, float16 + bfloat16 -> float32, bool + anything -> the other).
DType promote_types(DType a, DType b);

/// PyTorch's three-tier result type: operands with dimensions outrank zero-dimensional
/// tensors, which outrank C++ scalars ("wrapped numbers"); a lower tier only wins when it
/// is of a higher category (bool < integer < floating). A float scalar counts as
/// float32 (the default dtype), an integer scalar as int64, a bool as bool.
class ResultType {
 public:
  /// Adds a tensor operand of the given rank.
  void add_tensor(DType dtype, int rank);
  /// Adds a C++ scalar operand (a weak, "wrapped" number) of the given kind.
  void add_scalar(DType scalar_kind);
  /// The promoted dtype; Float32 if nothing was added.
  DType result() const;

 private:
  static constexpr int kNone = -1;
  int dim_ = kNone, zero_dim_ = kNone, scalar_ = kNone;
};

/// IEEE binary16 conversions, round to nearest even; NaN stays NaN, overflow goes to inf.
uint16_t float_to_half_bits(float value);
float half_bits_to_float(uint16_t bits);
/// bfloat16 conversions, round to nearest even; NaN stays a (quiet) NaN.
uint16_t float_to_bfloat16_bits(float value);
float bfloat16_bits_to_float(uint16_t bits);

/// float16 storage type: arithmetic happens in float32.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float value) : bits(float_to_half_bits(value)) {}
  operator float() const { return half_bits_to_float(bits); }
  static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

/// bfloat16 storage type: arithmetic happens in float32.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float value) : bits(float_to_bfloat16_bits(value)) {}
  operator float() const { return bfloat16_bits_to_float(bits); }
  static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

/// The DType of a C++ element type (bool, int8_t, ..., Half, BFloat16, float, double).
template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<bool>() { return DType::Bool; }
template <> constexpr DType dtype_of<int8_t>() { return DType::Int8; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::UInt8; }
template <> constexpr DType dtype_of<int16_t>() { return DType::Int16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::Int32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::Int64; }
template <> constexpr DType dtype_of<Half>() { return DType::Float16; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::BFloat16; }
template <> constexpr DType dtype_of<float>() { return DType::Float32; }
template <> constexpr DType dtype_of<double>() { return DType::Float64; }

/// Calls fn(T{}) with the C++ element type of dtype; the one switch over dtypes.
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Bool: return fn(bool{});
    case DType::Int8: return fn(int8_t{});
    case DType::UInt8: return fn(uint8_t{});
    case DType::Int16: return fn(int16_t{});
    case DType::Int32: return fn(int32_t{});
    case DType::Int64: return fn(int64_t{});
    case DType::Float16: return fn(Half{});
    case DType::BFloat16: return fn(BFloat16{});
    case DType::Float32: return fn(float{});
    case DType::Float64: break;
  }
  return fn(double{});
}

}  // namespace kiln
