#pragma once
// The public API: include this one header and link kiln::kiln.
#include "../core/graph_dump.h"
#include "../core/tensor.h"
#include "../ops/ops.h"
