#pragma once
// What the training examples share: `--flag value` parsing with defaults and usage text, a
// one-line progress bar, the memory pictures of a training step (--memory-timeline,
// --trace), and the closing report (kernel cache and memory pool).
#include <kiln/kiln.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "memory/host_pool.h"
#include "memory/step_record.h"

namespace example {

/// Parses `--name value` pairs against declared flags; `--help` prints the usage.
class Flags {
 public:
  Flags(std::string program, std::string summary)
      : program_(std::move(program)), summary_(std::move(summary)) {}

  /// Declares a flag with its default and a one-line description.
  void add(const std::string& name, const std::string& fallback, const std::string& help) {
    values_[name] = fallback;
    order_.push_back({name, help});
  }
  /// Returns false (after printing usage or the error) when the program should exit.
  bool parse(int argc, char** argv, int* exit_code) {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        usage(std::cout);
        *exit_code = 0;
        return false;
      }
      std::string name = arg.rfind("--", 0) == 0 ? arg.substr(2) : "";
      if (name.empty() || !values_.count(name) || i + 1 >= argc) {
        std::cerr << program_ << ": "
                  << (name.empty() || !values_.count(name) ? "unknown option "
                                                           : "missing value for ")
                  << arg << "\n";
        usage(std::cerr);
        *exit_code = 2;
        return false;
      }
      values_[name] = argv[++i];
    }
    return true;
  }
  /// Parses the command line and calls `run`; usage errors exit 2, kiln errors (bad data,
  /// a missing file) print "program: error: ..." and exit 1.
  template <typename Run>
  int main(int argc, char** argv, Run&& run) {
    int code = 0;
    if (!parse(argc, argv, &code)) return code;
    try {
      return run(*this);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: error: %s\n", program_.c_str(), e.what());
      return 1;
    }
  }
  std::string str(const std::string& name) const { return values_.at(name); }
  int64_t integer(const std::string& name) const { return std::stoll(values_.at(name)); }
  double real(const std::string& name) const { return std::stod(values_.at(name)); }

 private:
  void usage(std::ostream& os) const {
    os << "usage: " << program_ << " [options]\n" << summary_ << "\n\noptions:\n";
    for (const auto& [name, help] : order_) {
      os << "  --" << name
         << " (default: " << (values_.at(name).empty() ? "none" : values_.at(name)) << ")\n      "
         << help << "\n";
    }
  }
  std::string program_, summary_;
  std::map<std::string, std::string> values_;
  std::vector<std::pair<std::string, std::string>> order_;
};

/// Redraws one terminal line: "label [#####.....] 12/40 text".
inline void progress(const std::string& label, int64_t done, int64_t total,
                     const std::string& text) {
  constexpr int kWidth = 30;
  int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::printf("\r%s [%s] %lld/%lld %s", label.c_str(), bar.c_str(), static_cast<long long>(done),
              static_cast<long long>(total), text.c_str());
  if (done >= total) std::printf("\n");
  std::fflush(stdout);
}

/// Seconds since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Declares --memory-timeline FILE and --trace FILE (both off by default): the last training
/// step's bytes in use as an SVG picture, and its kernels as a Chrome trace.
inline void add_memory_flags(Flags& flags) {
  flags.add("memory-timeline", "",
            "write the last training step's memory timeline (SVG picture) to this file");
  flags.add("trace", "",
            "write the last training step as a Chrome trace (ui.perfetto.dev, chrome://tracing)");
}

/// Turns step recording on when either picture was asked for; call it before training.
inline void begin_memory_recording(const Flags& flags) {
  if (!flags.str("memory-timeline").empty() || !flags.str("trace").empty())
    kiln::memory::set_step_recording(true);
}

/// Writes the pictures asked for from the most recent evaluation; call it right after the
/// last training step, before any evaluation or sampling replaces the record.
inline void write_memory_pictures(const Flags& flags) {
  if (const std::string path = flags.str("memory-timeline"); !path.empty()) {
    kiln::memory::write_memory_timeline(path);
    std::printf("wrote memory timeline to %s\n", path.c_str());
  }
  if (const std::string path = flags.str("trace"); !path.empty()) {
    kiln::memory::write_chrome_trace(path);
    std::printf("wrote Chrome trace to %s (open it in ui.perfetto.dev or chrome://tracing)\n",
                path.c_str());
  }
}

/// The closing report every example prints: what the JIT compiled or reused and what the
/// memory pool holds.
inline void print_runtime_report() {
  kiln::jit::CacheStats s = kiln::jit::cache_stats();
  std::printf("\nkernel cache: %llu compiled (%.0f ms), %llu memory hits, %llu disk hits, %s\n",
              static_cast<unsigned long long>(s.kernels_compiled), s.compile_ms_total,
              static_cast<unsigned long long>(s.memory_hits),
              static_cast<unsigned long long>(s.disk_hits),
              s.disk_enabled ? ("directory " + s.directory).c_str() : "memory only");
  std::printf("\nmemory pool:\n%s\n", kiln::memory::host_pool().report().c_str());
}

}  // namespace example
