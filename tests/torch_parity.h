#pragma once
// Layer parity with PyTorch: each case runs a kiln layer (or functional op) in float64, and
// tests/layers_parity_torch.py runs the torch layer built from a Python expression on the
// same inputs and state (loaded strictly, so parameter names and shapes must be PyTorch's).
// Outputs, the gradients of a random linear functional of the outputs with respect to every
// floating input and parameter, and the module's state after the call (running statistics)
// are compared. Cases are collected and run by one Python process; where the Python of
// tests/python_support.h cannot import torch, the test WARNs that it is skipped.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "frontend/nn/nn.h"
#include "python_support.h"
#include "test_files.h"
#include "test_nn_support.h"

namespace nn_test {

/// One comparison with PyTorch.
struct TorchCase {
  std::string label;   ///< printed on a mismatch
  std::string module;  ///< Python building the torch module ("" for a functional case)
  std::string call;    ///< Python over m, x, torch, nn, F giving a tensor or nested tuple
  kiln::nn::Module* layer = nullptr;  ///< the kiln module whose state torch loads
  bool train = false;                 ///< the mode both modules run in
  std::vector<Tensor> inputs;         ///< float64 inputs become leaves; others pass as given
  int grad_inputs = -1;  ///< only the first this many inputs are leaves (-1: all float64 ones)
  /// The kiln side: outputs in the order torch's call flattens them.
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> run;
  double tol = 1e-9;  ///< absolute and relative
};

/// Runs every case and returns "" or the first disagreement (one per failing case).
inline std::string check_against_torch(std::vector<TorchCase>& cases) {
  kiln::test::TempDir dir("kiln_layers_parity");
  struct Expected {
    std::vector<Tensor> outs, grads;
    std::vector<std::string> grad_names;
    kiln::StateDict state_after;
  };
  std::vector<Expected> kiln_side(cases.size());
  std::ostringstream json;
  json << "[";
  for (size_t c = 0; c < cases.size(); ++c) {
    TorchCase& tc = cases[c];
    kiln::StateDict data;
    if (tc.layer) {
      tc.layer->train(tc.train);
      for (auto& [name, t] : tc.layer->state_dict()) data["state." + name] = t;
    }
    // Written now: the call may update the state in place.
    std::vector<Tensor> leaves;
    for (size_t i = 0; i < tc.inputs.size(); ++i) {
      Tensor& t = tc.inputs[i];
      data["in." + std::to_string(i)] = t;
      if (t.dtype() == DType::Float64 &&
          (tc.grad_inputs < 0 || static_cast<int>(i) < tc.grad_inputs)) {
        t.requires_grad_();
        leaves.push_back(t);
        kiln_side[c].grad_names.push_back("grad.in." + std::to_string(i));
      }
    }
    kiln::save_safetensors(dir.file("data" + std::to_string(c) + ".safetensors"), data);
    std::vector<Tensor> outs = tc.run(tc.inputs);
    kiln::StateDict gouts;
    Tensor loss;
    for (size_t j = 0; j < outs.size(); ++j) {
      if (!outs[j].defined() || !kiln::is_floating(outs[j].dtype())) continue;
      Tensor g = make(random_values(outs[j].numel(), 1000 + j), outs[j].shape(), DType::Float64);
      gouts["gout." + std::to_string(j)] = g;
      Tensor term = kiln::sum(outs[j] * g);
      loss = loss.defined() ? loss + term : term;
    }
    if (tc.layer) {
      for (auto& [name, p] : tc.layer->named_parameters()) {
        leaves.push_back(p);
        kiln_side[c].grad_names.push_back("grad.param." + name);
      }
    }
    if (loss.defined() && !leaves.empty()) {
      kiln_side[c].grads = kiln::grad(loss, leaves, Tensor(), true);
    }
    // A file of their own: rewriting the first would save the state after the call.
    kiln::save_safetensors(dir.file("gout" + std::to_string(c) + ".safetensors"), gouts);
    kiln_side[c].outs = outs;
    if (tc.layer) kiln_side[c].state_after = tc.layer->state_dict();
    auto quote = [](const std::string& s) {
      std::string q = "\"";
      for (char ch : s) q += ch == '"' || ch == '\\' ? std::string("\\") + ch : std::string(1, ch);
      return q + "\"";
    };
    json << (c ? "," : "")
         << "{\"gouts\":" << quote(dir.file("gout" + std::to_string(c) + ".safetensors"))
         << ",\"data\":" << quote(dir.file("data" + std::to_string(c) + ".safetensors"))
         << ",\"result\":" << quote(dir.file("result" + std::to_string(c) + ".safetensors"))
         << ",\"module\":" << quote(tc.module) << ",\"call\":" << quote(tc.call)
         << ",\"train\":" << (tc.train ? "true" : "false") << ",\"grad_inputs\":" << tc.grad_inputs
         << "}";
  }
  json << "]";
  std::ofstream(dir.file("cases.json")) << json.str();
  const std::string script = std::string(KILN_SOURCE_DIR) + "/tests/layers_parity_torch.py";
  const std::string cmd = "XDG_CACHE_HOME=" + dir.file("xdg") + " TORCH_HOME=" + dir.file("torch") +
                          " " + kiln::test::python3() + " " + script + " " +
                          dir.file("cases.json") + " 2>&1";
  std::string log;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char line[1024];
    while (std::fgets(line, sizeof line, p)) log += line;
    pclose(p);
  }
  std::string report;
  auto compare = [&](const TorchCase& tc, const std::string& what, const Tensor& got,
                     const kiln::StateDict& want, const std::string& key) {
    auto it = want.find(key);
    if (it == want.end()) {
      if (got.defined()) report += tc.label + ": PyTorch gave no " + what + "\n";
      return;
    }
    if (!got.defined()) {
      report += tc.label + ": kiln gave no " + what + "\n";
      return;
    }
    if (got.shape() != it->second.shape()) {
      report += tc.label + ": " + what + " shape " + kiln::shape_str(got.shape()) + ", PyTorch's " +
                kiln::shape_str(it->second.shape()) + "\n";
      return;
    }
    // Infinities (masks) compare by value: mismatch() would subtract them.
    auto finite = [](std::vector<double> v) {
      for (double& x : v)
        if (std::isinf(x)) x = x > 0 ? 1e300 : -1e300;
      return v;
    };
    std::string m = mismatch(finite(values(got)), finite(values(it->second)), tc.tol, tc.tol);
    if (!m.empty()) report += tc.label + ": " + what + " " + m + "\n";
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const TorchCase& tc = cases[c];
    const std::string result = dir.file("result" + std::to_string(c) + ".safetensors");
    if (!std::ifstream(result).good()) {
      report += tc.label + ": PyTorch did not run it:\n" + log;
      continue;
    }
    kiln::StateDict want = kiln::load_safetensors(result);
    if (tc.layer) {
      std::string ours;
      for (auto& [name, t] : tc.layer->named_parameters()) ours += (ours.empty() ? "" : ",") + name;
      std::string theirs = kiln::load_safetensors_metadata(result)["params"];
      if (ours != theirs) {
        report += tc.label + ": parameters in the order " + ours + ", PyTorch's " + theirs + "\n";
      }
    }
    const Expected& k = kiln_side[c];
    for (size_t j = 0; j < k.outs.size(); ++j)
      compare(tc, "output " + std::to_string(j), k.outs[j], want, "out." + std::to_string(j));
    if (want.count("out." + std::to_string(k.outs.size())))
      report += tc.label + ": PyTorch gave more outputs than kiln\n";
    for (size_t g = 0; g < k.grads.size(); ++g)
      compare(tc, k.grad_names[g], k.grads[g], want, k.grad_names[g]);
    for (auto& [name, t] : k.state_after)
      compare(tc, "state " + name + " after the call", t, want, "state." + name);
  }
  return report;
}

/// Whether the parity script can run (asked once per process: importing torch takes seconds).
inline bool torch_available() {
  static const bool available = kiln::test::python_has("torch, safetensors");
  return available;
}

/// Runs the cases against PyTorch when it is importable; WARNs that they are skipped if not.
#define NN_REQUIRE_TORCH_PARITY(cases)                                                     \
  do {                                                                                     \
    if (!nn_test::torch_available()) {                                                     \
      WARN("PyTorch parity skipped: " << kiln::test::python3()                             \
                                      << " cannot import torch (scripts/setup_torch.sh)"); \
    } else {                                                                               \
      REQUIRE(nn_test::check_against_torch(cases) == "");                                  \
    }                                                                                      \
  } while (0)

}  // namespace nn_test
