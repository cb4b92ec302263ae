// The C++ printer. Values are printed (printer_common.cpp) as `const T vN = ...;` statements
// in the innermost loop; the compiler hoists what is loop-invariant.
#include "printer_cpp.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>
#include <unordered_map>

namespace kiln::jit {
namespace {

using namespace printing;

const char* kPrelude =
#include "cpp_prelude.inc"
    ;

// The prelude in sections: the text before the first `//@ provides: a b` line goes into
// every kernel, each later section only into kernels that use one of the names it provides
// (directly, or through another included section). Parsing all of it cost a third of a
// quick (-O0) compile; most kernels need a few of its 35 sections.
struct PreludeSection {
  std::vector<std::string> provides;
  std::string text;
  std::set<std::string> uses;  // identifiers in `text`
};

void add_identifiers(const std::string& text, std::set<std::string>& out) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t i = 0; i < text.size();) {
    if (!word(text[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && word(text[j])) ++j;
    // A number (0x7fffu, 1e5f) is no identifier.
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) out.insert(text.substr(i, j - i));
    i = j;
  }
}

const std::pair<std::string, std::vector<PreludeSection>>& prelude_sections() {
  static const auto parsed = [] {
    std::pair<std::string, std::vector<PreludeSection>> out;
    const std::string all = kPrelude, marker = "//@ provides:";
    size_t at = all.find(marker);
    out.first = all.substr(0, at);
    while (at != std::string::npos) {
      const size_t eol = all.find('\n', at);
      const size_t next = all.find(marker, eol);
      PreludeSection sec;
      std::istringstream names(all.substr(at + marker.size(), eol - at - marker.size()));
      for (std::string n; names >> n;) sec.provides.push_back(n);
      sec.text =
          all.substr(eol + 1, next == std::string::npos ? std::string::npos : next - eol - 1);
      add_identifiers(sec.text, sec.uses);
      out.second.push_back(std::move(sec));
      at = next;
    }
    return out;
  }();
  return parsed;
}

// The prelude `kernel` needs: the common part and the sections whose names it uses, in
// prelude order (a section only uses names of sections before it).
std::string prelude_for(const std::string& kernel) {
  const auto& [common, sections] = prelude_sections();
  std::set<std::string> used;
  add_identifiers(kernel, used);
  std::vector<bool> take(sections.size(), false);
  // Later sections use earlier ones: walking back to front adds each one's names before
  // the sections it may need are considered.
  for (size_t k = sections.size(); k-- > 0;) {
    for (const std::string& n : sections[k].provides) take[k] = take[k] || used.count(n) > 0;
    if (take[k]) used.insert(sections[k].uses.begin(), sections[k].uses.end());
  }
  std::string out = common;
  for (size_t k = 0; k < sections.size(); ++k)
    if (take[k]) out += sections[k].text;
  return out;
}

// Row-uniform selects. A map's inner loop walks one row of its domain (the last var). A
// select whose condition does not depend on that var, or a load guarded by such a bound,
// takes the same side along the whole row. Concatenations and stacks (an RNN's per-step
// outputs) fuse into trees of such selects over up to 16 pieces, and the loop evaluated
// every piece's masked load for every element. RowSplit prints one loop per combination of
// those conditions that matters, chosen once per row by nested ifs, so each loop reads only
// the piece its rows come from.
class RowSplit {
 public:
  RowSplit(const KernelIR& ir, const ValuePrinter& printer, int inner)
      : ir_(ir), p_(printer), varies_(ir.values.size(), 0), key_(ir.values.size(), -1) {
    for (size_t i = 0; i < ir.values.size(); ++i) {
      const IrValue& x = ir.values[i];
      bool varies = false;
      switch (x.kind) {
        case IrValue::Kind::Load:
        case IrValue::Kind::Coord:
        case IrValue::Kind::Random:
          varies = mentions_var(x.index, inner) ||
                   (x.guard >= 0 && varies_[static_cast<size_t>(x.guard)]);
          break;
        case IrValue::Kind::InRange:
          for (const auto& [e, n] : x.bounds)
            varies = varies || mentions_var(e, inner) || mentions_var(n, inner);
          break;
        case IrValue::Kind::Const:
        case IrValue::Kind::Stage:
          break;
        case IrValue::Kind::Op:
        case IrValue::Kind::Cast:
          for (int a : x.args) varies = varies || varies_[static_cast<size_t>(a)];
          break;
      }
      varies_[i] = varies;
    }
    // Conditions printed alike are one condition (a concatenation repeats the bounds of
    // its pieces at each level), decided once.
    std::unordered_map<std::string, int> keys;
    for (size_t i = 0; i < ir.values.size(); ++i) {
      const int c = condition(static_cast<int>(i));
      if (c < 0 || key_[static_cast<size_t>(c)] >= 0) continue;
      std::string text = p_.statement(c);
      text = text.substr(text.find(" = "));
      const int next = static_cast<int>(keys.size());
      key_[static_cast<size_t>(c)] = keys.emplace(text, next).first->second;
    }
    conditions_ = static_cast<int>(keys.size());
  }

  /// The row's loops, or "" when nothing is row-uniform, a value can raise an error (every
  /// value is then evaluated, as the reference does) or the combinations are too many.
  /// `loop(indent)` opens the loop through the inner var's declaration; `store(indent)`
  /// writes the result.
  std::string print(const std::function<std::string(const std::string&)>& loop,
                    const std::function<std::string(const std::string&)>& store) {
    if (conditions_ == 0 || ir_.can_fail) return "";
    std::vector<int8_t> known(static_cast<size_t>(conditions_), -1);
    std::vector<char> defined(ir_.values.size(), 0);
    leaves_ = 0;
    std::string out = tree(known, defined, "    ", loop, store);
    return leaves_ <= kMaxLoops ? out : "";
  }

 private:
  // Loops printed at most: each is compiled and vectorized on its own.
  static constexpr int kMaxLoops = 48;

  // The value whose truth decides value `x` along a row, or -1.
  int condition(int x) const {
    const IrValue& v = ir_.values[static_cast<size_t>(x)];
    int c = -1;
    if (v.kind == IrValue::Kind::Op && v.op == OpCode::Where) c = v.args[0];
    if (v.kind == IrValue::Kind::Load) c = v.guard;
    return c >= 0 && !varies_[static_cast<size_t>(c)] ? c : -1;
  }

  // The side of `x` that the known conditions choose (1 or 0), or -1.
  int side(int x, const std::vector<int8_t>& known) const {
    const int c = condition(x);
    return c < 0 ? -1 : known[static_cast<size_t>(key_[static_cast<size_t>(c)])];
  }

  // Marks in `need` what `root` reads under `known`. Returns the first condition met that
  // is not known yet (one its own condition depends on first), or -1.
  int walk(int root, const std::vector<int8_t>& known, std::vector<char>& need) const {
    std::vector<int> stack{root};
    while (!stack.empty()) {
      const int x = stack.back();
      stack.pop_back();
      if (need[static_cast<size_t>(x)]) continue;
      const int c = condition(x);
      const int s = side(x, known);
      if (c >= 0 && s < 0) {
        std::vector<char> cone(ir_.values.size(), 0);
        const int deeper = walk(c, known, cone);
        return deeper >= 0 ? deeper : c;
      }
      need[static_cast<size_t>(x)] = 1;
      const IrValue& v = ir_.values[static_cast<size_t>(x)];
      if (c >= 0) {
        if (v.kind == IrValue::Kind::Op) stack.push_back(v.args[s ? 1 : 2]);
        continue;  // a guarded load: read unguarded, or zero
      }
      for (int a : v.args) stack.push_back(a);
      if (v.kind == IrValue::Kind::Load && v.guard >= 0) stack.push_back(v.guard);
    }
    return -1;
  }

  // Statements for the values of `need` not yet defined, operands first (ids are in order).
  std::string define(const std::vector<char>& need, std::vector<char>& defined,
                     const std::vector<int8_t>& known, const std::string& indent) const {
    ValuePrinter p(ir_, p_.dialect);
    p.load_ref = p_.load_ref;
    p.random_word = p_.random_word;
    p.indent = indent;
    std::string s;
    for (size_t i = 0; i < need.size(); ++i) {
      if (!need[i] || defined[i]) continue;
      defined[i] = 1;
      s += p.statement(static_cast<int>(i), side(static_cast<int>(i), known));
    }
    return s;
  }

  std::string tree(std::vector<int8_t>& known, std::vector<char> defined, const std::string& indent,
                   const std::function<std::string(const std::string&)>& loop,
                   const std::function<std::string(const std::string&)>& store) {
    if (leaves_ > kMaxLoops) return "";
    std::vector<char> need(ir_.values.size(), 0);
    const int c = walk(ir_.result, known, need);
    if (c < 0) {
      ++leaves_;
      return loop(indent) + define(need, defined, known, indent + "  ") + store(indent + "  ") +
             indent + "}\n";
    }
    std::fill(need.begin(), need.end(), 0);
    walk(c, known, need);  // known up to c itself
    std::string s = define(need, defined, known, indent);
    const auto k = static_cast<size_t>(key_[static_cast<size_t>(c)]);
    if (ir_.values[static_cast<size_t>(c)].kind == IrValue::Kind::Load && side(c, known) == 0) {
      // A load outside its guard reads zero: the condition is false, nothing to branch on.
      known[k] = 0;
      s += tree(known, defined, indent, loop, store);
      known[k] = -1;
      return s;
    }
    s += indent + "if (v" + std::to_string(c) + ") {\n";
    known[k] = 1;
    s += tree(known, defined, indent + "  ", loop, store);
    s += indent + "} else {\n";
    known[k] = 0;
    s += tree(known, defined, indent + "  ", loop, store);
    known[k] = -1;
    return s + indent + "}\n";
  }

  const KernelIR& ir_;
  const ValuePrinter& p_;
  std::vector<char> varies_;  // depends on the inner var
  std::vector<int> key_;      // per condition value: its condition's number
  int conditions_ = 0;
  int leaves_ = 0;
};

std::string accumulator_type(const KernelIR& ir) { return compute_type(accumulator_dtype(ir)); }

// The statements that fold the values of one row into the accumulator variable `total` (of
// compute type `acc`, declared by the caller and holding the identity or a partial result):
// `lane(j)` prints the statements that define the expression `x`, the element at offset `j`
// (an expression) of the row, for j in [0, count).
//
// Every reduction is one plain loop over the row that the loop vectorizer takes: it keeps
// native-width vector accumulators (interleaved, to hide the latency) and folds them once
// at the end of the row. A float sum or product is only vectorized when reordering its
// combines is allowed, which `vectorize(enable)` (clang) and `omp simd reduction` (GCC,
// with -fopenmp-simd) allow for that loop's accumulator alone: the elementwise code keeps
// its IEEE semantics, and the order depends only on the row length, so the result is the
// same bits run to run. Written as 16 lane accumulators instead, the SLP vectorizer split
// relu(a*b+c).sum()'s lanes into vectors of 8, 4, 2 and 1 plus scalars (2.5x slower in
// cache, 1.3x from memory).
// A float max/min propagates NaN, which no vectorizer takes as a reduction: it folds the
// integer keys of the prelude's max_key/min_key instead (NaN the extreme key) and converts
// back once per row, exact and independent of the order (max(x, 1) of 512x512: 2x faster
// than 16 SLP-packed lanes, 8x with GCC). Each call's names are its own (`total`, a block
// for the key), so a kernel may fold several rows or stages one after another.
std::string reduce_loop(DType acc, ReduceOp op, const std::string& total,
                        const std::function<std::string(const std::string&)>& lane,
                        const std::string& x, const std::string& count) {
  const std::string acc_t = compute_type(acc);
  const bool keyed = is_floating(acc) && (op == ReduceOp::Max || op == ReduceOp::Min);
  std::string var = total, step, omp;
  std::string pre, key, post;
  if (keyed) {
    const std::string key_t = acc == DType::Float64 ? "i64" : "int";
    const std::string f = op == ReduceOp::Max ? "max_key" : "min_key";
    const char* cmp = op == ReduceOp::Max ? " > " : " < ";
    var = total + "_key";
    pre = "    {\n    " + key_t + " " + var + " = " + f + "(" + total + ");\n";
    post = "    " + total + " = from_key(" + var + ");\n    }\n";
    key = "      const " + key_t + " " + x + "_key = " + f + "((" + acc_t + ")" + x + ");\n";
    step = var + cmp + x + "_key ? " + var + " : " + x + "_key";
    omp = op == ReduceOp::Max ? "max" : "min";
  } else {
    // And/Or as bitwise folds of 0/1 (the accumulator only ever holds 0 or 1), which both
    // vectorizers recognize; combine()'s && and || are not.
    switch (op) {
      case ReduceOp::Sum:
        step = total + " + " + x, omp = "+";
        break;
      case ReduceOp::Prod:
        step = total + " * " + x, omp = "*";
        break;
      case ReduceOp::Max:
        step = combine(op, total, x), omp = "max";
        break;
      case ReduceOp::Min:
        step = combine(op, total, x), omp = "min";
        break;
      case ReduceOp::And:
        step = total + " & (i64)(" + x + " != 0)", omp = "&";
        break;
      case ReduceOp::Or:
        step = total + " | (i64)(" + x + " != 0)", omp = "|";
        break;
    }
  }
  return pre +
         "#if defined(__clang__)\n#pragma clang loop vectorize(enable)\n#elif defined(__GNUC__)\n"
         "#pragma omp simd reduction(" +
         omp + ":" + var + ")\n#endif\n    for (i64 j = 0; j < " + count + "; ++j) {\n" +
         lane("j") + key + "      " + var + " = " + step + ";\n    }\n" + post;
}

// Whether `e` is (something without var k) + i<k>: it steps by one along rows of var k.
bool steps_by_one(const IndexExpr& e, int k) {
  if (e.kind() == IndexExpr::Kind::Var) return e.value() == k;
  if (e.kind() != IndexExpr::Kind::Add) return false;
  int stepping = 0;
  for (const IndexExpr& a : e.args()) {
    if (!mentions_var(a, k)) continue;
    if (!steps_by_one(a, k)) return false;
    ++stepping;
  }
  return stepping == 1;
}

// Uniform Random values of at most 32 bits whose flat index steps by one along the rows of
// var k: a row's words can be made ahead of its loop, one Philox block per four elements
// (core/philox.h, philox_word), in a loop that vectorizes across blocks. Drawn per element,
// each element paid a whole block: a dropout mask took 3.7 ns per element, 1.2 so.
std::vector<int> row_drawn_randoms(const KernelIR& ir, int k) {
  std::vector<int> ids;
  for (size_t i = 0; i < ir.values.size(); ++i) {
    const IrValue& x = ir.values[i];
    if (x.kind == IrValue::Kind::Random && !x.normal && x.dtype != DType::Float64 &&
        steps_by_one(x.index, k))
      ids.push_back(static_cast<int>(i));
  }
  return ids;
}

// The statements of `root`'s cone; with `hoisted`, the index checks that do not depend on
// var i<loop_var> go there (ValuePrinter::hoisted), for the caller to print ahead of its loop.
std::string cone_statements(const KernelIR& ir, int root, const std::string& indent,
                            int loop_var = -1, std::string* hoisted = nullptr) {
  ValuePrinter p(ir, kCppDialect);
  p.indent = indent;
  p.hoisted = hoisted;
  p.hoist_var = loop_var;
  const std::vector<char> need = cone(ir, root);
  std::string s;
  for (size_t i = 0; i < need.size(); ++i)
    if (need[i]) s += p.statement(static_cast<int>(i));
  return s;
}

// A Rows kernel: per row of the outer vars, each stage's reduction (reduce_loop over its
// last dim, as InnerReduce), its total rounded to the reduction's dtype, then the row's
// stores. A row's stages read its inputs again, from cache: a softmax row of 4096
// floats is 16 KiB, and it makes one pass over memory instead of three kernels' worth.
std::string rows_body(const KernelIR& ir, const std::vector<std::string>& d) {
  const int rank = static_cast<int>(ir.dims.size());
  std::string s = "  for (i64 o = begin; o < end; ++o) {\n    i64 rem = o;\n";
  for (int k = ir.kept - 1; k >= 0; --k)
    s += "    const i64 i" + std::to_string(k) + " = rem % " + d[static_cast<size_t>(k)] +
         "; rem /= " + d[static_cast<size_t>(k)] + ";\n";
  s += "    (void)rem;\n";
  for (size_t k = 0; k < ir.stages.size(); ++k) {
    const RowStage& st = ir.stages[k];
    const std::string n = std::to_string(k);
    const DType acc_dt = !is_floating(st.dtype)       ? DType::Int64
                         : st.dtype == DType::Float64 ? DType::Float64
                                                      : DType::Float32;
    const std::string acc_t = compute_type(acc_dt), total = "total" + n;
    const std::string x = "v" + std::to_string(st.value);
    s += "    " + acc_t + " " + total + " = (" + acc_t + ")" +
         identity_literal(kCppDialect, st.reduce, st.dtype) + ";\n";
    // Outer reduced dims as plain loops; the last one is reduce_loop's row (as InnerReduce).
    const int nd = static_cast<int>(st.dims.size());
    std::string close, ind = "    ";
    for (int m = 0; m + 1 < nd; ++m) {
      const std::string iv = "i" + std::to_string(st.first_var + m);
      s += ind + "for (i64 " + iv + " = 0; " + iv + " < d" + std::to_string(st.first_var + m) +
           "; ++" + iv + ") {\n";
      close = ind + "}\n" + close;
      ind += "  ";
    }
    if (nd == 0) {
      s += "    {\n" + cone_statements(ir, st.value, "      ") + "      " + total + " = " +
           combine(st.reduce, total, x) + ";\n    }\n";
    } else {
      const int last_var = st.first_var + nd - 1;
      const std::string last = "i" + std::to_string(last_var),
                        extent = "d" + std::to_string(last_var);
      std::string hoisted;
      auto lane = [&](const std::string& j) {
        return "      const i64 " + last + " = " + j + ";\n" +
               cone_statements(ir, st.value, "      ", last_var, &hoisted);
      };
      const std::string loop = reduce_loop(acc_dt, st.reduce, total, lane, x, extent);
      // Checked once per row, and only where the row has elements, as the loop would.
      if (!hoisted.empty()) s += ind + "if (" + extent + " > 0) {\n" + hoisted + ind + "}\n";
      s += loop;
    }
    s += close;
    // Rounded as a stored total would be, then read back in the compute type.
    s += "    const " + compute_type(st.dtype) + " stage" + n + " = " +
         load_expr(st.dtype, store_expr(st.dtype, total)) + ";\n";
  }
  const std::string res = "v" + std::to_string(ir.result);
  if (rank == ir.kept) {
    s += "    {\n" + cone_statements(ir, ir.result, "      ") +
         "      out[o] = " + store_expr(ir.out_dtype, res) + ";\n    }\n  }\n";
    return s;
  }
  // The row's elements: out is contiguous, row o starts at o * (product of inner extents).
  std::string inner = "1";
  for (int k = ir.kept; k < rank; ++k) inner += " * " + d[static_cast<size_t>(k)];
  s += "    const i64 row0 = o * (" + inner + ");\n";
  std::string ind = "    ", close, flat = "0";
  for (int k = ir.kept; k + 1 < rank; ++k) {
    const std::string iv = "i" + std::to_string(k);
    s += ind + "for (i64 " + iv + " = 0; " + iv + " < " + d[static_cast<size_t>(k)] + "; ++" + iv +
         ") {\n";
    close = ind + "}\n" + close;
    ind += "  ";
    flat = "(" + flat + " + " + iv + ") * " + d[static_cast<size_t>(k + 1)];
  }
  const std::string last = "i" + std::to_string(rank - 1);
  std::string hoisted;
  const std::string body = cone_statements(ir, ir.result, ind + "  ", rank - 1, &hoisted);
  if (!hoisted.empty())
    s += ind + "if (" + d[static_cast<size_t>(rank - 1)] + " > 0) {\n" + hoisted + ind + "}\n";
  // In place (the memory plan may hand out an input's buffer), each element is read before
  // it is written and the stages read only this row, which they finished before.
  s += "#if defined(__clang__)\n#pragma clang loop vectorize(assume_safety)\n"
       "#elif defined(__GNUC__)\n#pragma GCC ivdep\n#endif\n" +
       ind + "for (i64 " + last + " = 0; " + last + " < " + d[static_cast<size_t>(rank - 1)] +
       "; ++" + last + ") {\n" + body + ind + "  out[row0 + " + flat + " + " + last +
       "] = " + store_expr(ir.out_dtype, res) + ";\n" + ind + "}\n" + close + "  }\n";
  return s;
}

}  // namespace

PrintedKernel print_cpp(const KernelIR& ir) {
  ValuePrinter p(ir, kCppDialect);
  const size_t n_in = ir.inputs.size();
  const int rank = static_cast<int>(ir.dims.size());
  std::string acc_t = accumulator_type(ir);
  // A scatter adds into an accumulator array, unless no two points share an output.
  const bool accumulates = ir.kind == KernelIR::Kind::Scatter && !ir.injective;
  std::string out_t = accumulates ? acc_t : storage_type(ir.out_dtype);

  std::string head = "// kiln kernel: " +
                     std::string(ir.kind == KernelIR::Kind::Map           ? "map"
                                 : ir.kind == KernelIR::Kind::InnerReduce ? "reduce"
                                 : ir.kind == KernelIR::Kind::Rows        ? "rows"
                                                                          : "scatter") +
                     "\n// ops:";
  for (const std::string& op : ir.source_ops) head += " " + op;
  head += "\n";
  std::string sig =
      "extern \"C\" void KILN_ENTRY(char** __restrict bufs, const i64* __restrict params, i64 "
      "begin, i64 end, i64 part) {\n";
  // The parameters are copied into a local array first. Read through the pointer, a
  // parameter used only under a guard (a padded or concatenated piece's stride) is loaded
  // inside the guard, which the compiler cannot hoist, so the vectorized loop gathered it
  // per lane and then gathered the data through it: a sum of 9 padded slices took 11 ns
  // per element instead of 1.
  const int n_params = params_read(ir);
  std::string pro = n_params == 0 ? "  const i64* P = params;\n"
                                  : "  const i64 P[" + std::to_string(n_params) + "] = {";
  for (int k = 0; k < n_params; ++k)
    pro +=
        (k ? ", params[" : "params[") + std::to_string(k) + "]" + (k + 1 == n_params ? "};\n" : "");
  pro += "  " + out_t + "* __restrict out = (" + out_t + "*)bufs[0];\n";
  for (size_t k = 0; k < n_in; ++k) {
    std::string t = storage_type(ir.inputs[k]);
    pro += "  const " + t + "* __restrict b" + std::to_string(k + 1) + " = (const " + t +
           "*)bufs[" + std::to_string(k + 1) + "];\n";
  }
  pro += "  i64* err = (i64*)bufs[" + std::to_string(n_in + 2) +
         "];\n  (void)err; (void)part; (void)P;\n";
  std::vector<std::string> d;
  for (int k = 0; k < rank; ++k) {
    d.push_back("d" + std::to_string(k));
    pro += "  const i64 d" + std::to_string(k) + " = " + index_str(ir.dims[k]) + ";\n";
  }
  if (rank == 0) {
    d.push_back("d0");
    pro += "  const i64 d0 = 1;\n";
  }
  for (const RowStage& st : ir.stages)
    for (size_t m = 0; m < st.dims.size(); ++m)
      pro += "  const i64 d" + std::to_string(st.first_var + static_cast<int>(m)) + " = " +
             index_str(st.dims[m]) + ";\n";
  const int r = std::max(rank, 1);
  std::string body;

  // Chunked walk over a flat range [begin, end) of the first `r` vars: rows of the last var.
  auto flat_walk = [&](const std::string& inner) {
    std::string s = "  i64 rem = begin;\n";
    for (int k = r - 1; k >= 0; --k) {
      s += "  i64 c" + std::to_string(k) + " = rem % " + d[k] + "; rem /= " + d[k] + ";\n";
    }
    s += "  (void)rem;\n  i64 flat = begin;\n  while (flat < end) {\n";
    s += "    i64 len = " + d[r - 1] + " - c" + std::to_string(r - 1) +
         ";\n    if (len > end - flat) len = end - flat;\n";
    for (int k = 0; k + 1 < r; ++k)
      s += "    const i64 i" + std::to_string(k) + " = c" + std::to_string(k) + ";\n";
    s += inner;
    s += "    flat += len;\n    c" + std::to_string(r - 1) + " = 0;\n";
    for (int k = r - 2; k >= 0; --k) {
      s += std::string(2 * (r - 1 - k) + 2, ' ') + "if (++c" + std::to_string(k) + " == " + d[k] +
           ") { c" + std::to_string(k) + " = 0;\n";
    }
    for (int k = r - 2; k >= 0; --k) s += std::string(2 * (k + 1) + 2, ' ') + "}\n";
    s += "  }\n";
    return s;
  };

  if (ir.kind == KernelIR::Kind::Rows) {
    body = rows_body(ir, d);
  } else if (ir.kind == KernelIR::Kind::Map) {
    // A map may run in place (jit/step_memory.cpp, assign_in_place): `out` is then the
    // buffer of an input read only at the element being written. `__restrict` on locals
    // does not reach clang's alias analysis, so the vectorizer checks for overlap at run
    // time and, finding it, runs the scalar loop: the Transformer's in-place softmax took
    // 30 ms instead of 3. Each element is read before it is written and no element reads
    // another's output, so the loop is safe to vectorize whatever the binding.
    const std::vector<int> drawn = rank > 0 ? row_drawn_randoms(ir, r - 1) : std::vector<int>{};
    const bool chunked = !drawn.empty();
    if (chunked) {
      p.random_word = [&drawn](int id) {
        return std::find(drawn.begin(), drawn.end(), id) == drawn.end()
                   ? std::string()
                   : "rw" + std::to_string(id) + "[j - j0]";
      };
    }
    const std::string inner_var = "i" + std::to_string(r - 1), row_at = "c" + std::to_string(r - 1);
    auto loop = [&](const std::string& indent) {
      return "#if defined(__clang__)\n#pragma clang loop vectorize(assume_safety)\n"
             "#elif defined(__GNUC__)\n#pragma GCC ivdep\n#endif\n" +
             indent +
             (chunked ? "for (i64 j = j0; j < j1; ++j) {\n" : "for (i64 j = 0; j < len; ++j) {\n") +
             indent + "  const i64 " + inner_var + " = " + row_at + " + j;\n";
    };
    auto store = [&](const std::string& indent) {
      return indent +
             "out[flat + j] = " + store_expr(ir.out_dtype, "v" + std::to_string(ir.result)) + ";\n";
    };
    std::string inner = rank > 0 ? RowSplit(ir, p, r - 1).print(loop, store) : "";
    if (inner.empty()) {
      // Index checks that hold for the whole row run once ahead of its loop (where it has
      // elements), so that no call is left in a loop the vectorizer could take.
      std::string hoisted;
      p.hoisted = rank > 0 ? &hoisted : nullptr;
      p.hoist_var = r - 1;
      p.emit_values();
      p.hoisted = nullptr;
      inner = (hoisted.empty() ? "" : "    if (len > 0) {\n" + hoisted + "    }\n") + loop("    ") +
              p.body + store("      ") + "    }\n";
    }
    if (chunked) {
      // The row in chunks, each drawing its words first (the index at the chunk's start).
      std::string head =
          "    for (i64 j0 = 0; j0 < len; j0 += kiln_rng_chunk) {\n"
          "      const i64 j1 = len - j0 < kiln_rng_chunk ? len : j0 + kiln_rng_chunk;\n";
      for (int id : drawn) {
        const IrValue& x = ir.values[static_cast<size_t>(id)];
        const std::string n = std::to_string(id);
        head += "      u32 rb" + n + "[kiln_rng_chunk + 4];\n      const u32* rw" + n +
                ";\n      {\n        const i64 " + inner_var + " = " + row_at +
                " + j0;\n        rw" + n + " = philox_words(P[" + std::to_string(x.seed_param) +
                "], P[" + std::to_string(x.seed_param + 1) + "], " + index_str(x.index) +
                ", j1 - j0, rb" + n + ");\n      }\n";
      }
      inner = head + inner + "    }\n";
    }
    body = flat_walk(inner);
  } else if (ir.kind == KernelIR::Kind::InnerReduce) {
    p.emit_values();
    const std::string x = "v" + std::to_string(ir.result);
    const DType acc = accumulator_dtype(ir);
    const std::string init = "    " + acc_t + " total = (" + acc_t + ")" +
                             identity_literal(kCppDialect, ir.reduce, ir.out_dtype) + ";\n";
    if (ir.kept == 0) {
      // Whole-domain reduction: this call's slice of the flat range goes to partial `part`.
      const std::string inner_var = "i" + std::to_string(r - 1),
                        row_at = "c" + std::to_string(r - 1);
      auto lane = [&](const std::string& j) {
        return "      const i64 " + inner_var + " = " + row_at + " + " + j + ";\n" + p.body;
      };
      body = init + flat_walk(reduce_loop(acc, ir.reduce, "total", lane, x, "len")) + "  ((" +
             acc_t + "*)bufs[" + std::to_string(n_in + 1) + "])[part] = total;\n";
    } else {
      std::string s = "  for (i64 o = begin; o < end; ++o) {\n    i64 rem = o;\n";
      for (int k = ir.kept - 1; k >= 0; --k) {
        s +=
            "    const i64 i" + std::to_string(k) + " = rem % " + d[k] + "; rem /= " + d[k] + ";\n";
      }
      s += "    (void)rem;\n" + init;
      if (ir.kept == rank) {
        s += "    {\n" + p.body + "      total = " + combine(ir.reduce, "total", x) + ";\n    }\n";
      } else {
        std::string loops;
        int depth = 0;
        for (int k = ir.kept; k + 1 < rank; ++k, ++depth) {
          loops += "    for (i64 i" + std::to_string(k) + " = 0; i" + std::to_string(k) + " < " +
                   d[k] + "; ++i" + std::to_string(k) + ") {\n";
        }
        const std::string last = "i" + std::to_string(rank - 1);
        auto lane = [&](const std::string& j) {
          return "      const i64 " + last + " = " + j + ";\n" + p.body;
        };
        loops += reduce_loop(acc, ir.reduce, "total", lane, x, d[rank - 1]);
        for (int k = 0; k < depth; ++k) loops += "    }\n";
        s += loops;
      }
      s += "    out[o] = " + store_expr(ir.out_dtype, "total") + ";\n  }\n";
      body = s;
    }
  } else {
    p.emit_values();
    std::string s;
    for (int k = 0; k < rank; ++k) {
      std::string lo = k == ir.parallel_var ? "begin" : "0",
                  hi = k == ir.parallel_var ? "end" : d[k];
      s += std::string(2 * k + 2, ' ') + "for (i64 i" + std::to_string(k) + " = " + lo + "; i" +
           std::to_string(k) + " < " + hi + "; ++i" + std::to_string(k) + ") {\n";
    }
    if (rank == 0) s += "  do {\n";
    s += p.body;
    if (ir.store_guard >= 0) s += "      if (!v" + std::to_string(ir.store_guard) + ") continue;\n";
    std::string at = "out[" + index_str(ir.store_index) + "]";
    const std::string x = "(" + acc_t + ")v" + std::to_string(ir.result);
    if (ir.injective) {
      // What the accumulator path stores for an output with one term: the identity
      // combined with it, in the accumulator's type, converted as the executor converts.
      const std::string one = combine(
          ir.reduce, "(" + acc_t + ")" + identity_literal(kCppDialect, ir.reduce, ir.out_dtype), x);
      s += "      " + at + " = " + store_total_expr(ir.out_dtype, one) + ";\n";
    } else {
      s += "      " + at + " = " + combine(ir.reduce, at, x) + ";\n";
    }
    for (int k = rank - 1; k >= 0; --k) s += std::string(2 * k + 2, ' ') + "}\n";
    if (rank == 0) s += "  } while (0);\n";
    body = s;
  }

  std::string kernel = sig + pro + body + "}\n";
  std::string text = head + prelude_for(kernel) + kernel;
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
