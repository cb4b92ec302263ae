#pragma once
// Expression printing shared by the C++ and CUDA printers: types, literals, index
// expressions, casts, reduction combines and the walk that prints a kernel's value DAG as
// statements. Both languages spell values alike (their preludes define the same helper
// names: h2f, f2h, odd_f, sat, nan_max, kiln_index_error, ...), so only the few spellings
// that cannot be shared are parameters (Dialect).
#include <functional>
#include <string>
#include <vector>

#include "kernel_ir.h"

namespace kiln::jit {

/// Element type of reduction accumulators and partials: float32 or float64 for floating
/// outputs (float64 for scatters, which accumulate exactly as the reference does), int64
/// otherwise.
DType accumulator_dtype(const KernelIR& ir);

namespace printing {

/// What the printed languages spell differently.
struct Dialect {
  const char* inf_f;  ///< +infinity as float
  const char* inf_d;  ///< +infinity as double
  const char* nan_f;  ///< quiet NaN as float
  const char* nan_d;  ///< quiet NaN as double
  /// Prefix of a call that reinterprets an i64 expression's bits as a double.
  const char* double_from_bits;
};
/// GNU C++ (both CPU compilers).
extern const Dialect kCppDialect;
/// CUDA C++ as NVRTC reads it (no GNU builtins in device code).
extern const Dialect kCudaDialect;

/// The type values of `t` are computed in: float, double or i64.
std::string compute_type(DType t);
/// The type elements of `t` are stored as (u16 for float16/bfloat16).
std::string storage_type(DType t);
/// Brings a compute-type expression to the values representable in `t` (wraps integers,
/// rounds through float16/bfloat16).
std::string normalize(DType t, const std::string& e);
/// Compute-type value of the stored element `ref` of dtype `t`.
std::string load_expr(DType t, const std::string& ref);
/// Stored form of compute-type value `v` for dtype `t`.
std::string store_expr(DType t, const std::string& v);
/// Stored form of a float64/int64 total `v` for dtype `t`, converted as the reference and
/// the executor convert an accumulator: 16-bit floats round once (through float rounded to
/// odd).
std::string store_total_expr(DType t, const std::string& v);
/// An exact literal of `v` in the compute type of `t` (hex floats).
std::string float_literal(const Dialect& d, double v, DType t);
std::string int_literal(int64_t v);
/// An index expression over domain vars i<k>, params P[k] and index buffers b<k>.
std::string index_str(const IndexExpr& e);
/// Converts compute-type `x` of dtype `from` to dtype `to` as the reference does.
std::string cast_expr(DType from, DType to, const std::string& x);
/// The identity of reduction `op` over `dtype` (a literal in the accumulator type).
std::string identity_literal(const Dialect& d, ReduceOp op, DType dtype);
/// `acc` combined with `x` by reduction `op`.
std::string combine(ReduceOp op, const std::string& acc, const std::string& x);

/// The values `root` depends on, itself included (Stage values have no operands: they name
/// a row's total computed before): what one loop of a Rows kernel prints.
std::vector<char> cone(const KernelIR& ir, int root);

/// Whether `e` depends on domain var i<k>.
bool mentions_var(const IndexExpr& e, int k);
/// How many kernel parameters the printed code reads (P[0] up to P[result - 1]).
int params_read(const KernelIR& ir);

/// Prints the value DAG of `ir` as `const T vN = ...;` statements (and the IndexError
/// checks of data-dependent reads) into `body`.
struct ValuePrinter {
  ValuePrinter(const KernelIR& kernel, const Dialect& language) : ir(kernel), dialect(language) {}

  const KernelIR& ir;
  const Dialect& dialect;
  std::string indent = "      ";
  /// When set with `hoist_var`, the IndexError checks of gathers whose indices do not
  /// depend on domain var i<hoist_var> go here instead of before their value: the caller
  /// prints them once ahead of that var's loop, since a call inside the loop keeps it from
  /// vectorizing (an embedding's row loop in a layer norm's kernel).
  std::string* hoisted = nullptr;
  int hoist_var = -1;
  /// Stored element a load reads; empty = `b<buffer>[index]`. The CUDA printer reads
  /// vector-loaded values from registers through it.
  std::function<std::string(int id, const IrValue& load)> load_ref;
  /// The 32 random bits a uniform Random value takes, as an expression (the C++ printer
  /// makes a row's words ahead of its loop); empty = drawn per element.
  std::function<std::string(int id)> random_word;
  std::string body;

  void emit_values();
  /// The statement(s) defining value `id`, as emit_values prints them. `side` resolves a
  /// select (Where) or a guarded load whose condition is known: 1 the condition holds (the
  /// select's first choice, the load unguarded), 0 it does not (the second choice, zero).
  std::string statement(int id, int side = -1) const;

 private:
  std::string bounds_check(const IrValue& g, bool errors_only, bool only_nonerror) const;
};

}  // namespace printing
}  // namespace kiln::jit
