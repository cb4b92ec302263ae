#pragma once
// kiln::dist in one include: communicators (MPI, NCCL, single process), data parallelism, the
// distributed sampler and ZeRO-1. docs/distributed.md is the guide.
#include "communicator.h"
#include "data_parallel.h"
#include "sampler.h"
#include "zero.h"
