#pragma once
// Moving values between devices: the `to_device` meta-op (a materialized copy that never
// fuses) and the rule that lets device-free computations follow their consumers.
#include <vector>

#include "../core/tensor.h"

namespace kiln {

/// `x` on `device`: a lazy copy (no-op when already there); differentiable.
Tensor to(const Tensor& x, Device device);

namespace detail {
/// The device an op with these inputs runs on. Inputs that are pending computations of
/// nothing but fills, coordinates and counter-based random numbers (a mask, an index ramp,
/// a weak scalar) carry no data, so they are rebuilt on that device in place; any other
/// input elsewhere raises DeviceError naming `op` and both devices.
Device align_devices(const char* op, std::vector<Tensor*> inputs);
/// Gradient of a transfer: the incoming gradient moved back to the input's device.
std::vector<Tensor> transfer_vjp(const Node& node, const Tensor& g);
/// A copy of `src` (the value of a node of `dtype`) in the memory of `device`. Synchronous
/// when the destination is the host.
std::shared_ptr<Buffer> copy_buffer(const Buffer& src, Device device);
}  // namespace detail

}  // namespace kiln
