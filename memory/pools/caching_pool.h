#pragma once
// The caching pool, one implementation for every memory space (host, pinned host, each CUDA
// device): a SegmentSource supplies big segments, the pool carves blocks out of them. Tensor
// programs allocate and free the same few sizes over and over (one step looks like the
// last), so keeping freed memory and handing it out again is much cheaper than going back
// to the OS or the driver (cuMemAlloc synchronizes the device), and lets kiln report and
// limit memory per space.
//
// Small requests (<= 1 MiB) are rounded up to size classes and carved out of 2 MiB
// segments; a freed small block waits on its class's free list, so the common case (the
// same size again) costs a pop. Large requests are rounded to 64 bytes and served best-fit
// from large segments. Free blocks are split when the rest is still useful and merged with
// free neighbours (small ones lazily, before a new segment would be taken). Memory goes
// back to its source only in empty_cache() or when a limit is hit.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "../../core/allocator.h"

namespace kiln::memory {

/// A snapshot of the pool's counters. Sizes are in bytes.
struct PoolStats {
  size_t allocated = 0;         ///< Bytes in blocks handed out (rounded block sizes).
  size_t requested = 0;         ///< Bytes the callers of live blocks asked for.
  size_t reserved = 0;          ///< Bytes held from the source (all segments, used or cached).
  size_t peak_allocated = 0;    ///< Highest `allocated` since creation or reset_peak_stats().
  size_t peak_reserved = 0;     ///< Highest `reserved` since creation or reset_peak_stats().
  size_t limit = 0;             ///< Cap on `reserved`; 0 means unlimited.
  size_t largest_free = 0;      ///< Largest cached block; a request up to it needs no OS call.
  uint64_t num_allocs = 0;      ///< allocate() calls that succeeded.
  uint64_t cache_hits = 0;      ///< Of those, the ones served without asking the source.
  uint64_t num_frees = 0;       ///< deallocate() calls with a non-null pointer.
  uint64_t num_ooms = 0;        ///< allocate() calls that threw OutOfMemoryError.
  uint64_t segments = 0;        ///< Segments held now (small plus large).
  uint64_t small_segments = 0;  ///< Of those, 2 MiB segments for small blocks.
  uint64_t os_allocs = 0;       ///< Segments obtained from the source over the pool's life.
  uint64_t os_frees = 0;        ///< Segments returned to the source over the pool's life.

  /// Peak reserved over peak allocated (1.0 when every reserved byte was used at the peak):
  /// the memory the pool's layout costs beyond what the program needed at once.
  double reserve_ratio() const {
    return peak_allocated == 0
               ? 1.0
               : static_cast<double>(peak_reserved) / static_cast<double>(peak_allocated);
  }
  /// Cached bytes: reserved but not handed out.
  size_t cached() const { return reserved - allocated; }
  /// Share of cached bytes outside the largest free block, in [0, 1]: 0 when all cached
  /// memory could serve one request, near 1 when it is scattered in small pieces.
  double fragmentation() const {
    size_t free = cached();
    return free == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free) / static_cast<double>(free);
  }
};

/// Where a pool's segments come from: aligned_alloc, cuMemAlloc, cuMemHostAlloc.
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  /// Returns `bytes` of memory aligned to at least 64, or nullptr when the space is full.
  /// Throws (DeviceError, ...) for failures that freeing cached memory cannot fix.
  virtual void* reserve(size_t bytes) = 0;
  /// Returns memory from reserve(); never throws.
  virtual void release(void* ptr, size_t bytes) noexcept = 0;
  /// True for host memory the CPU may touch (the pool then poisons cached blocks under ASan).
  virtual bool host_addressable() const = 0;
  /// Who refused a segment, for error messages: "the OS", "the CUDA driver".
  virtual const char* who() const = 0;
};

/// A thread-safe caching allocator of 64-byte aligned memory from one SegmentSource.
class CachingPool : public Allocator {
 public:
  /// `name` starts every message and the report, e.g. "host pool", "cuda:0 pool".
  CachingPool(std::string name, std::unique_ptr<SegmentSource> source);
  /// Returns every segment to the source; blocks still handed out become invalid.
  ~CachingPool() override;
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;

  /// Returns a 64-byte aligned block of at least `bytes` (zero gives a unique block).
  /// Throws OutOfMemoryError, with the report, when the limit or the source refuses.
  void* allocate(size_t bytes) override;
  /// Like allocate(), but returns nullptr instead of throwing when the memory is not there
  /// (callers that can make room, such as device placement, try again).
  void* try_allocate(size_t bytes);
  /// Returns a block to the cache; nullptr is ignored. Throws ValueError for foreign pointers.
  void deallocate(void* ptr) override;

  /// A consistent snapshot of the counters.
  PoolStats stats() const;
  /// The bytes allocate(`bytes`) would add to `allocated` now: the block it would take,
  /// including a remainder too small to split off.
  size_t block_size_for(size_t bytes) const;
  /// Bytes handed out now (stats().allocated without the rest of the snapshot).
  size_t allocated() const;
  /// Reserved bytes in segments that hold at least one live block: what empty_cache()
  /// would leave. Less allocated(), it is the free space those segments pin.
  size_t reserved_in_use() const;
  /// The bytes open_arena(`bytes`) reserves when no cached block serves it: arenas get a
  /// segment of their own, rounded only to the pool's alignment.
  static size_t arena_segment(size_t bytes);
  /// Starts the peaks again from the current allocated and reserved bytes.
  void reset_peak_stats();
  /// Returns every fully free segment to the source; reserved drops to the segments in use.
  void empty_cache();
  /// Caps reserved bytes (0: unlimited). Lowering it below the reservation empties the cache.
  void set_limit(size_t bytes);
  /// The cap on reserved bytes; 0 means unlimited.
  size_t limit() const;
  /// The statistics as an aligned, human-readable table ("1.5 MiB").
  std::string report() const;
  /// The name given at construction.
  const std::string& name() const { return name_; }

  /// Sets aside one block of `bytes` (an arena) whose parts a planned step hands out at
  /// offsets it chose in advance (RECOMPUTE.md, offline assignment). The block itself is
  /// reserved, not allocated; returns its base, or nullptr when the memory is not there
  /// (or is not host memory). With `exact` (a budgeted step, whose plan counts its reserve)
  /// only a cached block of just that size is reused; otherwise the cache is emptied and the
  /// arena gets a segment of its own size.
  void* open_arena(size_t bytes, bool exact = false);
  /// Hands out `bytes` at `offset` in an open arena, counted as allocated like any block and
  /// returned by deallocate(); nullptr when the range would overlap a part still handed out
  /// (a plan that changed at run time) or leave the arena. Throws ValueError for a bad base.
  void* allocate_in_arena(void* base, size_t offset, size_t bytes);
  /// Ends an arena: its block goes back to the cache once every part is deallocated.
  void close_arena(void* base);

 private:
  // A contiguous range inside one segment, either handed out or cached. Blocks of a
  // segment form an address-ordered list so that freeing can merge with neighbours; a
  // segment is fully free when its only block is free (no prev, no next). A free block is
  // either in a FreeSet or, if `on_class_list`, on its class list and not merged yet.
  struct Arena;
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;
    bool small = false;
    bool free = true;
    bool on_class_list = false;
    Arena* arena = nullptr;  // set on the parts of an arena, which belong to no list
    Block* prev = nullptr;
    Block* next = nullptr;
  };
  // Best fit: the smallest block that fits, lowest address among equals (deterministic).
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using FreeSet = std::set<Block*, BySize>;
  // An open (or closed but still used) arena: its block and the parts handed out, by offset.
  struct Arena {
    Block* block = nullptr;
    std::map<size_t, size_t> parts;  // offset -> bytes
    bool open = true;
  };

  Block* take_free_block(FreeSet& free_set, size_t size);
  void insert_free(Block* block);
  void flush_class_lists();
  size_t largest_free_locked() const;
  void* allocate_locked(size_t bytes, std::string* failure);
  // `exact`: a segment of just `size` (an arena), not one rounded for reuse by other sizes.
  Block* new_segment(size_t size, bool small, size_t requested, std::string* failure,
                     bool exact = false);
  void poison(const void* p, size_t n) const;
  void unpoison(const void* p, size_t n) const;
  void split(Block* block, size_t size);
  void release_free_segments();
  void release_segment(Block* block);
  Block* make_block();
  void recycle_block(Block* block);
  void end_arena(Arena* arena);
  std::string report_locked() const;

  const std::string name_;
  const std::unique_ptr<SegmentSource> source_;
  const bool poison_;  // cached host blocks are poisoned under ASan
  mutable std::mutex mutex_;
  FreeSet small_free_;
  FreeSet large_free_;
  std::vector<std::vector<Block*>> class_free_;  // per small size class, most recent last
  size_t class_free_count_ = 0;
  std::unordered_map<void*, Block*> live_;
  std::unordered_map<void*, std::unique_ptr<Arena>> arenas_;  // by base
  std::vector<Block*> spare_blocks_;  // Block nodes kept to avoid heap calls on split/merge.
  PoolStats stats_;
};

/// Human-readable size: "1000 B", "1.5 MiB".
std::string format_bytes(size_t bytes);

/// The block size a CachingPool hands out for a request of `bytes` (before any split
/// remainder is left on the block): what the request adds to `allocated`.
size_t block_size(size_t bytes);

}  // namespace kiln::memory
