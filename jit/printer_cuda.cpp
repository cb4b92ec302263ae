// The CUDA printer. Values are printed by printer_common.cpp exactly as for the CPU; this
// file maps the three kernel kinds onto the GPU:
//   Map          grid-stride over output elements; when the last dim is a multiple of the
//                vector width, each thread handles one 16-byte chunk of the output, and
//                loads contiguous along the last dim are read as vectors where aligned.
//   InnerReduce  kept > 0: a warp per output row (a block for long rows), shuffle combine;
//                kept == 0: per-block partials into the scratch, then one block combines
//                them in fixed order (in double, as the CPU executor does).
//   Scatter      no float atomics: the accumulator array (scratch) is filled with the
//                identity, each thread owns one value of the parallel var and walks the
//                other vars in order (the CPU's order), then the scratch is converted.
// Every combine order depends only on the launch configuration, so results are
// deterministic.
#include "printer_cuda.h"

#include <algorithm>
#include <cstdio>

#include "hash.h"

namespace kiln::jit {
namespace {

using namespace printing;

const char* kPrelude =
#include "cuda_prelude.inc"
    ;

constexpr int kBlock = 256;
// Rows at least this long are reduced by a whole block instead of one warp.
constexpr int64_t kBlockRow = 2048;

std::string num(int64_t v) { return std::to_string(v); }
std::string var(int k) { return "i" + num(k); }

void add_terms(const IndexExpr& e, std::vector<IndexExpr>& terms) {
  if (e.kind() != IndexExpr::Kind::Add) return terms.push_back(e);
  for (const IndexExpr& a : e.args()) add_terms(a, terms);
}

// When `index` is base + i<k> (unit coefficient, base free of i<k>), stores base: the
// elements read by consecutive i<k> are then consecutive in memory.
bool unit_stride_base(const IndexExpr& index, int k, IndexExpr& base) {
  std::vector<IndexExpr> terms;
  add_terms(index, terms);
  bool found = false;
  base = IndexExpr::constant(0);
  for (const IndexExpr& t : terms) {
    bool unit = t.kind() == IndexExpr::Kind::Var && t.value() == k;
    if (t.kind() == IndexExpr::Kind::Mul) {
      const IndexExpr &x = t.args()[0], &y = t.args()[1];
      unit =
          (x.kind() == IndexExpr::Kind::Var && x.value() == k && y.is_const() && y.value() == 1) ||
          (y.kind() == IndexExpr::Kind::Var && y.value() == k && x.is_const() && x.value() == 1);
    }
    if (unit && !found)
      found = true;
    else if (mentions_var(t, k))
      return false;
    else
      base = base + t;
  }
  return found;
}

int storage_bytes(DType t) { return static_cast<int>(itemsize(t)); }

// Declares i<first>..i<last> from the flat number `flat` of the row-major box they span.
std::string decompose(const std::string& flat, int first, int last, const std::string& indent) {
  if (first > last) return "";
  std::string s = indent + "i64 rem_" + var(first) + " = " + flat + ";\n";
  for (int k = last; k > first; --k)
    s += indent + "const i64 " + var(k) + " = rem_" + var(first) + " % d" + num(k) + "; rem_" +
         var(first) + " /= d" + num(k) + ";\n";
  return s + indent + "const i64 " + var(first) + " = rem_" + var(first) + ";\n";
}

struct CudaPrinter {
  const KernelIR& ir;
  const size_t n_in;
  const int rank;
  const std::string acc_t;

  explicit CudaPrinter(const KernelIR& k)
      : ir(k),
        n_in(k.inputs.size()),
        rank(static_cast<int>(k.dims.size())),
        acc_t(compute_type(accumulator_dtype(k))) {}

  std::string values(const std::string& indent,
                     std::function<std::string(int, const IrValue&)> load_ref = nullptr) const {
    ValuePrinter p(ir, kCudaDialect);
    p.indent = indent;
    p.load_ref = std::move(load_ref);
    p.emit_values();
    return p.body;
  }
  std::string result() const { return "v" + num(ir.result); }

  std::string stage(const std::string& name, const std::string& out_t,
                    const std::string& body) const {
    std::string s = "extern \"C\" __global__ void __launch_bounds__(" + num(kBlock) +
                    ") KILN_ENTRY_" + name + "(const KArgs a, const i64 extent) {\n";
    s += "  " + out_t + "* __restrict__ out = (" + out_t + "*)a.b[0];\n";
    for (size_t k = 0; k < n_in; ++k) {
      std::string t = storage_type(ir.inputs[k]);
      s += "  const " + t + "* __restrict__ b" + num(k + 1) + " = (const " + t + "*)a.b[" +
           num(k + 1) + "];\n";
    }
    s += "  " + acc_t + "* __restrict__ scratch = (" + acc_t + "*)a.b[" + num(n_in + 1) + "];\n";
    s += "  i64* err = (i64*)a.b[" + num(n_in + 2) + "];\n  const i64* P = a.P;\n";
    for (int k = 0; k < rank; ++k)
      s += "  const i64 d" + num(k) + " = " + index_str(ir.dims[k]) + ";\n";
    for (const RowStage& st : ir.stages)
      for (size_t m = 0; m < st.dims.size(); ++m)
        s += "  const i64 d" + num(st.first_var + static_cast<int>(m)) + " = " +
             index_str(st.dims[m]) + ";\n";
    s += "  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x, nthreads = (i64)gridDim.x "
         "* blockDim.x;\n";
    s += "  (void)out; (void)scratch; (void)err; (void)P; (void)tid; (void)nthreads;\n";
    return s + body + "}\n";
  }

  // Elementwise: a vector path over 16-byte output chunks, else one element per step.
  std::string map_body() const {
    std::string s;
    const std::string out_t = storage_type(ir.out_dtype);
    const int vec = 16 / storage_bytes(ir.out_dtype);
    if (rank >= 1 && vec > 1) {
      const int last = rank - 1;
      const std::string d_last = "d" + num(last), V = num(vec);
      std::string pre;
      std::vector<bool> vectored(ir.values.size(), false);
      for (size_t id = 0; id < ir.values.size(); ++id) {
        const IrValue& x = ir.values[id];
        IndexExpr base;
        if (x.kind != IrValue::Kind::Load || x.guard >= 0 || !unit_stride_base(x.index, last, base))
          continue;
        vectored[id] = true;
        const std::string t = storage_type(x.dtype), r = "r" + num(static_cast<int64_t>(id));
        const int bytes = std::min(16, vec * storage_bytes(x.dtype));
        pre += "      alignas(16) " + t + " " + r + "[" + V + "];\n      {\n        const " + t +
               "* src = b" + num(x.buffer) + " + " + index_str(base) +
               " + col;\n        if (aligned_to(src, " + num(bytes) + ")) load_vec<" + t + ", " +
               V + ">(" + r + ", src);\n        else for (int l = 0; l < " + V + "; ++l) " + r +
               "[l] = src[l];\n      }\n";
      }
      auto ref = [&](int id, const IrValue&) {
        return vectored[id] ? "r" + num(id) + "[l]" : std::string();
      };
      s += "  if (" + d_last + " % " + V + " == 0 && aligned_to(out, 16)) {\n";
      s += "    for (i64 g = tid; g < extent / " + V +
           "; g += nthreads) {\n      const i64 flat = g * " + V + ", row = flat / " + d_last +
           ", col = flat - row * " + d_last + ";\n      (void)row;\n";
      s += decompose("row", 0, last - 1, "      ") + pre;
      s += "      alignas(16) " + out_t + " o[" + V +
           "];\n#pragma unroll\n      for (int l = 0; l < " + V + "; ++l) {\n        const i64 " +
           var(last) + " = col + l;\n";
      s += values("        ", ref) + "        o[l] = " + store_expr(ir.out_dtype, result()) +
           ";\n      }\n";
      s += "      load_vec<" + out_t + ", " + V + ">(out + flat, o);\n    }\n    return;\n  }\n";
    }
    s += "  for (i64 flat = tid; flat < extent; flat += nthreads) {\n";
    s += decompose("flat", 0, rank - 1, "    ") + values("    ");
    return s + "    out[flat] = " + store_expr(ir.out_dtype, result()) + ";\n  }\n";
  }

  // Accumulates the value over the reduced vars, numbered by `j` from `from` by `step`.
  std::string reduce_loop(const std::string& from, const std::string& step,
                          const std::string& count) const {
    std::string s = "      for (i64 j = " + from + "; j < " + count + "; j += " + step + ") {\n";
    s += decompose("j", ir.kept, rank - 1, "        ") + values("        ");
    return s + "        acc = Acc::op(acc, (" + acc_t + ")" + result() + ");\n      }\n";
  }

  std::string rows_body() const {
    std::string reduced = "1";
    for (int k = ir.kept; k < rank; ++k) reduced += " * d" + num(k);
    std::string s =
        "  const i64 reduced = " + reduced + ";\n  __shared__ " + acc_t + " smem[32];\n";
    const std::string store = "out[row] = " + store_expr(ir.out_dtype, "acc") + ";\n";
    s += "  if (reduced >= " + num(kBlockRow) +
         ") {\n    for (i64 row = blockIdx.x; row < extent; row += gridDim.x) {\n";
    s +=
        decompose("row", 0, ir.kept - 1, "      ") + "      " + acc_t + " acc = Acc::identity();\n";
    s += reduce_loop("threadIdx.x", "blockDim.x", "reduced");
    s += "      acc = block_reduce<Acc>(acc, smem);\n      if (threadIdx.x == 0) " + store +
         "    }\n    return;\n  }\n";
    s += "  const int lane = threadIdx.x & 31;\n";
    s += "  for (i64 row = tid >> 5; row < extent; row += nthreads >> 5) {\n";
    s +=
        decompose("row", 0, ir.kept - 1, "      ") + "      " + acc_t + " acc = Acc::identity();\n";
    s += reduce_loop("lane", "32", "reduced");
    return s + "      acc = warp_reduce<Acc>(acc);\n      if (lane == 0) " + store + "  }\n";
  }

  // The statements of the values `root` depends on.
  std::string cone_values(int root, const std::string& indent) const {
    const std::vector<char> need = cone(ir, root);
    ValuePrinter p(ir, kCudaDialect);
    p.indent = indent;
    std::string s;
    for (size_t i = 0; i < need.size(); ++i)
      if (need[i]) s += p.statement(static_cast<int>(i));
    return s;
  }

  static DType stage_acc_dtype(const RowStage& st) {
    if (!is_floating(st.dtype)) return DType::Int64;
    return st.dtype == DType::Float64 ? DType::Float64 : DType::Float32;
  }

  // One accumulator struct per stage (its own op and type).
  std::string stage_accumulators() const {
    std::string s;
    for (size_t k = 0; k < ir.stages.size(); ++k) {
      const RowStage& st = ir.stages[k];
      const std::string t = compute_type(stage_acc_dtype(st));
      s += "struct Acc" + num(static_cast<int64_t>(k)) + " {\n  typedef " + t +
           " T;\n  static __device__ __forceinline__ T identity() { return (T)" +
           identity_literal(kCudaDialect, st.reduce, st.dtype) +
           "; }\n  static __device__ __forceinline__ T op(T acc, T x) { return " +
           combine(st.reduce, "acc", "x") + "; }\n};\n";
    }
    return s;
  }

  // Rows: a block per row when its loops are long, else a warp per row. Each stage's
  // total reaches every thread of the row (a shuffle or shared memory), then the row's
  // elements are stored by the same threads.
  std::string rows_stages_body() const {
    std::string longest = "(i64)1";
    auto extent = [&](int first, int count) {
      std::string e = "(i64)1";
      for (int m = 0; m < count; ++m) e += " * d" + num(first + m);
      return e;
    };
    std::vector<std::string> stage_n;
    for (const RowStage& st : ir.stages) {
      stage_n.push_back(extent(st.first_var, static_cast<int>(st.dims.size())));
      longest = "max(" + longest + ", " + stage_n.back() + ")";
    }
    const std::string store_n = extent(ir.kept, rank - ir.kept);
    longest = "max(" + longest + ", " + store_n + ")";
    std::string s = "  const i64 longest = " + longest + ";\n";
    for (size_t k = 0; k < ir.stages.size(); ++k)
      s += "  __shared__ Acc" + num(static_cast<int64_t>(k)) + "::T smem" +
           num(static_cast<int64_t>(k)) + "[32];\n";
    auto row = [&](bool block) {
      const std::string first = block ? "threadIdx.x" : "lane", step = block ? "blockDim.x" : "32";
      std::string r = decompose("row", 0, ir.kept - 1, "    ");
      for (size_t k = 0; k < ir.stages.size(); ++k) {
        const RowStage& st = ir.stages[k];
        const std::string n = num(static_cast<int64_t>(k)), A = "Acc" + n;
        const int nd = static_cast<int>(st.dims.size());
        r += "    " + A + "::T acc" + n + " = " + A + "::identity();\n";
        r += "    for (i64 j = " + first + "; j < " + stage_n[k] + "; j += " + step + ") {\n";
        r += decompose("j", st.first_var, st.first_var + nd - 1, "      ");
        r += cone_values(st.value, "      ");
        r += "      acc" + n + " = " + A + "::op(acc" + n + ", (" + A + "::T)v" + num(st.value) +
             ");\n    }\n";
        if (block) {
          r += "    acc" + n + " = block_reduce<" + A + ">(acc" + n + ", smem" + n +
               ");\n    if (threadIdx.x == 0) smem" + n + "[0] = acc" + n +
               ";\n    __syncthreads();\n    acc" + n + " = smem" + n + "[0];\n";
        } else {
          r += "    acc" + n + " = warp_reduce<" + A + ">(acc" + n + ");\n    acc" + n +
               " = __shfl_sync(0xffffffffu, acc" + n + ", 0);\n";
        }
        r += "    const " + compute_type(st.dtype) + " stage" + n + " = " +
             load_expr(st.dtype, store_expr(st.dtype, "acc" + n)) + ";\n";
      }
      const std::string res = "v" + num(ir.result);
      if (rank == ir.kept) {
        r += "    if (" + first + " == 0) {\n" + cone_values(ir.result, "      ") +
             "      out[row] = " + store_expr(ir.out_dtype, res) + ";\n    }\n";
      } else {
        r += "    for (i64 j = " + first + "; j < " + store_n + "; j += " + step + ") {\n";
        r += decompose("j", ir.kept, rank - 1, "      ") + cone_values(ir.result, "      ");
        r += "      out[row * " + store_n + " + j] = " + store_expr(ir.out_dtype, res) +
             ";\n    }\n";
      }
      if (block) r += "    __syncthreads();  // the next row reuses the shared totals\n";
      return r;
    };
    s += "  if (longest >= " + num(kBlockRow) +
         ") {\n  for (i64 row = blockIdx.x; row < extent; row += gridDim.x) {\n" + row(true) +
         "  }\n  return;\n  }\n";
    s += "  const int lane = threadIdx.x & 31;\n";
    s +=
        "  for (i64 row = tid >> 5; row < extent; row += nthreads >> 5) {\n" + row(false) + "  }\n";
    return s;
  }

  std::string partials_body() const {
    std::string s =
        "  " + acc_t + " acc = Acc::identity();\n  __shared__ " + acc_t + " smem[32];\n  {\n";
    s += reduce_loop("tid", "nthreads", "extent");
    return s +
           "  }\n  acc = block_reduce<Acc>(acc, smem);\n  if (threadIdx.x == 0) "
           "scratch[blockIdx.x] = acc;\n";
  }

  std::string store_total(const std::string& total) const {
    return store_total_expr(ir.out_dtype, total);
  }

  std::string combine_body() const {
    std::string s = "  __shared__ Total::T smem[32];\n  Total::T acc = Total::identity();\n";
    s += "  for (i64 k = threadIdx.x; k < extent; k += blockDim.x) acc = Total::op(acc, "
         "(Total::T)scratch[k]);\n";
    return s + "  acc = block_reduce<Total>(acc, smem);\n  if (threadIdx.x == 0) out[0] = " +
           store_total("acc") + ";\n";
  }

  std::string scatter_body() const {
    std::string s = "  for (i64 p = tid; p < extent; p += nthreads) {\n";
    std::string close;
    for (int k = 0; k < rank; ++k) {
      std::string ind(2 * k + 4, ' ');
      if (k == ir.parallel_var) {
        s += ind + "{\n" + ind + "  const i64 " + var(k) + " = p;\n";
      } else {
        s += ind + "for (i64 " + var(k) + " = 0; " + var(k) + " < d" + num(k) + "; ++" + var(k) +
             ") {\n";
      }
      close = ind + "}\n" + close;
    }
    if (rank == 0) s += "    do {\n", close = "    } while (0);\n";
    const std::string ind(2 * rank + 6, ' ');
    s += values(ind);
    if (ir.store_guard >= 0) s += ind + "if (!v" + num(ir.store_guard) + ") continue;\n";
    const std::string at = "scratch[" + index_str(ir.store_index) + "]";
    s += ind + at + " = " + combine(ir.reduce, at, "(" + acc_t + ")" + result()) + ";\n";
    return s + close + "  }\n";
  }

  std::string accumulator(const std::string& name, const std::string& t) const {
    return "struct " + name + " {\n  typedef " + t +
           " T;\n  static __device__ __forceinline__ T identity() { return (T)" +
           identity_literal(kCudaDialect, ir.reduce, ir.out_dtype) +
           "; }\n  static __device__ __forceinline__ T op(T acc, T x) { return " +
           combine(ir.reduce, "acc", "x") + "; }\n};\n";
  }
};

}  // namespace

PrintedCudaKernel print_cuda(const KernelIR& ir) {
  CudaPrinter c(ir);
  PrintedCudaKernel k;
  k.num_buffers = static_cast<int>(ir.inputs.size()) + 3;
  k.num_params = std::max({ir.num_params, params_read(ir), 1});
  const std::string out_t = storage_type(ir.out_dtype);
  const char* kind = ir.kind == KernelIR::Kind::Map           ? "map"
                     : ir.kind == KernelIR::Kind::InnerReduce ? "reduce"
                     : ir.kind == KernelIR::Kind::Rows        ? "rows"
                                                              : "scatter";
  std::string text = "// kiln CUDA kernel: " + std::string(kind) + "\n// ops:";
  for (const std::string& op : ir.source_ops) text += " " + op;
  text += "\n" + std::string(kPrelude) + "namespace kiln {\nstruct KArgs {\n  char* b[" +
          num(k.num_buffers) + "];\n  i64 P[" + num(k.num_params) + "];\n};\n";
  using E = CudaStage::Extent;
  std::vector<std::pair<std::string, CudaStage>> stages;
  if (ir.kind == KernelIR::Kind::Map) {
    const int vec = ir.dims.empty() ? 1 : 16 / storage_bytes(ir.out_dtype);
    text += c.stage("map", out_t, c.map_body());
    stages.push_back({"map", {"", E::Work, kBlock, int64_t{kBlock} * vec, false}});
  } else if (ir.kind == KernelIR::Kind::Rows) {
    text += c.stage_accumulators();
    text += c.stage("rows", out_t, c.rows_stages_body());
    stages.push_back({"rows", {"", E::Work, kBlock, kBlock / 32, false}});
  } else if (ir.kind == KernelIR::Kind::InnerReduce) {
    text += c.accumulator("Acc", c.acc_t);
    if (ir.kept > 0) {
      text += c.stage("rows", out_t, c.rows_body());
      stages.push_back({"rows", {"", E::Work, kBlock, kBlock / 32, false}});
    } else {
      k.scratch = PrintedCudaKernel::Scratch::PerBlock;
      k.scratch_elem_bytes = static_cast<int>(itemsize(accumulator_dtype(ir)));
      text += c.accumulator("Total", c.acc_t == "float" ? "double" : c.acc_t);
      text += c.stage("partials", out_t, c.partials_body());
      text += c.stage("combine", out_t, c.combine_body());
      stages.push_back({"partials", {"", E::Work, kBlock, int64_t{kBlock} * 8, false}});
      stages.push_back({"combine", {"", E::Partials, kBlock, kBlock, true}});
    }
  } else {
    k.scratch = PrintedCudaKernel::Scratch::PerOutput;
    k.scratch_elem_bytes = static_cast<int>(itemsize(accumulator_dtype(ir)));
    const std::string fill = "  for (i64 i = tid; i < extent; i += nthreads) scratch[i] = (" +
                             c.acc_t + ")" +
                             identity_literal(kCudaDialect, ir.reduce, ir.out_dtype) + ";\n";
    const std::string finish =
        "  for (i64 i = tid; i < extent; i += nthreads) out[i] = " + c.store_total("scratch[i]") +
        ";\n";
    text += c.stage("init", out_t, fill) + c.stage("scatter", out_t, c.scatter_body()) +
            c.stage("finish", out_t, finish);
    stages.push_back({"init", {"", E::Output, kBlock, kBlock * 4, false}});
    stages.push_back({"scatter", {"", E::Work, kBlock, kBlock, false}});
    stages.push_back({"finish", {"", E::Output, kBlock, kBlock * 4, false}});
  }
  text += "}  // namespace kiln\n";

  // Entry names from the source, so equal kernels get equal names in every process.
  char base[32];
  std::snprintf(base, sizeof base, "kiln_cu%016llx",
                static_cast<unsigned long long>(hash128(text).lo));
  const std::string placeholder = "KILN_ENTRY_";
  for (size_t pos = text.find(placeholder); pos != std::string::npos;
       pos = text.find(placeholder, pos))
    text.replace(pos, placeholder.size(), std::string(base) + "_");
  for (auto& [name, stage] : stages) {
    stage.entry = std::string(base) + "_" + name;
    k.stages.push_back(stage);
  }
  k.source = std::move(text);
  return k;
}

}  // namespace kiln::jit
