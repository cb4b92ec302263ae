#pragma once
// What a training step keeps for its backward pass, read from the step's planning tables
// (KILN_PLAN_DUMP, memory/reports/step_graph_file.h): kiln evaluates forward, backward and update
// as one graph, so there is no moment "between forward and backward" to read the pool at;
// the tables say instead which kernel made each value and which kernels read it.
//
// The forward pass is the loss's kernel and its ancestors; the loss is the kept result
// (an output of the step) with the fewest ancestors: every update and gradient descends
// from the whole forward pass and from the loss's gradient as well. A value is kept for
// backward when a forward kernel made it and a kernel outside the forward reads it, as
// PyTorch's saved tensors are. Of those, copies of leaves (a kernel of casts/copies that
// reads leaves only: autocast's bfloat16 weights and batch) are counted apart, since they
// are no activations: PyTorch's side (bench_train_torch.py) leaves its own out the same way.
// Bytes are pool block bytes, as the planner counts them.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "memory/reports/step_graph_file.h"

namespace kiln::bench {

/// The bytes a step keeps for its backward pass.
struct KeptForBackward {
  bool found = false;      ///< A step with a forward and a backward pass was recorded.
  size_t activations = 0;  ///< Forward values the backward reads, leaf copies left out.
  size_t leaf_copies = 0;  ///< Casts/copies of parameters or data the backward reads.
  size_t values = 0;       ///< Number of values counted in `activations`.
  size_t forward_kernels = 0;
  /// Each kept value: bytes, its kernel's source ops, and whether it is a leaf copy.
  struct Value {
    size_t bytes;
    std::string kernel;
    bool leaf_copy;
  };
  std::vector<Value> list;
};

namespace detail {
// Whether a kernel's source ops ("cast", "cast+reindex") only convert or move elements.
inline bool only_copies(const std::string& ops) {
  size_t at = 0;
  while (at <= ops.size()) {
    size_t end = ops.find_first_of("+ ", at);
    if (end == std::string::npos) end = ops.size();
    const std::string op = ops.substr(at, end - at);
    if (!op.empty() && op != "cast" && op != "reindex" && op != "reshape" && op != "copy")
      return false;
    at = end + 1;
  }
  return true;
}
// Whether a kernel's name ("linear+full+relu+gt+...+pack_bits") lists the op `op`.
inline bool has_op(const std::string& ops, const std::string& op) {
  size_t at = 0;
  while (at <= ops.size()) {
    size_t end = ops.find('+', at);
    if (end == std::string::npos) end = ops.size();
    if (ops.compare(at, end - at, op) == 0) return true;
    at = end + 1;
  }
  return false;
}
}  // namespace detail

/// Counts what the step in `file` keeps for backward (see the file comment).
inline KeptForBackward kept_for_backward(const memory::StepGraphFile& file) {
  const memory::StepGraph& g = file.graph;
  const int nk = static_cast<int>(g.kernels.size());
  // Ancestor sets by a walk from each candidate: the steps are a few hundred kernels.
  auto ancestors = [&](int kernel) {
    std::vector<char> in(static_cast<size_t>(nk), 0);
    std::vector<int> stack{kernel};
    in[static_cast<size_t>(kernel)] = 1;
    while (!stack.empty()) {
      const int k = stack.back();
      stack.pop_back();
      for (int v : g.kernels[static_cast<size_t>(k)].inputs) {
        const int p = g.values[static_cast<size_t>(v)].producer;
        if (p >= 0 && !in[static_cast<size_t>(p)]) {
          in[static_cast<size_t>(p)] = 1;
          stack.push_back(p);
        }
      }
    }
    return in;
  };
  KeptForBackward out;
  std::vector<char> forward;
  size_t fewest = static_cast<size_t>(-1);
  for (const memory::PlanValue& v : g.values) {
    if (!v.output || v.producer < 0) continue;
    std::vector<char> a = ancestors(v.producer);
    const size_t n = static_cast<size_t>(std::count(a.begin(), a.end(), 1));
    if (n < fewest) {
      fewest = n;
      forward = std::move(a);
    }
  }
  if (forward.empty()) return out;
  // A kernel that packs a forward value's sign into bits for the backward (relu's mask,
  // ops/bit_mask.h) belongs to the forward pass although the loss does not descend from it:
  // what it reads dies there, and its bits are what the step keeps.
  for (int k = 0; k < nk; ++k)
    if (static_cast<size_t>(k) < file.kernel_names.size() &&
        detail::has_op(file.kernel_names[static_cast<size_t>(k)], "pack_bits"))
      forward[static_cast<size_t>(k)] = 1;
  std::vector<char> read_by_backward(g.values.size(), 0);
  for (int k = 0; k < nk; ++k) {
    if (forward[static_cast<size_t>(k)]) continue;
    for (int v : g.kernels[static_cast<size_t>(k)].inputs)
      read_by_backward[static_cast<size_t>(v)] = 1;
  }
  out.forward_kernels = fewest;
  for (size_t v = 0; v < g.values.size(); ++v) {
    const int p = g.values[v].producer;
    if (p < 0 || !forward[static_cast<size_t>(p)] || !read_by_backward[v]) continue;
    out.found = true;
    const memory::PlanKernel& k = g.kernels[static_cast<size_t>(p)];
    const bool of_leaves = std::all_of(k.inputs.begin(), k.inputs.end(), [&](int in) {
      return g.values[static_cast<size_t>(in)].producer < 0;
    });
    const std::string& name = static_cast<size_t>(p) < file.kernel_names.size()
                                  ? file.kernel_names[static_cast<size_t>(p)]
                                  : "";
    const bool leaf_copy = of_leaves && !name.empty() && detail::only_copies(name);
    out.list.push_back({g.values[v].bytes, name, leaf_copy});
    if (leaf_copy) {
      out.leaf_copies += g.values[v].bytes;
    } else {
      out.activations += g.values[v].bytes;
      ++out.values;
    }
  }
  return out;
}

/// Runs `step` once with KILN_PLAN_DUMP set and returns what its evaluation that holds the
/// forward and backward passes keeps (when a step is several evaluations, as with a
/// GradScaler's inf check before the update: the one whose forward pass has the most
/// kernels). KILN_BENCH_KEPT=1 lists the values counted on stderr.
inline KeptForBackward measure_kept_for_backward(const std::function<void()>& step) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("kiln_bench_kept_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const char* before = std::getenv("KILN_PLAN_DUMP");
  const std::string saved = before ? before : "";
  setenv("KILN_PLAN_DUMP", (dir / "eval_%n.graph").c_str(), 1);
  step();
  if (before)
    setenv("KILN_PLAN_DUMP", saved.c_str(), 1);
  else
    unsetenv("KILN_PLAN_DUMP");
  KeptForBackward best;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const memory::StepGraphFile file = memory::load_step_graph(e.path().string());
    KeptForBackward k = kept_for_backward(file);
    if (std::getenv("KILN_BENCH_KEPT"))
      std::fprintf(stderr, "evaluation %s: %zu kernels, forward %zu, found %d\n",
                   e.path().filename().c_str(), file.graph.kernels.size(), k.forward_kernels,
                   k.found);
    if (k.found && k.activations + k.leaf_copies > best.activations + best.leaf_copies) best = k;
  }
  fs::remove_all(dir);
  if (std::getenv("KILN_BENCH_KEPT")) {  // what was counted, value by value
    std::fprintf(stderr, "kept for backward: %zu forward kernels\n", best.forward_kernels);
    for (const KeptForBackward::Value& v : best.list)
      std::fprintf(stderr, "  %10zu %s %s\n", v.bytes, v.leaf_copy ? "leaf copy " : "activation",
                   v.kernel.c_str());
  }
  return best;
}

}  // namespace kiln::bench
