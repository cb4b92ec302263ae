#pragma once
// The public API: include this one header and link kiln::kiln.
#include "../core/graph_dump.h"
#include "../core/tensor.h"
#include "../jit/executor.h"
#include "../jit/kernel_cache.h"
#include "../ops/ops.h"
#include "data.h"
#include "lr_scheduler.h"
#include "nn/nn.h"
#include "optim.h"
#include "serialize.h"
#include "state_dict.h"
