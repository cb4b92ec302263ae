#pragma once
// Runs tests/trainapi_torch.py (PyTorch computing what a test computed with kiln) and reads
// back its "NAME v0 v1 ..." lines. Tests ask torch_available() first and WARN that they are
// skipped when the Python of python_support.h cannot import torch.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "frontend/serialize.h"
#include "python_support.h"
#include "test_files.h"

namespace kiln::test {

inline bool torch_available() { return python_has("torch"); }

/// The results trainapi_torch.py prints for `mode` with `inputs` and the JSON `spec`, by
/// name; empty when the script failed (its output is logged with UNSCOPED_INFO).
inline std::map<std::string, std::vector<double>> torch_results(const std::string& mode,
                                                                const StateDict& inputs,
                                                                const std::string& spec) {
  TempDir dir("kiln_trainapi_torch");
  const std::string path = dir.file("in.safetensors");
  StateDict to_save = inputs;
  if (to_save.empty()) to_save["unused"] = kiln::tensor(0.0);
  save_safetensors(path, to_save);
  // From the source tree's root: __FILE__ may be relative to the build directory.
  const std::string script = std::string(KILN_SOURCE_DIR) + "/tests/trainapi_torch.py";
  // Its own cache and home for anything PyTorch might write: nothing under ~/.cache.
  const std::string cmd = "XDG_CACHE_HOME=" + dir.file("xdg") + " TORCH_HOME=" + dir.file("torch") +
                          " " + python3() + " " + script + " " + mode + " " + path + " '" + spec +
                          "' 2>&1";
  std::map<std::string, std::vector<double>> out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  std::string text;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) text.append(buf, n);
  const bool ok = pclose(p) == 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    std::vector<double> values;
    std::string v;
    bool numbers = !name.empty();
    // strtod reads "nan" and "inf", which operator>> does not. A line that is not all
    // numbers after its name (a warning PyTorch printed) is skipped.
    while (numbers && fields >> v) {
      char* end = nullptr;
      values.push_back(std::strtod(v.c_str(), &end));
      numbers = end == v.c_str() + v.size();
    }
    if (numbers) out[name] = std::move(values);
  }
  if (!ok) {
    UNSCOPED_INFO("trainapi_torch.py " << mode << " failed:\n" << text);
    out.clear();
  }
  return out;
}

}  // namespace kiln::test
