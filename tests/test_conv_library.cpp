// Library convolution (jit/library_conv.h): conv2d's forward, backward-data and
// backward-weights products run on oneDNN's convolution primitives where it is built in.
// Each case computes the output and the gradients of x, weight and bias of a random
// projection of the output on the JIT executor and on the reference executor (which
// evaluates the im2col composition) from the same inputs. Tolerance: float32 5e-5 absolute
// plus 5e-5 relative (sums of up to ~600 products in a different order); bfloat16 against
// the float32 reference: 2e-2 relative to the largest value (8 mantissa bits per rounding).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include "jit/executor.h"
#include "jit/fuse.h"
#include "jit/library_conv.h"
#include "memory/memory.h"
#include "op_harness.h"
#include "test_nn_support.h"

using namespace nn_test;
namespace nn = kiln::nn;
namespace F = kiln::nn::F;

namespace {

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw;
  nn::Size2 stride, padding, dilation;
  int64_t groups;
  bool bias;
};

struct ConvResult {
  std::vector<double> y, dx, dw, db;
  size_t conv_forward = 0, conv_step = 0;  // library convolution calls of each evaluation
};

// y = conv2d(x, w, b), then the gradients of sum(y * r) for a fixed random r.
ConvResult run_case(const ConvCase& k, uint64_t seed, DType dtype) {
  kiln::manual_seed(seed);
  const int64_t oh = (k.h + 2 * k.padding.h - k.dilation.h * (k.kh - 1) - 1) / k.stride.h + 1;
  const int64_t ow = (k.w + 2 * k.padding.w - k.dilation.w * (k.kw - 1) - 1) / k.stride.w + 1;
  Tensor x = kiln::cast(kiln::randn({k.n, k.c, k.h, k.w}), dtype).eval();
  Tensor w = kiln::cast(kiln::randn({k.o, k.c / k.groups, k.kh, k.kw}) * 0.3, dtype).eval();
  Tensor b = k.bias ? kiln::cast(kiln::randn({k.o}), dtype).eval() : Tensor();
  Tensor r = kiln::randn({k.n, k.o, oh, ow}).eval();
  ConvResult out;
  {
    Tensor y = F::conv2d(x, w, b, k.stride, k.padding, k.dilation, k.groups);
    y.eval();
    out.conv_forward = kiln::jit::last_eval_stats().conv_calls;
  }
  for (Tensor* t : {&x, &w, &b})
    if (t->defined()) t->requires_grad_();
  Tensor y = F::conv2d(x, w, b, k.stride, k.padding, k.dilation, k.groups);
  Tensor loss = kiln::sum(kiln::cast(y, DType::Float32) * r);
  std::vector<Tensor> wrt{x, w};
  if (k.bias) wrt.push_back(b);
  std::vector<Tensor> g = kiln::grad(loss, wrt);
  std::vector<Tensor> all{y};
  all.insert(all.end(), g.begin(), g.end());
  kiln::eval(all);
  out.conv_step = kiln::jit::last_eval_stats().conv_calls;
  out.y = values(y);
  out.dx = values(g[0]);
  out.dw = values(g[1]);
  if (k.bias) out.db = values(g[2]);
  return out;
}

std::string describe(const ConvCase& k) {
  std::ostringstream s;
  s << "x [" << k.n << ", " << k.c << ", " << k.h << ", " << k.w << "] w [" << k.o << ", "
    << k.c / k.groups << ", " << k.kh << ", " << k.kw << "] stride " << k.stride.str()
    << " padding " << k.padding.str() << " dilation " << k.dilation.str() << " groups " << k.groups
    << (k.bias ? " bias" : "");
  return s.str();
}

// Largest |got - want| over the largest |want|.
double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return got.size() == want.size() ? diff / std::max(scale, 1e-30) : INFINITY;
}

const ConvCase kCases[] = {
    // n, c, h, w, o, kh, kw, stride, padding, dilation, groups, bias
    {2, 4, 9, 9, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {1, 3, 11, 7, 5, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, false},  // batch 1, non-square image
    {2, 6, 10, 10, 4, 3, 3, {1, 1}, {2, 2}, {2, 2}, 2, true},  // dilation, groups
    {3, 8, 7, 9, 8, 3, 3, {1, 2}, {1, 0}, {1, 1}, 8, true},    // depthwise, mixed stride
    {2, 16, 6, 6, 8, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, false},  // 1x1
    {2, 3, 23, 23, 8, 7, 7, {2, 2}, {3, 3}, {1, 1}, 1, true},  // 7x7/2 stem
    {2, 4, 8, 10, 6, 2, 3, {2, 3}, {0, 1}, {1, 2}, 2, false},  // non-square kernel, crop
    {1, 4, 5, 5, 4, 5, 5, {1, 1}, {0, 0}, {1, 1}, 1, true},    // 1x1 output
    {4, 12, 9, 9, 6, 3, 3, {3, 3}, {1, 1}, {1, 1}, 3, true},   // stride 3, groups 3
    {3, 8, 5, 7, 6, 1, 1, {1, 1}, {0, 0}, {1, 1}, 2, true},    // 1x1, groups 2, bias
};

// KILN_CONV_LAYOUT set for a scope (read per call), restored after.
class LayoutScope {
 public:
  explicit LayoutScope(const char* layout) {
    if (const char* v = std::getenv("KILN_CONV_LAYOUT")) saved_ = v;
    ::setenv("KILN_CONV_LAYOUT", layout, 1);
  }
  ~LayoutScope() {
    if (saved_)
      ::setenv("KILN_CONV_LAYOUT", saved_->c_str(), 1);
    else
      ::unsetenv("KILN_CONV_LAYOUT");
  }
  LayoutScope(const LayoutScope&) = delete;
  LayoutScope& operator=(const LayoutScope&) = delete;

 private:
  std::optional<std::string> saved_;
};

// Library convolution calls of one run_case (its forward, then its step), by layout.
struct LayoutCount {
  size_t blocked = 0, plain = 0, gemm = 0;
};

}  // namespace

TEST_CASE("conv2d runs its three products on the library and matches the reference", "[nn][conv]") {
  const bool library = kiln::jit::cpu_conv_available(DType::Float32);
  if (!library) WARN("no library convolution in this build: the composition is checked alone");
  for (size_t i = 0; i < std::size(kCases); ++i) {
    const ConvCase& k = kCases[i];
    INFO(describe(k));
    const ConvResult jit = run_case(k, 100 + i, DType::Float32);
    ConvResult ref;
    {
      kiln::test::ExecutorScope scope("reference");
      ref = run_case(k, 100 + i, DType::Float32);
    }
    // The forward is one call; a training step adds backward data and backward weights.
    CHECK(jit.conv_forward == (library ? 1u : 0u));
    CHECK(jit.conv_step == (library ? 3u : 0u));
    CHECK(mismatch(jit.y, ref.y, 5e-5, 5e-5) == "");
    CHECK(mismatch(jit.dx, ref.dx, 5e-5, 5e-5) == "");
    CHECK(mismatch(jit.dw, ref.dw, 5e-5, 5e-5) == "");
    CHECK(mismatch(jit.db, ref.db, 5e-5, 5e-5) == "");
  }
}

TEST_CASE("conv2d matches the reference on each library layout", "[nn][conv]") {
  if (!kiln::jit::cpu_conv_available(DType::Float32)) {
    WARN("no library convolution in this build: skipped");
    return;
  }
  // Forced blocked (oneDNN's layouts, reorders around the primitive) and forced plain (kiln's
  // tensors as stored, no reorders), then the per-pass rule; the same tolerance as above.
  for (const char* layout : {"blocked", "plain", "gemm", "auto"}) {
    size_t plain_calls = 0;
    for (size_t i = 0; i < std::size(kCases); ++i) {
      const ConvCase& k = kCases[i];
      INFO(layout << ": " << describe(k));
      ConvResult ref;
      {
        kiln::test::ExecutorScope scope("reference");
        ref = run_case(k, 300 + i, DType::Float32);
      }
      const kiln::jit::ConvLayoutCalls before = kiln::jit::conv_layout_calls();
      ConvResult jit;
      {
        LayoutScope scope(layout);
        jit = run_case(k, 300 + i, DType::Float32);
      }
      const kiln::jit::ConvLayoutCalls after = kiln::jit::conv_layout_calls();
      const LayoutCount got{after.blocked - before.blocked, after.plain - before.plain,
                            after.gemm - before.gemm};
      plain_calls += got.plain;
      // The forward alone, then the forward and both backward passes.
      CHECK(got.blocked + got.plain + got.gemm == 4);
      const bool one_gemm = k.kh == 1 && k.kw == 1 && k.stride.h == 1 && k.stride.w == 1 &&
                            k.padding.h == 0 && k.padding.w == 0;
      // Each way must really run: forced blocked and plain run oneDNN's convolution
      // alone (plain takes the 3x3, 1x1 and stem cases without reorders), gemm and the
      // rule run every 1x1 convolution at stride 1 without padding as GEMMs (all four
      // calls), and the rule runs the stem plain where its 3 channels would be padded
      // to 16 (its backward data at least).
      const std::string l = layout;
      if (l == "blocked") CHECK(got.blocked == 4);
      if (l == "plain") CHECK(got.gemm == 0);
      if (l == "plain" && (i == 0 || i == 4 || i == 5)) CHECK(got.plain == 4);
      if (l == "gemm" || l == "auto") CHECK(got.gemm == (one_gemm ? 4u : 0u));
      if (l == "auto" && i == 5) CHECK(got.plain >= 1);
      CHECK(mismatch(jit.y, ref.y, 5e-5, 5e-5) == "");
      CHECK(mismatch(jit.dx, ref.dx, 5e-5, 5e-5) == "");
      CHECK(mismatch(jit.dw, ref.dw, 5e-5, 5e-5) == "");
      CHECK(mismatch(jit.db, ref.db, 5e-5, 5e-5) == "");
    }
    // Forced plain falls back to blocked only where oneDNN has no plain kernel but its
    // reference code (on oneDNN 2.6.3 the stride-3 grouped case at least).
    INFO(layout);
    if (std::string(layout) == "plain") CHECK(plain_calls >= 4 * (std::size(kCases) - 3));
  }
}

TEST_CASE("conv2d's patches are not stored when the library convolves", "[nn][conv]") {
  if (!kiln::jit::cpu_conv_available(DType::Float32)) {
    WARN("no library convolution in this build: skipped");
    return;
  }
  kiln::manual_seed(7);
  Tensor x = kiln::randn({2, 4, 9, 9}).eval();
  Tensor w = kiln::randn({6, 2, 3, 3}).eval();
  Tensor y = F::conv2d(x, w, Tensor(), {2, 2}, {1, 1}, {1, 1}, 2);
  std::vector<kiln::Node*> outs{y.node().get()};
  kiln::jit::FusionPlan plan = kiln::jit::fuse(kiln::pending_subgraph(outs), {outs[0]});
  size_t convs = 0;
  for (const kiln::jit::FusionGroup& g : plan.groups) {
    CHECK(g.root->shape.size() < 7);  // no im2col kernel
    convs += g.library && g.conv.root ? 1 : 0;
  }
  CHECK(convs == 1);
}

TEST_CASE("conv2d uses its weight twice and keeps float64 on the composition", "[nn][conv]") {
  const bool library = kiln::jit::cpu_conv_available(DType::Float32);
  // The same weight in two convolutions (its gradient sums two weight products), and the
  // second reading the first's output (its backward data feeds the first's products).
  auto step = [](DType dtype) {
    kiln::manual_seed(9);
    Tensor x = kiln::cast(kiln::randn({2, 4, 8, 8}), dtype).eval();
    Tensor w = kiln::cast(kiln::randn({4, 4, 3, 3}) * 0.3, dtype).eval();
    x.requires_grad_();
    w.requires_grad_();
    Tensor y = F::conv2d(kiln::relu(F::conv2d(x, w, Tensor(), 1, 1)), w, Tensor(), 2, 1);
    std::vector<Tensor> g = kiln::grad(kiln::sum(y * y), {x, w});
    kiln::eval({y, g[0], g[1]});
    return std::tuple{values(y), values(g[0]), values(g[1]),
                      kiln::jit::last_eval_stats().conv_calls};
  };
  for (DType dtype : {DType::Float32, DType::Float64}) {
    INFO(kiln::dtype_name(dtype));
    auto [y, dx, dw, convs] = step(dtype);
    decltype(step(dtype)) ref;
    {
      kiln::test::ExecutorScope scope("reference");
      ref = step(dtype);
    }
    // Two forwards, two weight products, two backward data (x requires its gradient).
    CHECK(convs == (library && dtype == DType::Float32 ? 6u : 0u));
    const double tol = dtype == DType::Float64 ? 1e-12 : 1e-4;
    CHECK(mismatch(y, std::get<0>(ref), tol, tol) == "");
    CHECK(mismatch(dx, std::get<1>(ref), tol, tol) == "");
    CHECK(mismatch(dw, std::get<2>(ref), tol, tol) == "");
  }
}

TEST_CASE("conv2d in bfloat16 runs on the library where the CPU has kernels", "[nn][conv][amp]") {
  const bool library = kiln::jit::cpu_conv_available(DType::BFloat16);
  if (!library) WARN("no bfloat16 library convolution on this CPU: the composition is checked");
  for (size_t i : {0u, 2u, 3u, 4u, 5u, 9u}) {
    const ConvCase& k = kCases[i];
    INFO(describe(k));
    const ConvResult half = run_case(k, 200 + i, DType::BFloat16);
    ConvResult ref;
    {
      kiln::test::ExecutorScope scope("reference");
      ref = run_case(k, 200 + i, DType::BFloat16);
    }
    CHECK(half.conv_forward == (library ? 1u : 0u));
    CHECK(half.conv_step == (library ? 3u : 0u));
    CHECK(relative_error(half.y, ref.y) < 2e-2);
    CHECK(relative_error(half.dx, ref.dx) < 2e-2);
    CHECK(relative_error(half.dw, ref.dw) < 2e-2);
    if (k.bias) CHECK(relative_error(half.db, ref.db) < 2e-2);
  }
}

TEST_CASE("a small CNN trains to the reference executor's losses", "[nn][conv][train]") {
  auto train = [] {
    kiln::manual_seed(31);
    Tensor x = kiln::randn({8, 3, 12, 12}).eval();
    Tensor labels = kiln::from_vector<int64_t>({0, 1, 2, 3, 0, 1, 2, 3}, {8});
    auto model =
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
            std::make_shared<nn::Conv2d>(3, 8, 3, 1, 1), std::make_shared<nn::ReLU>(),
            std::make_shared<nn::Conv2d>(8, 8, 3, 2, 1, 1, 4), std::make_shared<nn::ReLU>(),
            std::make_shared<nn::Conv2d>(8, 6, 1), std::make_shared<nn::Flatten>(),
            std::make_shared<nn::Linear>(6 * 36, 4)});
    std::vector<double> losses;
    for (int step = 0; step < 8; ++step) {
      Tensor loss = nn::cross_entropy(model->forward(x), labels);
      std::vector<Tensor> params = model->parameters();
      std::vector<Tensor> g = kiln::grad(loss, params);
      kiln::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) params[i].assign(params[i] - g[i] * 0.1);
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  const std::vector<double> jit = train();
  std::vector<double> ref;
  {
    kiln::test::ExecutorScope scope("reference");
    ref = train();
  }
  INFO("loss " << jit.front() << " -> " << jit.back());
  CHECK(jit.back() < jit.front());
  CHECK(mismatch(jit, ref, 1e-4, 1e-4) == "");
}

TEST_CASE("checkpointed library convolutions are rebuilt bit-identically", "[nn][conv][plan]") {
  if (!kiln::jit::cpu_conv_available(DType::Float32)) {
    WARN("no library convolution in this build: skipped");
    return;
  }
  // A checkpointed block's values are released after the forward and rebuilt for the
  // backward: its convolutions run again, as a budget's recomputation would run them.
  auto step = [](bool checkpointed) {
    kiln::manual_seed(43);
    Tensor x = kiln::randn({4, 3, 16, 16}).eval();
    nn::Conv2d c1(3, 8, 3, 1, 1), c2(8, 8, 3, 1, 1);
    std::vector<Tensor> params = c1.parameters();
    for (const Tensor& p : c2.parameters()) params.push_back(p);
    // c2's weight gradient reads c1's output: released after the forward, c1 runs again.
    auto block = [&](const Tensor& in) { return c2.forward(c1.forward(in)); };
    Tensor h = kiln::tanh(checkpointed ? kiln::checkpoint(block, x) : block(x));
    Tensor loss = kiln::sum(h * h);
    std::vector<Tensor> g = kiln::grad(loss, params);
    std::vector<Tensor> all{loss};
    all.insert(all.end(), g.begin(), g.end());
    kiln::eval(all);
    std::vector<float> bits;
    for (const Tensor& t : all)
      for (float v : t.to_vector<float>()) bits.push_back(v);
    return bits;
  };
  const std::vector<float> plain = step(false);
  const std::vector<float> rebuilt = step(true);
  const kiln::memory::PlanSummary plan = kiln::memory::last_plan();
  INFO(kiln::memory::plan_report());
  bool conv_rebuilt = false;
  for (const kiln::memory::RecomputedValue& r : plan.recomputed)
    conv_rebuilt = conv_rebuilt || r.name.find("conv2d") != std::string::npos;
  CHECK(conv_rebuilt);
  CHECK(kiln::jit::last_eval_stats().conv_calls == 5);  // 2 forwards, 2 weights, 1 data
  REQUIRE(rebuilt.size() == plain.size());
  CHECK(std::memcmp(rebuilt.data(), plain.data(), plain.size() * sizeof(float)) == 0);
}

// Body of the child process of the next test; does nothing unless run by it: one training
// step of three convolutions (1x1, 3x3, the 7x7/2 stem) at sizes where oneDNN splits the
// work between threads, its output and gradients written as raw float32 bits to the file
// CONV_THREADS_CHILD_OUT names.
TEST_CASE("conv2d thread-count child: one step's bits", "[.][conv_threads_child]") {
  const char* out = std::getenv("CONV_THREADS_CHILD_OUT");
  if (!out) return;
  std::vector<float> bits;
  const ConvCase cases[] = {{8, 64, 28, 28, 32, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, true},
                            {8, 16, 28, 28, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
                            {8, 3, 56, 56, 16, 7, 7, {2, 2}, {3, 3}, {1, 1}, 1, true}};
  for (size_t i = 0; i < std::size(cases); ++i) {
    const ConvResult r = run_case(cases[i], 500 + i, DType::Float32);
    for (const std::vector<double>* v : {&r.y, &r.dx, &r.dw, &r.db})
      for (double d : *v) bits.push_back(static_cast<float>(d));
  }
  std::FILE* f = std::fopen(out, "wb");
  REQUIRE(f != nullptr);
  CHECK(std::fwrite(bits.data(), sizeof(float), bits.size(), f) == bits.size());
  std::fclose(f);
}

TEST_CASE("conv2d's library results are the same bits on 1, 2 and 3 threads", "[nn][conv]") {
  if (!kiln::jit::cpu_conv_available(DType::Float32)) {
    WARN("no library convolution in this build: skipped");
    return;
  }
  // The thread pool's size is fixed per process: each count runs in a child.
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  std::vector<std::string> results;
  for (int threads : {1, 2, 3}) {
    const std::string file =
        (dir / ("kiln_conv_threads_" + std::to_string(::getpid()) + "_" + std::to_string(threads)))
            .string();
    const std::string command = "KILN_NUM_THREADS=" + std::to_string(threads) +
                                " CONV_THREADS_CHILD_OUT='" + file + "' '" + self +
                                "' '[conv_threads_child]' >/dev/null 2>&1";
    INFO(command);
    REQUIRE(std::system(command.c_str()) == 0);
    std::ifstream in(file, std::ios::binary);
    results.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::filesystem::remove(file);
  }
  REQUIRE(results[0].size() > 0);
  CHECK(results[1] == results[0]);
  CHECK(results[2] == results[0]);
}
