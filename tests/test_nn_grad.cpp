// Gradients of the nn layers and losses against float64 central differences, on the
// reference executor: modules are cast with to(Float64), inputs are float64 leaves, and the
// objective is a random linear functional of the output (so no symmetry hides an error).
// Tolerance: |analytic - numeric| <= 1e-6 (1 + |numeric|), step 1e-6.
#include "test_nn_support.h"

using namespace nn_test;
namespace nn = kiln::nn;

namespace {

Tensor leaf(const Shape& shape, uint64_t seed, double scale = 1.0) {
  std::vector<double> v = random_values(kiln::numel(shape), seed);
  for (double& x : v) x *= scale;
  Tensor t = make(v, shape, DType::Float64);
  t.requires_grad_();
  return t;
}

// sum(y * r) for a fixed random r of y's shape.
Tensor project(const Tensor& y, uint64_t seed) {
  return kiln::sum(y * make(random_values(y.numel(), seed), y.shape(), DType::Float64));
}

std::vector<Tensor> with(std::vector<Tensor> params, std::initializer_list<Tensor> extra) {
  params.insert(params.end(), extra);
  return params;
}

}  // namespace

TEST_CASE("nn gradient check of Linear", "[nn][grad]") {
  kiln::manual_seed(71);
  nn::Linear lin(4, 3);
  lin.to(DType::Float64);
  Tensor x = leaf({2, 5, 4}, 1);
  REQUIRE(gradient_check([&] { return project(lin.forward(x), 2); }, with(lin.parameters(), {x})) ==
          "");
}

TEST_CASE("nn gradient check of Conv2d with stride, padding, dilation and groups",
          "[nn][grad][conv]") {
  kiln::manual_seed(72);
  for (auto [stride, padding, dilation, groups] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 1, 1, 2}, {1, 2, 2, 1}, {1, 0, 1, 1}}) {
    INFO("stride " << stride << " padding " << padding << " dilation " << dilation << " groups "
                   << groups);
    nn::Conv2d conv(4, 4, 3, stride, padding, dilation, groups);
    conv.to(DType::Float64);
    Tensor x = leaf({2, 4, 5, 5}, 3);
    REQUIRE(gradient_check([&] { return project(conv.forward(x), 4); },
                           with(conv.parameters(), {x})) == "");
  }
}

TEST_CASE("nn gradient check of pooling", "[nn][grad][pool]") {
  Tensor x = leaf({2, 2, 5, 6}, 5);
  REQUIRE(gradient_check([&] { return project(nn::F::max_pool2d(x, 3, 2, 1), 6); }, {x}) == "");
  REQUIRE(gradient_check([&] { return project(nn::F::avg_pool2d(x, 3, 2, 1, true, false), 7); },
                         {x}) == "");
  REQUIRE(gradient_check(
              [&] {
                return project(nn::F::adaptive_avg_pool2d(x, {3, 4}), 8);
              },
              {x}) == "");
}

TEST_CASE("nn gradient check of LSTM with initial states and two layers", "[nn][grad][lstm]") {
  kiln::manual_seed(73);
  nn::LSTM lstm(2, 3, 2);
  lstm.to(DType::Float64);
  Tensor x = leaf({4, 2, 2}, 9), h0 = leaf({2, 2, 3}, 10), c0 = leaf({2, 2, 3}, 11);
  auto loss = [&] {
    auto out = lstm.forward(x, h0, c0);
    return project(out.output, 12) + project(out.c_n, 13);
  };
  REQUIRE(gradient_check(loss, with(lstm.parameters(), {x, h0, c0}), 1e-6, 1e-6, 12) == "");
}

TEST_CASE("nn gradient check of MultiheadAttention with masks", "[nn][grad][attention]") {
  kiln::manual_seed(74);
  nn::MultiheadAttention mha(4, 2);
  mha.to(DType::Float64);
  nn::init::uniform_(mha.in_proj_bias, -0.5, 0.5);
  Tensor q = leaf({2, 2, 4}, 14), kv = leaf({3, 2, 4}, 15);
  Tensor pad = kiln::from_vector<bool>({false, false, true, false, false, false}, {2, 3});
  Tensor add = make(random_values(6, 16), {2, 3}, DType::Float64);
  auto loss = [&] {
    auto r = mha.forward(q, kv, kv, pad, true, add);
    return project(r.output, 17) + project(r.weights, 18);
  };
  REQUIRE(gradient_check(loss, with(mha.parameters(), {q, kv}), 1e-6, 1e-6, 16) == "");
  // Self-attention through the packed projection, causal.
  Tensor x = leaf({3, 2, 4}, 19);
  REQUIRE(gradient_check(
              [&] {
                return project(mha.forward(x, x, x, Tensor(), false, Tensor(), true, true).output,
                               20);
              },
              with(mha.parameters(), {x}), 1e-6, 1e-6, 16) == "");
}

TEST_CASE("nn gradient check of LayerNorm and BatchNorm in training mode", "[nn][grad][norm]") {
  kiln::manual_seed(75);
  nn::LayerNorm ln({2, 3});
  ln.to(DType::Float64);
  nn::init::uniform_(ln.weight, 0.5, 1.5);
  Tensor x = leaf({4, 2, 3}, 21, 2.0);
  REQUIRE(gradient_check([&] { return project(ln.forward(x), 22); }, with(ln.parameters(), {x})) ==
          "");

  nn::BatchNorm2d bn(3);
  bn.to(DType::Float64);
  nn::init::uniform_(bn.weight, 0.5, 1.5);
  Tensor img = leaf({3, 3, 2, 2}, 23, 2.0);
  REQUIRE(gradient_check([&] { return project(bn.forward(img), 24); },
                         with(bn.parameters(), {img})) == "");
  nn::BatchNorm1d bn1(2);
  bn1.to(DType::Float64);
  Tensor seq = leaf({3, 2, 4}, 25);
  REQUIRE(gradient_check([&] { return project(bn1.forward(seq), 26); },
                         with(bn1.parameters(), {seq})) == "");
}

TEST_CASE("nn gradient check of Embedding, activations and dropout", "[nn][grad]") {
  kiln::manual_seed(76);
  nn::Embedding emb(5, 3);  // (the padding row is excluded by design: see test_nn_layers)
  emb.to(DType::Float64);
  Tensor idx = kiln::from_vector<int64_t>({1, 0, 4, 1, 3, 0}, {2, 3});
  REQUIRE(gradient_check([&] { return project(emb.forward(idx), 27); }, emb.parameters()) == "");
  Tensor x = leaf({12}, 28, 3.0);
  std::vector<std::shared_ptr<nn::UnaryModule>> activations = {
      std::make_shared<nn::GELU>(), std::make_shared<nn::GELU>(nn::F::GeluApproximation::Tanh),
      std::make_shared<nn::SiLU>(), std::make_shared<nn::LeakyReLU>(0.1),
      std::make_shared<nn::Softmax>(0)};
  for (auto& m : activations) {
    INFO(m->name());
    REQUIRE(gradient_check([&] { return project(m->forward(x), 29); }, {x}) == "");
  }
  // Dropout: the gradient is the mask times 1/(1-p), the same draw as the forward's.
  kiln::manual_seed(5);
  std::vector<double> scale = values(nn::F::dropout(kiln::ones({12}, DType::Float64), 0.4));
  kiln::manual_seed(5);
  auto g = kiln::grad(kiln::sum(nn::F::dropout(x, 0.4)), {x});
  NN_REQUIRE_CLOSE(values(g[0]), scale, 1e-12, 0);
}

TEST_CASE("nn gradient check of the losses", "[nn][grad][loss]") {
  Tensor logits = leaf({5, 4}, 30, 3.0);
  Tensor y = kiln::from_vector<int64_t>({1, -100, 3, 0, 1}, {5});
  Tensor w = make({0.5, 2.0, 1.0, 1.5}, {4}, DType::Float64);
  for (double smoothing : {0.0, 0.2}) {
    INFO("label_smoothing " << smoothing);
    REQUIRE(gradient_check(
                [&] {
                  return nn::cross_entropy(logits, y, {.label_smoothing = smoothing, .weight = w});
                },
                {logits}) == "");
  }
  Tensor probs = kiln::softmax(make(random_values(20, 31), {5, 4}, DType::Float64), 1);
  REQUIRE(gradient_check([&] { return nn::cross_entropy(logits, probs, {.label_smoothing = 0.1}); },
                         {logits}) == "");
  Tensor target = make(random_values(20, 32), {5, 4}, DType::Float64);
  REQUIRE(gradient_check([&] { return nn::mse_loss(logits, target); }, {logits}) == "");
  Tensor labels =
      kiln::cast(make(random_values(20, 33), {5, 4}, DType::Float64) > 0, DType::Float64);
  Tensor pw = make({2.0, 0.5, 1.0, 3.0}, {4}, DType::Float64);
  REQUIRE(
      gradient_check(
          [&] { return nn::binary_cross_entropy_with_logits(logits, labels, {.pos_weight = pw}); },
          {logits}) == "");
}

TEST_CASE("nn gradient check harness reports a wrong gradient", "[nn][grad]") {
  // A detached factor hides half of d(x^2)/dx from autograd: the check must notice.
  Tensor x = leaf({3}, 34);
  std::string report = gradient_check([&] { return kiln::sum(x.detach() * x); }, {x});
  CHECK_THAT(report, Catch::Contains("parameter 0 element 0"));
}
