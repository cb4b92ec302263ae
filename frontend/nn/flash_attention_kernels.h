#pragma once
// The two custom kernels behind nn::functional::flash_attention (flash_attention.h); the
// .cpp says what each body computes and how the CPU work is split.
#include <cstdint>

#include "../custom_kernel.h"

namespace kiln::nn::detail {

/// The CPU bodies' tile product (C = A B on the GEMM library, one thread) as the integer the
/// kernels read from opts[3]: custom kernels see only their inputs, so the address is one.
int64_t flash_gemm_address();
/// Keys per backward task at the least: the caller splits each batch-head's keys into at most
/// ceil(S / this) chunks (flash_backward_spec).
constexpr int64_t kFlashMinChunkKeys = 128;

/// Forward: (q, k, v, mask, opts, scale) -> out [N, L, DV + 1], each row's output followed
/// by its log-sum-exp. opts = {causal, div, has_mask, flash_gemm_address()}.
CustomKernelSpec flash_forward_spec();
/// Backward: (q, k, v, mask, opts, scale, fwd, dout, delta) -> grads
/// [N, C*L*D + S*D + S*DV]: C partial dq (one per chunk of keys; their sum is dq), then dk and
/// dv of each batch-head. The CPU body reads C from the shape of grads; the CUDA body needs
/// C = 1.
CustomKernelSpec flash_backward_spec();

}  // namespace kiln::nn::detail
