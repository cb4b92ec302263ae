#pragma once
// Recurrent layers (RNN, GRU, LSTM) with PyTorch's parameter names, gate orders, shapes,
// initialisation and options (multi-layer, batch_first, dropout between layers, bias,
// bidirectional; LSTM proj_size).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "module.h"

namespace kiln::nn {

/// What RNN::forward and GRU::forward return: `auto [output, h_n] = gru->forward(x);`.
struct RNNOutput {
  Tensor output;  ///< [T, B, D*H] ([B, T, D*H] with batch_first; [T, D*H] unbatched)
  Tensor h_n;     ///< [D*num_layers, B, H]: the last hidden state of each layer and direction
};

/// What LSTM::forward returns: `auto [output, h_n, c_n] = lstm->forward(x);`.
struct LSTMOutput {
  Tensor output;  ///< [T, B, D*H_out] ([B, T, D*H_out] with batch_first; [T, D*H_out] unbatched)
  Tensor h_n;     ///< [D*num_layers, B, H_out]: the last hidden state of each layer/direction
  Tensor c_n;     ///< [D*num_layers, B, H]: the last cell state of each layer/direction
};

/// What RNN computes at each step: tanh or relu of the two affine maps' sum.
enum class RNNNonlinearity { Tanh, ReLU };

/// Shared by RNN, GRU and LSTM: the options, the parameters and the loop over layers,
/// directions and steps. D = 2 when bidirectional, else 1; H_out = proj_size when it is
/// non-zero (LSTM only), else hidden_size. Layer k, direction d has weight_ih_l{k}[_reverse]
/// [G*H, in_k], weight_hh_l{k}[_reverse] [G*H, H_out], bias_ih/bias_hh [G*H] (with bias) and,
/// with proj_size, weight_hr_l{k}[_reverse] [H_out, H]; G is the gate count (1, 3, 4) and
/// in_k is input_size for k = 0, else D*H_out. All start as U(-1/sqrt(H), 1/sqrt(H)).
/// `dropout` applies to every layer's output but the last's in training mode.
class RNNBase : public Module {
 public:
  const int64_t input_size, hidden_size, num_layers;
  const bool bias, batch_first;
  const double dropout;
  const bool bidirectional;
  const int64_t proj_size;  ///< 0 unless an LSTM with a projection

  /// 2 when bidirectional, else 1.
  int64_t num_directions() const { return bidirectional ? 2 : 1; }
  /// The size of each direction's hidden state (and output features): proj_size or H.
  int64_t output_size() const { return proj_size > 0 ? proj_size : hidden_size; }

  /// The parameters of one layer and direction (biases undefined without bias; w_hr
  /// undefined without proj_size).
  struct Layer {
    Tensor w_ih, w_hh, b_ih, b_hh, w_hr;
  };
  /// Layer k, direction d at index k * num_directions() + d.
  const std::vector<Layer>& layers() const { return layers_; }
  std::string extra_repr() const override;

 protected:
  RNNBase(std::string name, int64_t gates, int64_t input_size, int64_t hidden_size,
          int64_t num_layers, bool bias, bool batch_first, double dropout, bool bidirectional,
          int64_t proj_size);

  /// One step of one layer and direction: the new states (h first, then c for LSTM) from
  /// the step's input [B, in] and the current states.
  using Step = std::function<std::vector<Tensor>(const Tensor& x, const std::vector<Tensor>&)>;
  /// Builds the step of one layer and direction (so per-layer work, such as adding the two
  /// biases, happens once).
  using StepFactory = std::function<Step(const Layer&)>;

  /// Checks the input and the initial states, runs every layer and direction, and returns
  /// {output, final state 0, final state 1, ...} in the caller's layout. `initial` holds
  /// one tensor per state (undefined: zeros), each of [D*num_layers, B, state_sizes[i]];
  /// `state_names` name them in messages.
  std::vector<Tensor> run(const Tensor& input, std::vector<Tensor> initial,
                          const std::vector<int64_t>& state_sizes,
                          const std::vector<std::string>& state_names,
                          const StepFactory& make_step);

 private:
  std::vector<Layer> layers_;
};

/// An Elman RNN: h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh), act tanh or relu.
class RNN : public RNNBase {
 public:
  RNN(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1,
      RNNNonlinearity nonlinearity = RNNNonlinearity::Tanh, bool bias = true,
      bool batch_first = false, double dropout = 0.0, bool bidirectional = false);

  /// input [T, B, input_size] ([B, T, input_size] with batch_first, or unbatched
  /// [T, input_size]); h0 [D*num_layers, B, H] (or [D*num_layers, H] unbatched), zeros when
  /// omitted.
  RNNOutput forward(const Tensor& input, const Tensor& h0 = Tensor());
  std::string extra_repr() const override;

  const RNNNonlinearity nonlinearity;
};

/// A GRU with PyTorch's gate order (reset, update, new): r = s(W_ir x + b_ir + W_hr h + b_hr),
/// z = s(W_iz x + b_iz + W_hz h + b_hz), n = tanh(W_in x + b_in + r (W_hn h + b_hn)),
/// h' = (1 - z) n + z h.
class GRU : public RNNBase {
 public:
  GRU(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool bias = true,
      bool batch_first = false, double dropout = 0.0, bool bidirectional = false);

  /// Shapes as RNN::forward.
  RNNOutput forward(const Tensor& input, const Tensor& h0 = Tensor());
};

/// An LSTM with PyTorch's gate order (input, forget, cell, output): i, f, g, o =
/// split(x W_ih^T + b_ih + h W_hh^T + b_hh); c' = f c + i g; h' = o tanh(c'), with sigmoid
/// on i, f, o and tanh on g; with proj_size, h' = (o tanh(c')) W_hr^T.
class LSTM : public RNNBase {
 public:
  /// proj_size must be 0 (none) or in [1, hidden_size).
  LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool bias = true,
       bool batch_first = false, double dropout = 0.0, bool bidirectional = false,
       int64_t proj_size = 0);

  /// input as RNN::forward; h0 [D*num_layers, B, H_out] and c0 [D*num_layers, B, H] (no B
  /// when unbatched) are both given or both omitted (zeros).
  LSTMOutput forward(const Tensor& input, const Tensor& h0 = Tensor(), const Tensor& c0 = Tensor());
};

}  // namespace kiln::nn
