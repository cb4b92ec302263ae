#include "sequential_mlp.h"

#include <charconv>
#include <map>

namespace embed {
namespace {

// "0.weight" -> (0, "weight") when `key` is "<prefix><digits>.<rest>"; false otherwise.
bool split_key(const std::string& key, const std::string& prefix, int64_t& index,
               std::string& field) {
  if (key.compare(0, prefix.size(), prefix) != 0) return false;
  const char* begin = key.data() + prefix.size();
  const char* end = key.data() + key.size();
  auto [dot, error] = std::from_chars(begin, end, index);
  if (error != std::errc() || dot == end || *dot != '.' || index < 0) return false;
  field.assign(dot + 1, end);
  return true;
}

std::string describe(const kiln::Tensor& t) {
  return std::string(kiln::dtype_name(t.dtype())) + kiln::shape_str(t.shape());
}

}  // namespace

SequentialMlp SequentialMlp::from_state_dict(const kiln::StateDict& tensors,
                                             const std::string& prefix) {
  const std::string expected_names =
      "expected only '" + prefix + "<i>.weight' and '" + prefix + "<i>.bias' tensors";
  // Ordered by the layer's position in the Sequential, not by the string ("10" < "2").
  std::map<int64_t, Layer> by_index;
  for (const auto& [key, tensor] : tensors) {
    int64_t index = 0;
    std::string field;
    if (!split_key(key, prefix, index, field) || (field != "weight" && field != "bias")) {
      throw kiln::ValueError("unexpected tensor '" + key + "' in the weights; " + expected_names +
                             " (nn.Sequential of Linear and ReLU" +
                             (prefix.empty() ? "; use --prefix when the names have one)" : ")"));
    }
    if (!kiln::is_floating(tensor.dtype())) {
      throw kiln::DTypeError("'" + key + "' is " + describe(tensor) +
                             ", expected a floating dtype");
    }
    Layer& layer = by_index[index];
    layer.name = prefix + std::to_string(index);
    (field == "weight" ? layer.weight : layer.bias) = tensor;
  }
  if (by_index.empty()) {
    throw kiln::ValueError("the weights hold no '" + prefix + "<i>.weight' tensors; " +
                           expected_names);
  }

  SequentialMlp mlp;
  for (auto& [index, layer] : by_index) {
    if (!layer.weight.defined()) {
      throw kiln::ValueError("'" + layer.name + ".bias' has no '" + layer.name + ".weight'");
    }
    if (layer.weight.ndim() != 2) {
      throw kiln::ShapeError("'" + layer.name + ".weight' is " + describe(layer.weight) +
                             ", expected [out_features, in_features]");
    }
    const int64_t out = layer.weight.size(0);
    if (layer.bias.defined() && (layer.bias.ndim() != 1 || layer.bias.size(0) != out)) {
      throw kiln::ShapeError("'" + layer.name + ".bias' is " + describe(layer.bias) +
                             ", expected [" + std::to_string(out) + "] to match '" + layer.name +
                             ".weight' " + describe(layer.weight));
    }
    if (!mlp.layers_.empty()) {
      const Layer& previous = mlp.layers_.back();
      if (layer.weight.size(1) != previous.weight.size(0)) {
        throw kiln::ShapeError("'" + layer.name + ".weight' is " + describe(layer.weight) +
                               ", expected in_features " + std::to_string(previous.weight.size(0)) +
                               " (the out_features of '" + previous.name + ".weight' " +
                               describe(previous.weight) + ")");
      }
    }
    if (layer.weight.dtype() == kiln::DType::Float64) mlp.dtype_ = kiln::DType::Float64;
    mlp.layers_.push_back(std::move(layer));
  }
  // One compute dtype for the whole chain; half-precision files are widened once here.
  for (Layer& layer : mlp.layers_) {
    layer.weight = kiln::cast(layer.weight, mlp.dtype_);
    if (layer.bias.defined()) layer.bias = kiln::cast(layer.bias, mlp.dtype_);
  }
  return mlp;
}

int64_t SequentialMlp::in_features() const { return layers_.front().weight.size(1); }

int64_t SequentialMlp::out_features() const { return layers_.back().weight.size(0); }

std::string SequentialMlp::sizes() const {
  std::string text = std::to_string(in_features());
  for (const Layer& layer : layers_) text += "-" + std::to_string(layer.weight.size(0));
  return text;
}

kiln::Tensor SequentialMlp::probabilities(const kiln::Tensor& x) const {
  kiln::Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    h = kiln::linear(h, layers_[i].weight, layers_[i].bias);
    if (i + 1 < layers_.size()) h = kiln::relu(h);
  }
  return kiln::softmax(h, -1);
}

}  // namespace embed
