#include "autocast.h"

#include "../core/error.h"
#include "elementwise.h"

namespace kiln::amp {
namespace {

thread_local AutocastState t_cpu{false, DType::BFloat16};
thread_local AutocastState t_cuda{false, DType::Float16};

bool is_half(DType d) { return d == DType::Float16 || d == DType::BFloat16; }

}  // namespace

AutocastState autocast_state(const Device& device) { return device.is_cuda() ? t_cuda : t_cpu; }

autocast::autocast(const Device& device, std::optional<DType> dtype, bool enabled)
    : cuda_(device.is_cuda()), saved_(cuda_ ? t_cuda : t_cpu) {
  AutocastState next = saved_;
  if (dtype) {
    if (!is_half(*dtype)) {
      throw DTypeError("[autocast] expected float16 or bfloat16 as the autocast dtype, got " +
                       std::string(dtype_name(*dtype)));
    }
    next.dtype = *dtype;
  }  // else the thread's current dtype (PyTorch's get_autocast_dtype), the default at first
  next.enabled = enabled;
  (cuda_ ? t_cuda : t_cpu) = next;
}

autocast::~autocast() { (cuda_ ? t_cuda : t_cpu) = saved_; }

Tensor lower_precision(const Tensor& x) {
  if (!x.defined()) return x;
  const AutocastState s = autocast_state(x.device());
  if (!s.enabled || !(x.dtype() == DType::Float32 || is_half(x.dtype())) || x.dtype() == s.dtype)
    return x;
  return cast(x, s.dtype);
}

Tensor full_precision(const Tensor& x) {
  if (!x.defined() || !is_half(x.dtype()) || !autocast_state(x.device()).enabled) return x;
  return cast(x, DType::Float32);
}

}  // namespace kiln::amp
