#include "linear.h"

#include <cmath>

#include "../../ops/shape_ops.h"
#include "../../ops/sources.h"
#include "detail.h"
#include "init.h"

namespace kiln::nn {

using detail::describe;
using detail::require_layer_input;
using detail::require_positive;

Linear::Linear(int64_t in, int64_t out, bool with_bias)
    : UnaryModule("Linear"), in_features(in), out_features(out) {
  require_positive(in, name(), "in_features");
  require_positive(out, name(), "out_features");
  // kaiming_uniform(a = sqrt(5)) reduces to U(-1/sqrt(in), 1/sqrt(in)), the bias's bound too.
  double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight = register_parameter("weight", init::uniform({out, in}, -bound, bound));
  if (with_bias) bias = register_parameter("bias", init::uniform({out}, -bound, bound));
}

Tensor Linear::forward(const Tensor& x) {
  require_layer_input(x, name(), weight.dtype());
  if (x.ndim() < 1 || x.size(-1) != in_features) {
    throw ShapeError("[Linear] expected input with last dimension " + std::to_string(in_features) +
                     " (in_features), got " + describe(x));
  }
  return linear(x, weight, bias);
}

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(in_features) +
         ", out_features=" + std::to_string(out_features) +
         ", bias=" + (bias.defined() ? "true" : "false");
}

Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> pad)
    : UnaryModule("Embedding"),
      num_embeddings(num),
      embedding_dim(dim),
      padding_idx(pad && *pad < 0 ? std::optional<int64_t>(*pad + num) : pad) {
  require_positive(num, name(), "num_embeddings");
  require_positive(dim, name(), "embedding_dim");
  if (padding_idx && (*padding_idx < 0 || *padding_idx >= num)) {
    throw ValueError("[Embedding] padding_idx " + std::to_string(*pad) + " must be within [-" +
                     std::to_string(num) + ", " + std::to_string(num) + ")");
  }
  Tensor w = init::normal({num, dim});
  if (padding_idx) w = where(unsqueeze(arange(num) == *padding_idx, 1), 0.0f, w);
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& indices) {
  detail::require_defined(indices, name(), "indices");
  if (!is_integer(indices.dtype())) {
    throw DTypeError("[Embedding] expected integer indices, got " + describe(indices));
  }
  return F::embedding(indices, weight, padding_idx);
}

std::string Embedding::extra_repr() const {
  std::string s = std::to_string(num_embeddings) + ", " + std::to_string(embedding_dim);
  if (padding_idx) s += ", padding_idx=" + std::to_string(*padding_idx);
  return s;
}

Dropout::Dropout(double prob) : UnaryModule("Dropout"), p(prob) {
  if (!(p >= 0.0 && p <= 1.0)) {
    throw ValueError("[Dropout] probability must be in [0, 1], got " + detail::num(p));
  }
}

Tensor Dropout::forward(const Tensor& x) { return F::dropout(x, p, is_training()); }

std::string Dropout::extra_repr() const { return "p=" + detail::num(p); }

Tensor ReLU::forward(const Tensor& x) { return relu(x); }

GELU::GELU(F::GeluApproximation a) : UnaryModule("GELU"), approximate(a) {}
Tensor GELU::forward(const Tensor& x) { return F::gelu(x, approximate); }
std::string GELU::extra_repr() const {
  return approximate == F::GeluApproximation::Tanh ? "approximate='tanh'" : "";
}

Tensor SiLU::forward(const Tensor& x) { return F::silu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }

LeakyReLU::LeakyReLU(double slope) : UnaryModule("LeakyReLU"), negative_slope(slope) {}
Tensor LeakyReLU::forward(const Tensor& x) { return F::leaky_relu(x, negative_slope); }
std::string LeakyReLU::extra_repr() const {
  return "negative_slope=" + detail::num(negative_slope);
}

Softmax::Softmax(int64_t d) : UnaryModule("Softmax"), dim(d) {}
Tensor Softmax::forward(const Tensor& x) { return softmax(x, dim); }
std::string Softmax::extra_repr() const { return "dim=" + std::to_string(dim); }

Flatten::Flatten(int64_t start, int64_t end)
    : UnaryModule("Flatten"), start_dim(start), end_dim(end) {}
Tensor Flatten::forward(const Tensor& x) { return flatten(x, start_dim, end_dim); }
std::string Flatten::extra_repr() const {
  return "start_dim=" + std::to_string(start_dim) + ", end_dim=" + std::to_string(end_dim);
}

Functional::Functional(std::function<Tensor(const Tensor&)> fn, std::string name)
    : UnaryModule(std::move(name)), fn_(std::move(fn)) {
  if (!fn_) throw ValueError("[Functional] the function is empty");
}

}  // namespace kiln::nn
