#pragma once
// Integer index expressions over the coordinates of a loop domain. They are the index maps
// of the reindex and reindex-reduce meta-ops: `i0*2 + 1`, `idx1[i0, i1]` (a read of an
// integer index tensor). Expressions are immutable trees shared between nodes; builders
// fold constants and drop identities so dumps and generated code stay readable.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln {

/// An integer expression over loop coordinates i0, i1, ... and index-tensor reads.
class IndexExpr {
 public:
  enum class Kind : uint8_t { Const, Var, Add, Mul, FloorDiv, Mod, Min, Max, Load, Param };

  /// The constant 0.
  IndexExpr();
  /// An integer constant.
  static IndexExpr constant(int64_t value);
  /// Coordinate `dim` of the loop domain (printed `i<dim>`).
  static IndexExpr var(int dim);
  /// Integer argument `slot` of a generated kernel (printed `p<slot>`); only kernel IR uses
  /// it, so that sizes and offsets are arguments rather than part of a kernel's source.
  static IndexExpr param(int slot);
  /// The value of the node's integer input `input` (>= 1) at `coords`, printed `idx1[...]`.
  static IndexExpr load(int input, std::vector<IndexExpr> coords);

  Kind kind() const;
  /// Const: the value; Var: the dimension; Load: the input number; Param: the slot.
  int64_t value() const;
  /// Operands of Add/Mul/FloorDiv/Mod/Min/Max, or the coordinates of a Load.
  const std::vector<IndexExpr>& args() const;
  bool is_const() const { return kind() == Kind::Const; }
  /// True when the expression reads an index tensor anywhere.
  bool has_load() const;
  /// Human-readable form, e.g. "i0*3 + i1".
  std::string str() const;
  /// Structural hash and equality.
  size_t hash() const;
  friend bool operator==(const IndexExpr& a, const IndexExpr& b);

  /// Evaluates with coordinates `coords`; `load(input, coords)` supplies index-tensor reads.
  template <typename LoadFn>
  int64_t evaluate(const int64_t* coords, LoadFn&& load) const;

  friend IndexExpr operator+(const IndexExpr& a, const IndexExpr& b);
  friend IndexExpr operator-(const IndexExpr& a, const IndexExpr& b);
  friend IndexExpr operator*(const IndexExpr& a, const IndexExpr& b);
  /// Floor division (rounds toward -inf, as Python's //); divisor must be > 0.
  friend IndexExpr floordiv(const IndexExpr& a, const IndexExpr& b);
  /// Floor modulo (result has the divisor's sign); divisor must be > 0.
  friend IndexExpr mod(const IndexExpr& a, const IndexExpr& b);
  friend IndexExpr min(const IndexExpr& a, const IndexExpr& b);
  friend IndexExpr max(const IndexExpr& a, const IndexExpr& b);

 private:
  struct Rep;
  explicit IndexExpr(std::shared_ptr<const Rep> rep) : rep_(std::move(rep)) {}
  static IndexExpr make(Kind kind, int64_t value, std::vector<IndexExpr> args);
  std::shared_ptr<const Rep> rep_;
};

struct IndexExpr::Rep {
  Kind kind;
  int64_t value;
  std::vector<IndexExpr> args;
  size_t hash;
};

inline IndexExpr::Kind IndexExpr::kind() const { return rep_->kind; }
inline int64_t IndexExpr::value() const { return rep_->value; }
inline const std::vector<IndexExpr>& IndexExpr::args() const { return rep_->args; }
inline size_t IndexExpr::hash() const { return rep_->hash; }

/// Floor division and modulo on int64, as Python defines them.
inline int64_t floordiv_i64(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
inline int64_t floormod_i64(int64_t a, int64_t b) {
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

template <typename LoadFn>
int64_t IndexExpr::evaluate(const int64_t* coords, LoadFn&& load) const {
  const Rep& r = *rep_;
  switch (r.kind) {
    case Kind::Const: return r.value;
    case Kind::Var: return coords[r.value];
    case Kind::Param: return 0;  // kernel IR only; never evaluated on the host
    case Kind::Load: {
      int64_t at[8];
      std::vector<int64_t> big;
      int64_t* p = at;
      if (r.args.size() > 8) {
        big.resize(r.args.size());
        p = big.data();
      }
      for (size_t k = 0; k < r.args.size(); ++k) p[k] = r.args[k].evaluate(coords, load);
      return load(static_cast<int>(r.value), p);
    }
    default: break;
  }
  int64_t a = r.args[0].evaluate(coords, load);
  int64_t b = r.args[1].evaluate(coords, load);
  switch (r.kind) {
    case Kind::Add: return a + b;
    case Kind::Mul: return a * b;
    case Kind::FloorDiv: return floordiv_i64(a, b);
    case Kind::Mod: return floormod_i64(a, b);
    case Kind::Min: return a < b ? a : b;
    case Kind::Max: return a > b ? a : b;
    default: return 0;
  }
}

}  // namespace kiln
