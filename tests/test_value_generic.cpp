// Kernels are generic in values as well as shapes (docs/architecture.md): a floating
// constant is a kernel parameter, so a new scale, slope, probability, batch size or sequence
// length reuses the kernels already compiled. Values are checked against the reference
// executor (or hand-derived formulas) for every value tried.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "frontend/optim.h"
#include "jit/kernel_cache.h"
#include "op_harness.h"

using namespace kiln;
using kiln::test::ExecutorScope;

namespace {

// Kernels this process compiled or loaded from disk: a new kernel either way.
uint64_t kernels_loaded() {
  const jit::CacheStats s = jit::cache_stats();
  return s.kernels_compiled + s.disk_hits;
}

std::vector<double> on_reference(const std::function<Tensor()>& f) {
  ExecutorScope ref("reference");
  return f().to_vector<double>();
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": " << got[i] << " vs " << want[i]);
    REQUIRE(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

}  // namespace

TEST_CASE("a scalar's value is a kernel parameter: ten values compile one kernel",
          "[fusion][values]") {
  Generator gen(3);
  const Tensor a = randn({257}, DType::Float32, gen).eval();
  const Tensor h = randn({33}, DType::Float16, gen).eval();
  const std::vector<std::pair<std::string, std::function<Tensor(double)>>> programs = {
      {"a * s", [&](double s) { return a * s; }},
      {"a + s", [&](double s) { return a + s; }},
      {"pow(a, s) exponent tensor", [&](double s) { return pow(abs(a) + 0.5, full({257}, s)); }},
      {"clamp", [&](double s) { return clamp(a, -s, s * 0.5); }},
      {"leaky_relu", [&](double s) { return nn::F::leaky_relu(a, s * 0.1); }},
      {"dropout", [&](double s) { return nn::F::dropout(a, s * 0.09, true); }},
      {"pad value",
       [&](double s) {
         return pad(a, {{2, 3}}, s);
       }},
      {"float16 scale", [&](double s) { return h * s + 0.25; }},
  };
  for (const auto& [name, f] : programs) {
    INFO(name);
    f(0.37).eval();  // compiles the kernel
    const uint64_t before = kernels_loaded();
    for (int k = 2; k <= 10; ++k) {
      const double s = 0.37 * k + 0.011 * k * k;
      manual_seed(5);
      const std::vector<double> got = f(s).to_vector<double>();
      manual_seed(5);
      const std::vector<double> want = on_reference([&] { return f(s); });
      check_close(got, want, name == "float16 scale" ? 1e-3 : 1e-6);
    }
    CHECK(kernels_loaded() == before);
  }
}

TEST_CASE("literals stay where they change the code: 0, 1, -1 and non-finite values",
          "[fusion][values]") {
  Generator gen(4);
  const Tensor a = randn({65}, DType::Float32, gen).eval();
  const std::vector<float> av = a.to_vector<float>();
  for (double s : std::vector<double>{0.0, 1.0, -1.0, INFINITY, -INFINITY, NAN, 2.0}) {
    INFO("s = " << s);
    const std::vector<float> got = (a * s).to_vector<float>();
    for (size_t i = 0; i < av.size(); ++i) {
      const float want = av[i] * static_cast<float>(s);
      if (std::isnan(want))
        CHECK(std::isnan(got[i]));
      else
        CHECK(got[i] == want);
    }
  }
  // pow(x, 2) and pow(x, 3): exponents are literals (x*x), and both stay exact.
  for (double e : {2.0, 3.0, 0.5}) {
    const Tensor x = abs(a) + 0.25;
    const std::vector<double> got = pow(x, e).to_vector<double>();
    const std::vector<double> want = on_reference([&] { return pow(x, e); });
    check_close(got, want, 1e-6);
  }
}

namespace {

// Steps of `step(batch, length)` at random sizes; nothing may compile once three distinct
// shapes (the smallest, middle and largest of both ranges) ran.
struct Sizes {
  int64_t lo, hi;
};
void check_no_compiles_after_warmup(const std::string& what,
                                    const std::function<void(int64_t, int64_t)>& step, Sizes batch,
                                    Sizes length, uint64_t seed,
                                    const std::vector<int64_t>& more_lengths = {}) {
  std::mt19937_64 rng(seed);
  auto pick = [&](Sizes r) {
    return r.lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(r.hi - r.lo + 1));
  };
  step(batch.lo, length.lo);
  step((batch.lo + batch.hi) / 2, (length.lo + length.hi) / 2);
  step(batch.hi, length.hi);
  for (int64_t t : more_lengths) step(batch.lo, t);
  step(batch.lo, length.lo);  // a second step at a shape sees the optimizer's state exist
  const uint64_t before = kernels_loaded();
  for (int s = 0; s < 6; ++s) {
    const int64_t b = pick(batch), t = pick(length);
    INFO(what << " step at batch " << b << ", length " << t);
    step(b, t);
    CHECK(kernels_loaded() == before);
  }
}

}  // namespace

TEST_CASE(
    "training with a new batch size and length every step compiles nothing after the first shapes",
    "[fusion][values][train]") {
  manual_seed(21);
  SECTION("MLP with batch_norm and mse_loss") {
    auto model =
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
            std::make_shared<nn::Linear>(12, 32), std::make_shared<nn::BatchNorm1d>(32),
            std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(32, 4)});
    optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
    check_no_compiles_after_warmup(
        "mlp",
        [&](int64_t batch, int64_t) {
          Tensor x = randn({batch, 12}), y = randn({batch, 4});
          opt.zero_grad();
          Tensor loss = nn::mse_loss(model->forward(x), y);
          loss.backward();
          opt.step();
          REQUIRE(std::isfinite(loss.item<double>()));
        },
        {2, 40}, {1, 1}, 1);
  }
  SECTION("LSTM over a new batch size and sequence length every step") {
    // The whole output feeds the loss and the input wants its gradient, so the step joins
    // T step outputs forward and T slices' gradients backward (detail::concat_tree).
    auto lstm = std::make_shared<nn::LSTM>(6, 16);
    auto head = std::make_shared<nn::Linear>(16, 3);
    std::vector<Tensor> params = lstm->parameters();
    for (const Tensor& p : head->parameters()) params.push_back(p);
    optim::Adam opt(params, {.lr = 0.01});
    check_no_compiles_after_warmup(
        "lstm",
        [&](int64_t batch, int64_t t) {
          Tensor x = randn({t, batch, 6}).requires_grad_();
          Tensor y = randint(0, 3, {t * batch});
          opt.zero_grad();
          nn::LSTMOutput out = lstm->forward(x);
          Tensor logits = head->forward(reshape(out.output, {t * batch, 16}));
          Tensor loss = nn::cross_entropy(logits, y) + mean(square(out.h_n));
          loss.backward();
          opt.step();
          REQUIRE(std::isfinite(loss.item<double>()));
          REQUIRE(std::isfinite(sum(x.grad()).item<double>()));
        },
        // With its gates stored, the LSTM's backward has one kernel (a gate-gradient join
        // whose output-gradient slice starts at row 0, a literal) whose form depends on the
        // length: lengths 5 and 11 compile it, 2, 13 and 24 do not. Lengths 2 to 7 meet
        // every form (checked for every length up to 100 at batch 4).
        {2, 9}, {2, 24}, 2, {3, 4, 5, 6, 7});
  }
  SECTION("Transformer encoder layer over a new batch size and sequence length every step") {
    // Batches from 2: a dimension of size 1 is a broadcast, a different kernel structure.
    auto layer = std::make_shared<nn::TransformerEncoderLayer>(16, 2, 32, 0.1);
    optim::AdamW opt(layer->parameters(), {.lr = 0.01});
    check_no_compiles_after_warmup(
        "transformer",
        [&](int64_t batch, int64_t s) {
          Tensor x = randn({s, batch, 16});
          opt.zero_grad();
          Tensor loss = mean(square(layer->forward(x)));
          loss.backward();
          opt.step();
          REQUIRE(std::isfinite(loss.item<double>()));
        },
        {2, 5}, {2, 20}, 3);
  }
}
