#pragma once
// A C++ number carried by the graph (fill values, scalar operands) without losing int64
// precision or the bool/int/float category that type promotion needs.
#include <cstdint>
#include <string>
#include <type_traits>

#include "dtype.h"

namespace kiln {

/// A bool, integer or floating-point number.
class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Int, Float };

  Scalar() : kind_(Kind::Int), i_(0) {}
  Scalar(bool v) : kind_(Kind::Bool), i_(v) {}
  template <typename T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  Scalar(T v) : kind_(Kind::Int), i_(static_cast<int64_t>(v)) {}
  template <typename T>
    requires std::is_floating_point_v<T>
  Scalar(T v) : kind_(Kind::Float), f_(static_cast<double>(v)) {}
  Scalar(Half v) : kind_(Kind::Float), f_(static_cast<float>(v)) {}
  Scalar(BFloat16 v) : kind_(Kind::Float), f_(static_cast<float>(v)) {}

  Kind kind() const { return kind_; }
  /// The dtype that stands for this scalar's category in promotion: bool, int64 or float64.
  DType category_dtype() const;
  double to_double() const { return kind_ == Kind::Float ? f_ : static_cast<double>(i_); }
  /// Truncates floats toward zero, saturating at the int64 range (NaN gives 0).
  int64_t to_int64() const;
  bool to_bool() const { return kind_ == Kind::Float ? f_ != 0.0 : i_ != 0; }
  /// Shortest text that reads back the same value: "2", "0.5", "true", "inf".
  std::string str() const;
  friend bool operator==(const Scalar& a, const Scalar& b);

 private:
  Kind kind_;
  union {
    int64_t i_;
    double f_;
  };
};

}  // namespace kiln
