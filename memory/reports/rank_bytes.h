#pragma once
// What one rank of a data-parallel job holds of the training state: parameters, gradients
// and optimizer state, in bytes. kiln::dist's DataParallel and ZeroRedundancyOptimizer
// register a source here while they live (memory/ knows nothing of dist/), so that
// memory::report() and memory::plan_report() show what ZeRO's sharding leaves on this rank.
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace kiln::memory {

/// One holder's share of the training state on this rank.
struct RankBytes {
  std::string holder;     ///< Who holds it: "DataParallel", "ZeRO-2 (Adam)".
  int rank = 0;           ///< This process's rank.
  int ranks = 1;          ///< Ranks of the job (1 in a single process).
  size_t parameters = 0;  ///< Bytes of parameters held here.
  size_t gradients = 0;   ///< Bytes of gradients held here (defined ones only).
  /// Bytes of optimizer state held here; empty when the holder does not own the optimizer.
  std::optional<size_t> optimizer_state;
};

/// A function that reports a holder's bytes when asked (called by the reports).
using RankBytesSource = std::function<RankBytes()>;

/// Registers `source` until remove_rank_bytes_source(id); returns that id.
int add_rank_bytes_source(RankBytesSource source);
/// Unregisters a source (an unknown id is ignored).
void remove_rank_bytes_source(int id);
/// Every registered source's figures, in registration order.
std::vector<RankBytes> rank_bytes();
/// One line per source ("[rank 1 of 2] ZeRO-2 (Adam): parameters ..."), or "" when none is
/// registered (a program without DataParallel or ZeRO).
std::string rank_bytes_report();

}  // namespace kiln::memory
