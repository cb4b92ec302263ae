#pragma once
// User kernels (frontend/custom_kernel.h) inside the JIT: their printed source, compiled
// through the kernel cache like any generated kernel (keyed by that source, so the disk
// cache lists them and a changed body compiles anew), and how the executor runs them.
#include <memory>
#include <string>
#include <vector>

#include "../core/custom_op.h"
#include "../core/node.h"

namespace kiln::jit {

/// One use of a user kernel as the printers see it: names, dtypes and ranks (sizes are
/// arguments, so a new batch size compiles nothing), and the user's code.
struct CustomKernelSignature {
  std::string name;
  std::vector<std::string> input_names, output_names;
  std::vector<DType> input_dtypes, output_dtypes;
  std::vector<int> input_ranks, output_ranks;
  std::string header;  ///< placed before the entry point (helper functions)
  std::string body;    ///< the entry point's body (C++ or CUDA)
  /// CPU only: a C++ expression over the shape bindings giving the number of tasks the
  /// body is split into across the thread pool (empty: the body runs once, serially).
  std::string cpu_tasks;
  int cuda_block = 256;
};

/// The C++ source of `s` (no #include): extern "C" void kiln_custom_<name>(char**, const
/// long long*), which binds each input and output to a typed pointer plus <name>_shape,
/// <name>_ndim and <name>_numel, then runs the body once on one thread. With cpu_tasks the
/// entry is long long kiln_custom_<name>(char**, const long long*, long long kiln_task_begin,
/// long long kiln_task_end): a negative begin returns the task count, else the body runs
/// over tasks [begin, end).
std::string print_custom_cpp(const CustomKernelSignature& s);
/// The CUDA source of `s`: extern "C" __global__ void kiln_custom_<name>(KilnCustomArgs),
/// with the same bindings; launched with one thread per element of the first output.
std::string print_custom_cuda(const CustomKernelSignature& s);
/// The entry point's name, "kiln_custom_<name>".
std::string custom_entry(const CustomKernelSignature& s);

/// Compiles `s` for `device` through the kernel cache (a CompileError names the kernel and
/// carries the compiler's log) and returns one payload per output, for Custom nodes whose
/// outputs have `output_shapes`.
std::vector<std::shared_ptr<const CustomKernelOp>> compile_custom_kernel(
    const CustomKernelSignature& s, Device device, const std::vector<Shape>& output_shapes);

/// Computes a custom kernel node (OpCode::Custom) on its device: the output buffer comes
/// from the memory plan or is allocated here, the inputs must hold their values.
void run_custom_kernel(Node& node);

}  // namespace kiln::jit
