// Smaller kept values (issue 27 §2): what a training step keeps for the backward pass of
// its masks. A dropout mask is regenerated from its draw's counters in every kernel that
// reads it instead of being stored from the forward kernel to the backward one; the
// gradients still agree with the reference evaluator, and the kept bytes shrink.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <vector>

#include "bench/kept_for_backward.h"
#include "frontend/kiln.h"
#include "frontend/nn/nn.h"
#include "test_nn_support.h"

using namespace kiln;
using nn_test::ExecutorGuard;
using nn_test::values;

namespace {

// A value whose kernel only draws and compares: a mask stored on its own.
bool is_mask_kernel(const std::string& ops) {
  return ops.find("rand") != std::string::npos && ops.find("linear") == std::string::npos &&
         ops.find("where") == std::string::npos;
}

}  // namespace

TEST_CASE("dropout gradients agree with the draw of the forward pass", "[kept][dropout]") {
  ExecutorGuard jit("jit");
  // Rows of 1027 (not a multiple of 4): the forward's map makes a row's words ahead of its
  // loop, while the backward regenerates them in kernels of other shapes; both must give
  // each element the same bit.
  const double p = 0.3;
  manual_seed(41);
  Tensor x = (rand({33, 1027}) + 1.0f).eval();  // never 0, so out != 0 exactly where kept
  x.requires_grad_(true);
  Tensor c = randn({33, 1027}).eval();
  Tensor out = nn::F::dropout(x, p, true);
  std::vector<Tensor> g = grad(sum(out * c), {x});
  eval({out, g[0]});
  const std::vector<double> o = values(out), gv = values(g[0]), cv = values(c);
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  size_t kept = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    INFO("element " << i);
    const double want = o[i] != 0.0 ? static_cast<double>(static_cast<float>(cv[i]) * scale) : 0.0;
    REQUIRE(std::fabs(gv[i] - want) <= 1e-6 * std::fabs(want));
    kept += o[i] != 0.0;
  }
  // The share kept is 1 - p within a few standard deviations (33,891 draws).
  CHECK(std::fabs(static_cast<double>(kept) / static_cast<double>(o.size()) - (1.0 - p)) < 0.02);
}

TEST_CASE("attention dropout's backward matches the reference evaluator", "[kept][dropout]") {
  // The mask is read by the softmax's backward row reduction (drawn per element there) and
  // by the forward's map (drawn per row): the JIT and the reference evaluator (node by
  // node, float64 sums) must agree on the gradient of the scores.
  auto run = [](const char* executor) {
    ExecutorGuard use(executor);
    manual_seed(7);
    Tensor s = randn({2, 3, 17, 67}).eval();
    s.requires_grad_(true);
    Tensor v = randn({2, 3, 67, 5}).eval();
    Tensor c = randn({2, 3, 17, 5}).eval();
    Tensor y = matmul(nn::F::dropout(softmax(s, -1), 0.25, true), v);
    std::vector<Tensor> g = grad(sum(y * c), {s});
    return values(g[0]);
  };
  const std::vector<double> got = run("jit"), want = run("reference");
  NN_REQUIRE_CLOSE(got, want, 1e-5, 1e-4);
}

TEST_CASE("a dropout mask is not kept for the backward pass", "[kept][dropout]") {
  ExecutorGuard jit("jit");
  // Linear -> ReLU -> Dropout -> Linear: the step keeps the first product (relu's gradient
  // reads its sign) and the dropped activations (the second product's weight gradient
  // reads them), 4 bytes per element each; the mask (1 byte per element as bool) is drawn
  // again in the backward kernel.
  const int64_t batch = 64, hidden = 512;
  manual_seed(3);
  auto model =
      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
          std::make_shared<nn::Linear>(256, hidden), std::make_shared<nn::ReLU>(),
          std::make_shared<nn::Dropout>(0.2), std::make_shared<nn::Linear>(hidden, 10)});
  eval(model->parameters());
  optim::SGD opt(model->parameters(), optim::SGDOptions{.lr = 0.01});
  Tensor x = randn({batch, 256}).eval();
  Tensor y = randint(0, 10, {batch}).eval();
  auto step = [&] {
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(model->forward(x), y);
    loss.backward();
    opt.step();
    (void)loss.item<float>();
  };
  step();
  const bench::KeptForBackward kept = bench::measure_kept_for_backward(step);
  REQUIRE(kept.found);
  const size_t activation = static_cast<size_t>(batch * hidden) * 4;
  for (const auto& v : kept.list) {
    INFO(v.kernel << " " << v.bytes);
    CHECK_FALSE(is_mask_kernel(v.kernel));
  }
  // The two activations and the loss's small row statistics; a stored mask would add
  // batch * hidden bytes.
  CHECK(kept.activations >= 2 * activation);
  CHECK(kept.activations < 2 * activation + static_cast<size_t>(batch * hidden) / 2);
}
