// Kernel counts for known patterns, and that fused results agree with the reference
// evaluator. Inputs are evaluated first so that only the pattern itself is counted.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "frontend/kiln.h"
#include "jit/blas.h"
#include "jit/executor.h"
#include "jit/kernel_cache.h"
#include "jit/kernel_ir.h"
#include "jit/library_gemm.h"
#include "jit/printer_cpp.h"
#include "memory/pools/caching_pool.h"
#include "memory/pools/host_pool.h"
#include "memory/reports/plan_report.h"
#include "ops/reindex.h"

using namespace kiln;

namespace {

struct JitScope {
  JitScope() { set_executor("jit"); }
  ~JitScope() { set_executor(""); }
};

// Evaluates `build()` with the JIT and with the reference evaluator and checks they agree
// (relative and absolute `tolerance`, 1e-5 by default: float32 sums reassociate).
template <typename Build>
jit::EvalStats check_against_reference(Build build, double tolerance = 1e-5) {
  set_executor("jit");
  Tensor jit_out = build();
  eval({jit_out});
  jit::EvalStats stats = jit::last_eval_stats();
  set_executor("reference");
  Tensor ref_out = build();
  std::vector<double> want = ref_out.to_vector<double>();
  set_executor("");
  std::vector<double> got = jit_out.to_vector<double>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::fabs(got[i] - want[i]) <= tolerance + tolerance * std::fabs(want[i]));
  }
  return stats;
}

Tensor ready(Tensor t) {
  t.eval();
  return t;
}

// The one kernel evaluating `y` would run, lowered.
jit::LoweredKernel lower_only_kernel(const Tensor& y) {
  std::vector<Node*> outs{y.node().get()};
  jit::FusionPlan plan = jit::fuse(pending_subgraph(outs), {outs[0]});
  REQUIRE(plan.groups.size() == 1);
  return jit::lower(plan.groups[0]);
}

// Accumulation needs the library GEMM: without OpenBLAS there is nothing to test.
bool have_blas_or_warn() {
  if (!jit::cpu_gemm_available(DType::Float32))
    WARN("kiln built without OpenBLAS: no library GEMM to accumulate with");
  return jit::cpu_gemm_available(DType::Float32);
}

// Evaluated operands for n products x_i^T y_i (x_i [rows, m], y_i [rows, n]) and the sum of
// those products as autograd builds a shared weight's gradient: left to right.
struct Products {
  std::vector<Tensor> xs, ys;
  Products(Generator& g, int count, int64_t rows, int64_t m, int64_t n, DType dtype) {
    for (int i = 0; i < count; ++i) {
      xs.push_back(ready(randn({rows, m}, dtype, g)));
      ys.push_back(ready(randn({rows, n}, dtype, g)));
    }
  }
  Tensor sum() const {
    Tensor total = matmul(transpose(xs[0], 0, 1), ys[0]);
    for (size_t i = 1; i < xs.size(); ++i) total = total + matmul(transpose(xs[i], 0, 1), ys[i]);
    return total;
  }
};

}  // namespace

TEST_CASE("relu(a*b+c).sum() is one kernel", "[fusion]") {
  Generator g(11);
  Tensor a = ready(randn({300, 70}, DType::Float32, g));
  Tensor b = ready(randn({300, 70}, DType::Float32, g));
  Tensor c = ready(randn({70}, DType::Float32, g));
  jit::EvalStats s = check_against_reference([&] { return sum(relu(a * b + c)); });
  CHECK(s.kernels == 1);
}

TEST_CASE("a 6-op elementwise chain is one kernel", "[fusion]") {
  Generator g(12);
  Tensor a = ready(randn({1000}, DType::Float32, g));
  Tensor b = ready(rand({1000}, DType::Float32, g));
  jit::EvalStats s =
      check_against_reference([&] { return exp(((a * b + 1.0f) * 0.5f - a) / (b + 2.0f)); });
  CHECK(s.kernels == 1);
}

TEST_CASE("a broadcast add feeding a row reduction is one kernel", "[fusion]") {
  Generator g(13);
  Tensor x = ready(randn({64, 33}, DType::Float32, g));
  Tensor bias = ready(randn({33}, DType::Float32, g));
  jit::EvalStats s = check_against_reference([&] { return sum(x + bias, 1); });
  CHECK(s.kernels == 1);
}

TEST_CASE("row softmax takes at most 3 kernels", "[fusion]") {
  Generator g(14);
  Tensor x = ready(randn({50, 40}, DType::Float32, g));
  jit::EvalStats s = check_against_reference([&] { return softmax(x * 3.0f, 1); });
  CHECK(s.kernels <= 3);
}

TEST_CASE("a softmax written over its dying scores agrees with the reference", "[fusion][plan]") {
  // The normalizing map reads the scores at its own element and row maxima and sums through
  // a broadcast; the scores die there, so it writes into their buffer. Its loop is marked
  // safe to vectorize (the vectorizer's run-time overlap check otherwise sends an in-place
  // run to the scalar loop): the marked loop must still read every element before writing
  // it. Rows of 133 leave a remainder after the vector body.
  Generator g(19);
  Tensor q = ready(randn({3, 37, 24}, DType::Float32, g));
  Tensor k = ready(randn({3, 24, 133}, DType::Float32, g));
  {
    JitScope scope;
    Tensor y = softmax(matmul(q, k) * 0.5f, 2);
    eval({y});
    INFO(memory::plan_report());
    CHECK(memory::last_plan().in_place >= 1);
  }
  check_against_reference([&] { return softmax(matmul(q, k) * 0.5f, 2); });

  Tensor x = ready(randn({4, 9}, DType::Float32, g));
  Tensor y = exp(x) * 2.0f;
  std::vector<Node*> outs{y.node().get()};
  jit::FusionPlan plan = jit::fuse(pending_subgraph(outs), {outs[0]});
  REQUIRE(plan.groups.size() == 1);
  jit::LoweredKernel lk = jit::lower(plan.groups[0]);
  REQUIRE(lk.ir.kind == jit::KernelIR::Kind::Map);
  std::string source = jit::print_cpp(lk.ir).source;
  INFO(source);
  CHECK(source.find("#pragma clang loop vectorize(assume_safety)") != std::string::npos);
}

TEST_CASE("reductions print one loop the loop vectorizer takes", "[fusion]") {
  // Written as 16 lane accumulators, relu(a*b+c).sum() was split by the SLP vectorizer into
  // vectors of 8, 4, 2 and 1 (2.5x slower in cache). A plain loop marked for the loop
  // vectorizer (GCC: omp simd with the reduction's operator) keeps whole vectors; a float
  // max/min, which propagates NaN, folds integer keys (no vectorizer takes a NaN-propagating
  // max as a reduction).
  Generator g(23);
  Tensor a = ready(randn({3, 1037}, DType::Float32, g));
  Tensor b = ready(randn({3, 1037}, DType::Float32, g));
  Tensor c = ready(randn({3, 1037}, DType::Float32, g));
  Tensor n = ready(randint(-3, 4, {3, 1037}, g));
  Tensor d = ready(randn({3, 1037}, DType::Float64, g));
  struct Case {
    std::function<Tensor()> build;
    const char* clause;  // the omp simd clause
  };
  const std::vector<Case> cases = {
      {[&] { return sum(relu(a * b + c)); }, "reduction(+:total)"},
      {[&] { return sum(a * b, 1); }, "reduction(+:total)"},
      {[&] { return prod(a * 0.01f + 1.0f, 1); }, "reduction(*:total)"},
      {[&] { return max(n * 2, {1}); }, "reduction(max:total)"},
      {[&] { return any(n - 3, 1); }, "reduction(|:total)"},
      {[&] { return all(n + 4, -1); }, "reduction(&:total)"},
      {[&] { return max(relu(a * b + c), {1}); }, "reduction(max:total_key)"},
      {[&] { return min(a * b); }, "reduction(min:total_key)"},
      {[&] { return max(d * 2.0, {1}); }, "reduction(max:total_key)"}};
  for (size_t k = 0; k < cases.size(); ++k) {
    INFO("case " << k);
    check_against_reference(cases[k].build, 1e-4);
    Tensor y = cases[k].build();
    jit::LoweredKernel lk = lower_only_kernel(y);
    REQUIRE(lk.ir.kind == jit::KernelIR::Kind::InnerReduce);
    // The kernel after the prelude (whose Philox helper has a vectorize(enable) loop).
    const std::string printed = jit::print_cpp(lk.ir).source;
    const std::string source = printed.substr(printed.find("extern \"C\""));
    INFO(source);
    CHECK(source.find("#pragma clang loop vectorize(enable)\n") != std::string::npos);
    CHECK(source.find(std::string("#pragma omp simd ") + cases[k].clause + "\n") !=
          std::string::npos);
    CHECK(source.find("acc[") == std::string::npos);
  }
}

TEST_CASE("concatenated and padded pieces read their parameters before the row loop", "[fusion]") {
  // Each piece of a concatenation, or each padded slice of a sum (the gradient of slicing
  // an RNN's steps), is read under a bound on the row; its stride and offset are kernel
  // parameters read only there. Read through the parameter pointer, the compiler kept those
  // reads under the bound, inside the loop, and the vectorized loop gathered them per lane
  // (11 ns per element instead of 1). The printed kernel copies its parameters into a local
  // array before any loop.
  Generator g(21);
  std::vector<Tensor> pieces;
  for (int k = 0; k < 8; ++k) pieces.push_back(ready(randn({1, 5, 37}, DType::Float32, g)));
  jit::EvalStats s = check_against_reference([&] { return concat(pieces, 0) * 2.0f; });
  CHECK(s.kernels == 1);
  check_against_reference([&] {
    Tensor total = pad(pieces[0], {{0, 7}, {0, 0}, {0, 0}});
    for (int64_t k = 1; k < 8; ++k)
      total = total + pad(pieces[static_cast<size_t>(k)], {{k, 7 - k}, {0, 0}, {0, 0}});
    return total;
  });

  Tensor joined = concat(pieces, 0) * 2.0f;
  std::vector<Node*> outs{joined.node().get()};
  jit::FusionPlan plan = jit::fuse(pending_subgraph(outs), {outs[0]});
  REQUIRE(plan.groups.size() == 1);
  const std::string source = jit::print_cpp(jit::lower(plan.groups[0]).ir).source;
  INFO(source);
  const size_t loop = source.find("while (flat < end)");
  REQUIRE(loop != std::string::npos);
  CHECK(source.find("const i64 P[") < loop);
  CHECK(source.find("params[", loop) == std::string::npos);
  CHECK(source.find("params[") != std::string::npos);
  // Which piece a row reads depends on the row only: the kernel picks it once per row, in
  // one loop per piece, instead of masking every piece's load for every element.
  const size_t first_loop = source.find("for (i64 j = 0");
  CHECK(source.find("if (v", loop) < first_loop);
  size_t loops = 0;
  for (size_t at = first_loop; at != std::string::npos; at = source.find("for (i64 j = 0", at + 1))
    ++loops;
  CHECK(loops >= 8);
}

TEST_CASE("a select decided by the row alone agrees with the reference", "[fusion]") {
  // Conditions that hold along a whole row, split into one loop per side: a row mask loaded
  // from memory, a bound on the row index, and both nested; a condition that varies along
  // the row stays a per-element select.
  Generator g(22);
  Tensor x = ready(randn({33, 41}, DType::Float32, g));
  Tensor y = ready(randn({33, 41}, DType::Float32, g));
  Tensor rows = ready(rand({33, 1}, DType::Float32, g) > 0.5f);
  check_against_reference([&] { return where(rows, x * 2.0f, y + 1.0f); });
  check_against_reference([&] {
    return where(index({33, 41}, 0) < 20, where(rows, x, y), exp(x));
  });
  check_against_reference([&] { return where(rows, where(x > y, x, y * 3.0f), 0.5f); });
}

TEST_CASE("rows of random draws take four elements per Philox block", "[fusion][random]") {
  // A map whose uniform draw steps by one along its rows makes each row's random words
  // ahead of the loop, one Philox block per four elements, in chunks of 256. The words must
  // be those philox_word gives each element wherever a row, a chunk or a thread's range
  // starts: compared exactly with the reference (the same bits on both sides).
  auto exact = [](auto build) { check_against_reference(build, 0.0); };
  for (DType d : {DType::Float32, DType::Float16, DType::BFloat16}) {
    INFO(dtype_name(d));
    // Rows of 701: every residue mod 4 starts a row, and chunks end mid-row.
    exact([&] {
      Generator g(5);
      return rand({3, 5, 701}, d, g) * 2.0f;
    });
  }
  // Rows starting mid-draw (a slice), and a dropout-style mask.
  exact([&] {
    Generator g(6);
    return slice(rand({40, 1030}, DType::Float32, g), 1, 3, 1029) < 0.3f;
  });
  // Two draws in one kernel, one of them broadcast along the rows (drawn per element).
  exact([&] {
    Generator g(7);
    Tensor a = rand({17, 300}, DType::Float32, g);
    return a + rand({17, 1}, DType::Float32, g);
  });
  // Long rows split between threads mid-row.
  exact([&] {
    Generator g(8);
    return rand({3, 100003}, DType::Float32, g) * 3.0f;
  });
  // Rows that start before the draw does (a draw padded or concatenated on the left): the
  // first row's words start at a negative index, which lanes outside the draw never read.
  // Blocks counted from it unsigned came out empty, and the row read uninitialized words.
  for (int64_t before : {1, 2, 3, 5, 258}) {
    INFO("padded by " << before);
    exact([&] {
      Generator g(11);
      return pad(rand({6, 37}, DType::Float32, g), {{0, 0}, {before, 2}}) < 0.5f;
    });
    exact([&] {
      Generator g(12);
      Tensor r = rand({4, 300}, DType::Float32, g);
      return concat({full({4, before}, 7.0f), r * 2.0f, r}, 1);
    });
  }

  auto printed = [](const Tensor& y) { return jit::print_cpp(lower_only_kernel(y).ir).source; };
  Generator g(9);
  const std::string along = printed(rand({4, 9}, DType::Float32, g) * 2.0f);
  INFO(along);
  CHECK(along.find(" = philox_words(") != std::string::npos);
  // A transposed draw steps by a row length: drawn per element.
  const std::string across = printed(transpose(rand({9, 4}, DType::Float32, g), 0, 1) * 2.0f);
  INFO(across);
  CHECK(across.find(" = philox_words(") == std::string::npos);
  exact([&] {
    Generator h(10);
    return transpose(rand({9, 4}, DType::Float32, h), 0, 1) * 2.0f;
  });
}

TEST_CASE("a sum into a transposed output writes consecutive outputs innermost", "[fusion]") {
  // sum over a batch of x*y into [n, m] (the gradient of a transposed product, as an LSTM's
  // first step gives it) is a scatter: each output dim takes one input dim. Its innermost
  // loop must run over the output's unit-stride dim (it strode through the output, 65 ms
  // instead of 0.5 on the benchmark LSTM), and each output must still add its terms in
  // batch order: the kernel accumulates in double, so the result is that sum, exactly.
  Generator g(23);
  const int64_t b = 7, m = 33, n = 45;
  Tensor x = ready(randn({b, m, n}, DType::Float32, g));
  Tensor y = ready(randn({b, m, n}, DType::Float32, g));
  auto build = [&] {
    return reindex_reduce(x * y, ReduceOp::Sum, {n, m}, {IndexExpr::var(2), IndexExpr::var(1)});
  };
  check_against_reference(build);
  JitScope jit;
  Tensor out = build();
  const std::vector<float> got = out.to_vector<float>();
  const std::vector<float> xs = x.to_vector<float>(), ys = y.to_vector<float>();
  REQUIRE(got.size() == static_cast<size_t>(n * m));
  size_t exact = 0;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      double total = 0;
      for (int64_t k = 0; k < b; ++k) {
        const size_t at = static_cast<size_t>((k * m + i) * n + j);
        total += static_cast<double>(xs[at] * ys[at]);
      }
      exact += got[static_cast<size_t>(j * m + i)] == static_cast<float>(total);
    }
  CHECK(exact == got.size());

  Tensor again = build();
  std::vector<Node*> outs{again.node().get()};
  jit::FusionPlan plan = jit::fuse(pending_subgraph(outs), {outs[0]});
  REQUIRE(plan.groups.size() == 1);
  const jit::LoweredKernel lowered = jit::lower(plan.groups[0]);
  REQUIRE(lowered.ir.kind == jit::KernelIR::Kind::Scatter);
  const std::string source = jit::print_cpp(lowered.ir).source;
  INFO(source);
  // The last loop opened before the store runs over the var the store adds unscaled.
  const size_t store = source.rfind("out[(");
  const size_t inner = source.rfind("for (i64 i", store);
  REQUIRE(inner != std::string::npos);
  const std::string var = source.substr(inner + 9, source.find(' ', inner + 9) - inner - 9);
  CHECK(source.find("+ " + var + ")]", store) != std::string::npos);
  CHECK(lowered.parallel_extent == n);
}

TEST_CASE("a scatter whose rows belong to one batch index runs in parallel", "[fusion]") {
  // The gradient of attention's head split writes x[b, s, h, d] to [b*S + s, off + h*D + d]:
  // no output dim takes one input dim alone, but distinct b write distinct rows, so the
  // kernel splits b between threads. Here each output row also takes two s (s // 2), so each
  // output adds two terms, in s order, in double: the result is that sum exactly.
  using E = IndexExpr;
  Generator g(24);
  const int64_t b = 9, s = 10, h = 3, d = 4, off = 3;
  Tensor x = ready(randn({b, s, h, d}, DType::Float32, g));
  const int64_t rows = b * (s / 2), cols = off + h * d + 2;
  const std::vector<IndexExpr> split = {
      E::var(0) * E::constant(s / 2) + floordiv(E::var(1), E::constant(2)),
      E::constant(off) + E::var(2) * E::constant(d) + E::var(3)};
  auto build = [&] { return reindex_reduce(x * 2.0f, ReduceOp::Sum, {rows, cols}, split); };
  check_against_reference(build);
  JitScope jit;
  const std::vector<float> got = build().to_vector<float>();
  const std::vector<float> xs = x.to_vector<float>();
  std::vector<double> want(static_cast<size_t>(rows * cols), 0.0);
  for (int64_t i = 0; i < b * s * h * d; ++i) {
    const int64_t i3 = i % d, i2 = i / d % h, i1 = i / (d * h) % s, i0 = i / (d * h * s);
    const int64_t at = (i0 * (s / 2) + i1 / 2) * cols + off + i2 * d + i3;
    want[static_cast<size_t>(at)] += static_cast<double>(xs[static_cast<size_t>(i)] * 2.0f);
  }
  REQUIRE(got.size() == want.size());
  size_t exact = 0;
  for (size_t i = 0; i < got.size(); ++i) exact += got[i] == static_cast<float>(want[i]);
  CHECK(exact == got.size());

  auto lowered = [&](const std::vector<IndexExpr>& map, const Shape& shape) {
    return lower_only_kernel(reindex_reduce(x * 2.0f, ReduceOp::Sum, shape, map));
  };
  const jit::LoweredKernel parallel = lowered(split, {rows, cols});
  REQUIRE(parallel.ir.kind == jit::KernelIR::Kind::Scatter);
  CHECK(parallel.parallel_extent == b);
  // b*2 + s overlaps between neighbouring b, h + d between neighbouring h and d: one
  // thread. (h*D + d alone would split h.)
  const std::vector<IndexExpr> overlapping = {E::var(0) * E::constant(2) + E::var(1),
                                              E::var(2) + E::var(3)};
  const Shape shape = {2 * b + s, h + d};
  const jit::LoweredKernel serial = lowered(overlapping, shape);
  REQUIRE(serial.ir.kind == jit::KernelIR::Kind::Scatter);
  CHECK(serial.ir.parallel_var == -1);
  const jit::LoweredKernel by_h = lowered({overlapping[0], split[1]}, {2 * b + s, cols});
  CHECK(by_h.parallel_extent == h);
  check_against_reference(
      [&] { return reindex_reduce(x * 2.0f, ReduceOp::Sum, shape, overlapping); });
}

TEST_CASE("a one-to-one scatter stores into the output with the accumulator's bits", "[fusion]") {
  // The head split's gradient [b*S + s, off + h*D + d] stores each output once: the kernel
  // writes identity-combined-with-value, converted, into the output itself (filled with the
  // identity) instead of a float64 array converted afterwards. The bits must be the
  // accumulator path's, which the reference evaluator shares: exact equality, including
  // -0 (0 + -0 is +0), halves rounded once, integers wrapped, uncovered columns.
  using E = IndexExpr;
  Generator g(25);
  const int64_t b = 5, s = 6, h = 3, d = 4, off = 2;
  const Shape out = {b * s, off + h * d + 3};
  const std::vector<IndexExpr> split = {E::var(0) * E::constant(s) + E::var(1),
                                        E::constant(off) + E::var(2) * E::constant(d) + E::var(3)};
  Tensor x = ready(randn({b, s, h, d}, DType::Float32, g) * 300.0f);
  Tensor zeros = ready(where(rand({b, s, h, d}, DType::Float32, g) < 0.3f, -0.0f, x));
  // Equal values with equal signs (uncovered outputs of a max are -inf).
  auto same = [](const Tensor& a, const Tensor& r) {
    const std::vector<double> got = a.to_vector<double>(), want = r.to_vector<double>();
    REQUIRE(got.size() == want.size());
    size_t equal = 0;
    for (size_t i = 0; i < got.size(); ++i)
      equal += got[i] == want[i] && std::signbit(got[i]) == std::signbit(want[i]);
    CHECK(equal == got.size());
  };
  for (DType t : {DType::Float32, DType::Float16, DType::BFloat16, DType::Float64, DType::Int8,
                  DType::Int32, DType::Bool}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Prod}) {
      INFO(dtype_name(t) << " " << reduce_name(op));
      auto build = [&] { return reindex_reduce(cast(zeros, t), op, out, split); };
      set_executor("jit");
      Tensor a = build();
      a.eval();
      set_executor("reference");
      Tensor r = build();
      r.eval();
      set_executor("");
      same(a, r);
    }
  }
  Tensor y = reindex_reduce(zeros * 2.0f, ReduceOp::Sum, out, split);
  const jit::LoweredKernel lowered = lower_only_kernel(y);
  CHECK(lowered.ir.injective);
  CHECK(lowered.parallel_extent == b);
  // -0 stays -0 nowhere: every stored zero is +0, as 0 + -0 gives.
  JitScope jit;
  const std::vector<float> got = y.to_vector<float>();
  size_t negative_zeros = 0;
  for (float v : got) negative_zeros += v == 0.0f && std::signbit(v);
  CHECK(negative_zeros == 0);
  // Two terms to an output (s // 2): not one-to-one.
  const jit::LoweredKernel shared = lower_only_kernel(
      reindex_reduce(zeros, ReduceOp::Sum, {b * s, h * d},
                     {E::var(0) * E::constant(s / 2) + floordiv(E::var(1), E::constant(2)),
                      E::var(2) * E::constant(d) + E::var(3)}));
  CHECK_FALSE(shared.ir.injective);

  // A reshape's inverse writes v // c and v % c to two dims: one-to-one when both are
  // there (the head merge's gradient, [B*S, H*D] -> [B, H, S, D]), split between threads.
  Tensor rows = ready(randn({b * s, h * d}, DType::Float32, g));
  const std::vector<IndexExpr> merge = {
      floordiv(E::var(0), E::constant(s)), floordiv(E::var(1), E::constant(d)),
      mod(E::var(0), E::constant(s)), mod(E::var(1), E::constant(d))};
  auto lower_one = [&](const std::vector<IndexExpr>& map, const Shape& shape) {
    return lower_only_kernel(reindex_reduce(rows * 2.0f, ReduceOp::Sum, shape, map));
  };
  const jit::LoweredKernel merged = lower_one(merge, {b, h, s, d});
  CHECK(merged.ir.injective);
  CHECK(merged.parallel_extent == b * s);
  for (DType t : {DType::Float32, DType::Float16}) {
    INFO(dtype_name(t));
    set_executor("jit");
    Tensor a = reindex_reduce(cast(rows, t), ReduceOp::Sum, {b, h, s, d}, merge);
    a.eval();
    set_executor("reference");
    Tensor r = reindex_reduce(cast(rows, t), ReduceOp::Sum, {b, h, s, d}, merge);
    r.eval();
    set_executor("");
    same(a, r);
  }
  // Without i1 % D the columns of a head share outputs.
  const jit::LoweredKernel partial = lower_one({merge[0], merge[1], merge[2]}, {b, h, s});
  CHECK_FALSE(partial.ir.injective);
}

TEST_CASE("a scatter called one-to-one never stores twice to an output", "[fusion]") {
  // Random maps of sums of c*v, v // k, v % k and constants over small domains: whenever
  // lowering calls one a one-to-one scatter (stored without accumulating), enumerating the
  // domain finds no two in-range points with the same output; and its values agree with
  // the reference. Independent of the peeling it checks.
  using E = IndexExpr;
  std::mt19937_64 rng(26);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int claimed = 0, collide = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Shape in;
    for (int64_t r = pick(1, 3); r > 0; --r) in.push_back(pick(1, 6));
    const auto rank = static_cast<int>(in.size());
    std::vector<IndexExpr> map;
    Shape out;
    for (int64_t r = pick(1, 3); r > 0; --r) {
      IndexExpr e = E::constant(pick(0, 1));
      for (int64_t t = pick(1, 3); t > 0; --t) {
        const E v = E::var(static_cast<int>(pick(0, rank - 1)));
        const int64_t kind = pick(0, 3), c = pick(1, 7);
        e = e + (kind == 0   ? v * E::constant(c)
                 : kind == 1 ? floordiv(v, E::constant(c))
                 : kind == 2 ? mod(v, E::constant(c))
                             : v);
      }
      map.push_back(e);
      out.push_back(pick(4, 40));
    }
    Generator g(static_cast<uint64_t>(trial));
    Tensor x = ready(randn(in, DType::Float32, g));
    auto build = [&] { return reindex_reduce(x, ReduceOp::Sum, out, map); };
    const jit::LoweredKernel lowered = lower_only_kernel(build());
    if (lowered.ir.kind != jit::KernelIR::Kind::Scatter || !lowered.ir.injective) continue;
    ++claimed;
    std::set<std::vector<int64_t>> seen;
    std::vector<int64_t> at(in.size(), 0);
    for (int64_t i = 0; i < numel(in); ++i) {
      for (int64_t k = rank - 1, r = i; k >= 0; --k) at[k] = r % in[k], r /= in[k];
      std::vector<int64_t> o;
      bool inside = true;
      for (size_t d = 0; d < map.size(); ++d) {
        o.push_back(map[d].evaluate(at.data(), [](int, const int64_t*) { return int64_t{0}; }));
        inside = inside && o.back() >= 0 && o.back() < out[d];
      }
      if (inside && !seen.insert(o).second) ++collide;
    }
    INFO("trial " << trial);
    check_against_reference(build, 0.0);
  }
  CHECK(collide == 0);
  CHECK(claimed >= 40);
}

TEST_CASE("float32 matmul runs as a library GEMM", "[fusion][matmul]") {
  Generator g(15);
  Tensor a = ready(randn({2, 17, 9}, DType::Float32, g));
  Tensor b = ready(randn({9, 13}, DType::Float32, g));
  jit::EvalStats s = check_against_reference([&] { return matmul(a, b); });
  if (jit::cpu_gemm_available(DType::Float32)) {
    CHECK(s.library_calls == 1);
    CHECK(s.kernels == 0);
  } else {
    WARN("kiln built without OpenBLAS: matmul stays generated code");
  }
  // Integer matmul keeps the meta-op path and is exact.
  Tensor ia = ready(randint(-5, 5, {4, 6}, g));
  Tensor ib = ready(randint(-5, 5, {6, 3}, g));
  jit::EvalStats si = check_against_reference([&] { return matmul(ia, ib); });
  CHECK(si.library_calls == 0);
}

TEST_CASE("a sum of matmuls accumulates into one buffer", "[fusion][matmul]") {
  if (!have_blas_or_warn()) return;
  JitScope scope;
  Generator g(16);
  // Weight-gradient-like terms x_i^T y_i ([32, 64]^T [32, 48]), summed left to right as
  // autograd sums a shared weight's gradient, in float32 and float64, plus one sum into an
  // evaluated tensor.
  for (DType dtype : {DType::Float32, DType::Float64}) {
    const Products products(g, 12, 32, 64, 48, dtype);
    jit::EvalStats s = check_against_reference([&] { return products.sum(); });
    CHECK(s.library_calls == 12);
    CHECK(s.kernels == 0);  // no add kernel: every product adds into the running total
  }
  Tensor a = ready(randn({20, 30}, DType::Float32, g));
  Tensor b = ready(randn({30, 10}, DType::Float32, g));
  Tensor c = ready(randn({20, 10}, DType::Float32, g));
  const std::vector<float> c_before = c.to_vector<float>();
  jit::EvalStats s = check_against_reference([&] { return c + matmul(a, b); });
  CHECK(s.library_calls == 1);
  CHECK(s.kernels == 0);
  CHECK(c.to_vector<float>() == c_before);  // added into a copy: c itself is unchanged
  // A bias broadcast is not stored anyway: it stays a fused add after the product.
  Tensor bias = ready(randn({10}, DType::Float32, g));
  jit::EvalStats sb = check_against_reference([&] { return matmul(a, b) + bias; });
  CHECK(sb.library_calls == 1);
  CHECK(sb.kernels == 1);
}

TEST_CASE("an accumulated sum of products holds one running total", "[fusion][matmul][plan]") {
  if (!have_blas_or_warn()) return;
  JitScope scope;
  Generator g(17);
  const Products products(g, 16, 32, 256, 256, DType::Float32);
  const std::vector<Tensor>&xs = products.xs, &ys = products.ys;
  auto& pool = memory::host_pool();
  const size_t start = pool.allocated();
  pool.reset_peak_stats();
  Tensor total = products.sum();
  total.eval();
  // Each term is 256 KiB; summed by fused adds of 8 terms, 8 would be alive at once. The
  // accumulation writes into the running total (in place), so the step needs the total
  // and nothing else.
  const size_t term = 256 * 256 * sizeof(float);
  const size_t used = pool.stats().peak_allocated - start;
  INFO("peak above the start: " << used << " bytes; " << memory::plan_report());
  CHECK(used <= term + term / 2);
  CHECK(memory::last_plan().in_place >= 14);
  // The same sum, element by element, in float64.
  std::vector<double> want(256 * 256, 0.0);
  for (size_t i = 0; i < xs.size(); ++i) {
    std::vector<float> x = xs[i].to_vector<float>(), y = ys[i].to_vector<float>();
    for (int r = 0; r < 32; ++r)
      for (int p = 0; p < 256; ++p)
        for (int q = 0; q < 256; ++q)
          want[static_cast<size_t>(p * 256 + q)] +=
              static_cast<double>(x[static_cast<size_t>(r * 256 + p)]) *
              static_cast<double>(y[static_cast<size_t>(r * 256 + q)]);
  }
  std::vector<float> got = total.to_vector<float>();
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    bad += std::fabs(got[i] - want[i]) > 1e-3 + 1e-4 * std::fabs(want[i]);
  CHECK(bad == 0);
}

TEST_CASE("changing the batch size compiles nothing", "[fusion][cache]") {
  JitScope jit_scope;
  Generator g(16);
  auto step = [&](int64_t batch) {
    Tensor x = ready(randn({batch, 24}, DType::Float32, g));
    Tensor w = ready(randn({24}, DType::Float32, g));
    Tensor y = sum(relu(x * w + 0.25f), 1);
    return y.to_vector<float>();
  };
  step(8);
  uint64_t compiled = jit::cache_stats().kernels_compiled;
  std::vector<float> out = step(37);
  CHECK(out.size() == 37);
  step(5);
  CHECK(jit::cache_stats().kernels_compiled == compiled);
}

TEST_CASE("the fused plan is drawn with one cluster per kernel", "[fusion]") {
  Generator g(17);
  Tensor x = ready(randn({8, 8}, DType::Float32, g));
  Tensor y = softmax(x, 1);
  std::string dot = jit::plan_to_dot({y.node().get()});
  CHECK(dot.rfind("digraph", 0) == 0);
  CHECK(dot.find("cluster_0") != std::string::npos);
  CHECK(dot.find("cluster_3") == std::string::npos);
}

TEST_CASE("kernel IR has a readable dump and launches are recorded", "[fusion]") {
  Generator g(18);
  Tensor x = ready(randn({6, 5}, DType::Float32, g));
  Tensor y = sum(exp(x) * 2.0f, 1);
  std::vector<Node*> outs{y.node().get()};
  jit::FusionPlan plan = jit::fuse(pending_subgraph(outs), {outs[0]});
  REQUIRE(plan.groups.size() == 1);
  jit::LoweredKernel lk = jit::lower(plan.groups[0]);
  std::string dump = lk.ir.dump();
  INFO(dump);
  CHECK(dump.find("inner_reduce over [p") != std::string::npos);
  CHECK(dump.find("exp(") != std::string::npos);
  CHECK(dump.find("load b1[") != std::string::npos);
  {
    JitScope jit_scope;
    y.eval();
  }
  bool launched = false;
  for (const jit::KernelRecord& r : jit::kernel_records())
    if (r.launches > 0 && r.run_ms_total > 0) launched = true;
  CHECK(launched);
}
