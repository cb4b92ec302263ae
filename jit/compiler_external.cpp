// The fallback CPU compiler: the system C++ compiler ($CXX, else `c++`) run as a
// subprocess, producing a shared object that dlopen loads.
//
// Why a shared object: it is the one image format both compile-here and load-elsewhere
// understand without a linker of our own. glibc cannot dlopen from memory, so the image is
// put in a file first, and glibc's dlopen hands back an already-loaded object when the
// path names one or the file has its device and inode. Each load therefore gets a file
// that neither a later load nor another process can alias while the module lives: an
// anonymous memfd opened through /proc/self/fd/N, whose descriptor (and so its number and
// inode) is held until dlclose; or, where memfd or /proc is unavailable, a file under a
// per-load counter name in a private directory, removed only after dlclose. A file
// unlinked right after dlopen frees its name and inode for reuse by a later temporary,
// and dlopen may then hand back the earlier module in place of the new one.
//
// No shell is involved: arguments go straight to posix_spawnp, so neither the source path
// nor $CXX can inject commands. $CXX is split on whitespace (as make does), so
// CXX="ccache g++" works.
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "jit/compiler.h"

extern char** environ;

namespace kiln::jit {
namespace {

// The flags mirror the LLVM compiler's (see compiler_llvm.cpp): host ISA, no FMA
// contraction (results then match the reference evaluator and the other compiler more
// closely), no errno from math functions (so sqrt and friends vectorize). -fopenmp-simd
// honours the `omp simd reduction` pragma of reduction loops (printer_cpp.cpp, reduce_loop),
// GCC's way to let one loop reorder its float accumulator; it links no OpenMP runtime.
const std::vector<std::string> kFlags = {
    "-std=c++17",    "-O3",   "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fwrapv",
    "-fopenmp-simd", "-fPIC", "-shared"};

std::string temp_root() {
  const char* dir = std::getenv("TMPDIR");
  return dir && *dir ? dir : "/tmp";
}

std::string errno_text() { return std::strerror(errno); }

// A private directory (mode 0700 from mkdtemp), removed with its files on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = temp_root() + "/kiln-cc-XXXXXX";
    if (!mkdtemp(pattern.data()))
      throw CompileError("[jit] cannot create a temporary directory under " + temp_root() + ": " +
                         errno_text());
    path_ = pattern;
  }
  ~TempDir() {
    for (const auto& f : files_) ::unlink(f.c_str());
    ::rmdir(path_.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// Path of `name` inside the directory; the file is removed with the directory.
  std::string file(const std::string& name) {
    files_.push_back(path_ + "/" + name);
    return files_.back();
  }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const void* data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw CompileError("[jit] cannot write " + path + ": " + errno_text());
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t w = ::write(fd, p, size);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      std::string why = errno_text();
      ::close(fd);
      throw CompileError("[jit] cannot write " + path + ": " + why);
    }
    p += w;
    size -= static_cast<size_t>(w);
  }
  if (::close(fd) != 0) throw CompileError("[jit] cannot write " + path + ": " + errno_text());
}

std::vector<std::string> compiler_command() {
  std::vector<std::string> words;
  const char* cxx = std::getenv("CXX");
  std::istringstream in(cxx && *cxx ? cxx : "c++");
  for (std::string w; in >> w;) words.push_back(w);
  if (words.empty()) words.push_back("c++");
  return words;
}

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

// The compiler's environment: ours, with the C locale so that diagnostics are plain ASCII
// (GCC quotes with U+2018/U+2019 under UTF-8 locales) and read the same on every machine.
std::vector<std::string> compiler_environment() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry = *e;
    if (entry.rfind("LC_", 0) == 0 || entry.rfind("LANG=", 0) == 0 ||
        entry.rfind("LANGUAGE=", 0) == 0)
      continue;
    env.push_back(std::move(entry));
  }
  env.push_back("LC_ALL=C");
  return env;
}

// Runs argv with stdin from /dev/null and stdout+stderr into `log_path`. Returns the exit
// status (128+signal when killed); throws CompileError when the program cannot be started.
int run_process(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::vector<std::string> env_strings = compiler_environment();
  std::vector<char*> env;
  for (const auto& e : env_strings) env.push_back(const_cast<char*>(e.c_str()));
  env.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    throw CompileError("[jit] cannot run the C++ compiler '" + argv[0] + "': " + std::strerror(rc) +
                       " (set CXX to a C++ compiler)");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw CompileError("[jit] waitpid failed: " + errno_text());
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 255;
}

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t pos = 0; (pos = text.find(from, pos)) != std::string::npos; pos += to.size())
    text.replace(pos, from.size(), to);
}

// glibc trusts the file it maps: a segment reaching past the end of the file is mapped
// anyway, and touching it kills the process with SIGBUS. So before dlopen the image must
// be a shared object for this machine whose headers and loadable segments lie inside it.
// This catches damage (truncation, a zeroed header), not malice: code in a well-formed
// object runs when it is loaded (docs/kernel-cache.md, threat model).
std::optional<std::string> shared_object_problem(const std::vector<uint8_t>& image) {
  Elf64_Ehdr eh;
  if (image.size() < sizeof eh) return "truncated: " + std::to_string(image.size()) + " bytes";
  std::memcpy(&eh, image.data(), sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return std::string("not an ELF file");
#if defined(__x86_64__)
  constexpr unsigned kMachine = EM_X86_64;
#elif defined(__aarch64__)
  constexpr unsigned kMachine = EM_AARCH64;
#else
  constexpr unsigned kMachine = EM_NONE;  // no machine check on other hosts
#endif
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_type != ET_DYN ||
      (kMachine != EM_NONE && eh.e_machine != kMachine))
    return std::string("not a 64-bit shared object for this machine");
  const uint64_t size = image.size();
  auto inside = [size](uint64_t offset, uint64_t count, uint64_t each) {
    return offset <= size && (each == 0 || count <= (size - offset) / each);
  };
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || !inside(eh.e_phoff, eh.e_phnum, sizeof(Elf64_Phdr)))
    return std::string("program headers lie outside the image");
  if (eh.e_shoff != 0 && !inside(eh.e_shoff, eh.e_shnum, eh.e_shentsize))
    return std::string("section headers lie outside the image");
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, image.data() + eh.e_phoff + i * sizeof ph, sizeof ph);
    if (ph.p_type != PT_NULL && !inside(ph.p_offset, ph.p_filesz, 1))
      return "segment " + std::to_string(i) + " lies outside the image";
  }
  return std::nullopt;
}

// Where a loaded image's file is: a memfd (fd >= 0, path = /proc/self/fd/N) or a file in a
// private directory (fd < 0). Released only after dlclose.
struct ImageFile {
  int fd = -1;
  std::string path;
  std::string dir;  // the private directory of a plain file, removed with it
};

class SharedObjectModule final : public LoadedModule {
 public:
  SharedObjectModule(void* handle, ImageFile file) : handle_(handle), file_(std::move(file)) {}
  ~SharedObjectModule() override {
    ::dlclose(handle_);
    if (file_.fd >= 0) {
      // An object that stays loaded after dlclose (glibc keeps some, e.g. those with unique
      // symbols) keeps its name registered; closing the descriptor would free the number
      // for a later memfd of another image, which dlopen would then resolve to this one.
      void* still = ::dlopen(file_.path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
      if (still) {
        ::dlclose(still);
        return;  // the descriptor stays open for the life of the process
      }
      ::dlerror();  // NOLOAD's "not loaded" is no error of anyone's
      ::close(file_.fd);
    } else {
      // Plain files have counter names never reused in this process, and the mapping of a
      // still-loaded object keeps its inode alive: removing the file is always safe here.
      ::unlink(file_.path.c_str());
      ::rmdir(file_.dir.c_str());
    }
  }
  void* symbol(const std::string& name) override {
    void* address = ::dlsym(handle_, name.c_str());
    if (!address)
      throw CompileError("[jit] symbol '" + name + "' not found in the loaded kernel module");
    return address;
  }

 private:
  void* handle_;
  ImageFile file_;
};

bool write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t w = ::write(fd, p, size);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    size -= static_cast<size_t>(w);
  }
  return true;
}

std::string dlopen_error() {
  const char* e = ::dlerror();
  return e ? e : "unknown dlopen error";
}

// dlopen through an anonymous memory file. Returns the handle, or nullptr when the memfd
// cannot be made, written or loaded.
void* load_through_memfd(const std::vector<uint8_t>& image, ImageFile& file) {
  int fd = ::memfd_create("kiln-kernel", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  if (!write_all(fd, image.data(), image.size())) {
    ::close(fd);
    return nullptr;
  }
  file.fd = fd;
  file.path = "/proc/self/fd/" + std::to_string(fd);
  void* handle = ::dlopen(file.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    ::dlerror();  // clear it: the file path's error is the one reported
    ::close(fd);
    file = {};
  }
  return handle;
}

// dlopen through a file of a private directory. Throws CompileError when it fails.
void* load_through_file(const std::vector<uint8_t>& image, ImageFile& file) {
  static std::atomic<uint64_t> counter{0};
  std::string dir = temp_root() + "/kiln-mod-XXXXXX";
  if (!::mkdtemp(dir.data()))
    throw CompileError("[jit] cannot create a temporary directory under " + temp_root() + ": " +
                       errno_text());
  const std::string path = dir + "/kernel-" + std::to_string(counter.fetch_add(1)) + ".so";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0700);
  bool ok = fd >= 0 && write_all(fd, image.data(), image.size());
  std::string why = ok ? "" : errno_text();
  if (fd >= 0 && ::close(fd) != 0 && ok) {
    ok = false;
    why = errno_text();
  }
  void* handle = nullptr;
  if (ok) {
    handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) why = "cannot load kernel image: " + dlopen_error();
  } else {
    why = "cannot write " + path + ": " + why;
  }
  if (!handle) {
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());
    throw CompileError("[jit] " + why);
  }
  file = {-1, path, dir};
  return handle;
}

class ExternalCompiler final : public CpuCompiler {
 public:
  ExternalCompiler() : command_(compiler_command()) {
    // Version first line, e.g. "c++ (Debian 12.2.0-14) 12.2.0". A compiler that cannot be
    // started still gets an identity; compile() reports the real problem.
    std::string version = "unknown version";
    try {
      TempDir dir;
      std::string log = dir.file("version.txt");
      auto argv = command_;
      argv.push_back("--version");
      if (run_process(argv, log) == 0) {
        std::string text = read_text(log);
        std::string first = text.substr(0, text.find('\n'));
        if (!first.empty()) version = first;
      }
    } catch (const Error&) {
    }
    identity_ = join(command_) + " [" + version + "] " + join(kFlags);
  }

  std::string name() const override { return "external"; }
  std::string identity() const override { return identity_; }

  std::vector<uint8_t> compile(const std::string& source,
                               const std::string& source_path_hint) override {
    // Each compile has its own directory, so concurrent compiles need no lock.
    TempDir dir;
    std::string src = dir.file("kernel.cpp");
    std::string out = dir.file("kernel.so");
    std::string log = dir.file("log.txt");
    write_file(src, source.data(), source.size());
    auto argv = command_;
    argv.insert(argv.end(), kFlags.begin(), kFlags.end());
    argv.insert(argv.end(), {"-o", out, src});
    int status = run_process(argv, log);
    if (status != 0) {
      std::string text = read_text(log);
      // The log names our temporary file; name the saved copy the user can open instead.
      replace_all(text, src, source_path_hint.empty() ? "kernel.cpp" : source_path_hint);
      throw CompileError("[jit] external C++ compiler failed (exit " + std::to_string(status) +
                         ") on kernel source " + source_path_hint + "\ncommand: " + join(argv) +
                         "\n" + text);
    }
    std::string bytes = read_text(out);
    if (bytes.empty())
      throw CompileError("[jit] external C++ compiler produced no output for " + source_path_hint);
    return {bytes.begin(), bytes.end()};
  }

  std::unique_ptr<LoadedModule> load(const std::vector<uint8_t>& image) override {
    if (image.empty()) throw CompileError("[jit] cannot load an empty kernel image");
    if (auto bad = shared_object_problem(image))
      throw CompileError("[jit] cannot load kernel image: " + *bad);
    ImageFile file;
    void* handle = load_through_memfd(image, file);
    // A bad image fails both ways; the file's error is the one reported (it names no
    // /proc path). A memfd refused by the system (no memfd, no /proc, memfd_noexec) is
    // why the file exists at all.
    if (!handle) handle = load_through_file(image, file);
    return std::make_unique<SharedObjectModule>(handle, std::move(file));
  }

 private:
  std::vector<std::string> command_;
  std::string identity_;
};

}  // namespace

namespace detail {
std::unique_ptr<CpuCompiler> make_external_compiler() {
  return std::make_unique<ExternalCompiler>();
}
}  // namespace detail

}  // namespace kiln::jit
