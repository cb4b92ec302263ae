#include "scalar.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

namespace kiln {

DType Scalar::category_dtype() const {
  switch (kind_) {
    case Kind::Bool: return DType::Bool;
    case Kind::Int: return DType::Int64;
    case Kind::Float: break;
  }
  return DType::Float64;
}

int64_t Scalar::to_int64() const {
  if (kind_ != Kind::Float) return i_;
  if (std::isnan(f_)) return 0;
  if (f_ >= 9223372036854775807.0) return std::numeric_limits<int64_t>::max();
  if (f_ <= -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(f_);
}

std::string Scalar::str() const {
  switch (kind_) {
    case Kind::Bool: return i_ ? "true" : "false";
    case Kind::Int: return std::to_string(i_);
    case Kind::Float: break;
  }
  if (std::isnan(f_)) return "nan";
  if (std::isinf(f_)) return f_ > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os.precision(17);
  os << f_;
  std::string s = os.str();
  // Prefer the shortest form that round-trips, as Python prints floats.
  for (int p = 1; p < 17; ++p) {
    std::ostringstream t;
    t.precision(p);
    t << f_;
    if (std::stod(t.str()) == f_) {
      s = t.str();
      break;
    }
  }
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

bool operator==(const Scalar& a, const Scalar& b) {
  if (a.kind_ != b.kind_) return false;
  if (a.kind_ == Scalar::Kind::Float) {
    // Bitwise so that NaN fills compare equal to themselves (structural hashing).
    return std::memcmp(&a.f_, &b.f_, sizeof(double)) == 0;
  }
  return a.i_ == b.i_;
}

}  // namespace kiln
