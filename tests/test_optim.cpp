// Optimizers, gradient clipping, gradient accumulation and LR schedules against float64
// host implementations of PyTorch's formulas, written out here independently of
// frontend/optim.cpp; plus the properties a training loop relies on (laziness, no graph
// growth, no recompilation across steps) and the errors a user meets.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "frontend/lr_scheduler.h"
#include "frontend/optim.h"
#include "frontend/serialize.h"
#include "optim_support.h"

using namespace kiln;
namespace optim = kiln::optim;

namespace {

using optim_test::Bowl;
using optim_test::require_close;

// Runs `steps` steps of `opt` on the bowl: zero_grad, backward, step, read the loss.
void train(optim::Optimizer& opt, const Bowl& bowl, int steps) {
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    Tensor loss = bowl.loss();
    loss.backward();
    opt.step();
    loss.item<double>();
  }
}

// torch.optim.SGD's single-tensor update in float64.
std::vector<double> reference_sgd(const Bowl& bowl, std::vector<double> x,
                                  const optim::SGDOptions& o, int steps) {
  std::vector<double> buf;
  for (int s = 0; s < steps; ++s) {
    std::vector<double> g = bowl.grad_at(x);
    for (size_t i = 0; i < x.size(); ++i) g[i] += o.weight_decay * x[i];
    if (o.momentum != 0) {
      if (buf.empty()) {
        buf = g;
      } else {
        for (size_t i = 0; i < x.size(); ++i)
          buf[i] = o.momentum * buf[i] + (1 - o.dampening) * g[i];
      }
      for (size_t i = 0; i < x.size(); ++i) g[i] = o.nesterov ? g[i] + o.momentum * buf[i] : buf[i];
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] -= o.lr * g[i];
  }
  return x;
}

// torch.optim.Adam / AdamW's single-tensor update in float64.
std::vector<double> reference_adam(const Bowl& bowl, std::vector<double> x, double lr, double b1,
                                   double b2, double eps, double wd, bool decoupled, bool amsgrad,
                                   int steps) {
  std::vector<double> m(x.size(), 0), v(x.size(), 0), vmax(x.size(), 0);
  for (int t = 1; t <= steps; ++t) {
    std::vector<double> g = bowl.grad_at(x);
    for (size_t i = 0; i < x.size(); ++i) {
      if (decoupled)
        x[i] *= 1 - lr * wd;
      else
        g[i] += wd * x[i];
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      vmax[i] = std::max(vmax[i], v[i]);
      const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      const double second = amsgrad ? vmax[i] : v[i];
      x[i] -= lr / bc1 * m[i] / (std::sqrt(second) / std::sqrt(bc2) + eps);
    }
  }
  return x;
}

uint64_t kernels_loaded() {
  jit::CacheStats s = jit::cache_stats();
  return s.kernels_compiled + s.disk_hits;
}

}  // namespace

TEST_CASE("SGD matches PyTorch's update rules", "[optim]") {
  std::vector<optim::SGDOptions> cases = {
      {.lr = 0.1},
      {.lr = 0.05, .weight_decay = 0.1},
      {.lr = 0.05, .momentum = 0.9},
      {.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.01},
      {.lr = 0.05, .momentum = 0.9, .weight_decay = 0.02, .nesterov = true},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    INFO("case " << c);
    Bowl bowl({4, 5}, 11 + c);
    std::vector<double> start = bowl.p.to_vector<double>();
    optim::SGD opt({bowl.p}, cases[c]);
    train(opt, bowl, 6);
    require_close(bowl.p.to_vector<double>(), reference_sgd(bowl, start, cases[c], 6), 2e-5);
    CHECK(opt.step_count(0) == 6);
  }
}

TEST_CASE("SGD updates float64 parameters in float64", "[optim]") {
  Bowl bowl({3, 3}, 5, DType::Float64);
  std::vector<double> start = bowl.p.to_vector<double>();
  optim::SGDOptions o{.lr = 0.03, .momentum = 0.7, .nesterov = true};
  optim::SGD opt({bowl.p}, o);
  train(opt, bowl, 5);
  CHECK(bowl.p.dtype() == DType::Float64);
  require_close(bowl.p.to_vector<double>(), reference_sgd(bowl, start, o, 5), 1e-12);
}

TEST_CASE("optimizers keep the dtype of half-precision parameters", "[optim]") {
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    INFO(dtype_name(dt));
    Tensor p = from_vector<float>({1.0f, -2.0f, 0.5f});
    p = cast(p, dt).eval();
    p.requires_grad_();
    optim::Adam opt({p}, {.lr = 0.125});
    for (int s = 0; s < 2; ++s) {
      opt.zero_grad();
      sum(p * 1.0).backward();
      opt.step();
    }
    CHECK(p.dtype() == dt);
    // Adam's first steps move each element by about lr against the gradient's sign.
    require_close(p.to_vector<double>(), {0.75, -2.25, 0.25}, 1e-2);
  }
}

TEST_CASE("Adam and AdamW match PyTorch's bias-corrected updates", "[optim]") {
  struct Case {
    const char* name;
    double lr, b1, b2, eps, wd;
    bool decoupled, amsgrad;
  };
  std::vector<Case> cases = {
      {"Adam", 0.01, 0.9, 0.999, 1e-8, 0, false, false},
      {"Adam with L2", 0.02, 0.8, 0.99, 1e-6, 0.1, false, false},
      {"Adam amsgrad", 0.01, 0.9, 0.95, 1e-8, 0, false, true},
      {"AdamW", 0.01, 0.9, 0.999, 1e-8, 0.05, true, false},
      {"AdamW amsgrad", 0.03, 0.85, 0.99, 1e-7, 0.1, true, true},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    INFO(k.name);
    Bowl bowl({5, 3}, 21 + c);
    std::vector<double> start = bowl.p.to_vector<double>();
    std::unique_ptr<optim::Optimizer> opt;
    if (k.decoupled) {
      opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{bowl.p},
                                           optim::AdamWOptions{.lr = k.lr,
                                                               .betas = {k.b1, k.b2},
                                                               .eps = k.eps,
                                                               .weight_decay = k.wd,
                                                               .amsgrad = k.amsgrad});
    } else {
      opt = std::make_unique<optim::Adam>(std::vector<Tensor>{bowl.p},
                                          optim::AdamOptions{.lr = k.lr,
                                                             .betas = {k.b1, k.b2},
                                                             .eps = k.eps,
                                                             .weight_decay = k.wd,
                                                             .amsgrad = k.amsgrad});
    }
    train(*opt, bowl, 8);
    require_close(
        bowl.p.to_vector<double>(),
        reference_adam(bowl, start, k.lr, k.b1, k.b2, k.eps, k.wd, k.decoupled, k.amsgrad, 8),
        2e-5);
  }
}

TEST_CASE("AdamW defaults to weight decay 0.01 and Adam to none", "[optim]") {
  Tensor p = randn({3}).eval();
  p.requires_grad_();
  optim::AdamW adamw({p});
  optim::Adam adam({p.detach().requires_grad_()});
  CHECK(adamw.options(0).weight_decay == 0.01);
  CHECK(adam.options(0).weight_decay == 0);
  CHECK(adam.options(0).betas.second == 0.999);
}

TEST_CASE(
    "an optimizer step is lazy, updates every copy of a parameter and skips parameters without "
    "grad",
    "[optim]") {
  manual_seed(3);
  Tensor a = randn({4}).eval(), b = randn({4}).eval();
  a.requires_grad_();
  b.requires_grad_();
  Tensor module_view = a;  // a module holding the same handle
  const Node* b_node = b.node().get();
  std::vector<double> a0 = a.to_vector<double>(), b0 = b.to_vector<double>();
  optim::SGD opt({a, b}, {.lr = 0.25});
  Tensor loss = sum(square(a));
  loss.backward();
  opt.step();
  CHECK_FALSE(a.is_evaluated());
  CHECK(b.node().get() == b_node);  // no grad: untouched
  CHECK(opt.step_count(0) == 1);
  CHECK(opt.step_count(1) == 0);
  std::vector<double> got = module_view.to_vector<double>();
  for (size_t i = 0; i < 4; ++i) CHECK(got[i] == Approx(a0[i] - 0.25 * 2 * a0[i]).margin(1e-6));
  CHECK(b.to_vector<double>() == b0);
  CHECK(a.requires_grad());
  CHECK(a.is_leaf());
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("parameter groups keep their own learning rates and options", "[optim]") {
  Tensor a = ones({3}).eval(), b = ones({2}).eval();
  a.requires_grad_();
  b.requires_grad_();
  optim::SGD opt({a}, {.lr = 0.1});
  opt.add_param_group({b}, {.lr = 0.01, .weight_decay = 1.0});
  REQUIRE(opt.num_param_groups() == 2);
  sum(a * 2.0).backward();
  sum(b * 2.0).backward();
  opt.step();
  // a: 1 - 0.1*2; b: 1 - 0.01*(2 + 1*1)
  require_close(a.to_vector<double>(), {0.8, 0.8, 0.8}, 1e-6);
  require_close(b.to_vector<double>(), {0.97, 0.97}, 1e-6);
  opt.set_lr(1, 0.5);
  CHECK(opt.lr(1) == 0.5);
  CHECK(opt.parameters().size() == 2);
}

TEST_CASE("Adam steps 3 to 10 compile no new kernels and grow no graph", "[optim]") {
  manual_seed(7);
  Tensor x = randn({16, 8}), y = randn({16, 4});
  Tensor w = (randn({8, 4}) * 0.3).eval(), bias = zeros({4}).eval();
  w.requires_grad_();
  bias.requires_grad_();
  optim::Adam opt({w, bias}, {.lr = 0.05});
  auto step = [&] {
    opt.zero_grad();
    Tensor loss = mean(square(matmul(x, w) + bias - y));
    loss.backward();
    opt.step();
    return loss.item<double>();
  };
  double first = step();
  step();
  const uint64_t kernels_before = kernels_loaded();
  const int64_t live_before = Node::live_count();
  double last = 0;
  for (int s = 3; s <= 10; ++s) last = step();
  CHECK(kernels_loaded() == kernels_before);
  CHECK(Node::live_count() <= live_before);
  CHECK(last < first);
}

TEST_CASE("SGD with momentum and a changing learning rate compiles no new kernels", "[optim]") {
  manual_seed(8);
  Tensor x = randn({8, 5}), y = randn({8, 1});
  Tensor w = randn({5, 1}).eval();
  w.requires_grad_();
  optim::SGD opt({w}, {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
  optim::StepLR sched(opt, 2, 0.5);
  auto step = [&] {
    opt.zero_grad();
    Tensor loss = mean(square(matmul(x, w) - y));
    loss.backward();
    opt.step();
    sched.step();
    return loss.item<double>();
  };
  step();
  step();
  const uint64_t before = kernels_loaded();
  for (int s = 3; s <= 8; ++s) step();
  CHECK(kernels_loaded() == before);
}

TEST_CASE("gradient accumulation over half-batches equals the full-batch gradient", "[optim]") {
  manual_seed(9);
  Tensor x = randn({6, 3}).eval(), y = randn({6, 2}).eval();
  Tensor w = randn({3, 2}).eval();
  w.requires_grad_();
  auto loss_of = [&](const Tensor& xs, const Tensor& ys) {
    return mean(square(matmul(xs, w) - ys));
  };
  loss_of(x, y).backward();
  std::vector<double> full = w.grad().to_vector<double>();
  w.set_grad(Tensor());
  (loss_of(slice(x, 0, 0, 3), slice(y, 0, 0, 3)) / 2).backward();
  (loss_of(slice(x, 0, 3, 6), slice(y, 0, 3, 6)) / 2).backward();
  require_close(w.grad().to_vector<double>(), full, 1e-6);
  // and by hand: d/dw mean((xw - y)^2) = 2/(N*out) x^T (xw - y)
  std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>(),
                      wv = w.to_vector<double>();
  std::vector<double> expect(6, 0);
  for (int n = 0; n < 6; ++n) {
    for (int j = 0; j < 2; ++j) {
      double r = -yv[n * 2 + j];
      for (int k = 0; k < 3; ++k) r += xv[n * 3 + k] * wv[k * 2 + j];
      for (int k = 0; k < 3; ++k) expect[k * 2 + j] += 2.0 / 12 * xv[n * 3 + k] * r;
    }
  }
  require_close(full, expect, 1e-5);
}

TEST_CASE("clip_grad_norm scales gradients as torch.nn.utils.clip_grad_norm_", "[optim]") {
  for (double norm_type : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
    INFO("norm_type " << norm_type);
    Generator gen(31);
    Tensor a = zeros({3, 4}), b = zeros({5}), c = zeros({2});
    for (Tensor* p : {&a, &b, &c}) p->requires_grad_();
    Tensor ga = randn({3, 4}, DType::Float32, gen).eval(),
           gb = randn({5}, DType::Float32, gen).eval();
    a.set_grad(ga);
    b.set_grad(gb);  // c has no gradient
    std::vector<double> all = ga.to_vector<double>();
    for (double v : gb.to_vector<double>()) all.push_back(v);
    double total = 0;
    for (double v : all) {
      total = std::isinf(norm_type) ? std::max(total, std::fabs(v))
                                    : total + std::pow(std::fabs(v), norm_type);
    }
    if (!std::isinf(norm_type)) total = std::pow(total, 1 / norm_type);
    for (double max_norm : {0.5, 1e3}) {
      a.set_grad(ga);
      b.set_grad(gb);
      Tensor got = optim::clip_grad_norm({a, b, c}, max_norm, norm_type);
      CHECK(got.ndim() == 0);
      CHECK(got.item<double>() == Approx(total).epsilon(1e-5));
      const double coef = std::min(1.0, max_norm / (total + 1e-6));
      std::vector<double> ea, eb;
      for (double v : ga.to_vector<double>()) ea.push_back(v * coef);
      for (double v : gb.to_vector<double>()) eb.push_back(v * coef);
      require_close(a.grad().to_vector<double>(), ea, 1e-6);
      require_close(b.grad().to_vector<double>(), eb, 1e-6);
      CHECK_FALSE(c.grad().defined());
    }
  }
}

TEST_CASE("clip_grad_value clamps every gradient", "[optim]") {
  Tensor p = zeros({5});
  p.requires_grad_();
  p.set_grad(from_vector<float>({-3, -0.5, 0, 0.25, 2}));
  optim::clip_grad_value({p}, 1.0);
  CHECK(p.grad().to_vector<float>() == std::vector<float>{-1, -0.5, 0, 0.25, 1});
  Tensor none = zeros({2});
  none.requires_grad_();
  CHECK(optim::clip_grad_norm({none}, 1.0).item<double>() == 0.0);
}

TEST_CASE("optimizer state_dict resumes training exactly, also through a safetensors file",
          "[optim]") {
  Bowl bowl({4, 3}, 41);
  Tensor twin = bowl.p.detach().eval();
  twin.requires_grad_();
  Bowl other = bowl;
  other.p = twin;
  optim::Adam a({bowl.p}, {.lr = 0.02, .amsgrad = true});
  train(a, bowl, 3);
  twin.assign(bowl.p.detach());
  StateDict sd = a.state_dict();
  CHECK(sd.count("state.0.exp_avg"));
  CHECK(sd.count("state.0.max_exp_avg_sq"));
  CHECK(sd.at("state.0.step").item<int64_t>() == 3);
  CHECK(sd.at("param_groups.0.lr").item<double>() == 0.02);
  const std::string path = "/tmp/kiln_test_optim_state.safetensors";
  save_safetensors(path, sd);
  optim::Adam b({twin}, {.lr = 0.5, .amsgrad = true});
  b.load_state_dict(load_safetensors(path));
  std::remove(path.c_str());
  CHECK(b.lr(0) == 0.02);
  CHECK(b.step_count(0) == 3);
  train(a, bowl, 2);
  train(b, other, 2);
  CHECK(twin.to_vector<float>() == bowl.p.to_vector<float>());
  // the snapshot did not follow the later steps
  CHECK(sd.at("state.0.step").item<int64_t>() == 3);
}

TEST_CASE("optimizer argument errors", "[optim][errors]") {
  Tensor p = zeros({2}).eval();
  p.requires_grad_();
  REQUIRE_THROWS_AS(optim::SGD({p}, {.lr = -1}), ValueError);
  REQUIRE_THROWS_WITH(optim::SGD({p}, {.lr = -1}),
                      Catch::Contains("[SGD] expected lr >= 0, got -1"));
  REQUIRE_THROWS_WITH(optim::SGD({p}, {.lr = 0.1, .nesterov = true}),
                      Catch::Contains("Nesterov momentum needs momentum > 0"));
  REQUIRE_THROWS_AS(optim::Adam({p}, {.betas = {0.9, 1.0}}), ValueError);
  REQUIRE_THROWS_WITH(optim::Adam({p}, {.betas = {0.9, 1.0}}),
                      Catch::Contains("[Adam] expected betas.second in [0, 1)"));
  REQUIRE_THROWS_WITH(optim::AdamW({p}, {.eps = -1}), Catch::Contains("[AdamW] expected eps >= 0"));
  REQUIRE_THROWS_AS(optim::SGD({p, p}, {}), ValueError);
  REQUIRE_THROWS_WITH(optim::SGD({p, p}, {}), Catch::Contains("appears more than once"));
  REQUIRE_THROWS_AS(optim::SGD({zeros({2}, DType::Int32)}, {}), DTypeError);
  REQUIRE_THROWS_WITH(optim::SGD({zeros({2}, DType::Int32)}, {}),
                      Catch::Contains("int32[2]; only floating tensors can be optimized"));
  REQUIRE_THROWS_WITH(optim::SGD({p * 2.0}, {}), Catch::Contains("only leaves can be optimized"));
  REQUIRE_THROWS_WITH(optim::SGD({Tensor()}, {}),
                      Catch::Contains("parameter 0 of group 0 is undefined"));
  REQUIRE_THROWS_AS(optim::clip_grad_norm({p}, -1.0), ValueError);
  REQUIRE_THROWS_WITH(optim::clip_grad_norm({p}, 1.0, -2.0),
                      Catch::Contains("[clip_grad_norm] expected norm_type"));
  REQUIRE_THROWS_WITH(optim::clip_grad_value({p}, -1.0), Catch::Contains("[clip_grad_value]"));
  optim::SGD ok({p}, {.lr = 0.1});
  REQUIRE_THROWS_AS(ok.params(3), IndexError);
  ok.options(0).momentum = -1;  // validated again at step()
  p.set_grad(ones({2}));
  REQUIRE_THROWS_WITH(ok.step(), Catch::Contains("[SGD] expected momentum >= 0"));
}

TEST_CASE("load_state_dict rejects state that does not fit", "[optim][errors]") {
  Tensor p = zeros({2, 3});
  p.requires_grad_();
  optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  auto with = [](StateDict d, const std::string& k, Tensor v) {
    d[k] = v;
    return d;
  };
  StateDict good = {{"state.0.step", tensor<int64_t>(1)},
                    {"state.0.momentum_buffer", zeros({2, 3})}};
  REQUIRE_NOTHROW(opt.load_state_dict(good));
  REQUIRE_THROWS_AS(opt.load_state_dict(with(good, "state.0.momentum_buffer", zeros({3, 2}))),
                    ShapeError);
  REQUIRE_THROWS_WITH(
      opt.load_state_dict(with(good, "state.0.momentum_buffer", zeros({3, 2}))),
      Catch::Contains(
          "'state.0.momentum_buffer' is float32[3, 2] but parameter 0 is float32[2, 3]"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(with(good, "state.4.step", tensor<int64_t>(1))),
                      Catch::Contains("names a parameter this optimizer does not have"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(with(good, "state.0.exp_avg", zeros({2, 3}))),
                      Catch::Contains("'state.0.exp_avg' is not state of this optimizer"));
  REQUIRE_THROWS_WITH(opt.load_state_dict({{"state.0.step", tensor<int64_t>(2)}}),
                      Catch::Contains("has state but no 'state.0.momentum_buffer' entry"));
  REQUIRE_THROWS_WITH(opt.load_state_dict({{"weights", zeros({1})}}),
                      Catch::Contains("unexpected entry 'weights'"));
}

// ---------------------------------------------------------------------------------------
// LR schedules

namespace {

struct SchedFixture {
  Tensor a = zeros({2}), b = zeros({2});
  std::unique_ptr<optim::SGD> opt;
  SchedFixture() {
    a.requires_grad_();
    b.requires_grad_();
    opt = std::make_unique<optim::SGD>(std::vector<Tensor>{a}, optim::SGDOptions{.lr = 0.1});
    opt->add_param_group({b}, {.lr = 0.02});
  }
};

// The lrs of group 0 over `epochs` steps, starting with the value set at construction.
std::vector<double> lrs_of(optim::LRScheduler& s, int epochs, size_t group = 0) {
  std::vector<double> out{s.optimizer().lr(group)};
  for (int e = 1; e < epochs; ++e) {
    s.step();
    out.push_back(s.optimizer().lr(group));
    CHECK(s.get_last_lr()[group] == out.back());
  }
  return out;
}

}  // namespace

TEST_CASE("StepLR decays by gamma every step_size epochs", "[lr_scheduler]") {
  SchedFixture f;
  optim::StepLR s(*f.opt, 3, 0.5);
  require_close(lrs_of(s, 8), {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025}, 1e-15);
  CHECK(s.last_epoch() == 7);
  CHECK(f.opt->lr(1) == Approx(0.005));
}

TEST_CASE("CosineAnnealingLR follows PyTorch's closed form", "[lr_scheduler]") {
  SchedFixture f;
  optim::CosineAnnealingLR s(*f.opt, 10, 0.001);
  std::vector<double> got = lrs_of(s, 12);
  // Values of torch.optim.lr_scheduler.CosineAnnealingLR(T_max=10, eta_min=0.001), lr 0.1.
  require_close({got[0], got[1], got[5], got[10], got[11]},
                {0.1, 0.09757729755661012, 0.0505, 0.001, 0.0034227024433899004}, 1e-12);
  for (int e = 0; e < 12; ++e) {
    CHECK(got[e] == Approx(0.001 + (0.1 - 0.001) * (1 + std::cos(std::numbers::pi * e / 10)) / 2));
  }
}

TEST_CASE("LinearWarmup ramps from start_factor to end_factor", "[lr_scheduler]") {
  SchedFixture f;
  optim::LinearWarmup s(*f.opt, 4, 0.25);
  require_close(lrs_of(s, 7), {0.025, 0.04375, 0.0625, 0.08125, 0.1, 0.1, 0.1}, 1e-15);
  SchedFixture g;
  optim::LinearWarmup down(*g.opt, 2, 1.0, 0.5);
  require_close(lrs_of(down, 4), {0.1, 0.075, 0.05, 0.05}, 1e-15);
}

TEST_CASE("SequentialLR chains warmup and cosine for every group", "[lr_scheduler]") {
  SchedFixture f;
  auto warm = std::make_shared<optim::LinearWarmup>(*f.opt, 3, 0.1);
  auto cosine = std::make_shared<optim::CosineAnnealingLR>(*f.opt, 4);
  optim::SequentialLR s(*f.opt, {warm, cosine}, {3});
  CHECK(s.base_lrs() == std::vector<double>{0.1, 0.02});
  std::vector<double> g0 = lrs_of(s, 9, 0);
  // warmup 0.01, 0.04, 0.07, then cosine from 0.1 over T_max = 4
  std::vector<double> expect = {0.01,
                                0.04,
                                0.07,
                                0.1,
                                0.1 * (1 + std::cos(std::numbers::pi / 4)) / 2,
                                0.05,
                                0.1 * (1 + std::cos(3 * std::numbers::pi / 4)) / 2,
                                0.0,
                                0.1 * (1 + std::cos(5 * std::numbers::pi / 4)) / 2};
  require_close(g0, expect, 1e-12);
  CHECK(f.opt->lr(1) == Approx(0.02 * expect[8] / 0.1));

  SchedFixture h;
  auto wc = optim::warmup_cosine(*h.opt, 3, 7, 0.1);
  require_close(lrs_of(*wc, 9, 0), expect, 1e-12);
  wc->set_epoch(5);
  CHECK(h.opt->lr(0) == Approx(expect[5]));
}

TEST_CASE("a scheduler's lr is what the next step uses", "[lr_scheduler]") {
  Tensor p = zeros({1});
  p.requires_grad_();
  optim::SGD opt({p}, {.lr = 1.0});
  optim::StepLR s(opt, 1, 0.5);
  for (int e = 0; e < 3; ++e) {
    p.set_grad(ones({1}));
    opt.step();
    s.step();
  }
  CHECK(p.item<double>() == Approx(-(1.0 + 0.5 + 0.25)));
}

TEST_CASE("LR scheduler argument errors", "[lr_scheduler][errors]") {
  SchedFixture f;
  REQUIRE_THROWS_AS(optim::StepLR(*f.opt, 0), ValueError);
  REQUIRE_THROWS_WITH(optim::StepLR(*f.opt, 0),
                      Catch::Contains("[StepLR] expected step_size >= 1, got 0"));
  REQUIRE_THROWS_WITH(optim::CosineAnnealingLR(*f.opt, 0),
                      Catch::Contains("[CosineAnnealingLR] expected T_max >= 1"));
  REQUIRE_THROWS_WITH(optim::LinearWarmup(*f.opt, 3, 0.0),
                      Catch::Contains("[LinearWarmup] expected start_factor in (0, 1]"));
  auto one = std::make_shared<optim::StepLR>(*f.opt, 2);
  REQUIRE_THROWS_WITH(optim::SequentialLR(*f.opt, {one, one}, {}),
                      Catch::Contains("expected 1 milestones for 2 schedulers"));
  REQUIRE_THROWS_WITH(optim::SequentialLR(*f.opt, {one, one}, {0}),
                      Catch::Contains("milestones must be positive"));
  SchedFixture g;
  auto foreign = std::make_shared<optim::StepLR>(*g.opt, 2);
  REQUIRE_THROWS_WITH(optim::SequentialLR(*f.opt, {foreign}, {}),
                      Catch::Contains("drives a different optimizer"));
  REQUIRE_THROWS_WITH(optim::warmup_cosine(*f.opt, 5, 5),
                      Catch::Contains("[warmup_cosine] expected total_steps > warmup_steps"));
  REQUIRE_THROWS_WITH(one->set_epoch(-1), Catch::Contains("expected epoch >= 0"));
}
