// Autocast (ops/autocast.h): which ops run in half precision and which in float32 inside a
// scope, how scopes nest and stay per thread, and that training through the casts matches
// float32 training within bfloat16's precision and the reference evaluator on the same graph.
#include <catch2/catch.hpp>
#include <cmath>
#include <thread>
#include <vector>

#include "frontend/kiln.h"
#include "jit/blas.h"
#include "jit/executor.h"
#include "op_harness.h"

using namespace kiln;

namespace {

Tensor ready(Tensor t) {
  t.eval();
  return t;
}

}  // namespace

TEST_CASE("autocast runs products in bfloat16 and exp, softmax, norms, sums and losses in float32",
          "[amp][dtype]") {
  manual_seed(1);
  Tensor x = ready(randn({4, 8})), w = ready(randn({6, 8})), b = ready(randn({6}));
  Tensor img = ready(randn({1, 2, 5, 5})), k = ready(randn({3, 2, 3, 3}));
  Tensor xd = ready(randn({4, 8}, DType::Float64));
  amp::autocast scope;  // CPU: bfloat16
  CHECK(amp::autocast_state().enabled);
  CHECK(amp::autocast_state().dtype == DType::BFloat16);
  Tensor y = linear(x, w, b);
  CHECK(y.dtype() == DType::BFloat16);
  CHECK(matmul(x, transpose(w, 0, 1)).dtype() == DType::BFloat16);
  CHECK(nn::functional::conv2d(img, k).dtype() == DType::BFloat16);
  CHECK(matmul(xd, transpose(xd, 0, 1)).dtype() == DType::Float64);  // float64 is never cast
  CHECK(relu(y).dtype() == DType::BFloat16);                         // not on a list
  CHECK(softmax(y, 1).dtype() == DType::Float32);
  CHECK(log_softmax(y, 1).dtype() == DType::Float32);
  CHECK(exp(y).dtype() == DType::Float32);
  CHECK(log(abs(y) + 1).dtype() == DType::Float32);
  CHECK(sum(y).dtype() == DType::Float32);
  CHECK(mean(y, {1}).dtype() == DType::Float32);
  CHECK(nn::functional::layer_norm(y, Shape{6}).dtype() == DType::Float32);
  // A loss of a half prediction against a float32 target: both in float32.
  Tensor target = ready(randn({4, 6}));
  CHECK(nn::mse_loss(y, target).dtype() == DType::Float32);
  Tensor labels = ready(randint(0, 6, {4}));
  CHECK(nn::cross_entropy(y, labels).dtype() == DType::Float32);
  // The values are the float32 ones within bfloat16's precision.
  std::vector<double> got = y.to_vector<double>();
  amp::autocast off(Device::cpu(), {}, false);
  std::vector<double> want = linear(x, w, b).to_vector<double>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= 2e-2 * (1 + std::abs(want[i])));
  }
}

TEST_CASE("autocast scopes nest, turn off inside, restore and stay on their thread", "[amp]") {
  CHECK_FALSE(amp::autocast_state().enabled);
  {
    amp::autocast outer(Device::cpu(), DType::Float16);
    CHECK(amp::autocast_state().dtype == DType::Float16);
    {
      amp::autocast off(Device::cpu(), {}, false);
      CHECK_FALSE(amp::autocast_state().enabled);
      Tensor a = ones({2, 2});
      CHECK(matmul(a, a).dtype() == DType::Float32);
      {
        amp::autocast inner;  // on again, keeping the outer scope's dtype
        CHECK(amp::autocast_state().enabled);
        CHECK(amp::autocast_state().dtype == DType::Float16);
      }
      CHECK_FALSE(amp::autocast_state().enabled);
    }
    CHECK(amp::autocast_state().enabled);
    CHECK_FALSE(amp::autocast_state(Device::cuda(0)).enabled);  // per device kind
    bool other_thread_enabled = true;
    std::thread t([&] { other_thread_enabled = amp::autocast_state().enabled; });
    t.join();
    CHECK_FALSE(other_thread_enabled);
  }
  CHECK_FALSE(amp::autocast_state().enabled);
  CHECK(amp::autocast_state(Device::cuda(0)).dtype == DType::Float16);  // CUDA's default
  CHECK_THROWS_AS(amp::autocast(Device::cpu(), DType::Float32), DTypeError);
  CHECK_FALSE(amp::autocast_state().enabled);
}

TEST_CASE("training under autocast: gradients in the parameters' dtype, close to float32's",
          "[amp][train][autograd]") {
  // A step under autocast, backward and the update inside the scope (as a user may write
  // it): parameters and their gradients stay float32, the products run as bfloat16 GEMMs,
  // and the gradients agree with the reference evaluator on the same graph and with float32
  // training within bfloat16's precision.
  auto run = [](bool autocast_on, const char* executor) {
    kiln::test::ExecutorScope scope(executor);
    manual_seed(3);
    nn::Linear l1(16, 32), l2(32, 5);
    Tensor x = randn({24, 16});
    Tensor y = randint(0, 5, {24});
    std::vector<Tensor> params = l1.parameters();
    for (const Tensor& p : l2.parameters()) params.push_back(p);
    std::vector<double> out;
    {
      amp::autocast ac(Device::cpu(), {}, autocast_on);
      Tensor h = relu(l1.forward(x));
      if (autocast_on) CHECK(h.dtype() == DType::BFloat16);
      Tensor loss = nn::cross_entropy(l2.forward(h), y);
      CHECK(loss.dtype() == DType::Float32);
      loss.backward();
      out.push_back(loss.item<double>());
    }
    for (const Tensor& p : params) {
      CHECK(p.dtype() == DType::Float32);
      REQUIRE(p.grad().defined());
      CHECK(p.grad().dtype() == DType::Float32);
      std::vector<double> g = p.grad().to_vector<double>();
      out.insert(out.end(), g.begin(), g.end());
    }
    optim::SGD opt(params, {.lr = 0.1});
    {
      amp::autocast ac(Device::cpu(), {}, autocast_on);
      opt.step();
    }
    for (const Tensor& p : params) CHECK(p.dtype() == DType::Float32);
    return out;
  };
  const std::vector<double> amp_jit = run(true, "jit"), amp_ref = run(true, "reference");
  const std::vector<double> fp32 = run(false, "jit");
  REQUIRE(amp_jit.size() == fp32.size());
  REQUIRE(amp_ref.size() == fp32.size());
  double scale = 0;
  for (double v : fp32) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < fp32.size(); ++i) {
    INFO("value " << i << ": autocast jit " << amp_jit[i] << ", reference " << amp_ref[i]
                  << ", float32 " << fp32[i]);
    CHECK(std::abs(amp_jit[i] - amp_ref[i]) <= 1e-2 * (std::abs(amp_ref[i]) + 0.05 * scale));
    CHECK(std::abs(amp_jit[i] - fp32[i]) <= 5e-2 * (std::abs(fp32[i]) + 0.05 * scale));
  }
}

TEST_CASE("a linear layer under autocast is one bfloat16 GEMM and no widening kernels",
          "[amp][matmul]") {
  if (!jit::cpu_gemm_available(DType::BFloat16)) {
    WARN("no CPU GEMM library in this build: skipped");
    return;
  }
  manual_seed(4);
  Tensor x = ready(randn({64, 128})), w = ready(randn({256, 128})), b = ready(randn({256}));
  kiln::test::ExecutorScope jit_scope("jit");
  amp::autocast scope;
  Tensor y = relu(linear(x, w, b));
  y.eval();
  const jit::EvalStats s = jit::last_eval_stats();
  CHECK(s.library_calls == 1);
  // The operands' casts to bfloat16 (x, w) and the bias + relu kernel; the GEMM reads the
  // bfloat16 copies, never widened float32 ones, and writes its rounded result itself.
  CHECK(s.kernels == 3);
}

TEST_CASE("O2: a bfloat16 model keeps its norms in float32 and trains through float32 masters",
          "[amp][optim][train]") {
  auto make = [] {
    manual_seed(9);
    return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
        std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::LayerNorm>(16),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 4)});
  };
  auto half_model = make();
  half_model->to(DType::BFloat16);
  for (const auto& [name, p] : half_model->named_parameters()) {
    INFO(name);
    // The LayerNorm (child 1) stays float32; the linear layers are bfloat16.
    CHECK(p.dtype() == (name.rfind("1.", 0) == 0 ? DType::Float32 : DType::BFloat16));
  }
  auto train = [](const std::shared_ptr<nn::Sequential>& model, DType input, bool master, double lr,
                  int steps) {
    optim::AdamW opt(model->parameters(), {.lr = lr, .master_weights = master});
    manual_seed(10);
    Tensor x = cast(randn({32, 8}), input), y = randint(0, 4, {32});
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      Tensor out = model->forward(x);
      CHECK(out.dtype() == input);  // the norm's output is back in the model's dtype
      Tensor loss = nn::cross_entropy(cast(out, DType::Float32), y);
      loss.backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
    return std::make_pair(losses, opt.state_dict());
  };
  auto fp32_model = make();
  const auto [fp32_losses, fp32_state] = train(fp32_model, DType::Float32, false, 1e-2, 20);
  const auto [o2_losses, o2_state] = train(half_model, DType::BFloat16, true, 1e-2, 20);
  CHECK(o2_losses.back() < o2_losses.front() * 0.8);
  for (size_t s = 0; s < o2_losses.size(); ++s)
    CHECK(std::abs(o2_losses[s] - fp32_losses[s]) <= 0.05 * (1 + fp32_losses[s]));
  // Parameters stay bfloat16; each has a float32 master, and the optimizer state is float32.
  for (const Tensor& p : half_model->parameters())
    CHECK((p.dtype() == DType::BFloat16 || p.dtype() == DType::Float32));
  int masters = 0;
  for (const auto& [key, t] : o2_state) {
    if (key.find(".master") != std::string::npos) ++masters;
    if (key.find(".exp_avg") != std::string::npos) CHECK(t.dtype() == DType::Float32);
  }
  CHECK(masters == 4);  // two bfloat16 linear layers: weight and bias each
  // The state loads back into an optimizer with master weights, and not into one without.
  optim::AdamW again(half_model->parameters(), {.lr = 1e-2, .master_weights = true});
  again.load_state_dict(o2_state);
  optim::AdamW plain(half_model->parameters(), {.lr = 1e-2});
  CHECK_THROWS_AS(plain.load_state_dict(o2_state), Error);
}

TEST_CASE("master weights keep updates smaller than a bfloat16 parameter's precision",
          "[amp][optim]") {
  // w = 1 in bfloat16 has a spacing of 2^-7: SGD steps of 1e-3 vanish when applied to the
  // parameter itself, and add up in a float32 master copy.
  for (bool master : {false, true}) {
    INFO("master weights " << master);
    Tensor w = full({4}, 1.0, DType::BFloat16);
    w.requires_grad_(true);
    optim::SGD opt({w}, {.lr = 1e-3, .master_weights = master});
    for (int s = 0; s < 20; ++s) {
      opt.zero_grad();
      sum(cast(w, DType::Float32)).backward();  // gradient 1 everywhere
      opt.step();
    }
    CHECK(w.dtype() == DType::BFloat16);
    const double got = w.to_vector<double>()[0];
    if (master)
      CHECK(std::abs(got - 0.98) <= 1.0 / 128);  // 1 - 20 * 1e-3, rounded to bfloat16
    else
      CHECK(got == 1.0);
  }
}

namespace {

// Linear-ReLU-Linear-GELU-Linear: three GEMMs, each with a bias and (but the last) an
// activation to fuse behind it.
std::shared_ptr<nn::Sequential> three_layers(int64_t in, int64_t hidden, int64_t out) {
  manual_seed(9);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
      std::make_shared<nn::Linear>(in, hidden), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(hidden, hidden), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(hidden, out)});
}

// `depth` GELU layers of width `hidden`, then a linear head.
std::shared_ptr<nn::Sequential> deep_mlp(int64_t in, int64_t hidden, int64_t out, int depth) {
  manual_seed(9);
  auto model = std::make_shared<nn::Sequential>();
  for (int d = 0; d < depth; ++d) {
    model->push_back(std::make_shared<nn::Linear>(d == 0 ? in : hidden, hidden));
    model->push_back(std::make_shared<nn::GELU>());
  }
  model->push_back(std::make_shared<nn::Linear>(hidden, out));
  return model;
}

}  // namespace

TEST_CASE("half layers are one GEMM plus one fused kernel each, with no standalone casts",
          "[amp][fusion]") {
  if (!jit::cpu_gemm_available(DType::BFloat16)) {
    WARN("no CPU GEMM library in this build: skipped");
    return;
  }
  kiln::test::ExecutorScope jit_scope("jit");
  Tensor x = ready(randn({32, 64}));
  // O2: a bfloat16 model. Each layer's bias, activation and rounding run in the GEMM's
  // epilogue kernel: the forward is three library GEMMs and nothing else.
  {
    auto model = three_layers(64, 128, 10);
    model->to(DType::BFloat16);
    for (Tensor& p : model->parameters()) p.eval();
    Tensor xh = ready(cast(x, DType::BFloat16));
    model->forward(xh).eval();
    const jit::EvalStats s = jit::last_eval_stats();
    CHECK(s.library_calls == 3);
    CHECK(s.kernels == 3);  // generated kernels: the three epilogues
  }
  // O1: float32 parameters under autocast. The library reads half operands from memory, so
  // each float32 weight and the float32 input are rounded once into a bfloat16 copy (as
  // torch.autocast does); every other cast (the biases, the activations' rounding) fuses.
  {
    auto model = three_layers(64, 128, 10);
    for (Tensor& p : model->parameters()) p.eval();
    amp::autocast scope;
    Tensor y = model->forward(x);
    y.eval();
    CHECK(y.dtype() == DType::BFloat16);
    const jit::EvalStats s = jit::last_eval_stats();
    CHECK(s.library_calls == 3);
    CHECK(s.kernels == 3 + 4);  // the epilogues and the four casts
  }
}

TEST_CASE("a memory budget and autocast compose: half activations, bit-identical budgeted steps",
          "[amp][plan]") {
  struct BudgetGuard {
    ~BudgetGuard() { memory::clear_budget(); }
  } guard;
  kiln::test::ExecutorScope jit_scope("jit");
  memory::CachingPool& pool = memory::host_pool();
  manual_seed(12);
  // Wide activations, few parameters: most of a step's bytes are activations and their
  // gradients, which autocast halves.
  const Tensor x = ready(randn({2048, 64})), labels = ready(randint(0, 16, {2048}));
  struct Run {
    std::vector<double> losses;
    std::vector<std::vector<float>> params;
    size_t step_bytes = 0;  // peak allocated above the step's start, last step
    memory::PlanSummary plan;
  };
  // Three SGD steps; a budget of `fraction` of `step_bytes` above the start of the last one.
  auto run = [&](bool autocast_on, size_t step_bytes, double fraction) {
    auto model = deep_mlp(64, 256, 16, 6);
    for (Tensor& p : model->parameters()) p.eval();
    optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
    Run r;
    for (int step = 0; step < 3; ++step) {
      const bool last = step == 2;
      const size_t start = pool.allocated();
      if (last && fraction > 0)
        memory::set_budget(start + static_cast<size_t>(fraction * static_cast<double>(step_bytes)));
      pool.reset_peak_stats();
      opt.zero_grad();
      Tensor loss;
      {
        amp::autocast ac(Device::cpu(), {}, autocast_on);
        loss = nn::cross_entropy(model->forward(x), labels);
      }
      loss.backward();
      opt.step();
      r.losses.push_back(loss.item<double>());
      if (last) {
        r.step_bytes = pool.stats().peak_allocated - start;
        r.plan = memory::last_plan();
        memory::clear_budget();
      }
    }
    for (const Tensor& p : model->parameters()) r.params.push_back(p.to_vector<float>());
    return r;
  };
  const Run fp32 = run(false, 0, 0), amp = run(true, 0, 0);
  INFO("step bytes: float32 " << fp32.step_bytes << ", bfloat16 autocast " << amp.step_bytes);
  // The planner and the pool count bfloat16 values at two bytes, and the half GEMMs store
  // their rounded results themselves: the activations and their gradients halve (0.51 here);
  // the float32 gradients of the float32 parameters do not.
  CHECK(amp.step_bytes < fp32.step_bytes * 0.6);
  for (double fraction : {0.7, 0.5}) {
    INFO("budget: " << fraction << " of the autocast step's bytes");
    const Run budgeted = run(true, amp.step_bytes, fraction);
    INFO(memory::plan_report());
    CHECK(budgeted.plan.within_budget);
    CHECK(budgeted.plan.recomputes > 0);
    CHECK(budgeted.step_bytes <= static_cast<size_t>(fraction * amp.step_bytes * 1.01));
    CHECK(budgeted.losses == amp.losses);  // bit for bit: recomputation changes no value
    CHECK(budgeted.params == amp.params);
  }
}
