#pragma once
// LSTM with PyTorch's parameter names, gate order (input, forget, cell, output), shapes and
// initialisation.
#include <cstdint>
#include <string>

#include "module.h"

namespace kiln::nn {

/// What LSTM::forward returns: `auto [output, h_n, c_n] = lstm->forward(x);`.
struct LSTMOutput {
  Tensor output;  ///< [T, B, H] ([B, T, H] with batch_first; [T, H] unbatched)
  Tensor h_n;     ///< [num_layers, B, H]: the last hidden state of each layer
  Tensor c_n;     ///< [num_layers, B, H]: the last cell state of each layer
};

/// A multi-layer LSTM. Layer k has weight_ih_l{k} [4H, in], weight_hh_l{k} [4H, H] and
/// (with bias) bias_ih_l{k}, bias_hh_l{k} [4H], all starting as U(-1/sqrt(H), 1/sqrt(H)).
/// Per step: i, f, g, o = split(x W_ih^T + b_ih + h W_hh^T + b_hh); c = f c + i g;
/// h = o tanh(c), with sigmoid on i, f, o and tanh on g. `dropout` applies to the outputs of
/// every layer but the last in training mode.
class LSTM : public Module {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool bias = true,
       bool batch_first = false, double dropout = 0.0);

  /// input [T, B, input_size] ([B, T, input_size] with batch_first, or unbatched
  /// [T, input_size]); h0 and c0 [num_layers, B, H] (or [num_layers, H] unbatched) are
  /// both given or both omitted (zeros).
  LSTMOutput forward(const Tensor& input, const Tensor& h0 = Tensor(), const Tensor& c0 = Tensor());
  std::string extra_repr() const override;

  const int64_t input_size, hidden_size, num_layers;
  const bool bias, batch_first;
  const double dropout;

  /// The four parameters of one layer (b_ih and b_hh undefined without bias).
  struct Layer {
    Tensor w_ih, w_hh, b_ih, b_hh;
  };
  const std::vector<Layer>& layers() const { return layers_; }

 private:
  std::vector<Layer> layers_;
};

}  // namespace kiln::nn
