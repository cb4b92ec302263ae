#pragma once
// Named tensors of a model: what Module::state_dict() returns and safetensors files hold.
#include <map>
#include <string>

#include "../core/tensor.h"

namespace kiln {

/// Parameter and buffer names ("encoder.layers.0.linear1.weight") to tensors, sorted by name.
using StateDict = std::map<std::string, Tensor>;

}  // namespace kiln
