#pragma once
// Kernel IR: what one generated kernel computes, independent of the language it is printed
// in. A loop nest over a domain (the output's coordinates, or the reduction input's), a
// DAG of scalar values (loads through composed index expressions, constants, ops), and one
// store — plain or accumulating. Sizes, strides and offsets are kernel parameters
// (IndexExpr::param), never literals, so one kernel serves every batch size.
#include <cstdint>
#include <string>
#include <vector>

#include "../core/node.h"
#include "fuse.h"

namespace kiln::jit {

/// One scalar value of the kernel's expression DAG.
struct IrValue {
  enum class Kind : uint8_t {
    Load,     ///< input buffer `buffer` at flat element offset `index` (guarded by `guard`)
    Const,    ///< the number `value`
    Coord,    ///< the integer `index` (an iota value)
    Op,       ///< elementwise meta-op `op` of `args`
    Cast,     ///< args[0] converted to `dtype`
    Random,   ///< Philox value for flat index `index`; seed and offset are params `seed_param`, +1
    InRange,  ///< bool: every `bounds[k].first` lies in [0, bounds[k].second)
    Stage,    ///< Rows: the per-row total of reduction stage `stage` (in `dtype`)
  };
  Kind kind = Kind::Const;
  DType dtype = DType::Float32;
  OpCode op = OpCode::Add;
  std::vector<int> args;
  int buffer = -1;
  IndexExpr index;
  /// Load: value when the guard (an InRange value) is false.
  int guard = -1;
  Scalar value;
  /// Const: the kernel parameter that holds the value's float64 bits, or -1 when the value
  /// is printed as a literal. Values are parameters so that one kernel serves every value.
  int param = -1;
  /// Random: normal (true) or uniform.
  bool normal = false;
  int seed_param = -1;
  std::vector<std::pair<IndexExpr, IndexExpr>> bounds;
  /// InRange: per bound, whether violating it is an IndexError (data-dependent reads).
  std::vector<bool> bound_is_error;
  /// InRange: per bound, the KernelIR::error_sites entry it reports, or -1.
  std::vector<int> bound_site;
  /// Stage: the KernelIR::stages entry whose total this is.
  int stage = -1;
};

/// Rows: one reduction computed per row of the kernel's outer domain before the row's
/// store, whose total later stages and the store read as a Stage value.
struct RowStage {
  ReduceOp reduce = ReduceOp::Sum;
  /// The reduction's dtype: its total is rounded to it, as a stored value would be.
  DType dtype = DType::Float32;
  /// Extents of the reduced dims (params); they are domain vars first_var.. of the kernel.
  std::vector<IndexExpr> dims;
  int first_var = 0;
  /// The value reduced (over the outer vars and this stage's vars).
  int value = -1;
};

/// A whole kernel.
struct KernelIR {
  enum class Kind : uint8_t {
    Map,          ///< out[i] = value(i) over the output domain
    InnerReduce,  ///< out[kept] = reduce over trailing domain vars of value(kept, reduced)
    Scatter,      ///< out[store_index(i)] op= value(i) over the input domain, in order
    Rows,         ///< per row of the `kept` outer vars: the stages in order, then
                  ///< out[row, inner] = value(row, inner) over the remaining domain vars
  };
  Kind kind = Kind::Map;
  /// Domain sizes, outermost first (params).
  std::vector<IndexExpr> dims;
  /// InnerReduce, Rows: the number of leading (kept, outer) domain vars.
  int kept = 0;
  /// Rows: the reductions computed per row, in order (a stage reads only earlier ones).
  std::vector<RowStage> stages;
  /// Scatter: the domain var split across threads (its range is [begin, end)), or -1: serial.
  int parallel_var = -1;
  /// Scatter: no two domain points store to the same output, so the CPU kernel writes
  /// combine(identity, value) in the output's dtype straight into the output (filled with
  /// the identity first) instead of accumulating in a float64/int64 array.
  bool injective = false;
  /// Input buffers (slot 1.. in the kernel's buffer array; slot 0 is the output).
  std::vector<DType> inputs;
  DType out_dtype = DType::Float32;
  std::vector<IrValue> values;
  int result = -1;
  ReduceOp reduce = ReduceOp::Sum;
  /// Scatter: flat output offset and the bounds it must satisfy (skipped otherwise).
  IndexExpr store_index;
  int store_guard = -1;
  /// Number of int64 parameters the kernel reads.
  int num_params = 0;
  /// Whether any value can raise IndexError (the kernel then gets an error record).
  bool can_fail = false;
  /// Where an IndexError can come from: the user-level op, the dimension and the shape
  /// indexed, so the executor's message names them.
  struct ErrorSite {
    std::string op;
    int dim;
    Shape shape;
  };
  std::vector<ErrorSite> error_sites;
  /// Ops this kernel came from (user-level names), for the header comment and metadata.
  std::vector<std::string> source_ops;

  /// Readable multi-line dump.
  std::string dump() const;
  /// Structural hash: equal for kernels that print the same source (parameter values are
  /// not part of it), so launches can find their compiled kernel without printing.
  uint64_t structure_hash() const;
};

/// A lowered kernel plus the parameter values and buffers of this particular launch.
struct LoweredKernel {
  KernelIR ir;
  std::vector<int64_t> params;
  /// Nodes whose buffers are inputs 1.. (in order).
  std::vector<Node*> input_nodes;
  /// Total iterations of the parallel range the executor splits across threads.
  int64_t parallel_extent = 0;
  /// Rows: elements the whole launch visits (its stages' inputs and its output), so the
  /// executor can size the rows each thread takes.
  int64_t work = 0;
};

/// Lowers one fusion group to kernel IR with this launch's parameters. Throws
/// RowsUnsupported when the group holds a reduction it cannot compute as a row stage.
LoweredKernel lower(const FusionGroup& group);

/// A Rows kernel without outer dims (reductions over everything) runs on one thread: only
/// while its stages and its store visit at most this many elements each.
constexpr int64_t kSerialRowElements = int64_t{1} << 16;

/// A reduction inlined into a group that cannot run as one of its row stages (it is read
/// at other coordinates than the kernel's rows, or the group's rows differ from its own).
/// The fusion pass stores such a reduction instead.
struct RowsUnsupported {
  Node* reduction;
};

/// The number of leading input dims a reduction keeps when it is "standard" at its
/// current sizes (kept dims in order, then a reduced trailing block; output dims of size 1
/// at 0 anywhere), or -1. Standard reductions run as inner loops and can be row stages.
int standard_reduction_kept(const Node& reduction);

/// Throws the IndexError a kernel's error record (err[1] site, err[2] value, err[3] size)
/// describes, naming the user-level op and the shape it indexed.
[[noreturn]] void raise_kernel_index_error(const KernelIR& ir, const Node& root,
                                           const int64_t* err);

}  // namespace kiln::jit
