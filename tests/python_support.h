#pragma once
// The Python that interop and parity tests run: the one scripts/setup_torch.sh installs
// (torch, safetensors, numpy) when it is there, else the system's. Tests that need a module
// ask python_has() first and WARN that they are skipped when it is missing.
#include <cstdlib>
#include <string>

namespace kiln::test {

/// .venv-torch/wrap/python3 in the source tree when it is executable, else "python3".
inline std::string python3() {
#ifdef KILN_SOURCE_DIR
  std::string venv = std::string(KILN_SOURCE_DIR) + "/.venv-torch/wrap/python3";
  if (std::system(("test -x " + venv).c_str()) == 0) return venv;
#endif
  return "python3";
}

/// Whether python3() can import `modules` ("torch, safetensors").
inline bool python_has(const std::string& modules) {
  return std::system((python3() + " -c 'import " + modules + "' > /dev/null 2>&1").c_str()) == 0;
}

}  // namespace kiln::test
