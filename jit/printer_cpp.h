#pragma once
// Prints kernel IR as self-contained C++ (no #include) for the CPU compilers.
#include <string>

#include "printer_common.h"

namespace kiln::jit {

/// A printed kernel: its extern "C" entry point and the complete source.
struct PrintedKernel {
  std::string entry;
  std::string source;
};

/// Prints `ir`. The entry point has the signature
/// `void entry(char** bufs, const long long* params, long long begin, long long end, long long
/// part)`: bufs[0] is the output (the accumulator for scatters), bufs[1..n] the inputs, bufs[n+1]
/// per-thread partials of a whole-tensor reduction, bufs[n+2] the error record.
PrintedKernel print_cpp(const KernelIR& ir);

}  // namespace kiln::jit
