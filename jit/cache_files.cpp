// The kernel cache's file layer (see cache_files.h for the rules it enforces).
//
// Decisions:
// * Reads check the entry with fstatat(AT_SYMLINK_NOFOLLOW) before opening it, so a
//   planted FIFO or device node is never opened at all, then open with O_NOFOLLOW |
//   O_NONBLOCK and fstat the descriptor, so a file swapped in between is still caught.
// * Temporaries are created with O_CREAT | O_EXCL | O_NOFOLLOW under a random name: a
//   planted file or symlink of that name makes the open fail (and a new name is tried),
//   it is never opened, followed or truncated.
// * The lock file is the one file kiln opens for writing by its final name. It must be a
//   regular file with one link, so that a hard link planted under that name cannot make
//   kiln write into a file elsewhere.
#include "jit/cache_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

namespace kiln::jit::cache_files {
namespace {

constexpr const char* kTempPrefix = ".tmp-kiln-";
constexpr size_t kTempRandomDigits = 16;

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// `.tmp-kiln-<decimal pid>-<16 hex>`, nothing more.
bool is_temp_name(const std::string& name) {
  const std::string prefix = kTempPrefix;
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  size_t at = prefix.size(), digits = 0;
  while (at < name.size() && is_digit(name[at])) ++at, ++digits;
  if (digits == 0 || digits > 10 || at >= name.size() || name[at] != '-') return false;
  ++at;
  if (name.size() - at != kTempRandomDigits) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(at), name.end(), is_hex);
}

uint64_t random_u64() {
  uint64_t value = 0;
  if (::getrandom(&value, sizeof value, GRND_NONBLOCK) == static_cast<ssize_t>(sizeof value))
    return value;
  // No entropy yet (early boot): uniqueness is all a temporary name needs, and O_EXCL
  // turns any collision into a retry.
  static std::atomic<uint64_t> counter{0};
  uint64_t x = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               (counter.fetch_add(1) * 0x9e3779b97f4a7c15ULL) ^
               (static_cast<uint64_t>(::getpid()) << 32);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

// Opens a fresh temporary in `directory`; returns the fd (name in `name`) or -errno.
int create_temp(const std::string& directory, std::string& name) {
  int err = EEXIST;
  for (int attempt = 0; attempt < 8 && err == EEXIST; ++attempt) {
    name = temp_name();
    int fd = ::open((directory + "/" + name).c_str(),
                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    err = errno;
  }
  return -err;
}

bool write_all(int fd, const char* p, size_t left, std::string& why) {
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      why = n < 0 ? std::strerror(errno) : "short write";
      return false;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

bool is_key(const std::string& text) {
  return text.size() == 32 && std::all_of(text.begin(), text.end(), is_hex);
}

NameKind classify(const std::string& name, std::string* key) {
  for (auto [suffix, kind] :
       {std::pair{kEntrySuffix, NameKind::entry}, std::pair{kMetaSuffix, NameKind::meta}}) {
    if (!ends_with(name, suffix)) continue;
    std::string k = name.substr(0, name.size() - std::strlen(suffix));
    if (!is_key(k)) return NameKind::foreign;
    if (key) *key = std::move(k);
    return kind;
  }
  if (name == kLockName) return NameKind::lock;
  if (is_temp_name(name)) return NameKind::temp;
  return NameKind::foreign;
}

std::string temp_name() {
  char hex[kTempRandomDigits + 1];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(random_u64()));
  return kTempPrefix + std::to_string(::getpid()) + "-" + hex;
}

std::string type_name(mode_t mode) {
  if (S_ISLNK(mode)) return "symlink";
  if (S_ISFIFO(mode)) return "fifo";
  if (S_ISDIR(mode)) return "directory";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "device";
  if (S_ISREG(mode)) return "regular file";
  return "unknown file type";
}

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

ReadResult read_file(const std::string& path, size_t max_bytes, size_t limit) {
  ReadResult r;
  struct stat st {};
  if (::fstatat(AT_FDCWD, path.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return r;
    r.status = ReadResult::bad;
    r.why = std::string("cannot read: ") + std::strerror(errno);
    return r;
  }
  r.status = ReadResult::bad;
  if (!S_ISREG(st.st_mode)) {
    r.why = "not a regular file (" + type_name(st.st_mode) + ")";
    return r;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      r.status = ReadResult::missing;
      return r;
    }
    r.why = errno == ELOOP ? "not a regular file (symlink)"
                           : std::string("cannot read: ") + std::strerror(errno);
    return r;
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    r.why = "not a regular file (" + type_name(st.st_mode) + ")";
    ::close(fd);
    return r;
  }
  r.id = {st.st_dev, st.st_ino};
  r.file_size = static_cast<size_t>(st.st_size);
  if (r.file_size > max_bytes) {
    r.why = std::to_string(r.file_size) + " bytes, more than the " + std::to_string(max_bytes) +
            " a cache file may have";
    ::close(fd);
    return r;
  }
  size_t want = limit && limit < r.file_size ? limit : r.file_size;
  r.bytes.resize(want);
  size_t got = 0;
  while (got < want) {
    ssize_t n = ::read(fd, r.bytes.data() + got, want - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      r.why = std::string("cannot read: ") + std::strerror(errno);
      ::close(fd);
      return r;
    }
    if (n == 0) break;  // shrank while reading; the entry's length check reports it
    got += static_cast<size_t>(n);
  }
  r.bytes.resize(got);
  ::close(fd);
  r.status = ReadResult::ok;
  return r;
}

std::string write_atomically(const std::string& directory, const std::string& name,
                             const std::string& bytes) {
  std::string temp;
  int fd = create_temp(directory, temp);
  if (fd < 0) return std::strerror(-fd);
  const std::string temp_path = directory + "/" + temp;
  std::string why;
  bool ok = write_all(fd, bytes.data(), bytes.size(), why);
  if (::close(fd) != 0 && ok) {
    why = std::strerror(errno);
    ok = false;
  }
  if (ok && ::rename(temp_path.c_str(), (directory + "/" + name).c_str()) != 0) {
    why = std::strerror(errno);
    ok = false;
  }
  if (!ok) ::unlink(temp_path.c_str());
  return why;
}

std::string probe_writable(const std::string& directory) {
  std::string temp;
  int fd = create_temp(directory, temp);
  if (fd < 0) return std::strerror(-fd);
  ::close(fd);
  ::unlink((directory + "/" + temp).c_str());
  return "";
}

std::vector<DirFile> list(const std::string& directory) {
  std::vector<DirFile> files;
  DIR* dir = ::opendir(directory.c_str());
  if (!dir) return files;
  const int dfd = ::dirfd(dir);
  while (dirent* e = ::readdir(dir)) {
    DirFile f;
    f.name = e->d_name;
    if (f.name == "." || f.name == "..") continue;
    if (::fstatat(dfd, e->d_name, &f.st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // just removed
    f.kind = classify(f.name, &f.key);
    files.push_back(std::move(f));
  }
  ::closedir(dir);
  return files;
}

bool remove_regular(const std::string& directory, const std::string& name, const FileId* id) {
  const std::string path = directory + "/" + name;
  struct stat st {};
  if (::fstatat(AT_FDCWD, path.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
    return false;
  if (id && !(FileId{st.st_dev, st.st_ino} == *id)) return false;
  return ::unlink(path.c_str()) == 0;
}

DirectoryLock::DirectoryLock(const std::string& directory) {
  const std::string path = directory + "/" + kLockName;
  const int flags = O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | flags, 0644);
  writable_ = fd >= 0;
  // Another user's lock file may be read-only to us; flock works on a read-only descriptor.
  if (fd < 0 && (errno == EACCES || errno == EROFS)) fd = ::open(path.c_str(), O_RDONLY | flags);
  if (fd < 0) return;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
    ::close(fd);
    return;
  }
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      ::close(fd);
      return;
    }
  }
  fd_ = fd;
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

DirectoryLock::Accounting DirectoryLock::read() const {
  Accounting a;
  if (fd_ < 0) return a;
  char text[128] = {};
  ssize_t n = ::pread(fd_, text, sizeof text - 1, 0);
  if (n <= 0) return a;
  unsigned long long bytes = 0, stores = 0;
  int used = 0;
  if (std::sscanf(text, "kiln-lock 1 %llu %llu\n%n", &bytes, &stores, &used) == 2 && used == n) {
    a.valid = true;
    a.bytes = bytes;
    a.stores_since_scan = stores;
  }
  return a;
}

void DirectoryLock::write(const Accounting& a) const {
  if (fd_ < 0 || !writable_) return;
  char text[128];
  int n = a.valid ? std::snprintf(text, sizeof text, "kiln-lock 1 %llu %llu\n",
                                  static_cast<unsigned long long>(a.bytes),
                                  static_cast<unsigned long long>(a.stores_since_scan))
                  : 0;
  if (n > 0 && ::pwrite(fd_, text, static_cast<size_t>(n), 0) != n) n = 0;
  if (::ftruncate(fd_, n) != 0) return;  // best effort: a bad record only forces a scan
}

}  // namespace kiln::jit::cache_files
