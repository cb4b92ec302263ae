#pragma once
// Helpers shared by the kernel cache tests (test_kernel_cache.cpp, test_cache_hostility.cpp):
// a scratch directory, stderr capture, a counting compiler and a tiny kernel.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "jit/compiler.h"
#include "jit/kernel_cache.h"

namespace kiln::cache_test {

namespace fs = std::filesystem;
using namespace kiln::jit;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kiln-cache-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    root_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    for (auto& p : fs::recursive_directory_iterator(root_, ec))
      fs::permissions(p.path(), fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(root_, ec);
  }
  const std::string& root() const { return root_; }
  std::string cache() const { return root_ + "/cache"; }

 private:
  std::string root_;
};

// Redirects file descriptor 2 to a file until finish(), to check warning lines.
class StderrCapture {
 public:
  explicit StderrCapture(const std::string& dir) : path_(dir + "/stderr.txt") {
    std::fflush(stderr);
    int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    saved_ = ::dup(2);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~StderrCapture() { restore(); }
  std::string finish() {
    restore();
    std::ifstream in(path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

inline size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
  return n;
}

// Delegates to a real CPU compiler (the process's, or `base`), counting compiles and loads;
// can slow compiles down to widen races, and can pretend to be another compiler version.
class CountingCompiler final : public CpuCompiler {
 public:
  explicit CountingCompiler(int delay_ms = 0, std::string identity_suffix = "",
                            CpuCompiler* base = nullptr)
      : delay_ms_(delay_ms), suffix_(std::move(identity_suffix)), base_(base) {}
  std::string name() const override { return base().name(); }
  std::string identity() const override { return base().identity() + suffix_; }
  std::vector<uint8_t> compile(const std::string& source, const std::string& hint) override {
    compiles++;
    if (delay_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    return base().compile(source, hint);
  }
  std::unique_ptr<LoadedModule> load(const std::vector<uint8_t>& image) override {
    loads++;
    return base().load(image);
  }
  std::atomic<int> compiles{0};
  std::atomic<int> loads{0};

 private:
  CpuCompiler& base() const { return base_ ? *base_ : cpu_compiler(); }
  int delay_ms_;
  std::string suffix_;
  CpuCompiler* base_;
};

inline const char* const kEntry = "kiln_cache_test";
using KernelFn = long long (*)(long long);

// A tiny self-contained kernel; `add` makes distinct sources (and keys).
inline std::string kernel_source(int add) {
  return "extern \"C\" long long kiln_cache_test(long long x) { return x * 3 + " +
         std::to_string(add) + "; }\n";
}

inline long long run(const KernelHandle& h, long long x) {
  REQUIRE(h.fn != nullptr);
  return reinterpret_cast<KernelFn>(h.fn)(x);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

/// Waits for every child and checks each exited 0 without a kiln warning in its log.
inline void expect_children_clean(const std::vector<pid_t>& children,
                                  const std::vector<std::string>& logs) {
  for (size_t i = 0; i < children.size(); ++i) {
    int status = 0;
    REQUIRE(::waitpid(children[i], &status, 0) == children[i]);
    INFO("child " << i << " log:\n" << read_bytes(logs[i]));
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(read_bytes(logs[i]).find("kiln: warning") == std::string::npos);
  }
}

inline std::vector<std::string> entry_files(const std::string& dir) {
  std::vector<std::string> names;
  for (auto& p : fs::directory_iterator(dir))
    if (p.path().extension() == ".kk") names.push_back(p.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace kiln::cache_test
