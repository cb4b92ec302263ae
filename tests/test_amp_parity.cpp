// Autocast against PyTorch: the same MLP, weights, data and optimizer trained for a few
// steps under kiln::amp::autocast (bfloat16) and under torch.autocast("cpu",
// torch.bfloat16) give the same losses within 1e-2 relative. Runs where the Python of
// tests/python_support.h imports torch (scripts/setup_torch.sh installs it), and WARNs that
// it is skipped otherwise.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "python_support.h"
#include "test_files.h"

using namespace kiln;

namespace {

constexpr int kSteps = 5;
constexpr double kLr = 0.1, kMomentum = 0.9;

// From the source tree's root: __FILE__ may be relative to the build directory (ccache's
// CCACHE_BASEDIR rewrites it).
std::string parity_script() { return std::string(KILN_SOURCE_DIR) + "/tests/amp_parity_torch.py"; }

// The losses amp_parity_torch.py prints for `path`, in step order; empty when it failed.
std::vector<double> torch_losses(const std::string& path, const test::TempDir& dir) {
  // Its own cache and home for anything PyTorch might write: nothing under ~/.cache.
  const std::string cmd = "XDG_CACHE_HOME=" + dir.file("xdg") + " TORCH_HOME=" + dir.file("torch") +
                          " " + test::python3() + " " + parity_script() + " " + path + " " +
                          std::to_string(kSteps) + " " + std::to_string(kLr) + " " +
                          std::to_string(kMomentum) + " 2>&1";
  std::vector<double> losses;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return losses;
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    int step = -1;
    double loss = 0;
    if (std::sscanf(line, "LOSS %d %lf", &step, &loss) == 2 &&
        step == static_cast<int>(losses.size()))
      losses.push_back(loss);
    else
      UNSCOPED_INFO("amp_parity_torch.py: " << line);
  }
  if (pclose(p) != 0) losses.clear();
  return losses;
}

}  // namespace

TEST_CASE("bfloat16 autocast training matches torch.autocast step for step", "[amp][torch]") {
  if (!test::python_has("torch")) {
    WARN("autocast parity with PyTorch skipped: "
         << test::python3() << " cannot import torch (scripts/setup_torch.sh)");
    return;
  }
  manual_seed(3);
  auto model =
      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
          std::make_shared<nn::Linear>(24, 48), std::make_shared<nn::ReLU>(),
          std::make_shared<nn::Linear>(48, 7)});
  Tensor x = randn({96, 24}).eval();
  Tensor y = randint(0, 7, {96}).eval();
  test::TempDir dir("kiln_amp_parity");
  StateDict saved = model->state_dict();
  saved["x"] = x;
  saved["y"] = y;
  const std::string path = dir.file("start.safetensors");
  save_safetensors(path, saved);

  optim::SGD opt(model->parameters(), {.lr = kLr, .momentum = kMomentum});
  std::vector<double> ours;
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    Tensor loss;
    {
      amp::autocast scope(Device::cpu(), DType::BFloat16);
      Tensor logits = model->forward(x);
      REQUIRE(logits.dtype() == DType::BFloat16);
      loss = nn::cross_entropy(logits, y);
    }
    REQUIRE(loss.dtype() == DType::Float32);
    loss.backward();
    opt.step();
    ours.push_back(loss.item<double>());
  }

  const std::vector<double> theirs = torch_losses(path, dir);
  REQUIRE(theirs.size() == static_cast<size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step << ": kiln " << ours[step] << ", PyTorch " << theirs[step]);
    CHECK(std::abs(ours[step] - theirs[step]) <= 1e-2 * std::abs(theirs[step]));
  }
  // The run learns (the comparison is not of five equal numbers).
  CHECK(theirs.back() < 0.97 * theirs.front());
}
