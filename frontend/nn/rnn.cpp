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

// Gate `which` of a [B, G*H] block of G gates: its columns [which*H, (which+1)*H).
Tensor gate_slice(const Tensor& gates, int64_t which, int64_t hs) {
  return slice(gates, 1, which * hs, (which + 1) * hs);
}

}  // namespace

RNNBase::RNNBase(std::string layer_name, int64_t gates, int64_t in, int64_t hidden, int64_t layers,
                 bool with_bias, bool first, double p, bool bidi, int64_t proj)
    : Module(std::move(layer_name)),
      input_size(in),
      hidden_size(hidden),
      num_layers(layers),
      bias(with_bias),
      batch_first(first),
      dropout(p),
      bidirectional(bidi),
      proj_size(proj) {
  detail::require_positive(in, name(), "input_size");
  detail::require_positive(hidden, name(), "hidden_size");
  detail::require_positive(layers, name(), "num_layers");
  if (!(p >= 0.0 && p <= 1.0)) {
    throw ValueError("[" + name() + "] dropout must be in [0, 1], got " + detail::num(p));
  }
  if (proj < 0 || (proj > 0 && proj >= hidden)) {
    throw ValueError("[" + name() + "] proj_size must be 0 (no projection) or in [1, hidden_size " +
                     std::to_string(hidden) + "), got " + std::to_string(proj));
  }
  // PyTorch's order: per layer, per direction, w_ih, w_hh, b_ih, b_hh, w_hr.
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
  const int64_t out = output_size();
  for (int64_t k = 0; k < layers; ++k) {
    for (int64_t d = 0; d < num_directions(); ++d) {
      std::string s = "_l" + std::to_string(k) + (d == 1 ? "_reverse" : "");
      int64_t layer_in = k == 0 ? in : out * num_directions();
      auto u = [&](const Shape& shape) { return init::uniform(shape, -bound, bound); };
      Layer l;
      l.w_ih = register_parameter("weight_ih" + s, u({gates * hidden, layer_in}));
      l.w_hh = register_parameter("weight_hh" + s, u({gates * hidden, out}));
      if (with_bias) {
        l.b_ih = register_parameter("bias_ih" + s, u({gates * hidden}));
        l.b_hh = register_parameter("bias_hh" + s, u({gates * hidden}));
      }
      if (proj > 0) l.w_hr = register_parameter("weight_hr" + s, u({proj, hidden}));
      layers_.push_back(l);
    }
  }
}

std::vector<Tensor> RNNBase::run(const Tensor& input, std::vector<Tensor> initial,
                                 const std::vector<int64_t>& state_sizes,
                                 const std::vector<std::string>& state_names,
                                 const StepFactory& make_step) {
  const DType dtype = layers_[0].w_ih.dtype();
  detail::require_layer_input(input, name(), dtype);
  const bool unbatched = input.ndim() == 2;
  if ((input.ndim() != 2 && input.ndim() != 3) || input.size(-1) != input_size) {
    throw ShapeError("[" + name() + "] expected input " +
                     std::string(batch_first ? "[B, T, " : "[T, B, ") + std::to_string(input_size) +
                     "] (or unbatched [T, " + std::to_string(input_size) + "]) with input_size " +
                     std::to_string(input_size) + ", got " + describe(input));
  }
  // Time-major [T, B, in] inside.
  Tensor x = unbatched ? unsqueeze(input, 1) : (batch_first ? transpose(input, 0, 1) : input);
  const int64_t steps = x.size(0), batch = x.size(1), dirs = num_directions();
  const int64_t stacked = num_layers * dirs;
  for (size_t i = 0; i < initial.size(); ++i) {
    Tensor& s = initial[i];
    if (!s.defined()) {
      s = zeros({stacked, batch, state_sizes[i]}, dtype);
      continue;
    }
    Shape want = unbatched ? Shape{stacked, state_sizes[i]} : Shape{stacked, batch, state_sizes[i]};
    detail::require_layer_input(s, name(), dtype);
    if (s.shape() != want) {
      const char* size_name = state_sizes[i] == hidden_size ? "hidden_size" : "proj_size";
      throw ShapeError("[" + name() + "] expected initial states of shape " + shape_str(want) +
                       " [" + (dirs == 2 ? "2*num_layers" : "num_layers") + ", B, " + size_name +
                       "], got " + describe(s) + " (" + state_names[i] + ")");
    }
    if (unbatched) s = unsqueeze(s, 1);
  }
  if (steps == 0) {
    throw ShapeError("[" + name() + "] expected a sequence of at least one step, got " +
                     describe(input));
  }

  // Each layer consumes a list of per-step inputs [B, in]: slices of the input for the first
  // layer, the previous layer's outputs for the others, so no layer but the last stacks
  // its outputs into a sequence only to slice it again.
  std::vector<Tensor> inputs;
  for (int64_t t = 0; t < steps; ++t)
    inputs.push_back(detail::stored(squeeze(slice(x, 0, t, t + 1), 0)));
  std::vector<std::vector<Tensor>> finals(initial.size());
  for (int64_t k = 0; k < num_layers; ++k) {
    std::vector<std::vector<Tensor>> per_direction;
    for (int64_t d = 0; d < dirs; ++d) {
      const int64_t at = k * dirs + d;
      Step step = make_step(layers_[static_cast<size_t>(at)]);
      std::vector<Tensor> state;
      for (const Tensor& s : initial) state.push_back(squeeze(slice(s, 0, at, at + 1), 0));
      // The reverse direction reads the sequence backwards; its output at step t is the
      // state after reading t (as PyTorch's), so both directions' outputs align in time.
      std::vector<Tensor> outputs(static_cast<size_t>(steps));
      for (int64_t i = 0; i < steps; ++i) {
        const int64_t t = d == 0 ? i : steps - 1 - i;
        state = step(inputs[static_cast<size_t>(t)], state);
        outputs[static_cast<size_t>(t)] = state[0];
      }
      for (size_t i = 0; i < state.size(); ++i) finals[i].push_back(state[i]);
      per_direction.push_back(std::move(outputs));
    }
    std::vector<Tensor> outputs = std::move(per_direction[0]);
    if (dirs == 2) {
      // Stored: the next layer's product reads the joined features as a plain matrix.
      for (int64_t t = 0; t < steps; ++t) {
        auto i = static_cast<size_t>(t);
        outputs[i] = detail::stored(concat({outputs[i], per_direction[1][i]}, 1));
      }
    }
    if (k + 1 < num_layers && is_training() && dropout > 0.0) {
      for (Tensor& t : outputs) t = F::dropout(t, dropout, true);
    }
    inputs = std::move(outputs);
  }
  std::vector<Tensor> result{stack_steps(inputs)};
  for (const auto& f : finals) result.push_back(stack(f, 0));
  if (unbatched) {
    for (Tensor& r : result) r = squeeze(r, 1);
  } else if (batch_first) {
    result[0] = transpose(result[0], 0, 1);
  }
  return result;
}

std::string RNNBase::extra_repr() const {
  std::string s = std::to_string(input_size) + ", " + std::to_string(hidden_size);
  if (num_layers != 1) s += ", num_layers=" + std::to_string(num_layers);
  if (!bias) s += ", bias=false";
  if (batch_first) s += ", batch_first=true";
  if (dropout > 0) s += ", dropout=" + detail::num(dropout);
  if (bidirectional) s += ", bidirectional=true";
  if (proj_size > 0) s += ", proj_size=" + std::to_string(proj_size);
  return s;
}

RNN::RNN(int64_t in, int64_t hidden, int64_t layers, RNNNonlinearity act, bool with_bias,
         bool first, double p, bool bidi)
    : RNNBase("RNN", 1, in, hidden, layers, with_bias, first, p, bidi, 0), nonlinearity(act) {}

RNNOutput RNN::forward(const Tensor& input, const Tensor& h0) {
  const bool relu_act = nonlinearity == RNNNonlinearity::ReLU;
  auto make_step = [relu_act](const Layer& l) -> Step {
    Tensor b = l.b_ih.defined() ? l.b_ih + l.b_hh : Tensor();
    return [l, b, relu_act](const Tensor& x, const std::vector<Tensor>& state) {
      Tensor pre = linear(x, l.w_ih, b) + linear(state[0], l.w_hh);
      // Stored: the next step's product and the backward both read it.
      return std::vector<Tensor>{kiln::detail::store_hint(relu_act ? relu(pre) : tanh(pre))};
    };
  };
  auto r = run(input, {h0}, {hidden_size}, {"h0"}, make_step);
  return {r[0], r[1]};
}

std::string RNN::extra_repr() const {
  std::string s = RNNBase::extra_repr();
  if (nonlinearity == RNNNonlinearity::ReLU) s += ", nonlinearity=relu";
  return s;
}

GRU::GRU(int64_t in, int64_t hidden, int64_t layers, bool with_bias, bool first, double p,
         bool bidi)
    : RNNBase("GRU", 3, in, hidden, layers, with_bias, first, p, bidi, 0) {}

RNNOutput GRU::forward(const Tensor& input, const Tensor& h0) {
  const int64_t hs = hidden_size;
  auto make_step = [hs](const Layer& l) -> Step {
    // The new gate's hidden bias sits inside r * (...), so the two biases stay apart.
    return [l, hs](const Tensor& x, const std::vector<Tensor>& state) {
      const Tensor& h = state[0];
      Tensor gi = linear(x, l.w_ih, l.b_ih), gh = linear(h, l.w_hh, l.b_hh);
      Tensor r = sigmoid(gate_slice(gi, 0, hs) + gate_slice(gh, 0, hs));
      Tensor z = sigmoid(gate_slice(gi, 1, hs) + gate_slice(gh, 1, hs));
      Tensor n = tanh(gate_slice(gi, 2, hs) + r * gate_slice(gh, 2, hs));
      return std::vector<Tensor>{kiln::detail::store_hint(n + z * (h - n))};
    };
  };
  auto r = run(input, {h0}, {hidden_size}, {"h0"}, make_step);
  return {r[0], r[1]};
}

LSTM::LSTM(int64_t in, int64_t hidden, int64_t layers, bool with_bias, bool first, double p,
           bool bidi, int64_t proj)
    : RNNBase("LSTM", 4, in, hidden, layers, with_bias, first, p, bidi, proj) {}

LSTMOutput LSTM::forward(const Tensor& input, const Tensor& h0, const Tensor& c0) {
  if (h0.defined() != c0.defined()) {
    throw ValueError("[LSTM] pass both h0 and c0, or neither");
  }
  const int64_t hs = hidden_size;
  auto make_step = [hs](const Layer& l) -> Step {
    Tensor b = l.b_ih.defined() ? l.b_ih + l.b_hh : Tensor();
    return [l, b, hs](const Tensor& x, const std::vector<Tensor>& state) {
      // Two products per step; their gradients are per-step products too, where projecting
      // the whole sequence at once would need the sequence's gradient scattered back from
      // T step slices.
      Tensor gates = linear(x, l.w_ih, b) + linear(state[0], l.w_hh);
      // Under a memory budget the activated gates are inlined (below), and the backward
      // pass read both products to rebuild them, keeping two [B, 4H] values per step. The
      // summed pre-activations are stored instead: one [B, 4H] value, and the products die
      // in the forward pass (docs/benchmarks.md has what it saves). Whether a budget applies
      // is decided per evaluation, by fusion (StoreHint::Budgeted).
      gates = kiln::detail::store_hint(gates, StoreHint::Budgeted);
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
      Tensor i = gate(sigmoid(gate_slice(gates, 0, hs)));
      Tensor f = gate(sigmoid(gate_slice(gates, 1, hs)));
      Tensor g = gate(tanh(gate_slice(gates, 2, hs)));
      Tensor o = gate(sigmoid(gate_slice(gates, 3, hs)));
      Tensor c = f * state[1] + i * g;
      Tensor h = o * tanh(c);
      if (l.w_hr.defined()) h = linear(detail::stored(h), l.w_hr);
      // Stored: the next step's product reads it anyway, and the last step's then joins
      // the output like the others (one kind of piece for the join's kernels).
      return std::vector<Tensor>{kiln::detail::store_hint(h), c};
    };
  };
  auto r = run(input, {h0, c0}, {output_size(), hidden_size}, {"h0", "c0"}, make_step);
  return {r[0], r[1], r[2]};
}

}  // namespace kiln::nn
