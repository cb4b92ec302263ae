#pragma once
// cuBLAS, loaded at run time (dlopen of libcublas.so.13 or .12) like the driver, for the
// library GEMM on CUDA. kiln keeps one handle per device, bound to kiln's stream.
#include <cstdint>
#include <optional>
#include <string>

#include "../core/dtype.h"

namespace kiln::jit {

/// True when libcublas was found and has the functions kiln uses.
bool cublas_available();
/// The library kiln loaded ("libcublas.so.13"), or why none could be.
std::string cublas_status();

/// Row-major strided-batched C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] on kiln's
/// stream of `device`, for float32/float16/bfloat16/float64 (float16/bfloat16 accumulate in
/// float32). op(A) is m x k, op(B) k x n, C m x n; lda/ldb/ldc are row strides in elements of
/// the stored matrices, stride_* the elements between batch entries. Pointers are device
/// pointers. `c_dtype` is C's type: `dtype` itself, or float32 for float16/bfloat16 A and B
/// (mixed precision on tensor cores, the result not rounded to half). Throws DeviceError (no
/// cuBLAS, a failed call) or DTypeError/ValueError.
void cublas_gemm(int device, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                 int64_t k, const void* a, int64_t lda, int64_t stride_a, const void* b,
                 int64_t ldb, int64_t stride_b, void* c, int64_t ldc, int64_t stride_c,
                 int64_t batch, float alpha, float beta, std::optional<DType> c_dtype = {});

}  // namespace kiln::jit
