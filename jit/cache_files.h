#pragma once
// The file layer of the kernel cache: which names in a cache directory are kiln's, and the
// only ways kiln reads, writes, lists and removes them.
//
// A cache directory may be shared, and whoever can write it can plant anything there
// (symlinks, FIFOs, huge sparse files, files of their own under kiln-like names). Every
// access goes through these functions so that each rule holds in one place:
//   - no symlink is ever followed, and nothing outside the directory is created, truncated
//     or removed;
//   - only regular files are read or removed, and a file is sized with fstat before it is
//     read (no read of an unbounded file, no open that blocks on a FIFO);
//   - only names kiln writes, matched exactly, are ever removed.
#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::jit::cache_files {

/// What a name in a cache directory is, by its exact spelling.
enum class NameKind {
  entry,    ///< `<key>.kk`, a kernel entry
  meta,     ///< `<key>.meta`, its mutable statistics
  temp,     ///< `.tmp-kiln-<pid>-<16 hex>`, a write in progress (or a dead writer's)
  lock,     ///< `.kiln-lock`, the cross-process lock and size accounting
  foreign,  ///< anything else: never touched
};

/// Suffixes and fixed names kiln writes.
inline constexpr const char* kEntrySuffix = ".kk";
inline constexpr const char* kMetaSuffix = ".meta";
inline constexpr const char* kLockName = ".kiln-lock";

/// True for a kernel key: exactly 32 lowercase hex digits.
bool is_key(const std::string& text);
/// Classifies `name`; for entry and meta names sets `key` (when given) to the key part.
NameKind classify(const std::string& name, std::string* key = nullptr);
/// A fresh temporary name `.tmp-kiln-<pid>-<16 random hex digits>`.
std::string temp_name();

/// Identity of a file, to remove only the file that was read and not a newer one.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileId& o) const { return dev == o.dev && ino == o.ino; }
};

/// The outcome of read_file().
struct ReadResult {
  enum Status { ok, missing, bad } status = missing;
  std::string why;       ///< for bad: why the file was not read
  std::string bytes;     ///< for ok: the first `limit` bytes (all when limit is 0)
  size_t file_size = 0;  ///< size from fstat
  FileId id;
};

/// Reads the regular file `path` without following a symlink or blocking on a FIFO.
/// A file larger than `max_bytes` is refused unread (status bad); `limit` > 0 reads only
/// that many bytes from the start.
ReadResult read_file(const std::string& path, size_t max_bytes, size_t limit = 0);

/// Writes `bytes` to a new temporary file in `directory` (O_CREAT|O_EXCL|O_NOFOLLOW) and
/// renames it over `directory/name`. Returns "" or why it failed (nothing is left behind).
std::string write_atomically(const std::string& directory, const std::string& name,
                             const std::string& bytes);

/// Creates and removes a temporary file in `directory`: "" when kiln can write there, else
/// why not (EROFS, EACCES, ...). Permission bits alone cannot say this (root, ACLs, mounts).
std::string probe_writable(const std::string& directory);

/// One directory entry, stat'ed without following symlinks.
struct DirFile {
  std::string name;
  NameKind kind = NameKind::foreign;
  std::string key;  ///< for entry and meta names
  struct stat st {};
  bool regular() const { return S_ISREG(st.st_mode); }
};

/// Every entry of `directory` except "." and ".." (empty when it cannot be read).
std::vector<DirFile> list(const std::string& directory);

/// Removes `directory/name` if it is still the regular file `id` (when given) or any
/// regular file; never a symlink, FIFO or directory. Returns true when removed.
bool remove_regular(const std::string& directory, const std::string& name,
                    const FileId* id = nullptr);

/// A short description of a non-regular file's type ("symlink", "fifo", "directory", ...).
std::string type_name(mode_t mode);

/// Modification time in nanoseconds since the epoch.
int64_t mtime_ns(const struct stat& st);

/// An exclusive flock on `<directory>/.kiln-lock`, shared by all processes using the
/// directory, plus the size accounting stored in that file. The lock file is opened with
/// O_NOFOLLOW and must be a regular file; when it cannot be had, held() is false and the
/// caller proceeds without cross-process exclusion.
class DirectoryLock {
 public:
  explicit DirectoryLock(const std::string& directory);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  bool held() const { return fd_ >= 0; }

  /// The accounting kept in the lock file: the directory's bytes as of the last scan plus
  /// the stores since, and how many stores there were since that scan.
  struct Accounting {
    bool valid = false;
    uint64_t bytes = 0;
    uint64_t stores_since_scan = 0;
  };
  /// Reads the accounting (invalid when absent, unreadable or malformed).
  Accounting read() const;
  /// Replaces the accounting (no effect without write access to the lock file).
  void write(const Accounting& a) const;

 private:
  int fd_ = -1;
  bool writable_ = false;
};

}  // namespace kiln::jit::cache_files
