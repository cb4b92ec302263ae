// Tensors on CUDA devices through the frontend: placement rules that hold with or without a
// GPU ([device]), and JIT-on-GPU results against the reference evaluator on the CPU
// ([cuda], skipped with a visible message where no device is present). The differential
// corpus on the GPU is in test_differential.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "core/cuda_driver.h"
#include "frontend/kiln.h"
#include "jit/executor.h"
#include "memory/memory.h"

using kiln::Device;
using kiln::DType;
using kiln::Tensor;

namespace {

bool have_gpu() { return kiln::cuda::device_count() > 0; }

#define KILN_REQUIRE_GPU()                                                     \
  do {                                                                         \
    if (!have_gpu()) {                                                         \
      WARN("SKIPPED: no CUDA device (" << kiln::cuda::driver_status() << ")"); \
      return;                                                                  \
    }                                                                          \
  } while (0)

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -2.f, float hi = 2.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

/// Evaluates `make` on the CPU with the reference evaluator and on cuda:0 with the jit
/// (inputs built by `make` from the default device) and compares within `rel`.
void check_against_reference(const std::function<Tensor()>& make, double rel, double abs_tol) {
  kiln::set_executor("reference");
  Tensor want = make();
  std::vector<double> w = want.to_vector<double>();
  kiln::set_executor("");
  kiln::set_default_device(Device::cuda(0));
  Tensor got;
  try {
    got = make();
  } catch (...) {
    kiln::set_default_device(Device::cpu());
    throw;
  }
  kiln::set_default_device(Device::cpu());
  REQUIRE(got.device() == Device::cuda(0));
  REQUIRE(got.shape() == want.shape());
  std::vector<double> g = got.to_vector<double>();
  for (size_t i = 0; i < w.size(); ++i) {
    INFO("element " << i);
    if (std::isnan(w[i])) {
      CHECK(std::isnan(g[i]));
    } else {
      CHECK(std::fabs(g[i] - w[i]) <= abs_tol + rel * std::fabs(w[i]));
    }
  }
}

}  // namespace

TEST_CASE(
    "device: without a CUDA device, asking for one raises DeviceError and the cpu is unaffected",
    "[device]") {
  if (have_gpu()) {
    SUCCEED("a CUDA device is present; the no-device behaviour is not observable here");
    return;
  }
  Tensor x = kiln::from_vector<float>({1, 2, 3});
  try {
    (void)x.to(Device::cuda(0));
    FAIL("to(cuda:0) did not throw");
  } catch (const kiln::DeviceError& e) {
    std::string m = e.what();
    CHECK(m.find("cuda:0") != std::string::npos);
    CHECK(m.find("[to]") != std::string::npos);
    CHECK(m.find(kiln::cuda::driver_status()) != std::string::npos);
  }
  CHECK_THROWS_AS(kiln::zeros({2}, DType::Float32, Device::cuda(0)), kiln::DeviceError);
  CHECK_THROWS_AS(kiln::set_default_device(Device::cuda(0)), kiln::DeviceError);
  CHECK(kiln::default_device() == Device::cpu());
  CHECK((x * 2).to_vector<float>() == std::vector<float>{2, 4, 6});
}

TEST_CASE(
    "device: to(cpu) on a cpu tensor is the same tensor, and data-free values follow their "
    "consumer",
    "[device]") {
  Tensor x = kiln::from_vector<float>({1, 2, 3});
  Tensor same = x.to(Device::cpu());
  CHECK(same.node() == x.node());
  // A scalar operand is built on the default device and still combines with any tensor.
  CHECK((x + 1.5).device() == Device::cpu());
  CHECK((x + 1.5).to_vector<float>() == std::vector<float>{2.5f, 3.5f, 4.5f});
  // A pending fill placed on cuda:0 (made by hand, so no GPU is needed) has no data: used
  // with a cpu tensor it is built on the cpu, while a constant there is an error.
  auto on_gpu = [](kiln::OpCode op) {
    auto n = std::make_shared<kiln::Node>(op, std::vector<kiln::NodePtr>{}, kiln::Shape{3},
                                          DType::Float32, Device::cuda(0));
    n->scalar = 2.0;
    return Tensor(n);
  };
  Tensor fill = on_gpu(kiln::OpCode::Full);
  Tensor sum = x + fill + fill;
  CHECK(sum.device() == Device::cpu());
  CHECK(sum.to_vector<float>() == std::vector<float>{5, 6, 7});
  CHECK(fill.device() == Device::cuda(0));  // the user's tensor is not moved
  CHECK_THROWS_AS(x + on_gpu(kiln::OpCode::Constant), kiln::DeviceError);
}

TEST_CASE("cuda: transfers round-trip every dtype bit for bit", "[cuda]") {
  KILN_REQUIRE_GPU();
  std::vector<float> v = random_floats(1000, 1);
  for (DType d : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int32,
                  DType::Int64, DType::Int8, DType::UInt8, DType::Int16, DType::Bool}) {
    INFO("dtype " << kiln::dtype_name(d));
    Tensor host = kiln::cast(kiln::from_vector<float>(v) * 50, d).eval();
    Tensor dev = host.to(Device::cuda(0));
    CHECK(dev.device() == Device::cuda(0));
    Tensor back = dev.to(Device::cpu());
    CHECK(back.to_vector<double>() == host.to_vector<double>());
    CHECK(dev.to_vector<double>() == host.to_vector<double>());
  }
}

TEST_CASE("cuda: fused elementwise, reductions and scatters match the reference", "[cuda]") {
  KILN_REQUIRE_GPU();
  auto a = random_floats(37 * 53, 2), b = random_floats(53, 3);
  for (DType d : {DType::Float32, DType::Float16, DType::BFloat16}) {
    INFO("dtype " << kiln::dtype_name(d));
    double rel = d == DType::Float32 ? 1e-5 : d == DType::Float16 ? 2e-3 : 2e-2;
    auto in = [&](const std::vector<float>& v, kiln::Shape s) {
      return kiln::cast(kiln::from_vector<float>(v, s), d);
    };
    check_against_reference(
        [&] {
          return kiln::relu(in(a, {37, 53}) * in(b, {53}) + 0.5) * kiln::tanh(in(b, {53}));
        },
        rel, 1e-6);
    check_against_reference([&] { return kiln::sum(in(a, {37, 53}), {1}); }, rel * 10, 1e-4);
    check_against_reference([&] { return kiln::softmax(in(a, {37, 53}), 1); }, rel * 10, 1e-6);
    check_against_reference([&] { return kiln::sum(kiln::exp(in(a, {37, 53}))); }, rel * 10, 1e-3);
    check_against_reference([&] { return kiln::max(in(a, {37, 53}), {0}); }, 0, 0);
  }
  // A scatter (embedding-style gradient: index_add over repeated rows).
  check_against_reference(
      [&] {
        Tensor w = kiln::zeros({10, 53});
        Tensor idx = kiln::from_vector<int64_t>({1, 3, 3, 9, 0, 1, 1}, {7});
        Tensor src =
            kiln::from_vector<float>(std::vector<float>(a.begin(), a.begin() + 7 * 53), {7, 53});
        Tensor index = kiln::broadcast_to(kiln::reshape(idx, {7, 1}), {7, 53});
        return kiln::scatter_add(w, 0, index, src);
      },
      1e-6, 1e-6);
}

TEST_CASE("cuda: random numbers are the same bits on cuda and cpu", "[cuda]") {
  KILN_REQUIRE_GPU();
  kiln::Generator g1(1234), g2(1234);
  Tensor cpu = kiln::randn({4096}, DType::Float32, g1);
  Tensor gpu = kiln::randn({4096}, DType::Float32, g2, Device::cuda(0));
  std::vector<float> a = cpu.to_vector<float>(), b = gpu.to_vector<float>();
  size_t close = 0;
  for (size_t i = 0; i < a.size(); ++i)
    close += std::fabs(a[i] - b[i]) <= 1e-5f * (1 + std::fabs(a[i]));
  CHECK(close == a.size());  // Box-Muller's log/cos round per device; uniforms are exact:
  kiln::Generator g3(5), g4(5);
  CHECK(kiln::rand({4096}, DType::Float32, g3).to_vector<float>() ==
        kiln::rand({4096}, DType::Float32, g4, Device::cuda(0)).to_vector<float>());
}

TEST_CASE("cuda: an out-of-range gather raises IndexError and the device stays usable", "[cuda]") {
  KILN_REQUIRE_GPU();
  Tensor x = kiln::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}, Device::cuda(0));
  Tensor bad =
      kiln::gather(x, 1, kiln::from_vector<int64_t>({0, 3, 1, 2}, {2, 2}, Device::cuda(0)));
  CHECK_THROWS_AS(bad.eval(), kiln::IndexError);
  CHECK((x * 2).to_vector<float>() == std::vector<float>{2, 4, 6, 8, 10, 12});
}

TEST_CASE("cuda: matmuls run on cuBLAS for f32/f16/bf16 and match a float64 product", "[cuda]") {
  KILN_REQUIRE_GPU();
  const int64_t m = 67, k = 129, n = 45;
  auto a = random_floats(static_cast<size_t>(m * k), 4),
       b = random_floats(static_cast<size_t>(k * n), 5);
  std::vector<double> want(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        want[static_cast<size_t>(i * n + j)] +=
            static_cast<double>(a[static_cast<size_t>(i * k + p)]) *
            b[static_cast<size_t>(p * n + j)];
  for (DType d : {DType::Float32, DType::Float16, DType::BFloat16}) {
    INFO("dtype " << kiln::dtype_name(d));
    Tensor A = kiln::cast(kiln::from_vector<float>(a, {m, k}, Device::cuda(0)), d);
    Tensor B = kiln::cast(kiln::from_vector<float>(b, {k, n}, Device::cuda(0)), d);
    A.eval();
    B.eval();
    Tensor C = kiln::matmul(A, B);
    C.eval();
    // cuBLAS reads half operands as they are (tensor cores, float32 sums) and rounds the
    // result as it stores it: the GEMM alone, no widening or rounding kernel.
    const kiln::jit::EvalStats s = kiln::jit::last_eval_stats();
    CHECK(s.library_calls == 1);
    CHECK(s.kernels == 0);
    std::vector<double> got = C.to_vector<double>();
    // Inputs are rounded to d first; the bound covers that and the f32 accumulation.
    double tol = d == DType::Float32 ? 1e-3 : d == DType::Float16 ? 0.1 : 0.6;
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i);
      CHECK(std::fabs(got[i] - want[i]) <= tol * std::sqrt(static_cast<double>(k)) * 0.2 + tol);
    }
  }
}

namespace {

// The MLP of the training-step cases on `device`, seeded, with its batch.
struct SmallMlp {
  std::shared_ptr<kiln::nn::Sequential> net;
  Tensor x, y;
};
SmallMlp small_mlp(Device device) {
  kiln::manual_seed(7);
  namespace nn = kiln::nn;
  SmallMlp m;
  m.net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
      std::make_shared<nn::Linear>(32, 64), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(64, 10)});
  m.net->to(device);
  m.x = kiln::from_vector<float>(random_floats(16 * 32, 9), {16, 32}, device);
  m.y = kiln::from_vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5}, {16}, device);
  return m;
}

}  // namespace

TEST_CASE("cuda: an MLP training step on cuda:0 matches the same step on the cpu", "[cuda]") {
  KILN_REQUIRE_GPU();
  auto run = [](Device device) {
    auto [net, x, y] = small_mlp(device);
    kiln::optim::Adam opt(net->parameters(), {.lr = 1e-2});
    std::vector<double> losses;
    for (int step = 0; step < 5; ++step) {
      opt.zero_grad();
      Tensor loss = kiln::nn::cross_entropy(net->forward(x), y);
      loss.backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  std::vector<double> cpu = run(Device::cpu()), gpu = run(Device::cuda(0));
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO("step " << i);
    CHECK(std::fabs(cpu[i] - gpu[i]) <= 1e-4 * (1 + std::fabs(cpu[i])));
  }
  CHECK(gpu.back() < gpu.front());
}

TEST_CASE("cuda: a float16 autocast MLP step with a GradScaler tracks float32 on the cpu",
          "[cuda][amp]") {
  KILN_REQUIRE_GPU();
  // CUDA's autocast default is float16: products on cuBLAS's tensor cores with half operands
  // and rounded half results, the loss in float32, gradients scaled by 2^16 and unscaled in
  // the update. Tolerance: float16 rounds each product's operands and result (~1e-3
  // relative), over five steps.
  auto run = [](Device device, bool amp_on) {
    auto [net, x, y] = small_mlp(device);
    kiln::optim::Adam opt(net->parameters(), {.lr = 1e-2});
    kiln::amp::GradScaler scaler({.enabled = amp_on});
    std::vector<double> losses;
    for (int step = 0; step < 5; ++step) {
      opt.zero_grad();
      Tensor loss;
      {
        kiln::amp::autocast scope(device, {}, amp_on);
        loss = kiln::nn::cross_entropy(net->forward(x), y);
      }
      scaler.scale(loss).backward();
      CHECK(scaler.step(opt));
      scaler.update();
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  const std::vector<double> cpu = run(Device::cpu(), false), gpu = run(Device::cuda(0), true);
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO("step " << i << ": cpu float32 " << cpu[i] << ", cuda float16 autocast " << gpu[i]);
    CHECK(std::fabs(cpu[i] - gpu[i]) <= 1e-2 * (1 + std::fabs(cpu[i])));
  }
  CHECK(gpu.back() < gpu.front());
}

TEST_CASE(
    "cuda: results are unchanged when a small device memory limit forces buffers to host memory",
    "[cuda]") {
  KILN_REQUIRE_GPU();
  auto chain = [](Device device) {
    std::vector<Tensor> kept;
    Tensor x = kiln::from_vector<float>(random_floats(1 << 20, 11), {1 << 20}, device);
    for (int i = 0; i < 12; ++i) {
      x = kiln::tanh(x * 1.01 + 0.1).eval();
      kept.push_back(x);  // 12 x 4 MiB held: more than the limit below
    }
    double total = 0;
    for (const Tensor& t : kept) total += kiln::sum(t).item<double>();
    return total;
  };
  double want = chain(Device::cpu());
  kiln::memory::set_device_memory_limit(0, 24u << 20);
  double got = 0;
  try {
    got = chain(Device::cuda(0));
  } catch (...) {
    kiln::memory::set_device_memory_limit(0, 0);
    throw;
  }
  kiln::memory::set_device_memory_limit(0, 0);
  CHECK(std::fabs(got - want) <= 1e-3 * std::fabs(want) + 1e-3);
}
