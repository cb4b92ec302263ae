#pragma once
// The meta-ops: the only operations the graph holds and the code generators print. Each
// line gives the op's identifier, its printed name, its family and its number of inputs
// (-1: variable). What an op computes (dtype rule, scalar expression, reference evaluation)
// is defined next to it in ops/; this list is the identity that core and passes share.
#include <cstdint>
#include <string_view>

namespace kiln {

/// How an op maps inputs to outputs; passes query families rather than individual ops.
/// Transfer moves a value between devices; it never fuses and is not printed as a kernel.
/// Custom runs a user's kernel (kiln::custom_kernel): opaque to the passes, it never fuses,
/// and its inputs and output are stored.
enum class OpFamily : uint8_t { Source, Elementwise, Reindex, ReindexReduce, Transfer, Custom };

// clang-format off
#define KILN_META_OPS(X)                                          \
  /* sources */                                                   \
  X(Constant, "constant", Source, 0)                              \
  X(Full, "full", Source, 0)                                      \
  X(Iota, "index", Source, 0)                                     \
  X(RandUniform, "rand", Source, 0)                               \
  X(RandNormal, "randn", Source, 0)                               \
  /* unary */                                                     \
  X(Cast, "cast", Elementwise, 1)                                 \
  X(Neg, "neg", Elementwise, 1)                                   \
  X(Abs, "abs", Elementwise, 1)                                   \
  X(Sign, "sign", Elementwise, 1)                                 \
  X(Exp, "exp", Elementwise, 1)                                   \
  X(Exp2, "exp2", Elementwise, 1)                                 \
  X(Log, "log", Elementwise, 1)                                   \
  X(Log2, "log2", Elementwise, 1)                                 \
  X(Log1p, "log1p", Elementwise, 1)                               \
  X(Expm1, "expm1", Elementwise, 1)                               \
  X(Sqrt, "sqrt", Elementwise, 1)                                 \
  X(Rsqrt, "rsqrt", Elementwise, 1)                               \
  X(Reciprocal, "reciprocal", Elementwise, 1)                     \
  X(Sin, "sin", Elementwise, 1)                                   \
  X(Cos, "cos", Elementwise, 1)                                   \
  X(Tan, "tan", Elementwise, 1)                                   \
  X(Tanh, "tanh", Elementwise, 1)                                 \
  X(Sigmoid, "sigmoid", Elementwise, 1)                           \
  X(Erf, "erf", Elementwise, 1)                                   \
  X(Floor, "floor", Elementwise, 1)                               \
  X(Ceil, "ceil", Elementwise, 1)                                 \
  X(Round, "round", Elementwise, 1)                               \
  X(Trunc, "trunc", Elementwise, 1)                               \
  X(LogicalNot, "logical_not", Elementwise, 1)                    \
  X(BitwiseNot, "bitwise_not", Elementwise, 1)                    \
  /* binary */                                                    \
  X(Add, "add", Elementwise, 2)                                   \
  X(Sub, "sub", Elementwise, 2)                                   \
  X(Mul, "mul", Elementwise, 2)                                   \
  X(Div, "div", Elementwise, 2)                                   \
  X(FloorDiv, "floor_div", Elementwise, 2)                        \
  X(Mod, "mod", Elementwise, 2)                                   \
  X(Pow, "pow", Elementwise, 2)                                   \
  X(Maximum, "maximum", Elementwise, 2)                           \
  X(Minimum, "minimum", Elementwise, 2)                           \
  X(Eq, "eq", Elementwise, 2)                                     \
  X(Ne, "ne", Elementwise, 2)                                     \
  X(Lt, "lt", Elementwise, 2)                                     \
  X(Le, "le", Elementwise, 2)                                     \
  X(Gt, "gt", Elementwise, 2)                                     \
  X(Ge, "ge", Elementwise, 2)                                     \
  X(LogicalAnd, "logical_and", Elementwise, 2)                    \
  X(LogicalOr, "logical_or", Elementwise, 2)                      \
  X(LogicalXor, "logical_xor", Elementwise, 2)                    \
  X(BitwiseAnd, "bitwise_and", Elementwise, 2)                    \
  X(BitwiseOr, "bitwise_or", Elementwise, 2)                      \
  X(BitwiseXor, "bitwise_xor", Elementwise, 2)                    \
  /* ternary */                                                   \
  X(Where, "where", Elementwise, 3)                               \
  /* index maps */                                                \
  X(Reindex, "reindex", Reindex, -1)                              \
  X(ReindexReduce, "reindex_reduce", ReindexReduce, -1)         \
  /* placement */                                                 \
  X(Transfer, "to_device", Transfer, 1)                           \
  /* user kernels */                                              \
  X(Custom, "custom", Custom, -1)
// clang-format on

/// Identifies a meta-op.
enum class OpCode : uint8_t {
#define KILN_X(id, name, family, arity) id,
  KILN_META_OPS(KILN_X)
#undef KILN_X
};

/// Printed name of an op ("add", "reindex_reduce").
std::string_view op_name(OpCode op);
/// The op's family.
OpFamily op_family(OpCode op);
/// Number of inputs, or -1 for reindex ops (data input plus index tensors) and custom kernels.
int op_arity(OpCode op);

/// The combining operator of a reindex-reduce.
enum class ReduceOp : uint8_t { Sum, Prod, Max, Min, And, Or };
/// "sum", "prod", "max", "min", "and", "or".
std::string_view reduce_name(ReduceOp op);

}  // namespace kiln
