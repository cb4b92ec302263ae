#pragma once
// NVRTC, loaded with dlopen on first use (libnvrtc.so.13 / .12 / libnvrtc.so, also under
// $CUDA_HOME/lib64 and /usr/local/cuda/lib64): kiln never links it, so one binary runs with
// or without the CUDA toolkit. Compiled images go through the kernel cache like CPU objects.
#include <cstdint>
#include <string>
#include <vector>

#include "kernel_cache.h"
#include "printer_cuda.h"

namespace kiln::jit {

/// True when libnvrtc was found and loaded.
bool nvrtc_available();
/// NVRTC's version, e.g. "13.0"; throws CompileError when NVRTC is unavailable.
std::string nvrtc_version();

/// A compiled CUDA module: CUBIN for "sm_XX", or PTX (NUL-terminated text) for "compute_XX".
struct CudaImage {
  std::vector<uint8_t> bytes;
  bool is_cubin = false;
  std::string target;
};

/// Compiles `source` for sm_<arch> (e.g. 90) to CUBIN; when NVRTC does not know that arch,
/// to PTX for the newest compute_XX it supports (the driver JIT-compiles it). Throws
/// CompileError whose message has the NVRTC log and `source_path_hint`.
/// With `ptx_only`, stops at PTX for compute_<arch> (front end and NVVM, without ptxas: a
/// third of the time; the corpus tests use it for breadth).
CudaImage nvrtc_compile(const std::string& source, int arch, const std::string& source_path_hint,
                        bool ptx_only = false);

/// A printed kernel's image for sm_<arch> from the process-wide kernel cache (memory, disk,
/// else NVRTC); thread-safe; the pointers stay valid for the process.
struct CudaKernelImage {
  const std::vector<uint8_t>* image;
  KernelRecord* record;
  std::mutex* record_mutex;  // guards *record, see count_use()
};
/// `load_check` as KernelCache::get_image's (the launcher loads the module there).
CudaKernelImage cuda_kernel_image(
    const PrintedCudaKernel& k, const std::vector<std::string>& source_ops, int arch,
    const std::function<void(const std::vector<uint8_t>&)>& load_check = {});

/// The ImageCompiler the cache uses for sm_<arch> (identity "nvrtc <version> <options>").
std::unique_ptr<ImageCompiler> make_nvrtc_compiler(int arch, bool ptx_only = false);

}  // namespace kiln::jit
