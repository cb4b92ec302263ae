// Expression printing shared by the C++ and CUDA printers (see printer_common.h). Integer
// values are kept in i64 and wrapped to their dtype after every op, floats in float (double
// for float64) and rounded through float16/bfloat16 after every op of those dtypes, so each
// op rounds exactly where the reference evaluator stores.
#include "printer_common.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "../ops/elementwise.h"

namespace kiln::jit {

DType accumulator_dtype(const KernelIR& ir) {
  if (!is_floating(ir.out_dtype)) return DType::Int64;
  if (ir.kind == KernelIR::Kind::Scatter || ir.out_dtype == DType::Float64) return DType::Float64;
  return DType::Float32;
}

namespace printing {

const Dialect kCppDialect = {"__builtin_inff()", "__builtin_inf()", "__builtin_nanf(\"\")",
                             "__builtin_nan(\"\")", "__builtin_bit_cast(double, "};
const Dialect kCudaDialect = {
    "__int_as_float(0x7f800000)", "__longlong_as_double(0x7ff0000000000000LL)",
    "__int_as_float(0x7fc00000)", "__longlong_as_double(0x7ff8000000000000LL)",
    "__longlong_as_double("};

std::string compute_type(DType t) {
  switch (t) {
    case DType::Float16:
    case DType::BFloat16:
    case DType::Float32:
      return "float";
    case DType::Float64:
      return "double";
    default:
      return "i64";
  }
}

std::string storage_type(DType t) {
  switch (t) {
    case DType::Bool:
      return "unsigned char";
    case DType::Int8:
      return "signed char";
    case DType::UInt8:
      return "unsigned char";
    case DType::Int16:
      return "short";
    case DType::Int32:
      return "int";
    case DType::Int64:
      return "i64";
    case DType::Float16:
    case DType::BFloat16:
      return "u16";
    case DType::Float32:
      return "float";
    case DType::Float64:
      return "double";
  }
  return "i64";
}

// Brings a compute-type expression to the values representable in `t`.
std::string normalize(DType t, const std::string& e) {
  switch (t) {
    case DType::Bool:
      return "(i64)((" + e + ") != 0)";
    case DType::Int8:
      return "(i64)(signed char)(" + e + ")";
    case DType::UInt8:
      return "(i64)(unsigned char)(" + e + ")";
    case DType::Int16:
      return "(i64)(short)(" + e + ")";
    case DType::Int32:
      return "(i64)(int)(" + e + ")";
    case DType::Int64:
      return "(i64)(" + e + ")";
    case DType::Float16:
      return "rt_h((float)(" + e + "))";
    case DType::BFloat16:
      return "rt_bf((float)(" + e + "))";
    case DType::Float32:
      return "(float)(" + e + ")";
    case DType::Float64:
      return "(double)(" + e + ")";
  }
  return e;
}

std::string load_expr(DType t, const std::string& ref) {
  if (t == DType::Float16) return "h2f(" + ref + ")";
  if (t == DType::BFloat16) return "bf2f(" + ref + ")";
  if (is_floating(t)) return ref;
  return "(i64)" + ref;
}

std::string store_expr(DType t, const std::string& v) {
  if (t == DType::Float16) return "f2h(" + v + ")";
  if (t == DType::BFloat16) return "f2bf(" + v + ")";
  if (t == DType::Bool) return "(unsigned char)((" + v + ") != 0)";
  return "(" + storage_type(t) + ")(" + v + ")";
}

std::string store_total_expr(DType t, const std::string& v) {
  const bool half = t == DType::Float16 || t == DType::BFloat16;
  return store_expr(t, half ? "odd_f(" + v + ")" : v);
}

std::string float_literal(const Dialect& d, double v, DType t) {
  bool f = compute_type(t) == "float";
  if (std::isnan(v)) return f ? d.nan_f : d.nan_d;
  if (std::isinf(v)) return std::string(v < 0 ? "-" : "") + (f ? d.inf_f : d.inf_d);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);  // hex float: exact
  return std::string(buf) + (f ? "f" : "");
}

std::string int_literal(int64_t v) {
  if (v == INT64_MIN) return "(i64)(-9223372036854775807LL - 1)";
  return "(i64)" + std::to_string(v) + "LL";
}

std::string index_str(const IndexExpr& e) {
  switch (e.kind()) {
    case IndexExpr::Kind::Const:
      return int_literal(e.value());
    case IndexExpr::Kind::Var:
      return "i" + std::to_string(e.value());
    case IndexExpr::Kind::Param:
      return "P[" + std::to_string(e.value()) + "]";
    case IndexExpr::Kind::Load:
      return "((i64)b" + std::to_string(e.value()) + "[" + index_str(e.args()[0]) + "])";
    default:
      break;
  }
  std::string a = index_str(e.args()[0]), b = index_str(e.args()[1]);
  switch (e.kind()) {
    case IndexExpr::Kind::Add:
      return "(" + a + " + " + b + ")";
    case IndexExpr::Kind::Mul:
      return "(" + a + " * " + b + ")";
    case IndexExpr::Kind::FloorDiv:
      return "fdiv(" + a + ", " + b + ")";
    case IndexExpr::Kind::Mod:
      return "fmod_i(" + a + ", " + b + ")";
    case IndexExpr::Kind::Min:
      return "((" + a + ") < (" + b + ") ? (" + a + ") : (" + b + "))";
    default:
      return "((" + a + ") > (" + b + ") ? (" + a + ") : (" + b + "))";
  }
}

namespace {

// Substitutes operands a, b, c (whole identifiers only) in a table expression.
std::string apply_expr(const std::string& expr, const std::vector<std::string>& args) {
  std::string out;
  auto ident = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (size_t i = 0; i < expr.size(); ++i) {
    char ch = expr[i];
    bool alone = (i == 0 || !ident(expr[i - 1])) && (i + 1 == expr.size() || !ident(expr[i + 1]));
    if (alone && ch >= 'a' && ch <= 'c' && static_cast<size_t>(ch - 'a') < args.size())
      out += args[ch - 'a'];
    else
      out += ch;
  }
  return out;
}

std::string v(int id) { return "v" + std::to_string(id); }

}  // namespace

std::string cast_expr(DType from, DType to, const std::string& x) {
  if (is_floating(from) && !is_floating(to)) {
    if (to == DType::Bool) return "(i64)(" + x + " != 0)";
    static const char* bounds[] = {"",
                                   "-128.0, 127.0, -128LL, 127LL",
                                   "0.0, 255.0, 0LL, 255LL",
                                   "-32768.0, 32767.0, -32768LL, 32767LL",
                                   "-2147483648.0, 2147483647.0, -2147483648LL, 2147483647LL",
                                   "-9223372036854775808.0, 9223372036854775807.0, "
                                   "(-9223372036854775807LL - 1), 9223372036854775807LL"};
    return "sat((double)(" + x + "), " + bounds[static_cast<int>(to)] + ")";
  }
  bool half = to == DType::Float16 || to == DType::BFloat16;
  // Through float rounded to odd, so the 16-bit result rounds once, as the reference's does.
  if (half && (from == DType::Float64 || !is_floating(from)))
    return normalize(to, "odd_f((double)(" + x + "))");
  if (!is_floating(from) && is_floating(to))
    return normalize(to, "(" + compute_type(to) + ")(" + x + ")");
  return normalize(to, x);
}

std::string ValuePrinter::bounds_check(const IrValue& g, bool errors_only,
                                       bool only_nonerror) const {
  std::string s;
  for (size_t k = 0; k < g.bounds.size(); ++k) {
    bool is_err = g.bound_is_error[k];
    if ((errors_only && !is_err) || (only_nonerror && is_err)) continue;
    std::string e = index_str(g.bounds[k].first), n = index_str(g.bounds[k].second);
    s += std::string(s.empty() ? "" : " && ") + "(" + e + ") >= 0 && (" + e + ") < " + n;
  }
  return s;
}

std::string ValuePrinter::statement(int id, int side) const {
  const IrValue& x = ir.values[static_cast<size_t>(id)];
  std::string ct = x.kind == IrValue::Kind::InRange ? "bool" : compute_type(x.dtype);
  std::string e, checks;
  switch (x.kind) {
    case IrValue::Kind::Load: {
      std::string ref = load_ref ? load_ref(id, x) : "";
      if (ref.empty()) ref = "b" + std::to_string(x.buffer) + "[" + index_str(x.index) + "]";
      e = side == 0 ? "(" + ct + ")0" : load_expr(x.dtype, ref);
      if (x.guard >= 0 && side < 0) e = v(x.guard) + " ? " + e + " : (" + ct + ")0";
      break;
    }
    case IrValue::Kind::Const:
      if (x.param >= 0)
        e = "(" + ct + ")" + dialect.double_from_bits + "P[" + std::to_string(x.param) + "])";
      else
        e = is_floating(x.dtype) ? float_literal(dialect, x.value.to_double(), x.dtype)
                                 : int_literal(x.value.to_int64());
      break;
    case IrValue::Kind::Coord:
      e = normalize(x.dtype, "(" + ct + ")(" + index_str(x.index) + ")");
      break;
    case IrValue::Kind::Cast:
      e = cast_expr(ir.values[x.args[0]].dtype, x.dtype, v(x.args[0]));
      break;
    case IrValue::Kind::Random: {
      std::string seed = "P[" + std::to_string(x.seed_param) + "]";
      std::string off = "P[" + std::to_string(x.seed_param + 1) + "]";
      std::string idx = index_str(x.index);
      if (x.normal) {
        e = "normal_at(" + seed + ", " + off + ", " + idx + ")";
      } else {
        int bits = x.dtype == DType::Float16    ? 11
                   : x.dtype == DType::BFloat16 ? 8
                   : x.dtype == DType::Float64  ? 53
                                                : 24;
        const std::string word = random_word ? random_word(id) : "";
        e = word.empty() ? "uniform_bits(" + seed + ", " + off + ", " + idx + ", " +
                               std::to_string(bits) + ")"
                         : "uniform_word(" + word + ", " + std::to_string(bits) + ")";
      }
      e = normalize(x.dtype, e);
      break;
    }
    case IrValue::Kind::Stage:
      e = "stage" + std::to_string(x.stage);  // the row's total, declared after its loop
      break;
    case IrValue::Kind::InRange: {
      std::string errs = bounds_check(x, true, false);
      if (!errs.empty()) {
        bool invariant = hoisted != nullptr && hoist_var >= 0;
        for (const auto& [ex, n] : x.bounds)
          invariant = invariant && !mentions_var(ex, hoist_var) && !mentions_var(n, hoist_var);
        for (size_t k = 0; k < x.bounds.size(); ++k) {
          if (!x.bound_is_error[k]) continue;
          std::string ex = index_str(x.bounds[k].first), n = index_str(x.bounds[k].second);
          std::string pre = bounds_check(x, false, true);
          const std::string check = indent + "if (" + (pre.empty() ? "" : "(" + pre + ") && ") +
                                    "!((" + ex + ") >= 0 && (" + ex + ") < " + n +
                                    ")) kiln_index_error(err, " + std::to_string(x.bound_site[k]) +
                                    ", " + ex + ", " + n + ");\n";
          if (!invariant)
            checks += check;
          else if (hoisted->find(check) == std::string::npos)
            *hoisted += check;
        }
      }
      e = bounds_check(x, false, false);
      break;
    }
    case IrValue::Kind::Op: {
      if (x.op == OpCode::Where && side >= 0) {
        e = normalize(x.dtype, v(x.args[side ? 1 : 2]));
        break;
      }
      const ElementwiseDef& def = elementwise_def(x.op);
      std::vector<std::string> args;
      for (int a : x.args) args.push_back(v(a));
      e = normalize(x.dtype, apply_expr(def.expr, args));
      break;
    }
  }
  return checks + indent + "const " + ct + " " + v(id) + " = " + e + ";\n";
}

void ValuePrinter::emit_values() {
  for (size_t i = 0; i < ir.values.size(); ++i) body += statement(static_cast<int>(i));
}

namespace {
int max_param(const IndexExpr& e) {
  int m = e.kind() == IndexExpr::Kind::Param ? static_cast<int>(e.value()) : -1;
  if (e.kind() != IndexExpr::Kind::Const && e.kind() != IndexExpr::Kind::Var &&
      e.kind() != IndexExpr::Kind::Param)
    for (const IndexExpr& a : e.args()) m = std::max(m, max_param(a));
  return m;
}
}  // namespace

std::vector<char> cone(const KernelIR& ir, int root) {
  std::vector<char> need(ir.values.size(), 0);
  std::vector<int> stack{root};
  while (!stack.empty()) {
    const int x = stack.back();
    stack.pop_back();
    if (need[static_cast<size_t>(x)]) continue;
    need[static_cast<size_t>(x)] = 1;
    const IrValue& v = ir.values[static_cast<size_t>(x)];
    for (int a : v.args) stack.push_back(a);
    if (v.guard >= 0) stack.push_back(v.guard);
  }
  return need;
}

bool mentions_var(const IndexExpr& e, int k) {
  if (e.kind() == IndexExpr::Kind::Var) return e.value() == k;
  if (e.kind() == IndexExpr::Kind::Const || e.kind() == IndexExpr::Kind::Param) return false;
  for (const IndexExpr& a : e.args())
    if (mentions_var(a, k)) return true;
  return false;
}

int params_read(const KernelIR& ir) {
  int m = max_param(ir.store_index);
  for (const IndexExpr& d : ir.dims) m = std::max(m, max_param(d));
  for (const RowStage& st : ir.stages)
    for (const IndexExpr& d : st.dims) m = std::max(m, max_param(d));
  for (const IrValue& v : ir.values) {
    m = std::max({m, max_param(v.index), v.seed_param >= 0 ? v.seed_param + 1 : -1, v.param});
    for (const auto& [e, n] : v.bounds) m = std::max({m, max_param(e), max_param(n)});
  }
  return m + 1;
}

std::string identity_literal(const Dialect& d, ReduceOp op, DType dtype) {
  bool f = is_floating(dtype);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Or:
      return f ? "0" : "0LL";
    case ReduceOp::Prod:
    case ReduceOp::And:
      return f ? "1" : "1LL";
    default:
      break;
  }
  bool want_max = op == ReduceOp::Min;
  if (f) return want_max ? std::string(d.inf_d) : std::string("-") + d.inf_d;
  static const char* lo[] = {"0LL",      "-128LL",        "0LL",
                             "-32768LL", "-2147483648LL", "(-9223372036854775807LL - 1)"};
  static const char* hi[] = {"1LL",     "127LL",        "255LL",
                             "32767LL", "2147483647LL", "9223372036854775807LL"};
  return want_max ? hi[static_cast<int>(dtype)] : lo[static_cast<int>(dtype)];
}

std::string combine(ReduceOp op, const std::string& acc, const std::string& x) {
  switch (op) {
    case ReduceOp::Sum:
      return acc + " + " + x;
    case ReduceOp::Prod:
      return acc + " * " + x;
    case ReduceOp::Max:
      return "nan_max(" + acc + ", " + x + ")";
    case ReduceOp::Min:
      return "nan_min(" + acc + ", " + x + ")";
    case ReduceOp::And:
      return "(i64)(" + acc + " != 0 && " + x + " != 0)";
    case ReduceOp::Or:
      break;
  }
  return "(i64)(" + acc + " != 0 || " + x + " != 0)";
}

}  // namespace printing
}  // namespace kiln::jit
