#pragma once
// Prints kernel IR as self-contained CUDA C++ (no #include) for NVRTC. One IR becomes one
// module of one or more stages (extern "C" __global__ functions) launched in order on one
// stream. Every stage has the signature
//   extern "C" __global__ void NAME(const KArgs a, long long extent)
//   struct KArgs { char* b[num_buffers]; long long P[num_params]; };   // passed by value
// with b[0] the output, b[1..n] the inputs, b[n+1] the scratch, b[n+2] an int64[4] error
// record zeroed by the host (err[0] != 0: IndexError with site err[1], value err[2], size
// err[3]). Results match the CPU kernels bit for bit except for transcendental functions, NaN
// payloads (the hardware conversions give canonical NaNs) and
// the summation order of reductions (fixed per launch configuration, so deterministic).
#include <cstdint>
#include <string>
#include <vector>

#include "printer_common.h"

namespace kiln::jit {

/// One launch of a printed CUDA kernel.
struct CudaStage {
  std::string entry;  ///< extern "C" __global__ function name in the module
  /// What `extent` is: Output = the output's numel; Work = LoweredKernel::parallel_extent;
  /// Partials = the grid size the previous stage was launched with.
  enum class Extent : uint8_t { Output, Work, Partials } extent;
  int block = 256;                ///< threads per block
  int64_t items_per_block = 256;  ///< grid = min(ceil(extent / items_per_block), max_grid), >= 1
  bool single_block = false;      ///< launch exactly one block
};

/// A printed CUDA module and how to launch it.
struct PrintedCudaKernel {
  std::string source;             ///< complete CUDA source, no #include
  std::vector<CudaStage> stages;  ///< launched in order on one stream
  /// PerBlock: b[n+1] holds one accumulator per block of stage 0 (kept == 0 reductions);
  /// PerOutput: one accumulator per output element (scatters).
  enum class Scratch : uint8_t { None, PerBlock, PerOutput } scratch = Scratch::None;
  int scratch_elem_bytes = 0;  ///< 4 or 8 (accumulator_dtype(ir)); 0 without scratch
  int num_buffers = 0;         ///< n_in + 3
  int num_params = 0;          ///< max(ir.num_params, 1)
};

/// Prints `ir` for CUDA (see the file comment for the ABI).
PrintedCudaKernel print_cuda(const KernelIR& ir);

}  // namespace kiln::jit
