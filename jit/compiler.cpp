// Selection of the CPU compiler and the host CPU description shared by both compilers.
#include "jit/compiler.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/settings.h"

namespace kiln::jit {

bool have_llvm() {
#ifdef KILN_WITH_LLVM
  return true;
#else
  return false;
#endif
}

std::unique_ptr<CpuCompiler> make_cpu_compiler(const std::string& name) {
  if (name == "external") return detail::make_external_compiler();
#ifdef KILN_WITH_LLVM
  if (name == "llvm") return detail::make_llvm_compiler();
#endif
  return nullptr;
}

CpuCompiler& cpu_compiler() {
  // Built once; a failed construction (bad KILN_CPU_COMPILER) throws and is retried on the
  // next call, as C++ guarantees for function-local statics.
  static const std::unique_ptr<CpuCompiler> compiler = [] {
    std::string name =
        settings::text("KILN_CPU_COMPILER").value_or(have_llvm() ? "llvm" : "external");
    auto made = make_cpu_compiler(name);
    if (!made) {
      if (name == "llvm")
        throw ValueError("[jit] KILN_CPU_COMPILER=llvm, but this kiln was built without "
                         "LLVM (-DKILN_WITH_LLVM=OFF); use KILN_CPU_COMPILER=external");
      throw ValueError("[jit] KILN_CPU_COMPILER='" + name +
                       "' is not a CPU compiler; expected 'llvm' or 'external'");
    }
    return made;
  }();
  return *compiler;
}

namespace {

#ifndef KILN_WITH_LLVM
// Without LLVM the cache key only needs a string that is stable on one machine and differs
// between machines whose CPUs could run different code: the model name plus the sorted
// feature flags the kernel reports.
std::string cpuinfo_features() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown-cpu";
  std::set<std::string> flags;
  bool have_model = false, have_flags = false;
  while (std::getline(in, line) && !(have_model && have_flags)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    std::string value = line.substr(colon + 1);
    if (!have_model && key == "model name") {
      value.erase(0, value.find_first_not_of(" \t"));
      model = value;
      have_model = true;
    } else if (!have_flags && (key == "flags" || key == "Features")) {
      std::istringstream words(value);
      std::string flag;
      while (words >> flag) flags.insert(flag);
      have_flags = true;
    }
  }
  std::replace(model.begin(), model.end(), ' ', '_');
  std::string out = model + " ";
  bool first = true;
  for (const auto& f : flags) {
    if (!first) out += ',';
    out += "+" + f;
    first = false;
  }
  return out;
}
#endif

}  // namespace

const std::string& host_cpu_features() {
  static const std::string features =
#ifdef KILN_WITH_LLVM
      detail::llvm_host_cpu_features();
#else
      cpuinfo_features();
#endif
  return features;
}

}  // namespace kiln::jit
