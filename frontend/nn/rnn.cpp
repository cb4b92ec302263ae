// Each step is two GEMMs (x_t W_ih^T and h W_hh^T) and one or two fused elementwise kernels
// for the gates. Projecting the whole input sequence with one product is faster (one large
// GEMM instead of T small ones: the benchmark LSTM's step 372-420 -> 304-312 ms at T = 256,
// B = 32, H = 256, now that autograd joins the T step slices of its gradient), but the
// projection is one [T, B, 4H] value every step reads, resident from the first step to the
// last: it raised that step's lower bound from 21 to 69 MiB, so no memory budget below half
// of what the step may release fit. Per-step products are values the memory planner can
// release and rebuild one by one.
#include "rnn.h"

#include <cmath>

#include "../../ops/linalg.h"
#include "../../ops/shape_ops.h"
#include "../../ops/sources.h"
#include "detail.h"
#include "functional.h"
#include "init.h"

namespace kiln::nn {

using detail::describe;

namespace {

// Stacks the per-step outputs [B, H] into [T, B, H] through detail::concat_tree, whose kernels
// are the same for every sequence length (a flat stack would be a chain of T selects: O(T)
// work per element, and one kernel per length).
Tensor stack_steps(const std::vector<Tensor>& steps) {
  std::vector<Tensor> pieces;
  pieces.reserve(steps.size());
  for (const Tensor& s : steps) pieces.push_back(unsqueeze(s, 0));
  return kiln::detail::concat_tree(pieces, 0);
}

}  // namespace

LSTM::LSTM(int64_t in, int64_t hidden, int64_t layers, bool with_bias, bool first, double p)
    : Module("LSTM"),
      input_size(in),
      hidden_size(hidden),
      num_layers(layers),
      bias(with_bias),
      batch_first(first),
      dropout(p) {
  detail::require_positive(in, name(), "input_size");
  detail::require_positive(hidden, name(), "hidden_size");
  detail::require_positive(layers, name(), "num_layers");
  if (!(p >= 0.0 && p <= 1.0)) {
    throw ValueError("[LSTM] dropout must be in [0, 1], got " + detail::num(p));
  }
  double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
  for (int64_t k = 0; k < layers; ++k) {
    std::string s = "_l" + std::to_string(k);
    int64_t layer_in = k == 0 ? in : hidden;
    Layer l;
    l.w_ih =
        register_parameter("weight_ih" + s, init::uniform({4 * hidden, layer_in}, -bound, bound));
    l.w_hh =
        register_parameter("weight_hh" + s, init::uniform({4 * hidden, hidden}, -bound, bound));
    if (with_bias) {
      l.b_ih = register_parameter("bias_ih" + s, init::uniform({4 * hidden}, -bound, bound));
      l.b_hh = register_parameter("bias_hh" + s, init::uniform({4 * hidden}, -bound, bound));
    }
    layers_.push_back(l);
  }
}

LSTMOutput LSTM::forward(const Tensor& input, const Tensor& h0_in, const Tensor& c0_in) {
  const DType dtype = layers_[0].w_ih.dtype();
  detail::require_layer_input(input, name(), dtype);
  const bool unbatched = input.ndim() == 2;
  if ((input.ndim() != 2 && input.ndim() != 3) || input.size(-1) != input_size) {
    throw ShapeError("[LSTM] expected input " + std::string(batch_first ? "[B, T, " : "[T, B, ") +
                     std::to_string(input_size) + "] (or unbatched [T, " +
                     std::to_string(input_size) + "]) with input_size " +
                     std::to_string(input_size) + ", got " + describe(input));
  }
  // Time-major [T, B, in] inside.
  Tensor x = unbatched ? unsqueeze(input, 1) : (batch_first ? transpose(input, 0, 1) : input);
  const int64_t steps = x.size(0), batch = x.size(1), hs = hidden_size;
  if (h0_in.defined() != c0_in.defined()) {
    throw ValueError("[LSTM] pass both h0 and c0, or neither");
  }
  Tensor h0 = h0_in, c0 = c0_in;
  if (h0.defined()) {
    Shape want = unbatched ? Shape{num_layers, hs} : Shape{num_layers, batch, hs};
    for (const Tensor* t : {&h0, &c0}) {
      detail::require_layer_input(*t, name(), dtype);
      if (t->shape() != want) {
        throw ShapeError("[LSTM] expected initial states of shape " + shape_str(want) +
                         " [num_layers, B, hidden_size], got " + describe(*t));
      }
    }
    if (unbatched) h0 = unsqueeze(h0, 1), c0 = unsqueeze(c0, 1);
  } else {
    h0 = zeros({num_layers, batch, hs}, dtype);
    c0 = h0;
  }
  if (steps == 0)
    throw ShapeError("[LSTM] expected a sequence of at least one step, got " + describe(input));

  // Each layer consumes a list of per-step inputs [B, in]: slices of the input for the first
  // layer, the previous layer's outputs for the others, so no layer but the last stacks
  // its outputs into a sequence only to slice it again.
  std::vector<Tensor> inputs;
  for (int64_t t = 0; t < steps; ++t)
    inputs.push_back(detail::stored(squeeze(slice(x, 0, t, t + 1), 0)));
  std::vector<Tensor> h_last, c_last;
  for (int64_t k = 0; k < num_layers; ++k) {
    const Layer& l = layers_[static_cast<size_t>(k)];
    Tensor b = l.b_ih.defined() ? l.b_ih + l.b_hh : Tensor();
    Tensor h = squeeze(slice(h0, 0, k, k + 1), 0), c = squeeze(slice(c0, 0, k, k + 1), 0);
    std::vector<Tensor> outputs;
    outputs.reserve(static_cast<size_t>(steps));
    for (int64_t t = 0; t < steps; ++t) {
      // Two products per step; their gradients are per-step products too, where projecting
      // the whole sequence at once would need the sequence's gradient scattered back from
      // T step slices.
      Tensor gates = linear(inputs[static_cast<size_t>(t)], l.w_ih, b) + linear(h, l.w_hh);
      // Where no memory budget applies the gates are stored: the backward reads them
      // (sigmoid' = s(1 - s), tanh' = 1 - t^2) and so does the cell update, and recomputing
      // them per reader re-read both products and the biases and ran the exponentials again
      // in every backward kernel. Stored, the products die in the forward pass, so the step
      // also keeps a third fewer bytes. Under a budget they are inlined as before: rebuilding
      // a released gate would take both products again, and near the step's floor the
      // planner's extra work went from +28% to +112% (bench_plan's LSTM).
      auto gate = [](const Tensor& v) {
        return kiln::detail::store_hint(v, StoreHint::Unbudgeted);
      };
      Tensor i = gate(sigmoid(slice(gates, 1, 0, hs)));
      Tensor f = gate(sigmoid(slice(gates, 1, hs, 2 * hs)));
      Tensor g = gate(tanh(slice(gates, 1, 2 * hs, 3 * hs)));
      Tensor o = gate(sigmoid(slice(gates, 1, 3 * hs, 4 * hs)));
      c = f * c + i * g;
      // Stored: the next step's product reads it anyway, and the last step's then joins
      // the output like the others (one kind of piece for the join's kernels).
      h = kiln::detail::store_hint(o * tanh(c));
      outputs.push_back(h);
    }
    h_last.push_back(h);
    c_last.push_back(c);
    if (k + 1 < num_layers && is_training() && dropout > 0.0) {
      for (Tensor& t : outputs) t = F::dropout(t, dropout, true);
    }
    inputs = std::move(outputs);
  }
  x = stack_steps(inputs);
  LSTMOutput out{x, stack(h_last, 0), stack(c_last, 0)};
  if (unbatched) {
    out.output = squeeze(out.output, 1);
    out.h_n = squeeze(out.h_n, 1);
    out.c_n = squeeze(out.c_n, 1);
  } else if (batch_first) {
    out.output = transpose(out.output, 0, 1);
  }
  return out;
}

std::string LSTM::extra_repr() const {
  std::string s = std::to_string(input_size) + ", " + std::to_string(hidden_size);
  if (num_layers != 1) s += ", num_layers=" + std::to_string(num_layers);
  if (!bias) s += ", bias=false";
  if (batch_first) s += ", batch_first=true";
  if (dropout > 0) s += ", dropout=" + detail::num(dropout);
  return s;
}

}  // namespace kiln::nn
