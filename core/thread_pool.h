#pragma once
// The kiln thread pool: runs a kernel's outer range on all cores.
//
// Partitions are deterministic: for a given n, grain and pool size, chunk k is always the
// same range (chunk_begin), whichever thread happens to run it. Kernels that keep
// per-chunk partial results (whole-tensor reductions) therefore combine the same partials
// in the same order on every run, and recomputed values are bit-identical.
#include <cstdint>
#include <functional>
#include <memory>

namespace kiln {

/// First index of chunk k when [0, n) is split into `parts` contiguous chunks whose sizes
/// differ by at most one (the first n % parts chunks get the extra item).
/// chunk_begin(n, parts, parts) == n.
inline int64_t chunk_begin(int64_t n, int64_t parts, int64_t k) {
  int64_t base = n / parts, extra = n % parts;
  return k * base + (k < extra ? k : extra);
}

/// Number of chunks parallel_for uses for n items: at most `threads`, each of at least
/// `grain` items (grain <= 0 counts as 1), at least 1 when n > 0, 0 when n <= 0.
int64_t chunk_count(int64_t n, int64_t grain, int threads);

class ThreadPool {
 public:
  /// A pool of `threads` threads in all, the calling thread included (threads - 1 workers
  /// are started); values below 1 count as 1.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Number of threads that run chunks, the caller included.
  int size() const;

  /// Runs fn(begin, end) over [0, n) split into chunk_count(n, grain, size()) contiguous
  /// chunks (boundaries from chunk_begin); blocks until done; rethrows the first exception
  /// (chunks not yet started are then skipped). n <= grain runs fn(0, n) inline with no
  /// synchronization. A call from inside a chunk, or while another host thread is using
  /// the pool, runs the same chunks one after another on the calling thread.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// The process-wide pool; its size is KILN_NUM_THREADS, default usable_cpus(). Created on first
/// use; a bad KILN_NUM_THREADS raises ValueError from every call until it is fixed.
ThreadPool& thread_pool();

/// Resizes the process-wide pool to `threads` (>= 1; ValueError otherwise), overriding
/// KILN_NUM_THREADS (torch.set_num_threads). The old pool's workers are joined, so call it
/// only while no evaluation runs on any thread (at start-up or between steps).
void set_num_threads(int threads);
/// Size of the process-wide pool, the calling thread included.
int get_num_threads();
/// CPUs this process may run on: its affinity mask (as set by mpiexec's binding, taskset or
/// a container's cpuset), at least 1; hardware_concurrency() where the mask is unreadable.
int usable_cpus();

}  // namespace kiln
