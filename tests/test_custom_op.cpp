// Extending kiln without forking it: custom autograd functions (kiln::autograd::Function)
// and custom kernels (kiln::CustomKernel). Values are checked against references computed
// here on the host, gradients by hand and against float64 central differences (the op
// harness's check), second derivatives by hand; errors are typed and name the function or
// kernel; a kernel that does not compile leaves the cache usable; a budgeted step that
// reruns a custom kernel gives the same bits.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "jit/compiler.h"
#include "jit/kernel_cache.h"
#include "jit/nvrtc.h"
#include "memory/memory.h"
#include "memory/reports/plan_report.h"
#include "tests/op_harness.h"

using namespace kiln;
using kiln::autograd::AutogradContext;
using kiln::autograd::Function;
using kiln::test::ExecutorScope;
using kiln::test::GradCase;
using kiln::test::GradInput;

namespace {

// ---------------------------------------------------------------------------------------
// Custom autograd functions

// exp(x), saving its output: the backward reads the function's own result.
struct SavedExp : Function<SavedExp> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    Tensor y = exp(x);
    ctx->save_for_backward({y});
    return y;
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> g) {
    return {g[0] * ctx->get_saved_variables()[0]};
  }
};

// x * y + alpha, with a non-tensor argument and which inputs need a gradient recorded.
struct MulAdd : Function<MulAdd> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& y, double alpha) {
    ctx->save_for_backward({x, y});
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["needs"] = std::vector<bool>{ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                                 ctx->needs_input_grad(2)};
    return x * y + alpha;
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> g) {
    std::vector<Tensor> s = ctx->get_saved_variables();
    const auto needs = std::any_cast<std::vector<bool>>(ctx->saved_data["needs"]);
    return {needs[0] ? g[0] * s[1] : Tensor(), needs[1] ? g[0] * s[0] : Tensor(), Tensor()};
  }
};

// x^3 with a backward built from ops on the saved input: differentiable twice.
struct Cube : Function<Cube> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x * x;
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> g) {
    Tensor x = ctx->get_saved_variables()[0];
    return {g[0] * 3.0 * x * x};
  }
};

// Two outputs: (x^2, sin(x)); the backward sums both contributions.
struct SquareAndSin : Function<SquareAndSin> {
  static std::vector<Tensor> forward(AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return {x * x, sin(x)};
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> g) {
    Tensor x = ctx->get_saved_variables()[0];
    return {g[0] * 2.0 * x + g[1] * cos(x)};
  }
};

// Returns its input unchanged, with a backward that doubles the gradient: the recorded
// output must be a node of its own, not the input.
struct DoubleGradIdentity : Function<DoubleGradIdentity> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x; }
  static std::vector<Tensor> backward(AutogradContext*, std::vector<Tensor> g) {
    return {g[0] * 2.0};
  }
};

struct WrongCount : Function<WrongCount> {
  static Tensor forward(AutogradContext*, const Tensor& x, const Tensor& y) { return x + y; }
  static std::vector<Tensor> backward(AutogradContext*, std::vector<Tensor> g) { return {g[0]}; }
};

struct WrongShape : Function<WrongShape> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return sum(x); }
  static std::vector<Tensor> backward(AutogradContext*, std::vector<Tensor> g) { return {g[0]}; }
};

std::vector<double> values_of(const Tensor& t) { return t.to(DType::Float64).to_vector<double>(); }

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])));
  }
}

// A gradient case checked against float64 central differences on the reference executor,
// then the same gradient on the JIT.
void gradcheck(const GradCase& c, uint64_t seed) {
  auto [v, w] = kiln::test::grad_inputs(c, seed);
  CHECK(kiln::test::check_against_differences(c, v, w, "random") == "");
  std::vector<std::vector<double>> reference, jit;
  {
    ExecutorScope s("reference");
    reference = kiln::test::analytic_gradient(c, v, w);
  }
  {
    ExecutorScope s("jit");
    jit = kiln::test::analytic_gradient(c, v, w);
  }
  for (size_t i = 0; i < reference.size(); ++i) check_close(jit[i], reference[i], 1e-12);
}

}  // namespace

TEST_CASE("a custom function's backward gives the hand-derived gradients", "[custom][autograd]") {
  Tensor x = from_vector(std::vector<double>{-1.0, 0.0, 0.5, 2.0}, {4}).requires_grad_();
  Tensor y = SavedExp::apply(x);
  check_close(values_of(y), {std::exp(-1.0), 1.0, std::exp(0.5), std::exp(2.0)}, 1e-15);
  Tensor gx = grad(sum(y), {x})[0];
  check_close(values_of(gx), {std::exp(-1.0), 1.0, std::exp(0.5), std::exp(2.0)}, 1e-15);

  // Two tensor arguments, one of which needs no gradient, and a double.
  Tensor a = from_vector(std::vector<double>{1, 2, 3}, {3}).requires_grad_();
  Tensor b = from_vector(std::vector<double>{4, 5, 6}, {3});
  Tensor out = MulAdd::apply(a, b, 0.5);
  check_close(values_of(out), {4.5, 10.5, 18.5}, 0);
  out.sum().backward();
  check_close(values_of(a.grad()), {4, 5, 6}, 0);
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("a custom function records needs_input_grad and arbitrary saved values",
          "[custom][autograd]") {
  Tensor a = from_vector(std::vector<double>{1, 2}, {2});
  Tensor b = from_vector(std::vector<double>{3, 4}, {2}).requires_grad_();
  Tensor out = MulAdd::apply(a, b, 2.0);
  Tensor gb = grad(sum(out), {b})[0];
  check_close(values_of(gb), {1, 2}, 0);
  // Without any argument needing a gradient the outputs are plain values.
  Tensor plain = MulAdd::apply(a, a, 1.0);
  CHECK_FALSE(plain.requires_grad());
  {
    NoGradGuard no_grad;
    CHECK_FALSE(MulAdd::apply(b, b, 1.0).requires_grad());
  }
}

TEST_CASE("custom functions match float64 central differences", "[custom][autograd][gradcheck]") {
  gradcheck(GradCase{"custom/saved_exp",
                     "custom",
                     {GradInput{{2, 3}}},
                     [](const std::vector<Tensor>& x) { return SavedExp::apply(x[0]); }},
            1);
  gradcheck(GradCase{"custom/muladd",
                     "custom",
                     {GradInput{{3}}, GradInput{{3}}},
                     [](const std::vector<Tensor>& x) { return MulAdd::apply(x[0], x[1], 0.25); }},
            2);
  // Outputs feed further ops, one output reaches the loss twice, the other not at all.
  gradcheck(GradCase{"custom/two_outputs",
                     "custom",
                     {GradInput{{4}}},
                     [](const std::vector<Tensor>& x) {
                       std::vector<Tensor> o = SquareAndSin::apply(x[0]);
                       return o[0] * o[1] + tanh(o[1]);
                     }},
            3);
  gradcheck(GradCase{"custom/first_output_only",
                     "custom",
                     {GradInput{{4}}},
                     [](const std::vector<Tensor>& x) { return SquareAndSin::apply(x[0])[0]; }},
            4);
  // Nested: a function of a function's output.
  gradcheck(
      GradCase{"custom/nested",
               "custom",
               {GradInput{{5}}},
               [](const std::vector<Tensor>& x) { return Cube::apply(SavedExp::apply(x[0])); }},
      5);
}

TEST_CASE("a custom function whose backward is built from ops is differentiable twice",
          "[custom][autograd][gradcheck]") {
  Tensor x = from_vector(std::vector<double>{-2, -0.5, 1, 3}, {4}).requires_grad_();
  Tensor y = Cube::apply(x);
  Tensor g1 = grad(sum(y), {x}, Tensor(), false, /*create_graph=*/true)[0];
  check_close(values_of(g1), {12, 0.75, 3, 27}, 1e-15);
  Tensor g2 = grad(sum(g1), {x})[0];
  check_close(values_of(g2), {-12, -3, 6, 18}, 1e-15);

  // A backward that saves the function's own output: d/dx exp(x) twice is exp(x).
  Tensor e = SavedExp::apply(x);
  Tensor e1 = grad(sum(e), {x}, Tensor(), false, true)[0];
  Tensor e2 = grad(sum(e1), {x})[0];
  check_close(values_of(e2), {std::exp(-2.0), std::exp(-0.5), std::exp(1.0), std::exp(3.0)}, 1e-15);
}

TEST_CASE("a custom function's output is its own gradient edge through evaluation and fusion",
          "[custom][autograd]") {
  Tensor x = from_vector(std::vector<double>{1, 2, 3}, {3}).requires_grad_();
  Tensor y = DoubleGradIdentity::apply(x);
  CHECK(y.node() != x.node());
  Tensor loss = sum(y * y);
  // Evaluating first lets simplify and fusion see the graph; the edge must survive them.
  CHECK(loss.item<double>() == 14);
  loss.backward();
  check_close(values_of(x.grad()), {4, 8, 12}, 0);  // 2 * (2 y), y = x
}

TEST_CASE("a custom function's backward returning the wrong gradients raises a typed error",
          "[custom][autograd][errors]") {
  Tensor x = from_vector(std::vector<float>{1, 2}, {2}).requires_grad_();
  Tensor y = from_vector(std::vector<float>{3, 4}, {2}).requires_grad_();
  try {
    (void)grad(sum(WrongCount::apply(x, y)), {x, y});
    FAIL("expected ValueError");
  } catch (const ValueError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("WrongCount backward") != std::string::npos);
    CHECK(std::string(e.what()).find("expected 2") != std::string::npos);
  }
  try {
    (void)grad(WrongShape::apply(x), {x});
    FAIL("expected ShapeError");
  } catch (const ShapeError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("WrongShape backward") != std::string::npos);
    CHECK(std::string(e.what()).find("[2]") != std::string::npos);
  }
  // The graph stays usable.
  CHECK(sum(x).item<float>() == 3);
}

// ---------------------------------------------------------------------------------------
// Custom kernels

namespace {

// out[r] = sum_c x[r, c] * w[c] + b[r], two outputs: the sum and its square.
CustomKernelSpec row_dot_spec() {
  CustomKernelSpec s;
  s.name = "row_dot";
  s.inputs = {"x", "w", "b"};
  s.outputs = {"out", "sq"};
  s.cpu_source = R"(
    for (long long r = 0; r < x_shape[0]; ++r) {
      double acc = b[r];
      for (long long c = 0; c < x_shape[1]; ++c) acc += (double)x[r * x_shape[1] + c] * w[c];
      out[r] = (float)acc;
      sq[r] = (float)(acc * acc);
    }
  )";
  return s;
}

// y = x * x elementwise, any rank, any floating dtype the caller picks.
CustomKernelSpec square_spec(const std::string& name = "square") {
  CustomKernelSpec s;
  s.name = name;
  s.inputs = {"x"};
  s.outputs = {"y"};
  s.cpu_source = "for (long long i = 0; i < x_numel; ++i) y[i] = x[i] * x[i];";
  s.cuda_source = R"(
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < y_numel) y[i] = x[i] * x[i];
  )";
  return s;
}

// dx = 2 * x * g, the square's gradient as a kernel of its own.
CustomKernel square_grad_kernel() {
  CustomKernelSpec s;
  s.name = "square_grad";
  s.inputs = {"x", "g"};
  s.outputs = {"dx"};
  s.cpu_source = "for (long long i = 0; i < x_numel; ++i) dx[i] = 2 * x[i] * g[i];";
  return CustomKernel(s);
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed;
  for (float& f : v) {
    s = s * 1664525u + 1013904223u;
    f = static_cast<float>(s >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  }
  return v;
}

bool nvrtc_here() {
  if (jit::nvrtc_available()) return true;
  WARN("NVRTC is not available (no libnvrtc.so); custom CUDA kernel checks skipped");
  return false;
}

}  // namespace

TEST_CASE("a custom kernel computes what an independent host reference computes",
          "[custom][custom_kernel]") {
  CustomKernel k(row_dot_spec());
  for (int64_t rows : {1, 5, 37}) {
    const int64_t cols = 19;
    std::vector<float> xv = random_floats(static_cast<size_t>(rows * cols), 7);
    std::vector<float> wv = random_floats(static_cast<size_t>(cols), 8);
    std::vector<float> bv = random_floats(static_cast<size_t>(rows), 9);
    Tensor x = from_vector(xv, {rows, cols}), w = from_vector(wv, {cols}),
           b = from_vector(bv, {rows});
    std::vector<Tensor> o = k({x, w, b}, {{{rows}, DType::Float32}, {{rows}, DType::Float32}});
    REQUIRE(o.size() == 2);
    // Consumers fuse around it: the kernel's outputs feed generated kernels.
    Tensor shifted = o[0] + 1.0f;
    eval({shifted, o[1]});
    std::vector<float> got = shifted.to_vector<float>(), got_sq = o[1].to_vector<float>();
    for (int64_t r = 0; r < rows; ++r) {
      double acc = bv[static_cast<size_t>(r)];
      for (int64_t c = 0; c < cols; ++c)
        acc +=
            static_cast<double>(xv[static_cast<size_t>(r * cols + c)]) * wv[static_cast<size_t>(c)];
      CHECK(got[static_cast<size_t>(r)] == static_cast<float>(acc) + 1.0f);
      CHECK(got_sq[static_cast<size_t>(r)] == static_cast<float>(acc * acc));
    }
    // The reference evaluator runs the same kernel.
    ExecutorScope reference("reference");
    std::vector<Tensor> again = k({x, w, b}, {{{rows}, DType::Float32}, {{rows}, DType::Float32}});
    CHECK(again[1].to_vector<float>() == got_sq);
  }
}

TEST_CASE("a custom kernel is shape-generic and cached by its source like any kernel",
          "[custom][custom_kernel][cache]") {
  CustomKernel k(square_spec("square_cached"));
  auto square = [&](int64_t n) {
    Tensor x = from_vector(random_floats(static_cast<size_t>(n), 3), {n});
    return k({x}, {{{n}, DType::Float32}})[0];
  };
  square(10).eval();
  const uint64_t compiled = jit::cache_stats().kernels_compiled;
  Tensor y = square(1000);
  y.eval();
  CHECK(jit::cache_stats().kernels_compiled == compiled);  // sizes are arguments
  // The plan cache sees the same structure at another size too.
  const uint64_t hits = jit::replay_stats().hits;
  (square(2000) * 2.0f).eval();
  (square(3000) * 2.0f).eval();
  CHECK(jit::replay_stats().hits > hits);
  // The disk cache lists it under its entry point, with where it came from.
  bool listed = false;
  for (const jit::KernelRecord& r : jit::kernel_records())
    if (r.name == "kiln_custom_square_cached") {
      listed = true;
      REQUIRE(r.source_ops.size() == 1);
      CHECK(r.source_ops[0] == "custom_kernel:square_cached");
      CHECK(r.launches >= 2);
    }
  CHECK(listed);
  // The key is the source's: another body is another key, the same body the same key.
  Tensor x = zeros({4});
  CustomKernelSpec other = square_spec("square_cached");
  other.cpu_source = "for (long long i = 0; i < x_numel; ++i) y[i] = x[i] * x[i] + 0;";
  const std::string a = k.source_for({x}, {{{4}, DType::Float32}}, Device::cpu());
  const std::string b = CustomKernel(other).source_for({x}, {{{4}, DType::Float32}}, Device::cpu());
  CHECK(a.find(square_spec().cpu_source) != std::string::npos);
  jit::CpuCompiler& cc = jit::cpu_compiler();
  CHECK(jit::KernelCache::key_for(a, cc) != jit::KernelCache::key_for(b, cc));
  CHECK(jit::KernelCache::key_for(a, cc) ==
        jit::KernelCache::key_for(k.source_for({x}, {{{4}, DType::Float32}}, Device::cpu()), cc));
  CHECK_NOTHROW(jit::kernel_cache().show(jit::KernelCache::key_for(a, cc)));
  // A float64 call is another kernel (typed pointers), compiled once.
  Tensor x64 = from_vector(std::vector<double>{1.5, -2}, {2});
  CHECK(k({x64}, {{{2}, DType::Float64}})[0].to_vector<double>() == std::vector<double>{2.25, 4});
}

TEST_CASE("a custom kernel's gradient may be another custom kernel or ops",
          "[custom][custom_kernel][gradcheck]") {
  CustomKernel grad_kernel = square_grad_kernel();
  CustomKernel by_kernel(square_spec("square_k"),
                         [grad_kernel](const std::vector<Tensor>& in, const std::vector<Tensor>&,
                                       const std::vector<Tensor>& g) {
                           Shape s = in[0].shape();
                           return grad_kernel({in[0], g[0]}, {{s, in[0].dtype()}});
                         });
  CustomKernel by_ops(
      square_spec("square_o"),
      [](const std::vector<Tensor>& in, const std::vector<Tensor>&, const std::vector<Tensor>& g) {
        return std::vector<Tensor>{g[0] * 2.0 * in[0]};
      });
  for (const CustomKernel* k : {&by_kernel, &by_ops}) {
    INFO(k->spec().name);
    auto fn = [k](const std::vector<Tensor>& x) {
      Tensor y = (*k)({x[0]}, {{x[0].shape(), x[0].dtype()}})[0];
      return sin(y) * x[0];  // the kernel's output and its input both reach the loss
    };
    gradcheck(GradCase{"custom_kernel/" + k->spec().name, "custom", {GradInput{{2, 5}}}, fn}, 11);
  }
  // Built from ops on the inputs, the gradient is differentiable again: d2(x^2)/dx2 = 2.
  Tensor x = from_vector(std::vector<double>{-1, 0.5, 3}, {3}).requires_grad_();
  Tensor y = by_ops({x}, {{{3}, DType::Float64}})[0];
  Tensor g1 = grad(sum(y), {x}, Tensor(), false, true)[0];
  check_close(values_of(g1), {-2, 1, 6}, 0);
  check_close(values_of(grad(sum(g1), {x})[0]), {2, 2, 2}, 0);
  // Without a gradient the kernel's outputs are not differentiable, and say why.
  CustomKernel plain(square_spec("square_plain"));
  Tensor z = plain({x}, {{{3}, DType::Float64}})[0];
  CHECK_FALSE(z.requires_grad());
  CHECK_THROWS_AS(grad(sum(z), {x}), ValueError);
}

TEST_CASE("two calls of a custom kernel on the same inputs run it once, and dumps name it",
          "[custom][custom_kernel]") {
  CustomKernel k(square_spec("square_cse"));
  Tensor x = from_vector(std::vector<float>{1, -2, 3}, {3});
  auto launches = [] {
    uint64_t count = 0;
    for (const jit::KernelRecord& r : jit::kernel_records())
      if (r.name == "kiln_custom_square_cse") count += r.launches;
    return count;
  };
  Tensor a = k({x}, {{{3}, DType::Float32}})[0];
  Tensor b = k({x}, {{{3}, DType::Float32}})[0];
  CHECK(dump_graph({a}).find("kernel=square_cse") != std::string::npos);
  const uint64_t before = launches();
  Tensor s = a + b;
  CHECK(s.to_vector<float>() == std::vector<float>{2, 8, 18});
  CHECK(launches() - before == 1);  // CSE: same source, sizes and input
}

TEST_CASE("a custom kernel's gradient returning the wrong gradients names the kernel",
          "[custom][custom_kernel][errors]") {
  CustomKernel k(
      square_spec("square_bad_grad"),
      [](const std::vector<Tensor>& in, const std::vector<Tensor>&, const std::vector<Tensor>&) {
        return std::vector<Tensor>{in[0], in[0]};
      });
  Tensor x = from_vector(std::vector<float>{1, 2}, {2}).requires_grad_();
  try {
    (void)grad(sum(k({x}, {{{2}, DType::Float32}})[0]), {x});
    FAIL("expected ValueError");
  } catch (const ValueError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("[square_bad_grad backward] returned 2 gradients") !=
          std::string::npos);
  }
}

TEST_CASE("a custom kernel that does not compile raises CompileError and leaves the cache usable",
          "[custom][custom_kernel][errors][cache]") {
  CustomKernelSpec bad = square_spec("broken_square");
  bad.cpu_source = "for (long long i = 0; i < x_numel; ++i) y[i] = x[i] * undeclared_thing;";
  CustomKernel k(bad);
  Tensor x = from_vector(std::vector<float>{1, 2, 3}, {3});
  const std::string key = jit::KernelCache::key_for(
      k.source_for({x}, {{{3}, DType::Float32}}, Device::cpu()), jit::cpu_compiler());
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second compiles again: nothing cached
    INFO("attempt " << attempt);
    try {
      (void)k({x}, {{{3}, DType::Float32}});
      FAIL("expected CompileError");
    } catch (const CompileError& e) {
      const std::string m = e.what();
      INFO(m);
      CHECK(m.find("broken_square") != std::string::npos);
      CHECK(m.find("undeclared_thing") != std::string::npos);  // the compiler's diagnostic
    }
  }
  CHECK_THROWS_AS(jit::kernel_cache().show(key), ValueError);  // no entry on disk
  // The fixed body under the same name compiles and runs.
  CustomKernel fixed(square_spec("broken_square"));
  CHECK(fixed({x}, {{{3}, DType::Float32}})[0].to_vector<float>() == std::vector<float>{1, 4, 9});
  // Nothing pending was left behind: unrelated work still evaluates.
  CHECK((x * 2.0f).to_vector<float>() == std::vector<float>{2, 4, 6});
}

TEST_CASE("a custom kernel's declaration and call are checked when made",
          "[custom][custom_kernel][errors]") {
  CustomKernelSpec s = square_spec("checked");
  s.inputs = {"x", "x"};
  CHECK_THROWS_AS(CustomKernel(s), ValueError);
  s = square_spec("bad name");
  CHECK_THROWS_AS(CustomKernel(s), ValueError);
  s = square_spec("checked");
  s.cpu_source.clear();
  s.cuda_source.clear();
  CHECK_THROWS_AS(CustomKernel(s), ValueError);
  CustomKernel k(square_spec("checked"));
  Tensor x = zeros({3});
  try {
    (void)k({x, x}, {{{3}, DType::Float32}});
    FAIL("expected ValueError");
  } catch (const ValueError& e) {
    CHECK(std::string(e.what()).find("[custom_kernel checked] expects 1 inputs (x), got 2") !=
          std::string::npos);
  }
  CHECK_THROWS_AS(k({x}, {}), ValueError);
  CHECK_THROWS_AS(k({x}, {{{-1}, DType::Float32}}), ValueError);  // as zeros({-1})
  CHECK_THROWS_AS(k({x.to(DType::Float16)}, {{{3}, DType::Float32}}), DTypeError);
  CustomKernelSpec cuda_only = square_spec("cuda_only");
  cuda_only.cpu_source.clear();
  CHECK_THROWS_AS(CustomKernel(cuda_only)({x}, {{{3}, DType::Float32}}), DeviceError);
}

TEST_CASE("a custom kernel with cpu_tasks runs its body over task ranges on the pool",
          "[custom][custom_kernel]") {
  struct Restore {
    int threads = get_num_threads();
    ~Restore() { set_num_threads(threads); }
  } restore;
  // Row sums, one task per row: each task writes its own row whatever range it is given.
  CustomKernelSpec spec;
  spec.name = "row_sums_tasks";
  spec.inputs = {"x"};
  spec.outputs = {"y"};
  spec.cpu_tasks = "x_shape[0]";
  spec.cpu_source = R"(
    for (long long r = kiln_task_begin; r < kiln_task_end; ++r) {
      float acc = 0;
      for (long long c = 0; c < x_shape[1]; ++c) acc += x[r * x_shape[1] + c];
      y[r] = acc;
    }
  )";
  CustomKernel k(spec);
  const int64_t rows = 37, cols = 101;
  std::vector<float> v = random_floats(static_cast<size_t>(rows * cols), 9);
  Tensor x = from_vector(v, {rows, cols});
  std::vector<float> want(static_cast<size_t>(rows), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      want[static_cast<size_t>(r)] += v[static_cast<size_t>(r * cols + c)];
  const std::string source = k.source_for({x}, {{{rows}, DType::Float32}}, Device::cpu());
  CHECK(source.find("kiln_task_begin") != std::string::npos);
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    CHECK(k({x}, {{{rows}, DType::Float32}})[0].to_vector<float>() == want);
  }
  // A task count that does not compile is the kernel's CompileError, at the call.
  CustomKernelSpec bad = spec;
  bad.name = "bad_tasks";
  bad.cpu_tasks = "no_such_size";
  CHECK_THROWS_AS(CustomKernel(bad)({x}, {{{rows}, DType::Float32}}), CompileError);
}

TEST_CASE("a budgeted step that reruns a custom kernel gives the unbudgeted bits",
          "[custom][custom_kernel][plan]") {
  struct BudgetGuard {
    ~BudgetGuard() { memory::clear_budget(); }
  } guard;
  // A chain of custom kernels whose gradients read their inputs: the backward pass needs
  // every layer's input, which a budget makes the planner drop and rebuild.
  CustomKernelSpec spec;
  spec.name = "soft_step";
  spec.inputs = {"x"};
  spec.outputs = {"y"};
  spec.cpu_source = "for (long long i = 0; i < x_numel; ++i) y[i] = x[i] / (1.0f + x[i] * x[i]);";
  CustomKernel k(spec, [](const std::vector<Tensor>& in, const std::vector<Tensor>&,
                          const std::vector<Tensor>& g) {
    Tensor d = 1.0f + in[0] * in[0];
    return std::vector<Tensor>{g[0] * (1.0f - in[0] * in[0]) / (d * d)};
  });
  const int64_t n = 1 << 16;
  Tensor x0 = from_vector(random_floats(static_cast<size_t>(n), 5), {n}).requires_grad_();
  auto step = [&] {
    Tensor h = x0 * 3.0f;
    for (int layer = 0; layer < 8; ++layer) h = k({h * 1.5f + 0.25f}, {{{n}, DType::Float32}})[0];
    Tensor loss = sum(h * h);
    Tensor g = grad(loss, {x0})[0];
    eval({loss, g});
    return std::pair{loss.item<float>(), g.to_vector<float>()};
  };
  auto launches = [] {
    uint64_t count = 0;
    for (const jit::KernelRecord& r : jit::kernel_records())
      if (r.name == "kiln_custom_soft_step") count += r.launches;
    return count;
  };
  const auto [loss, g] = step();
  const uint64_t before = launches();
  (void)step();
  const uint64_t unbudgeted = launches() - before;
  CHECK(unbudgeted == 8);
  const size_t start = memory::host_pool().allocated();
  memory::set_budget(start + static_cast<size_t>(6 * n * 4));
  const auto [loss_b, g_b] = step();
  const memory::PlanSummary plan = memory::last_plan();
  memory::clear_budget();
  INFO(memory::plan_report());
  CHECK(plan.recomputes > 0);
  CHECK(launches() - before - unbudgeted > 8);  // the planner ran the kernel again
  CHECK(std::memcmp(&loss, &loss_b, sizeof loss) == 0);
  CHECK(g == g_b);
}

TEST_CASE("a custom kernel's CUDA source compiles with NVRTC", "[custom][custom_kernel][nvrtc]") {
  if (!nvrtc_here()) return;
  CustomKernel k(square_spec("square_cuda"));
  Tensor x = zeros({2, 3});
  const std::string source = k.source_for({x}, {{{2, 3}, DType::Float32}}, Device::cuda(0));
  INFO(source);
  CHECK(source.find("__global__") != std::string::npos);
  for (int arch : {80, 90}) {
    jit::CudaImage image = jit::nvrtc_compile(source, arch, "square_cuda.cu");
    CHECK(image.is_cubin);
    CHECK(!image.bytes.empty());
  }
  // A broken CUDA body is a CompileError with NVRTC's diagnostic.
  CustomKernelSpec bad = square_spec("bad_cuda");
  bad.cuda_source = "y[0] = not_declared_here;";
  const std::string bad_source =
      CustomKernel(bad).source_for({x}, {{{2, 3}, DType::Float32}}, Device::cuda(0));
  try {
    (void)jit::nvrtc_compile(bad_source, 80, "bad_cuda.cu");
    FAIL("expected CompileError");
  } catch (const CompileError& e) {
    CHECK(std::string(e.what()).find("not_declared_here") != std::string::npos);
  }
}

TEST_CASE("a custom kernel runs on a CUDA device", "[custom][custom_kernel][cuda]") {
  if (cuda::device_count() == 0) {
    WARN("SKIPPED: no CUDA device (" << cuda::driver_status() << ")");
    return;
  }
  CustomKernel k(square_spec("square_gpu"));
  std::vector<float> v = random_floats(1000, 4);
  Tensor x = from_vector(v, {10, 100}).to(Device::cuda(0));
  Tensor y = k({x}, {{{10, 100}, DType::Float32}})[0];
  std::vector<float> got = (y + 1.0f).to(Device::cpu()).to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i) CHECK(got[i] == v[i] * v[i] + 1.0f);
}
