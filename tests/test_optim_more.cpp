// RMSprop and Adagrad against float64 host implementations of torch.optim's single-tensor
// updates (written out here independently of frontend/optim.cpp), over option combinations,
// shapes, dtypes and parameter groups; their state_dict resume; clip_grad_norm's
// error_if_nonfinite; and the schedules MultiStepLR, ExponentialLR, LambdaLR, OneCycleLR
// and ReduceLROnPlateau against values derived by hand from PyTorch's definitions, with
// every scheduler's state_dict resume. PyTorch itself is compared in
// test_trainapi_parity.cpp.
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
#include "test_files.h"

using namespace kiln;
namespace optim = kiln::optim;

namespace {

using optim_test::Bowl;
using optim_test::require_close;

void train(optim::Optimizer& opt, const std::vector<const Bowl*>& bowls, int steps) {
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    Tensor loss = bowls[0]->loss();
    for (size_t i = 1; i < bowls.size(); ++i) loss = loss + bowls[i]->loss();
    loss.backward();
    opt.step();
    loss.item<double>();
  }
}

// torch.optim.RMSprop's single-tensor update in float64.
std::vector<double> reference_rmsprop(const Bowl& bowl, std::vector<double> x,
                                      const optim::RMSpropOptions& o, int steps) {
  const size_t n = x.size();
  std::vector<double> sq(n, 0), gavg(n, 0), buf(n, 0);
  for (int s = 0; s < steps; ++s) {
    std::vector<double> g = bowl.grad_at(x);
    for (size_t i = 0; i < n; ++i) {
      const double d = g[i] + o.weight_decay * x[i];
      sq[i] = o.alpha * sq[i] + (1 - o.alpha) * d * d;
      double avg;
      if (o.centered) {
        gavg[i] = o.alpha * gavg[i] + (1 - o.alpha) * d;
        avg = std::sqrt(sq[i] - gavg[i] * gavg[i]) + o.eps;
      } else {
        avg = std::sqrt(sq[i]) + o.eps;
      }
      if (o.momentum > 0) {
        buf[i] = o.momentum * buf[i] + d / avg;
        x[i] -= o.lr * buf[i];
      } else {
        x[i] -= o.lr * d / avg;
      }
    }
  }
  return x;
}

// torch.optim.Adagrad's single-tensor update in float64.
std::vector<double> reference_adagrad(const Bowl& bowl, std::vector<double> x,
                                      const optim::AdagradOptions& o, int steps) {
  std::vector<double> acc(x.size(), o.initial_accumulator_value);
  for (int t = 1; t <= steps; ++t) {
    std::vector<double> g = bowl.grad_at(x);
    const double clr = o.lr / (1 + (t - 1) * o.lr_decay);
    for (size_t i = 0; i < x.size(); ++i) {
      const double d = g[i] + o.weight_decay * x[i];
      acc[i] += d * d;
      x[i] -= clr * d / (std::sqrt(acc[i]) + o.eps);
    }
  }
  return x;
}

uint64_t kernels_loaded() {
  jit::CacheStats s = jit::cache_stats();
  return s.kernels_compiled + s.disk_hits;
}

std::vector<Shape> shapes() { return {{5}, {3, 4}, {2, 2, 3}}; }

}  // namespace

TEST_CASE("RMSprop matches torch.optim.RMSprop's update", "[optim]") {
  std::vector<optim::RMSpropOptions> cases = {
      {.lr = 0.01},
      {.lr = 0.01, .alpha = 0.9, .weight_decay = 0.1},
      {.lr = 0.005, .momentum = 0.9},
      {.lr = 0.01, .centered = true},
      {.lr = 0.003,
       .alpha = 0.95,
       .eps = 1e-3,
       .weight_decay = 0.05,
       .momentum = 0.5,
       .centered = true},
  };
  uint64_t seed = 100;
  for (const auto& o : cases) {
    for (const Shape& shape : shapes()) {
      for (DType dtype : {DType::Float32, DType::Float64}) {
        INFO("alpha " << o.alpha << " momentum " << o.momentum << " centered " << o.centered
                      << " wd " << o.weight_decay << " shape " << shape_str(shape) << " "
                      << dtype_name(dtype));
        Bowl bowl(shape, ++seed, dtype);
        std::vector<double> expected = reference_rmsprop(bowl, bowl.p.to_vector<double>(), o, 7);
        optim::RMSprop opt({bowl.p}, o);
        train(opt, {&bowl}, 7);
        require_close(bowl.p.to_vector<double>(), expected, dtype == DType::Float64 ? 1e-12 : 2e-5);
        CHECK(opt.step_count(0) == 7);
      }
    }
  }
}

TEST_CASE("Adagrad matches torch.optim.Adagrad's update", "[optim]") {
  std::vector<optim::AdagradOptions> cases = {
      {.lr = 0.1},
      {.lr = 0.1, .lr_decay = 0.05},
      {.lr = 0.05, .weight_decay = 0.2, .initial_accumulator_value = 0.5},
      {.lr = 0.2,
       .lr_decay = 0.01,
       .weight_decay = 0.01,
       .initial_accumulator_value = 0.1,
       .eps = 1e-4},
  };
  uint64_t seed = 200;
  for (const auto& o : cases) {
    for (const Shape& shape : shapes()) {
      for (DType dtype : {DType::Float32, DType::Float64}) {
        INFO("lr_decay " << o.lr_decay << " wd " << o.weight_decay << " acc "
                         << o.initial_accumulator_value << " shape " << shape_str(shape) << " "
                         << dtype_name(dtype));
        Bowl bowl(shape, ++seed, dtype);
        std::vector<double> expected = reference_adagrad(bowl, bowl.p.to_vector<double>(), o, 6);
        optim::Adagrad opt({bowl.p}, o);
        train(opt, {&bowl}, 6);
        require_close(bowl.p.to_vector<double>(), expected, dtype == DType::Float64 ? 1e-12 : 2e-5);
      }
    }
  }
}

TEST_CASE("RMSprop and Adagrad parameter groups keep their own options", "[optim]") {
  Bowl a({4}, 301), b({2, 3}, 302);
  const optim::RMSpropOptions oa{.lr = 0.01}, ob{.lr = 0.002, .momentum = 0.8, .centered = true};
  std::vector<double> ea = reference_rmsprop(a, a.p.to_vector<double>(), oa, 5);
  std::vector<double> eb = reference_rmsprop(b, b.p.to_vector<double>(), ob, 5);
  optim::RMSprop rms({a.p}, oa);
  rms.add_param_group({b.p}, ob);
  train(rms, {&a, &b}, 5);
  require_close(a.p.to_vector<double>(), ea, 2e-5);
  require_close(b.p.to_vector<double>(), eb, 2e-5);
  StateDict sd = rms.state_dict();
  CHECK(sd.count("state.0.square_avg") == 1);
  CHECK(sd.count("state.0.momentum_buffer") == 0);
  CHECK(sd.count("state.1.momentum_buffer") == 1);
  CHECK(sd.count("state.1.grad_avg") == 1);

  Bowl c({3}, 303), d({3}, 304);
  const optim::AdagradOptions oc{.lr = 0.1}, od{.lr = 0.3, .lr_decay = 0.1};
  std::vector<double> ec = reference_adagrad(c, c.p.to_vector<double>(), oc, 4);
  std::vector<double> ed = reference_adagrad(d, d.p.to_vector<double>(), od, 4);
  optim::Adagrad ada({c.p}, oc);
  ada.add_param_group({d.p}, od);
  train(ada, {&c, &d}, 4);
  require_close(c.p.to_vector<double>(), ec, 2e-5);
  require_close(d.p.to_vector<double>(), ed, 2e-5);
}

TEST_CASE("RMSprop and Adagrad state_dict resumes training exactly", "[optim]") {
  auto resume = [](auto make_optimizer) {
    Bowl bowl({3, 2}, 401);
    Bowl twin = bowl;
    twin.p = bowl.p.detach().eval();
    twin.p.requires_grad_();
    auto a = make_optimizer(bowl.p);
    train(*a, {&bowl}, 3);
    twin.p.assign(bowl.p.detach());
    auto b = make_optimizer(twin.p);
    b->load_state_dict(a->state_dict());
    CHECK(b->step_count(0) == 3);
    train(*a, {&bowl}, 3);
    train(*b, {&twin}, 3);
    CHECK(twin.p.to_vector<float>() == bowl.p.to_vector<float>());
  };
  resume([](const Tensor& p) {
    return std::make_unique<optim::RMSprop>(
        std::vector<Tensor>{p},
        optim::RMSpropOptions{.lr = 0.01, .momentum = 0.9, .centered = true});
  });
  resume([](const Tensor& p) {
    return std::make_unique<optim::Adagrad>(
        std::vector<Tensor>{p},
        optim::AdagradOptions{.lr = 0.1, .lr_decay = 0.1, .initial_accumulator_value = 0.2});
  });
}

TEST_CASE("Adagrad with lr_decay compiles no new kernels after its second step", "[optim]") {
  Bowl bowl({6}, 501);
  optim::Adagrad opt({bowl.p}, {.lr = 0.1, .lr_decay = 0.1, .initial_accumulator_value = 0.1});
  train(opt, {&bowl}, 2);
  const uint64_t before = kernels_loaded();
  train(opt, {&bowl}, 4);
  CHECK(kernels_loaded() == before);
}

TEST_CASE("RMSprop and Adagrad argument errors", "[optim][errors]") {
  Tensor p = zeros({2});
  p.requires_grad_();
  REQUIRE_THROWS_AS(optim::RMSprop({p}, {.lr = -1}), ValueError);
  REQUIRE_THROWS_WITH(optim::RMSprop({p}, {.alpha = -0.5}),
                      Catch::Contains("[RMSprop] expected alpha >= 0, got -0.5"));
  REQUIRE_THROWS_AS(optim::RMSprop({p}, {.momentum = -0.1}), ValueError);
  REQUIRE_THROWS_AS(optim::RMSprop({p}, {.eps = -1}), ValueError);
  REQUIRE_THROWS_WITH(optim::Adagrad({p}, {.lr_decay = -1}),
                      Catch::Contains("[Adagrad] expected lr_decay >= 0, got -1"));
  REQUIRE_THROWS_AS(optim::Adagrad({p}, {.initial_accumulator_value = -1}), ValueError);
  REQUIRE_THROWS_AS(optim::Adagrad({p}, {.weight_decay = -1}), ValueError);
  REQUIRE_THROWS_AS(optim::Adagrad({}, {}), ValueError);
  optim::Adagrad ada({p});
  CHECK_FALSE(ada.momentum(0).has_value());
  REQUIRE_THROWS_WITH(ada.set_momentum(0, 0.9), Catch::Contains("[Adagrad] has no momentum"));
  optim::RMSprop rms({p}, {.momentum = 0.5});
  REQUIRE(rms.momentum(0).has_value());
  CHECK(*rms.momentum(0) == 0.5);
  StateDict wrong = {{"state.0.exp_avg", zeros({2})}, {"state.0.step", tensor(int64_t{1})}};
  REQUIRE_THROWS_WITH(rms.load_state_dict(wrong),
                      Catch::Contains("'state.0.exp_avg' is not state of this optimizer"));
}

TEST_CASE("clip_grad_norm with error_if_nonfinite raises on a NaN or infinite norm",
          "[optim][errors]") {
  Tensor a = zeros({3}), b = zeros({2});
  a.requires_grad_();
  b.requires_grad_();
  for (double bad :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    for (double norm_type : {2.0, 1.0, std::numeric_limits<double>::infinity()}) {
      INFO("bad " << bad << " norm_type " << norm_type);
      a.set_grad(from_vector<float>({1, 2, static_cast<float>(bad)}));
      b.set_grad(from_vector<float>({3, 4}));
      REQUIRE_THROWS_AS(optim::clip_grad_norm({a, b}, 1.0, norm_type, true),
                        optim::NonFiniteNormError);
      // It is a ValueError too, for handlers written against the generic type.
      REQUIRE_THROWS_AS(optim::clip_grad_norm({a, b}, 1.0, norm_type, true), ValueError);
      REQUIRE_THROWS_WITH(optim::clip_grad_norm({a, b}, 1.0, norm_type, true),
                          Catch::Contains("[clip_grad_norm] the total norm of order") &&
                              Catch::Contains("of the gradients of 2 parameters is"));
      // The gradients were left as they were.
      CHECK(b.grad().to_vector<float>() == std::vector<float>{3, 4});
      // Without the flag the clipping runs (and the norm is not finite).
      CHECK_FALSE(std::isfinite(optim::clip_grad_norm({a, b}, 1.0, norm_type).item<double>()));
    }
  }
  // A finite norm clips as without the flag.
  a.set_grad(from_vector<float>({3, 0, 0}));
  b.set_grad(from_vector<float>({0, 4}));
  CHECK(optim::clip_grad_norm({a, b}, 1.0, 2.0, true).item<double>() == Approx(5.0));
  require_close(b.grad().to_vector<double>(), {0, 4 / (5 + 1e-6)}, 1e-6);
}

// ---------------------------------------------------------------------------------------
// Schedules

namespace {

// Two groups with lrs 1 and 0.1 over a one-element parameter each.
struct TwoGroups {
  Tensor a = zeros({1}), b = zeros({1});
  std::unique_ptr<optim::SGD> opt;
  explicit TwoGroups(double momentum = 0.0) {
    a.requires_grad_();
    b.requires_grad_();
    opt = std::make_unique<optim::SGD>(std::vector<Tensor>{a},
                                       optim::SGDOptions{.lr = 1.0, .momentum = momentum});
    opt->add_param_group({b}, {.lr = 0.1, .momentum = momentum});
  }
};

// The lrs of group `g` over epochs 0..n-1 (construction, then n-1 steps).
template <typename Scheduler>
std::vector<double> lr_series(Scheduler& s, optim::Optimizer& opt, size_t g, int n) {
  std::vector<double> out{opt.lr(g)};
  for (int e = 1; e < n; ++e) {
    s.step();
    out.push_back(opt.lr(g));
  }
  return out;
}

// Steps `make()` n times straight, and separately k times, saves, builds a fresh scheduler
// on a fresh optimizer, loads, and steps n - k more: the lrs (and momentum) must agree.
template <typename Make>
void check_resume(Make make, int k, int n, double momentum = 0.0) {
  TwoGroups straight(momentum), first(momentum), resumed(momentum);
  auto s = make(*straight.opt);
  auto f = make(*first.opt);
  for (int e = 0; e < n; ++e) s->step();
  for (int e = 0; e < k; ++e) f->step();
  StateDict sd = f->state_dict();
  StateDict osd = first.opt->state_dict();
  auto r = make(*resumed.opt);
  resumed.opt->load_state_dict(osd);
  r->load_state_dict(sd);
  for (int e = k; e < n; ++e) r->step();
  for (size_t g = 0; g < 2; ++g) {
    INFO("group " << g);
    CHECK(resumed.opt->lr(g) == Approx(straight.opt->lr(g)).epsilon(1e-12));
    if (momentum != 0) CHECK(*resumed.opt->momentum(g) == Approx(*straight.opt->momentum(g)));
  }
  CHECK(r->get_last_lr() == s->get_last_lr());
}

}  // namespace

TEST_CASE("MultiStepLR decays by gamma at each milestone, twice at a repeated one",
          "[lr_scheduler]") {
  TwoGroups t;
  optim::MultiStepLR s(*t.opt, {5, 2, 5}, 0.5);
  require_close(lr_series(s, *t.opt, 0, 8), {1, 1, 0.5, 0.5, 0.5, 0.125, 0.125, 0.125}, 1e-15);
  CHECK(s.get_last_lr()[1] == Approx(0.0125));
  check_resume(
      [](optim::Optimizer& o) {
        return std::make_unique<optim::MultiStepLR>(o, std::vector<int64_t>{2, 4}, 0.1);
      },
      3, 7);
}

TEST_CASE("ExponentialLR multiplies by gamma every epoch", "[lr_scheduler]") {
  TwoGroups t;
  optim::ExponentialLR s(*t.opt, 0.9);
  require_close(lr_series(s, *t.opt, 1, 5), {0.1, 0.09, 0.081, 0.0729, 0.06561}, 1e-14);
  check_resume([](optim::Optimizer& o) { return std::make_unique<optim::ExponentialLR>(o, 0.8); },
               2, 6);
}

TEST_CASE("LambdaLR scales each group's base lr by its function", "[lr_scheduler]") {
  TwoGroups t;
  optim::LambdaLR s(*t.opt, std::vector<optim::LambdaLR::Lambda>{
                                [](int64_t e) { return 1.0 / static_cast<double>(e + 1); },
                                [](int64_t e) { return e < 2 ? 1.0 : 10.0; }});
  std::vector<double> g0{t.opt->lr(0)}, g1{t.opt->lr(1)};
  for (int e = 1; e < 4; ++e) {
    s.step();
    g0.push_back(t.opt->lr(0));
    g1.push_back(t.opt->lr(1));
  }
  require_close(g0, {1, 0.5, 1.0 / 3, 0.25}, 1e-15);
  require_close(g1, {0.1, 0.1, 1, 1}, 1e-15);
  check_resume(
      [](optim::Optimizer& o) {
        return std::make_unique<optim::LambdaLR>(o, [](int64_t e) { return std::pow(0.5, e % 3); });
      },
      4, 9);
}

TEST_CASE("OneCycleLR follows PyTorch's phases for cos and linear annealing", "[lr_scheduler]") {
  // total 10, pct_start 0.3: phase 1 ends at step 2, phase 2 at step 9. initial = 1/25,
  // final = initial / 1e4. The midpoint of a phase is the same for cos and linear.
  for (auto anneal :
       {optim::OneCycleLROptions::Anneal::Cos, optim::OneCycleLROptions::Anneal::Linear}) {
    TwoGroups t(0.9);
    optim::OneCycleLR s(*t.opt, {1.0, 0.5}, 10, {.anneal_strategy = anneal});
    const double init = 1.0 / 25, final_lr = init / 1e4;
    CHECK(*t.opt->initial_lr(0) == init);
    CHECK(s.base_lrs()[1] == Approx(0.02));
    std::vector<double> lr = lr_series(s, *t.opt, 0, 11);
    CHECK(lr[0] == Approx(init));
    CHECK(lr[1] == Approx((init + 1.0) / 2));
    CHECK(lr[2] == Approx(1.0));
    CHECK(lr[9] == Approx(final_lr));
    // Step 5 is 3/7 of the way down: cos or linear.
    const double pct = 3.0 / 7;
    const double want5 =
        anneal == optim::OneCycleLROptions::Anneal::Cos
            ? final_lr + (1.0 - final_lr) / 2 * (std::cos(std::numbers::pi * pct) + 1)
            : (final_lr - 1.0) * pct + 1.0;
    CHECK(lr[5] == Approx(want5).epsilon(1e-12));
    CHECK(t.opt->lr(1) == Approx(lr[10] * 0.5));
    // Stepping past total_steps raises and changes nothing.
    REQUIRE_THROWS_WITH(s.step(), Catch::Contains("[OneCycleLR] tried to step 11 times"));
    CHECK(s.last_epoch() == 10);
  }
  // Momentum runs opposite to the lr: max at the ends, base at the peak.
  TwoGroups t(0.5);
  optim::OneCycleLR s(*t.opt, 1.0, 10);
  CHECK(*t.opt->momentum(0) == Approx(0.95));
  s.set_epoch(1);
  CHECK(*t.opt->momentum(1) == Approx(0.9));
  s.set_epoch(2);
  CHECK(*t.opt->momentum(0) == Approx(0.85));
  s.set_epoch(9);
  CHECK(*t.opt->momentum(0) == Approx(0.95));
}

TEST_CASE("OneCycleLR three_phase returns to the initial lr before the final descent",
          "[lr_scheduler]") {
  TwoGroups t(0.9);
  optim::OneCycleLR s(*t.opt, 2.0, 10,
                      {.div_factor = 10, .final_div_factor = 100, .three_phase = true});
  // Phase ends: 2, 4, 9.
  std::vector<double> lr = lr_series(s, *t.opt, 0, 10);
  CHECK(lr[0] == Approx(0.2));
  CHECK(lr[2] == Approx(2.0));
  CHECK(lr[3] == Approx(1.1));
  CHECK(lr[4] == Approx(0.2));
  CHECK(lr[9] == Approx(0.002));
  CHECK(*t.opt->momentum(0) == Approx(0.95));  // phase 3 holds max_momentum
  s.set_epoch(3);
  CHECK(*t.opt->momentum(0) == Approx(0.9));
  // Adam's betas.first is its momentum; the second beta stays.
  Tensor p = zeros({1});
  p.requires_grad_();
  optim::Adam adam({p}, {.lr = 0.1, .betas = {0.9, 0.98}});
  optim::OneCycleLR sa(adam, 0.1, 4, {.base_momentum = 0.8, .max_momentum = 0.9});
  CHECK(adam.options(0).betas.first == Approx(0.9));
  CHECK(adam.options(0).betas.second == 0.98);
  check_resume(
      [](optim::Optimizer& o) {
        return std::make_unique<optim::OneCycleLR>(o, 1.0, 12, optim::OneCycleLROptions{});
      },
      5, 11, 0.9);
}

TEST_CASE("ReduceLROnPlateau lowers the lr after patience bad epochs, then cools down",
          "[lr_scheduler]") {
  TwoGroups t;
  optim::ReduceLROnPlateau s(*t.opt,
                             {.factor = 0.5, .patience = 2, .cooldown = 1, .min_lrs = {0.3, 0.0}});
  std::vector<double> metrics = {1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.6, 0.6, 0.6, 0.6};
  std::vector<double> lr0, lr1;
  for (double m : metrics) {
    s.step(m);
    lr0.push_back(t.opt->lr(0));
    lr1.push_back(t.opt->lr(1));
  }
  // Epochs 2-4 are bad; the third exceeds patience 2: reduce at 4 (1 -> 0.5). Epoch 5 is in
  // cooldown (not counted); 6 improves; 7-9 are bad: reduce at 9, 0.5 -> 0.3 (group 0's
  // min_lr), group 1 0.05 -> 0.025; 10 is cooldown again.
  require_close(lr0, {1, 1, 1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.3, 0.3}, 1e-15);
  require_close(lr1, {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025}, 1e-15);
  CHECK(s.num_bad_epochs() == 0);
  CHECK(s.best() == 0.5);
  CHECK(s.get_last_lr() == std::vector<double>{0.3, 0.025});

  // Max mode with an absolute threshold: only a rise of more than 0.1 counts.
  TwoGroups u;
  optim::ReduceLROnPlateau m(
      *u.opt, {.mode = optim::ReduceLROnPlateauOptions::Mode::Max,
               .patience = 0,
               .threshold = 0.1,
               .threshold_mode = optim::ReduceLROnPlateauOptions::ThresholdMode::Abs});
  m.step(0.5);  // improves on -inf
  CHECK(u.opt->lr(0) == 1.0);
  m.step(0.55);  // not by more than 0.1: reduce at once (patience 0)
  CHECK(u.opt->lr(0) == Approx(0.1));
  m.step(0.7);
  CHECK(u.opt->lr(0) == Approx(0.1));
  CHECK(m.best() == 0.7);
  // A NaN metric is never an improvement.
  m.step(std::numeric_limits<double>::quiet_NaN());
  CHECK(u.opt->lr(0) == Approx(0.01));

  // Rel mode: min needs metric < best * (1 - threshold); eps skips a tiny reduction.
  TwoGroups v;
  v.opt->set_lr(0, 1e-9);
  optim::ReduceLROnPlateau r(*v.opt, {.patience = 0, .threshold = 0.5});
  r.step(1.0);
  r.step(0.6);                  // not below 0.5: bad
  CHECK(v.opt->lr(0) == 1e-9);  // 1e-9 - 1e-10 < eps: unchanged
  CHECK(v.opt->lr(1) == Approx(0.01));
  r.step(0.4);
  CHECK(r.best() == 0.4);
}

TEST_CASE("ReduceLROnPlateau state_dict resumes its counters", "[lr_scheduler]") {
  std::vector<double> metrics = {3, 2, 2.5, 2.4, 2.6, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5};
  const optim::ReduceLROnPlateauOptions o{.factor = 0.3, .patience = 1, .cooldown = 2};
  TwoGroups straight, first, resumed;
  optim::ReduceLROnPlateau s(*straight.opt, o), f(*first.opt, o);
  for (double m : metrics) s.step(m);
  for (size_t e = 0; e < 4; ++e) f.step(metrics[e]);
  StateDict sd = f.state_dict();
  optim::ReduceLROnPlateau r(*resumed.opt, o);
  r.load_state_dict(sd);  // writes the lrs too: no optimizer state needed
  for (size_t e = 4; e < metrics.size(); ++e) r.step(metrics[e]);
  CHECK(r.get_last_lr() == s.get_last_lr());
  CHECK(r.num_bad_epochs() == s.num_bad_epochs());
  CHECK(r.cooldown_counter() == s.cooldown_counter());
  CHECK(r.last_epoch() == 11);
  CHECK(resumed.opt->lr(0) == straight.opt->lr(0));
}

TEST_CASE("every closed-form scheduler's state_dict resumes its schedule", "[lr_scheduler]") {
  check_resume([](optim::Optimizer& o) { return std::make_unique<optim::StepLR>(o, 3, 0.5); }, 4,
               9);
  check_resume(
      [](optim::Optimizer& o) { return std::make_unique<optim::CosineAnnealingLR>(o, 10, 0.01); },
      3, 8);
  check_resume([](optim::Optimizer& o) { return std::make_unique<optim::LinearWarmup>(o, 5); }, 2,
               7);
  check_resume([](optim::Optimizer& o) { return optim::warmup_cosine(o, 3, 12); }, 5, 10);
  // The state is the epoch and the base lrs.
  TwoGroups t;
  optim::StepLR s(*t.opt, 2);
  s.step();
  StateDict sd = s.state_dict();
  CHECK(sd.at("last_epoch").item<int64_t>() == 1);
  CHECK(sd.at("base_lrs").to_vector<double>() == std::vector<double>{1.0, 0.1});
  // Saved beside the optimizer's state in one safetensors file, under prefixes.
  s.step();
  s.step();
  test::TempDir dir("kiln_sched_state");
  StateDict file;
  for (const auto& [k, v] : s.state_dict()) file["scheduler." + k] = v;
  for (const auto& [k, v] : t.opt->state_dict()) file["optimizer." + k] = v;
  save_safetensors(dir.file("resume.safetensors"), file);
  StateDict loaded = load_safetensors(dir.file("resume.safetensors")), sched_part, opt_part;
  for (const auto& [k, v] : loaded) {
    if (k.starts_with("scheduler.")) sched_part[k.substr(10)] = v;
    if (k.starts_with("optimizer.")) opt_part[k.substr(10)] = v;
  }
  TwoGroups u;
  optim::StepLR r(*u.opt, 2);
  u.opt->load_state_dict(opt_part);
  r.load_state_dict(sched_part);
  CHECK(r.last_epoch() == 3);
  r.step();
  s.step();
  CHECK(r.get_last_lr() == s.get_last_lr());
  CHECK(u.opt->lr(0) == Approx(0.01));
}

TEST_CASE("new scheduler argument and state errors", "[lr_scheduler][errors]") {
  TwoGroups t;
  REQUIRE_THROWS_AS(optim::MultiStepLR(*t.opt, {-1}), ValueError);
  REQUIRE_THROWS_AS(optim::ExponentialLR(*t.opt, -0.5), ValueError);
  REQUIRE_THROWS_WITH(
      optim::LambdaLR(*t.opt, std::vector<optim::LambdaLR::Lambda>{[](int64_t) { return 1.0; }}),
      Catch::Contains("[LambdaLR] expected 2 lr_lambdas"));
  REQUIRE_THROWS_AS(optim::LambdaLR(*t.opt, optim::LambdaLR::Lambda()), ValueError);
  REQUIRE_THROWS_AS(optim::OneCycleLR(*t.opt, 1.0, 0), ValueError);
  REQUIRE_THROWS_AS(optim::OneCycleLR(*t.opt, 1.0, 10, {.pct_start = 1.5}), ValueError);
  REQUIRE_THROWS_AS(optim::OneCycleLR(*t.opt, std::vector<double>{1.0}, 10), ValueError);
  Tensor p = zeros({1});
  p.requires_grad_();
  optim::Adagrad ada({p});
  REQUIRE_THROWS_WITH(optim::OneCycleLR(ada, 1.0, 10),
                      Catch::Contains("[OneCycleLR] cycle_momentum needs an optimizer"));
  optim::OneCycleLR ok(ada, 1.0, 10, {.cycle_momentum = false});
  CHECK(ada.lr(0) == Approx(0.04));
  REQUIRE_THROWS_AS(optim::ReduceLROnPlateau(*t.opt, {.factor = 1.0}), ValueError);
  REQUIRE_THROWS_AS(optim::ReduceLROnPlateau(*t.opt, {.patience = -1}), ValueError);
  REQUIRE_THROWS_WITH(optim::ReduceLROnPlateau(*t.opt, {.min_lrs = {0.1}}),
                      Catch::Contains("expected 2 min_lrs"));

  optim::StepLR s(*t.opt, 2);
  s.step();
  REQUIRE_THROWS_WITH(s.load_state_dict({{"last_epoch", tensor(int64_t{3})}}),
                      Catch::Contains("missing entry 'base_lrs'"));
  REQUIRE_THROWS_WITH(s.load_state_dict({{"last_epoch", tensor(int64_t{3})},
                                         {"base_lrs", from_vector<double>({1.0})}}),
                      Catch::Contains("entry 'base_lrs' is float64[1]; expected [2]"));
  REQUIRE_THROWS_WITH(s.load_state_dict({{"last_epoch", tensor(-1.0)},
                                         {"base_lrs", from_vector<double>({1.0, 2.0})}}),
                      Catch::Contains("must be a whole number >= 0"));
  optim::ReduceLROnPlateau plateau(*t.opt);
  REQUIRE_THROWS_WITH(s.load_state_dict(plateau.state_dict()), Catch::Contains("unexpected entry"));
  // A failed load changed nothing.
  CHECK(s.last_epoch() == 1);
  CHECK(s.base_lrs() == std::vector<double>{1.0, 0.1});
  // A OneCycleLR state past its total steps is refused, leaving it as it was.
  optim::OneCycleLR cyc(*t.opt, 1.0, 5);
  StateDict far = cyc.state_dict();
  far["last_epoch"] = tensor(int64_t{6});
  REQUIRE_THROWS_AS(cyc.load_state_dict(far), ValueError);
  CHECK(cyc.last_epoch() == 0);
}
