// Thread pool for kernel launches.
//
// Kernels are launched at high rates, so a launch must cost microseconds: workers spin
// briefly on a generation counter after each job before sleeping on a condition variable,
// and the caller runs chunks itself instead of only waiting. Chunks are claimed from an
// atomic counter, so a slow or descheduled worker never holds up the others, while each
// chunk's bounds stay a pure function of (n, grain, size) (see chunk_begin).
//
// One job runs at a time. A second host thread calling parallel_for while a job is
// running does not queue behind it: it runs its chunks itself, in order. Same for a call
// made from inside a chunk (nested parallelism), which would otherwise deadlock.
#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/settings.h"

#if defined(__linux__)
#include <pthread.h>
#endif

namespace kiln {

int64_t chunk_count(int64_t n, int64_t grain, int threads) {
  if (n <= 0) return 0;
  grain = std::max<int64_t>(grain, 1);
  return std::clamp<int64_t>(n / grain, 1, std::max(threads, 1));
}

namespace {

// True while this thread runs a chunk of some pool: parallel_for then stays on the thread.
thread_local bool t_inside_chunk = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until pred() or `micros` have passed; returns pred()'s last value. The clock is
// read every 64 iterations only.
template <typename Pred>
bool spin_until(Pred pred, int micros) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  for (int i = 1;; ++i) {
    if (pred()) return true;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) return pred();
  }
}

constexpr int kWorkerSpinMicros = 50;   // after a job, wait this long for the next one
constexpr int kCallerSpinMicros = 200;  // the caller waits for the other chunks

struct Job {
  const std::function<void(int64_t, int64_t)>* fn;
  int64_t n;
  int64_t parts;
  std::atomic<int64_t> next{0};  // next chunk to claim
  std::atomic<int64_t> done{0};  // chunks finished (or skipped after an error)
  std::atomic<int> active{0};    // workers inside run_chunks; changed under State::mutex
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;

  void run_chunks() {
    bool outer = t_inside_chunk;
    t_inside_chunk = true;
    for (;;) {
      int64_t k = next.fetch_add(1, std::memory_order_relaxed);
      if (k >= parts) break;
      if (!failed.load(std::memory_order_relaxed)) {
        try {
          (*fn)(chunk_begin(n, parts, k), chunk_begin(n, parts, k + 1));
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
          failed.store(true, std::memory_order_relaxed);
        }
      }
      done.fetch_add(1, std::memory_order_release);
    }
    t_inside_chunk = outer;
  }
};

}  // namespace

struct ThreadPool::State {
  int size = 1;
  std::vector<std::thread> workers;
  std::mutex submit;  // held by the one caller whose job the workers run

  std::mutex mutex;  // guards everything below and Job::active changes
  std::condition_variable wake;
  std::condition_variable finished;
  std::atomic<uint64_t> generation{0};  // bumped when a job is published
  Job* job = nullptr;
  int sleeping = 0;
  bool caller_waiting = false;
  bool stop = false;

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      spin_until([&] { return generation.load(std::memory_order_acquire) != seen; },
                 kWorkerSpinMicros);
      Job* current = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex);
        if (generation.load() == seen && !stop) {
          ++sleeping;
          wake.wait(lock, [&] { return stop || generation.load() != seen; });
          --sleeping;
        }
        if (stop) return;
        seen = generation.load();
        current = job;
        if (!current) continue;  // slept through a whole job
        current->active.fetch_add(1);
      }
      current->run_chunks();
      std::lock_guard<std::mutex> lock(mutex);
      if (current->active.fetch_sub(1) == 1 && caller_waiting) finished.notify_all();
    }
  }
};

ThreadPool::ThreadPool(int threads) : state_(std::make_unique<State>()) {
  state_->size = std::max(threads, 1);
  for (int i = 1; i < state_->size; ++i) {
    state_->workers.emplace_back([s = state_.get()] { s->worker_loop(); });
#if defined(__linux__)
    std::string name = "kiln-worker-" + std::to_string(i);
    pthread_setname_np(state_->workers.back().native_handle(), name.c_str());
#endif
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  for (auto& t : state_->workers) t.join();
}

int ThreadPool::size() const { return state_->size; }

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  int64_t parts = chunk_count(n, grain, state_->size);
  if (parts == 0) return;
  if (parts == 1) {
    fn(0, n);
    return;
  }
  State& s = *state_;
  if (t_inside_chunk || !s.submit.try_lock()) {
    // Nested, or the workers are busy with another thread's job: same chunks, in order.
    for (int64_t k = 0; k < parts; ++k) fn(chunk_begin(n, parts, k), chunk_begin(n, parts, k + 1));
    return;
  }
  std::lock_guard<std::mutex> submit_lock(s.submit, std::adopt_lock);

  Job job;
  job.fn = &fn;
  job.n = n;
  job.parts = parts;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.job = &job;
    s.generation.fetch_add(1, std::memory_order_release);
    // Spinning workers see the generation; wake only as many sleepers as there is work.
    int64_t helpers = std::min<int64_t>(parts - 1, s.sleeping);
    if (helpers == s.sleeping) {
      if (helpers > 0) s.wake.notify_all();
    } else {
      for (int64_t i = 0; i < helpers; ++i) s.wake.notify_one();
    }
  }
  job.run_chunks();
  spin_until(
      [&] {
        return job.done.load(std::memory_order_acquire) == parts &&
               job.active.load(std::memory_order_acquire) == 0;
      },
      kCallerSpinMicros);
  {
    // Workers change `active` under this mutex, so once the predicate holds here no worker
    // touches `job` again, and clearing s.job keeps late wakers away from it.
    std::unique_lock<std::mutex> lock(s.mutex);
    s.caller_waiting = true;
    s.finished.wait(lock, [&] {
      return job.done.load(std::memory_order_acquire) == parts && job.active.load() == 0;
    });
    s.caller_waiting = false;
    s.job = nullptr;
  }
  if (job.error) std::rethrow_exception(job.error);
}

namespace {
// The process-wide pool. Read without a lock (an acquire load) by every kernel launch;
// replaced only by set_num_threads under g_pool_mutex.
std::atomic<ThreadPool*> g_pool{nullptr};
std::mutex g_pool_mutex;
}  // namespace

ThreadPool& thread_pool() {
  if (ThreadPool* pool = g_pool.load(std::memory_order_acquire)) return *pool;
  // Never destroyed: kernels may run from static destructors of other objects, and
  // sleeping workers need no cleanup at exit.
  // A bad KILN_NUM_THREADS throws here, before any thread starts; the pool stays unset,
  // so every later call that needs the pool raises the same error.
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (ThreadPool* pool = g_pool.load(std::memory_order_acquire)) return *pool;
  int threads = usable_cpus();
  if (std::optional<int64_t> n = settings::integer("KILN_NUM_THREADS", 1, 4096))
    threads = static_cast<int>(*n);
  auto* pool = new ThreadPool(threads);
  g_pool.store(pool, std::memory_order_release);
  return *pool;
}

void set_num_threads(int threads) {
  if (threads < 1 || threads > 4096) {
    throw ValueError("[set_num_threads] expected a thread count in [1, 4096], got " +
                     std::to_string(threads));
  }
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  ThreadPool* old = g_pool.load(std::memory_order_acquire);
  if (old && old->size() == threads) return;
  // The caller guarantees no evaluation is running, so no thread is inside the old pool;
  // deleting it joins its (sleeping) workers.
  g_pool.store(new ThreadPool(threads), std::memory_order_release);
  delete old;
}

int get_num_threads() { return thread_pool().size(); }

// A rank started by mpiexec is bound to one core (Open MPI binds to cores for up to two
// ranks): a pool sized by hardware_concurrency() would put every worker on that core,
// each kernel's chunks then waiting for the others' time slices.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(CPU_COUNT(&set), 1);
  return std::max(static_cast<int>(std::thread::hardware_concurrency()), 1);
}

}  // namespace kiln
