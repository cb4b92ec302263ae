// Flash attention (frontend/nn/flash_attention.h): forward and the three input gradients
// against the composed path and a float64 reference over shapes that exercise every tile
// edge (L != S, sizes that are no multiple of the 64 x 128 tiles or the backward's key
// chunks, causal, masks of each broadcast kind, leading dims), what a training step keeps
// for backward (O(L) against the composed path's O(L * S)), bit-identical reruns (thread
// count, memory budget), the backend switch, errors, a second backward, and the CUDA
// bodies through NVRTC.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bench/kept_for_backward.h"
#include "core/cuda_driver.h"
#include "core/custom_op.h"
#include "frontend/kiln.h"
#include "frontend/nn/flash_attention_kernels.h"
#include "jit/kernel_cache.h"
#include "jit/nvrtc.h"
#include "memory/memory.h"
#include "memory/reports/plan_report.h"
#include "torch_parity.h"

using namespace kiln;
namespace F = kiln::nn::functional;
using kiln::nn::SDPBackend;
using kiln::nn::SDPBackendGuard;

namespace {

std::vector<double> values(const Tensor& t) { return t.to(DType::Float64).to_vector<double>(); }

// The output and d sum(o * w) / d q, k, v.
struct Attention {
  std::vector<double> o, dq, dk, dv;
};

struct Problem {
  Shape q, k, v;
  Tensor mask;  // float32 (additive) or bool; undefined for none
  bool causal = false;
  std::optional<double> scale;
};

Attention attend(const Problem& p, SDPBackend backend, DType dtype, uint64_t seed = 7) {
  manual_seed(seed);
  Tensor q0 = randn(p.q), k0 = randn(p.k), v0 = randn(p.v);
  Shape os = p.q;
  os.back() = p.v.back();
  Tensor w = randn(os);
  Tensor q = q0.to(dtype).detach().requires_grad_(), k = k0.to(dtype).detach().requires_grad_(),
         v = v0.to(dtype).detach().requires_grad_();
  Tensor mask = p.mask;
  if (mask.defined() && mask.dtype() != DType::Bool) mask = mask.to(dtype);
  SDPBackendGuard guard(backend);
  Tensor o = F::scaled_dot_product_attention(q, k, v, mask, 0.0, p.causal, p.scale);
  std::vector<Tensor> g = grad(sum(o * w.to(dtype)), {q, k, v});
  eval({o, g[0], g[1], g[2]});
  return {values(o), values(g[0]), values(g[1]), values(g[2])};
}

// max |a - b| / (atol + rtol |b|): <= 1 passes.
double worst(const std::vector<double>& a, const std::vector<double>& b, double atol, double rtol) {
  REQUIRE(a.size() == b.size());
  double out = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(b[i]) && std::isnan(a[i])) continue;
    out = std::max(out, std::fabs(a[i] - b[i]) / (atol + rtol * std::fabs(b[i])));
    if (std::isnan(a[i]) != std::isnan(b[i])) out = INFINITY;
  }
  return out;
}

void check_close(const Attention& got, const Attention& want, double atol, double rtol) {
  CHECK(worst(got.o, want.o, atol, rtol) <= 1.0);
  CHECK(worst(got.dq, want.dq, atol, rtol) <= 1.0);
  CHECK(worst(got.dk, want.dk, atol, rtol) <= 1.0);
  CHECK(worst(got.dv, want.dv, atol, rtol) <= 1.0);
}

bool has_flash(const Node* n, std::vector<const Node*>& seen) {
  for (const Node* s : seen)
    if (s == n) return false;
  seen.push_back(n);
  if (n->custom && n->custom->name() == "flash_attention_forward") return true;
  for (const NodePtr& in : n->inputs)
    if (has_flash(in.get(), seen)) return true;
  return false;
}

// Whether `t` (unevaluated) is computed by the flash forward kernel.
bool uses_flash(const Tensor& t) {
  std::vector<const Node*> seen;
  return has_flash(t.node().get(), seen);
}

Tensor bool_mask(const Shape& shape, uint64_t seed, int keep_first_keys) {
  // Random, but every query row keeps its first `keep_first_keys` keys so no row is empty.
  manual_seed(seed);
  Tensor r = rand(shape) > 0.4;
  Tensor first = index(shape, static_cast<int64_t>(shape.size()) - 1) < keep_first_keys;
  return logical_or(r, first);
}

// Flash and the composed path in float32 against the composed path in float64, and flash
// in float64 against it, for each named problem.
void check_against_references(const std::vector<std::pair<std::string, Problem>>& problems) {
  for (const auto& [name, p] : problems) {
    INFO(name);
    const Attention flash = attend(p, SDPBackend::Flash, DType::Float32);
    const Attention math = attend(p, SDPBackend::Math, DType::Float32);
    const Attention ref = attend(p, SDPBackend::Math, DType::Float64);
    const Attention flash64 = attend(p, SDPBackend::Flash, DType::Float64);
    // float32 rounding: both float32 paths within 1e-5 + 1e-4 |x| of float64 (each value is
    // a sum of at most a few hundred products of N(0, 1) values).
    check_close(flash, ref, 1e-5, 1e-4);
    check_close(math, ref, 1e-5, 1e-4);
    check_close(flash, math, 2e-5, 2e-4);
    // float64 flash against the float64 composed path: only the summation order differs.
    check_close(flash64, ref, 1e-12, 1e-10);
  }
}

}  // namespace

TEST_CASE("flash attention matches the composed path and a float64 reference",
          "[flash_attention]") {
  std::vector<std::pair<std::string, Problem>> problems = {
      {"L 37 S 53 heads", {{2, 3, 37, 16}, {2, 3, 53, 16}, {2, 3, 53, 8}, {}, false, {}}},
      {"causal L = S 70", {{1, 2, 70, 8}, {1, 2, 70, 8}, {1, 2, 70, 8}, {}, true, {}}},
      {"causal L 5 S 100", {{2, 5, 12}, {2, 100, 12}, {2, 100, 4}, {}, true, 0.3}},
      {"causal L 100 S 7", {{2, 100, 12}, {2, 7, 12}, {2, 7, 4}, {}, true, {}}},
      {"no leading dims", {{33, 16}, {65, 16}, {65, 16}, {}, false, {}}},
      {"float mask L S", {{2, 2, 40, 8}, {2, 2, 70, 8}, {2, 2, 70, 8}, randn({40, 70}), false, {}}},
      {"bool key padding",
       {{3, 2, 20, 8}, {3, 2, 90, 8}, {3, 2, 90, 8}, bool_mask({3, 1, 1, 90}, 3, 1), false, {}}},
      {"float mask per head causal",
       {{2, 3, 45, 8}, {2, 3, 45, 8}, {2, 3, 45, 8}, randn({3, 45, 1}), true, {}}},
      {"mask expanded over leading dims",
       {{2, 3, 2, 9, 8},
        {2, 3, 2, 11, 8},
        {2, 3, 2, 11, 8},
        bool_mask({2, 1, 2, 9, 11}, 4, 2),
        false,
        {}}},
  };
  check_against_references(problems);
}

TEST_CASE("flash attention's tiles and key chunks meet at their edges", "[flash_attention]") {
  // The CPU bodies run 64 query rows x 128 keys per product, and the backward splits each
  // batch-head's keys into chunks (at least 128 keys each) until batch-heads x chunks reach
  // 32, summing the chunks' partial dq afterwards. Here L and S are no multiple of either
  // tile, one batch-head's 300 keys make 3 chunks of 100 (a chunk edge inside a key tile),
  // and two batch-heads' 260 keys 3 chunks of 87: against float64 and the composed path
  // with the tolerances of the case above (sums of a few hundred products).
  std::vector<std::pair<std::string, Problem>> problems = {
      {"one head L 200 S 300", {{1, 200, 16}, {1, 300, 16}, {1, 300, 8}, {}, false, {}}},
      {"causal L = S 300", {{1, 300, 16}, {1, 300, 16}, {1, 300, 16}, {}, true, {}}},
      {"float mask L 130 S 260",
       {{2, 130, 8}, {2, 260, 8}, {2, 260, 8}, randn({130, 260}), false, {}}},
      {"bool key padding causal L 129 S 257",
       {{2, 129, 8}, {2, 257, 8}, {2, 257, 8}, bool_mask({2, 1, 257}, 5, 1), true, {}}},
  };
  check_against_references(problems);
}

TEST_CASE("flash attention serves bfloat16 and float16 through float32", "[flash_attention]") {
  Problem p{{2, 2, 40, 16}, {2, 2, 50, 16}, {2, 2, 50, 16}, {}, true, {}};
  const Attention ref = attend(p, SDPBackend::Math, DType::Float64);
  for (DType d : {DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(d));
    const Attention got = attend(p, SDPBackend::Flash, d);
    // The inputs themselves are rounded to 8 (bfloat16) or 11 (float16) bits.
    const double tol = d == DType::BFloat16 ? 5e-2 : 1e-2;
    check_close(got, ref, tol, tol);
  }
}

TEST_CASE("flash attention is chosen automatically under a budget or for huge steps",
          "[flash_attention]") {
  // Without a budget: flash once the composed path would keep 256 MiB of probabilities
  // (the tensors are never evaluated: the rule reads shapes only).
  Tensor huge_q = randn({8, 8, 2048, 64}).requires_grad_(), huge_kv = randn({8, 8, 1024, 64});
  CHECK(nn::flash_attention_preferred(huge_q, huge_kv, huge_kv));  // 64 x 2048 x 1024 x 4 B
  Tensor quarter_kv = randn({8, 8, 256, 64});
  CHECK_FALSE(nn::flash_attention_preferred(huge_q, quarter_kv, quarter_kv));  // 128 MiB
  {
    NoGradGuard no_grad;  // inference keeps nothing for backward
    CHECK_FALSE(nn::flash_attention_preferred(huge_q, huge_kv, huge_kv));
  }
  const int64_t big = 160;
  Tensor q = randn({1, 2, big, 8}).requires_grad_(), k = randn({1, 2, big, 8}),
         v = randn({1, 2, big, 8});
  CHECK_FALSE(uses_flash(F::scaled_dot_product_attention(q, k, v)));  // faster composed
  Tensor small = randn({1, 2, 8, 8}).requires_grad_();
  CHECK_FALSE(uses_flash(F::scaled_dot_product_attention(small, small, small)));
  {
    SDPBackendGuard math(SDPBackend::Math);
    CHECK_FALSE(uses_flash(F::scaled_dot_product_attention(q, k, v)));
    SDPBackendGuard flash(SDPBackend::Flash);
    CHECK(uses_flash(F::scaled_dot_product_attention(small, small, small)));
  }
  CHECK(nn::sdp_backend() == SDPBackend::Auto);
  {
    struct BudgetGuard {
      ~BudgetGuard() { memory::clear_budget(); }
    } guard;
    memory::set_budget(size_t{1} << 30);  // a budget makes flash worth it at any size
    CHECK(uses_flash(F::scaled_dot_product_attention(q, k, v)));
    // Calls flash cannot serve fall back under Auto.
    Tensor weights;
    CHECK_FALSE(uses_flash(F::scaled_dot_product_attention(q, k, v, {}, 0.0, false, {}, &weights)));
    CHECK_FALSE(uses_flash(F::scaled_dot_product_attention(q, k, v, {}, 0.1)));
    NoGradGuard no_grad;
    CHECK(uses_flash(F::scaled_dot_product_attention(small, small, small)));
  }
  // MultiheadAttention without weights takes the same decision.
  nn::MultiheadAttention mha(16, 2, 0.0, true, true);
  Tensor x = randn({2, big, 16});
  CHECK_FALSE(uses_flash(mha.forward(x, x, x, {}, false).output));
  {
    struct BudgetGuard {
      ~BudgetGuard() { memory::clear_budget(); }
    } guard;
    memory::set_budget(size_t{1} << 30);
    CHECK(uses_flash(mha.forward(x, x, x, {}, false).output));
    CHECK_FALSE(uses_flash(mha.forward(x, x, x, {}, true).output));
  }
}

TEST_CASE("MultiheadAttention through flash matches its composed path", "[flash_attention]") {
  manual_seed(11);
  const int64_t e = 16, l = 37, s = 45, n = 2;
  nn::MultiheadAttention mha(e, 4, 0.0, true, true);
  Tensor x = randn({n, l, e}), mem = randn({n, s, e});
  Tensor pad = logical_not(bool_mask({n, s}, 5, 3));  // true = padding, as torch's MHA
  Tensor am = randn({l, s});
  auto run = [&](SDPBackend b, bool causal) {
    SDPBackendGuard guard(b);
    Tensor o = mha.forward(x, mem, mem, pad, false, causal ? Tensor() : am, true, causal).output;
    CHECK(uses_flash(o) == (b == SDPBackend::Flash));
    std::vector<Tensor> params = mha.parameters();
    std::vector<Tensor> g = grad(sum(o * o), params);
    std::vector<std::vector<double>> out{values(o)};
    for (const Tensor& t : g) out.push_back(values(t));
    return out;
  };
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    auto f = run(SDPBackend::Flash, causal), m = run(SDPBackend::Math, causal);
    for (size_t i = 0; i < f.size(); ++i) CHECK(worst(f[i], m[i], 1e-4, 1e-4) <= 1.0);
  }
}

TEST_CASE(
    "a training step through flash keeps bytes linear in L for backward and the composed path L "
    "times S",
    "[flash_attention][plan]") {
  const int64_t heads = 4, d = 32;
  auto kept = [&](int64_t len, SDPBackend b) {
    SDPBackendGuard guard(b);
    // Evaluated leaves, as parameters are: what is counted is what the step makes.
    Tensor q = randn({1, heads, len, d}).eval().requires_grad_(),
           k = randn({1, heads, len, d}).eval().requires_grad_(),
           v = randn({1, heads, len, d}).eval().requires_grad_();
    return bench::measure_kept_for_backward([&] {
             Tensor o = F::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
             Tensor loss = sum(o * o);
             std::vector<Tensor> g = grad(loss, {q, k, v});
             eval({loss, g[0], g[1], g[2]});
           })
        .activations;
  };
  const size_t flash256 = kept(256, SDPBackend::Flash), flash512 = kept(512, SDPBackend::Flash);
  const size_t math256 = kept(256, SDPBackend::Math), math512 = kept(512, SDPBackend::Math);
  INFO("kept bytes: flash " << flash256 << " / " << flash512 << ", composed " << math256 << " / "
                            << math512);
  // flash: the output and its row statistics, [heads, L, d + 1] floats.
  CHECK(flash256 <= static_cast<size_t>(2 * heads * 256 * (d + 1) * 4));
  CHECK(flash512 <= static_cast<size_t>(2 * heads * 512 * (d + 1) * 4));
  CHECK(static_cast<double>(flash512) / static_cast<double>(flash256) < 2.5);
  // composed: at least the probabilities, [heads, L, L] floats, growing with L^2.
  CHECK(math512 >= static_cast<size_t>(heads * 512 * 512 * 4));
  CHECK(static_cast<double>(math512) / static_cast<double>(math256) > 3.5);
}

TEST_CASE("flash attention gives the same bits on any thread count", "[flash_attention]") {
  struct Restore {
    int threads = get_num_threads();
    ~Restore() { set_num_threads(threads); }
  } restore;
  Problem p{{2, 3, 70, 16}, {2, 3, 130, 16}, {2, 3, 130, 16}, randn({70, 130}), true, {}};
  set_num_threads(1);
  const Attention one = attend(p, SDPBackend::Flash, DType::Float32);
  set_num_threads(3);
  const Attention three = attend(p, SDPBackend::Flash, DType::Float32);
  CHECK(one.o == three.o);
  CHECK(one.dq == three.dq);
  CHECK(one.dk == three.dk);
  CHECK(one.dv == three.dv);
}

TEST_CASE("a budgeted step that reruns the flash kernels gives the unbudgeted bits",
          "[flash_attention][plan]") {
  struct BudgetGuard {
    ~BudgetGuard() { memory::clear_budget(); }
  } guard;
  // Ten attention layers in a chain: each layer's forward output stays alive across the
  // later layers' forward and backward, so a budget makes the planner drop and rebuild it.
  manual_seed(21);
  const Shape shape{2, 4, 96, 16};
  Tensor q = randn(shape).eval().requires_grad_(), k = randn(shape).eval().requires_grad_(),
         v = randn(shape).eval().requires_grad_();
  memory::PlanSummary step_plan;
  auto step = [&] {
    SDPBackendGuard flash(SDPBackend::Flash);
    Tensor h = q;
    for (int layer = 0; layer < 10; ++layer)
      h = F::scaled_dot_product_attention(h * 1.5f, k, v, {}, 0.0, true);
    Tensor loss = sum(h * h);
    std::vector<Tensor> g = grad(loss, {q, k, v});
    eval({loss, g[0], g[1], g[2]});
    step_plan = memory::last_plan();  // the step's own plan, before values() evaluates more
    return std::vector<std::vector<double>>{values(loss), values(g[0]), values(g[1]), values(g[2])};
  };
  auto launches = [] {
    uint64_t count = 0;
    for (const jit::KernelRecord& r : jit::kernel_records())
      if (r.name.rfind("kiln_custom_flash_attention_", 0) == 0) count += r.launches;
    return count;
  };
  (void)step();  // compiles everything
  uint64_t before = launches();
  const auto plain = step();
  const uint64_t plain_launches = launches() - before;
  const memory::PlanSummary free_plan = step_plan;
  INFO("unbudgeted: lower bound " << free_plan.lower_bound << ", peak " << free_plan.planned_peak);
  REQUIRE(free_plan.planned_peak > free_plan.lower_bound);
  // Just under the unbudgeted peak (the planner's smallest fit is near it: the backward
  // kernels' own working sets set the lower bound).
  memory::set_budget(free_plan.planned_peak - (free_plan.planned_peak - free_plan.lower_bound) / 8);
  before = launches();
  const auto budgeted = step();
  const memory::PlanSummary plan = step_plan;
  CHECK(plain_launches == 20);                  // a forward and a backward per layer
  CHECK(launches() - before > plain_launches);  // the planner ran a flash kernel again
  memory::clear_budget();
  INFO(memory::plan_report());
  CHECK(plan.recomputes > 0);
  CHECK(plan.measured_peak < free_plan.measured_peak);
  for (size_t i = 0; i < plain.size(); ++i) CHECK(plain[i] == budgeted[i]);
}

TEST_CASE("flash attention raises typed errors for what it cannot do", "[flash_attention]") {
  Tensor q = randn({2, 5, 4}).requires_grad_(), k = randn({2, 6, 4}), v = randn({2, 6, 3});
  SDPBackendGuard flash(SDPBackend::Flash);
  Tensor weights;
  CHECK_THROWS_AS(F::scaled_dot_product_attention(q, k, v, {}, 0.0, false, {}, &weights),
                  ValueError);
  CHECK_THROWS_AS(F::scaled_dot_product_attention(q, k, v, {}, 0.2), ValueError);
  Tensor m = randn({5, 6}).requires_grad_();
  CHECK_THROWS_AS(F::flash_attention(q, k, v, m), ValueError);
  CHECK_THROWS_AS(F::flash_attention(q, randn({2, 6, 5}), v), ShapeError);
  CHECK_THROWS_AS(F::flash_attention(q, k, v, randn({3, 6})), ShapeError);
  CHECK_THROWS_AS(F::flash_attention(q, k, v, randn({1, 1, 5, 6})), ShapeError);
  CHECK_THROWS_AS(F::flash_attention(q, k, v, randn({5, 6}).to(DType::Float64)), DTypeError);
  CHECK_THROWS_AS(F::flash_attention(zeros({2, 5, 4}, DType::Int32), k, v), DTypeError);
  // Differentiable once: a second backward says so when it is built.
  Tensor o = F::flash_attention(q, k, v);
  Tensor gq = grad(sum(o * o), {q}, {}, false, true)[0];
  try {
    (void)grad(sum(gq * gq), {q});
    FAIL("expected ValueError");
  } catch (const ValueError& e) {
    CHECK(std::string(e.what()).find("[flash_attention]") != std::string::npos);
  }
}

TEST_CASE("flash attention's CUDA kernels compile with NVRTC", "[flash_attention][nvrtc]") {
  if (!jit::nvrtc_available()) {
    WARN("NVRTC is not available (no libnvrtc.so); flash attention's CUDA checks skipped");
    return;
  }
  for (DType d : {DType::Float32, DType::Float64}) {
    INFO(dtype_name(d));
    Tensor q = zeros({2, 5, 4}, d), k = zeros({2, 6, 4}, d), v = zeros({2, 6, 3}, d),
           mask = zeros({1, 1, 1}, d), opts = zeros({3}, DType::Int64), scale = zeros({1}, d);
    const std::string fwd =
        CustomKernel(nn::detail::flash_forward_spec())
            .source_for({q, k, v, mask, opts, scale}, {{{2, 5, 4}, d}}, Device::cuda(0));
    const std::string bwd = CustomKernel(nn::detail::flash_backward_spec())
                                .source_for({q, k, v, mask, opts, scale, zeros({2, 5, 4}, d),
                                             zeros({2, 5, 3}, d), zeros({2, 5}, d)},
                                            {{{2, 5 * 4 + 6 * 4 + 6 * 3}, d}}, Device::cuda(0));
    for (const std::string* source : {&fwd, &bwd}) {
      INFO(*source);
      for (int arch : {80, 90}) {
        jit::CudaImage image = jit::nvrtc_compile(*source, arch, "flash_attention.cu");
        CHECK(!image.bytes.empty());
      }
    }
  }
}

TEST_CASE("flash attention on a CUDA device matches the composed path", "[flash_attention][cuda]") {
  if (cuda::device_count() == 0) {
    WARN("SKIPPED: no CUDA device (" << cuda::driver_status() << ")");
    return;
  }
  manual_seed(3);
  Tensor q = randn({2, 3, 37, 16}), k = randn({2, 3, 53, 16}), v = randn({2, 3, 53, 8});
  Tensor qc = q.to(Device::cuda(0)).requires_grad_(), kc = k.to(Device::cuda(0)).requires_grad_(),
         vc = v.to(Device::cuda(0)).requires_grad_();
  Tensor mask = randn({37, 53}).to(Device::cuda(0));
  auto run = [&](SDPBackend b) {
    SDPBackendGuard guard(b);
    Tensor o = F::scaled_dot_product_attention(qc, kc, vc, mask, 0.0, true);
    std::vector<Tensor> g = grad(sum(o * o), {qc, kc, vc});
    return std::vector<std::vector<double>>{
        values(o.to(Device::cpu())), values(g[0].to(Device::cpu())), values(g[1].to(Device::cpu())),
        values(g[2].to(Device::cpu()))};
  };
  auto f = run(SDPBackend::Flash), m = run(SDPBackend::Math);
  for (size_t i = 0; i < f.size(); ++i) CHECK(worst(f[i], m[i], 1e-4, 1e-4) <= 1.0);
}

TEST_CASE("flash attention matches PyTorch's scaled_dot_product_attention",
          "[flash_attention][torch]") {
  using nn_test::random_values;
  std::vector<nn_test::TorchCase> cases;
  auto f64 = [](int64_t n, uint64_t seed, const Shape& shape) {
    return nn_test::make(random_values(n, seed), shape, DType::Float64);
  };
  auto flash = [](bool causal, std::optional<double> scale) {
    return [causal, scale](const std::vector<Tensor>& x) {
      SDPBackendGuard guard(SDPBackend::Flash);
      Tensor mask = x.size() > 3 ? x[3] : Tensor();
      return std::vector<Tensor>{
          F::scaled_dot_product_attention(x[0], x[1], x[2], mask, 0.0, causal, scale)};
    };
  };
  {
    nn_test::TorchCase tc;
    tc.label = "flash causal, L 70 S 90";
    tc.call = "F.scaled_dot_product_attention(x[0], x[1], x[2], is_causal=True)";
    tc.inputs = {f64(2 * 70 * 8, 1, {2, 70, 8}), f64(2 * 90 * 8, 2, {2, 90, 8}),
                 f64(2 * 90 * 5, 3, {2, 90, 5})};
    tc.run = flash(true, {});
    cases.push_back(std::move(tc));
  }
  {
    nn_test::TorchCase tc;
    tc.label = "flash bool mask, scale 0.4";
    tc.call = "F.scaled_dot_product_attention(x[0], x[1], x[2], attn_mask=x[3], scale=0.4)";
    std::vector<bool> keep;
    for (int i = 0; i < 33 * 40; ++i) keep.push_back(i % 40 == 0 || (i * 7) % 3 != 0);
    tc.grad_inputs = 3;
    tc.inputs = {f64(2 * 3 * 33 * 8, 4, {2, 3, 33, 8}), f64(2 * 3 * 40 * 8, 5, {2, 3, 40, 8}),
                 f64(2 * 3 * 40 * 8, 6, {2, 3, 40, 8}), from_vector(keep, {33, 40})};
    tc.run = flash(false, 0.4);
    cases.push_back(std::move(tc));
  }
  {
    nn_test::TorchCase tc;
    tc.label = "flash float mask per batch";
    tc.call = "F.scaled_dot_product_attention(x[0], x[1], x[2], attn_mask=x[3])";
    tc.grad_inputs = 3;
    tc.inputs = {f64(2 * 2 * 17 * 4, 7, {2, 2, 17, 4}), f64(2 * 2 * 65 * 4, 8, {2, 2, 65, 4}),
                 f64(2 * 2 * 65 * 6, 9, {2, 2, 65, 6}), f64(2 * 65, 10, {2, 1, 1, 65})};
    tc.run = flash(false, {});
    cases.push_back(std::move(tc));
  }
  NN_REQUIRE_TORCH_PARITY(cases);
}
