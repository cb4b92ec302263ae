#pragma once
// Custom kernels, as Jittor's jt.code and MLX's fast::metal_kernel: a C++ (CPU) and/or CUDA
// body with declared inputs and outputs, compiled through kiln's own JIT and kernel cache
// and run as a node of the lazy graph. docs/extending.md is the guide.
//
// The body must be a pure function of its inputs: it writes every element of its outputs,
// reads nothing else (no globals, clocks, files or random state) and gives the same bits
// each run. The memory planner may drop an output and run the kernel again to rebuild it,
// and each output node runs the kernel itself (the other outputs of that run are scratch).
#include <functional>
#include <string>
#include <vector>

#include "../core/tensor.h"

namespace kiln {

/// What a custom kernel is: names, and its code for each device kind.
struct CustomKernelSpec {
  /// An identifier naming the kernel in errors, dumps and the kernel cache.
  std::string name;
  /// Input names as the body uses them (identifiers), in call order.
  std::vector<std::string> inputs;
  /// Output names as the body uses them (identifiers), in the order returned.
  std::vector<std::string> outputs;
  /// C++ body run once, on one thread, for a CPU call (or per range of tasks: cpu_tasks). No
  /// #include is needed or wise (each costs compile time); the body sees, per input/output `x`: a
  /// typed pointer `x` (const for inputs), `x_shape[d]`, `x_ndim` and `x_numel` (long long). Data
  /// is contiguous, row-major.
  std::string cpu_source;
  /// CUDA body for a call on a CUDA device, run by one thread per element of the first output
  /// (blocks of cuda_block threads; the last block has spare threads the body must skip):
  /// the same bindings, plus CUDA's threadIdx/blockIdx/blockDim.
  std::string cuda_source;
  /// Code placed before the entry point, for both sources (helper functions, constants).
  std::string header;
  /// When set, a C++ expression over the shape bindings (e.g. "q_shape[0] * 4") giving a
  /// number of tasks: the CPU body then runs in parallel on kiln's thread pool, each call
  /// over tasks [kiln_task_begin, kiln_task_end) (long long). Each task must write its own
  /// elements, computed the same way whichever call runs it, so the bits do not depend on
  /// the split. Empty: the body runs once, on one thread.
  std::string cpu_tasks;
  /// Threads per CUDA block.
  int cuda_block = 256;
};

/// The shape and dtype of one output of a call.
struct KernelOutput {
  Shape shape;
  DType dtype = DType::Float32;
};

/// A custom kernel's gradient: the inputs' gradients (one per input, undefined where none)
/// from the call's inputs, outputs and the outputs' gradients. Built from kiln ops or from
/// other custom kernels; ops built from differentiable values can be differentiated again.
using CustomKernelGrad = std::function<std::vector<Tensor>(
    const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
    const std::vector<Tensor>& grad_outputs)>;

/// A user kernel: validated when made, compiled for each combination of input/output dtypes,
/// ranks and device it is called with (once per process; the disk cache keeps the objects).
class CustomKernel {
 public:
  /// Checks the names (identifiers, distinct) and that there is some source; throws
  /// ValueError naming the kernel otherwise.
  explicit CustomKernel(CustomKernelSpec spec, CustomKernelGrad grad = {});
  /// Builds the kernel's outputs over `inputs` lazily (nothing runs); compiles the body now
  /// if this signature is new, so a CompileError (with the compiler's diagnostic and the
  /// kernel's name) is raised here. Without a gradient the outputs are not differentiable.
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs,
                                 const std::vector<KernelOutput>& outputs) const;
  /// The spec it was made from.
  const CustomKernelSpec& spec() const { return spec_; }
  /// The source printed for a call with these input and output dtypes and ranks, on `device`
  /// (what the kernel cache stores; for inspection and NVRTC checks without a GPU).
  std::string source_for(const std::vector<Tensor>& inputs,
                         const std::vector<KernelOutput>& outputs, Device device) const;

 private:
  CustomKernelSpec spec_;
  CustomKernelGrad grad_;
};

}  // namespace kiln
