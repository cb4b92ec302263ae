// kl_div, huber_loss, binary_cross_entropy (values and input gradients), RMSprop and
// Adagrad (parameters after every step, two parameter groups) and the schedulers (every
// group's lr, and the momentum OneCycleLR cycles, after every step) against PyTorch itself,
// all in float64: tests/trainapi_torch.py computes the same with torch. Runs where the
// Python of tests/python_support.h imports torch (scripts/setup_torch.sh), and WARNs that
// it is skipped otherwise.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "frontend/lr_scheduler.h"
#include "frontend/nn/nn.h"
#include "frontend/optim.h"
#include "torch_reference.h"

using namespace kiln;
namespace nn = kiln::nn;
namespace optim = kiln::optim;

namespace {

using Results = std::map<std::string, std::vector<double>>;

bool skip_without_torch(const char* what) {
  if (test::torch_available()) return false;
  WARN(what << " parity with PyTorch skipped: " << test::python3()
            << " cannot import torch (scripts/setup_torch.sh)");
  return true;
}

void require_matches(const Results& torch, const std::string& name, const std::vector<double>& ours,
                     double tol) {
  INFO(name);
  auto it = torch.find(name);
  REQUIRE(it != torch.end());
  const std::vector<double>& want = it->second;
  REQUIRE(ours.size() == want.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    INFO("element " << i << ": kiln " << ours[i] << ", torch " << want[i]);
    REQUIRE(std::fabs(ours[i] - want[i]) <= tol * (1 + std::fabs(want[i])));
  }
}

// Reproducible float64 values in [lo, hi).
Tensor uniform(const Shape& shape, uint64_t seed, double lo, double hi) {
  Generator gen(seed);
  return (rand(shape, DType::Float64, gen) * (hi - lo) + lo).eval();
}

// The loss and the gradient of its sum with respect to `x`, as trainapi_torch.py reports.
std::pair<std::vector<double>, std::vector<double>> value_and_grad(
    const std::function<Tensor(const Tensor&)>& loss, const Tensor& x_in) {
  Tensor x = x_in.detach();
  x.requires_grad_();
  Tensor y = loss(x);
  std::vector<double> g = kiln::grad(sum(y), {x})[0].to_vector<double>();
  return {y.to_vector<double>(), g};
}

// A JSON list of `v`, every digit kept.
std::string spec_list(const std::vector<double>& v) {
  std::ostringstream os;
  os.precision(17);
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

}  // namespace

TEST_CASE("kl_div, huber_loss and binary_cross_entropy match PyTorch", "[nn][loss][torch]") {
  if (skip_without_torch("loss")) return;
  StateDict in;
  // log-probabilities, a target with zeros, a log-target.
  in["kl_in"] = log(softmax(uniform({3, 4}, 1, -2, 2), 1)).eval();
  Tensor t = uniform({3, 4}, 2, 0, 1);
  in["kl_t"] = where(t < 0.25, 0.0, t).eval();
  in["kl_tl"] = uniform({3, 4}, 3, -3, 0);
  in["h_x"] = uniform({2, 5}, 4, -3, 3);
  in["h_y"] = uniform({2, 5}, 5, -1, 1);
  // Probabilities with exact 0 and 1 (the clamp), and interior ones for the gradients.
  in["b_x"] = from_vector<double>({0, 1, 0, 1, 0.2, 0.5, 0.9, 1e-60, 0.999, 0.3, 0.6, 0.1}, {4, 3});
  in["b_y"] = from_vector<double>({0, 1, 1, 0, 0, 1, 0.3, 1, 0, 0.5, 1, 0}, {4, 3});
  in["b_w"] = from_vector<double>({0.5, 2, 1}, {3});
  in["b_xi"] = uniform({4, 3}, 6, 0.05, 0.95);
  Results torch = test::torch_results("losses", in, "{}");
  REQUIRE_FALSE(torch.empty());
  const double tol = 1e-12;
  const std::pair<nn::KLDivReduction, const char*> kl_reductions[] = {
      {nn::KLDivReduction::None, "none"},
      {nn::KLDivReduction::Mean, "mean"},
      {nn::KLDivReduction::Sum, "sum"},
      {nn::KLDivReduction::BatchMean, "batchmean"}};
  for (bool log_target : {false, true}) {
    Tensor target = log_target ? in["kl_tl"] : in["kl_t"];
    for (auto [r, name] : kl_reductions) {
      auto [v, g] = value_and_grad(
          [&](const Tensor& x) {
            return nn::kl_div(x, target, {.reduction = r, .log_target = log_target});
          },
          in["kl_in"]);
      const std::string key = std::string("kl_") + name + "_" + (log_target ? "1" : "0");
      require_matches(torch, key, v, tol);
      require_matches(torch, key + "_grad", g, tol);
    }
  }
  const std::pair<nn::Reduction, const char*> reductions[] = {
      {nn::Reduction::None, "none"}, {nn::Reduction::Mean, "mean"}, {nn::Reduction::Sum, "sum"}};
  for (double delta : {0.5, 1.0, 2.0}) {
    for (auto [r, name] : reductions) {
      auto [v, g] = value_and_grad(
          [&](const Tensor& x) { return nn::huber_loss(x, in["h_y"], r, delta); }, in["h_x"]);
      // Python prints the delta as "0.5", "1.0", "2.0".
      const std::string key =
          std::string("huber_") + name + "_" + std::to_string(delta).substr(0, 3);
      require_matches(torch, key, v, tol);
      require_matches(torch, key + "_grad", g, tol);
    }
  }
  for (bool weighted : {false, true}) {
    Tensor w = weighted ? in["b_w"] : Tensor();
    for (auto [r, name] : reductions) {
      const std::string key = std::string("bce_") + name + "_" + (weighted ? "1" : "0");
      require_matches(torch, key,
                      nn::binary_cross_entropy(in["b_x"], in["b_y"], {.reduction = r, .weight = w})
                          .to_vector<double>(),
                      tol);
      auto [v, g] = value_and_grad(
          [&](const Tensor& x) {
            return nn::binary_cross_entropy(x, in["b_y"], {.reduction = r, .weight = w});
          },
          in["b_xi"]);
      require_matches(torch, key + "_grad", g, tol);
    }
  }
}

namespace {

// Two float64 parameters in two groups, trained on sum(w (p - t)^2) by kiln and by torch;
// every step's parameters must agree.
template <typename Optimizer, typename Options>
void check_optimizer(const char* name, const Options& group0, const Options& group1,
                     const std::string& json0, const std::string& json1,
                     const std::string& defaults = "{}") {
  INFO(name << " " << json0 << " " << json1);
  StateDict in;
  const Shape shapes[] = {{3, 2}, {4}};
  std::vector<Tensor> params, targets, weights;
  for (size_t i = 0; i < 2; ++i) {
    const std::string k = std::to_string(i);
    in["p." + k] = uniform(shapes[i], 10 + i, -1, 1);
    in["t." + k] = uniform(shapes[i], 20 + i, -1, 1);
    in["w." + k] = uniform(shapes[i], 30 + i, 0.5, 1.5);
    Tensor p = in["p." + k].detach().eval();
    p.requires_grad_();
    params.push_back(p);
  }
  const int steps = 6;
  const std::string spec = std::string("{\"optimizer\": \"") + name +
                           "\", \"steps\": " + std::to_string(steps) + ", \"groups\": [[[0], " +
                           json0 + "], [[1], " + json1 + "]], \"defaults\": " + defaults + "}";
  Results torch = test::torch_results("optim", in, spec);
  REQUIRE_FALSE(torch.empty());
  Optimizer opt({params[0]}, group0);
  opt.add_param_group({params[1]}, group1);
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    Tensor loss = sum(in["w.0"] * square(params[0] - in["t.0"])) +
                  sum(in["w.1"] * square(params[1] - in["t.1"]));
    loss.backward();
    opt.step();
    for (size_t i = 0; i < 2; ++i) {
      require_matches(torch, "step" + std::to_string(s) + ".p" + std::to_string(i),
                      params[i].to_vector<double>(), 1e-11);
    }
  }
}

}  // namespace

TEST_CASE("RMSprop and Adagrad match torch.optim step for step", "[optim][torch]") {
  if (skip_without_torch("optimizer")) return;
  check_optimizer<optim::RMSprop>(
      "RMSprop",
      optim::RMSpropOptions{
          .lr = 0.01, .alpha = 0.9, .weight_decay = 0.1, .momentum = 0.5, .centered = true},
      optim::RMSpropOptions{.lr = 0.02},
      R"({"lr": 0.01, "alpha": 0.9, "weight_decay": 0.1, "momentum": 0.5, "centered": true})",
      R"({"lr": 0.02})");
  check_optimizer<optim::RMSprop>("RMSprop",
                                  optim::RMSpropOptions{.lr = 0.005, .eps = 1e-4, .momentum = 0.9},
                                  optim::RMSpropOptions{.lr = 0.01, .alpha = 0.8, .centered = true},
                                  R"({"lr": 0.005, "eps": 1e-4, "momentum": 0.9})",
                                  R"({"lr": 0.01, "alpha": 0.8, "centered": true})");
  // torch.optim.Adagrad fills every group's accumulator from the constructor's
  // initial_accumulator_value (a group's own is ignored), so both groups share one here;
  // kiln honours a group's own value.
  check_optimizer<optim::Adagrad>(
      "Adagrad",
      optim::AdagradOptions{
          .lr = 0.1, .lr_decay = 0.05, .weight_decay = 0.1, .initial_accumulator_value = 0.2},
      optim::AdagradOptions{.lr = 0.3, .initial_accumulator_value = 0.2, .eps = 1e-6},
      R"({"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.1})", R"({"lr": 0.3, "eps": 1e-6})",
      R"({"initial_accumulator_value": 0.2})");
}

namespace {

// Every group's lr (and momentum, where torch reports one) after construction and after
// every step, against torch; `step(e)` steps the kiln scheduler for epoch e (1-based).
void check_schedule(const std::string& spec, optim::Optimizer& opt, int steps,
                    const std::function<void(int)>& step) {
  INFO(spec);
  Results torch = test::torch_results("sched", {}, spec);
  REQUIRE_FALSE(torch.empty());
  for (int e = 0; e <= steps; ++e) {
    if (e > 0) step(e);
    for (size_t g = 0; g < opt.num_param_groups(); ++g) {
      const std::string key = "step" + std::to_string(e);
      require_matches(torch, key + ".lr" + std::to_string(g), {opt.lr(g)}, 1e-9);
      auto m = torch.find(key + ".m" + std::to_string(g));
      if (m != torch.end()) require_matches(torch, m->first, {*opt.momentum(g)}, 1e-12);
    }
  }
}

struct Groups {
  Tensor a = zeros({1}), b = zeros({1});
  std::vector<double> lrs{1.0, 0.1};
  Groups() {
    a.requires_grad_();
    b.requires_grad_();
  }
  std::unique_ptr<optim::SGD> sgd(double momentum = 0) {
    auto opt = std::make_unique<optim::SGD>(std::vector<Tensor>{a},
                                            optim::SGDOptions{.lr = lrs[0], .momentum = momentum});
    opt->add_param_group({b}, {.lr = lrs[1], .momentum = momentum});
    return opt;
  }
};

// A spec for trainapi_torch.py's sched mode over SGD with lrs [1, 0.1].
std::string sched_spec(const std::string& scheduler, const std::string& kwargs, int steps,
                       const std::string& extra = "") {
  return "{\"scheduler\": \"" + scheduler + "\", \"optimizer\": \"SGD\", \"lrs\": [1.0, 0.1], " +
         "\"kwargs\": " + kwargs + ", \"steps\": " + std::to_string(steps) + extra + "}";
}

}  // namespace

TEST_CASE("the schedulers match torch.optim.lr_scheduler step for step", "[lr_scheduler][torch]") {
  if (skip_without_torch("scheduler")) return;
  {
    Groups g;
    auto opt = g.sgd();
    optim::MultiStepLR s(*opt, {5, 2, 5}, 0.5);
    check_schedule(sched_spec("MultiStepLR", R"({"milestones": [5, 2, 5], "gamma": 0.5})", 8), *opt,
                   8, [&](int) { s.step(); });
  }
  {
    Groups g;
    auto opt = g.sgd();
    optim::ExponentialLR s(*opt, 0.9);
    check_schedule(sched_spec("ExponentialLR", R"({"gamma": 0.9})", 6), *opt, 6,
                   [&](int) { s.step(); });
  }
  {
    Groups g;
    auto opt = g.sgd();
    // trainapi_torch.py's LambdaLR uses this function.
    optim::LambdaLR s(*opt, [](int64_t e) { return std::pow(0.5, e / 3) + 0.01 * e; });
    check_schedule(sched_spec("LambdaLR", "{}", 8), *opt, 8, [&](int) { s.step(); });
  }
  {
    Groups g;
    auto opt = g.sgd();
    optim::StepLR s(*opt, 3, 0.5);
    check_schedule(sched_spec("StepLR", R"({"step_size": 3, "gamma": 0.5})", 7), *opt, 7,
                   [&](int) { s.step(); });
  }
  {
    Groups g;
    auto opt = g.sgd();
    optim::CosineAnnealingLR s(*opt, 6, 0.01);
    check_schedule(sched_spec("CosineAnnealingLR", R"({"T_max": 6, "eta_min": 0.01})", 6), *opt, 6,
                   [&](int) { s.step(); });
  }
  {
    Groups g;
    auto opt = g.sgd();
    optim::LinearWarmup s(*opt, 4, 0.25, 0.75);
    check_schedule(sched_spec("LinearLR",
                              R"({"start_factor": 0.25, "end_factor": 0.75, "total_iters": 4})", 6),
                   *opt, 6, [&](int) { s.step(); });
  }
  using Anneal = optim::OneCycleLROptions::Anneal;
  for (bool three_phase : {false, true}) {
    for (Anneal anneal : {Anneal::Cos, Anneal::Linear}) {
      Groups g;
      auto opt = g.sgd(0.9);
      optim::OneCycleLR s(*opt, {1.0, 0.5}, 20,
                          {.pct_start = 0.25,
                           .anneal_strategy = anneal,
                           .div_factor = 10,
                           .final_div_factor = 100,
                           .three_phase = three_phase});
      const std::string kwargs =
          std::string(R"({"max_lr": [1.0, 0.5], "total_steps": 20, "pct_start": 0.25, )") +
          "\"anneal_strategy\": \"" + (anneal == Anneal::Cos ? "cos" : "linear") +
          "\", \"div_factor\": 10, \"final_div_factor\": 100, \"three_phase\": " +
          (three_phase ? "true" : "false") + "}";
      check_schedule(sched_spec("OneCycleLR", kwargs, 20, R"(, "options": {"momentum": 0.9})"),
                     *opt, 20, [&](int) { s.step(); });
    }
  }
  {
    // Adam: the cycled momentum is betas[0].
    Groups g;
    optim::Adam adam({g.a}, {.lr = 1.0});
    adam.add_param_group({g.b}, {.lr = 0.1});
    optim::OneCycleLR s(adam, 0.5, 10, {.base_momentum = 0.8, .max_momentum = 0.9});
    check_schedule(
        R"({"scheduler": "OneCycleLR", "optimizer": "Adam", "lrs": [1.0, 0.1], )"
        R"("kwargs": {"max_lr": 0.5, "total_steps": 10, "base_momentum": 0.8, "max_momentum": 0.9}, "steps": 10})",
        adam, 10, [&](int) { s.step(); });
  }
  const std::vector<double> metrics = {5,    4,    4.05, 4.0,  3.95, 3.9, 3.0, 3.1,
                                       2.95, 2.96, 2.97, 2.98, 1.0,  1.2, 1.3, 1.4};
  {
    Groups g;
    auto opt = g.sgd();
    optim::ReduceLROnPlateau s(
        *opt, {.factor = 0.5,
               .patience = 2,
               .threshold = 0.1,
               .threshold_mode = optim::ReduceLROnPlateauOptions::ThresholdMode::Abs,
               .cooldown = 1,
               .min_lrs = {0.2, 0.0}});
    check_schedule(
        sched_spec(
            "ReduceLROnPlateau",
            R"({"factor": 0.5, "patience": 2, "threshold": 0.1, "threshold_mode": "abs", "cooldown": 1, "min_lr": [0.2, 0.0]})",
            16, ", \"metrics\": " + spec_list(metrics)),
        *opt, 16, [&](int e) { s.step(metrics[static_cast<size_t>(e - 1)]); });
  }
  {
    Groups g;
    auto opt = g.sgd();
    std::vector<double> accuracy;
    for (double m : metrics) accuracy.push_back(1.0 / m);
    optim::ReduceLROnPlateau s(*opt, {.mode = optim::ReduceLROnPlateauOptions::Mode::Max,
                                      .factor = 0.3,
                                      .patience = 1,
                                      .threshold = 0.05});
    check_schedule(sched_spec("ReduceLROnPlateau",
                              R"({"mode": "max", "factor": 0.3, "patience": 1, "threshold": 0.05})",
                              16, ", \"metrics\": " + spec_list(accuracy)),
                   *opt, 16, [&](int e) { s.step(accuracy[static_cast<size_t>(e - 1)]); });
  }
}
