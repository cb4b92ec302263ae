#include "index_expr.h"

#include <functional>

namespace kiln {
namespace {

size_t mix(size_t seed, size_t v) { return seed ^ (v + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2)); }

const char* op_text(IndexExpr::Kind k) {
  switch (k) {
    case IndexExpr::Kind::Add: return " + ";
    case IndexExpr::Kind::Mul: return "*";
    case IndexExpr::Kind::FloorDiv: return " // ";
    case IndexExpr::Kind::Mod: return " % ";
    default: return "";
  }
}

}  // namespace

IndexExpr::IndexExpr() : IndexExpr(constant(0)) {}

IndexExpr IndexExpr::make(Kind kind, int64_t value, std::vector<IndexExpr> args) {
  size_t h = mix(static_cast<size_t>(kind), std::hash<int64_t>{}(value));
  for (const IndexExpr& a : args) h = mix(h, a.hash());
  return IndexExpr(std::make_shared<const Rep>(Rep{kind, value, std::move(args), h}));
}

IndexExpr IndexExpr::constant(int64_t value) { return make(Kind::Const, value, {}); }
IndexExpr IndexExpr::var(int dim) { return make(Kind::Var, dim, {}); }
IndexExpr IndexExpr::param(int slot) { return make(Kind::Param, slot, {}); }
IndexExpr IndexExpr::load(int input, std::vector<IndexExpr> coords) {
  return make(Kind::Load, input, std::move(coords));
}

bool IndexExpr::has_load() const {
  if (kind() == Kind::Load) return true;
  for (const IndexExpr& a : args())
    if (a.has_load()) return true;
  return false;
}

bool operator==(const IndexExpr& a, const IndexExpr& b) {
  if (a.rep_ == b.rep_) return true;
  if (a.hash() != b.hash() || a.kind() != b.kind() || a.value() != b.value() ||
      a.args().size() != b.args().size())
    return false;
  for (size_t i = 0; i < a.args().size(); ++i)
    if (!(a.args()[i] == b.args()[i])) return false;
  return true;
}

IndexExpr operator+(const IndexExpr& a, const IndexExpr& b) {
  if (a.is_const() && b.is_const()) return IndexExpr::constant(a.value() + b.value());
  if (a.is_const() && a.value() == 0) return b;
  if (b.is_const() && b.value() == 0) return a;
  return IndexExpr::make(IndexExpr::Kind::Add, 0, {a, b});
}

IndexExpr operator-(const IndexExpr& a, const IndexExpr& b) {
  if (b.is_const()) return a + IndexExpr::constant(-b.value());
  return a + b * IndexExpr::constant(-1);
}

IndexExpr operator*(const IndexExpr& a, const IndexExpr& b) {
  if (a.is_const() && b.is_const()) return IndexExpr::constant(a.value() * b.value());
  if ((a.is_const() && a.value() == 0) || (b.is_const() && b.value() == 0))
    return IndexExpr::constant(0);
  if (a.is_const() && a.value() == 1) return b;
  if (b.is_const() && b.value() == 1) return a;
  // Constants go right so "i0*3" reads naturally.
  if (a.is_const()) return IndexExpr::make(IndexExpr::Kind::Mul, 0, {b, a});
  return IndexExpr::make(IndexExpr::Kind::Mul, 0, {a, b});
}

IndexExpr floordiv(const IndexExpr& a, const IndexExpr& b) {
  if (a.is_const() && b.is_const()) return IndexExpr::constant(floordiv_i64(a.value(), b.value()));
  if (b.is_const() && b.value() == 1) return a;
  return IndexExpr::make(IndexExpr::Kind::FloorDiv, 0, {a, b});
}

IndexExpr mod(const IndexExpr& a, const IndexExpr& b) {
  if (a.is_const() && b.is_const()) return IndexExpr::constant(floormod_i64(a.value(), b.value()));
  if (b.is_const() && b.value() == 1) return IndexExpr::constant(0);
  return IndexExpr::make(IndexExpr::Kind::Mod, 0, {a, b});
}

IndexExpr min(const IndexExpr& a, const IndexExpr& b) {
  if (a.is_const() && b.is_const()) return IndexExpr::constant(std::min(a.value(), b.value()));
  return IndexExpr::make(IndexExpr::Kind::Min, 0, {a, b});
}

IndexExpr max(const IndexExpr& a, const IndexExpr& b) {
  if (a.is_const() && b.is_const()) return IndexExpr::constant(std::max(a.value(), b.value()));
  return IndexExpr::make(IndexExpr::Kind::Max, 0, {a, b});
}

std::string IndexExpr::str() const {
  switch (kind()) {
    case Kind::Const: return std::to_string(value());
    case Kind::Var: return "i" + std::to_string(value());
    case Kind::Param: return "p" + std::to_string(value());
    case Kind::Load: {
      std::string s = "idx" + std::to_string(value()) + "[";
      for (size_t k = 0; k < args().size(); ++k) s += (k ? ", " : "") + args()[k].str();
      return s + "]";
    }
    case Kind::Min: return "min(" + args()[0].str() + ", " + args()[1].str() + ")";
    case Kind::Max: return "max(" + args()[0].str() + ", " + args()[1].str() + ")";
    default: break;
  }
  auto operand = [&](const IndexExpr& e) {
    bool wrap = (kind() != Kind::Add && (e.kind() == Kind::Add)) ||
                (kind() == Kind::Mul && (e.kind() == Kind::FloorDiv || e.kind() == Kind::Mod));
    return wrap ? "(" + e.str() + ")" : e.str();
  };
  if (kind() == Kind::Add && args()[1].is_const() && args()[1].value() < 0)
    return operand(args()[0]) + " - " + std::to_string(-args()[1].value());
  return operand(args()[0]) + op_text(kind()) + operand(args()[1]);
}

}  // namespace kiln
