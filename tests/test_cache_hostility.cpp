// The kernel cache under hostile or shared use (issue 23, section 3): whatever a writer of
// the cache directory plants there — damaged or crafted entries, symlinks, FIFOs, huge
// sparse files, files of its own under kiln-like names — a kiln process never hangs, never
// follows a link or writes outside the directory, never removes what it did not write, and
// never keeps failing: a bad entry is discarded with one warning and recompiled. Also: a
// read-only directory, a full disk, and the size cap across 8 concurrent processes.
// Every test uses its own directories and its own KernelCache, never the global one.
#include <fcntl.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/error.h"
#include "jit/compiler.h"
#include "jit/hash.h"
#include "jit/kernel_cache.h"
#include "tests/cache_test_support.h"

extern char** environ;

namespace fs = std::filesystem;
using namespace kiln;
using namespace kiln::jit;
using namespace kiln::cache_test;
using Json = nlohmann::json;

namespace {

// ---- entries as a cache writer could write them ----
//
// The layout of docs/kernel-cache.md, implemented again here: a writer of the directory
// can produce entries with valid checksums around any content, so these tests do too.

uint64_t le64(const std::string& b, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

struct EntryParts {
  Json meta;
  std::string source, object;
};

EntryParts split_entry(const std::string& bytes) {
  REQUIRE(bytes.size() >= 64);
  const uint64_t m = le64(bytes, 16), s = le64(bytes, 24), o = le64(bytes, 32);
  REQUIRE(bytes.size() == 64 + m + s + o);
  return {Json::parse(bytes.substr(64, m)), bytes.substr(64 + m, s), bytes.substr(64 + m + s, o)};
}

// A well-formed entry: lengths, object_bytes and checksum agree with the content.
std::string join_entry(EntryParts p) {
  p.meta["object_bytes"] = p.object.size();
  const std::string meta = p.meta.dump();
  const std::string payload = meta + p.source + p.object;
  const Hash128 sum = hash128(payload);
  std::string out = "KILNKC01";
  put_le(out, 1, 4);
  put_le(out, 64, 4);
  put_le(out, meta.size(), 8);
  put_le(out, p.source.size(), 8);
  put_le(out, p.object.size(), 8);
  put_le(out, sum.lo, 8);
  put_le(out, sum.hi, 8);
  put_le(out, 0, 8);
  return out + payload;
}

// The key a kiln with this compiler identity would give `source` on a CPU with `target`.
std::string key_of(const std::string& source, const std::string& identity,
                   const std::string& target) {
  return HashInput().add(uint64_t{1}).add(source).add(identity).add(target).finish().hex();
}

// The entry `compiler` writes for `source` (compiled in a scratch cache).
std::string entry_bytes(const std::string& source, CpuCompiler& compiler,
                        const char* entry = kEntry) {
  TempDir scratch;
  {
    KernelCache cache(scratch.cache(), 0);
    cache.get(source, entry, {"add"}, compiler);
  }
  return read_bytes(scratch.cache() + "/" + KernelCache::key_for(source, compiler) + ".kk");
}

// The CPU compilers of this build, each wrapped to count compiles.
std::vector<std::pair<std::string, std::unique_ptr<CpuCompiler>>> compilers() {
  std::vector<std::pair<std::string, std::unique_ptr<CpuCompiler>>> out;
  for (const char* name : {"llvm", "external"})
    if (auto c = make_cpu_compiler(name)) out.emplace_back(name, std::move(c));
  return out;
}

// Files of a directory that kiln writes (regular .kk and .meta), with their total size.
size_t kiln_bytes(const std::string& dir, size_t* entries = nullptr) {
  size_t total = 0, n = 0;
  for (auto& p : fs::directory_iterator(dir)) {
    const std::string ext = p.path().extension().string();
    if (!p.is_regular_file() || p.is_symlink() || (ext != ".kk" && ext != ".meta")) continue;
    total += fs::file_size(p.path());
    if (ext == ".kk") n++;
  }
  if (entries) *entries = n;
  return total;
}

bool has_temporaries(const std::string& dir) {
  for (auto& p : fs::directory_iterator(dir))
    if (p.path().filename().string().rfind(".tmp-kiln-", 0) == 0) return true;
  return false;
}

// Bytes this process has read through read(2) and friends so far.
uint64_t bytes_read_by_process() {
  std::ifstream in("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value)
    if (key == "rchar:") return value;
  return 0;
}

// A small tmpfs mounted over `dir` for the life of the object (root only). Tests that need
// one skip with a visible message when it cannot be mounted.
class TmpfsMount {
 public:
  TmpfsMount(const std::string& dir, const std::string& size)
      : dir_(dir), options_("size=" + size) {
    fs::create_directories(dir);
    if (::geteuid() != 0) {
      why_ = "not running as root";
      return;
    }
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options_.c_str()) != 0) {
      why_ = std::string("mount -t tmpfs failed: ") + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~TmpfsMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }
  /// Makes the mount read-only, for root too (EROFS).
  bool remount_read_only() {
    return ::mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, options_.c_str()) == 0;
  }

 private:
  std::string dir_, options_, why_;
  bool mounted_ = false;
};

// Runs this test binary's hidden case `name` with `env` added; output into `log`.
pid_t spawn_child(const std::string& name, const std::vector<std::string>& env,
                  const std::string& log) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.push_back(*e);
  env_strings.insert(env_strings.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string arg0 = self, arg1 = name;
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, self.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(rc == 0);
  return pid;
}

// One get() of kernel_source(add) in a fresh cache over `dir`: the result is right, the
// kernel was compiled (not loaded), and stderr had exactly `warnings` lines, each a
// warning containing `why`. Then a second cache over `dir` loads what the first stored.
void expect_recompiled(const std::string& dir, const std::string& scratch, int add,
                       const std::string& why, CpuCompiler* base = nullptr, size_t warnings = 1) {
  CountingCompiler compiler(0, "", base);
  {
    KernelCache cache(dir, 0);
    StderrCapture capture(scratch);
    KernelHandle h = cache.get(kernel_source(add), kEntry, {"add"}, compiler);
    std::string err = capture.finish();
    INFO(err);
    CHECK(run(h, 2) == 6 + add);
    CHECK(compiler.compiles == 1);
    CHECK(count(err, "\n") == warnings);
    CHECK(count(err, "kiln: warning: discarding corrupt kernel cache entry ") == warnings);
    CHECK(err.find(why) != std::string::npos);
  }
  CountingCompiler later(0, "", base);
  KernelCache cache(dir, 0);
  StderrCapture capture(scratch);
  CHECK(run(cache.get(kernel_source(add), kEntry, {"add"}, later), 2) == 6 + add);
  std::string err = capture.finish();
  INFO(err);
  CHECK(later.compiles == 0);
  CHECK(cache.stats().disk_hits == 1);
  CHECK(err.empty());
}

}  // namespace

TEST_CASE("cache hostility: bit flips and truncation of every byte of an entry's header",
          "[cache]") {
  const int add = 200;
  CountingCompiler seed;
  const std::string pristine = entry_bytes(kernel_source(add), seed);
  const std::string key = KernelCache::key_for(kernel_source(add), seed);
  REQUIRE(pristine.size() > 64);

  std::vector<std::pair<std::string, std::string>> variants;
  // Every header byte, then a sample of the metadata, source and object.
  for (size_t at = 0; at < pristine.size(); at += at < 64 ? 1 : 97) {
    std::string b = pristine;
    b[at] = static_cast<char>(b[at] ^ (1 << (at % 8)));
    variants.emplace_back("bit flip at byte " + std::to_string(at), b);
  }
  for (size_t len :
       {size_t{0}, size_t{1}, size_t{63}, size_t{64}, pristine.size() / 2, pristine.size() - 1})
    variants.emplace_back("truncated to " + std::to_string(len), pristine.substr(0, len));
  variants.emplace_back("one byte appended", pristine + "x");

  for (const auto& [name, bytes] : variants) {
    DYNAMIC_SECTION(name) {
      TempDir tmp;
      fs::create_directories(tmp.cache());
      write_bytes(tmp.cache() + "/" + key + ".kk", bytes);
      expect_recompiled(tmp.cache(), tmp.root(), add, "kernel cache entry");
    }
  }
}

TEST_CASE("cache hostility: a damaged .meta or lock file costs statistics, never the entry",
          "[cache]") {
  const int add = 201;
  TempDir tmp;
  CountingCompiler compiler;
  const std::string key = KernelCache::key_for(kernel_source(add), compiler);
  {
    KernelCache cache(tmp.cache(), size_t{1} << 30);
    KernelHandle h = cache.get(kernel_source(add), kEntry, {"add"}, compiler);
    h.record->launches += 5;
  }
  const std::string meta_path = tmp.cache() + "/" + key + ".meta";
  const std::string lock_path = tmp.cache() + "/.kiln-lock";
  const std::string meta = read_bytes(meta_path), lock = read_bytes(lock_path);
  REQUIRE(!meta.empty());
  REQUIRE(lock.rfind("kiln-lock 1 ", 0) == 0);

  std::vector<std::pair<std::string, std::string>> metas, locks;
  for (size_t at = 0; at < meta.size(); at += 7) {
    std::string b = meta;
    b[at] = static_cast<char>(b[at] ^ 0x41);
    metas.emplace_back("meta byte " + std::to_string(at), b);
  }
  metas.emplace_back("meta truncated", meta.substr(0, meta.size() / 2));
  metas.emplace_back("meta empty", "");
  for (size_t at = 0; at < lock.size(); ++at) {
    std::string b = lock;
    b[at] = static_cast<char>(b[at] ^ 0x11);
    locks.emplace_back("lock byte " + std::to_string(at), b);
  }
  locks.emplace_back("lock truncated", lock.substr(0, 5));
  locks.emplace_back("lock claims a full cache", "kiln-lock 1 99999999999 0\n");
  locks.emplace_back("lock claims an empty cache", "kiln-lock 1 0 0\n");

  for (const auto& [name, bytes] : metas) {
    DYNAMIC_SECTION(name) {
      write_bytes(meta_path, bytes);
      CountingCompiler later;
      KernelCache cache(tmp.cache(), 0);
      StderrCapture capture(tmp.root());
      KernelHandle h = cache.get(kernel_source(add), kEntry, {"add"}, later);
      std::string err = capture.finish();
      CHECK(err.empty());
      CHECK(run(h, 1) == 3 + add);
      CHECK(later.compiles == 0);
      CHECK(cache.stats().disk_hits == 1);
      // The flush writes a well-formed .meta again.
      cache.flush();
      CHECK(Json::parse(read_bytes(meta_path)).at("key") == key);
    }
  }
  for (const auto& [name, bytes] : locks) {
    DYNAMIC_SECTION(name) {
      write_bytes(lock_path, bytes);
      // A cap of about two entries: three stores must still evict, whatever the lock said.
      const size_t entry = fs::file_size(tmp.cache() + "/" + key + ".kk");
      CountingCompiler later;
      KernelCache cache(tmp.cache(), entry * 5 / 2);
      StderrCapture capture(tmp.root());
      for (int a : {210, 211, 212, 213})
        CHECK(run(cache.get(kernel_source(a), kEntry, {"add"}, later), 1) == 3 + a);
      std::string err = capture.finish();
      CHECK(err.empty());
      CHECK(kiln_bytes(tmp.cache()) <= entry * 5 / 2);
      CHECK(read_bytes(lock_path).rfind("kiln-lock 1 ", 0) == 0);
    }
  }
}

TEST_CASE(
    "cache hostility: an entry that passes its checksum but does not load is discarded "
    "once and recompiled, and verify reports it",
    "[cache]") {
  for (auto& [compiler_name, base] : compilers()) {
    const int add = 220;
    const std::string source = kernel_source(add);
    const std::string key = KernelCache::key_for(source, *base);
    CountingCompiler seed(0, "", base.get());
    const EntryParts pristine = split_entry(entry_bytes(source, seed));
    // Objects a writer could swap in: another kernel's (no kiln_cache_test in it), one
    // whose code calls a function no library defines (ORC links it only at lookup).
    const std::string other_object =
        split_entry(entry_bytes("extern \"C\" long long other_kernel(long long x) { return x; }\n",
                                seed, "other_kernel"))
            .object;
    const std::string unresolved_source =
        "extern \"C\" long long kiln_no_such_function(long long);\n"
        "extern \"C\" long long kiln_cache_test(long long x) { return kiln_no_such_function(x); "
        "}\n";
    const std::vector<uint8_t> unresolved_object =
        base->compile(unresolved_source, "unresolved.cpp");

    struct Sabotage {
      const char* name;
      std::function<std::string(std::string)> object;
    };
    const std::vector<Sabotage> sabotages = {
        {"zeroed ELF header",
         [](std::string o) {
           std::fill_n(o.begin(), std::min<size_t>(64, o.size()), '\0');
           return o;
         }},
        {"another kernel's object", [&](std::string) { return other_object; }},
        {"object with an unresolvable call",
         [&](std::string) {
           return std::string(unresolved_object.begin(), unresolved_object.end());
         }},
        {"object cut in half", [](std::string o) { return o.substr(0, o.size() / 2); }},
    };
    for (const Sabotage& s : sabotages) {
      DYNAMIC_SECTION(compiler_name << ": " << s.name) {
        EntryParts bad = pristine;
        bad.object = s.object(bad.object);
        const std::string bytes = join_entry(bad);

        TempDir verify_dir;
        fs::create_directories(verify_dir.cache());
        write_bytes(verify_dir.cache() + "/" + key + ".kk", bytes);
        {
          KernelCache cache(verify_dir.cache(), 0);
          VerifyReport report = cache.verify({base.get()});
          REQUIRE(report.problems.size() == 1);
          CHECK(report.ok == 0);
          CHECK(report.problems[0].key == key);
          CHECK(report.problems[0].removed);
          CHECK(report.problems[0].reason.find("object does not load") != std::string::npos);
          CHECK(report.problems[0].reason.find('\n') == std::string::npos);
          CHECK_FALSE(fs::exists(verify_dir.cache() + "/" + key + ".kk"));
        }

        TempDir tmp;
        fs::create_directories(tmp.cache());
        write_bytes(tmp.cache() + "/" + key + ".kk", bytes);
        expect_recompiled(tmp.cache(), tmp.root(), add, "object does not load", base.get());
        // The replacement is a good entry: verify loads it.
        KernelCache cache(tmp.cache(), 0);
        VerifyReport report = cache.verify({base.get()});
        CHECK(report.ok == 1);
        CHECK(report.load_checked == 1);
        CHECK(report.problems.empty());
      }
    }
  }
}

TEST_CASE("cache hostility: an entry for another CPU is never loaded", "[cache]") {
  const int add = 230;
  const std::string source = kernel_source(add);
  CountingCompiler compiler;
  REQUIRE(key_of(source, compiler.identity(), host_cpu_features()) ==
          KernelCache::key_for(source, compiler));
  EntryParts foreign = split_entry(entry_bytes(source, compiler));
  const std::string other_cpu = "kiln-test-cpu +kiln-test-feature";
  foreign.meta["target"] = other_cpu;
  const std::string foreign_key = key_of(source, compiler.identity(), other_cpu);
  foreign.meta["key"] = foreign_key;
  const std::string bytes = join_entry(foreign);
  const std::string our_key = KernelCache::key_for(source, compiler);
  compiler.compiles = 0;

  SECTION("under its own key: listed and verified, not loaded, not used") {
    TempDir tmp;
    fs::create_directories(tmp.cache());
    write_bytes(tmp.cache() + "/" + foreign_key + ".kk", bytes);
    KernelCache cache(tmp.cache(), 0);
    CHECK(run(cache.get(source, kEntry, {"add"}, compiler), 1) == 3 + add);
    CHECK(compiler.compiles == 1);
    compiler.loads = 0;
    VerifyReport report = cache.verify({&compiler});
    CHECK(report.ok == 2);
    CHECK(report.load_checked == 1);  // ours only
    CHECK(compiler.loads == 1);
    CHECK(cache.disk_records().size() == 2);
  }
  SECTION("renamed to this CPU's key: rejected") {
    TempDir tmp;
    fs::create_directories(tmp.cache());
    write_bytes(tmp.cache() + "/" + our_key + ".kk", bytes);
    expect_recompiled(tmp.cache(), tmp.root(), add, "entry belongs to key " + foreign_key);
  }
  SECTION("its metadata claiming this CPU's key: rejected by the recomputed key") {
    foreign.meta["key"] = our_key;
    TempDir tmp;
    fs::create_directories(tmp.cache());
    write_bytes(tmp.cache() + "/" + our_key + ".kk", join_entry(foreign));
    expect_recompiled(tmp.cache(), tmp.root(), add, "key does not match");
  }
}

TEST_CASE("cache hostility: planted symlinks are never followed", "[cache]") {
  const int add = 240;
  TempDir tmp;
  CountingCompiler compiler;
  const std::string key = KernelCache::key_for(kernel_source(add), compiler);
  const std::string dir = tmp.cache();
  fs::create_directories(dir);
  // Outside files a writer points kiln at: a valid entry (so following the link would
  // "work"), and files whose truncation or rewrite would hurt.
  const std::string outside_entry = tmp.root() + "/outside.kk";
  const std::string victim = tmp.root() + "/victim.txt";
  write_bytes(outside_entry, entry_bytes(kernel_source(add), compiler));
  write_bytes(victim, "precious\n");
  const std::string entry_before = read_bytes(outside_entry);
  fs::create_symlink(outside_entry, dir + "/" + key + ".kk");
  fs::create_symlink(victim, dir + "/" + key + ".meta");
  fs::create_symlink(victim, dir + "/.kiln-lock");
  const std::string other_key = KernelCache::key_for(kernel_source(add + 1), compiler);
  fs::create_symlink(victim, dir + "/" + other_key + ".kk");

  compiler.compiles = 0;
  {
    KernelCache cache(dir, size_t{1} << 30);  // a cap: the store takes the lock
    StderrCapture capture(tmp.root());
    KernelHandle h = cache.get(kernel_source(add), kEntry, {"add"}, compiler);
    std::string err = capture.finish();
    INFO(err);
    CHECK(run(h, 1) == 3 + add);
    CHECK(compiler.compiles == 1);  // the link was not followed to the valid entry
    CHECK(count(err, "\n") == 1);
    CHECK(err.find("not a regular file (symlink)") != std::string::npos);
    h.record->launches++;
  }  // flush writes .meta

  CHECK(read_bytes(outside_entry) == entry_before);
  CHECK(read_bytes(victim) == "precious\n");
  // The store and the flush replaced the links with files of their own.
  CHECK_FALSE(fs::is_symlink(dir + "/" + key + ".kk"));
  CHECK_FALSE(fs::is_symlink(dir + "/" + key + ".meta"));
  CHECK(fs::is_symlink(dir + "/.kiln-lock"));

  KernelCache cache(dir, 0);
  VerifyReport report = cache.verify({&compiler});
  CHECK(report.ok == 1);
  REQUIRE(report.problems.size() == 1);
  CHECK(report.problems[0].key == other_key);
  CHECK_FALSE(report.problems[0].removed);  // kiln removes only regular files
  CHECK(report.problems[0].reason.find("symlink") != std::string::npos);
  CHECK(cache.disk_records().size() == 1);
  CHECK_THROWS_AS(cache.show(other_key), ValueError);
  CHECK(cache.clear() == 1);
  CHECK(fs::is_symlink(dir + "/" + other_key + ".kk"));
  CHECK(read_bytes(victim) == "precious\n");
  CHECK(fs::exists(victim));
}

TEST_CASE("cache hostility: FIFOs under kiln's names never block", "[cache]") {
  const int add = 250;
  TempDir tmp;
  CountingCompiler compiler;
  const std::string dir = tmp.cache();
  fs::create_directories(dir);
  const std::string key = KernelCache::key_for(kernel_source(add), compiler);
  const std::string other_key = KernelCache::key_for(kernel_source(add + 1), compiler);
  for (const std::string& name :
       {key + ".kk", other_key + ".kk", other_key + ".meta", std::string(".kiln-lock")})
    REQUIRE(::mkfifo((dir + "/" + name).c_str(), 0644) == 0);

  // Run in another thread: if kiln opened a FIFO for reading it would block until a writer
  // came, and this thread plays that writer after the deadline so the test ends either way.
  StderrCapture capture(tmp.root());
  auto work = std::async(std::launch::async, [&] {
    KernelCache cache(dir, size_t{1} << 30);
    long long a = run(cache.get(kernel_source(add), kEntry, {"add"}, compiler), 1);
    long long b = run(cache.get(kernel_source(add + 1), kEntry, {"add"}, compiler), 1);
    size_t listed = cache.disk_records().size();
    VerifyReport report = cache.verify({&compiler});
    (void)cache.stats();
    cache.clear();
    return std::make_tuple(a, b, listed, report);
  });
  const bool finished = work.wait_for(std::chrono::seconds(120)) == std::future_status::ready;
  if (!finished) {
    for (const std::string& name : {key + ".kk", other_key + ".kk", other_key + ".meta"}) {
      int fd = ::open((dir + "/" + name).c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
    }
  }
  auto [a, b, listed, report] = work.get();
  std::string err = capture.finish();
  INFO(err);
  REQUIRE(finished);
  CHECK(a == 3 + add);
  CHECK(b == 4 + add);
  CHECK(count(err, "not a regular file (fifo)") == 2);
  CHECK(listed == 2);
  CHECK(report.ok == 2);
  // Stores replaced the entry FIFOs; the .meta FIFO and the lock FIFO stay: not kiln's to remove.
  CHECK(fs::is_regular_file(dir + "/" + key + ".kk") == false);  // cleared
  CHECK(fs::is_fifo(dir + "/.kiln-lock"));
}

TEST_CASE("cache hostility: a huge sparse entry is refused without being read", "[cache]") {
  const int add = 260;
  TempDir tmp;
  CountingCompiler compiler;
  const std::string dir = tmp.cache();
  fs::create_directories(dir);
  const std::string key = KernelCache::key_for(kernel_source(add), compiler);
  const uint64_t huge = uint64_t{3} << 30;
  for (const std::string& name : {key + ".kk", key + ".meta"}) {
    int fd = ::open((dir + "/" + name).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(huge)) == 0);
    ::close(fd);
  }
  const uint64_t read_before = bytes_read_by_process();
  {
    KernelCache cache(dir, 0);
    StderrCapture capture(tmp.root());
    KernelHandle h = cache.get(kernel_source(add), kEntry, {"add"}, compiler);
    CHECK(cache.disk_records().empty() == false);
    std::string err = capture.finish();
    INFO(err);
    CHECK(run(h, 1) == 3 + add);
    CHECK(count(err, "\n") == 1);
    CHECK(err.find("more than the") != std::string::npos);
  }
  // Far less than the 3 GiB: compiles and the test's own files are all that was read.
  CHECK(bytes_read_by_process() - read_before < (uint64_t{64} << 20));
  CHECK(fs::file_size(dir + "/" + key + ".kk") < huge);  // replaced by the recompiled entry

  // verify removes a huge regular entry from the written directory, unread.
  const std::string other = KernelCache::key_for(kernel_source(add + 1), compiler);
  int fd = ::open((dir + "/" + other + ".kk").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(huge)) == 0);
  ::close(fd);
  const uint64_t before_verify = bytes_read_by_process();
  KernelCache cache(dir, 0);
  VerifyReport report = cache.verify({&compiler});
  CHECK(bytes_read_by_process() - before_verify < (uint64_t{64} << 20));
  CHECK(report.ok == 1);
  REQUIRE(report.problems.size() == 1);
  CHECK(report.problems[0].removed);
  CHECK_FALSE(fs::exists(dir + "/" + other + ".kk"));
}

TEST_CASE("cache hostility: verify and clear touch only files kiln wrote", "[cache]") {
  TempDir tmp;
  CountingCompiler compiler;
  const std::string dir = tmp.cache();
  {
    KernelCache cache(dir, 0);
    cache.get(kernel_source(270), kEntry, {"add"}, compiler);
  }
  const std::string key = KernelCache::key_for(kernel_source(270), compiler);
  const std::vector<std::string> foreign = {"my.kk",
                                            "photo.meta",
                                            ".tmp-foo",
                                            ".tmp-12-abc",
                                            ".tmp-kiln-1-xyz",
                                            "README",
                                            std::string(31, 'a') + ".kk",
                                            std::string(32, 'A') + ".kk",
                                            key + ".kk.bak",
                                            ".tmp-kiln-12-0123456789abcdeg",
                                            ".kiln-lock.old"};
  for (const std::string& name : foreign) write_bytes(dir + "/" + name, "user data " + name);
  fs::create_directories(dir + "/" + std::string(32, 'b') + ".kk");  // a directory
  // A dead writer's temporary (two hours old) is kiln's; a fresh one may be a live write.
  const std::string dead = dir + "/.tmp-kiln-12345-0123456789abcdef";
  const std::string live = dir + "/.tmp-kiln-12345-fedcba9876543210";
  write_bytes(dead, "partial");
  write_bytes(live, "partial");
  const auto old_time = fs::file_time_type::clock::now() - std::chrono::hours(2);
  fs::last_write_time(dead, old_time);
  write_bytes(dir + "/" + std::string(32, 'c') + ".meta", "{}");  // orphan metadata

  KernelCache cache(dir, 0);
  VerifyReport report = cache.verify({&compiler});
  CHECK(report.ok == 1);
  CHECK(report.load_checked == 1);
  CHECK(report.stray_files_removed == 2);  // the dead temporary and the orphan .meta
  for (const VerifyProblem& p : report.problems) CHECK(p.key == std::string(32, 'b'));
  CHECK_FALSE(fs::exists(dead));
  CHECK(fs::exists(live));
  for (const std::string& name : foreign)
    CHECK(read_bytes(dir + "/" + name) == "user data " + name);

  CHECK(cache.clear() == 1);
  CHECK_FALSE(fs::exists(dir + "/" + key + ".kk"));
  CHECK(fs::exists(live));
  CHECK(fs::is_directory(dir + "/" + std::string(32, 'b') + ".kk"));
  for (const std::string& name : foreign)
    CHECK(read_bytes(dir + "/" + name) == "user data " + name);
}

TEST_CASE(
    "cache hostility: a read-only cache is read, new kernels go to memory or a second "
    "directory",
    "[cache]") {
  TempDir tmp;
  const std::string ro = tmp.root() + "/baked";
  TmpfsMount mount(ro, "4m");
  if (!mount.mounted()) {
    WARN("skipped: the read-only cache test needs a tmpfs it can remount read-only (" +
         mount.why() + ")");
    return;
  }
  CountingCompiler compiler;
  const std::string bad_key = KernelCache::key_for(kernel_source(282), compiler);
  {
    KernelCache bake(ro, 0);
    for (int add : {280, 281, 282}) bake.get(kernel_source(add), kEntry, {"add"}, compiler);
  }
  std::string damaged = read_bytes(ro + "/" + bad_key + ".kk");
  damaged[damaged.size() - 2] ^= 1;
  write_bytes(ro + "/" + bad_key + ".kk", damaged);
  REQUIRE(mount.remount_read_only());
  REQUIRE(::access(ro.c_str(), W_OK) != 0);  // EROFS, root included
  REQUIRE(errno == EROFS);

  SECTION("alone: one warning, entries loaded, new kernels kept in memory") {
    CountingCompiler c;
    StderrCapture capture(tmp.root());
    KernelCache cache(ro, 0);
    CHECK(run(cache.get(kernel_source(280), kEntry, {"add"}, c), 1) == 283);
    CHECK(run(cache.get(kernel_source(283), kEntry, {"add"}, c), 1) == 286);
    CHECK(run(cache.get(kernel_source(282), kEntry, {"add"}, c), 1) == 285);
    cache.flush();
    std::string err = capture.finish();
    INFO(err);
    CHECK(c.compiles == 2);  // 283 (new) and 282 (damaged)
    CHECK(cache.stats().disk_hits == 1);
    CHECK_FALSE(cache.disk_enabled());
    CHECK(cache.read_only_directories() == std::vector<std::string>{ro});
    CHECK(count(err, "\n") == 2);
    CHECK(count(err, "is not writable") == 1);
    CHECK(count(err, "discarding corrupt kernel cache entry") == 1);
    CHECK(err.find("cannot write") == std::string::npos);
    VerifyReport report = cache.verify({&c});
    CHECK(report.ok == 2);
    REQUIRE(report.problems.size() == 1);
    CHECK_FALSE(report.problems[0].removed);
    CHECK(cache.clear() == 0);
    CHECK(entry_files(ro).size() == 3);
  }
  SECTION("ro:rw: no warning for the layer, new and repaired kernels written to rw") {
    const std::string rw = tmp.root() + "/rw";
    for (int round = 0; round < 2; ++round) {
      CountingCompiler c;
      StderrCapture capture(tmp.root());
      KernelCache cache(ro + ":" + rw, size_t{1} << 30);
      for (int add : {280, 281, 282, 283})
        CHECK(run(cache.get(kernel_source(add), kEntry, {"add"}, c), 1) == 3 + add);
      cache.flush();
      std::string err = capture.finish();
      INFO("round " << round << ": " << err);
      CHECK(cache.disk_enabled());
      CHECK(cache.directory() == rw);
      CHECK(cache.read_only_directories() == std::vector<std::string>{ro});
      if (round == 0) {
        CHECK(c.compiles == 2);
        CHECK(count(err, "\n") == 1);
        CHECK(count(err, "discarding corrupt kernel cache entry " + ro) == 1);
      } else {  // the repaired entry is found in rw first
        CHECK(c.compiles == 0);
        CHECK(err.empty());
      }
    }
    CHECK(entry_files(rw).size() == 2);
    KernelCache cache(ro + ":" + rw, 0);
    CHECK(cache.disk_records().size() == 4);
    VerifyReport report = cache.verify({&compiler});
    CHECK(report.ok == 4);
    REQUIRE(report.problems.size() == 1);
    CHECK(report.problems[0].path == ro + "/" + bad_key + ".kk");
    CHECK_FALSE(report.problems[0].removed);
    CHECK(cache.clear() == 2);
    CHECK(entry_files(ro).size() == 3);
  }
  SECTION("ro:off: the layer is read, nothing is written, no warning") {
    CountingCompiler c;
    StderrCapture capture(tmp.root());
    KernelCache cache(ro + ":off", 0);
    CHECK(run(cache.get(kernel_source(281), kEntry, {"add"}, c), 1) == 284);
    CHECK(run(cache.get(kernel_source(284), kEntry, {"add"}, c), 1) == 287);
    std::string err = capture.finish();
    CHECK(err.empty());
    CHECK(c.compiles == 1);
    CHECK(cache.directory().empty());
    CHECK_FALSE(cache.disk_enabled());
  }
}

TEST_CASE("cache hostility: a full disk keeps kernels in memory with one warning", "[cache]") {
  TempDir tmp;
  const std::string dir = tmp.root() + "/small";
  TmpfsMount mount(dir, "32k");
  if (!mount.mounted()) {
    WARN("skipped: the full-disk test needs a small tmpfs (" + mount.why() + ")");
    return;
  }
  CountingCompiler compiler;
  StderrCapture capture(tmp.root());
  KernelCache cache(dir, 0);
  REQUIRE(cache.disk_enabled());
  for (int add = 300; add < 340; ++add)
    CHECK(run(cache.get(kernel_source(add), kEntry, {"add"}, compiler), 2) == 6 + add);
  cache.flush();
  std::string err = capture.finish();
  INFO(err);
  CHECK(cache.stats().disk_errors > 0);  // the disk did fill up
  CHECK(count(err, "\n") == 1);
  CHECK(count(err, "kiln: warning: cannot write kernel cache entry") == 1);
  CHECK(err.find("No space left on device") != std::string::npos);
  CHECK_FALSE(has_temporaries(dir));
  // What did fit is intact and loads.
  size_t stored = entry_files(dir).size();
  CHECK(stored > 0);
  CHECK(stored < 40);
  KernelCache later(dir, 0);
  VerifyReport report = later.verify({&compiler});
  CHECK(report.ok == stored);
  CHECK(report.problems.empty());
}

// The body of one child process of the next test. Hidden ("[.]"): runs only when named.
TEST_CASE("cache hostility: size cap child process", "[.][cache_cap_child]") {
  const char* dir = std::getenv("KILN_TEST_CAP_DIR");
  const char* id_text = std::getenv("KILN_TEST_CAP_ID");
  if (!dir || !id_text) return;
  const int id = std::atoi(id_text);
  CountingCompiler compiler;
  KernelCache cache(dir, size_t{1} << 20);
  // 4 KB of comment makes each entry about 5 KB: 8 processes x 40 kernels write ~1.7 MB.
  const std::string padding = "// " + std::string(4000, 'p') + "\n";
  for (int k = 0; k < 40; ++k) {
    const int add = 1000 + 100 * id + k;
    REQUIRE(run(cache.get(padding + kernel_source(add), kEntry, {"add"}, compiler), 1) == 3 + add);
  }
}

TEST_CASE("cache hostility: KILN_CACHE_MAX_MB holds across 8 concurrent processes", "[cache]") {
  TempDir tmp;
  const size_t cap = size_t{1} << 20;
  std::vector<pid_t> children;
  std::vector<std::string> logs;
  for (int id = 0; id < 8; ++id) {
    logs.push_back(tmp.root() + "/child" + std::to_string(id) + ".log");
    children.push_back(
        spawn_child("cache hostility: size cap child process",
                    {"KILN_TEST_CAP_DIR=" + tmp.cache(), "KILN_TEST_CAP_ID=" + std::to_string(id)},
                    logs.back()));
  }
  expect_children_clean(children, logs);
  size_t entries = 0;
  const size_t total = kiln_bytes(tmp.cache(), &entries);
  INFO("8 processes x 40 kernels under a 1 MiB cap left " << total << " bytes in " << entries
                                                          << " entries");
  CHECK(total <= cap);
  CHECK(entries < 8 * 40);  // the cap did evict
  // Evictions stop at 90% of the cap; processes that evict at once sort the same entries
  // oldest first, so together they stay near that mark too. Checked in bytes: how many
  // entries fit depends on the size of each object, which differs between builds (one TSan
  // run kept 50 entries of 20 KB where a release build keeps about 160 of 6.5 KB).
  CHECK(total > cap / 2);
  CHECK_FALSE(has_temporaries(tmp.cache()));
  KernelCache cache(tmp.cache(), 0);
  VerifyReport report = cache.verify();
  CHECK(report.ok == entries);
  CHECK(report.problems.empty());
}

TEST_CASE("cache hostility: each external-compiler load is its own module", "[cache]") {
  auto external = make_cpu_compiler("external");
  REQUIRE(external);
  TempDir tmp;
  const std::string tmpdir = tmp.root() + "/tmpdir";
  fs::create_directories(tmpdir);
  const char* saved = std::getenv("TMPDIR");
  const std::string saved_value = saved ? saved : "";
  ::setenv("TMPDIR", tmpdir.c_str(), 1);
  // The second source has an inline function's static, which g++ makes a unique global
  // symbol: glibc then keeps the object loaded after dlclose, and a later load must still
  // not be handed that object in place of its own.
  const std::vector<uint8_t> a = external->compile(kernel_source(1), "a.cpp");
  const std::vector<uint8_t> sticky = external->compile(
      "inline long long& kiln_unique() { static long long c = 0; return c; }\n"
      "extern \"C\" long long kiln_cache_test(long long x) { return x * 3 + 2 + kiln_unique(); }\n",
      "sticky.cpp");
  const std::vector<uint8_t> c = external->compile(kernel_source(3), "c.cpp");
  auto call = [](LoadedModule& m, long long x) {
    return reinterpret_cast<KernelFn>(m.symbol(kEntry))(x);
  };
  {
    std::vector<std::unique_ptr<LoadedModule>> kept;
    for (int round = 0; round < 12; ++round) {
      auto ma = external->load(a);
      auto ms = external->load(sticky);
      CHECK(call(*ma, 1) == 4);
      CHECK(call(*ms, 1) == 5);
      ms.reset();  // stays mapped (unique symbol); its name must not be reused
      auto mc = external->load(c);
      CHECK(call(*mc, 1) == 6);
      CHECK(call(*ma, 1) == 4);
      // Two loads of one image are two modules: dropping one leaves the other working.
      auto ma2 = external->load(a);
      ma.reset();
      CHECK(call(*ma2, 1) == 4);
      if (round % 3 == 0) kept.push_back(std::move(mc));
    }
    for (auto& m : kept) CHECK(call(*m, 1) == 6);
    std::vector<uint8_t> broken = a;
    std::fill(broken.begin(), broken.begin() + 64, uint8_t{0});
    CHECK_THROWS_AS(external->load(broken), CompileError);
  }
  std::vector<std::string> left;
  for (auto& p : fs::directory_iterator(tmpdir)) left.push_back(p.path().string());
  if (saved)
    ::setenv("TMPDIR", saved_value.c_str(), 1);
  else
    ::unsetenv("TMPDIR");
  CHECK(left.empty());
}

TEST_CASE("cache hostility: kiln cache verify loads objects and leaves what is not kiln's",
          "[cache]") {
  TempDir tmp;
  const std::string dir = tmp.cache();
  CountingCompiler compiler;
  const std::string bad_key = KernelCache::key_for(kernel_source(401), compiler);
  {
    KernelCache cache(dir, 0);
    cache.get(kernel_source(400), kEntry, {"add"}, compiler);
  }
  EntryParts bad = split_entry(entry_bytes(kernel_source(401), compiler));
  std::fill_n(bad.object.begin(), std::min<size_t>(64, bad.object.size()), '\0');
  write_bytes(dir + "/" + bad_key + ".kk", join_entry(bad));
  write_bytes(dir + "/my.kk", "mine");
  const std::string fifo_key(32, 'f');
  REQUIRE(::mkfifo((dir + "/" + fifo_key + ".kk").c_str(), 0644) == 0);

  auto verify = [&](const std::string& args, std::string& out) {
    const std::string command = "'" + std::string(KILN_CLI_PATH) + "' --cache-dir '" + dir +
                                "' cache verify " + args + " 2>'" + tmp.root() + "/cli-stderr.txt'";
    FILE* f = ::popen(command.c_str(), "r");
    REQUIRE(f != nullptr);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    int status = ::pclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  std::string out;
  int status = verify("", out);
  INFO(out << read_bytes(tmp.root() + "/cli-stderr.txt"));
  CHECK(status == 1);
  CHECK(out.find("removed " + bad_key + ": object does not load") != std::string::npos);
  CHECK(out.find("bad " + dir + "/" + fifo_key +
                 ".kk: not a regular file (fifo) (left in place)") != std::string::npos);
  CHECK(out.find("1 entry ok, 1 removed, 1 bad left in place (1 of the good objects loaded and "
                 "checked)") != std::string::npos);
  CHECK_FALSE(fs::exists(dir + "/" + bad_key + ".kk"));
  CHECK(read_bytes(dir + "/my.kk") == "mine");
  CHECK(fs::is_fifo(dir + "/" + fifo_key + ".kk"));

  std::string json_out;
  CHECK(verify("--json", json_out) == 1);
  Json j = Json::parse(json_out);
  CHECK(j.at("ok") == 1);
  CHECK(j.at("load_checked") == 1);
  CHECK(j.at("removed").empty());
  REQUIRE(j.at("bad_left_in_place").size() == 1);
  CHECK(j.at("bad_left_in_place")[0].at("key") == fifo_key);
}

TEST_CASE("cache hostility: hard links under kiln's names are never written through", "[cache]") {
  TempDir tmp;
  const std::string dir = tmp.cache();
  fs::create_directories(dir);
  CountingCompiler compiler;
  const std::string key = KernelCache::key_for(kernel_source(410), compiler);
  const std::string victim = tmp.root() + "/victim.txt";
  write_bytes(victim, "precious\n");
  // The lock file is the one file kiln opens for writing by its final name; entries and
  // .meta are replaced by rename, which never writes into the file a name links to.
  for (const std::string& name : {std::string(".kiln-lock"), key + ".kk", key + ".meta"})
    REQUIRE(::link(victim.c_str(), (dir + "/" + name).c_str()) == 0);
  {
    KernelCache cache(dir, size_t{1} << 30);
    StderrCapture capture(tmp.root());
    KernelHandle h = cache.get(kernel_source(410), kEntry, {"add"}, compiler);
    cache.get(kernel_source(411), kEntry, {"add"}, compiler);
    std::string err = capture.finish();
    INFO(err);
    CHECK(run(h, 1) == 413);
    CHECK(count(err, "\n") == 1);  // the linked "entry" is not an entry
    h.record->launches++;
  }
  CHECK(read_bytes(victim) == "precious\n");
  CHECK(fs::hard_link_count(victim) == 2);  // only the lock's link is left
}

namespace {

// The process's compiler, with a hook run inside the first load() (which then fails, as a
// link error would) and a note, at each compile(), of what is on disk under `watched`.
class HookedCompiler final : public CpuCompiler {
 public:
  std::function<void()> first_load;
  std::string watched;
  std::vector<ino_t> inode_at_compile;  // 0 = no file

  std::string name() const override { return cpu_compiler().name(); }
  std::string identity() const override { return cpu_compiler().identity(); }
  std::vector<uint8_t> compile(const std::string& source, const std::string& hint) override {
    struct stat st {};
    inode_at_compile.push_back(::lstat(watched.c_str(), &st) == 0 ? st.st_ino : 0);
    return cpu_compiler().compile(source, hint);
  }
  std::unique_ptr<LoadedModule> load(const std::vector<uint8_t>& image) override {
    if (first_load) {
      auto hook = std::move(first_load);
      first_load = nullptr;
      hook();
      throw CompileError("[jit] simulated link failure");
    }
    return cpu_compiler().load(image);
  }
};

}  // namespace

TEST_CASE("cache hostility: a discarded entry is removed only if it is still the file read",
          "[cache]") {
  const int add = 420;
  CountingCompiler seed;
  const std::string good = entry_bytes(kernel_source(add), seed);
  const std::string key = KernelCache::key_for(kernel_source(add), seed);
  for (bool replaced : {false, true}) {
    DYNAMIC_SECTION((replaced ? "replaced by a concurrent writer" : "unchanged")) {
      TempDir tmp;
      const std::string dir = tmp.cache();
      fs::create_directories(dir);
      const std::string path = dir + "/" + key + ".kk";
      write_bytes(path, good);
      ino_t fresh = 0;
      HookedCompiler compiler;
      compiler.watched = path;
      compiler.first_load = [&] {
        if (!replaced) return;
        // Another process stores a fresh entry while this one is failing to load the old.
        write_bytes(dir + "/fresh", good);
        fs::rename(dir + "/fresh", path);
        struct stat st {};
        REQUIRE(::lstat(path.c_str(), &st) == 0);
        fresh = st.st_ino;
      };
      KernelCache cache(dir, 0);
      StderrCapture capture(tmp.root());
      KernelHandle h = cache.get(kernel_source(add), kEntry, {"add"}, compiler);
      std::string err = capture.finish();
      INFO(err);
      CHECK(run(h, 1) == 3 + add);
      CHECK(count(err, "object does not load: [jit] simulated link failure") == 1);
      REQUIRE(compiler.inode_at_compile.size() == 1);
      if (replaced) {
        CHECK(compiler.inode_at_compile[0] == fresh);  // the fresh entry survived the discard
      } else {
        CHECK(compiler.inode_at_compile[0] == 0);  // the bad one was removed
      }
    }
  }
}
