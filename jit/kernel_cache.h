#pragma once
// The kernel cache: printed kernel source -> loaded entry point, in memory and on disk.
//
// A kernel is keyed by a 128-bit hash of (cache format version, source, compiler identity,
// target), so an object is only ever reused by the same compiler for the same target: the
// host CPU's features for CPU kernels, the GPU architecture ("sm_90") for device images,
// which are compiled and cached here but loaded by the device runtime. The memory level keeps every
// kernel this process has loaded; the disk level (one file per key, see docs/kernel-cache.md)
// survives the process and may be shared by several processes and users. Disk entries are
// written atomically and carry a checksum; a damaged, foreign, stale or unloadable entry is
// discarded with one warning and recompiled, never trusted. The disk level may also stack
// read-only directories (a cache baked into an image) under the one it writes.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace kiln::jit {

class CpuCompiler;
class LoadedModule;

/// Statistics of one kernel cache since it was created (process start for the global one).
struct CacheStats {
  uint64_t kernels_compiled = 0;  ///< compiles done by this process
  uint64_t memory_hits = 0;       ///< requests answered by an already loaded kernel
  uint64_t disk_hits = 0;         ///< requests answered by loading a verified disk entry
  uint64_t disk_errors = 0;       ///< corrupt entries discarded and failed disk writes
  uint64_t evictions = 0;         ///< disk entries removed by the size cap
  double compile_ms_total = 0;    ///< time spent in the compiler
  double load_ms_total = 0;       ///< time spent reading and loading disk entries
  uint64_t quick_builds = 0;      ///< first-tier builds (KILN_JIT_TIERS), in kernels_compiled
  uint64_t full_rebuilds = 0;     ///< background full builds of quick kernels (compiles not
                                  ///< in kernels_compiled, their time in compile_ms_total)
  uint64_t swaps = 0;         ///< quick kernels replaced by their full build (rebuilt or from disk)
  size_t disk_bytes = 0;      ///< current size of the directory's entries
  std::string directory;      ///< the cache directory ("" when memory-only)
  bool disk_enabled = false;  ///< false when new entries are not written to disk
  std::vector<std::string> read_only_directories;  ///< read, never written
};

/// One bad file found by KernelCache::verify().
struct VerifyProblem {
  std::string key;       ///< the entry's key (or the file name when it is not an entry)
  std::string path;      ///< the file
  std::string reason;    ///< why it is bad
  bool removed = false;  ///< false when left in place: a read-only directory, or not a
                         ///< regular file (kiln removes only regular files it wrote)
};

/// What KernelCache::verify() found.
struct VerifyReport {
  size_t ok = 0;            ///< good entries (all directories)
  size_t load_checked = 0;  ///< of those, how many objects were also loaded successfully
  std::vector<VerifyProblem> problems;  ///< bad entries, sorted by key
  size_t stray_files_removed = 0;       ///< orphan .meta files and dead writers' temporaries
};

/// What is known about one kernel (memory and/or disk).
struct KernelRecord {
  std::string key;                      ///< 32 hex digits
  std::string name;                     ///< the entry point's name
  std::vector<std::string> source_ops;  ///< graph ops the kernel was generated from
  std::string compiler;                 ///< compiler identity
  std::string target;                   ///< host CPU features, or GPU arch ("sm_90")
  double compile_ms = 0;
  size_t object_bytes = 0;
  int64_t created_unix = 0, last_used_unix = 0;
  uint64_t hits = 0;        ///< cache hits (memory and disk), all processes, best effort
  uint64_t launches = 0;    ///< launches counted through KernelHandle::record
  double run_ms_total = 0;  ///< run time counted through KernelHandle::record
};

/// A compiled kernel's entry point plus its record. The record lives as long as the cache;
/// its users add hits, launches and run time through count_use().
struct KernelHandle {
  void* fn = nullptr;  ///< the entry point when the handle was made (see entry())
  KernelRecord* record = nullptr;
  std::mutex* record_mutex = nullptr;  ///< guards *record (the cache entry's lock)
  /// The cache entry's current entry point, which a background full build replaces (tiers);
  /// null for handles whose entry point never changes.
  const std::atomic<void*>* slot = nullptr;
  /// The entry point to call now: read it at each launch, so a kernel rebuilt at full
  /// optimisation runs from then on. Every entry point stays valid while the cache lives.
  void* entry() const { return slot ? slot->load(std::memory_order_acquire) : fn; }
};

/// One kernel wanted from KernelCache::get_many() (or get()).
struct KernelRequest {
  std::string source;                   ///< printed, self-contained kernel source
  std::string entry;                    ///< the entry point's name
  std::vector<std::string> source_ops;  ///< graph ops it came from (metadata)
  /// The kernel may first run from a quick build (tiers): its results do not depend on
  /// the optimisation level (no float reduction whose order the vectorizer picks).
  bool quick_ok = false;
};

/// Adds to `record`'s hits, launches and run time under `record_mutex` (a handle's), so that
/// loaded_records() and flush() on other threads never read a counter being written.
/// Does nothing when `record` is null.
void count_use(KernelRecord* record, std::mutex* record_mutex, uint64_t hits, uint64_t launches,
               double run_ms);

/// A compiler of device images (NVRTC): the cache stores what it produces but does not
/// load it into this process.
class ImageCompiler {
 public:
  virtual ~ImageCompiler() = default;
  /// Compiler identity, version and flags, e.g. "nvrtc 13.0 -O3 --fmad=false"; in the key.
  virtual std::string identity() const = 0;
  /// What the image is for, e.g. "sm_90"; in the key and KernelRecord::target.
  virtual std::string target() const = 0;
  /// Compiles `source`; throws kiln::CompileError with the log and `source_path_hint`.
  virtual std::vector<uint8_t> compile(const std::string& source,
                                       const std::string& source_path_hint) = 0;
};

/// A compiled device image and its record, both owned by the cache (stable pointers).
struct ImageHandle {
  const std::vector<uint8_t>* image = nullptr;
  KernelRecord* record = nullptr;
  std::mutex* record_mutex = nullptr;  ///< guards *record, see count_use()
};

class KernelCache {
 public:
  /// Uses `directories` with a size cap in bytes (0 = none). `directories` is one directory
  /// or a ':'-separated list: the last one is written ("" or "off" = none: new kernels stay
  /// in memory), the ones before it are read-only layers searched after it. A last
  /// directory that cannot be written is still read, with one warning; one that cannot be
  /// created makes the cache memory-only, with one warning.
  KernelCache(std::string directories, size_t max_bytes);
  /// Writes pending metadata (flush()) and unloads the kernels.
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  /// Returns the loaded entry point `entry` of `source`: memory hit, else disk hit
  /// (verified), else compile + store. Thread-safe; concurrent requests for the same key
  /// compile once. `source_ops` names the graph ops the kernel came from (metadata).
  /// Throws kiln::CompileError when the source does not compile or `entry` is missing.
  KernelHandle get(const std::string& source, const std::string& entry,
                   const std::vector<std::string>& source_ops, CpuCompiler& compiler);
  /// get() of one request. With tiers on (set_tiers, KILN_JIT_TIERS) and `quick_ok`, a
  /// kernel whose full build is neither in memory nor on disk runs from its quick build
  /// (compiler.quick_compiler(), cached under its own key) and, once launched
  /// kRebuildAfterLaunches times (count_use), is built again by `compiler` on a background
  /// thread, swapped in (KernelHandle::entry()) and stored, replacing the quick build on
  /// disk. `compiler` must outlive the cache (or its stop_rebuilds()).
  KernelHandle get(const KernelRequest& request, CpuCompiler& compiler);
  /// get() of every request, the missing kernels compiled in parallel on the thread pool
  /// (at most one compile per core) and each loaded as soon as it is built. Same order as
  /// `requests`; throws the first request's CompileError.
  std::vector<KernelHandle> get_many(const std::vector<KernelRequest>& requests,
                                     CpuCompiler& compiler);
  /// Launches after which a quick build is rebuilt at full optimisation.
  static constexpr uint64_t kRebuildAfterLaunches = 3;
  /// Turns tiered compilation on or off for later requests (default: KILN_JIT_TIERS).
  void set_tiers(bool on) { tiers_.store(on ? 1 : 0); }
  /// Whether tiered compilation is on.
  bool tiers() const;
  /// Blocks until every background rebuild queued so far has finished (tests, benches).
  void wait_for_rebuilds();
  /// Drops queued background rebuilds and waits for the running one; later rebuilds are
  /// not started. Done by the destructor, and at exit for the global cache.
  void stop_rebuilds();
  /// Counts `n` requests answered by a caller's memo of this cache's handles as memory hits.
  void note_memory_hits(uint64_t n) { memo_hits_.fetch_add(n, std::memory_order_relaxed); }

  /// Returns the image of `source` built by `compiler`: memory hit, else verified disk hit,
  /// else compile + store. Thread-safe like get(); `entry` names the module in the record.
  /// `load_check`, when given, loads an image before the cache takes it (the CUDA driver):
  /// a disk entry it rejects is discarded with one warning and compiled again, and a fresh
  /// image it rejects is not stored and its error is thrown. Throws kiln::CompileError when
  /// the source does not compile.
  ImageHandle get_image(const std::string& source, const std::string& entry,
                        const std::vector<std::string>& source_ops, ImageCompiler& compiler,
                        const std::function<void(const std::vector<uint8_t>&)>& load_check = {});
  /// key = hex of a 128-bit hash of (format version, source, compiler identity,
  /// host_cpu_features()).
  static std::string key_for(const std::string& source, CpuCompiler& compiler);
  /// key of a device image: (format version, source, compiler identity, compiler target).
  static std::string key_for(const std::string& source, ImageCompiler& compiler);

  CacheStats stats() const;
  /// Records of kernels used in this process (memory level).
  std::vector<KernelRecord> loaded_records() const;
  /// Records of every readable entry on disk (for `kiln cache list`), newest use first.
  std::vector<KernelRecord> disk_records() const;
  /// Record and source of one disk entry by key or unique key prefix; throws
  /// kiln::ValueError if none matches, several match, or the entry is damaged.
  std::pair<KernelRecord, std::string> show(const std::string& key_prefix) const;
  /// Checks every disk entry of every directory: format, checksum, key, and that its
  /// object loads and defines its entry point, with whichever of `loaders` built it (its
  /// identity equals the entry's compiler; entries for another target are not loaded).
  /// Removes bad regular entries of the written directory, orphan metadata and dead
  /// writers' temporaries; never touches other names, non-regular files or read-only layers.
  VerifyReport verify(const std::vector<CpuCompiler*>& loaders = {});
  /// Removes the written directory's entries (and their metadata and dead writers'
  /// temporaries); returns how many entries. Loaded kernels stay usable in memory.
  size_t clear();
  /// Writes pending metadata updates (hits, last used, launches) to disk; also done by the
  /// destructor and, for the global cache, at exit.
  void flush();

  /// The directory new entries are written to ("" when memory-only).
  const std::string& directory() const { return directory_; }
  /// The size cap of the written directory in bytes (0 = none).
  size_t max_bytes() const { return max_bytes_; }
  /// True when new entries are written to directory().
  bool disk_enabled() const { return disk_enabled_; }
  /// Directories that are read but never written: the layers named before the last one,
  /// and the last one itself when it cannot be written.
  const std::vector<std::string>& read_only_directories() const { return read_only_; }

 private:
  struct Entry;
  struct Builder;
  friend void count_use(KernelRecord*, std::mutex*, uint64_t, uint64_t, double);
  friend KernelCache& kernel_cache();

  KernelHandle handle_of(Entry& e, const std::string& entry_name);
  void fill_quick(Entry& e, const KernelRequest& request, CpuCompiler& compiler);
  void queue_rebuild(const KernelRecord* record);
  void rebuild(Entry& e);
  void rebuild_loop();
  void drop_quick_entry(Entry& e);
  void hook_exit();
  bool load_from_disk_full(Entry& e, CpuCompiler& compiler, const std::string& entry_name,
                           std::string& why);

  Entry& entry_for(const std::string& key);
  Entry& ready_entry(const std::string& source, const std::string& entry_name,
                     const std::vector<std::string>& source_ops, const Builder& builder,
                     std::unique_lock<std::mutex>& lock);
  void fill(Entry& entry, const std::string& source, const std::string& entry_name,
            const std::vector<std::string>& source_ops, const Builder& builder);
  bool load_from_disk(Entry& entry, const Builder& builder, std::string& why);
  bool load_from(const std::string& dir, Entry& entry, const Builder& builder, std::string& why);
  void store(Entry& entry, const std::string& source, const std::vector<uint8_t>& object);
  void flush_entry(Entry& entry);
  void enforce_cap(const std::string& keep_key, size_t stored_bytes);
  /// Directories read for entries, in search order: directory() first when readable (its
  /// entries are the freshest), then the read-only layers in the order given.
  std::vector<std::string> search_order() const;

  std::string directory_;
  size_t max_bytes_;
  bool disk_enabled_ = false;
  std::vector<std::string> read_only_;
  std::atomic<bool> write_warned_{false};  // one warning per cache for failed writes

  mutable std::mutex map_mutex_;  // guards entries_
  std::map<std::string, std::unique_ptr<Entry>> entries_;

  mutable std::mutex stats_mutex_;  // guards counters_
  CacheStats counters_;
  std::atomic<uint64_t> memo_hits_{0};  // note_memory_hits(), added to memory_hits
  mutable std::atomic<int> tiers_{-1};  // -1: not decided yet (KILN_JIT_TIERS)
  bool exit_hooks_ = false;             // the global cache: stop rebuilds at exit

  // Background rebuilds of quick builds: one thread, started by the first rebuild.
  std::mutex rebuild_mutex_;  // guards the fields below
  std::condition_variable rebuild_cv_;
  std::map<const KernelRecord*, Entry*> quick_entries_;  // quick builds not yet queued
  std::vector<Entry*> rebuild_queue_;
  size_t rebuilds_running_ = 0;
  bool rebuild_stop_ = false;
  std::thread rebuild_thread_;

  // Serializes this process's size accounting and scans; the directory's lock file
  // (cache_files::DirectoryLock) serializes them between processes.
  std::mutex disk_mutex_;
};

/// The process-wide cache: directories from KILN_CACHE_DIR (default $XDG_CACHE_HOME/kiln or
/// ~/.cache/kiln; "" or "off" = memory only; "ro1:ro2:rw" stacks read-only layers under the
/// written directory), cap from KILN_CACHE_MAX_MB (default 1024, 0 = none). Pending
/// metadata is flushed at exit.
KernelCache& kernel_cache();
/// kernel_cache().stats()
CacheStats cache_stats();
/// kernel_cache().loaded_records()
std::vector<KernelRecord> kernel_records();

}  // namespace kiln::jit
