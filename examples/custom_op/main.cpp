// Extending kiln without forking it (docs/extending.md): a custom autograd function whose
// backward is built from ops, and a custom C++ kernel with a gradient, both trained by the
// ordinary optimizer loop. Run with `build/examples/custom_op`.
#include <kiln/kiln.h>

#include <cmath>
#include <functional>
#include <iostream>

#include "common/flags.h"

namespace {

using kiln::Tensor;
using kiln::autograd::AutogradContext;

// softsign(x) = x / (1 + |x|), with the gradient 1 / (1 + |x|)^2 written by hand (the
// composition would keep abs's sign for the backward pass; this keeps only x).
struct Softsign : kiln::autograd::Function<Softsign> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x / (1.0f + kiln::abs(x));
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grad_outputs) {
    Tensor x = ctx->get_saved_variables()[0];
    Tensor d = 1.0f + kiln::abs(x);
    return {grad_outputs[0] / (d * d)};
  }
};

// The same function as a C++ kernel compiled by kiln's JIT; its gradient as kiln ops.
kiln::CustomKernel softsign_kernel() {
  kiln::CustomKernelSpec spec;
  spec.name = "softsign";
  spec.inputs = {"x"};
  spec.outputs = {"y"};
  spec.header = "static inline float magnitude(float v) { return v < 0 ? -v : v; }";
  spec.cpu_source = R"(
    for (long long i = 0; i < x_numel; ++i) y[i] = x[i] / (1.0f + magnitude(x[i]));
  )";
  spec.cuda_source = R"(
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < x_numel) y[i] = x[i] / (1.0f + magnitude(x[i]));
  )";
  return kiln::CustomKernel(spec, [](const std::vector<Tensor>& inputs, const std::vector<Tensor>&,
                                     const std::vector<Tensor>& grad_outputs) {
    Tensor d = 1.0f + kiln::abs(inputs[0]);
    return std::vector<Tensor>{grad_outputs[0] / (d * d)};
  });
}

// Fits y = softsign(w * x + b) to targets made with w = 2, b = -0.5, once per activation.
double fit(const char* label, const std::function<Tensor(const Tensor&)>& activation, int steps) {
  using namespace kiln;
  manual_seed(1);
  Tensor x = randn({256, 1});
  Tensor target = (x * 2.0f - 0.5f) / (1.0f + abs(x * 2.0f - 0.5f));
  Tensor w = zeros({1, 1}).requires_grad_();
  Tensor b = zeros({1}).requires_grad_();
  optim::SGDOptions options;
  options.lr = 0.5;
  optim::SGD opt({w, b}, options);
  double loss_value = 0;
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    Tensor y = activation(matmul(x, w) + b);
    Tensor loss = mean((y - target) * (y - target));
    loss.backward();
    opt.step();
    loss_value = loss.item<double>();
  }
  std::cout << label << ": loss " << loss_value << ", w " << w.item<float>() << ", b "
            << b.item<float>() << " (target w 2, b -0.5)\n";
  return loss_value;
}

int run(const example::Flags& flags) {
  const int steps = static_cast<int>(flags.integer("steps"));
  const double a = fit(
      "autograd::Function", [](const Tensor& t) { return Softsign::apply(t); }, steps);
  kiln::CustomKernel kernel = softsign_kernel();
  const double b = fit(
      "CustomKernel      ",
      [&](const Tensor& t) {
        return kernel({t}, {{t.shape(), t.dtype()}})[0];
      },
      steps);
  for (const kiln::jit::KernelRecord& r : kiln::jit::kernel_records())
    if (r.name == "kiln_custom_softsign")
      std::cout << "kernel " << r.name << " (cache key " << r.key << "): " << r.launches
                << " launches, compiled in " << r.compile_ms << " ms\n";
  // Both spell the same function: the fits agree.
  return std::fabs(a - b) <= 1e-6 * (1 + std::fabs(a)) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags("custom_op",
                       "Fits softsign(w*x + b) twice: with a custom autograd function and with a "
                       "custom C++ kernel compiled by kiln's JIT (docs/extending.md).");
  flags.add("steps", "200", "optimizer steps per fit");
  return flags.main(argc, argv, run);
}
