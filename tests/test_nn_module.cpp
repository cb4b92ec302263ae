// nn::Module: registration, recursive parameter and buffer listing with dotted names,
// shared handles, train/eval, state_dict round trips and their errors, to(dtype), Sequential,
// printing and reproducible initialisation.
#include <cstring>

#include "test_nn_support.h"

using namespace nn_test;
namespace nn = kiln::nn;

namespace {

std::shared_ptr<nn::Sequential> small_convnet() {
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Conv2d>(1, 2, 3, 1, 1));
  net->push_back(std::make_shared<nn::BatchNorm2d>(2));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Flatten>());
  net->push_back(std::make_shared<nn::Linear>(2 * 4 * 4, 3));
  return net;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  return std::memcmp(a.raw_data(), b.raw_data(),
                     static_cast<size_t>(a.numel()) * kiln::itemsize(a.dtype())) == 0;
}

// A user-defined module with a parameter, a buffer and two children.
struct Block : nn::UnaryModule {
  Block() : nn::UnaryModule("Block") {
    scale = register_parameter("scale", kiln::ones({4}));
    steps = register_buffer("steps", kiln::zeros({}, DType::Int64));
    first = register_module("first", std::make_shared<nn::Linear>(4, 4));
    second = register_module("second", std::make_shared<nn::Linear>(4, 4, false));
  }
  Tensor forward(const Tensor& x) override {
    return second->forward(kiln::relu(first->forward(x))) * scale;
  }
  Tensor scale, steps;
  std::shared_ptr<nn::Linear> first, second;
};

}  // namespace

TEST_CASE("nn module lists parameters and buffers recursively with dotted names", "[nn][module]") {
  auto block = std::make_shared<Block>();
  auto named = block->named_parameters();
  std::vector<std::string> names;
  for (auto& [n, _] : named) names.push_back(n);
  REQUIRE(names ==
          std::vector<std::string>{"scale", "first.weight", "first.bias", "second.weight"});
  REQUIRE(block->parameters().size() == 4);
  REQUIRE(block->parameters(false).size() == 1);
  for (const Tensor& p : block->parameters()) {
    CHECK(p.requires_grad());
    CHECK(p.is_leaf());
  }
  auto buffers = block->named_buffers();
  REQUIRE(buffers.size() == 1);
  CHECK(buffers[0].first == "steps");
  CHECK_FALSE(buffers[0].second.requires_grad());
  CHECK(block->num_parameters() == 4 + 16 + 4 + 16);
  auto modules = block->named_modules();
  REQUIRE(modules.size() == 2);
  CHECK(modules[1].first == "second");

  auto sd = block->state_dict();
  std::vector<std::string> keys;
  for (auto& [k, _] : sd) keys.push_back(k);
  CHECK(keys ==
        std::vector<std::string>{"first.bias", "first.weight", "scale", "second.weight", "steps"});
}

TEST_CASE("nn parameters returned by parameters() share handles with the module", "[nn][module]") {
  kiln::manual_seed(3);
  auto lin = std::make_shared<nn::Linear>(3, 2);
  std::vector<Tensor> params = lin->parameters();
  Tensor x = make({1, 2, 3}, {1, 3});
  Tensor loss = kiln::sum(lin->forward(x));
  loss.backward();
  // The gradient reached the module's own weight, seen through the copy as well.
  REQUIRE(params[0].grad().defined());
  REQUIRE(lin->weight.grad().defined());
  NN_REQUIRE_CLOSE(values(lin->weight.grad()), (std::vector<double>{1, 2, 3, 1, 2, 3}), 1e-6, 0);
  // An optimizer-style update through the copy is what the module uses next.
  std::vector<double> before = values(lin->weight);
  sgd_step(params, 0.5);
  CHECK_FALSE(lin->weight.grad().defined());
  std::vector<double> after = values(lin->weight);
  for (size_t i = 0; i < after.size(); ++i)
    CHECK(after[i] == Approx(before[i] - 0.5 * (1.0 + i % 3)));
  loss = kiln::sum(lin->forward(x));
  loss.backward();
  REQUIRE(params[1].grad().defined());
  lin->zero_grad();
  CHECK_FALSE(params[1].grad().defined());
}

TEST_CASE("nn train and eval propagate to submodules", "[nn][module]") {
  auto net = small_convnet();
  CHECK(net->is_training());
  net->eval();
  for (auto& [_, m] : net->named_modules()) CHECK_FALSE(m->is_training());
  net->train();
  for (auto& [_, m] : net->named_modules()) CHECK(m->is_training());
}

TEST_CASE("nn state_dict round trip is bit exact and loads independent copies",
          "[nn][module][state_dict]") {
  kiln::manual_seed(11);
  auto src = small_convnet();
  // Run one training forward so that batch norm buffers hold non-trivial values.
  src->forward(kiln::randn({4, 1, 4, 4})).eval();
  kiln::manual_seed(12);
  auto dst = small_convnet();
  auto sd = src->state_dict();
  std::vector<std::string> keys;
  for (auto& [k, _] : sd) keys.push_back(k);
  REQUIRE(keys == std::vector<std::string>{"0.bias", "0.weight", "1.bias", "1.num_batches_tracked",
                                           "1.running_mean", "1.running_var", "1.weight", "4.bias",
                                           "4.weight"});
  CHECK_FALSE(bit_equal(sd.at("0.weight"), dst->state_dict().at("0.weight")));
  dst->load_state_dict(sd);
  auto loaded = dst->state_dict();
  for (auto& [k, t] : sd) {
    INFO(k);
    CHECK(bit_equal(t, loaded.at(k)));
  }
  CHECK(loaded.at("1.num_batches_tracked").item<int64_t>() == 1);
  // Loaded parameters are still trainable leaves, and independent of the source dict.
  CHECK(dst->parameters()[0].requires_grad());
  CHECK(dst->parameters()[0].is_leaf());
  CHECK_FALSE(sd.at("0.weight").node() == loaded.at("0.weight").node());
  Tensor w = src->state_dict().at("0.weight");
  w.assign(kiln::zeros_like(w));
  CHECK(values(dst->state_dict().at("0.weight")) != values(w));
  // Identical state gives identical eval outputs.
  src->eval();
  dst->eval();
  dst->load_state_dict(src->state_dict());
  Tensor x = kiln::randn({2, 1, 4, 4});
  CHECK(values(src->forward(x)) == values(dst->forward(x)));
}

TEST_CASE("nn load_state_dict reports missing, unexpected and mismatched keys together",
          "[nn][module][state_dict][errors]") {
  auto net = small_convnet();
  auto sd = net->state_dict();
  sd.erase("4.bias");
  sd.erase("1.running_var");
  sd["4.extra"] = kiln::zeros({1});
  sd["0.weight"] = kiln::zeros({2, 1, 5, 5});
  try {
    net->load_state_dict(sd);
    FAIL("load_state_dict accepted a bad state_dict");
  } catch (const kiln::ShapeError& e) {
    std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("missing keys: \"1.running_var\", \"4.bias\""));
    CHECK_THAT(msg, Catch::Contains("unexpected keys: \"4.extra\""));
    CHECK_THAT(msg, Catch::Contains(
                        "\"0.weight\": expected float32[2, 1, 3, 3], got float32[2, 1, 5, 5]"));
  }
  // Nothing was loaded by the failed call.
  CHECK(net->state_dict().at("0.weight").shape() == Shape{2, 1, 3, 3});

  auto only_keys = net->state_dict();
  only_keys.erase("4.bias");
  REQUIRE_THROWS_AS(net->load_state_dict(only_keys), kiln::ValueError);
  REQUIRE_THROWS_WITH(net->load_state_dict(only_keys), Catch::Contains("missing keys: \"4.bias\""));
  // Non-strict loading ignores missing and unexpected keys but still loads the rest.
  only_keys["something.else"] = kiln::ones({2});
  only_keys["4.weight"] = kiln::full({3, 32}, 0.25);
  net->load_state_dict(only_keys, false);
  CHECK(values(net->state_dict().at("4.weight")) == std::vector<double>(96, 0.25));
  // Shape mismatches fail even when not strict; a dtype mismatch is a DTypeError.
  auto bad_dtype = net->state_dict();
  bad_dtype["4.weight"] = kiln::zeros({3, 32}, DType::Float64);
  REQUIRE_THROWS_AS(net->load_state_dict(bad_dtype, false), kiln::DTypeError);
  REQUIRE_THROWS_WITH(net->load_state_dict(bad_dtype, false),
                      Catch::Contains("\"4.weight\": expected float32[3, 32], got float64[3, 32]"));
}

TEST_CASE("nn module to(dtype) casts floating parameters and buffers only", "[nn][module]") {
  kiln::manual_seed(5);
  auto net = small_convnet();
  std::vector<Tensor> params = net->parameters();
  std::vector<double> before = values(params[0]);
  net->to(DType::Float64);
  for (auto& [name, t] : net->state_dict()) {
    INFO(name);
    CHECK(t.dtype() == (name == "1.num_batches_tracked" ? DType::Int64 : DType::Float64));
  }
  // Handles held elsewhere (an optimizer's list) see the cast, values unchanged.
  CHECK(params[0].dtype() == DType::Float64);
  CHECK(params[0].requires_grad());
  CHECK(values(params[0]) == before);
  Tensor y = net->forward(kiln::randn({2, 1, 4, 4}, DType::Float64));
  CHECK(y.dtype() == DType::Float64);
  CHECK(y.shape() == Shape{2, 3});
  REQUIRE_THROWS_AS(net->forward(kiln::randn({2, 1, 4, 4})), kiln::DTypeError);
}

TEST_CASE("nn module registration rejects bad and duplicate names", "[nn][module][errors]") {
  nn::Sequential seq;
  seq.push_back(std::make_shared<nn::ReLU>());
  REQUIRE_THROWS_AS(seq.push_back("0", std::make_shared<nn::Tanh>()), kiln::ValueError);
  REQUIRE_THROWS_WITH(seq.push_back("0", std::make_shared<nn::Tanh>()),
                      Catch::Contains("already used"));
  REQUIRE_THROWS_WITH(seq.push_back("a.b", std::make_shared<nn::Tanh>()),
                      Catch::Contains("without '.'"));
  REQUIRE_THROWS_AS(seq.register_parameter("w", Tensor()), kiln::ValueError);
  REQUIRE_THROWS_AS(seq[3], kiln::IndexError);
  REQUIRE_THROWS_WITH(seq.at<nn::Linear>(0), Catch::Contains("is a ReLU"));
}

TEST_CASE("nn Sequential chains modules and functions and prints like PyTorch", "[nn][module]") {
  kiln::manual_seed(2);
  auto seq =
      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
          std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::ReLU>()});
  seq->push_back([](const Tensor& x) { return x * 2.0; });
  seq->push_back("head", std::make_shared<nn::Linear>(4, 1, false));
  REQUIRE(seq->size() == 4);
  auto first = seq->at<nn::Linear>(0);
  auto head = seq->at<nn::Linear>(3);
  Tensor x = kiln::randn({5, 3});
  Tensor want =
      kiln::linear(kiln::relu(kiln::linear(x, first->weight, first->bias)) * 2.0, head->weight);
  NN_REQUIRE_CLOSE(values((*seq)(x)), values(want), 1e-6, 1e-6);
  auto names = seq->named_parameters();
  REQUIRE(names.size() == 3);
  CHECK(names[2].first == "head.weight");
  std::ostringstream os;
  os << *seq;
  CHECK(os.str() ==
        "Sequential(\n  (0): Linear(in_features=3, out_features=4, bias=true)\n  (1): ReLU()\n"
        "  (2): Functional()\n  (head): Linear(in_features=4, out_features=1, bias=false)\n)");
}

TEST_CASE("nn default initialisation follows PyTorch and is reproducible under manual_seed",
          "[nn][init]") {
  kiln::manual_seed(42);
  nn::Linear a(50, 40);
  nn::Conv2d conv(16, 32, 3, 1, 0, 1, 2);
  kiln::manual_seed(42);
  nn::Linear b(50, 40);
  CHECK(values(a.weight) == values(b.weight));
  CHECK(values(a.bias) == values(b.bias));
  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)): bounds hold and the spread is that of a uniform.
  auto check_uniform = [](const std::vector<double>& v, double bound) {
    double lo = 1e9, hi = -1e9, sq = 0;
    for (double x : v) lo = std::min(lo, x), hi = std::max(hi, x), sq += x * x;
    CHECK(lo >= -bound);
    CHECK(hi <= bound);
    CHECK(hi > 0.9 * bound);
    CHECK(std::sqrt(sq / static_cast<double>(v.size())) ==
          Approx(bound / std::sqrt(3.0)).epsilon(0.05));
  };
  check_uniform(values(a.weight), 1 / std::sqrt(50.0));
  check_uniform(values(conv.weight), 1 / std::sqrt(8 * 9.0));
  CHECK(conv.weight.shape() == Shape{32, 8, 3, 3});

  nn::Embedding emb(200, 16, 3);
  std::vector<double> e = values(emb.weight);
  double sq = 0;
  for (double x : e) sq += x * x;
  CHECK(std::sqrt(sq / static_cast<double>(e.size())) == Approx(1.0).epsilon(0.05));
  for (int j = 0; j < 16; ++j) CHECK(e[static_cast<size_t>(3 * 16 + j)] == 0.0);

  nn::MultiheadAttention mha(8, 2);
  check_uniform(values(mha.in_proj_weight), std::sqrt(6.0 / (8 + 24)));
  CHECK(values(mha.in_proj_bias) == std::vector<double>(24, 0.0));
  CHECK(values(mha.out_proj->bias) == std::vector<double>(8, 0.0));
  nn::LSTM lstm(3, 25);
  check_uniform(values(lstm.layers()[0].w_hh), 1 / 5.0);

  // init functions: fan computation and in-place forms keep shape, dtype and handle.
  CHECK(nn::init::fan_in_and_fan_out({6, 2, 3, 3}) == std::pair<int64_t, int64_t>{18, 54});
  Tensor t = kiln::zeros({30, 20}, DType::Float64);
  Tensor copy = t;
  nn::init::kaiming_uniform_(t, 0.0, nn::init::FanMode::FanIn, nn::init::Nonlinearity::ReLU);
  check_uniform(values(copy), std::sqrt(2.0) * std::sqrt(3.0 / 20));
  CHECK(copy.dtype() == DType::Float64);
  nn::init::constant_(copy, 0.5);
  CHECK(values(t) == std::vector<double>(600, 0.5));
}
