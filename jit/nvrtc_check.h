#pragma once
// The NVRTC compile check: with KILN_NVRTC_CHECK set (e.g. "80,90"), every new kernel the
// CPU executor generates is also printed for CUDA and compiled for each listed sm_XX, so
// machines without a GPU prove that every generated CUDA kernel compiles.
#include <vector>

#include "kernel_ir.h"

namespace kiln::jit {

/// No-op unless KILN_NVRTC_CHECK lists architectures; prints `ir` for CUDA and compiles it
/// for each through the kernel cache (once per structure per process). Without NVRTC it
/// prints one warning and skips. Throws CompileError when a kernel does not compile.
void nvrtc_check_kernel(const KernelIR& ir);

/// The architectures KILN_NVRTC_CHECK lists (read once); empty when unset. Throws
/// ValueError for a malformed list.
const std::vector<int>& nvrtc_check_archs();

}  // namespace kiln::jit
