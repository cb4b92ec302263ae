// The NVRTC compile check (see nvrtc_check.h). Structures already checked in this process
// are skipped before printing; a kernel checked by an earlier process is a disk hit of the
// kernel cache, so a warm test run compiles nothing.
#include "jit/nvrtc_check.h"


#include <cstdlib>
#include <mutex>
#include <sstream>
#include <unordered_set>

#include "core/error.h"
#include "core/log.h"
#include "core/settings.h"
#include "jit/nvrtc.h"
#include "jit/printer_cuda.h"

namespace kiln::jit {

const std::vector<int>& nvrtc_check_archs() {
  static const std::vector<int> archs = [] {
    std::vector<int> out;
    const std::optional<std::string> value = settings::text("KILN_NVRTC_CHECK");
    if (!value || *value == "0") return out;
    const char* text = value->c_str();
    std::stringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) {
      char* end = nullptr;
      long arch = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || arch < 10 || arch > 999)
        settings::reject("KILN_NVRTC_CHECK", text, "'" + item + "' is not a compute capability");
      out.push_back(static_cast<int>(arch));
    }
    return out;
  }();
  return archs;
}

void nvrtc_check_kernel(const KernelIR& ir) {
  const std::vector<int>& archs = nvrtc_check_archs();
  if (archs.empty()) return;
  if (!nvrtc_available()) {
    static std::once_flag warned;
    std::call_once(warned, [] {
      log_line(
          "kiln: warning: KILN_NVRTC_CHECK is set but NVRTC is not available; "
          "CUDA kernels are not compile-checked");
    });
    return;
  }
  static std::mutex mutex;
  static std::unordered_set<uint64_t> checked;
  const uint64_t key = ir.structure_hash();
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (checked.count(key)) return;
  }
  const PrintedCudaKernel k = print_cuda(ir);
  for (int arch : archs) cuda_kernel_image(k, ir.source_ops, arch);
  std::lock_guard<std::mutex> lock(mutex);
  checked.insert(key);
}

}  // namespace kiln::jit
