#include "step_graph_file.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>

#include "../../core/error.h"
#include "../../core/settings.h"

namespace kiln::memory {
namespace {

// Version 2 adds each kernel's in-place candidates, so that a replay in another kernel
// order chooses in-place inputs as the stage does (reorder_to_run); version 3 the inputs
// it can rebuild inside itself (InlineInput). Older files are still read, their kernels
// without those.
constexpr const char* kMagic = "kiln-step-graph 3";
constexpr const char* kMagicV2 = "kiln-step-graph 2";
constexpr const char* kMagicV1 = "kiln-step-graph 1";

}  // namespace

void save_step_graph(const StepGraphFile& file, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw IOError("[memory] cannot write the step graph to " + tmp);
    const StepGraph& g = file.graph;
    out.precision(17);
    out << kMagic << "\n";
    out << "budget " << file.budget << "\n";
    out << "start_bytes " << g.start_bytes << "\n";
    out << "fixed_tail " << file.fixed_tail << "\n";
    out << "values " << g.values.size() << "\n";
    // bytes producer output releasable_leaf
    for (const PlanValue& v : g.values)
      out << v.bytes << ' ' << v.producer << ' ' << v.output << ' ' << v.releasable_leaf << "\n";
    out << "kernels " << g.kernels.size() << "\n";
    // output cost recomputable in_place_input region region_result n_inputs inputs...
    // n_candidates candidates... n_inline (value share)... | name
    for (size_t k = 0; k < g.kernels.size(); ++k) {
      const PlanKernel& pk = g.kernels[k];
      out << pk.output << ' ' << pk.cost << ' ' << pk.recomputable << ' ' << pk.in_place_input
          << ' ' << pk.region << ' ' << pk.region_result << ' ' << pk.inputs.size();
      for (int in : pk.inputs) out << ' ' << in;
      out << ' ' << pk.in_place_candidates.size();
      for (int c : pk.in_place_candidates) out << ' ' << c;
      out << ' ' << pk.inline_inputs.size();
      for (const InlineInput& f : pk.inline_inputs) out << ' ' << f.value << ' ' << f.share;
      out << " | " << (k < file.kernel_names.size() ? file.kernel_names[k] : std::string()) << "\n";
    }
    if (!out) throw IOError("[memory] cannot write the step graph to " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw IOError("[memory] cannot replace " + path + " with the step graph");
  }
}

StepGraphFile load_step_graph(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IOError("[memory] cannot read the step graph " + path);
  StepGraphFile file;
  StepGraph& g = file.graph;
  int line_no = 0;
  std::string line;
  auto bad = [&](const std::string& what) -> ValueError {
    return ValueError("[memory] " + path + ":" + std::to_string(line_no) +
                      ": not a step graph written by KILN_PLAN_DUMP (" + what + ")");
  };
  auto next = [&]() -> std::istringstream {
    if (!std::getline(in, line)) throw bad("it ends early");
    ++line_no;
    return std::istringstream(line);
  };
  auto header = [&](const char* word) {
    std::istringstream s = next();
    std::string w;
    size_t n = 0;
    if (!(s >> w >> n) || w != word) throw bad(std::string("expected '") + word + " N'");
    return n;
  };
  if (std::getline(in, line), ++line_no, line != kMagic && line != kMagicV2 && line != kMagicV1)
    throw bad("no header line");
  const bool candidates = line != kMagicV1, inline_inputs = line == kMagic;
  file.budget = header("budget");
  g.start_bytes = header("start_bytes");
  file.fixed_tail = header("fixed_tail");
  const size_t nv = header("values");
  if (nv > (size_t{1} << 28)) throw bad("too many values");
  g.values.resize(nv);
  for (PlanValue& v : g.values) {
    std::istringstream s = next();
    int output = 0, leaf = 0;
    if (!(s >> v.bytes >> v.producer >> output >> leaf)) throw bad("a value needs 4 fields");
    v.output = output != 0, v.releasable_leaf = leaf != 0;
  }
  const size_t nk = header("kernels");
  if (nk > (size_t{1} << 28)) throw bad("too many kernels");
  g.kernels.resize(nk);
  file.kernel_names.resize(nk);
  auto value_id = [&](int v) {
    if (v < 0 || static_cast<size_t>(v) >= nv) throw bad("value id " + std::to_string(v));
    return v;
  };
  for (size_t k = 0; k < nk; ++k) {
    PlanKernel& pk = g.kernels[k];
    std::istringstream s = next();
    int recomputable = 0, result = 0;
    size_t n = 0;
    if (!(s >> pk.output >> pk.cost >> recomputable >> pk.in_place_input >> pk.region >> result >>
          n) ||
        n > nv)
      throw bad("a kernel needs output, cost, flags and inputs");
    pk.recomputable = recomputable != 0, pk.region_result = result != 0;
    value_id(pk.output);
    if (pk.in_place_input != -1) value_id(pk.in_place_input);
    pk.inputs.resize(n);
    for (int& v : pk.inputs)
      if (!(s >> v)) throw bad("missing inputs");
    if (candidates) {
      size_t nc = 0;
      if (!(s >> nc) || nc > n) throw bad("a kernel needs its count of in-place candidates");
      pk.in_place_candidates.resize(nc);
      for (int& v : pk.in_place_candidates)
        if (!(s >> v) || std::find(pk.inputs.begin(), pk.inputs.end(), v) == pk.inputs.end())
          throw bad("an in-place candidate must be one of the kernel's inputs");
    }
    if (inline_inputs) {
      size_t nf = 0;
      if (!(s >> nf) || nf > n) throw bad("a kernel needs its count of inline inputs");
      pk.inline_inputs.resize(nf);
      for (InlineInput& f : pk.inline_inputs)
        if (!(s >> f.value >> f.share) || !(f.share >= 0) ||
            std::find(pk.inputs.begin(), pk.inputs.end(), f.value) == pk.inputs.end())
          throw bad("an inline input must be one of the kernel's inputs, with a share >= 0");
    }
    for (int v : pk.inputs)
      if (g.values[static_cast<size_t>(value_id(v))].producer >= static_cast<int>(k))
        throw bad("kernel " + std::to_string(k) + " reads value " + std::to_string(v) +
                  " before it is written");
    std::string bar;
    if (s >> bar && bar == "|") {
      std::getline(s >> std::ws, file.kernel_names[k]);
    }
  }
  // The planner indexes by these: a producer must name the kernel that writes the value.
  for (size_t v = 0; v < nv; ++v) {
    int p = g.values[v].producer;
    if (p != -1 && (p < 0 || static_cast<size_t>(p) >= nk ||
                    g.kernels[static_cast<size_t>(p)].output != static_cast<int>(v)))
      throw bad("value " + std::to_string(v) + " names producer " + std::to_string(p) +
                ", which does not write it");
  }
  for (size_t k = 0; k < nk; ++k)
    if (g.values[static_cast<size_t>(g.kernels[k].output)].producer != static_cast<int>(k))
      throw bad("kernel " + std::to_string(k) + " writes a value produced elsewhere");
  return file;
}

std::string plan_dump_path(bool training_step) {
  std::optional<std::string> set = settings::text("KILN_PLAN_DUMP");
  if (!set) return {};
  std::string path = *set;
  if (size_t at = path.find("%n"); at != std::string::npos) {
    // Six digits keep the files in evaluation order when listed by name.
    static std::atomic<uint64_t> evaluations{0};
    char number[24];
    std::snprintf(number, sizeof number, "%06llu",
                  static_cast<unsigned long long>(evaluations.fetch_add(1)));
    path.replace(at, 2, number);
    return path;
  }
  // One file: once a training step is in it, evaluations after training (a test pass,
  // sampling) leave it alone, so it holds the step a user means to plan. Another path set
  // later starts afresh.
  static std::mutex mutex;
  static std::string holds_training_step;
  std::lock_guard lock(mutex);
  if (training_step) {
    holds_training_step = path;
    return path;
  }
  return path == holds_training_step ? std::string() : path;
}

}  // namespace kiln::memory
