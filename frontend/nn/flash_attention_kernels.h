#pragma once
// The two custom kernels behind nn::functional::flash_attention (flash_attention.h); the
// .cpp says what each body computes and how the CPU work is split.
#include "../custom_kernel.h"

namespace kiln::nn::detail {

/// Forward: (q, k, v, mask, opts, scale) -> out [N, L, DV + 1], each row's output followed
/// by its log-sum-exp.
CustomKernelSpec flash_forward_spec();
/// Backward: (q, k, v, mask, opts, scale, fwd, dout, delta) -> grads [N, L*D + S*D + S*DV],
/// dq, dk and dv of each batch-head one after another.
CustomKernelSpec flash_backward_spec();

}  // namespace kiln::nn::detail
