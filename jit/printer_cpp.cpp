// The C++ printer. Values are printed as `const T vN = ...;` statements in the innermost
// loop; the compiler hoists what is loop-invariant. Integer values are kept in i64 and
// wrapped to their dtype after every op, floats in float (double for float64) and rounded
// through float16/bfloat16 after every op of those dtypes, so each op rounds exactly where
// the reference evaluator stores.
#include "printer_cpp.h"

#include <cmath>
#include <cstring>
#include <functional>

#include "../ops/elementwise.h"

namespace kiln::jit {
namespace {

const char* kPrelude =
#include "cpp_prelude.inc"
    ;

std::string compute_type(DType t) {
  switch (t) {
    case DType::Float16:
    case DType::BFloat16:
    case DType::Float32: return "float";
    case DType::Float64: return "double";
    default: return "i64";
  }
}

std::string storage_type(DType t) {
  switch (t) {
    case DType::Bool: return "unsigned char";
    case DType::Int8: return "signed char";
    case DType::UInt8: return "unsigned char";
    case DType::Int16: return "short";
    case DType::Int32: return "int";
    case DType::Int64: return "i64";
    case DType::Float16:
    case DType::BFloat16: return "u16";
    case DType::Float32: return "float";
    case DType::Float64: return "double";
  }
  return "i64";
}

// Brings a compute-type expression to the values representable in `t`.
std::string normalize(DType t, const std::string& e) {
  switch (t) {
    case DType::Bool: return "(i64)((" + e + ") != 0)";
    case DType::Int8: return "(i64)(signed char)(" + e + ")";
    case DType::UInt8: return "(i64)(unsigned char)(" + e + ")";
    case DType::Int16: return "(i64)(short)(" + e + ")";
    case DType::Int32: return "(i64)(int)(" + e + ")";
    case DType::Int64: return "(i64)(" + e + ")";
    case DType::Float16: return "rt_h((float)(" + e + "))";
    case DType::BFloat16: return "rt_bf((float)(" + e + "))";
    case DType::Float32: return "(float)(" + e + ")";
    case DType::Float64: return "(double)(" + e + ")";
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

std::string float_literal(double v, DType t) {
  bool f = compute_type(t) == "float";
  if (std::isnan(v)) return f ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")";
  if (std::isinf(v)) return std::string(v < 0 ? "-" : "") + (f ? "__builtin_inff()" : "__builtin_inf()");
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
    case IndexExpr::Kind::Const: return int_literal(e.value());
    case IndexExpr::Kind::Var: return "i" + std::to_string(e.value());
    case IndexExpr::Kind::Param: return "P[" + std::to_string(e.value()) + "]";
    case IndexExpr::Kind::Load: return "((i64)b" + std::to_string(e.value()) + "[" + index_str(e.args()[0]) + "])";
    default: break;
  }
  std::string a = index_str(e.args()[0]), b = index_str(e.args()[1]);
  switch (e.kind()) {
    case IndexExpr::Kind::Add: return "(" + a + " + " + b + ")";
    case IndexExpr::Kind::Mul: return "(" + a + " * " + b + ")";
    case IndexExpr::Kind::FloorDiv: return "fdiv(" + a + ", " + b + ")";
    case IndexExpr::Kind::Mod: return "fmod_i(" + a + ", " + b + ")";
    case IndexExpr::Kind::Min: return "((" + a + ") < (" + b + ") ? (" + a + ") : (" + b + "))";
    default: return "((" + a + ") > (" + b + ") ? (" + a + ") : (" + b + "))";
  }
}

// Substitutes operands a, b, c (whole identifiers only) in a table expression.
std::string apply_expr(const std::string& expr, const std::vector<std::string>& args) {
  std::string out;
  auto ident = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (size_t i = 0; i < expr.size(); ++i) {
    char ch = expr[i];
    bool alone = (i == 0 || !ident(expr[i - 1])) && (i + 1 == expr.size() || !ident(expr[i + 1]));
    if (alone && ch >= 'a' && ch <= 'c' && static_cast<size_t>(ch - 'a') < args.size()) out += args[ch - 'a'];
    else out += ch;
  }
  return out;
}

std::string cast_expr(DType from, DType to, const std::string& x) {
  if (is_floating(from) && !is_floating(to)) {
    if (to == DType::Bool) return "(i64)(" + x + " != 0)";
    static const char* bounds[] = {"", "-128.0, 127.0, -128LL, 127LL", "0.0, 255.0, 0LL, 255LL",
                                   "-32768.0, 32767.0, -32768LL, 32767LL",
                                   "-2147483648.0, 2147483647.0, -2147483648LL, 2147483647LL",
                                   "-9223372036854775808.0, 9223372036854775807.0, (-9223372036854775807LL - 1), 9223372036854775807LL"};
    return "sat((double)(" + x + "), " + bounds[static_cast<int>(to)] + ")";
  }
  bool half = to == DType::Float16 || to == DType::BFloat16;
  // Through float rounded to odd, so the 16-bit result rounds once, as the reference's does.
  if (half && (from == DType::Float64 || !is_floating(from))) return normalize(to, "odd_f((double)(" + x + "))");
  if (!is_floating(from) && is_floating(to)) return normalize(to, "(" + compute_type(to) + ")(" + x + ")");
  return normalize(to, x);
}

struct Printer {
  const KernelIR& ir;
  std::string body;
  std::string indent = "      ";

  std::string v(int id) { return "v" + std::to_string(id); }

  std::string bounds_check(const IrValue& g, bool errors_only, bool only_nonerror) {
    std::string s;
    for (size_t k = 0; k < g.bounds.size(); ++k) {
      bool is_err = g.bound_is_error[k];
      if ((errors_only && !is_err) || (only_nonerror && is_err)) continue;
      std::string e = index_str(g.bounds[k].first), n = index_str(g.bounds[k].second);
      s += std::string(s.empty() ? "" : " && ") + "(" + e + ") >= 0 && (" + e + ") < " + n;
    }
    return s;
  }

  void emit_values() {
    for (size_t i = 0; i < ir.values.size(); ++i) {
      const IrValue& x = ir.values[i];
      int id = static_cast<int>(i);
      std::string ct = x.kind == IrValue::Kind::InRange ? "bool" : compute_type(x.dtype);
      std::string e;
      switch (x.kind) {
        case IrValue::Kind::Load: {
          std::string ref = "b" + std::to_string(x.buffer) + "[" + index_str(x.index) + "]";
          e = load_expr(x.dtype, ref);
          if (x.guard >= 0) e = v(x.guard) + " ? " + e + " : (" + ct + ")0";
          break;
        }
        case IrValue::Kind::Const:
          e = is_floating(x.dtype) ? float_literal(x.value.to_double(), x.dtype) : int_literal(x.value.to_int64());
          break;
        case IrValue::Kind::Coord: e = normalize(x.dtype, "(" + ct + ")(" + index_str(x.index) + ")"); break;
        case IrValue::Kind::Cast: e = cast_expr(ir.values[x.args[0]].dtype, x.dtype, v(x.args[0])); break;
        case IrValue::Kind::Random: {
          std::string seed = "P[" + std::to_string(x.seed_param) + "]";
          std::string off = "P[" + std::to_string(x.seed_param + 1) + "]";
          std::string idx = index_str(x.index);
          if (x.normal) {
            e = "normal_at(" + seed + ", " + off + ", " + idx + ")";
          } else {
            int bits = x.dtype == DType::Float16 ? 11 : x.dtype == DType::BFloat16 ? 8 : x.dtype == DType::Float64 ? 53 : 24;
            e = "uniform_bits(" + seed + ", " + off + ", " + idx + ", " + std::to_string(bits) + ")";
          }
          e = normalize(x.dtype, e);
          break;
        }
        case IrValue::Kind::InRange: {
          std::string errs = bounds_check(x, true, false);
          if (!errs.empty()) {
            for (size_t k = 0; k < x.bounds.size(); ++k) {
              if (!x.bound_is_error[k]) continue;
              std::string ex = index_str(x.bounds[k].first), n = index_str(x.bounds[k].second);
              std::string pre = bounds_check(x, false, true);
              body += indent + "if (" + (pre.empty() ? "" : "(" + pre + ") && ") + "!((" + ex + ") >= 0 && (" + ex +
                      ") < " + n + ")) kiln_index_error(err, " + std::to_string(x.bound_site[k]) + ", " + ex + ", " + n + ");\n";
            }
          }
          e = bounds_check(x, false, false);
          break;
        }
        case IrValue::Kind::Op: {
          const ElementwiseDef& def = elementwise_def(x.op);
          std::vector<std::string> args;
          for (int a : x.args) args.push_back(v(a));
          e = normalize(x.dtype, apply_expr(def.expr, args));
          break;
        }
      }
      body += indent + "const " + ct + " " + v(id) + " = " + e + ";\n";
    }
  }
};

std::string identity_literal(ReduceOp op, DType dtype) {
  bool f = is_floating(dtype);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Or: return f ? "0" : "0LL";
    case ReduceOp::Prod:
    case ReduceOp::And: return f ? "1" : "1LL";
    default: break;
  }
  bool want_max = op == ReduceOp::Min;
  if (f) return want_max ? "__builtin_inf()" : "-__builtin_inf()";
  static const char* lo[] = {"0LL", "-128LL", "0LL", "-32768LL", "-2147483648LL", "(-9223372036854775807LL - 1)"};
  static const char* hi[] = {"1LL", "127LL", "255LL", "32767LL", "2147483647LL", "9223372036854775807LL"};
  return want_max ? hi[static_cast<int>(dtype)] : lo[static_cast<int>(dtype)];
}

std::string combine(ReduceOp op, const std::string& acc, const std::string& x) {
  switch (op) {
    case ReduceOp::Sum: return acc + " + " + x;
    case ReduceOp::Prod: return acc + " * " + x;
    case ReduceOp::Max: return "nan_max(" + acc + ", " + x + ")";
    case ReduceOp::Min: return "nan_min(" + acc + ", " + x + ")";
    case ReduceOp::And: return "(i64)(" + acc + " != 0 && " + x + " != 0)";
    case ReduceOp::Or: break;
  }
  return "(i64)(" + acc + " != 0 || " + x + " != 0)";
}

constexpr int kLanes = 16;

}  // namespace

DType accumulator_dtype(const KernelIR& ir) {
  if (!is_floating(ir.out_dtype)) return DType::Int64;
  if (ir.kind == KernelIR::Kind::Scatter || ir.out_dtype == DType::Float64) return DType::Float64;
  return DType::Float32;
}

namespace {
std::string accumulator_type(const KernelIR& ir) { return compute_type(accumulator_dtype(ir)); }
}  // namespace

PrintedKernel print_cpp(const KernelIR& ir) {
  Printer p{ir, "", "      "};
  const size_t n_in = ir.inputs.size();
  const int rank = static_cast<int>(ir.dims.size());
  std::string acc_t = accumulator_type(ir);
  std::string out_t = ir.kind == KernelIR::Kind::Scatter ? acc_t : storage_type(ir.out_dtype);

  std::string head = "// kiln kernel: " + std::string(ir.kind == KernelIR::Kind::Map ? "map" :
                                                    ir.kind == KernelIR::Kind::InnerReduce ? "reduce" : "scatter") + "\n// ops:";
  for (const std::string& op : ir.source_ops) head += " " + op;
  head += "\n";
  std::string sig = "extern \"C\" void KILN_ENTRY(char** __restrict bufs, const i64* __restrict P, i64 begin, i64 end, i64 part) {\n";
  std::string pro = "  " + out_t + "* __restrict out = (" + out_t + "*)bufs[0];\n";
  for (size_t k = 0; k < n_in; ++k) {
    std::string t = storage_type(ir.inputs[k]);
    pro += "  const " + t + "* __restrict b" + std::to_string(k + 1) + " = (const " + t + "*)bufs[" + std::to_string(k + 1) + "];\n";
  }
  pro += "  i64* err = (i64*)bufs[" + std::to_string(n_in + 2) + "];\n  (void)err; (void)part; (void)P;\n";
  std::vector<std::string> d;
  for (int k = 0; k < rank; ++k) {
    d.push_back("d" + std::to_string(k));
    pro += "  const i64 d" + std::to_string(k) + " = " + index_str(ir.dims[k]) + ";\n";
  }
  if (rank == 0) {
    d.push_back("d0");
    pro += "  const i64 d0 = 1;\n";
  }
  const int r = std::max(rank, 1);
  std::string body;

  // Chunked walk over a flat range [begin, end) of the first `r` vars: rows of the last var.
  auto flat_walk = [&](const std::string& inner) {
    std::string s = "  i64 rem = begin;\n";
    for (int k = r - 1; k >= 0; --k) {
      s += "  i64 c" + std::to_string(k) + " = rem % " + d[k] + "; rem /= " + d[k] + ";\n";
    }
    s += "  (void)rem;\n  i64 flat = begin;\n  while (flat < end) {\n";
    s += "    i64 len = " + d[r - 1] + " - c" + std::to_string(r - 1) + ";\n    if (len > end - flat) len = end - flat;\n";
    for (int k = 0; k + 1 < r; ++k) s += "    const i64 i" + std::to_string(k) + " = c" + std::to_string(k) + ";\n";
    s += inner;
    s += "    flat += len;\n    c" + std::to_string(r - 1) + " = 0;\n";
    for (int k = r - 2; k >= 0; --k) {
      s += std::string(2 * (r - 1 - k) + 2, ' ') + "if (++c" + std::to_string(k) + " == " + d[k] + ") { c" + std::to_string(k) + " = 0;\n";
    }
    for (int k = r - 2; k >= 0; --k) s += std::string(2 * (k + 1) + 2, ' ') + "}\n";
    s += "  }\n";
    return s;
  };

  if (ir.kind == KernelIR::Kind::Map) {
    p.emit_values();
    std::string inner = "    for (i64 j = 0; j < len; ++j) {\n      const i64 i" + std::to_string(r - 1) + " = c" +
                        std::to_string(r - 1) + " + j;\n" + p.body + "      out[flat + j] = " +
                        store_expr(ir.out_dtype, "v" + std::to_string(ir.result)) + ";\n    }\n";
    body = flat_walk(inner);
  } else if (ir.kind == KernelIR::Kind::InnerReduce) {
    p.emit_values();
    std::string x = "v" + std::to_string(ir.result);
    std::string id = identity_literal(ir.reduce, ir.out_dtype);
    std::string lanes = "    " + acc_t + " acc[" + std::to_string(kLanes) + "];\n    for (int l = 0; l < " +
                        std::to_string(kLanes) + "; ++l) acc[l] = (" + acc_t + ")" + id + ";\n";
    std::string fold = "    " + acc_t + " total = acc[0];\n    for (int l = 1; l < " + std::to_string(kLanes) +
                       "; ++l) total = " + combine(ir.reduce, "total", "acc[l]") + ";\n";
    if (ir.kept == 0) {
      // Whole-domain reduction: this call's slice of the flat range goes to partial `part`.
      std::string inner = "    i64 j = 0;\n    for (; j + " + std::to_string(kLanes) + " <= len; j += " + std::to_string(kLanes) +
                          ") {\n      for (int l = 0; l < " + std::to_string(kLanes) + "; ++l) {\n      const i64 i" +
                          std::to_string(r - 1) + " = c" + std::to_string(r - 1) + " + j + l;\n" + p.body +
                          "      acc[l] = " + combine(ir.reduce, "acc[l]", x) + ";\n      }\n    }\n" +
                          "    for (; j < len; ++j) {\n      const i64 i" + std::to_string(r - 1) + " = c" +
                          std::to_string(r - 1) + " + j;\n" + p.body + "      acc[0] = " + combine(ir.reduce, "acc[0]", x) +
                          ";\n    }\n";
      body = lanes + flat_walk(inner) + fold + "  ((" + acc_t + "*)bufs[" + std::to_string(n_in + 1) + "])[part] = total;\n";
    } else {
      std::string s = "  for (i64 o = begin; o < end; ++o) {\n    i64 rem = o;\n";
      for (int k = ir.kept - 1; k >= 0; --k) {
        s += "    const i64 i" + std::to_string(k) + " = rem % " + d[k] + "; rem /= " + d[k] + ";\n";
      }
      s += "    (void)rem;\n" + lanes;
      if (ir.kept == rank) {
        s += "    {\n" + p.body + "      acc[0] = " + combine(ir.reduce, "acc[0]", x) + ";\n    }\n";
      } else {
        std::string loops;
        int depth = 0;
        for (int k = ir.kept; k + 1 < rank; ++k, ++depth) {
          loops += "    for (i64 i" + std::to_string(k) + " = 0; i" + std::to_string(k) + " < " + d[k] + "; ++i" + std::to_string(k) + ") {\n";
        }
        std::string last = "i" + std::to_string(rank - 1);
        loops += "    i64 j = 0;\n    for (; j + " + std::to_string(kLanes) + " <= " + d[rank - 1] + "; j += " +
                 std::to_string(kLanes) + ") {\n      for (int l = 0; l < " + std::to_string(kLanes) +
                 "; ++l) {\n      const i64 " + last + " = j + l;\n" + p.body + "      acc[l] = " +
                 combine(ir.reduce, "acc[l]", x) + ";\n      }\n    }\n    for (; j < " + d[rank - 1] +
                 "; ++j) {\n      const i64 " + last + " = j;\n" + p.body + "      acc[0] = " +
                 combine(ir.reduce, "acc[0]", x) + ";\n    }\n";
        for (int k = 0; k < depth; ++k) loops += "    }\n";
        s += loops;
      }
      s += fold + "    out[o] = " + store_expr(ir.out_dtype, "total") + ";\n  }\n";
      body = s;
    }
  } else {
    p.emit_values();
    std::string s;
    for (int k = 0; k < rank; ++k) {
      std::string lo = k == ir.parallel_var ? "begin" : "0", hi = k == ir.parallel_var ? "end" : d[k];
      s += std::string(2 * k + 2, ' ') + "for (i64 i" + std::to_string(k) + " = " + lo + "; i" + std::to_string(k) +
           " < " + hi + "; ++i" + std::to_string(k) + ") {\n";
    }
    if (rank == 0) s += "  do {\n";
    s += p.body;
    if (ir.store_guard >= 0) s += "      if (!v" + std::to_string(ir.store_guard) + ") continue;\n";
    std::string at = "out[" + index_str(ir.store_index) + "]";
    s += "      " + at + " = " + combine(ir.reduce, at, "(" + acc_t + ")v" + std::to_string(ir.result)) + ";\n";
    for (int k = rank - 1; k >= 0; --k) s += std::string(2 * k + 2, ' ') + "}\n";
    if (rank == 0) s += "  } while (0);\n";
    body = s;
  }

  std::string text = head + kPrelude + sig + pro + body + "}\n";
  uint64_t h = std::hash<std::string>{}(text);
  char name[32];
  std::snprintf(name, sizeof name, "kiln_k%016llx", static_cast<unsigned long long>(h));
  PrintedKernel out;
  out.entry = name;
  size_t pos = text.find("KILN_ENTRY");
  out.source = text.replace(pos, 10, name);
  return out;
}

}  // namespace kiln::jit
