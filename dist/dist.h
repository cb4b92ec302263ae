#pragma once
// kiln::dist in one include: communicators (MPI, NCCL, single process), data parallelism and
// the distributed sampler. docs/distributed.md is the guide.
#include "communicator.h"
#include "data_parallel.h"
#include "sampler.h"
