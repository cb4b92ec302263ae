#pragma once
// Automatic mixed precision (PyTorch's torch.autocast semantics): inside an autocast scope,
// ops that gain from half precision (products: matmul, linear, convolutions, attention)
// take float32 operands in the scope's half dtype, and ops that need float32's range or
// precision (exp, log, pow, softmax, log_softmax, logsumexp, sums and means, norms,
// losses) take half operands in float32. Other ops follow ordinary promotion. The casts are
// graph nodes, so autograd differentiates through them and each backward op runs in the
// dtype its forward op ran in. The state is per thread and per device kind.
#include <optional>

#include "../core/device.h"
#include "../core/tensor.h"

namespace kiln::amp {

/// The autocast setting of one device kind on this thread.
struct AutocastState {
  bool enabled = false;
  /// The half dtype products run in: bfloat16 by default on the CPU, float16 on CUDA.
  DType dtype = DType::BFloat16;
};

/// This thread's setting for devices of `device`'s kind (CPU or CUDA).
AutocastState autocast_state(const Device& device = Device::cpu());

/// An autocast scope (RAII): sets this thread's setting for `device`'s kind and restores the
/// previous one when it ends, so scopes nest, and `autocast(device, {}, false)` turns
/// autocast off inside another. Throws DTypeError for a dtype other than float16/bfloat16.
class autocast {
 public:
  explicit autocast(const Device& device = Device::cpu(), std::optional<DType> dtype = {},
                    bool enabled = true);
  ~autocast();
  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;

 private:
  bool cuda_;
  AutocastState saved_;
};

/// Autocast off on both device kinds for a scope: autograd builds backward graphs under it
/// (each backward op then takes its forward op's dtypes, as PyTorch's backward does), and
/// optimizers build their updates under it.
class autocast_off {
 public:
  autocast_off() : cpu_(Device::cpu(), {}, false), cuda_(Device::cuda(0), {}, false) {}

 private:
  autocast cpu_, cuda_;
};

/// Lower-precision policy (the product ops call it on their operands): a float32 (or the
/// other half type's) tensor becomes the autocast dtype where autocast is on for its device;
/// anything else is returned as it is (float64 stays float64, as in PyTorch).
Tensor lower_precision(const Tensor& x);
/// Float32 policy (exp, log, softmax, norms, reductions, losses call it on their inputs): a
/// float16/bfloat16 tensor becomes float32 where autocast is on for its device.
Tensor full_precision(const Tensor& x);

}  // namespace kiln::amp
