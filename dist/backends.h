#pragma once
// The backends behind dist::world() and dist::make_nccl(); private to dist/.
#include <memory>
#include <string>

#include "communicator.h"

namespace kiln::dist::detail {

/// The size-1 communicator: host buffers, every collective a copy.
std::unique_ptr<Communicator> make_single_process();
/// Initialises MPI (MPI_Init_thread) and wraps MPI_COMM_WORLD. Throws DistError when kiln
/// was built without MPI or MPI fails to start.
std::unique_ptr<Communicator> make_mpi();
/// Calls MPI_Finalize if make_mpi() initialised MPI (no-op otherwise).
void finalize_mpi();
/// MPI_Abort on the world when MPI is running; returns otherwise.
void abort_mpi(int code);
/// Elements of work per MPI call must fit an int; throws DistError naming `what` otherwise.
int checked_count(int64_t count, const std::string& what);

/// The timeout of one collective in seconds (KILN_DIST_TIMEOUT, default 300).
double timeout_seconds();

/// A new evaluated constant tensor holding `buffer` (the results of collectives, and the
/// flat vectors ZeRO packs by copying).
Tensor constant_from(std::shared_ptr<Buffer> buffer, const Shape& shape, DType dtype,
                     Device device);

}  // namespace kiln::dist::detail
