// Losses against float64 values computed here from PyTorch's definitions: cross entropy with
// mean/sum/none, ignore_index, label smoothing, class weights, K-dimensional inputs and
// probability targets; nll_loss; mse/l1/smooth_l1; BCE with logits incl. pos_weight and
// extreme logits. Tolerance 1e-5 relative on float32 inputs.
#include "test_nn_support.h"

using namespace nn_test;
namespace nn = kiln::nn;
using nn::CrossEntropyOptions;
using nn::Reduction;

namespace {

// log_softmax of each row of a [rows, classes] matrix.
std::vector<double> log_softmax_rows(const std::vector<double>& x, int64_t rows, int64_t classes) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, z = 0;
    for (int64_t c = 0; c < classes; ++c) m = std::max(m, x[static_cast<size_t>(r * classes + c)]);
    for (int64_t c = 0; c < classes; ++c)
      z += std::exp(x[static_cast<size_t>(r * classes + c)] - m);
    for (int64_t c = 0; c < classes; ++c)
      out[static_cast<size_t>(r * classes + c)] =
          x[static_cast<size_t>(r * classes + c)] - m - std::log(z);
  }
  return out;
}

// PyTorch's cross entropy for [rows, classes] logits and index targets: per-row losses and
// the mean's denominator (summed target weights over non-ignored rows).
struct CeReference {
  std::vector<double> per_row;
  double denominator = 0;
};

CeReference ce_reference(const std::vector<double>& logits, const std::vector<int64_t>& target,
                         int64_t classes, int64_t ignore, double smoothing,
                         const std::vector<double>& weight) {
  auto rows = static_cast<int64_t>(target.size());
  std::vector<double> lp = log_softmax_rows(logits, rows, classes);
  CeReference r;
  for (int64_t i = 0; i < rows; ++i) {
    int64_t t = target[static_cast<size_t>(i)];
    if (t == ignore) {
      r.per_row.push_back(0);
      continue;
    }
    auto w = [&](int64_t c) { return weight.empty() ? 1.0 : weight[static_cast<size_t>(c)]; };
    double nll = -w(t) * lp[static_cast<size_t>(i * classes + t)];
    double smooth = 0;
    for (int64_t c = 0; c < classes; ++c) smooth -= w(c) * lp[static_cast<size_t>(i * classes + c)];
    r.per_row.push_back((1 - smoothing) * nll + smoothing / static_cast<double>(classes) * smooth);
    r.denominator += w(t);
  }
  return r;
}

double total(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

}  // namespace

TEST_CASE("nn cross_entropy reductions, ignore_index, label smoothing and weights", "[nn][loss]") {
  const int64_t rows = 6, classes = 5;
  std::vector<double> logits = random_values(rows * classes, 61);
  for (double& v : logits) v = static_cast<float>(v * 4);
  std::vector<int64_t> target = {3, 0, -100, 4, 1, 3};
  Tensor x = make(logits, {rows, classes});
  Tensor y = kiln::from_vector(target, {rows});
  std::vector<double> weight = {0.5, 2.0, 1.0, 1.5, 0.25};
  Tensor w = make(weight, {classes});
  for (double smoothing : {0.0, 0.1, 0.35}) {
    for (bool weighted : {false, true}) {
      INFO("label_smoothing " << smoothing << " weighted " << weighted);
      CeReference ref = ce_reference(logits, target, classes, -100, smoothing,
                                     weighted ? weight : std::vector<double>{});
      CrossEntropyOptions o{.label_smoothing = smoothing, .weight = weighted ? w : Tensor()};
      o.reduction = Reduction::Mean;
      CHECK(nn::cross_entropy(x, y, o).item<double>() ==
            Approx(total(ref.per_row) / ref.denominator).epsilon(1e-5));
      o.reduction = Reduction::Sum;
      CHECK(nn::cross_entropy(x, y, o).item<double>() == Approx(total(ref.per_row)).epsilon(1e-5));
      o.reduction = Reduction::None;
      Tensor each = nn::cross_entropy(x, y, o);
      REQUIRE(each.shape() == Shape{rows});
      NN_REQUIRE_CLOSE(values(each), ref.per_row, 1e-6, 1e-5);
    }
  }
  // A different ignore_index; every target ignored gives NaN for the mean, 0 for the sum.
  std::vector<int64_t> t2 = {3, 2, 2, 4, 1, 2};
  CeReference ref = ce_reference(logits, t2, classes, 2, 0.0, {});
  CHECK(nn::cross_entropy(x, kiln::from_vector(t2, {rows}), {.ignore_index = 2}).item<double>() ==
        Approx(total(ref.per_row) / 3).epsilon(1e-5));
  Tensor all_ignored = kiln::full({rows}, -100, DType::Int64);
  CHECK(std::isnan(nn::cross_entropy(x, all_ignored).item<double>()));
  CHECK(nn::cross_entropy(x, all_ignored, {.reduction = Reduction::Sum}).item<double>() == 0.0);
  // Int32 targets work too.
  CHECK(nn::cross_entropy(x, kiln::cast(y, DType::Int32)).item<double>() ==
        Approx(nn::cross_entropy(x, y).item<double>()));
}

TEST_CASE("nn cross_entropy over K-dimensional and unbatched inputs and probability targets",
          "[nn][loss]") {
  // [N, C, d] logits with [N, d] targets: class axis 1, as PyTorch.
  const int64_t n = 2, classes = 3, d = 4;
  std::vector<double> logits = random_values(n * classes * d, 62);
  for (double& v : logits) v = static_cast<float>(v * 3);
  std::vector<int64_t> target = {0, 2, 1, 1, 2, -100, 0, 1};
  std::vector<double> rows_major;  // [(n, d), C]
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < d; ++k)
      for (int64_t c = 0; c < classes; ++c)
        rows_major.push_back(logits[static_cast<size_t>((i * classes + c) * d + k)]);
  CeReference ref = ce_reference(rows_major, target, classes, -100, 0.2, {});
  Tensor x = make(logits, {n, classes, d});
  Tensor y = kiln::from_vector(target, {n, d});
  CHECK(nn::cross_entropy(x, y, {.label_smoothing = 0.2}).item<double>() ==
        Approx(total(ref.per_row) / ref.denominator).epsilon(1e-5));
  Tensor each = nn::cross_entropy(x, y, {.reduction = Reduction::None, .label_smoothing = 0.2});
  REQUIRE(each.shape() == Shape{n, d});
  NN_REQUIRE_CLOSE(values(each), ref.per_row, 1e-6, 1e-5);

  // Unbatched: [C] logits and a rank-0 target.
  std::vector<double> one(rows_major.begin(), rows_major.begin() + classes);
  CeReference single = ce_reference(one, {2}, classes, -100, 0.0, {});
  CHECK(nn::cross_entropy(make(one, {classes}), kiln::tensor<int64_t>(2)).item<double>() ==
        Approx(single.per_row[0]).epsilon(1e-5));

  // Probability targets with the input's shape: -sum p log q, mean over rows, smoothing mixes.
  std::vector<double> probs = {0.2, 0.5, 0.3, 1.0, 0.0, 0.0};
  std::vector<double> two(rows_major.begin(), rows_major.begin() + 2 * classes);
  std::vector<double> lp = log_softmax_rows(two, 2, classes);
  double want = 0;
  for (size_t i = 0; i < 6; ++i) want -= (probs[i] * 0.9 + 0.1 / 3) * lp[i];
  CHECK(nn::cross_entropy(make(two, {2, classes}), make(probs, {2, classes}),
                          {.label_smoothing = 0.1})
            .item<double>() == Approx(want / 2).epsilon(1e-5));
}

TEST_CASE("nn nll_loss, mse, l1 and smooth l1 losses", "[nn][loss]") {
  std::vector<double> lp = random_values(12, 63);
  for (double& v : lp) v = static_cast<float>(v - 2);
  std::vector<double> weight = {1.0, 3.0, 0.5};
  Tensor x = make(lp, {4, 3});
  Tensor y = kiln::from_vector<int64_t>({2, 1, 1, 0}, {4});
  double num = -(0.5 * lp[2] + 3 * lp[4] + 3 * lp[7] + 1 * lp[9]);
  CHECK(nn::nll_loss(x, y, {.weight = make(weight, {3})}).item<double>() ==
        Approx(num / 7.5).epsilon(1e-5));
  CHECK(nn::nll_loss(x, y).item<double>() ==
        Approx(-(lp[2] + lp[4] + lp[7] + lp[9]) / 4).epsilon(1e-5));

  std::vector<double> a = random_values(10, 64), b = random_values(10, 65);
  for (double& v : a) v = static_cast<float>(v * 3);
  for (double& v : b) v = static_cast<float>(v);
  Tensor ta = make(a, {2, 5}), tb = make(b, {2, 5});
  double mse = 0, l1 = 0, smooth = 0;
  for (size_t i = 0; i < 10; ++i) {
    double dd = std::fabs(a[i] - b[i]);
    mse += dd * dd;
    l1 += dd;
    smooth += dd < 0.5 ? 0.5 * dd * dd / 0.5 : dd - 0.25;
  }
  CHECK(nn::mse_loss(ta, tb).item<double>() == Approx(mse / 10).epsilon(1e-5));
  CHECK(nn::mse_loss(ta, tb, Reduction::Sum).item<double>() == Approx(mse).epsilon(1e-5));
  CHECK(nn::mse_loss(ta, tb, Reduction::None).shape() == Shape{2, 5});
  CHECK(nn::l1_loss(ta, tb).item<double>() == Approx(l1 / 10).epsilon(1e-5));
  CHECK(nn::smooth_l1_loss(ta, tb, Reduction::Sum, 0.5).item<double>() ==
        Approx(smooth).epsilon(1e-5));
}

TEST_CASE("nn binary_cross_entropy_with_logits is stable and honours pos_weight and weight",
          "[nn][loss]") {
  std::vector<double> x = {-120.0, -3.5, -0.25, 0.0, 0.75, 2.0, 40.0, 120.0};
  std::vector<double> y = {0.0, 1.0, 0.3, 1.0, 0.0, 1.0, 0.0, 1.0};
  std::vector<double> pw = {2.0, 0.5};
  std::vector<double> w = {1.0, 0.0, 2.0, 1.0, 0.5, 1.0, 1.0, 3.0};
  // log(sigmoid) in float64, exact enough for |x| <= 120 via log1p.
  auto log_sigmoid = [](double v) {
    return v >= 0 ? -std::log1p(std::exp(-v)) : v - std::log1p(std::exp(v));
  };
  std::vector<double> plain, weighted;
  for (size_t i = 0; i < 8; ++i) {
    double p = pw[i % 2];
    plain.push_back(-(y[i] * log_sigmoid(x[i]) + (1 - y[i]) * log_sigmoid(-x[i])));
    weighted.push_back(-w[i] * (p * y[i] * log_sigmoid(x[i]) + (1 - y[i]) * log_sigmoid(-x[i])));
  }
  Tensor tx = make(x, {4, 2}), ty = make(y, {4, 2});
  Tensor each = nn::binary_cross_entropy_with_logits(tx, ty, {.reduction = Reduction::None});
  NN_REQUIRE_CLOSE(values(each), plain, 1e-6, 1e-5);
  double want = total(weighted) / 8;
  CHECK(nn::binary_cross_entropy_with_logits(
            tx, ty, {.weight = make(w, {4, 2}), .pos_weight = make(pw, {2})})
            .item<double>() == Approx(want).epsilon(1e-5));
}

TEST_CASE("nn losses reject bad targets", "[nn][loss][errors]") {
  Tensor x = kiln::randn({4, 3});
  Tensor y = kiln::from_vector<int64_t>({0, 1, 2, 1}, {4});
  REQUIRE_THROWS_AS(nn::cross_entropy(x, kiln::from_vector<int64_t>({0, 1, 2}, {3})),
                    kiln::ShapeError);
  REQUIRE_THROWS_WITH(
      nn::cross_entropy(x, kiln::from_vector<int64_t>({0, 1, 2}, {3})),
      Catch::Contains(
          "expected class-index targets of shape [4] for input float32[4, 3], got int64[3]"));
  REQUIRE_THROWS_AS(nn::cross_entropy(x, kiln::randn({4})), kiln::DTypeError);
  REQUIRE_THROWS_WITH(nn::cross_entropy(x, kiln::randn({4})),
                      Catch::Contains("expected integer class indices"));
  REQUIRE_THROWS_AS(nn::cross_entropy(x, y, {.label_smoothing = 1.5}), kiln::ValueError);
  REQUIRE_THROWS_AS(nn::cross_entropy(x, y, {.weight = kiln::ones({4})}), kiln::ShapeError);
  // A class index out of range is found when the loss is evaluated.
  Tensor bad = nn::cross_entropy(x, kiln::from_vector<int64_t>({0, 3, 2, 1}, {4}));
  REQUIRE_THROWS_AS(bad.eval(), kiln::IndexError);
  REQUIRE_THROWS_AS(nn::mse_loss(x, kiln::randn({4, 1})), kiln::ShapeError);
  REQUIRE_THROWS_WITH(
      nn::mse_loss(kiln::randn({4}), kiln::randn({4, 1})),
      Catch::Contains("expected target with the input's shape [4], got float32[4, 1]"));
  REQUIRE_THROWS_AS(
      nn::binary_cross_entropy_with_logits(x, kiln::randn({4, 3}), {.pos_weight = kiln::ones({4})}),
      kiln::ShapeError);
  REQUIRE_THROWS_AS(nn::nll_loss(x, kiln::cast(y, DType::Float32)), kiln::DTypeError);
}
