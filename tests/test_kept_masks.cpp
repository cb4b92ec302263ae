// Smaller kept values (issue 27 §2): what a training step keeps for the backward pass of
// its masks. A dropout mask is regenerated from its draw's counters in every kernel that
// reads it instead of being stored from the forward kernel to the backward one; the
// gradients still agree with the reference evaluator, and the kept bytes shrink.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "bench/kept_for_backward.h"
#include "frontend/kiln.h"
#include "frontend/nn/nn.h"
#include "memory/pools/budget.h"
#include "ops/bit_mask.h"
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

// Linear -> ReLU -> Dropout -> Linear, the Transformer's feed-forward block: what its
// training step keeps for the backward pass.
bench::KeptForBackward kept_by_feed_forward(bool dropout, int64_t batch, int64_t hidden) {
  manual_seed(3);
  std::vector<std::shared_ptr<nn::UnaryModule>> layers{std::make_shared<nn::Linear>(256, hidden),
                                                       std::make_shared<nn::ReLU>()};
  // p = 0.1 and momentum 0.9: the mask compares its draw with 1 - p, the scalar the
  // optimizer's update reads too, which an earlier evaluation may have stored.
  if (dropout) layers.push_back(std::make_shared<nn::Dropout>(0.1));
  layers.push_back(std::make_shared<nn::Linear>(hidden, 10));
  auto model = std::make_shared<nn::Sequential>();
  for (auto& l : layers) model->push_back(l);
  eval(model->parameters());
  optim::SGD opt(model->parameters(), optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
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
  step();
  return bench::measure_kept_for_backward(step);
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

TEST_CASE("a dropout mask and relu's input are not kept for the backward pass",
          "[kept][dropout][relu]") {
  ExecutorGuard jit("jit");
  // The second product's weight gradient reads the dropped activations (4 bytes per
  // element); relu's gradient reads its sign, packed into bits in the forward pass, since
  // relu's output is computed inside the dropout's kernel and never stored. Neither the
  // mask (1 byte per element as bool) nor the first product (4 bytes) is kept.
  const int64_t batch = 64, hidden = 512;
  const bench::KeptForBackward kept = kept_by_feed_forward(true, batch, hidden);
  REQUIRE(kept.found);
  const size_t activation = static_cast<size_t>(batch * hidden) * 4;
  for (const auto& v : kept.list) {
    INFO(v.kernel << " " << v.bytes);
    CHECK_FALSE(is_mask_kernel(v.kernel));
    CHECK(v.bytes <= activation);
  }
  // The dropped activations, relu's bits (batch / 8 * hidden bytes) and the loss's row
  // statistics (under 4 KiB here).
  CHECK(kept.activations >= activation + static_cast<size_t>(batch * hidden) / 8);
  CHECK(kept.activations < activation + static_cast<size_t>(batch * hidden) / 8 + 4096);
}

TEST_CASE("relu's output read by a product is kept with no bits beside it", "[kept][relu]") {
  ExecutorGuard jit("jit");
  // Linear -> ReLU -> Linear: the product's weight gradient reads relu's output, so its
  // sign costs nothing more; packing it would only add bits and a kernel.
  const int64_t batch = 64, hidden = 512;
  const bench::KeptForBackward kept = kept_by_feed_forward(false, batch, hidden);
  REQUIRE(kept.found);
  const size_t activation = static_cast<size_t>(batch * hidden) * 4;
  for (const auto& v : kept.list) {
    INFO(v.kernel << " " << v.bytes);
    CHECK(v.kernel.find("pack_bits") == std::string::npos);
  }
  CHECK(kept.activations >= activation);
  CHECK(kept.activations < activation + 4096);
}

TEST_CASE("packed bits read back the mask they were packed from", "[kept][relu]") {
  ExecutorGuard jit("jit");
  // Last dimensions that are and are not multiples of 8, and a rank-0 mask.
  for (const Shape& shape : {Shape{3, 5, 13}, Shape{4, 16}, Shape{1}, Shape{}, Shape{2, 1027}}) {
    INFO(shape_str(shape));
    manual_seed(11);
    Tensor mask = (randn(shape) > 0.0f).eval();
    Tensor packed = kiln::detail::pack_bits(mask);
    CHECK(packed.dtype() == DType::UInt8);
    CHECK(packed.numel() * 8 >= std::max<int64_t>(numel(shape), 1));
    Tensor back = kiln::detail::unpack_bits(packed, shape);
    CHECK(back.shape() == shape);
    CHECK(back.to_vector<bool>() == mask.to_vector<bool>());
  }
}

TEST_CASE("relu's gradient from packed bits matches finite differences", "[kept][relu]") {
  // relu's output read only by elementwise ops (a scale, as dropout's): its backward reads
  // the packed sign. Central differences in float64 on the reference evaluator, and the
  // JIT against the reference at float32 (the same graph both ways).
  kiln::Generator gen(21);
  Tensor x = (kiln::rand({3, 5, 13}, DType::Float64, gen) * 2.0 - 1.0).eval();
  x.requires_grad_(true);
  Tensor w = kiln::rand({3, 5, 13}, DType::Float64, gen).eval();
  auto loss = [&] { return sum(relu(x) * 3.0 * w); };
  REQUIRE(nn_test::gradient_check(loss, {x}, 1e-6, 1e-7, 200) == "");
  auto run = [&](const char* executor) {
    ExecutorGuard use(executor);
    Tensor xf = cast(x.detach(), DType::Float32).eval();
    xf.requires_grad_(true);
    Tensor wf = cast(w, DType::Float32).eval();
    return values(grad(sum(relu(xf) * 3.0f * wf), {xf})[0]);
  };
  const std::vector<double> got = run("jit"), want = run("reference");
  NN_REQUIRE_CLOSE(got, want, 0, 0);  // one multiply per element: exact
}

TEST_CASE("attention masks are read by the kernels and never stored at scores size",
          "[kept][attention]") {
  ExecutorGuard jit("jit");
  // A bool attn_mask [L, S] broadcast over batch and heads, and is_causal (compares of
  // coordinates): the scores' kernels read the mask where they need it, so no value of the
  // step (forward or backward) is a bool [B, H, L, S]. Sizes make that byte count unlike
  // any float value's.
  const int64_t b = 2, h = 4, l = 32, s = 24, e = 16;
  manual_seed(5);
  Tensor q = randn({b, h, l, e}).eval(), k = randn({b, h, s, e}).eval(),
         v = randn({b, h, s, e}).eval();
  for (Tensor* t : {&q, &k, &v}) t->requires_grad_(true);
  Tensor mask = (randn({l, s}) > -1.0f).eval();
  namespace fs = std::filesystem;
  const fs::path file = fs::temp_directory_path() / "kiln_test_attention_mask.graph";
  for (bool causal : {false, true}) {
    INFO("is_causal " << causal);
    setenv("KILN_PLAN_DUMP", file.c_str(), 1);
    Tensor o = nn::F::scaled_dot_product_attention(q, k, v, causal ? Tensor() : mask, 0.0, causal);
    std::vector<Tensor> g = grad(sum(o * o), {q, k, v});
    eval({g[0], g[1], g[2]});
    unsetenv("KILN_PLAN_DUMP");
    const memory::StepGraphFile dump = memory::load_step_graph(file.string());
    REQUIRE(!dump.graph.values.empty());
    for (size_t i = 0; i < dump.graph.values.size(); ++i) {
      INFO("value " << i);
      CHECK(dump.graph.values[i].bytes != static_cast<size_t>(b * h * l * s));
    }
  }
  fs::remove(file);
}

TEST_CASE("an LSTM under a memory budget keeps its summed gates and not both products",
          "[kept][lstm]") {
  ExecutorGuard jit("jit");
  // Without a budget the step keeps the four activated gates of every time step ([B, 4H]
  // in all). Under one they are inlined, and the step keeps their summed pre-activations
  // ([B, 4H]) where it kept the two products that make them (2 x [B, 4H]).
  auto kept_bytes = [](bool budgeted) {
    manual_seed(9);
    nn::LSTM lstm(32, 64, 1, true, true);
    nn::Linear head(64, 16);
    std::vector<Tensor> params = lstm.parameters();
    for (const Tensor& p : head.parameters()) params.push_back(p);
    eval(params);
    optim::Adam opt(params, optim::AdamOptions{.lr = 1e-3});
    Tensor x = randn({8, 24, 32}).eval();
    Tensor y = randint(0, 16, {8 * 24}).eval();
    auto step = [&] {
      opt.zero_grad();
      Tensor logits = head.forward(lstm.forward(x).output);
      Tensor loss = nn::cross_entropy(reshape(logits, {8 * 24, 16}), y);
      loss.backward();
      opt.step();
      (void)loss.item<float>();
    };
    // A budget far above the step: nothing is released, only what fusion stores changes.
    if (budgeted) memory::set_budget(std::string("1GiB"));
    step();
    const bench::KeptForBackward kept = bench::measure_kept_for_backward(step);
    memory::clear_budget();
    REQUIRE(kept.found);
    return kept.activations;
  };
  const size_t free_run = kept_bytes(false), budgeted = kept_bytes(true);
  const size_t products = 24 * static_cast<size_t>(8 * 4 * 64 * 4);  // one [B, 4H] per step
  INFO("unbudgeted " << free_run << ", budgeted " << budgeted);
  // Both keep about one [B, 4H] per step beside h and c; two products would add `products`.
  CHECK(budgeted < free_run + products / 2);
}

TEST_CASE("a mask drawn against a stored probability is drawn again too", "[kept][dropout]") {
  ExecutorGuard jit("jit");
  // The probability as an evaluated scalar (an earlier step may have stored the same weak
  // scalar): it is a buffer the mask reads, but it keeps nothing alive, so the mask is
  // still regenerated rather than stored from the forward kernel to the backward one.
  manual_seed(13);
  Tensor w1 = (randn({128, 256}) * 0.1f).eval(), w2 = (randn({256, 8}) * 0.1f).eval();
  w1.requires_grad_(true);
  w2.requires_grad_(true);
  Tensor x = randn({64, 128}).eval();
  Tensor keep = full({}, 0.9f).eval();
  optim::SGD opt({w1, w2}, optim::SGDOptions{.lr = 0.01});
  auto step = [&] {
    opt.zero_grad();
    Tensor h = matmul(x, w1);
    Tensor d = where(rand(h.shape()) < keep, h * (1.0f / 0.9f), 0.0f);
    Tensor loss = sum(square(matmul(d, w2)));
    loss.backward();
    opt.step();
    (void)loss.item<float>();
  };
  step();
  // No kernel of the step stores the mask (a kernel of the draw and the compare alone).
  namespace fs = std::filesystem;
  const fs::path file = fs::temp_directory_path() / "kiln_test_stored_probability.graph";
  setenv("KILN_PLAN_DUMP", file.c_str(), 1);
  step();
  unsetenv("KILN_PLAN_DUMP");
  const memory::StepGraphFile dump = memory::load_step_graph(file.string());
  fs::remove(file);
  REQUIRE(!dump.kernel_names.empty());
  for (const std::string& name : dump.kernel_names) {
    INFO(name);
    CHECK_FALSE(is_mask_kernel(name));
  }
}
