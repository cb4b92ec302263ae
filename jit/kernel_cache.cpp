// Kernel cache: memory level (key -> loaded module) over a disk level shared by processes.
//
// Invariants and decisions:
// * An entry file is never modified in place. It is written whole to a temporary file in
//   the same directory and renamed over `<key>.kk`, so a reader sees either no entry or a
//   complete one, whatever other processes do. Only the size accounting takes a lock
//   (the directory's lock file), so that the cap holds across processes.
// * Every file access goes through cache_files (no symlink followed, only regular files
//   of bounded size read, only kiln's own names removed): the directory may be shared
//   with users who plant files in it.
// * Nothing read from disk is trusted before its header, length, checksum and key have
//   been checked, and its object has been loaded with its entry point resolved. The key is
//   recomputed from the stored source, compiler identity and CPU features, so a file
//   copied under another name, or built by another compiler or for another CPU, is
//   rejected even if its checksum is intact. The checksum detects damage, not intent:
//   anyone who can write the directory can write a valid entry (docs/kernel-cache.md).
// * Mutable metadata (hits, last use, launches) lives in a separate small `<key>.meta`
//   file, also replaced atomically. Updates are merged best-effort: a flush adds this
//   process's increments to what is on disk at that moment; two processes flushing at
//   the same instant may lose one's increments, which only affects statistics.
// * There is no fsync: after a power loss an entry may be empty or partial, and the
//   checksum turns that into one warning and a recompile.
#include "jit/kernel_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/log.h"
#include "core/settings.h"
#include "core/thread_pool.h"
#include "jit/cache_files.h"
#include "jit/compiler.h"
#include "jit/hash.h"

namespace kiln::jit {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Bump when the entry layout or the meaning of any stored field changes. It is part of the
// key too, so entries of another version are never even looked up; verify() removes them.
constexpr uint32_t kFormatVersion = 1;
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'K', 'C', '0', '1'};
constexpr size_t kHeaderBytes = 64;
using cache_files::kEntrySuffix;
using cache_files::kMetaSuffix;

int64_t now_unix() { return static_cast<int64_t>(std::time(nullptr)); }
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

bool dump_kernels() { return settings::flag("KILN_DUMP_KERNELS"); }

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

// ---- little-endian header fields ----

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const std::string& in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(in[at + i]);
  return v;
}

// ---- files (every access goes through cache_files) ----

using cache_files::DirFile;
using cache_files::FileId;
using cache_files::mtime_ns;
using cache_files::NameKind;
using cache_files::ReadResult;

// No kernel entry comes near these sizes (objects are kilobytes, CUDA images at most a few
// megabytes); a larger file is refused unread, so a planted sparse file of gigabytes costs
// one fstat, not a read of all of it.
constexpr size_t kMaxEntryBytes = size_t{256} << 20;
constexpr size_t kMaxMetaBytes = size_t{64} << 10;
// What the size cap counts for an entry's .meta before it exists (a .meta is ~130 bytes).
constexpr size_t kMetaReserve = 256;

// ---- entry format ----
//
// <key>.kk = 64-byte header, then metadata JSON, source, object.
//   0  magic "KILNKC01"            8 bytes
//   8  format version              u32 LE
//   12 header size (64)            u32 LE
//   16 metadata length             u64 LE
//   24 source length               u64 LE
//   32 object length               u64 LE
//   40 hash128 of the payload      lo u64 LE, hi u64 LE
//   56 reserved (zero)             8 bytes

struct ParsedEntry {
  KernelRecord record;
  std::string source;
  std::string object;
};

std::string key_of(const std::string& source, const std::string& identity,
                   const std::string& target) {
  return HashInput().add(kFormatVersion).add(source).add(identity).add(target).finish().hex();
}

std::string encode_entry(const KernelRecord& r, const std::string& source,
                         const std::vector<uint8_t>& object) {
  Json meta = {{"key", r.key},
               {"name", r.name},
               {"source_ops", r.source_ops},
               {"compiler", r.compiler},
               {"target", r.target},
               {"compile_ms", r.compile_ms},
               {"object_bytes", r.object_bytes},
               {"created_unix", r.created_unix}};
  std::string payload = meta.dump();
  const size_t meta_len = payload.size();
  payload += source;
  payload.append(reinterpret_cast<const char*>(object.data()), object.size());
  Hash128 sum = hash128(payload);

  std::string out(kMagic, sizeof kMagic);
  put_u32(out, kFormatVersion);
  put_u32(out, kHeaderBytes);
  put_u64(out, meta_len);
  put_u64(out, source.size());
  put_u64(out, object.size());
  put_u64(out, sum.lo);
  put_u64(out, sum.hi);
  put_u64(out, 0);
  return out + payload;
}

// Checks and splits an entry read from disk. With `full` false only the header and
// metadata are needed (`bytes` may be a prefix) and the checksum is not checked. Returns
// the reason the entry is bad, or nothing.
std::optional<std::string> parse_entry(const std::string& bytes, const std::string& key, bool full,
                                       size_t file_size, ParsedEntry& out) {
  if (file_size < kHeaderBytes)
    return "truncated: " + std::to_string(file_size) + " bytes, shorter than the header";
  if (bytes.size() < kHeaderBytes) return std::string("short read");
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return std::string("not a kiln kernel cache entry (bad magic)");
  uint32_t version = static_cast<uint32_t>(get_le(bytes, 8, 4));
  if (version != kFormatVersion)
    return "stale format version " + std::to_string(version) + " (this kiln uses " +
           std::to_string(kFormatVersion) + ")";
  if (get_le(bytes, 12, 4) != kHeaderBytes) return std::string("bad header size");
  if (get_le(bytes, 56, 8) != 0) return std::string("reserved header bytes are not zero");
  uint64_t meta_len = get_le(bytes, 16, 8), source_len = get_le(bytes, 24, 8),
           object_len = get_le(bytes, 32, 8);
  // Each length is bounded by the file size first, so the sum cannot overflow.
  if (meta_len > file_size || source_len > file_size || object_len > file_size ||
      kHeaderBytes + meta_len + source_len + object_len != file_size)
    return "truncated or padded: header promises " +
           std::to_string(kHeaderBytes + meta_len + source_len + object_len) + " bytes, file has " +
           std::to_string(file_size);
  if (bytes.size() < kHeaderBytes + meta_len) return std::string("short read");
  if (full) {
    if (bytes.size() != file_size) return std::string("short read");
    Hash128 want{get_le(bytes, 40, 8), get_le(bytes, 48, 8)};
    Hash128 got = hash128(bytes.data() + kHeaderBytes, file_size - kHeaderBytes);
    if (!(got == want)) return std::string("checksum mismatch");
  }
  try {
    Json meta = Json::parse(bytes.begin() + kHeaderBytes,
                            bytes.begin() + static_cast<std::ptrdiff_t>(kHeaderBytes + meta_len));
    KernelRecord& r = out.record;
    r.key = meta.at("key").get<std::string>();
    r.name = meta.at("name").get<std::string>();
    r.source_ops = meta.at("source_ops").get<std::vector<std::string>>();
    r.compiler = meta.at("compiler").get<std::string>();
    r.target = meta.at("target").get<std::string>();
    r.compile_ms = meta.at("compile_ms").get<double>();
    r.object_bytes = meta.at("object_bytes").get<size_t>();
    r.created_unix = meta.at("created_unix").get<int64_t>();
    r.last_used_unix = r.created_unix;
  } catch (const std::exception& e) {
    return std::string("bad metadata: ") + e.what();
  }
  if (out.record.key != key) return "entry belongs to key " + out.record.key;
  if (out.record.object_bytes != object_len)
    return std::string("object size disagrees with metadata");
  if (full) {
    out.source = bytes.substr(kHeaderBytes + meta_len, source_len);
    out.object = bytes.substr(kHeaderBytes + meta_len + source_len, object_len);
    if (key_of(out.source, out.record.compiler, out.record.target) != key)
      return std::string("key does not match the entry's source, compiler and target");
  }
  return std::nullopt;
}

// Mutable per-entry metadata, `<key>.meta`. Unreadable or foreign content reads as zeros:
// it only carries statistics.
struct MetaState {
  int64_t last_used_unix = 0;
  uint64_t hits = 0, launches = 0;
  double run_ms_total = 0;
};

MetaState read_meta(const std::string& path, const std::string& key) {
  MetaState m;
  ReadResult f = cache_files::read_file(path, kMaxMetaBytes);
  if (f.status != ReadResult::ok) return m;
  try {
    Json j = Json::parse(f.bytes);
    if (j.at("key").get<std::string>() != key) return m;
    m.last_used_unix = j.at("last_used_unix").get<int64_t>();
    m.hits = j.at("hits").get<uint64_t>();
    m.launches = j.at("launches").get<uint64_t>();
    m.run_ms_total = j.at("run_ms_total").get<double>();
  } catch (const std::exception&) {
    return MetaState{};
  }
  return m;
}

void merge_meta(KernelRecord& r, const MetaState& m) {
  r.last_used_unix = std::max(r.created_unix, m.last_used_unix);
  r.hits = m.hits;
  r.launches = m.launches;
  r.run_ms_total = m.run_ms_total;
}

// A reason on one line: loader errors (ORC's in particular) span several.
std::string one_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  for (size_t at = 0; (at = text.find('\n', at)) != std::string::npos;) text.replace(at, 1, "; ");
  return text;
}

void warn_discard(const std::string& path, const std::string& why) {
  log_line("kiln: warning: discarding corrupt kernel cache entry " + path + ": " + one_line(why));
}

std::string without_trailing_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::vector<std::string> split_directories(const std::string& spec) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t colon = spec.find(':', start);
    out.push_back(
        spec.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return out;
}

// "" when `dir` is a directory this process can list, else why not.
std::string unreadable_reason(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return std::strerror(errno);
  ::closedir(d);
  return "";
}

bool is_device_target(const std::string& target) {
  return target.rfind("sm_", 0) == 0 || target.rfind("compute_", 0) == 0;
}

// The load check of a device image, which cannot be loaded without a GPU: CUBIN is an ELF
// file for the CUDA machine (EM_CUDA = 190), PTX is text naming its target.
std::optional<std::string> image_problem(const std::vector<uint8_t>& image) {
  if (image.empty()) return std::string("empty device image");
  if (image.size() >= 4 && std::memcmp(image.data(),
                                       "\x7f"
                                       "ELF",
                                       4) == 0) {
    if (image.size() < 52) return std::string("truncated ELF header");
    const unsigned machine = image[18] | (unsigned{image[19]} << 8);
    if (machine != 190) return "ELF image for machine " + std::to_string(machine) + ", not CUDA";
    return std::nullopt;
  }
  std::string_view text(reinterpret_cast<const char*>(image.data()), image.size());
  if (!text.empty() && text.back() == '\0') text.remove_suffix(1);  // NVRTC's PTX ends in NUL
  if (text.find('\0') == std::string_view::npos &&
      text.find(".version") != std::string_view::npos &&
      text.find(".target") != std::string_view::npos)
    return std::nullopt;
  return std::string("neither a CUBIN nor a PTX image");
}

// Loads a verified entry's object with the compiler that built it and resolves its entry
// point. Returns the reason it fails ("" when it loads, or when no loader applies).
std::string load_check(const ParsedEntry& p, const std::vector<CpuCompiler*>& loaders,
                       bool& loaded) {
  loaded = false;
  const std::vector<uint8_t> object(p.object.begin(), p.object.end());
  if (is_device_target(p.record.target)) {
    if (auto bad = image_problem(object)) return *bad;
    return "";
  }
  // Another machine's object (a shared directory) is checked by checksum and key only.
  if (p.record.target != host_cpu_features()) return "";
  for (CpuCompiler* compiler : loaders) {
    if (!compiler || compiler->identity() != p.record.compiler) continue;
    try {
      std::unique_ptr<LoadedModule> module = compiler->load(object);
      if (!module) return "object does not load";
      module->symbol(p.record.name);
      loaded = true;
      return "";
    } catch (const std::exception& e) {
      return std::string("object does not load: ") + e.what();
    }
  }
  return "";
}

// Compiles done by fill() on this thread: tells fill_quick() whether its quick build was
// compiled or found.
thread_local uint64_t tls_compiles = 0;

// Tiers (KILN_JIT_TIERS) unless the variable says otherwise.
constexpr bool kTiersByDefault = true;

// Caches that may hold quick builds, for count_use(), which knows a record but not its
// cache. Caches register when made and leave when destroyed, so count_use never reaches a
// dead one; tier_watch() turns true at the first quick build, so that processes without
// tiers never take the lock.
std::mutex& tier_caches_mutex() {
  static std::mutex m;
  return m;
}
std::set<KernelCache*>& tier_caches() {
  static std::set<KernelCache*> caches;
  return caches;
}
std::atomic<bool>& tier_watch() {
  static std::atomic<bool> watch{false};
  return watch;
}

}  // namespace

// One key's state. Entries are never erased, so KernelHandle::record stays valid for the
// cache's lifetime. `mutex` is held while the entry is filled (disk load or compile), which
// is what makes concurrent requests for one key compile once. Lock order: entry mutex,
// then disk_mutex_ (then the directory's lock file), then map_mutex_, then stats_mutex_;
// map_mutex_ is never held while waiting for an entry.
struct KernelCache::Entry {
  std::mutex mutex;
  bool ready = false;
  std::unique_ptr<LoadedModule> module;  // CPU kernels
  std::map<std::string, void*> symbols;
  std::vector<uint8_t> image;  // device images
  KernelRecord record;
  std::string disk_dir;  // the directory holding its disk entry ("" = none known)
  // Values of the record's counters last agreed with disk; a flush adds the difference.
  uint64_t synced_hits = 0, synced_launches = 0;
  double synced_run_ms = 0;
  bool dirty = false;
  std::atomic<int64_t> last_used_ns{0};  // read by eviction without the entry lock
  // The entry point of record.name now (KernelHandle::entry()); a background full build
  // replaces it, so launches read it each time.
  std::atomic<void*> slot{nullptr};
  // Tiers: a quick build (not on disk) remembers what its full build needs. Modules it
  // replaced stay loaded until the cache dies: a launch may still be running one.
  bool quick = false;
  std::string source;
  std::string quick_key;  // the quick build's own entry, removed from disk after the swap
  CpuCompiler* full_compiler = nullptr;
};

KernelCache::KernelCache(std::string directories, size_t max_bytes) : max_bytes_(max_bytes) {
  {
    std::lock_guard<std::mutex> lock(tier_caches_mutex());
    tier_caches().insert(this);
  }
  std::vector<std::string> dirs = split_directories(directories);
  std::string last = without_trailing_slashes(dirs.back());
  dirs.pop_back();
  for (std::string& d : dirs) {
    d = without_trailing_slashes(d);
    if (d.empty()) continue;
    if (std::string why = unreadable_reason(d); !why.empty())
      log_line("kiln: warning: read-only kernel cache directory " + d + " cannot be read (" + why +
               "); ignoring it");
    else
      read_only_.push_back(d);
  }
  if (last.empty() || last == "off") return;
  directory_ = last;
  // Probe by creating a file: permission bits alone do not say whether we may write
  // (root, ACLs, read-only mounts).
  std::error_code ec;
  std::filesystem::create_directories(directory_, ec);
  const std::string why = ec ? ec.message() : cache_files::probe_writable(directory_);
  if (why.empty()) {
    disk_enabled_ = true;
    return;
  }
  if (!ec && unreadable_reason(directory_).empty()) {
    // A pre-populated cache on a read-only image: its entries are still worth loading.
    read_only_.insert(read_only_.begin(), directory_);
    log_line("kiln: warning: kernel cache directory " + directory_ + " is not writable (" + why +
             "); reading its entries, keeping new kernels in memory only");
    return;
  }
  log_line("kiln: warning: kernel cache directory " + directory_ + " is not usable (" + why +
           "); caching kernels in memory only");
}

KernelCache::~KernelCache() {
  {
    std::lock_guard<std::mutex> lock(tier_caches_mutex());
    tier_caches().erase(this);
  }
  stop_rebuilds();
  flush();
}

std::vector<std::string> KernelCache::search_order() const {
  std::vector<std::string> dirs;
  if (disk_enabled_) dirs.push_back(directory_);
  dirs.insert(dirs.end(), read_only_.begin(), read_only_.end());
  return dirs;
}

std::string KernelCache::key_for(const std::string& source, CpuCompiler& compiler) {
  return key_of(source, compiler.identity(), host_cpu_features());
}
std::string KernelCache::key_for(const std::string& source, ImageCompiler& compiler) {
  return key_of(source, compiler.identity(), compiler.target());
}

KernelCache::Entry& KernelCache::entry_for(const std::string& key) {
  std::lock_guard<std::mutex> lock(map_mutex_);
  auto& slot = entries_[key];
  if (!slot) {
    slot = std::make_unique<Entry>();
    slot->record.key = key;
  }
  return *slot;
}

// What get() and get_image() differ in: how a kernel is compiled and what becomes of the
// bytes (a CPU object is loaded into this process, a device image is kept for the runtime).
struct KernelCache::Builder {
  std::string identity, target;
  const char* source_suffix;  // of the source path hint in compiler messages
  std::function<std::vector<uint8_t>(const std::string& source, const std::string& hint)> compile;
  // Makes `entry` usable from `object`, including resolving `entry_point` (for ORC the
  // lookup is when the object is linked); throws when the object does not load.
  std::function<void(Entry& entry, std::vector<uint8_t> object, const std::string& entry_point)>
      install;
};

KernelCache::Entry& KernelCache::ready_entry(const std::string& source,
                                             const std::string& entry_name,
                                             const std::vector<std::string>& source_ops,
                                             const Builder& builder,
                                             std::unique_lock<std::mutex>& lock) {
  Entry& e = entry_for(key_of(source, builder.identity, builder.target));
  lock = std::unique_lock<std::mutex>(e.mutex);
  if (e.ready) {
    e.record.hits++;
    e.record.last_used_unix = now_unix();
    e.last_used_ns.store(now_ns(), std::memory_order_relaxed);
    e.dirty = true;
    std::lock_guard<std::mutex> stats_lock(stats_mutex_);
    counters_.memory_hits++;
  } else {
    fill(e, source, entry_name, source_ops, builder);
  }
  return e;
}

// Loads `object` with `compiler` into `entry` (a KernelCache entry), replacing the symbols
// of the module it had when `replace`, and returns its entry point. Throws CompileError,
// leaving `entry` as it was, when the object does not load or lacks the entry point.
template <typename CacheEntry>
void* install_object(CacheEntry& entry, CpuCompiler& compiler, const std::vector<uint8_t>& object,
                     const std::string& entry_point, bool replace) {
  std::unique_ptr<LoadedModule> module = compiler.load(object);
  if (!module) throw CompileError("[kernel cache] object does not load");
  void* fn = module->symbol(entry_point);
  if (!fn) throw CompileError("[kernel cache] object has no entry point '" + entry_point + "'");
  entry.module = std::move(module);
  if (replace) entry.symbols.clear();
  entry.symbols[entry_point] = fn;
  return fn;
}

KernelHandle KernelCache::get(const std::string& source, const std::string& entry_name,
                              const std::vector<std::string>& source_ops, CpuCompiler& compiler) {
  Builder builder{
      compiler.identity(), host_cpu_features(), ".cpp",
      [&](const std::string& src, const std::string& hint) { return compiler.compile(src, hint); },
      [&](Entry& entry, std::vector<uint8_t> object, const std::string& entry_point) {
        install_object(entry, compiler, object, entry_point, /*replace=*/false);
      }};
  std::unique_lock<std::mutex> lock;
  Entry& e = ready_entry(source, entry_name, source_ops, builder, lock);
  return handle_of(e, entry_name);
}

// Under e's lock. The handle of the record's own entry point follows the slot (tiers);
// another symbol of the module is fixed (a replaced module stays loaded).
KernelHandle KernelCache::handle_of(Entry& e, const std::string& entry_name) {
  auto it = e.symbols.find(entry_name);
  if (it == e.symbols.end()) {
    if (!e.module)  // a quick build's entry has its record's entry point only
      throw CompileError("[kernel cache] kernel " + e.record.key + " has no entry point '" +
                         entry_name + "' in its quick build");
    void* fn = e.module->symbol(entry_name);
    if (!fn)
      throw CompileError("[kernel cache] kernel " + e.record.key + " has no entry point '" +
                         entry_name + "'");
    it = e.symbols.emplace(entry_name, fn).first;
  }
  if (entry_name == e.record.name) {
    e.slot.store(it->second, std::memory_order_release);
    return {it->second, &e.record, &e.mutex, &e.slot};
  }
  return {it->second, &e.record, &e.mutex};
}

KernelHandle KernelCache::get(const KernelRequest& request, CpuCompiler& compiler) {
  CpuCompiler* quick = compiler.quick_compiler();
  if (!request.quick_ok || !quick || !tiers())
    return get(request.source, request.entry, request.source_ops, compiler);
  Entry& e = entry_for(key_of(request.source, compiler.identity(), host_cpu_features()));
  std::unique_lock<std::mutex> lock(e.mutex);
  if (!e.ready) {
    // A full build on disk is the best there is: only a kernel missing from every
    // directory starts from a quick build.
    std::string why;
    if (search_order().empty() || !load_from_disk_full(e, compiler, request.entry, why)) {
      if (!why.empty() && debug_log())
        log_line("kiln: debug: quick build " + e.record.key + " (" + request.entry +
                 "): disk entry corrupt: " + one_line(why));
      fill_quick(e, request, compiler);
    }
    return handle_of(e, request.entry);
  }
  lock.unlock();
  return get(request.source, request.entry, request.source_ops, compiler);
}

// Under e's lock (the full build's entry): runs `request` from its quick build, an entry of
// its own under the quick compiler's key (from memory, from disk, or compiled and stored
// like any kernel), and registers e for a background full build. e's record keeps the full
// build's key; its compiler field names the quick build until the swap. The quick entry's
// module stays loaded while the cache lives, so its entry point stays valid after the swap.
void KernelCache::fill_quick(Entry& e, const KernelRequest& request, CpuCompiler& compiler) {
  CpuCompiler& quick = *compiler.quick_compiler();
  const uint64_t compiled_before = tls_compiles;
  KernelHandle q = get(request.source, request.entry, request.source_ops, quick);
  const bool compiled = tls_compiles != compiled_before;
  e.symbols[request.entry] = q.fn;
  KernelRecord& r = e.record;
  {
    std::lock_guard<std::mutex> qlock(*q.record_mutex);
    const std::string key = r.key;
    r = *q.record;
    r.key = key;
  }
  r.hits = r.launches = 0;
  r.run_ms_total = 0;
  r.compile_ms = 0;  // nothing was compiled under this key yet (the quick entry's record has it)
  r.object_bytes = 0;
  e.last_used_ns.store(now_ns(), std::memory_order_relaxed);
  e.quick = true;
  e.quick_key = q.record->key;
  e.source = request.source;
  e.full_compiler = &compiler;
  e.ready = true;
  if (compiled) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    counters_.quick_builds++;
  }
  std::lock_guard<std::mutex> lock(rebuild_mutex_);
  if (!rebuild_stop_) quick_entries_[&e.record] = &e;
  tier_watch().store(true, std::memory_order_relaxed);
}

std::vector<KernelHandle> KernelCache::get_many(const std::vector<KernelRequest>& requests,
                                                CpuCompiler& compiler) {
  std::vector<KernelHandle> out(requests.size());
  // One request per chunk: a chunk compiles and loads its kernel while the others compile
  // theirs; the compiler bounds how many compile at once. Equal keys wait for one compile.
  thread_pool().parallel_for(
      static_cast<int64_t>(requests.size()), 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i)
          out[static_cast<size_t>(i)] = get(requests[static_cast<size_t>(i)], compiler);
      });
  return out;
}

bool KernelCache::tiers() const {
  int t = tiers_.load();
  if (t < 0) {
    t = settings::flag("KILN_JIT_TIERS", kTiersByDefault) ? 1 : 0;
    tiers_.store(t);
  }
  return t == 1;
}

// count_use() saw `record` reach kRebuildAfterLaunches launches: a quick build of this
// cache is queued for its full build.
void KernelCache::queue_rebuild(const KernelRecord* record) {
  CpuCompiler* full = nullptr;
  {
    std::lock_guard<std::mutex> lock(rebuild_mutex_);
    auto it = quick_entries_.find(record);
    if (it == quick_entries_.end() || rebuild_stop_) return;
    if (!rebuild_thread_.joinable()) full = it->second->full_compiler;
  }
  if (full) {
    // Before the first background compile: the statics a full compile makes on first use
    // are made here, on a thread that is not racing exit, and the exit hook is registered
    // after them. Made by the background compile instead, they could die under it when the
    // process exits meanwhile (a segfault at exit, seen when every kernel came from disk
    // and the first -O3 compile of the process was a rebuild).
    full->warm_up();
    hook_exit();
  }
  std::lock_guard<std::mutex> lock(rebuild_mutex_);
  auto it = quick_entries_.find(record);
  if (it == quick_entries_.end() || rebuild_stop_) return;
  rebuild_queue_.push_back(it->second);
  quick_entries_.erase(it);
  if (!rebuild_thread_.joinable()) rebuild_thread_ = std::thread([this] { rebuild_loop(); });
  rebuild_cv_.notify_all();
}

void KernelCache::rebuild_loop() {
  std::unique_lock<std::mutex> lock(rebuild_mutex_);
  while (true) {
    rebuild_cv_.wait(lock, [&] { return rebuild_stop_ || !rebuild_queue_.empty(); });
    if (rebuild_stop_) return;
    Entry* e = rebuild_queue_.front();
    rebuild_queue_.erase(rebuild_queue_.begin());
    ++rebuilds_running_;
    lock.unlock();
    rebuild(*e);
    lock.lock();
    --rebuilds_running_;
    rebuild_cv_.notify_all();
  }
}

// LLVM keeps function-local statics (SelectionDAG's value type tables, ...) that are made by
// the first compile that needs them and destroyed at exit in reverse order of making: a
// rebuild still compiling then would use destroyed tables. The global cache's exit handler
// that stops rebuilds is therefore registered again after each compile and before each
// rebuild, so it runs before the destructors of every static a compile has made so far;
// the compiler's warm_up() before the first rebuild (queue_rebuild) leaves a background
// compile no static of its own to make.
void KernelCache::hook_exit() {
  if (!exit_hooks_ || !tiers()) return;
  std::atexit([] { kernel_cache().stop_rebuilds(); });
}

void KernelCache::wait_for_rebuilds() {
  std::unique_lock<std::mutex> lock(rebuild_mutex_);
  rebuild_cv_.wait(
      lock, [&] { return rebuild_stop_ || (rebuild_queue_.empty() && rebuilds_running_ == 0); });
}

void KernelCache::stop_rebuilds() {
  std::thread worker;
  {
    std::lock_guard<std::mutex> lock(rebuild_mutex_);
    rebuild_stop_ = true;
    rebuild_queue_.clear();
    quick_entries_.clear();
    worker = std::move(rebuild_thread_);
  }
  rebuild_cv_.notify_all();
  if (worker.joinable()) worker.join();
}

// The full build of a quick kernel, on the rebuild thread: from disk when another process
// stored it meanwhile (a damaged entry is discarded with one warning, as in get()), else
// compiled here without the entry's lock (launches go on with the quick build), then
// swapped in and stored. A failure keeps the quick build, which computes the same values.
void KernelCache::rebuild(Entry& e) {
  CpuCompiler& full = *e.full_compiler;
  std::string entry_name, source;
  {
    std::lock_guard<std::mutex> lock(e.mutex);
    entry_name = e.record.name;
    source = e.source;
    const uint64_t hits = e.record.hits, launches = e.record.launches;
    const double run_ms = e.record.run_ms_total;
    std::string why;
    if (!search_order().empty() && load_from_disk_full(e, full, entry_name, why)) {
      // The quick build's counts were never on disk: keep them on top of the entry's.
      e.record.hits = e.synced_hits + hits;
      e.record.launches = e.synced_launches + launches;
      e.record.run_ms_total = e.synced_run_ms + run_ms;
      e.quick = false;
      e.source.clear();
      drop_quick_entry(e);
      std::lock_guard<std::mutex> stats_lock(stats_mutex_);
      counters_.swaps++;
      return;
    }
  }
  if (debug_log())
    log_line("kiln: debug: full build " + e.record.key + " (" + entry_name + "): quick build ran " +
             std::to_string(kRebuildAfterLaunches) + " times");
  hook_exit();
  try {
    const auto start = Clock::now();
    std::vector<uint8_t> object = full.compile(source, "kiln_" + e.record.key + ".cpp");
    std::unique_ptr<LoadedModule> module = full.load(object);
    void* fn = module ? module->symbol(entry_name) : nullptr;
    if (!fn) throw CompileError("[kernel cache] object has no entry point '" + entry_name + "'");
    const double compile_ms = ms_since(start);
    std::lock_guard<std::mutex> lock(e.mutex);
    e.module = std::move(module);
    e.symbols.clear();
    e.symbols[entry_name] = fn;
    e.slot.store(fn, std::memory_order_release);
    e.record.compiler = full.identity();
    e.record.compile_ms = compile_ms;
    e.record.object_bytes = object.size();
    e.quick = false;
    e.source.clear();
    {
      std::lock_guard<std::mutex> stats_lock(stats_mutex_);
      counters_.full_rebuilds++;
      counters_.swaps++;
      counters_.compile_ms_total += compile_ms;
    }
    if (disk_enabled_) {
      store(e, source, object);
      drop_quick_entry(e);
    }
  } catch (const std::exception& ex) {
    log_line("kiln: warning: background full build of kernel " + e.record.key + " (" + entry_name +
             ") failed, keeping its quick build: " + one_line(ex.what()));
  }
}

// Under e's lock, once its full build is on disk: the quick build's disk entry is only a
// worse copy of it now (the quick entry stays loaded in memory).
void KernelCache::drop_quick_entry(Entry& e) {
  if (!disk_enabled_ || e.quick_key.empty()) return;
  if (cache_files::remove_regular(directory_, e.quick_key + kEntrySuffix))
    cache_files::remove_regular(directory_, e.quick_key + kMetaSuffix);
  e.quick_key.clear();
}

// Under e's lock: a full build of e from disk, swapped in for whatever e runs now.
bool KernelCache::load_from_disk_full(Entry& e, CpuCompiler& compiler,
                                      const std::string& entry_name, std::string& why) {
  Builder builder{compiler.identity(), host_cpu_features(), ".cpp", nullptr,
                  [&](Entry& entry, std::vector<uint8_t> object, const std::string& entry_point) {
                    entry.slot.store(
                        install_object(entry, compiler, object, entry_point, /*replace=*/true),
                        std::memory_order_release);
                  }};
  (void)entry_name;
  return load_from_disk(e, builder, why);
}

ImageHandle KernelCache::get_image(
    const std::string& source, const std::string& entry_name,
    const std::vector<std::string>& source_ops, ImageCompiler& compiler,
    const std::function<void(const std::vector<uint8_t>&)>& load_check) {
  Builder builder{
      compiler.identity(), compiler.target(), ".cu",
      [&](const std::string& src, const std::string& hint) { return compiler.compile(src, hint); },
      [&](Entry& entry, std::vector<uint8_t> object, const std::string&) {
        if (auto bad = image_problem(object)) throw CompileError("[kernel cache] " + *bad);
        // The load check of an image, as the CPU path's link: a well-formed image the
        // driver rejects (another GPU's CUBIN under this key, a planted file) is discarded.
        if (load_check) load_check(object);
        entry.image = std::move(object);
      }};
  std::unique_lock<std::mutex> lock;
  Entry& e = ready_entry(source, entry_name, source_ops, builder, lock);
  return {&e.image, &e.record, &e.mutex};
}

void KernelCache::fill(Entry& e, const std::string& source, const std::string& entry_name,
                       const std::vector<std::string>& source_ops, const Builder& builder) {
  std::string reason = "not in memory or on disk";
  if (!search_order().empty()) {
    std::string why;
    if (load_from_disk(e, builder, why)) return;
    if (!why.empty()) reason = "disk entry corrupt: " + one_line(why);
  } else {
    reason = "not in memory (no disk cache)";
  }

  const std::string& key = e.record.key;
  if (debug_log()) log_line("kiln: debug: compile " + key + " (" + entry_name + "): " + reason);
  if (dump_kernels())
    log_line("kiln: kernel " + key + " (" + entry_name + ") from [" + join(source_ops, ", ") +
             "]:\n" + source + "\nkiln: end of kernel " + key);

  const auto start = Clock::now();
  // The hint names the kernel in compiler diagnostics; no file of that name need exist.
  std::vector<uint8_t> object = builder.compile(source, "kiln_" + key + builder.source_suffix);
  const size_t object_bytes = object.size();
  // An object that does not load, or lacks the entry point, is never stored: later
  // processes would only discard it.
  builder.install(e, disk_enabled_ ? object : std::move(object), entry_name);
  const double compile_ms = ms_since(start);

  KernelRecord& r = e.record;
  r.name = entry_name;
  r.source_ops = source_ops;
  r.compiler = builder.identity;
  r.target = builder.target;
  r.compile_ms = compile_ms;
  r.object_bytes = object_bytes;
  r.created_unix = r.last_used_unix = now_unix();
  r.hits = r.launches = 0;
  r.run_ms_total = 0;
  e.synced_hits = e.synced_launches = 0;
  e.synced_run_ms = 0;
  e.last_used_ns.store(now_ns(), std::memory_order_relaxed);
  e.ready = true;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    counters_.kernels_compiled++;
    counters_.compile_ms_total += compile_ms;
  }
  ++tls_compiles;
  hook_exit();
  if (disk_enabled_) store(e, source, object);
}

// The written directory first: it holds what this machine compiled most recently, and a
// bad entry of a read-only layer is then replaced there after its first discard.
bool KernelCache::load_from_disk(Entry& e, const Builder& builder, std::string& why) {
  for (const std::string& dir : search_order()) {
    std::string bad;
    if (load_from(dir, e, builder, bad)) return true;
    if (why.empty()) why = bad;
  }
  return false;
}

bool KernelCache::load_from(const std::string& dir, Entry& e, const Builder& builder,
                            std::string& why) {
  const std::string& key = e.record.key;
  const std::string name = key + kEntrySuffix;
  const std::string path = dir + "/" + name;
  const auto start = Clock::now();
  ReadResult f = cache_files::read_file(path, kMaxEntryBytes);
  if (f.status == ReadResult::missing) return false;

  ParsedEntry parsed;
  if (f.status == ReadResult::bad) {
    why = f.why;
  } else if (auto bad = parse_entry(f.bytes, key, true, f.bytes.size(), parsed)) {
    why = *bad;
  } else if (parsed.record.compiler != builder.identity || parsed.record.target != builder.target) {
    // Unreachable unless the hash collides; checked because running an object built for
    // other CPU features (or another GPU) is the one thing the cache must never do.
    why = "built by another compiler or for another target";
  } else {
    try {
      // The entry point the entry was stored for: the load check of the object.
      builder.install(e, std::vector<uint8_t>(parsed.object.begin(), parsed.object.end()),
                      parsed.record.name);
    } catch (const std::exception& ex) {
      why = std::string("object does not load: ") + ex.what();
    }
  }

  if (!why.empty()) {
    if (!e.ready) {  // a quick build being replaced keeps running
      e.module.reset();
      e.symbols.clear();
      e.image.clear();
    }
    warn_discard(path, why);
    // Only the written directory is kiln's to change, and there only the file that was
    // read: another process may have replaced it with a good entry meanwhile.
    if (disk_enabled_ && dir == directory_ && cache_files::remove_regular(dir, name, &f.id))
      cache_files::remove_regular(dir, key + kMetaSuffix);
    std::lock_guard<std::mutex> lock(stats_mutex_);
    counters_.disk_errors++;
    return false;
  }

  KernelRecord& r = e.record;
  r = parsed.record;
  merge_meta(r, read_meta(dir + "/" + key + kMetaSuffix, key));
  e.disk_dir = dir;
  e.synced_hits = r.hits;
  e.synced_launches = r.launches;
  e.synced_run_ms = r.run_ms_total;
  r.hits++;
  r.last_used_unix = now_unix();
  e.last_used_ns.store(now_ns(), std::memory_order_relaxed);
  e.dirty = true;
  e.ready = true;
  const double load_ms = ms_since(start);
  if (debug_log()) log_line("kiln: debug: load " + key + " (" + r.name + ") from " + dir);
  std::lock_guard<std::mutex> lock(stats_mutex_);
  counters_.disk_hits++;
  counters_.load_ms_total += load_ms;
  return true;
}

void KernelCache::store(Entry& e, const std::string& source, const std::vector<uint8_t>& object) {
  const std::string& key = e.record.key;
  const std::string bytes = encode_entry(e.record, source, object);
  std::string why = cache_files::write_atomically(directory_, key + kEntrySuffix, bytes);
  if (!why.empty()) {
    // Once per cache: a full disk would otherwise print a line per kernel.
    if (!write_warned_.exchange(true))
      log_line("kiln: warning: cannot write kernel cache entry " + directory_ + "/" + key +
               kEntrySuffix + ": " + why + " (kernels stay cached in memory)");
    std::lock_guard<std::mutex> lock(stats_mutex_);
    counters_.disk_errors++;
    return;
  }
  e.disk_dir = directory_;
  // A .meta left by an earlier (evicted or discarded) entry of this key is stale.
  cache_files::remove_regular(directory_, key + kMetaSuffix);
  enforce_cap(key, bytes.size() + kMetaReserve);
}

// The cap holds across processes: each store's accounting runs under the directory's lock
// file. The lock file also keeps the directory's size (last scan + stores since), so most
// stores only add to it; a scan recounts when the sum would pass the cap, every
// kRescanStores stores (catching changes made without the lock), or when the lock cannot
// be had. Over the cap, the least recently used entries go until the directory is at 90%
// of it, so the next stores fit without a scan each. An entry's last use is the newest of
// its file times (a flush rewrites .meta) and, for kernels loaded here, the in-memory last
// use, which may not have been flushed yet.
void KernelCache::enforce_cap(const std::string& keep_key, size_t stored_bytes) {
  if (max_bytes_ == 0) return;
  std::lock_guard<std::mutex> disk_lock(disk_mutex_);
  cache_files::DirectoryLock lock(directory_);
  constexpr uint64_t kRescanStores = 64;
  cache_files::DirectoryLock::Accounting account = lock.read();
  if (account.valid && account.stores_since_scan + 1 < kRescanStores &&
      account.bytes + stored_bytes <= max_bytes_) {
    account.bytes += stored_bytes;
    account.stores_since_scan++;
    lock.write(account);
    return;
  }
  struct Candidate {
    std::string key;
    int64_t used_ns = 0;
    size_t bytes = 0;
    bool has_meta = false;
  };
  std::map<std::string, Candidate> by_key;
  for (const DirFile& f : cache_files::list(directory_)) {
    if (!f.regular() || (f.kind != NameKind::entry && f.kind != NameKind::meta)) continue;
    Candidate& c = by_key.try_emplace(f.key, Candidate{f.key}).first->second;
    c.used_ns = std::max(c.used_ns, mtime_ns(f.st));
    c.bytes += static_cast<size_t>(f.st.st_size);
    c.has_meta |= f.kind == NameKind::meta;
  }
  // An entry's .meta is written at its process's next flush, after this count: it is
  // reserved now, so the directory stays under the cap once it appears.
  for (auto& [key, c] : by_key)
    if (!c.has_meta) c.bytes += kMetaReserve;
  size_t total = 0;
  std::vector<Candidate> order;
  {
    std::lock_guard<std::mutex> lock(map_mutex_);
    for (auto& [key, c] : by_key) {
      total += c.bytes;
      auto it = entries_.find(key);
      if (it != entries_.end())
        c.used_ns = std::max(c.used_ns, it->second->last_used_ns.load(std::memory_order_relaxed));
      if (key != keep_key) order.push_back(c);
    }
  }
  uint64_t evicted = 0;
  if (total > max_bytes_) {
    const size_t low_water = max_bytes_ / 10 * 9;
    std::sort(order.begin(), order.end(),
              [](const Candidate& a, const Candidate& b) { return a.used_ns < b.used_ns; });
    for (const Candidate& c : order) {
      if (total <= low_water) break;
      cache_files::remove_regular(directory_, c.key + kEntrySuffix);
      cache_files::remove_regular(directory_, c.key + kMetaSuffix);
      total -= std::min(total, c.bytes);
      evicted++;
      if (debug_log()) log_line("kiln: debug: evict " + c.key + " (cache over its size cap)");
    }
  }
  lock.write({true, total, 0});
  std::lock_guard<std::mutex> stats_lock(stats_mutex_);
  counters_.evictions += evicted;
}

void KernelCache::flush_entry(Entry& e) {
  KernelRecord& r = e.record;
  if (!e.ready || e.disk_dir != directory_ || (!e.dirty && r.launches == e.synced_launches)) return;
  // An entry evicted or cleared on disk gets no orphan .meta.
  struct stat st {};
  const std::string entry = directory_ + "/" + r.key + kEntrySuffix;
  if (::fstatat(AT_FDCWD, entry.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
    return;
  const std::string meta_name = r.key + kMetaSuffix;
  MetaState m = read_meta(directory_ + "/" + meta_name, r.key);
  m.last_used_unix = std::max(m.last_used_unix, r.last_used_unix);
  m.hits += r.hits - e.synced_hits;
  m.launches += r.launches - e.synced_launches;
  m.run_ms_total += r.run_ms_total - e.synced_run_ms;
  Json j = {{"key", r.key},
            {"last_used_unix", m.last_used_unix},
            {"hits", m.hits},
            {"launches", m.launches},
            {"run_ms_total", m.run_ms_total}};
  if (!cache_files::write_atomically(directory_, meta_name, j.dump()).empty()) return;
  merge_meta(r, m);
  e.synced_hits = r.hits;
  e.synced_launches = r.launches;
  e.synced_run_ms = r.run_ms_total;
  e.dirty = false;
}

void KernelCache::flush() {
  if (!disk_enabled_) return;
  std::vector<Entry*> all;
  {
    std::lock_guard<std::mutex> lock(map_mutex_);
    for (auto& [key, e] : entries_) all.push_back(e.get());
  }
  for (Entry* e : all) {
    std::lock_guard<std::mutex> lock(e->mutex);
    flush_entry(*e);
  }
}

CacheStats KernelCache::stats() const {
  CacheStats s;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    s = counters_;
  }
  s.memory_hits += memo_hits_.load(std::memory_order_relaxed);
  s.directory = directory_;
  s.disk_enabled = disk_enabled_;
  s.read_only_directories = read_only_;
  s.disk_bytes = 0;
  if (!directory_.empty()) {
    for (const DirFile& f : cache_files::list(directory_))
      if (f.regular() && (f.kind == NameKind::entry || f.kind == NameKind::meta))
        s.disk_bytes += static_cast<size_t>(f.st.st_size);
  }
  return s;
}

std::vector<KernelRecord> KernelCache::loaded_records() const {
  // Never hold map_mutex_ while waiting for an entry: a thread filling that entry takes
  // map_mutex_ when its store enforces the size cap (lock order: entry, disk, map).
  std::vector<Entry*> all;
  {
    std::lock_guard<std::mutex> lock(map_mutex_);
    for (const auto& [key, e] : entries_) all.push_back(e.get());
  }
  std::vector<KernelRecord> out;
  for (Entry* e : all) {
    std::lock_guard<std::mutex> entry_lock(e->mutex);
    if (e->ready) out.push_back(e->record);
  }
  return out;
}

std::vector<KernelRecord> KernelCache::disk_records() const {
  std::vector<KernelRecord> out;
  std::set<std::string> seen;  // a key in several directories is listed once, as found first
  for (const std::string& dir : search_order()) {
    for (const DirFile& f : cache_files::list(dir)) {
      if (f.kind != NameKind::entry || !f.regular() || seen.count(f.key)) continue;
      // Header first, then exactly the metadata: listing does not read objects.
      const std::string path = dir + "/" + f.name;
      ReadResult head = cache_files::read_file(path, kMaxEntryBytes, kHeaderBytes);
      if (head.status != ReadResult::ok || head.bytes.size() < kHeaderBytes) continue;
      const uint64_t meta_len = get_le(head.bytes, 16, 8);
      if (meta_len > head.file_size) continue;
      ReadResult part = cache_files::read_file(path, kMaxEntryBytes, kHeaderBytes + meta_len);
      if (part.status != ReadResult::ok) continue;
      ParsedEntry parsed;
      if (parse_entry(part.bytes, f.key, false, part.file_size, parsed)) continue;
      merge_meta(parsed.record, read_meta(dir + "/" + f.key + kMetaSuffix, f.key));
      seen.insert(f.key);
      out.push_back(std::move(parsed.record));
    }
  }
  std::sort(out.begin(), out.end(), [](const KernelRecord& a, const KernelRecord& b) {
    return a.last_used_unix != b.last_used_unix ? a.last_used_unix > b.last_used_unix
                                                : a.key < b.key;
  });
  return out;
}

std::pair<KernelRecord, std::string> KernelCache::show(const std::string& key_prefix) const {
  if (key_prefix.empty()) throw ValueError("[kernel cache] show: empty key");
  const std::vector<std::string> dirs = search_order();
  if (dirs.empty()) throw ValueError("[kernel cache] show: the cache has no directory");
  std::set<std::string> matches;
  for (const std::string& dir : dirs) {
    for (const DirFile& f : cache_files::list(dir)) {
      if (f.kind != NameKind::entry || f.key.compare(0, key_prefix.size(), key_prefix) != 0)
        continue;
      if (f.key == key_prefix) {
        matches = {f.key};
        break;
      }
      matches.insert(f.key);
    }
    if (matches.size() == 1 && *matches.begin() == key_prefix) break;
  }
  if (matches.empty())
    throw ValueError("[kernel cache] no entry in " + join(dirs, ", ") +
                     " has a key starting with '" + key_prefix + "'");
  if (matches.size() > 1)
    throw ValueError("[kernel cache] key prefix '" + key_prefix +
                     "' is ambiguous: " + std::to_string(matches.size()) + " entries match");
  const std::string key = *matches.begin();
  std::string problem;
  for (const std::string& dir : dirs) {
    ReadResult f = cache_files::read_file(dir + "/" + key + kEntrySuffix, kMaxEntryBytes);
    if (f.status == ReadResult::missing) continue;
    ParsedEntry parsed;
    std::optional<std::string> bad = f.status == ReadResult::bad
                                         ? f.why
                                         : parse_entry(f.bytes, key, true, f.bytes.size(), parsed);
    if (bad) {
      if (problem.empty()) problem = *bad;
      continue;
    }
    merge_meta(parsed.record, read_meta(dir + "/" + key + kMetaSuffix, key));
    return {std::move(parsed.record), std::move(parsed.source)};
  }
  throw ValueError("[kernel cache] entry " + key + " is corrupt: " +
                   (problem.empty() ? std::string("removed while reading") : problem));
}

VerifyReport KernelCache::verify(const std::vector<CpuCompiler*>& loaders) {
  VerifyReport report;
  std::lock_guard<std::mutex> disk_lock(disk_mutex_);
  for (const std::string& dir : search_order()) {
    const bool ours = disk_enabled_ && dir == directory_;
    const std::vector<DirFile> files = cache_files::list(dir);
    std::set<std::string> good;
    for (const DirFile& f : files) {
      if (f.kind != NameKind::entry) continue;
      const std::string path = dir + "/" + f.name;
      ReadResult r = cache_files::read_file(path, kMaxEntryBytes);
      if (r.status == ReadResult::missing) continue;  // removed by another process meanwhile
      ParsedEntry parsed;
      std::string why;
      bool loaded = false;
      if (r.status == ReadResult::bad)
        why = r.why;
      else if (auto bad = parse_entry(r.bytes, f.key, true, r.bytes.size(), parsed))
        why = *bad;
      else
        why = load_check(parsed, loaders, loaded);
      if (why.empty()) {
        report.ok++;
        if (loaded) report.load_checked++;
        good.insert(f.key);
        continue;
      }
      VerifyProblem problem{f.key, path, one_line(why), false};
      if (ours && cache_files::remove_regular(dir, f.name, &r.id)) {
        problem.removed = true;
        cache_files::remove_regular(dir, f.key + kMetaSuffix);
      }
      report.problems.push_back(std::move(problem));
    }
    if (!ours) continue;
    // Stray files: .meta without a good entry, temporaries of writers that died (an hour
    // is far longer than any write takes, so a live writer's file is never removed).
    const int64_t hour_ago_ns = now_ns() - int64_t{3600} * 1000000000;
    for (const DirFile& f : files) {
      if (!f.regular()) continue;
      const bool stray = (f.kind == NameKind::meta && !good.count(f.key)) ||
                         (f.kind == NameKind::temp && mtime_ns(f.st) < hour_ago_ns);
      if (stray && cache_files::remove_regular(dir, f.name)) report.stray_files_removed++;
    }
    // Entries were removed behind the size accounting's back: the next store recounts.
    cache_files::DirectoryLock(directory_).write({});
  }
  std::sort(report.problems.begin(), report.problems.end(),
            [](const VerifyProblem& a, const VerifyProblem& b) {
              return a.key != b.key ? a.key < b.key : a.path < b.path;
            });
  return report;
}

size_t KernelCache::clear() {
  if (!disk_enabled_) return 0;
  std::lock_guard<std::mutex> disk_lock(disk_mutex_);
  cache_files::DirectoryLock lock(directory_);
  const int64_t hour_ago_ns = now_ns() - int64_t{3600} * 1000000000;
  size_t removed = 0;
  for (const DirFile& f : cache_files::list(directory_)) {
    if (!f.regular()) continue;
    const bool ours = f.kind == NameKind::entry || f.kind == NameKind::meta ||
                      (f.kind == NameKind::temp && mtime_ns(f.st) < hour_ago_ns);
    if (ours && cache_files::remove_regular(directory_, f.name) && f.kind == NameKind::entry)
      removed++;
  }
  lock.write({});
  return removed;
}

// ---- the process-wide cache ----

namespace {

std::string default_cache_directory() {
  if (const std::optional<std::string> dir = settings::text("KILN_CACHE_DIR"))
    return *dir == "off" ? "" : *dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && xdg[0] == '/')
    return std::string(xdg) + "/kiln";
  const char* home = std::getenv("HOME");
  if (!home || !*home) {
    if (const passwd* pw = ::getpwuid(::getuid())) home = pw->pw_dir;
  }
  if (!home || !*home) {
    log_line(
        "kiln: warning: no home directory and no KILN_CACHE_DIR; caching kernels in "
        "memory only");
    return "";
  }
  return std::string(home) + "/.cache/kiln";
}

// A malformed value raises ValueError from every call that opens the cache (the registry's
// rule), instead of a warning and a cap the user did not ask for.
size_t default_cache_cap() {
  constexpr int64_t kDefaultMb = 1024;
  const int64_t mb =
      settings::integer("KILN_CACHE_MAX_MB", 0, int64_t{1} << 40).value_or(kDefaultMb);
  return static_cast<size_t>(mb) << 20;
}

}  // namespace

KernelCache& kernel_cache() {
  // Never destroyed: loaded kernels may be called until the very end of the process, and
  // the compiler they came from may already be gone at static destruction. The metadata is
  // flushed at exit instead.
  static KernelCache* cache = [] {
    auto* c = new KernelCache(default_cache_directory(), default_cache_cap());
    c->exit_hooks_ = true;
    // Background rebuilds end before the process does (they use LLVM, whose statics die
    // after the atexit handlers registered after them).
    std::atexit([] {
      kernel_cache().stop_rebuilds();
      kernel_cache().flush();
    });
    return c;
  }();
  return *cache;
}

void count_use(KernelRecord* record, std::mutex* record_mutex, uint64_t hits, uint64_t launches,
               double run_ms) {
  if (record == nullptr) return;
  uint64_t before = 0;
  {
    std::lock_guard<std::mutex> lock(*record_mutex);
    before = record->launches;
    record->hits += hits;
    record->launches += launches;
    record->run_ms_total += run_ms;
  }
  // Once per record, when it reaches the rebuild count, and only while quick builds exist:
  // the registry of caches is looked up then, not on every launch.
  constexpr uint64_t n = KernelCache::kRebuildAfterLaunches;
  if (before < n && before + launches >= n && tier_watch().load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(tier_caches_mutex());
    for (KernelCache* cache : tier_caches()) cache->queue_rebuild(record);
  }
}

CacheStats cache_stats() { return kernel_cache().stats(); }
std::vector<KernelRecord> kernel_records() { return kernel_cache().loaded_records(); }

}  // namespace kiln::jit
