#pragma once
// The CPU GEMM libraries behind library GEMM, and which one runs a product. float32 goes to
// oneDNN where kiln was built with it: it picks its kernels by the CPU's instruction-set
// features at run time (AVX2, AVX-512, AMX), as PyTorch's CPU path does, where OpenBLAS
// 0.3.21 picks them from a table of CPU models and falls back to SSE3 code on a model it
// does not know. OpenBLAS runs float64 (oneDNN has no dgemm) and float32 without oneDNN.
#include <cstdint>
#include <string>

#include "../core/dtype.h"

namespace kiln::jit {

/// What runs one dtype's CPU GEMMs: library name and version, and the kernel path it chose
/// on this CPU (an ISA such as "avx512_core_bf16", or an OpenBLAS core such as "Haswell").
struct GemmPath {
  std::string library;   ///< "oneDNN", "OpenBLAS", or "none" (generated kernels)
  std::string version;   ///< e.g. "2.6.3"; empty for "none"
  std::string kernels;   ///< the ISA or core name the library picked
  bool generic = false;  ///< a baseline path on a CPU that has AVX2 or better
};

/// The library path of one dtype's GEMMs: float32 and float64 as above; float16 and
/// bfloat16 on oneDNN's matmul primitive where it has kernels for this CPU, else widened to
/// float32 (kernels then ends in "(via float32)"); other dtypes: generated kernels.
GemmPath gemm_path(DType dtype);

/// True when some library runs CPU GEMMs of `dtype`.
bool cpu_gemm_available(DType dtype);

/// One single-threaded row-major product C = A @ B (+ C when `accumulate`) of `dtype`
/// matrices A and B: float32 or float64 (C the same), or float16/bfloat16 (C float32, the
/// products accumulated in float32; with `half_result`, C in `dtype`, the float32 sums rounded
/// once, and no `accumulate`), on the library gemm_path(dtype) names; `ta`/`tb` read A/B
/// transposed. The first call on a generic path prints one warning.
void cpu_gemm(DType dtype, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a,
              int64_t lda, const void* b, int64_t ldb, bool accumulate, void* c, int64_t ldc,
              bool half_result = false);

/// How oneDNN runs one layout of a float16/bfloat16 cpu_gemm (arguments as there): its
/// implementation (impl_info_str, e.g. "brg:avx512_core_amx_bf16" or "gemm:jit"), and which
/// matrices are first copied into dense buffers (brgemm takes only dense ones). An empty
/// implementation: oneDNN has no kernels for it here and the product is widened to float32.
struct HalfGemmKernel {
  std::string implementation;
  bool dense_a = false, dense_b = false, dense_c = false;
};
HalfGemmKernel half_gemm_kernel(DType dtype, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                int64_t lda, int64_t ldb, int64_t ldc, bool accumulate,
                                bool half_result = false);

}  // namespace kiln::jit
