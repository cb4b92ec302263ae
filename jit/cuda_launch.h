#pragma once
// Running lowered kernels on a CUDA device: the CUDA printer's source, compiled by NVRTC for
// the device's architecture (through the kernel cache), loaded once per device and launched
// stage by stage on kiln's stream for that device.
#include "../core/node.h"
#include "kernel_ir.h"

namespace kiln::jit {

/// Computes `root` (a node on a CUDA device) with the kernel `lk`; the inputs' buffers must
/// be on the same device. Throws IndexError for out-of-range gathers, as the CPU path does.
void run_cuda_kernel(const LoweredKernel& lk, Node& root);

}  // namespace kiln::jit
