// Kernel cache: memory and disk levels, recovery from damaged entries, the size cap,
// inspection (verify/show/clear), and sharing between threads and processes.
// Every test uses its own temporary directory and its own KernelCache, never the global one.
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

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

TEST_CASE("hash128 is MurmurHash3 x64-128 and field framing is unambiguous", "[cache]") {
  Hash128 fox = hash128(std::string_view("The quick brown fox jumps over the lazy dog"));
  CHECK(fox.lo == 0xe34bbc7bbc071b6cULL);
  CHECK(fox.hi == 0x7a433ca9c49a9347ULL);
  CHECK(fox.hex() == "e34bbc7bbc071b6c7a433ca9c49a9347");
  // SMHasher's verification value: hashes of {}, {0}, {0,1}, ... with seeds 256-i.
  unsigned char key[256];
  std::vector<unsigned char> all(256 * 16);
  for (int i = 0; i < 256; ++i) {
    key[i] = static_cast<unsigned char>(i);
    Hash128 h = hash128(key, static_cast<size_t>(i), static_cast<uint64_t>(256 - i));
    for (int b = 0; b < 8; ++b) {
      all[i * 16 + b] = static_cast<unsigned char>(h.lo >> (8 * b));
      all[i * 16 + 8 + b] = static_cast<unsigned char>(h.hi >> (8 * b));
    }
  }
  CHECK((hash128(all.data(), all.size()).lo & 0xffffffffu) == 0x6384ba69u);
  CHECK(HashInput().add("ab").add("c").finish() != HashInput().add("a").add("bc").finish());
}

TEST_CASE("kernel cache: compile once, then memory hits", "[cache]") {
  TempDir tmp;
  CountingCompiler compiler;
  KernelCache cache(tmp.cache(), 0);
  REQUIRE(cache.disk_enabled());

  KernelHandle a = cache.get(kernel_source(1), kEntry, {"mul", "add"}, compiler);
  CHECK(run(a, 5) == 16);
  KernelHandle b = cache.get(kernel_source(1), kEntry, {"mul", "add"}, compiler);
  CHECK(b.fn == a.fn);
  CHECK(b.record == a.record);

  CacheStats s = cache.stats();
  CHECK(s.kernels_compiled == 1);
  CHECK(s.memory_hits == 1);
  CHECK(s.disk_hits == 0);
  CHECK(s.compile_ms_total > 0);
  CHECK(s.disk_enabled);
  CHECK(s.directory == tmp.cache());
  CHECK(s.disk_bytes > 0);
  CHECK(compiler.compiles == 1);

  const std::string key = KernelCache::key_for(kernel_source(1), compiler);
  CHECK(key.size() == 32);
  CHECK(a.record->key == key);
  CHECK(a.record->name == kEntry);
  CHECK(a.record->source_ops == std::vector<std::string>{"mul", "add"});
  CHECK(a.record->compiler == compiler.identity());
  CHECK(a.record->target == host_cpu_features());
  CHECK(a.record->hits == 1);
  CHECK(fs::exists(tmp.cache() + "/" + key + ".kk"));
  REQUIRE(cache.loaded_records().size() == 1);
  CHECK(cache.loaded_records()[0].key == key);

  // The key follows the compiler identity: another compiler version never reuses it.
  CountingCompiler other(0, " (other version)");
  CHECK(KernelCache::key_for(kernel_source(1), other) != key);
}

TEST_CASE("kernel cache: a second process hits the disk and compiles nothing", "[cache]") {
  TempDir tmp;
  const std::string source = kernel_source(2);
  {
    CountingCompiler compiler;
    KernelCache first(tmp.cache(), 0);
    KernelHandle h = first.get(source, kEntry, {"mul", "add"}, compiler);
    CHECK(run(h, 1) == 5);
    h.record->launches += 3;
    h.record->run_ms_total += 1.5;
  }  // destructor flushes metadata
  CountingCompiler compiler;
  KernelCache second(tmp.cache(), 0);
  KernelHandle h = second.get(source, kEntry, {"ignored"}, compiler);
  CHECK(run(h, 10) == 32);
  CacheStats s = second.stats();
  CHECK(s.kernels_compiled == 0);
  CHECK(s.disk_hits == 1);
  CHECK(s.memory_hits == 0);
  CHECK(compiler.compiles == 0);
  // Metadata comes from disk, not from this request.
  CHECK(h.record->source_ops == std::vector<std::string>{"mul", "add"});
  CHECK(h.record->launches == 3);
  CHECK(h.record->hits == 1);
  CHECK(h.record->compile_ms > 0);

  h.record->launches += 2;
  second.flush();
  std::vector<KernelRecord> disk = second.disk_records();
  REQUIRE(disk.size() == 1);
  CHECK(disk[0].key == h.record->key);
  CHECK(disk[0].hits == 1);
  CHECK(disk[0].launches == 5);
  CHECK(disk[0].run_ms_total == Approx(1.5));
  CHECK(disk[0].object_bytes > 0);
  CHECK(disk[0].last_used_unix >= disk[0].created_unix);
}

TEST_CASE("kernel cache: damaged entries are discarded with one warning and recompiled",
          "[cache]") {
  TempDir seed_dir;
  const std::string source = kernel_source(3);
  std::string key, pristine, other_entry;
  {
    CountingCompiler compiler;
    KernelCache seed(seed_dir.cache(), 0);
    seed.get(source, kEntry, {"add"}, compiler);
    seed.get(kernel_source(33), kEntry, {"add"}, compiler);
    key = KernelCache::key_for(source, compiler);
    pristine = read_bytes(seed_dir.cache() + "/" + key + ".kk");
    other_entry = read_bytes(seed_dir.cache() + "/" +
                             KernelCache::key_for(kernel_source(33), compiler) + ".kk");
  }
  REQUIRE(pristine.size() > 64);

  struct Damage {
    const char* name;
    const char* why;  // expected part of the warning
    std::function<std::string(std::string)> apply;
  };
  const std::vector<Damage> damages = {
      {"flipped bytes in the middle", "checksum mismatch",
       [](std::string b) {
         for (size_t i = b.size() / 2; i < b.size() / 2 + 8; ++i)
           b[i] = static_cast<char>(b[i] ^ 0x5a);
         return b;
       }},
      {"truncated to half", "truncated", [](std::string b) { return b.substr(0, b.size() / 2); }},
      {"truncated inside the header", "truncated", [](std::string b) { return b.substr(0, 10); }},
      {"empty file", "truncated", [](std::string) { return std::string(); }},
      {"wrong magic", "bad magic",
       [](std::string b) {
         b[0] = 'X';
         return b;
       }},
      {"stale format version", "stale format version 99",
       [](std::string b) {
         b[8] = 99;
         return b;
       }},
      {"foreign entry under this key", "entry belongs to key",
       [&](std::string) { return other_entry; }},
  };

  for (const Damage& d : damages) {
    DYNAMIC_SECTION(d.name) {
      TempDir tmp;
      fs::create_directories(tmp.cache());
      const std::string path = tmp.cache() + "/" + key + ".kk";
      write_bytes(path, d.apply(pristine));

      CountingCompiler compiler;
      KernelCache cache(tmp.cache(), 0);
      StderrCapture capture(tmp.root());
      KernelHandle h = cache.get(source, kEntry, {"add"}, compiler);
      std::string err = capture.finish();
      CHECK(run(h, 2) == 9);
      CHECK(compiler.compiles == 1);
      CacheStats s = cache.stats();
      CHECK(s.kernels_compiled == 1);
      CHECK(s.disk_errors == 1);
      CHECK(s.disk_hits == 0);
      INFO(err);
      CHECK(count(err, "\n") == 1);
      CHECK(count(err, "kiln: warning: discarding corrupt kernel cache entry " + path + ": ") == 1);
      CHECK(err.find(d.why) != std::string::npos);

      // The recompiled entry replaced the bad one: the next process loads it.
      CountingCompiler later_compiler;
      KernelCache later(tmp.cache(), 0);
      CHECK(run(later.get(source, kEntry, {"add"}, later_compiler), 2) == 9);
      CHECK(later.stats().disk_hits == 1);
      CHECK(later_compiler.compiles == 0);
    }
  }
}

TEST_CASE("kernel cache: an unusable directory falls back to memory with one warning", "[cache]") {
  TempDir tmp;
  std::vector<std::string> dirs;
  // A directory below a regular file can never be created, even by root.
  write_bytes(tmp.root() + "/plainfile", "x");
  dirs.push_back(tmp.root() + "/plainfile/sub");
  // Permission bits stop everyone but root.
  if (::geteuid() != 0) {
    fs::create_directories(tmp.root() + "/readonly");
    fs::permissions(tmp.root() + "/readonly", fs::perms(0555));
    dirs.push_back(tmp.root() + "/readonly");
  }
  for (const std::string& dir : dirs) {
    DYNAMIC_SECTION(dir) {
      CountingCompiler compiler;
      StderrCapture capture(tmp.root());
      KernelCache cache(dir, 0);
      KernelHandle a = cache.get(kernel_source(4), kEntry, {"add"}, compiler);
      KernelHandle b = cache.get(kernel_source(4), kEntry, {"add"}, compiler);
      std::string err = capture.finish();
      INFO(err);
      CHECK(run(a, 1) == 7);
      CHECK(a.fn == b.fn);
      CHECK_FALSE(cache.disk_enabled());
      CacheStats s = cache.stats();
      CHECK_FALSE(s.disk_enabled);
      CHECK(s.kernels_compiled == 1);
      CHECK(s.memory_hits == 1);
      CHECK(count(err, "kiln: warning:") == 1);
      CHECK(count(err, "\n") == 1);
      CHECK(err.find(dir) != std::string::npos);
      CHECK(cache.disk_records().empty());
      CHECK(cache.verify().ok == 0);
    }
  }
}

TEST_CASE("kernel cache: memory-only cache with an empty directory", "[cache]") {
  CountingCompiler compiler;
  KernelCache cache("", 0);
  CHECK_FALSE(cache.disk_enabled());
  CHECK(run(cache.get(kernel_source(5), kEntry, {}, compiler), 0) == 5);
  CHECK(cache.stats().kernels_compiled == 1);
  CHECK(cache.clear() == 0);
}

TEST_CASE("kernel cache: the size cap evicts the least recently used entry", "[cache]") {
  TempDir probe;
  size_t entry_bytes = 0;
  {
    CountingCompiler compiler;
    KernelCache cache(probe.cache(), 0);
    cache.get(kernel_source(60), kEntry, {"add"}, compiler);
    entry_bytes = cache.stats().disk_bytes;
  }
  REQUIRE(entry_bytes > 0);

  TempDir tmp;
  CountingCompiler compiler;
  // Room for two entries of this size (they differ by a few bytes), not three. The cap
  // counts 256 bytes for each entry's .meta before it is written, and evicts down to 90%.
  const size_t cap = (entry_bytes + 256) * 5 / 2;
  KernelCache cache(tmp.cache(), cap);
  auto key = [&](int add) { return KernelCache::key_for(kernel_source(add), compiler) + ".kk"; };
  auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); };

  cache.get(kernel_source(61), kEntry, {"add"}, compiler);
  pause();
  cache.get(kernel_source(62), kEntry, {"add"}, compiler);
  pause();
  cache.get(kernel_source(61), kEntry, {"add"}, compiler);  // 61 is now more recent than 62
  pause();
  cache.get(kernel_source(63), kEntry, {"add"}, compiler);

  std::vector<std::string> expected = {key(61), key(63)};
  std::sort(expected.begin(), expected.end());
  CHECK(entry_files(tmp.cache()) == expected);
  CacheStats s = cache.stats();
  CHECK(s.evictions == 1);
  CHECK(s.disk_bytes <= cap);
  // An evicted kernel stays loaded in this process.
  CHECK(run(cache.get(kernel_source(62), kEntry, {"add"}, compiler), 1) == 65);
  CHECK(compiler.compiles == 3);
}

TEST_CASE("kernel cache: verify reports and removes bad entries", "[cache]") {
  TempDir tmp;
  CountingCompiler compiler;
  std::vector<std::string> keys;
  {
    KernelCache cache(tmp.cache(), 0);
    for (int add : {70, 71, 72}) {
      cache.get(kernel_source(add), kEntry, {"add"}, compiler);
      keys.push_back(KernelCache::key_for(kernel_source(add), compiler));
    }
  }
  const std::string dir = tmp.cache();
  std::string flipped = read_bytes(dir + "/" + keys[0] + ".kk");
  flipped[flipped.size() - 3] ^= 1;
  write_bytes(dir + "/" + keys[0] + ".kk", flipped);
  std::string cut = read_bytes(dir + "/" + keys[1] + ".kk");
  write_bytes(dir + "/" + keys[1] + ".kk", cut.substr(0, cut.size() - 1));
  write_bytes(dir + "/" + keys[1] + ".meta", "{\"key\": 1}");
  write_bytes(dir + "/0123456789abcdef0123456789abcdef.meta", "{}");  // orphan

  KernelCache cache(dir, 0);
  std::vector<CpuCompiler*> loaders = {&compiler};
  VerifyReport report = cache.verify(loaders);
  CHECK(report.ok == 1);
  CHECK(report.load_checked == 1);
  std::vector<std::string> removed;
  for (const VerifyProblem& p : report.problems) {
    CHECK(p.removed);
    removed.push_back(p.key);
  }
  std::vector<std::string> expected = {keys[0], keys[1]};
  std::sort(expected.begin(), expected.end());
  CHECK(removed == expected);
  CHECK(report.stray_files_removed == 1);
  CHECK(entry_files(dir) == std::vector<std::string>{keys[2] + ".kk"});
  CHECK_FALSE(fs::exists(dir + "/" + keys[1] + ".meta"));
  CHECK_FALSE(fs::exists(dir + "/0123456789abcdef0123456789abcdef.meta"));

  VerifyReport again = cache.verify(loaders);
  CHECK(again.ok == 1);
  CHECK(again.problems.empty());
}

TEST_CASE("kernel cache: show by key prefix, clear", "[cache]") {
  TempDir tmp;
  CountingCompiler compiler;
  KernelCache cache(tmp.cache(), 0);
  KernelHandle h = cache.get(kernel_source(80), kEntry, {"mul", "add"}, compiler);
  cache.get(kernel_source(81), kEntry, {"add"}, compiler);
  const std::string key = h.record->key;

  auto [record, source] = cache.show(key);
  CHECK(record.key == key);
  CHECK(record.source_ops == std::vector<std::string>{"mul", "add"});
  CHECK(source == kernel_source(80));
  CHECK(cache.show(key.substr(0, 8)).second == kernel_source(80));
  CHECK_THROWS_AS(cache.show("zzzz"), ValueError);
  CHECK_THROWS_AS(cache.show(""), ValueError);
  // A second file starting with the same digit makes a one-digit prefix ambiguous.
  std::string twin = key.substr(0, 1) + std::string(31, key[1] == '0' ? '1' : '0');
  fs::copy_file(tmp.cache() + "/" + key + ".kk", tmp.cache() + "/" + twin + ".kk");
  CHECK_THROWS_AS(cache.show(key.substr(0, 1)), ValueError);
  CHECK_THROWS_AS(cache.show(twin), ValueError);  // foreign content under that name
  CHECK(cache.show(key).first.key == key);        // the exact key still resolves

  CHECK(cache.clear() == 3);
  CHECK(entry_files(tmp.cache()).empty());
  CHECK(cache.stats().disk_bytes == 0);
  CHECK(cache.disk_records().empty());
  // Loaded kernels survive a clear: no recompile.
  CHECK(run(cache.get(kernel_source(80), kEntry, {}, compiler), 1) == 83);
  CHECK(compiler.compiles == 2);
}

TEST_CASE("kernel cache: KILN_LOG=debug and KILN_DUMP_KERNELS", "[cache]") {
  TempDir tmp;
  CountingCompiler compiler;
  KernelCache cache(tmp.cache(), 0);
  ::setenv("KILN_LOG", "debug", 1);
  ::setenv("KILN_DUMP_KERNELS", "1", 1);
  StderrCapture capture(tmp.root());
  cache.get(kernel_source(90), kEntry, {"add"}, compiler);
  cache.get(kernel_source(90), kEntry, {"add"}, compiler);
  std::string err = capture.finish();
  ::unsetenv("KILN_LOG");
  ::unsetenv("KILN_DUMP_KERNELS");
  const std::string key = KernelCache::key_for(kernel_source(90), compiler);
  INFO(err);
  CHECK(count(err,
              "kiln: debug: compile " + key + " (kiln_cache_test): not in memory or on disk") == 1);
  CHECK(count(err, kernel_source(90)) == 1);
  CHECK(count(err, "kiln: kernel " + key) == 1);
}

TEST_CASE("kernel cache: a compile error propagates and is retried", "[cache]") {
  TempDir tmp;
  CountingCompiler compiler;
  KernelCache cache(tmp.cache(), 0);
  StderrCapture capture(tmp.root());  // compilers may print diagnostics
  CHECK_THROWS_AS(cache.get("this is not C++", kEntry, {}, compiler), CompileError);
  CHECK_THROWS_AS(cache.get(kernel_source(91), "no_such_symbol", {}, compiler), CompileError);
  capture.finish();
  CHECK(run(cache.get(kernel_source(91), kEntry, {}, compiler), 1) == 94);
  CHECK(cache.stats().kernels_compiled == 1);
}

TEST_CASE("kernel cache: 8 threads asking for one kernel compile it once", "[cache]") {
  TempDir tmp;
  CountingCompiler compiler(200);  // a slow compile so that every thread arrives during it
  // With a cap, the store scans the directory and consults the loaded entries, while an
  // observer thread reads records and statistics: the two must not deadlock.
  KernelCache cache(tmp.cache(), size_t{1} << 30);
  std::vector<void*> fns(8, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  std::atomic<bool> done{false};
  std::thread observer([&] {
    while (!done) {
      (void)cache.loaded_records();
      (void)cache.stats();
    }
  });
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      ready++;
      while (ready < 8) std::this_thread::yield();
      fns[t] = cache.get(kernel_source(100), kEntry, {"add"}, compiler).fn;
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  observer.join();
  CHECK(compiler.compiles == 1);
  CacheStats s = cache.stats();
  CHECK(s.kernels_compiled == 1);
  CHECK(s.memory_hits == 7);
  for (void* fn : fns) {
    CHECK(fn == fns[0]);
    CHECK(reinterpret_cast<KernelFn>(fn)(2) == 106);
  }
}

// The body of one child process of the next test. Hidden ("[.]"): it runs only when named,
// with KILN_TEST_CACHE_CHILD_DIR set.
TEST_CASE("kernel cache child process", "[.][cache_child]") {
  const char* dir = std::getenv("KILN_TEST_CACHE_CHILD_DIR");
  const char* id_text = std::getenv("KILN_TEST_CACHE_CHILD_ID");
  if (!dir || !id_text) return;
  const int id = std::atoi(id_text);
  CountingCompiler compiler;
  KernelCache cache(dir, 0);
  for (int round = 0; round < 2; ++round) {
    for (int add : {110, 111, 112})
      REQUIRE(run(cache.get(kernel_source(add), kEntry, {"add"}, compiler), 7) == 21 + add);
    REQUIRE(run(cache.get(kernel_source(120 + id), kEntry, {"add"}, compiler), 7) == 141 + id);
  }
  REQUIRE(cache.stats().kernels_compiled + cache.stats().disk_hits == 4);
}

TEST_CASE("kernel cache: 4 processes share a fresh directory", "[cache]") {
  TempDir tmp;
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<pid_t> children;
  std::vector<std::string> logs;
  for (int id = 0; id < 4; ++id) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) env_strings.push_back(*e);
    env_strings.push_back("KILN_TEST_CACHE_CHILD_DIR=" + tmp.cache());
    env_strings.push_back("KILN_TEST_CACHE_CHILD_ID=" + std::to_string(id));
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string arg0 = self, arg1 = "kernel cache child process";
    char* argv[] = {arg0.data(), arg1.data(), nullptr};

    logs.push_back(tmp.root() + "/child" + std::to_string(id) + ".log");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, logs.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = 0;
    int rc = posix_spawn(&pid, self.c_str(), &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE(rc == 0);
    children.push_back(pid);
  }
  expect_children_clean(children, logs);

  KernelCache cache(tmp.cache(), 0);
  VerifyReport report = cache.verify();
  CHECK(report.ok == 7);  // 3 shared kernels + 1 per child
  CHECK(report.problems.empty());
  for (auto& p : fs::directory_iterator(tmp.cache()))
    CHECK(p.path().filename().string().rfind(".tmp-", 0) == std::string::npos);
  CountingCompiler compiler;
  for (int add : {110, 111, 112, 120, 121, 122, 123})
    CHECK(run(cache.get(kernel_source(add), kEntry, {"add"}, compiler), 1) == 3 + add);
  CHECK(compiler.compiles == 0);
  CHECK(cache.stats().disk_hits == 7);
}
