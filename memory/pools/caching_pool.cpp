#include "caching_pool.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <sstream>
#include <utility>

#include "../../core/error.h"

// Under AddressSanitizer, cached blocks are poisoned so that a use after deallocate() is
// reported even though the memory never went back to malloc.
#if defined(__SANITIZE_ADDRESS__)
#define KILN_POOL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_POOL_ASAN 1
#endif
#endif
#ifdef KILN_POOL_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace kiln::memory {
namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kMiB = size_t{1} << 20;
// Requests up to this size are small: class-rounded and packed into shared segments.
constexpr size_t kSmallMax = kMiB;
constexpr size_t kSmallSegment = 2 * kMiB;
// Large requests below kLargeShared share one kLargeSegment (as PyTorch does), so that a
// few mid-sized tensors cost one OS call; bigger ones get a segment of their own size.
constexpr size_t kLargeShared = 10 * kMiB;
constexpr size_t kLargeSegment = 20 * kMiB;
// Beyond this, rounding could overflow; no machine has that much memory anyway.
constexpr size_t kMaxRequest = std::numeric_limits<size_t>::max() / 2;

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// 64-byte steps up to 1 KiB, then four classes per power of two, so rounding wastes at most
// a quarter of a request while a step's repeated sizes land in the same class.
size_t small_class(size_t bytes) {
  if (bytes <= 1024) return bytes == 0 ? kAlignment : round_up(bytes, kAlignment);
  size_t below = std::bit_floor(bytes - 1);  // below < bytes <= 2 * below
  return round_up(bytes, below / 4);
}

// Position of a small class in class_free_: 16 steps of 64 up to 1 KiB, then four per
// power of two up to 1 MiB, 56 in all. `size` must be a class size.
constexpr size_t kNumClasses = 16 + 4 * 10;
size_t class_index(size_t size) {
  if (size <= 1024) return size / kAlignment - 1;
  size_t below = std::bit_floor(size - 1);
  size_t quarter = (size - below) / (below / 4);  // 1..4
  return 16 + 4 * (static_cast<size_t>(std::countr_zero(below)) - 10) + quarter - 1;
}

}  // namespace

size_t block_size(size_t bytes) {
  return bytes <= kSmallMax ? small_class(bytes) : round_up(bytes, kAlignment);
}

std::string format_bytes(size_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f %s", value, kUnits[unit]);
  return text;
}

namespace {

std::string format_percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f%%", 100.0 * fraction);
  return text;
}

std::string size_and_bytes(size_t bytes) {
  return format_bytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
}

}  // namespace

CachingPool::CachingPool(std::string name, std::unique_ptr<SegmentSource> source)
    : name_(std::move(name)),
      source_(std::move(source)),
      poison_(source_->host_addressable()),
      class_free_(kNumClasses) {}

void CachingPool::poison(const void* p, size_t n) const {
#ifdef KILN_POOL_ASAN
  if (poison_) ASAN_POISON_MEMORY_REGION(p, n);
#else
  (void)p, (void)n, (void)poison_;
#endif
}

void CachingPool::unpoison(const void* p, size_t n) const {
#ifdef KILN_POOL_ASAN
  if (poison_) ASAN_UNPOISON_MEMORY_REGION(p, n);
#else
  (void)p, (void)n, (void)poison_;
#endif
}

CachingPool::~CachingPool() {
  std::vector<Block*> heads;
  for (const FreeSet* set : {&small_free_, &large_free_}) {
    for (Block* b : *set) {
      if (b->prev == nullptr) heads.push_back(b);
    }
  }
  for (const auto& [ptr, b] : live_) {
    if (b->arena == nullptr && b->prev == nullptr) heads.push_back(b);
  }
  for (const auto& [base, arena] : arenas_) {
    if (arena->block->prev == nullptr) heads.push_back(arena->block);
  }
  for (const auto& list : class_free_) {
    for (Block* b : list) {
      if (b->prev == nullptr) heads.push_back(b);
    }
  }
  for (const auto& [ptr, b] : live_) {
    if (b->arena != nullptr) delete b;
  }
  for (Block* head : heads) {
    size_t segment_bytes = 0;
    for (Block* b = head; b != nullptr; b = b->next) segment_bytes += b->size;
    unpoison(head->ptr, segment_bytes);
    source_->release(head->ptr, segment_bytes);
    for (Block* b = head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
  for (Block* b : spare_blocks_) delete b;
}

void* CachingPool::allocate(size_t bytes) {
  std::lock_guard lock(mutex_);
  std::string failure;
  void* p = allocate_locked(bytes, &failure);
  if (p == nullptr) {
    ++stats_.num_ooms;
    throw OutOfMemoryError("[" + name_ + "] cannot allocate " + failure + "\n" + report_locked());
  }
  return p;
}

void* CachingPool::try_allocate(size_t bytes) {
  std::lock_guard lock(mutex_);
  return allocate_locked(bytes, nullptr);
}

void* CachingPool::allocate_locked(size_t bytes, std::string* failure) {
  if (bytes > kMaxRequest) {
    if (failure != nullptr) {
      *failure = std::to_string(bytes) + " bytes: larger than any machine's memory";
    }
    return nullptr;
  }
  const bool small = bytes <= kSmallMax;
  const size_t size = small ? small_class(bytes) : round_up(bytes, kAlignment);

  Block* block = nullptr;
  if (small && !class_free_[class_index(size)].empty()) {
    auto& list = class_free_[class_index(size)];
    block = list.back();
    list.pop_back();
    --class_free_count_;
    block->on_class_list = false;
  } else {
    FreeSet& free_set = small ? small_free_ : large_free_;
    block = take_free_block(free_set, size);
    // Unmerged small blocks may add up to what is needed; merge before asking the source.
    if (block == nullptr && small && class_free_count_ > 0) {
      flush_class_lists();
      block = take_free_block(free_set, size);
    }
  }
  if (block != nullptr) {
    ++stats_.cache_hits;
  } else {
    block = new_segment(size, small, bytes, failure);
    if (block == nullptr) return nullptr;
  }
  split(block, size);
  block->free = false;
  block->requested = bytes;
  live_.emplace(block->ptr, block);

  stats_.allocated += block->size;
  stats_.requested += bytes;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  ++stats_.num_allocs;
  unpoison(block->ptr, bytes);
  return block->ptr;
}

void CachingPool::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    std::ostringstream message;
    message << "[" << name_ << "] deallocate(" << ptr
            << "): not a live block of this pool (freed twice, or from another allocator)";
    throw ValueError(message.str());
  }
  Block* block = it->second;
  live_.erase(it);
  stats_.allocated -= block->size;
  stats_.requested -= block->requested;
  ++stats_.num_frees;
  poison(block->ptr, block->size);
  if (Arena* arena = block->arena) {
    arena->parts.erase(static_cast<size_t>(block->ptr - arena->block->ptr));
    recycle_block(block);
    if (!arena->open && arena->parts.empty()) end_arena(arena);
    return;
  }
  block->free = true;
  block->requested = 0;

  // Small blocks are carved at exactly their class size, so the next request of that
  // class can take this one as it is; merging waits until it is needed.
  if (block->small) {
    block->on_class_list = true;
    class_free_[class_index(block->size)].push_back(block);
    ++class_free_count_;
    return;
  }
  insert_free(block);
}

void* CachingPool::open_arena(size_t bytes, bool exact) {
  std::lock_guard lock(mutex_);
  // Parts become host Buffers (core/allocator.h), so only host memory has arenas.
  if (bytes == 0 || bytes > kMaxRequest || !source_->host_addressable()) return nullptr;
  // Taken like a large block (best fit), so that the next step's arena of the same size
  // finds it again in the cache, or a segment of exactly its size: a budgeted step's plan
  // counts its reserve to the byte (memory/planner/arena_fit.h), and rounding up to 2 MiB put the
  // benchmark LSTM's reserve 1.5 MiB over a budget its plan held.
  const size_t size = arena_segment(bytes);
  Block* block = take_free_block(large_free_, size);
  if (block != nullptr && exact && block->size != size) {
    // A bigger cached block (an unbudgeted step's arena) would keep its whole segment
    // reserved beside the smaller arena; back to the cache, which is emptied below.
    large_free_.insert(block);
    block = nullptr;
  }
  if (block == nullptr) {
    // A bigger arena than any cached block (a longer sequence, a tighter plan): the older
    // arenas' free segments would otherwise stay reserved beside the new one.
    release_free_segments();
    block = new_segment(size, false, bytes, nullptr, true);
  }
  if (block == nullptr) return nullptr;
  split(block, size);
  block->free = false;
  auto arena = std::make_unique<Arena>();
  arena->block = block;
  void* base = block->ptr;
  arenas_.emplace(base, std::move(arena));
  return base;
}

void* CachingPool::allocate_in_arena(void* base, size_t offset, size_t bytes) {
  std::lock_guard lock(mutex_);
  auto it = arenas_.find(base);
  if (it == arenas_.end() || !it->second->open)
    throw ValueError("[" + name_ + "] allocate_in_arena: no open arena at this base");
  Arena& arena = *it->second;
  if (bytes > kMaxRequest) return nullptr;
  const size_t size = round_up(std::max<size_t>(bytes, 1), kAlignment);
  if (offset % kAlignment != 0 || offset > arena.block->size || size > arena.block->size - offset)
    return nullptr;
  // The part must not overlap one still handed out: the one starting at or before it, or
  // the first one after it.
  auto next = arena.parts.lower_bound(offset);
  if (next != arena.parts.end() && next->first < offset + size) return nullptr;
  if (next != arena.parts.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > offset) return nullptr;
  }
  arena.parts.emplace_hint(next, offset, size);
  Block* part = make_block();
  part->ptr = arena.block->ptr + offset;
  part->size = size;
  part->requested = bytes;
  part->free = false;
  part->arena = &arena;
  live_.emplace(part->ptr, part);
  stats_.allocated += size;
  stats_.requested += bytes;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  ++stats_.num_allocs;
  ++stats_.cache_hits;
  unpoison(part->ptr, bytes);
  return part->ptr;
}

void CachingPool::close_arena(void* base) {
  std::lock_guard lock(mutex_);
  auto it = arenas_.find(base);
  if (it == arenas_.end() || !it->second->open)
    throw ValueError("[" + name_ + "] close_arena: no open arena at this base");
  it->second->open = false;
  if (it->second->parts.empty()) end_arena(it->second.get());
}

void CachingPool::end_arena(Arena* arena) {
  Block* block = arena->block;
  arenas_.erase(block->ptr);  // destroys `arena`
  block->free = true;
  block->requested = 0;
  insert_free(block);
}

void CachingPool::insert_free(Block* block) {
  // Merging keeps the free set short and lets a later, bigger request reuse the space;
  // it also makes "segment fully free" a single-block check.
  FreeSet& free_set = block->small ? small_free_ : large_free_;
  if (Block* prev = block->prev; prev != nullptr && prev->free && !prev->on_class_list) {
    free_set.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    recycle_block(block);
    block = prev;
  }
  if (Block* next = block->next; next != nullptr && next->free && !next->on_class_list) {
    free_set.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    recycle_block(next);
  }
  free_set.insert(block);
}

PoolStats CachingPool::stats() const {
  std::lock_guard lock(mutex_);
  PoolStats s = stats_;
  s.largest_free = largest_free_locked();
  return s;
}

size_t CachingPool::block_size_for(size_t bytes) const {
  if (bytes <= kSmallMax) return small_class(bytes);  // small blocks are split exactly
  const size_t size = round_up(bytes, kAlignment);
  std::lock_guard lock(mutex_);
  Block key;
  key.size = size;
  auto it = large_free_.lower_bound(&key);
  // A fresh segment: shared ones are split like a free block, own ones are rounded.
  size_t block = it != large_free_.end()
                     ? (*it)->size
                     : (size < kLargeShared ? kLargeSegment : round_up(size, kSmallSegment));
  return block - size <= kSmallMax ? block : size;
}

size_t CachingPool::allocated() const {
  std::lock_guard lock(mutex_);
  return stats_.allocated;
}

size_t CachingPool::reserved_in_use() const {
  std::lock_guard lock(mutex_);
  // A segment is fully free when every block of it is: one merged block in a FreeSet, or
  // small blocks on class lists that have not been merged yet. Each segment is counted at
  // its first block.
  size_t free_segments = 0;
  auto count = [&](const Block* first) {
    if (first->prev != nullptr) return;
    size_t bytes = 0;
    for (const Block* b = first; b != nullptr; b = b->next) {
      if (!b->free) return;
      bytes += b->size;
    }
    free_segments += bytes;
  };
  for (const FreeSet* set : {&small_free_, &large_free_})
    for (const Block* block : *set) count(block);
  for (const auto& list : class_free_)
    for (const Block* block : list) count(block);
  return stats_.reserved - free_segments;
}

size_t CachingPool::arena_segment(size_t bytes) {
  return round_up(std::max(bytes, kSmallMax + 1), kAlignment);
}

void CachingPool::reset_peak_stats() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

void CachingPool::empty_cache() {
  std::lock_guard lock(mutex_);
  release_free_segments();
}

void CachingPool::set_limit(size_t bytes) {
  std::lock_guard lock(mutex_);
  stats_.limit = bytes;
  if (bytes != 0 && stats_.reserved > bytes) release_free_segments();
}

size_t CachingPool::limit() const {
  std::lock_guard lock(mutex_);
  return stats_.limit;
}

std::string CachingPool::report() const {
  std::lock_guard lock(mutex_);
  return report_locked();
}

void CachingPool::flush_class_lists() {
  // Every block on a list is unmerged, so neighbours that are also on lists merge when
  // their own turn comes.
  for (auto& list : class_free_) {
    for (Block* block : list) {
      block->on_class_list = false;
      insert_free(block);
    }
    list.clear();
  }
  class_free_count_ = 0;
}

size_t CachingPool::largest_free_locked() const {
  size_t largest = 0;
  for (const FreeSet* set : {&small_free_, &large_free_}) {
    if (!set->empty()) largest = std::max(largest, (*set->rbegin())->size);
  }
  for (const auto& list : class_free_) {
    if (!list.empty()) largest = std::max(largest, list.back()->size);
  }
  return largest;
}

CachingPool::Block* CachingPool::take_free_block(FreeSet& free_set, size_t size) {
  Block key;
  key.size = size;  // ptr == nullptr sorts first among blocks of this size
  auto it = free_set.lower_bound(&key);
  if (it == free_set.end()) return nullptr;
  Block* block = *it;
  free_set.erase(it);
  return block;
}

CachingPool::Block* CachingPool::new_segment(size_t size, bool small, size_t requested,
                                             std::string* failure, bool exact) {
  const size_t limit = stats_.limit;
  auto fits = [&](size_t segment) {
    return limit == 0 || (stats_.reserved <= limit && segment <= limit - stats_.reserved);
  };
  size_t segment = exact   ? size
                   : small ? kSmallSegment
                           : (size < kLargeShared ? kLargeSegment : round_up(size, kSmallSegment));
  if (!fits(segment)) release_free_segments();
  // Under a tight limit a segment of just this block still lets the request succeed.
  if (!fits(segment)) segment = size;
  if (!fits(segment)) {
    if (failure != nullptr) {
      *failure = size_and_bytes(requested) + ": reserved " + format_bytes(stats_.reserved) +
                 " + a new " + format_bytes(segment) + " segment would exceed the limit of " +
                 size_and_bytes(limit) + "; cached memory was already freed";
    }
    return nullptr;
  }

  void* memory = source_->reserve(segment);
  if (memory == nullptr) {
    release_free_segments();
    memory = source_->reserve(segment);
    if (memory == nullptr && segment != size) {
      segment = size;
      memory = source_->reserve(segment);
    }
    if (memory == nullptr) {
      if (failure != nullptr) {
        *failure = size_and_bytes(requested) + ": " + source_->who() + " refused a " +
                   format_bytes(segment) + " segment after the cache was freed (limit " +
                   (limit == 0 ? std::string("unlimited") : size_and_bytes(limit)) + ")";
      }
      return nullptr;
    }
  }
  poison(memory, segment);

  stats_.reserved += segment;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  ++stats_.segments;
  if (small) ++stats_.small_segments;
  ++stats_.os_allocs;

  Block* block = make_block();
  block->ptr = static_cast<char*>(memory);
  block->size = segment;
  block->small = small;
  return block;
}

void CachingPool::split(Block* block, size_t size) {
  const size_t rest = block->size - size;
  // A large remainder of 1 MiB or less could only serve small requests, which never come
  // to the large pool, so it stays with the block instead of cluttering the free list.
  if (rest == 0 || (!block->small && rest <= kSmallMax)) return;
  Block* tail = make_block();
  tail->ptr = block->ptr + size;
  tail->size = rest;
  tail->small = block->small;
  tail->prev = block;
  tail->next = block->next;
  if (block->next != nullptr) block->next->prev = tail;
  block->next = tail;
  block->size = size;
  (block->small ? small_free_ : large_free_).insert(tail);
}

void CachingPool::release_free_segments() {
  flush_class_lists();
  for (FreeSet* set : {&small_free_, &large_free_}) {
    for (auto it = set->begin(); it != set->end();) {
      Block* block = *it;
      if (block->prev == nullptr && block->next == nullptr) {
        it = set->erase(it);
        release_segment(block);
      } else {
        ++it;
      }
    }
  }
}

void CachingPool::release_segment(Block* block) {
  unpoison(block->ptr, block->size);
  source_->release(block->ptr, block->size);
  stats_.reserved -= block->size;
  --stats_.segments;
  if (block->small) --stats_.small_segments;
  ++stats_.os_frees;
  recycle_block(block);
}

CachingPool::Block* CachingPool::make_block() {
  if (spare_blocks_.empty()) return new Block;
  Block* block = spare_blocks_.back();
  spare_blocks_.pop_back();
  return block;
}

void CachingPool::recycle_block(Block* block) {
  *block = Block{};
  spare_blocks_.push_back(block);
}

std::string CachingPool::report_locked() const {
  PoolStats s = stats_;
  s.largest_free = largest_free_locked();

  std::ostringstream out;
  auto row = [&out](const std::string& label, const std::string& value,
                    const std::string& extra = "") {
    out << "  " << std::left << std::setw(20) << label << std::right << std::setw(12) << value;
    if (!extra.empty()) out << std::setw(12) << extra;
    out << '\n';
  };
  out << "[" << name_ << "] memory report\n";
  row("", "current", "peak");
  row("allocated", format_bytes(s.allocated), format_bytes(s.peak_allocated));
  row("reserved", format_bytes(s.reserved), format_bytes(s.peak_reserved));
  row("requested", format_bytes(s.requested));
  row("cached", format_bytes(s.cached()));
  row("largest free block", format_bytes(s.largest_free));
  row("fragmentation", format_percent(s.fragmentation()));
  {
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.3f", s.reserve_ratio());
    row("reserved/allocated", ratio, "at peak");
  }
  row("limit", s.limit == 0 ? "unlimited" : format_bytes(s.limit));
  row("", "count");
  row("allocations", std::to_string(s.num_allocs));
  row("cache hits", std::to_string(s.cache_hits),
      s.num_allocs == 0
          ? ""
          : format_percent(static_cast<double>(s.cache_hits) / static_cast<double>(s.num_allocs)));
  row("frees", std::to_string(s.num_frees));
  row("out of memory", std::to_string(s.num_ooms));
  row("segments", std::to_string(s.segments));
  row("small segments", std::to_string(s.small_segments));
  row("os allocs", std::to_string(s.os_allocs));
  row("os frees", std::to_string(s.os_frees));
  return out.str();
}

}  // namespace kiln::memory
