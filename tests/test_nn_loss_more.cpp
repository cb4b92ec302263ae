// kl_div, huber_loss and binary_cross_entropy (functions and modules) against float64
// values computed here from PyTorch's definitions, over several shapes and every reduction;
// their gradients against central differences; and the errors a user meets. PyTorch itself
// is compared in test_trainapi_parity.cpp.
#include "test_nn_support.h"

using namespace nn_test;
namespace nn = kiln::nn;
using nn::KLDivReduction;
using nn::Reduction;

namespace {

double total(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// The loss as the reduction would give it, from float64 per-element values.
double reduced(const std::vector<double>& each, Reduction r) {
  return r == Reduction::Sum ? total(each) : total(each) / static_cast<double>(each.size());
}

// Values rounded to float32, so that the float32 kernels and the float64 reference see the
// same inputs.
std::vector<double> as_float(std::vector<double> v) {
  for (double& x : v) x = static_cast<float>(x);
  return v;
}

std::vector<Shape> loss_shapes() { return {{7}, {4, 5}, {2, 3, 4}}; }

}  // namespace

TEST_CASE("nn kl_div matches PyTorch's definition for every reduction and log_target",
          "[nn][loss]") {
  for (const Shape& shape : loss_shapes()) {
    const int64_t n = kiln::numel(shape);
    INFO("shape " << kiln::shape_str(shape));
    // Log-probabilities as input; a target with exact zeros (0 log 0 = 0, no NaN).
    std::vector<double> input = as_float(random_values(n, 11));
    for (double& v : input) v = static_cast<float>(v * 2 - 1.5);
    std::vector<double> target = as_float(random_values(n, 12));
    for (size_t i = 0; i < target.size(); ++i) target[i] = i % 3 == 0 ? 0.0 : std::fabs(target[i]);
    std::vector<double> plain, logged;
    for (size_t i = 0; i < input.size(); ++i) {
      const double t = target[i];
      plain.push_back(t == 0 ? 0.0 : t * (std::log(t) - input[i]));
      // With log_target the same numbers are read as log-probabilities.
      logged.push_back(std::exp(t) * (t - input[i]));
    }
    Tensor x = make(input, shape), y = make(target, shape);
    for (bool log_target : {false, true}) {
      const std::vector<double>& each = log_target ? logged : plain;
      INFO("log_target " << log_target);
      NN_REQUIRE_CLOSE(
          values(nn::kl_div(x, y, {.reduction = KLDivReduction::None, .log_target = log_target})),
          each, 1e-6, 1e-5);
      CHECK(nn::kl_div(x, y, {.reduction = KLDivReduction::Sum, .log_target = log_target})
                .item<double>() == Approx(total(each)).epsilon(1e-5));
      CHECK(nn::kl_div(x, y, {.log_target = log_target}).item<double>() ==
            Approx(total(each) / static_cast<double>(n)).epsilon(1e-5));
      CHECK(nn::kl_div(x, y, {.reduction = KLDivReduction::BatchMean, .log_target = log_target})
                .item<double>() ==
            Approx(total(each) / static_cast<double>(shape[0])).epsilon(1e-5));
    }
  }
  // A rank-0 input is a batch of one for batchmean.
  Tensor x0 = kiln::tensor(-0.5f), y0 = kiln::tensor(0.25f);
  CHECK(nn::kl_div(x0, y0, {.reduction = KLDivReduction::BatchMean}).item<double>() ==
        Approx(0.25 * (std::log(0.25) + 0.5)).epsilon(1e-6));
}

TEST_CASE("nn huber_loss is quadratic inside delta and linear outside", "[nn][loss]") {
  for (const Shape& shape : loss_shapes()) {
    const int64_t n = kiln::numel(shape);
    std::vector<double> a = as_float(random_values(n, 21)), b = as_float(random_values(n, 22));
    for (double& v : a) v = static_cast<float>(v * 3);
    Tensor ta = make(a, shape), tb = make(b, shape);
    for (double delta : {0.5, 1.0, 2.5}) {
      INFO("shape " << kiln::shape_str(shape) << " delta " << delta);
      std::vector<double> each;
      for (size_t i = 0; i < a.size(); ++i) {
        const double d = std::fabs(a[i] - b[i]);
        each.push_back(d < delta ? 0.5 * d * d : delta * (d - 0.5 * delta));
      }
      NN_REQUIRE_CLOSE(values(nn::huber_loss(ta, tb, Reduction::None, delta)), each, 1e-6, 1e-5);
      for (Reduction r : {Reduction::Mean, Reduction::Sum}) {
        CHECK(nn::huber_loss(ta, tb, r, delta).item<double>() ==
              Approx(reduced(each, r)).epsilon(1e-5));
      }
    }
  }
  // With delta 1 Huber and smooth L1 coincide (PyTorch documents the identity).
  Tensor a = make(random_values(12, 23), {3, 4}), b = make(random_values(12, 24), {3, 4});
  CHECK(nn::huber_loss(a * 2.0, b).item<double>() ==
        Approx(nn::smooth_l1_loss(a * 2.0, b).item<double>()).epsilon(1e-6));
}

TEST_CASE("nn binary_cross_entropy clamps its logs at -100 and broadcasts the weight",
          "[nn][loss]") {
  // Probabilities including exact 0 and 1: PyTorch's clamp keeps those terms at 100.
  std::vector<double> x = {0.0, 1.0, 0.0, 1.0, 0.25, 0.5, 0.875, 1e-3, 0.999, 0.3, 0.6, 0.125};
  std::vector<double> y = {0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.3, 1.0, 0.0, 0.5, 1.0, 0.0};
  x = as_float(x);
  y = as_float(y);
  std::vector<double> w = {0.5, 2.0, 1.0};  // one per column of [4, 3]
  auto clamped_log = [](double v) { return std::max(std::log(v), -100.0); };
  std::vector<double> plain, weighted;
  for (size_t i = 0; i < x.size(); ++i) {
    const double l = -(y[i] * clamped_log(x[i]) + (1 - y[i]) * clamped_log(1 - x[i]));
    plain.push_back(l);
    weighted.push_back(l * w[i % 3]);
  }
  CHECK(plain[2] == Approx(100.0));
  CHECK(plain[0] == 0.0);
  Tensor tx = make(x, {4, 3}), ty = make(y, {4, 3}), tw = make(w, {3});
  NN_REQUIRE_CLOSE(values(nn::binary_cross_entropy(tx, ty, {.reduction = Reduction::None})), plain,
                   1e-6, 1e-5);
  for (Reduction r : {Reduction::Mean, Reduction::Sum}) {
    CHECK(nn::binary_cross_entropy(tx, ty, {.reduction = r}).item<double>() ==
          Approx(reduced(plain, r)).epsilon(1e-5));
    CHECK(nn::binary_cross_entropy(tx, ty, {.reduction = r, .weight = tw}).item<double>() ==
          Approx(reduced(weighted, r)).epsilon(1e-5));
  }
  // The gradient is PyTorch's (x - y) / max(x (1 - x), 1e-12) / numel: finite at an exact 0
  // or 1 (no 0 * inf), and large there on the wrong side (torch gives +-1e12 / 12 below),
  // so a saturated wrong prediction still learns.
  Tensor leaf = make(x, {4, 3});
  leaf.requires_grad_();
  std::vector<double> g = values(kiln::grad(nn::binary_cross_entropy(leaf, ty), {leaf})[0]);
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("element " << i);
    CHECK(std::isfinite(g[i]));
    CHECK(g[i] == Approx((x[i] - y[i]) / std::max(x[i] * (1 - x[i]), 1e-12) / 12.0)
                      .epsilon(1e-4)
                      .margin(1e-12));
  }
  CHECK(g[2] == Approx(-1e12 / 12).epsilon(1e-6));
  CHECK(g[3] == Approx(1e12 / 12).epsilon(1e-6));
  // The target's gradient stays log(1 - x) - log(x) with the logs clamped.
  Tensor target_leaf = make(y, {4, 3});
  target_leaf.requires_grad_();
  std::vector<double> gy =
      values(kiln::grad(nn::binary_cross_entropy(tx, target_leaf), {target_leaf})[0]);
  for (size_t i = 0; i < x.size(); ++i)
    CHECK(gy[i] == Approx((clamped_log(1 - x[i]) - clamped_log(x[i])) / 12.0).epsilon(1e-4));
  // Probabilities outside [0, 1] give NaN, not a silent number.
  CHECK(std::isnan(nn::binary_cross_entropy(make({1.5}, {1}), make({1.0}, {1})).item<double>()));
}

TEST_CASE("nn gradient check of kl_div, huber_loss and binary_cross_entropy", "[nn][grad][loss]") {
  auto leaf = [](std::vector<double> v, const Shape& shape) {
    Tensor t = make(v, shape, DType::Float64);
    t.requires_grad_();
    return t;
  };
  Tensor logp = leaf(random_values(12, 41), {3, 4});
  std::vector<double> p = random_values(12, 42);
  for (double& v : p) v = std::fabs(v) + 0.05;
  Tensor target = make(p, {3, 4}, DType::Float64);
  Tensor target_leaf = leaf(p, {3, 4});
  for (KLDivReduction r : {KLDivReduction::Sum, KLDivReduction::Mean, KLDivReduction::BatchMean}) {
    for (bool log_target : {false, true}) {
      INFO("reduction " << static_cast<int>(r) << " log_target " << log_target);
      // Gradients with respect to both arguments, as PyTorch gives.
      REQUIRE(gradient_check(
                  [&] {
                    return nn::kl_div(logp, target_leaf,
                                      {.reduction = r, .log_target = log_target});
                  },
                  {logp, target_leaf}) == "");
    }
  }
  Tensor a = leaf(random_values(15, 43), {5, 3});
  std::vector<double> bv = random_values(15, 44);
  Tensor b = make(bv, {5, 3}, DType::Float64);
  for (double delta : {0.3, 1.0}) {
    INFO("delta " << delta);
    REQUIRE(gradient_check([&] { return nn::huber_loss(a * 2.0, b, Reduction::Sum, delta); },
                           {a}) == "");
  }
  std::vector<double> probs = random_values(15, 45);
  for (double& v : probs) v = 0.1 + 0.8 * std::fabs(v);
  Tensor x = leaf(probs, {5, 3});
  Tensor y = make(as_float(random_values(15, 46)), {5, 3}, DType::Float64);
  y = kiln::abs(y);
  Tensor w = make({0.5, 1.5, 2.0}, {3}, DType::Float64);
  REQUIRE(gradient_check([&] { return nn::binary_cross_entropy(x, y, {.weight = w}); }, {x}) == "");
}

TEST_CASE("nn loss modules equal the functions and print their options", "[nn][loss][module]") {
  Tensor x = make(random_values(12, 51), {3, 4}),
         y = kiln::abs(make(random_values(12, 52), {3, 4}));
  nn::KLDivLoss kl({.reduction = KLDivReduction::BatchMean, .log_target = true});
  CHECK(kl(x, y).item<double>() ==
        nn::kl_div(x, y, {.reduction = KLDivReduction::BatchMean, .log_target = true})
            .item<double>());
  nn::HuberLoss huber(Reduction::Sum, 0.25);
  CHECK(huber(x, y).item<double>() == nn::huber_loss(x, y, Reduction::Sum, 0.25).item<double>());
  Tensor p = kiln::sigmoid(x);
  Tensor w = make({1, 2, 3, 4}, {4});
  nn::BCELoss bce({.weight = w});
  CHECK(bce(p, y).item<double>() == nn::binary_cross_entropy(p, y, {.weight = w}).item<double>());
  // PyTorch's BCELoss keeps its weight as a buffer named "weight".
  CHECK(bce.state_dict().count("weight") == 1);
  bce.to(DType::Float64);
  CHECK(w.dtype() == DType::Float32);
  CHECK(nn::BCELoss().state_dict().empty());
  std::ostringstream os;
  os << kl << " " << huber << " " << bce;
  CHECK(os.str() ==
        "KLDivLoss(reduction=batchmean, log_target=true) HuberLoss(reduction=sum, delta=0.25) "
        "BCELoss(reduction=mean)");
}

TEST_CASE("nn modules of the older losses equal their functions and keep weights as buffers",
          "[nn][loss][module]") {
  Tensor logits = make(random_values(12, 61), {4, 3});
  Tensor y = kiln::from_vector<int64_t>({2, 0, -100, 1}, {4});
  Tensor w = make({0.5, 2.0, 1.0}, {3});
  const nn::CrossEntropyOptions o{.label_smoothing = 0.1, .weight = w};
  nn::CrossEntropyLoss ce(o);
  CHECK(ce(logits, y).item<double>() == nn::cross_entropy(logits, y, o).item<double>());
  CHECK(ce.state_dict().count("weight") == 1);
  nn::NLLLoss nll({.reduction = Reduction::Sum});
  Tensor logp = kiln::log_softmax(logits, 1);
  CHECK(nll(logp, y).item<double>() ==
        nn::nll_loss(logp, y, {.reduction = Reduction::Sum}).item<double>());
  CHECK(nll.state_dict().empty());
  Tensor a = make(random_values(6, 62), {2, 3}), b = make(random_values(6, 63), {2, 3});
  CHECK(nn::MSELoss(Reduction::Sum)(a, b).item<double>() ==
        nn::mse_loss(a, b, Reduction::Sum).item<double>());
  CHECK(nn::L1Loss()(a, b).item<double>() == nn::l1_loss(a, b).item<double>());
  CHECK(nn::SmoothL1Loss(Reduction::Mean, 0.3)(a, b).item<double>() ==
        nn::smooth_l1_loss(a, b, Reduction::Mean, 0.3).item<double>());
  REQUIRE_THROWS_AS(nn::SmoothL1Loss(Reduction::Mean, -1.0), kiln::ValueError);
  Tensor labels = kiln::cast(b > 0, DType::Float32);
  nn::BCEWithLogitsLoss bce({.pos_weight = w});
  CHECK(bce(a, labels).item<double>() ==
        nn::binary_cross_entropy_with_logits(a, labels, {.pos_weight = w}).item<double>());
  CHECK(bce.state_dict().count("pos_weight") == 1);
  CHECK(bce.state_dict().count("weight") == 0);
  // The buffer is what the loss reads: to(float64) carries it along with float64 inputs,
  // and leaves the caller's tensor alone.
  ce.to(DType::Float64);
  CHECK(ce.state_dict().at("weight").dtype() == DType::Float64);
  CHECK(w.dtype() == DType::Float32);
  CHECK(ce(kiln::cast(logits, DType::Float64), y).item<double>() ==
        Approx(nn::cross_entropy(logits, y, o).item<double>()).epsilon(1e-6));
  std::ostringstream os;
  os << ce << " " << nn::MSELoss() << " " << nn::SmoothL1Loss(Reduction::Sum, 0.5);
  CHECK(os.str() ==
        "CrossEntropyLoss(reduction=mean, ignore_index=-100, label_smoothing=0.1) "
        "MSELoss(reduction=mean) SmoothL1Loss(reduction=sum, beta=0.5)");
}

TEST_CASE("nn kl_div, huber_loss and binary_cross_entropy reject bad arguments",
          "[nn][loss][errors]") {
  Tensor x = kiln::randn({4, 3});
  REQUIRE_THROWS_AS(nn::kl_div(x, kiln::randn({4, 1})), kiln::ShapeError);
  REQUIRE_THROWS_WITH(nn::kl_div(x, kiln::randn({3})),
                      Catch::Contains("[kl_div] expected target with the input's shape [4, 3], "
                                      "got float32[3]"));
  REQUIRE_THROWS_AS(nn::kl_div(x, kiln::cast(x, DType::Float64)), kiln::DTypeError);
  REQUIRE_THROWS_AS(nn::kl_div(kiln::ones({4, 3}, DType::Int64), x), kiln::DTypeError);
  REQUIRE_THROWS_AS(nn::huber_loss(x, x, Reduction::Mean, 0.0), kiln::ValueError);
  REQUIRE_THROWS_WITH(nn::huber_loss(x, x, Reduction::Mean, -1.0),
                      Catch::Contains("[huber_loss] delta must be > 0, got -1"));
  REQUIRE_THROWS_AS(nn::huber_loss(x, kiln::randn({4})), kiln::ShapeError);
  REQUIRE_THROWS_AS(nn::HuberLoss(Reduction::Mean, 0.0), kiln::ValueError);
  REQUIRE_THROWS_AS(nn::binary_cross_entropy(x, kiln::randn({3, 4})), kiln::ShapeError);
  REQUIRE_THROWS_WITH(nn::binary_cross_entropy(x, kiln::rand({4, 3}), {.weight = kiln::ones({2})}),
                      Catch::Contains("binary_cross_entropy"));
  REQUIRE_THROWS_AS(
      nn::binary_cross_entropy(x, kiln::rand({4, 3}), {.weight = kiln::ones({3}, DType::Float64)}),
      kiln::DTypeError);
  REQUIRE_THROWS_AS(nn::binary_cross_entropy(x, Tensor()), kiln::ValueError);
}
