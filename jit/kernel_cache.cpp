// Kernel cache: memory level (key -> loaded module) over a disk level shared by processes.
//
// Invariants and decisions:
// * An entry file is never modified in place. It is written whole to a temporary file in
//   the same directory and renamed over `<key>.kk`, so a reader sees either no entry or a
//   complete one, whatever other processes do. No directory lock is needed.
// * Nothing read from disk is trusted before its header, length, checksum and key have
//   been checked. The key is recomputed from the stored source, compiler identity and CPU
//   features, so a file copied under another name, or built by another compiler or for
//   another CPU, is rejected even if its checksum is intact.
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

#include "core/error.h"
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
constexpr const char* kEntrySuffix = ".kk";
constexpr const char* kMetaSuffix = ".meta";
constexpr const char* kTempPrefix = ".tmp-";

int64_t now_unix() { return static_cast<int64_t>(std::time(nullptr)); }
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// One write(2) per line so that lines from several threads or processes do not interleave.
void print_line(const std::string& line) {
  std::string text = line + "\n";
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}
bool debug_log() { return env_is("KILN_LOG", "debug"); }
bool dump_kernels() {
  const char* v = std::getenv("KILN_DUMP_KERNELS");
  return v && *v && std::strcmp(v, "0") != 0;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

bool is_key(const std::string& s) {
  return s.size() == 32 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
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

// ---- files ----

struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
};

// Reads up to `limit` bytes of `path` (all of it when limit is 0). Returns 0 or an errno.
int read_file(const std::string& path, std::string& out, FileId* id = nullptr, size_t limit = 0) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return err;
  }
  if (id) *id = {st.st_dev, st.st_ino};
  size_t want = static_cast<size_t>(st.st_size);
  if (limit && limit < want) want = limit;
  out.resize(want);
  size_t got = 0;
  while (got < want) {
    ssize_t n = ::read(fd, out.data() + got, want - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return err;
    }
    if (n == 0) break;  // shrank while reading; the length check reports it
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  ::close(fd);
  return 0;
}

// Writes `bytes` to a fresh temporary file next to `path` and renames it over `path`.
// Returns "" or the reason it failed (the temporary file is removed then).
std::string write_atomically(const std::string& directory, const std::string& path,
                             const std::string& bytes) {
  static std::atomic<uint64_t> counter{0};
  std::string temp = directory + "/" + kTempPrefix + std::to_string(::getpid()) + "-" +
                     std::to_string(counter.fetch_add(1)) + "-" +
                     std::filesystem::path(path).filename().string();
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return std::strerror(errno);
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string why = n < 0 ? std::strerror(errno) : "short write";
      ::close(fd);
      ::unlink(temp.c_str());
      return why;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::close(fd) != 0 || ::rename(temp.c_str(), path.c_str()) != 0) {
    std::string why = std::strerror(errno);
    ::unlink(temp.c_str());
    return why;
  }
  return "";
}

struct DirFile {
  std::string name;
  struct stat st;
};

std::vector<DirFile> list_directory(const std::string& directory) {
  std::vector<DirFile> files;
  DIR* dir = ::opendir(directory.c_str());
  if (!dir) return files;
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (::stat((directory + "/" + name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    files.push_back({name, st});
  }
  ::closedir(dir);
  return files;
}

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

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
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return std::string("not a kiln kernel cache entry (bad magic)");
  uint32_t version = static_cast<uint32_t>(get_le(bytes, 8, 4));
  if (version != kFormatVersion)
    return "stale format version " + std::to_string(version) + " (this kiln uses " +
           std::to_string(kFormatVersion) + ")";
  if (get_le(bytes, 12, 4) != kHeaderBytes) return std::string("bad header size");
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
  std::string text;
  if (read_file(path, text) != 0) return m;
  try {
    Json j = Json::parse(text);
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

void warn_discard(const std::string& path, const std::string& why) {
  print_line("kiln: warning: discarding corrupt kernel cache entry " + path + ": " + why);
}

}  // namespace

// One key's state. Entries are never erased, so KernelHandle::record stays valid for the
// cache's lifetime. `mutex` is held while the entry is filled (disk load or compile), which
// is what makes concurrent requests for one key compile once. Lock order: entry mutex,
// then disk_mutex_, then map_mutex_, then stats_mutex_; map_mutex_ is never held while
// waiting for an entry.
struct KernelCache::Entry {
  std::mutex mutex;
  bool ready = false;
  std::unique_ptr<LoadedModule> module;  // CPU kernels
  std::map<std::string, void*> symbols;
  std::vector<uint8_t> image;  // device images
  KernelRecord record;
  // Values of the record's counters last agreed with disk; a flush adds the difference.
  uint64_t synced_hits = 0, synced_launches = 0;
  double synced_run_ms = 0;
  bool dirty = false;
  std::atomic<int64_t> last_used_ns{0};  // read by eviction without the entry lock
};

KernelCache::KernelCache(std::string directory, size_t max_bytes)
    : directory_(std::move(directory)), max_bytes_(max_bytes) {
  while (directory_.size() > 1 && directory_.back() == '/') directory_.pop_back();
  if (directory_.empty()) return;
  // Probe by creating a file: permission bits alone do not say whether we may write
  // (root, ACLs, read-only mounts).
  std::error_code ec;
  std::filesystem::create_directories(directory_, ec);
  std::string why;
  if (ec) {
    why = ec.message();
  } else {
    std::string probe = directory_ + "/" + kTempPrefix + "probe-" + std::to_string(::getpid());
    int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      why = std::strerror(errno);
    } else {
      ::close(fd);
      ::unlink(probe.c_str());
    }
  }
  if (!why.empty()) {
    print_line("kiln: warning: kernel cache directory " + directory_ + " is not usable (" + why +
               "); caching kernels in memory only");
    return;
  }
  disk_enabled_ = true;
}

KernelCache::~KernelCache() { flush(); }

std::string KernelCache::entry_path(const std::string& key) const {
  return directory_ + "/" + key + kEntrySuffix;
}
std::string KernelCache::meta_path(const std::string& key) const {
  return directory_ + "/" + key + kMetaSuffix;
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
  // Makes `entry` usable from `object`; throws CompileError when the object does not load.
  std::function<void(Entry& entry, std::vector<uint8_t> object)> install;
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

KernelHandle KernelCache::get(const std::string& source, const std::string& entry_name,
                              const std::vector<std::string>& source_ops, CpuCompiler& compiler) {
  Builder builder{
      compiler.identity(), host_cpu_features(), ".cpp",
      [&](const std::string& src, const std::string& hint) { return compiler.compile(src, hint); },
      [&](Entry& entry, std::vector<uint8_t> object) {
        entry.module = compiler.load(object);
        if (!entry.module) throw CompileError("[kernel cache] object does not load");
      }};
  std::unique_lock<std::mutex> lock;
  Entry& e = ready_entry(source, entry_name, source_ops, builder, lock);
  auto it = e.symbols.find(entry_name);
  if (it == e.symbols.end()) {
    void* fn = e.module->symbol(entry_name);
    if (!fn)
      throw CompileError("[kernel cache] kernel " + e.record.key + " has no entry point '" +
                         entry_name + "'");
    it = e.symbols.emplace(entry_name, fn).first;
  }
  return {it->second, &e.record, &e.mutex};
}

ImageHandle KernelCache::get_image(const std::string& source, const std::string& entry_name,
                                   const std::vector<std::string>& source_ops,
                                   ImageCompiler& compiler) {
  Builder builder{
      compiler.identity(), compiler.target(), ".cu",
      [&](const std::string& src, const std::string& hint) { return compiler.compile(src, hint); },
      [](Entry& entry, std::vector<uint8_t> object) {
        if (object.empty()) throw CompileError("[kernel cache] empty device image");
        entry.image = std::move(object);
      }};
  std::unique_lock<std::mutex> lock;
  Entry& e = ready_entry(source, entry_name, source_ops, builder, lock);
  return {&e.image, &e.record, &e.mutex};
}

void KernelCache::fill(Entry& e, const std::string& source, const std::string& entry_name,
                       const std::vector<std::string>& source_ops, const Builder& builder) {
  std::string reason = "not in memory or on disk";
  if (disk_enabled_) {
    std::string why;
    if (load_from_disk(e, builder, why)) return;
    if (!why.empty()) reason = "disk entry corrupt: " + why;
  } else {
    reason = "not in memory (no disk cache)";
  }

  const std::string& key = e.record.key;
  if (debug_log()) print_line("kiln: debug: compile " + key + " (" + entry_name + "): " + reason);
  if (dump_kernels())
    print_line("kiln: kernel " + key + " (" + entry_name + ") from [" + join(source_ops, ", ") +
               "]:\n" + source + "\nkiln: end of kernel " + key);

  const auto start = Clock::now();
  // The hint names the kernel in compiler diagnostics; no file of that name need exist.
  std::vector<uint8_t> object = builder.compile(source, "kiln_" + key + builder.source_suffix);
  const size_t object_bytes = object.size();
  builder.install(e, disk_enabled_ ? object : std::move(object));
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
  if (disk_enabled_) store(e, source, object);
}

bool KernelCache::load_from_disk(Entry& e, const Builder& builder, std::string& why) {
  const std::string& key = e.record.key;
  const std::string path = entry_path(key);
  const auto start = Clock::now();
  std::string bytes;
  FileId id;
  int err = read_file(path, bytes, &id);
  if (err == ENOENT) return false;

  ParsedEntry parsed;
  if (err != 0) {
    why = std::string("cannot read: ") + std::strerror(err);
  } else if (auto bad = parse_entry(bytes, key, true, bytes.size(), parsed)) {
    why = *bad;
  } else if (parsed.record.compiler != builder.identity || parsed.record.target != builder.target) {
    // Unreachable unless the hash collides; checked because running an object built for
    // other CPU features (or another GPU) is the one thing the cache must never do.
    why = "built by another compiler or for another target";
  } else {
    try {
      builder.install(e, std::vector<uint8_t>(parsed.object.begin(), parsed.object.end()));
    } catch (const std::exception& ex) {
      why = std::string("object does not load: ") + ex.what();
    }
  }

  if (!why.empty()) {
    e.module.reset();
    e.image.clear();
    warn_discard(path, why);
    // Remove only the file we read: another process may have replaced it meanwhile.
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && st.st_dev == id.dev && st.st_ino == id.ino) {
      ::unlink(path.c_str());
      ::unlink(meta_path(key).c_str());
    }
    std::lock_guard<std::mutex> lock(stats_mutex_);
    counters_.disk_errors++;
    return false;
  }

  KernelRecord& r = e.record;
  r = parsed.record;
  merge_meta(r, read_meta(meta_path(key), key));
  e.synced_hits = r.hits;
  e.synced_launches = r.launches;
  e.synced_run_ms = r.run_ms_total;
  r.hits++;
  r.last_used_unix = now_unix();
  e.last_used_ns.store(now_ns(), std::memory_order_relaxed);
  e.dirty = true;
  e.ready = true;
  const double load_ms = ms_since(start);
  if (debug_log()) print_line("kiln: debug: load " + key + " (" + r.name + ") from disk");
  std::lock_guard<std::mutex> lock(stats_mutex_);
  counters_.disk_hits++;
  counters_.load_ms_total += load_ms;
  return true;
}

void KernelCache::store(Entry& e, const std::string& source, const std::vector<uint8_t>& object) {
  const std::string path = entry_path(e.record.key);
  const std::string bytes = encode_entry(e.record, source, object);
  std::string why = write_atomically(directory_, path, bytes);
  if (!why.empty()) {
    // Once per process: a full disk would otherwise print a line per kernel.
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      print_line("kiln: warning: cannot write kernel cache entry " + path + ": " + why +
                 " (kernels stay cached in memory)");
    std::lock_guard<std::mutex> lock(stats_mutex_);
    counters_.disk_errors++;
    return;
  }
  // A .meta left by an earlier (evicted or discarded) entry of this key is stale.
  ::unlink(meta_path(e.record.key).c_str());
  enforce_cap(e.record.key, bytes.size() + 256);  // + room for its .meta
}

// Least recently used first: a disk entry's last use is the newest of its file times (a
// flush rewrites .meta) and, for kernels loaded here, the in-memory last use, which may
// not have been flushed yet.
void KernelCache::enforce_cap(const std::string& keep_key, size_t stored_bytes) {
  if (max_bytes_ == 0) return;
  std::lock_guard<std::mutex> disk_lock(disk_mutex_);
  // A scan stats every file, which a large cache makes slow; most stores only need the
  // running estimate. Other processes' stores are caught by the periodic rescan.
  constexpr unsigned kRescanStores = 64;
  if (estimate_valid_ && ++stores_since_scan_ < kRescanStores &&
      disk_bytes_estimate_ + stored_bytes <= max_bytes_) {
    disk_bytes_estimate_ += stored_bytes;
    return;
  }
  stores_since_scan_ = 0;
  struct Candidate {
    std::string key;
    int64_t used_ns;
    size_t bytes;
  };
  std::map<std::string, Candidate> by_key;
  for (const DirFile& f : list_directory(directory_)) {
    std::string key;
    if (ends_with(f.name, kEntrySuffix))
      key = f.name.substr(0, f.name.size() - 3);
    else if (ends_with(f.name, kMetaSuffix))
      key = f.name.substr(0, f.name.size() - 5);
    if (!is_key(key)) continue;
    Candidate& c = by_key.try_emplace(key, Candidate{key, 0, 0}).first->second;
    c.used_ns = std::max(c.used_ns, mtime_ns(f.st));
    c.bytes += static_cast<size_t>(f.st.st_size);
  }
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
  estimate_valid_ = true;
  disk_bytes_estimate_ = total;
  if (total <= max_bytes_) return;
  std::sort(order.begin(), order.end(),
            [](const Candidate& a, const Candidate& b) { return a.used_ns < b.used_ns; });
  uint64_t evicted = 0;
  for (const Candidate& c : order) {
    if (total <= max_bytes_) break;
    ::unlink(entry_path(c.key).c_str());
    ::unlink(meta_path(c.key).c_str());
    total -= std::min(total, c.bytes);
    evicted++;
    disk_bytes_estimate_ = total;
    if (debug_log()) print_line("kiln: debug: evict " + c.key + " (cache over its size cap)");
  }
  std::lock_guard<std::mutex> lock(stats_mutex_);
  counters_.evictions += evicted;
}

void KernelCache::flush_entry(Entry& e) {
  KernelRecord& r = e.record;
  if (!e.ready || (!e.dirty && r.launches == e.synced_launches)) return;
  // An entry evicted or cleared on disk gets no orphan .meta.
  struct stat st {};
  if (::stat(entry_path(r.key).c_str(), &st) != 0) return;
  MetaState m = read_meta(meta_path(r.key), r.key);
  m.last_used_unix = std::max(m.last_used_unix, r.last_used_unix);
  m.hits += r.hits - e.synced_hits;
  m.launches += r.launches - e.synced_launches;
  m.run_ms_total += r.run_ms_total - e.synced_run_ms;
  Json j = {{"key", r.key},
            {"last_used_unix", m.last_used_unix},
            {"hits", m.hits},
            {"launches", m.launches},
            {"run_ms_total", m.run_ms_total}};
  if (!write_atomically(directory_, meta_path(r.key), j.dump()).empty()) return;
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
  s.directory = directory_;
  s.disk_enabled = disk_enabled_;
  s.disk_bytes = 0;
  if (disk_enabled_) {
    for (const DirFile& f : list_directory(directory_))
      if (f.name[0] != '.' && (ends_with(f.name, kEntrySuffix) || ends_with(f.name, kMetaSuffix)))
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
  if (directory_.empty()) return out;
  for (const DirFile& f : list_directory(directory_)) {
    if (!ends_with(f.name, kEntrySuffix)) continue;
    std::string key = f.name.substr(0, f.name.size() - 3);
    if (!is_key(key)) continue;
    // Header first, then exactly the metadata: listing does not read objects.
    std::string bytes;
    if (read_file(directory_ + "/" + f.name, bytes, nullptr, kHeaderBytes) != 0 ||
        bytes.size() < kHeaderBytes)
      continue;
    uint64_t meta_len = get_le(bytes, 16, 8);
    if (meta_len > static_cast<uint64_t>(f.st.st_size)) continue;
    if (read_file(directory_ + "/" + f.name, bytes, nullptr, kHeaderBytes + meta_len) != 0)
      continue;
    ParsedEntry parsed;
    if (parse_entry(bytes, key, false, static_cast<size_t>(f.st.st_size), parsed)) continue;
    merge_meta(parsed.record, read_meta(meta_path(key), key));
    out.push_back(std::move(parsed.record));
  }
  std::sort(out.begin(), out.end(), [](const KernelRecord& a, const KernelRecord& b) {
    return a.last_used_unix != b.last_used_unix ? a.last_used_unix > b.last_used_unix
                                                : a.key < b.key;
  });
  return out;
}

std::pair<KernelRecord, std::string> KernelCache::show(const std::string& key_prefix) const {
  if (key_prefix.empty()) throw ValueError("[kernel cache] show: empty key");
  if (directory_.empty()) throw ValueError("[kernel cache] show: the cache has no directory");
  std::vector<std::string> matches;
  for (const DirFile& f : list_directory(directory_)) {
    if (!ends_with(f.name, kEntrySuffix)) continue;
    std::string key = f.name.substr(0, f.name.size() - 3);
    if (!is_key(key) || key.compare(0, key_prefix.size(), key_prefix) != 0) continue;
    if (key == key_prefix) {
      matches = {key};
      break;
    }
    matches.push_back(key);
  }
  if (matches.empty())
    throw ValueError("[kernel cache] no entry in " + directory_ + " has a key starting with '" +
                     key_prefix + "'");
  if (matches.size() > 1)
    throw ValueError("[kernel cache] key prefix '" + key_prefix +
                     "' is ambiguous: " + std::to_string(matches.size()) + " entries match");
  const std::string& key = matches[0];
  std::string bytes;
  if (int err = read_file(entry_path(key), bytes))
    throw ValueError("[kernel cache] cannot read entry " + key + ": " + std::strerror(err));
  ParsedEntry parsed;
  if (auto bad = parse_entry(bytes, key, true, bytes.size(), parsed))
    throw ValueError("[kernel cache] entry " + key + " is corrupt: " + *bad);
  merge_meta(parsed.record, read_meta(meta_path(key), key));
  return {std::move(parsed.record), std::move(parsed.source)};
}

std::pair<size_t, std::vector<std::string>> KernelCache::verify() {
  std::pair<size_t, std::vector<std::string>> result{0, {}};
  if (!disk_enabled_) return result;
  std::lock_guard<std::mutex> disk_lock(disk_mutex_);
  estimate_valid_ = false;
  const std::vector<DirFile> files = list_directory(directory_);
  std::vector<std::string> good;
  for (const DirFile& f : files) {
    if (!ends_with(f.name, kEntrySuffix)) continue;
    std::string key = f.name.substr(0, f.name.size() - 3);
    const std::string path = directory_ + "/" + f.name;
    std::string bytes;
    ParsedEntry parsed;
    std::optional<std::string> bad;
    if (int err = read_file(path, bytes)) {
      if (err == ENOENT) continue;  // removed by another process meanwhile
      bad = std::string("cannot read: ") + std::strerror(err);
    } else if (!is_key(key)) {
      bad = std::string("file name is not a kernel key");
    } else {
      bad = parse_entry(bytes, key, true, bytes.size(), parsed);
    }
    if (bad) {
      ::unlink(path.c_str());
      if (is_key(key)) ::unlink(meta_path(key).c_str());
      result.second.push_back(key);
    } else {
      good.push_back(key);
      result.first++;
    }
  }
  // Stray files: .meta without an entry, temporaries of writers that died (an hour is far
  // longer than any write takes, so a live writer's file is never removed).
  const int64_t hour_ago_ns = now_ns() - int64_t{3600} * 1000000000;
  for (const DirFile& f : files) {
    if (ends_with(f.name, kMetaSuffix)) {
      std::string key = f.name.substr(0, f.name.size() - 5);
      if (std::find(good.begin(), good.end(), key) == good.end())
        ::unlink((directory_ + "/" + f.name).c_str());
    } else if (f.name.rfind(kTempPrefix, 0) == 0 && mtime_ns(f.st) < hour_ago_ns) {
      ::unlink((directory_ + "/" + f.name).c_str());
    }
  }
  std::sort(result.second.begin(), result.second.end());
  return result;
}

size_t KernelCache::clear() {
  if (!disk_enabled_) return 0;
  std::lock_guard<std::mutex> disk_lock(disk_mutex_);
  estimate_valid_ = false;
  size_t removed = 0;
  for (const DirFile& f : list_directory(directory_)) {
    bool entry = ends_with(f.name, kEntrySuffix);
    if (entry || ends_with(f.name, kMetaSuffix) || f.name.rfind(kTempPrefix, 0) == 0) {
      if (::unlink((directory_ + "/" + f.name).c_str()) == 0 && entry) removed++;
    }
  }
  return removed;
}

// ---- the process-wide cache ----

namespace {

std::string default_cache_directory() {
  if (const char* dir = std::getenv("KILN_CACHE_DIR")) {
    std::string d = dir;
    return d == "off" ? "" : d;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && xdg[0] == '/')
    return std::string(xdg) + "/kiln";
  const char* home = std::getenv("HOME");
  if (!home || !*home) {
    if (const passwd* pw = ::getpwuid(::getuid())) home = pw->pw_dir;
  }
  if (!home || !*home) {
    print_line(
        "kiln: warning: no home directory and no KILN_CACHE_DIR; caching kernels in "
        "memory only");
    return "";
  }
  return std::string(home) + "/.cache/kiln";
}

size_t default_cache_cap() {
  constexpr size_t kDefaultMb = 1024;
  const char* text = std::getenv("KILN_CACHE_MAX_MB");
  if (!text || !*text) return kDefaultMb << 20;
  char* end = nullptr;
  errno = 0;
  unsigned long long mb = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || text[0] == '-') {
    print_line(std::string("kiln: warning: KILN_CACHE_MAX_MB='") + text +
               "' is not a whole number of megabytes; using " + std::to_string(kDefaultMb));
    return kDefaultMb << 20;
  }
  return static_cast<size_t>(mb) << 20;
}

}  // namespace

KernelCache& kernel_cache() {
  // Never destroyed: loaded kernels may be called until the very end of the process, and
  // the compiler they came from may already be gone at static destruction. The metadata is
  // flushed at exit instead.
  static KernelCache* cache = [] {
    auto* c = new KernelCache(default_cache_directory(), default_cache_cap());
    std::atexit([] { kernel_cache().flush(); });
    return c;
  }();
  return *cache;
}

void count_use(KernelRecord* record, std::mutex* record_mutex, uint64_t hits, uint64_t launches,
               double run_ms) {
  if (record == nullptr) return;
  std::lock_guard<std::mutex> lock(*record_mutex);
  record->hits += hits;
  record->launches += launches;
  record->run_ms_total += run_ms;
}

CacheStats cache_stats() { return kernel_cache().stats(); }
std::vector<KernelRecord> kernel_records() { return kernel_cache().loaded_records(); }

}  // namespace kiln::jit
