#pragma once
// The inference half of a PyTorch-style nn.Sequential(Linear, ReLU, Linear, ReLU, ..., Linear)
// rebuilt from its state dict with kiln's functional ops, so the host needs no nn module
// definitions to run a trained model.
#include <kiln/frontend/state_dict.h>
#include <kiln/kiln.h>

#include <string>
#include <vector>

namespace embed {

/// Fully connected layers applied in order, ReLU between them, softmax at the end.
class SequentialMlp {
 public:
  /// Takes the tensors "<prefix><i>.weight" ([out, in]) and "<prefix><i>.bias" ([out], may be
  /// absent) ordered by the integer i, as nn.Sequential names them; any other tensor, a gap in
  /// the chain of sizes or a non-floating dtype throws kiln::ValueError / kiln::ShapeError.
  static SequentialMlp from_state_dict(const kiln::StateDict& tensors,
                                       const std::string& prefix = "");

  /// Inputs per sample (the first layer's in_features).
  int64_t in_features() const;
  /// Classes (the last layer's out_features).
  int64_t out_features() const;
  /// float64 when any weight is float64, else float32 (half-precision weights are widened).
  kiln::DType dtype() const { return dtype_; }
  /// Layer sizes, e.g. "64-32-10".
  std::string sizes() const;

  /// Class probabilities [n, out_features] for inputs [n, in_features] (lazy).
  kiln::Tensor probabilities(const kiln::Tensor& x) const;

 private:
  struct Layer {
    std::string name;  // "<prefix><i>", for messages
    kiln::Tensor weight;
    kiln::Tensor bias;  // undefined when the layer has none
  };
  std::vector<Layer> layers_;
  kiln::DType dtype_ = kiln::DType::Float32;
};

}  // namespace embed
