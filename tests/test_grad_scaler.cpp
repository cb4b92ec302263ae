// GradScaler (frontend/amp.h): PyTorch's loss-scaling semantics, checked against a float64
// model of them, and skipped steps that leave parameters and optimizer state bit-identical.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "frontend/kiln.h"

using namespace kiln;

namespace {

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

}  // namespace

TEST_CASE("GradScaler scales the loss, unscales gradients and steps like an unscaled step",
          "[amp][optim]") {
  // The same SGD step with and without a scaler (a power-of-two scale is exact): equal
  // parameters afterwards.
  auto run = [](bool scaled) {
    manual_seed(2);
    nn::Linear lin(6, 3);
    Tensor x = randn({8, 6}), y = randn({8, 3});
    optim::SGD opt(lin.parameters(), {.lr = 0.1, .momentum = 0.9});
    amp::GradScaler scaler({.init_scale = 1024.0});
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      Tensor loss = nn::mse_loss(lin.forward(x), y);
      (scaled ? scaler.scale(loss) : loss).backward();
      if (scaled) {
        CHECK(scaler.step(opt));
        scaler.update();
      } else {
        opt.step();
      }
    }
    std::vector<double> out;
    for (const Tensor& p : lin.parameters()) {
      std::vector<double> v = values(p);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  const std::vector<double> a = run(true), b = run(false);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(std::abs(a[i] - b[i]) <= 1e-6 * (1 + std::abs(b[i])));
}

TEST_CASE("a step with an inf or NaN gradient is skipped bit for bit and the scale backs off",
          "[amp][optim]") {
  for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    INFO("bad value " << bad);
    manual_seed(3);
    Tensor w = randn({4, 4});
    w.requires_grad_(true);
    optim::Adam opt({w}, {.lr = 0.01});
    amp::GradScaler scaler;
    // One good step first, so Adam has state to keep.
    (scaler.scale(sum(w * w))).backward();
    CHECK(scaler.step(opt));
    scaler.update();
    const std::vector<double> w_before = values(w);
    const StateDict state_before = opt.state_dict();
    std::map<std::string, std::vector<double>> state_values;
    for (const auto& [k, t] : state_before) state_values[k] = values(t);
    opt.zero_grad();
    Tensor poison = full({4, 4}, 1.0);
    poison = where(eq(reshape(arange(0, 16), {4, 4}), 5), full({4, 4}, bad), poison);
    scaler.scale(sum(w * poison)).backward();
    CHECK_FALSE(scaler.step(opt));
    scaler.update();
    CHECK(scaler.get_scale() == 65536.0 * 0.5);
    CHECK(scaler.growth_tracker() == 0);
    const std::vector<double> w_after = values(w);
    for (size_t i = 0; i < w_after.size(); ++i)
      CHECK(std::memcmp(&w_after[i], &w_before[i], sizeof(double)) == 0);
    const StateDict state_after = opt.state_dict();
    REQUIRE(state_after.size() == state_values.size());
    for (const auto& [k, t] : state_after) {
      INFO(k);
      const std::vector<double> v = values(t);
      REQUIRE(v.size() == state_values[k].size());
      for (size_t i = 0; i < v.size(); ++i)
        CHECK(std::memcmp(&v[i], &state_values[k][i], sizeof(double)) == 0);
    }
  }
}

TEST_CASE("GradScaler's scale follows PyTorch's growth and backoff schedule", "[amp][optim]") {
  // A float64 model of torch.amp.GradScaler.update() over a random pattern of good and bad
  // steps, growth_interval 3.
  manual_seed(4);
  Tensor w = randn({3});
  w.requires_grad_(true);
  optim::SGD opt({w}, {.lr = 0.0});
  amp::GradScaler scaler(
      {.init_scale = 8.0, .growth_factor = 2.0, .backoff_factor = 0.25, .growth_interval = 3});
  double scale = 8.0;
  int64_t tracker = 0;
  const std::vector<bool> bad = {false, false, false, true,  false, false, false,
                                 false, true,  true,  false, false, false};
  for (bool b : bad) {
    opt.zero_grad();
    Tensor factor = full({3}, b ? std::numeric_limits<double>::infinity() : 1.0);
    scaler.scale(sum(w * factor)).backward();
    CHECK(scaler.step(opt) == !b);
    scaler.update();
    if (b) {
      scale *= 0.25, tracker = 0;
    } else if (++tracker == 3) {
      scale *= 2.0, tracker = 0;
    }
    CHECK(scaler.get_scale() == scale);
    CHECK(scaler.growth_tracker() == tracker);
  }
  // state_dict round trip into a fresh scaler.
  amp::GradScaler other;
  other.load_state_dict(scaler.state_dict());
  CHECK(other.get_scale() == scaler.get_scale());
  CHECK(other.growth_tracker() == scaler.growth_tracker());
}

TEST_CASE("GradScaler refuses misuse with messages, and passes through when disabled",
          "[amp][optim][errors]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(amp::GradScaler({.init_scale = 0.0}), Contains("[GradScaler] the scale"));
  CHECK_THROWS_WITH(amp::GradScaler({.growth_factor = 1.0}), Contains("growth_factor"));
  CHECK_THROWS_WITH(amp::GradScaler({.backoff_factor = 1.5}), Contains("backoff_factor"));
  CHECK_THROWS_WITH(amp::GradScaler({.growth_interval = 0}), Contains("growth_interval"));
  Tensor w = ones({2});
  w.requires_grad_(true);
  optim::SGD opt({w}, {.lr = 0.5});
  amp::GradScaler scaler;
  scaler.scale(sum(w)).backward();
  scaler.unscale_(opt);
  CHECK_THROWS_WITH(scaler.unscale_(opt), Contains("already been called"));
  // The unscaled gradient: d(sum(w))/dw = 1 after dividing by the scale.
  for (double g : values(w.grad())) CHECK(g == 1.0);
  CHECK(scaler.step(opt));
  scaler.update();
  CHECK_THROWS_WITH(scaler.update(), Contains("update() without a step()"));
  StateDict broken = scaler.state_dict();
  broken.erase("scale");
  CHECK_THROWS_WITH(scaler.load_state_dict(broken), Contains("'scale'"));
  amp::GradScaler off({.enabled = false});
  Tensor loss = sum(w);
  CHECK(off.scale(loss).node() == loss.node());
  CHECK(off.get_scale() == 1.0);
  CHECK(off.state_dict().empty());
}
