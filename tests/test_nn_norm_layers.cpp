// GroupNorm and InstanceNorm2d (modules and functionals): forward values against float64
// loops written from PyTorch's definitions, running statistics against the update written
// out, gradients against central differences, errors, and PyTorch parity (outputs,
// gradients, running statistics) where torch is importable.
#include "test_nn_support.h"
#include "torch_parity.h"

using namespace nn_test;
using Catch::Contains;
namespace nn = kiln::nn;
namespace F = kiln::nn::F;

namespace {


Tensor f64(const Matrix& v, const Shape& s) { return make(v, s, DType::Float64); }

// Normalises each of `blocks` consecutive runs of `size` values (biased variance).
Matrix normalise_blocks(const Matrix& x, int64_t blocks, int64_t size, double eps) {
  Matrix y(x.size());
  for (int64_t b = 0; b < blocks; ++b) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < size; ++i) m += x[static_cast<size_t>(b * size + i)] / size;
    for (int64_t i = 0; i < size; ++i) {
      double d = x[static_cast<size_t>(b * size + i)] - m;
      v += d * d / size;
    }
    for (int64_t i = 0; i < size; ++i)
      y[static_cast<size_t>(b * size + i)] =
          (x[static_cast<size_t>(b * size + i)] - m) / std::sqrt(v + eps);
  }
  return y;
}

// y * w[c] + b[c] over [N, C, positions].
Matrix affine_channels(Matrix y, int64_t n, int64_t c, int64_t positions, const Matrix& w,
                       const Matrix& b) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < positions; ++p) {
        double& v = y[static_cast<size_t>((i * c + ch) * positions + p)];
        v = v * w[static_cast<size_t>(ch)] + b[static_cast<size_t>(ch)];
      }
  return y;
}

}  // namespace

TEST_CASE("nn group_norm matches the definition over shapes and group counts", "[nn][norm]") {
  for (auto [shape, groups] : {std::pair<Shape, int64_t>{{2, 6, 4, 3}, 3},
                               {{3, 4, 5}, 2},
                               {{2, 6}, 6},
                               {{1, 8, 2, 2, 2}, 1}}) {
    INFO("input " << kiln::shape_str(shape) << " groups " << groups);
    const int64_t n = shape[0], c = shape[1], positions = kiln::numel(shape) / (n * c);
    Matrix x = random_values(kiln::numel(shape), 1), w = random_values(c, 2),
           b = random_values(c, 3);
    for (double& v : x) v = 3 * v + 1;  // not already centred
    Matrix want = affine_channels(normalise_blocks(x, n * groups, c / groups * positions, 1e-5), n,
                                  c, positions, w, b);
    NN_REQUIRE_CLOSE(values(F::group_norm(f64(x, shape), groups, f64(w, {c}), f64(b, {c}))), want,
                     1e-12, 1e-10);
    nn::GroupNorm gn(groups, c, 1e-3);
    gn.to(DType::Float64);
    NN_REQUIRE_CLOSE(values(gn.forward(f64(x, shape))),
                     normalise_blocks(x, n * groups, c / groups * positions, 1e-3), 1e-12, 1e-10);
  }
  // PyTorch's parameters: weight (ones) and bias (zeros) [C]; none without affine.
  nn::GroupNorm gn(2, 4);
  CHECK(values(gn.weight) == Matrix(4, 1.0));
  CHECK(values(gn.bias) == Matrix(4, 0.0));
  CHECK(nn::GroupNorm(2, 4, 1e-5, false).parameters().empty());
  std::ostringstream repr;
  repr << gn;
  CHECK(repr.str() == "GroupNorm(2, 4, eps=1e-05, affine=true)");
}

TEST_CASE("nn InstanceNorm2d normalises each sample's channels and tracks statistics as PyTorch",
          "[nn][norm]") {
  const int64_t n = 3, c = 2, h = 3, w = 4;
  Matrix x = random_values(n * c * h * w, 4);
  for (double& v : x) v = 2 * v - 0.5;
  Matrix want = normalise_blocks(x, n * c, h * w, 1e-5);
  SECTION("default: no parameters, no buffers, the same in eval mode, unbatched input") {
    nn::InstanceNorm2d in(c);
    in.to(DType::Float64);
    CHECK(in.parameters().empty());
    CHECK(in.buffers().empty());
    NN_REQUIRE_CLOSE(values(in.forward(f64(x, {n, c, h, w}))), want, 1e-12, 1e-10);
    in.eval();
    NN_REQUIRE_CLOSE(values(in.forward(f64(x, {n, c, h, w}))), want, 1e-12, 1e-10);
    Matrix first(x.begin(), x.begin() + c * h * w);
    Tensor single = in.forward(f64(first, {c, h, w}));
    REQUIRE(single.shape() == Shape{c, h, w});
    NN_REQUIRE_CLOSE(values(single), Matrix(want.begin(), want.begin() + c * h * w), 1e-12, 1e-10);
    // As PyTorch, a channel count other than num_features is accepted when nothing is per
    // channel.
    REQUIRE(in.forward(f64(x, {n * c, 1, h, w})).shape() == Shape{n * c, 1, h, w});
  }
  SECTION("affine and running statistics") {
    nn::InstanceNorm2d in(c, 1e-5, 0.3, true, true);
    in.to(DType::Float64);
    nn::init::uniform_(in.weight, 0.5, 1.5);
    nn::init::uniform_(in.bias, -1, 1);
    Matrix wt = values(in.weight), bs = values(in.bias);
    NN_REQUIRE_CLOSE(values(in.forward(f64(x, {n, c, h, w}))),
                     affine_channels(want, n, c, h * w, wt, bs), 1e-12, 1e-10);
    // running = 0.7 running + 0.3 (batch mean of the instance means / unbiased variances).
    Matrix rm(c, 0.0), rv(c, 1.0);
    for (int64_t ch = 0; ch < c; ++ch) {
      double means = 0, vars = 0;
      for (int64_t i = 0; i < n; ++i) {
        double m = 0, v = 0;
        for (int64_t p = 0; p < h * w; ++p) m += x[static_cast<size_t>((i * c + ch) * h * w + p)];
        m /= h * w;
        for (int64_t p = 0; p < h * w; ++p) {
          double d = x[static_cast<size_t>((i * c + ch) * h * w + p)] - m;
          v += d * d;
        }
        means += m / n;
        vars += v / (h * w - 1) / n;
      }
      rm[static_cast<size_t>(ch)] = 0.3 * means;
      rv[static_cast<size_t>(ch)] = 0.7 + 0.3 * vars;
    }
    NN_REQUIRE_CLOSE(values(in.running_mean), rm, 1e-12, 1e-10);
    NN_REQUIRE_CLOSE(values(in.running_var), rv, 1e-12, 1e-10);
    CHECK(in.num_batches_tracked.item<int64_t>() == 0);  // as PyTorch: never counts
    // Eval mode normalises by the running statistics and leaves them alone.
    in.eval();
    Matrix by_running(x.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t p = 0; p < h * w; ++p) {
          size_t at = static_cast<size_t>((i * c + ch) * h * w + p);
          by_running[at] = (x[at] - rm[static_cast<size_t>(ch)]) /
                               std::sqrt(rv[static_cast<size_t>(ch)] + 1e-5) *
                               wt[static_cast<size_t>(ch)] +
                           bs[static_cast<size_t>(ch)];
        }
    NN_REQUIRE_CLOSE(values(in.forward(f64(x, {n, c, h, w}))), by_running, 1e-12, 1e-10);
    NN_REQUIRE_CLOSE(values(in.running_mean), rm, 1e-12, 1e-10);
    CHECK(in.num_batches_tracked.item<int64_t>() == 0);  // as PyTorch: never counts
    std::vector<std::string> names;
    for (auto& [name, _] : in.state_dict()) names.push_back(name);
    CHECK(names == std::vector<std::string>{"bias", "num_batches_tracked", "running_mean",
                                            "running_var", "weight"});
  }
}

TEST_CASE("nn gradient check of GroupNorm and InstanceNorm2d", "[nn][grad][norm]") {
  kiln::manual_seed(91);
  auto leaf = [](const Shape& s, uint64_t seed) {
    Tensor t = f64(random_values(kiln::numel(s), seed), s);
    t.requires_grad_();
    return t;
  };
  auto project = [](const Tensor& y, uint64_t seed) {
    return kiln::sum(y * f64(random_values(y.numel(), seed), y.shape()));
  };
  nn::GroupNorm gn(2, 4);
  gn.to(DType::Float64);
  nn::init::uniform_(gn.weight, 0.5, 1.5);
  nn::init::uniform_(gn.bias, -1, 1);
  Tensor x = leaf({2, 4, 3, 2}, 1);
  std::vector<Tensor> params = gn.parameters();
  params.push_back(x);
  REQUIRE(gradient_check([&] { return project(gn.forward(x), 2); }, params) == "");
  nn::InstanceNorm2d in(4, 1e-5, 0.1, true, true);
  in.to(DType::Float64);
  nn::init::uniform_(in.weight, 0.5, 1.5);
  params = in.parameters();
  params.push_back(x);
  REQUIRE(gradient_check([&] { return project(in.forward(x), 3); }, params) == "");
}

TEST_CASE("nn GroupNorm and InstanceNorm2d reject bad settings and inputs", "[nn][errors][norm]") {
  REQUIRE_THROWS_AS(nn::GroupNorm(3, 4), kiln::ValueError);
  REQUIRE_THROWS_WITH(nn::GroupNorm(3, 4),
                      Contains("[GroupNorm] num_channels 4 must be divisible by num_groups 3"));
  REQUIRE_THROWS_WITH(nn::GroupNorm(0, 4), Contains("[GroupNorm] num_groups must be >= 1, got 0"));
  nn::GroupNorm gn(2, 4);
  REQUIRE_THROWS_AS(gn.forward(kiln::zeros({2, 6, 3})), kiln::ShapeError);
  REQUIRE_THROWS_WITH(gn.forward(kiln::zeros({2, 6, 3})),
                      Contains("[GroupNorm] expected input [N, 4, *] (num_channels 4), got "
                               "float32[2, 6, 3]"));
  REQUIRE_THROWS_AS(gn.forward(kiln::zeros({2, 4}, DType::Float64)), kiln::DTypeError);
  REQUIRE_THROWS_AS(gn.forward(kiln::zeros({2, 4}, DType::Int32)), kiln::DTypeError);
  REQUIRE_THROWS_WITH(F::group_norm(kiln::zeros({2, 6, 3}), 4),
                      Contains("[group_norm] expected the channels of input float32[2, 6, 3] to "
                               "be divisible by num_groups 4"));
  REQUIRE_THROWS_WITH(F::group_norm(kiln::zeros({2, 6, 3}), 3, kiln::ones({4})),
                      Contains("[group_norm] expected affine parameters and statistics of shape "
                               "[6] for input float32[2, 6, 3], got float32[4]"));
  REQUIRE_THROWS_WITH(nn::InstanceNorm2d(4, 1e-5, 1.5),
                      Contains("[InstanceNorm2d] momentum must be in [0, 1], got 1.5"));
  nn::InstanceNorm2d affine(4, 1e-5, 0.1, true);
  REQUIRE_THROWS_WITH(affine.forward(kiln::zeros({2, 3, 5, 5})),
                      Contains("[InstanceNorm2d] expected input with 4 channels (num_features) "
                               "in dimension 1, got float32[2, 3, 5, 5]"));
  REQUIRE_THROWS_WITH(affine.forward(kiln::zeros({4, 5})),
                      Contains("[InstanceNorm2d] expected a 4-D input [N, C, H, W] or 3-D [C, H, "
                               "W], got float32[4, 5]"));
  REQUIRE_THROWS_AS(affine.forward(kiln::zeros({2, 4, 1, 1})), kiln::ValueError);
  REQUIRE_THROWS_WITH(F::instance_norm(kiln::zeros({2, 4})),
                      Contains("[instance_norm] expected an input [N, C, *] with at least one "
                               "position dimension, got float32[2, 4]"));
  REQUIRE_THROWS_WITH(
      F::instance_norm(kiln::zeros({2, 4, 3}), Tensor(), Tensor(), Tensor(), Tensor(), false),
      Contains("[instance_norm] without input statistics it needs running_mean"));
}

TEST_CASE("nn GroupNorm and InstanceNorm2d match PyTorch outputs, gradients and statistics",
          "[nn][norm][torch]") {
  kiln::manual_seed(92);
  std::vector<std::shared_ptr<nn::Module>> keep;
  std::vector<TorchCase> cases;
  auto add = [&](std::shared_ptr<nn::UnaryModule> m, const std::string& module, bool train,
                 const Shape& shape) {
    m->to(DType::Float64);
    // Parameters away from their ones/zeros start, so a swapped weight and bias shows.
    for (Tensor p : m->parameters()) nn::init::uniform_(p, 0.5, 1.5);
    keep.push_back(m);
    TorchCase tc;
    tc.label = module + (train ? " train" : " eval");
    tc.module = module;
    tc.layer = m.get();
    tc.train = train;
    tc.call = "m(x[0])";
    Matrix x = random_values(kiln::numel(shape), cases.size() + 1);
    for (double& v : x) v = 2 * v + 0.3;
    tc.inputs = {f64(x, shape)};
    nn::UnaryModule* raw = m.get();
    tc.run = [raw](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{raw->forward(in[0])};
    };
    cases.push_back(std::move(tc));
  };
  add(nn::make<nn::GroupNorm>(3, 6), "nn.GroupNorm(3, 6)", true, {2, 6, 4, 3});
  add(nn::make<nn::GroupNorm>(2, 4, 1e-3, false), "nn.GroupNorm(2, 4, eps=1e-3, affine=False)",
      false, {3, 4, 5});
  add(nn::make<nn::InstanceNorm2d>(3), "nn.InstanceNorm2d(3)", true, {2, 3, 4, 5});
  add(nn::make<nn::InstanceNorm2d>(3, 1e-5, 0.2, true, true),
      "nn.InstanceNorm2d(3, momentum=0.2, affine=True, track_running_stats=True)", true,
      {2, 3, 4, 5});
  add(nn::make<nn::InstanceNorm2d>(3, 1e-5, 0.1, false, true),
      "nn.InstanceNorm2d(3, track_running_stats=True)", true, {3, 4, 5});
  // Eval with tracked statistics normalises by them (set away from their 0/1 start).
  auto tracked = nn::make<nn::InstanceNorm2d>(3, 1e-4, 0.1, true, true);
  tracked->to(DType::Float64);
  nn::init::uniform_(tracked->running_mean, -0.5, 0.5);
  nn::init::uniform_(tracked->running_var, 0.5, 2.0);
  add(tracked, "nn.InstanceNorm2d(3, eps=1e-4, affine=True, track_running_stats=True)", false,
      {2, 3, 4, 5});
  TorchCase f;
  f.label = "F.group_norm and F.instance_norm";
  f.call =
      "(F.group_norm(x[0], 2, x[1], x[2], 1e-4), F.instance_norm(x[0], weight=x[1], "
      "bias=x[2]))";
  f.inputs = {f64(random_values(2 * 4 * 6, 20), {2, 4, 6}), f64(random_values(4, 21), {4}),
              f64(random_values(4, 22), {4})};
  f.run = [](const std::vector<Tensor>& x) {
    return std::vector<Tensor>{F::group_norm(x[0], 2, x[1], x[2], 1e-4),
                               F::instance_norm(x[0], Tensor(), Tensor(), x[1], x[2])};
  };
  cases.push_back(std::move(f));
  NN_REQUIRE_TORCH_PARITY(cases);
}

TEST_CASE("nn GroupNorm and InstanceNorm2d run in float32 under autocast and in half models",
          "[nn][norm][amp]") {
  kiln::manual_seed(93);
  Tensor x = kiln::randn({2, 4, 3, 3});
  nn::GroupNorm gn(2, 4);
  nn::InstanceNorm2d in(4, 1e-5, 0.1, true, true);
  std::vector<double> gn32 = values(gn.forward(x)), in32 = values(in.forward(x));
  {
    kiln::amp::autocast scope;  // CPU: bfloat16
    Tensor half = kiln::cast(x, DType::BFloat16);
    CHECK(F::group_norm(half, 2).dtype() == DType::Float32);
    CHECK(F::instance_norm(half).dtype() == DType::Float32);
    // The module, as LayerNorm's, normalises in float32 and returns its input's dtype.
    CHECK(gn.forward(half).dtype() == DType::BFloat16);
  }
  // A bfloat16 model keeps both norms' parameters and statistics in float32 (Module::to) and
  // returns the input's dtype, within bfloat16's precision of the float32 result.
  gn.to(DType::BFloat16);
  in.to(DType::BFloat16);
  CHECK(gn.weight.dtype() == DType::Float32);
  CHECK(in.running_var.dtype() == DType::Float32);
  Tensor half = kiln::cast(x, DType::BFloat16);
  Tensor y = gn.forward(half), z = in.forward(half);
  CHECK(y.dtype() == DType::BFloat16);
  CHECK(z.dtype() == DType::BFloat16);
  NN_REQUIRE_CLOSE(values(y), gn32, 5e-2, 2e-2);
  NN_REQUIRE_CLOSE(values(z), in32, 5e-2, 2e-2);
}
