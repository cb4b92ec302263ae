#pragma once
// Helpers shared by the nn tests: float64 views of tensors, closeness checks that name the
// first mismatch, an executor guard, and a central-difference gradient check.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "frontend/nn/nn.h"

namespace nn_test {

using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

inline std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

/// A constant tensor of `dtype` holding `v`.
inline Tensor make(const std::vector<double>& v, const Shape& shape, DType dtype = DType::Float32) {
  return kiln::cast(kiln::from_vector<double>(v, shape), dtype);
}

/// Reproducible values in [-1, 1) (never all zero), from the kiln generator.
inline std::vector<double> random_values(int64_t n, uint64_t seed) {
  kiln::Generator g(seed);
  return (kiln::rand({n}, DType::Float64, g) * 2.0 - 1.0).to_vector<double>();
}

/// "" when |got - want| <= atol + rtol * |want| everywhere; otherwise the first mismatch.
inline std::string mismatch(const std::vector<double>& got, const std::vector<double>& want,
                            double atol, double rtol) {
  if (got.size() != want.size()) {
    return "size " + std::to_string(got.size()) + " vs expected " + std::to_string(want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    if (!both_nan && !(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]))) {
      std::ostringstream os;
      os.precision(10);
      os << "element " << i << ": got " << got[i] << ", expected " << want[i];
      return os.str();
    }
  }
  return "";
}

#define NN_REQUIRE_CLOSE(got, want, atol, rtol) \
  REQUIRE(nn_test::mismatch((got), (want), (atol), (rtol)) == "")

/// Restores the executor when a test that changes it ends, even by an exception.
struct ExecutorGuard {
  std::string saved = kiln::current_executor();
  explicit ExecutorGuard(const char* use) { kiln::set_executor(use); }
  ~ExecutorGuard() { kiln::set_executor(saved.c_str()); }
};

/// Compares kiln::grad of `loss()` with respect to `params` (float64 leaves) with central
/// differences of step `eps` on every element (at most `max_per_param` spread over each
/// tensor). Runs on the reference executor. Returns "" or the first disagreement.
inline std::string gradient_check(const std::function<Tensor()>& loss, std::vector<Tensor> params,
                                  double tol = 1e-6, double eps = 1e-6,
                                  int64_t max_per_param = 40) {
  ExecutorGuard reference("reference");
  std::vector<Tensor> analytic = kiln::grad(loss(), params);
  for (size_t p = 0; p < params.size(); ++p) {
    Tensor& param = params[p];
    if (param.dtype() != DType::Float64)
      return "parameter " + std::to_string(p) + " is not float64";
    std::vector<double> base = values(param);
    std::vector<double> g = values(analytic[p]);
    int64_t n = static_cast<int64_t>(base.size());
    int64_t step = std::max<int64_t>(1, n / max_per_param);
    for (int64_t i = 0; i < n; i += step) {
      auto at = [&](double delta) {
        std::vector<double> v = base;
        v[static_cast<size_t>(i)] += delta;
        kiln::NoGradGuard no_grad;
        param.assign(make(v, param.shape(), DType::Float64));
        return loss().item<double>();
      };
      double numeric = (at(eps) - at(-eps)) / (2 * eps);
      if (std::fabs(numeric - g[static_cast<size_t>(i)]) > tol * (1 + std::fabs(numeric))) {
        std::ostringstream os;
        os.precision(10);
        os << "parameter " << p << " element " << i << ": analytic " << g[static_cast<size_t>(i)]
           << ", numeric " << numeric;
        param.assign(make(base, param.shape(), DType::Float64));
        return os.str();
      }
    }
    kiln::NoGradGuard no_grad;
    param.assign(make(base, param.shape(), DType::Float64));
  }
  return "";
}

/// Plain SGD written out: p <- p - lr * grad, then clears the gradients.
inline void sgd_step(const std::vector<Tensor>& params, double lr) {
  kiln::NoGradGuard no_grad;
  for (Tensor p : params) {
    if (!p.grad().defined()) continue;
    p.assign(p - p.grad() * lr);
    p.set_grad(Tensor());
  }
}

/// A row-major float64 matrix, for the host references of the recurrent layers.
using Matrix = std::vector<double>;

/// out[r, o] = sum_k x[r, k] w[o, k] + b[o] for x [rows, in], w [out, in] (b may be empty).
inline Matrix affine(const Matrix& x, int64_t rows, int64_t in, const Matrix& w, const Matrix& b,
                     int64_t out) {
  Matrix y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b[static_cast<size_t>(o)];
      for (int64_t k = 0; k < in; ++k)
        acc += x[static_cast<size_t>(r * in + k)] * w[static_cast<size_t>(o * in + k)];
      y[static_cast<size_t>(r * out + o)] = acc;
    }
  return y;
}

/// The logistic function in float64.
inline double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

}  // namespace nn_test
