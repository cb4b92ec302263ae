#pragma once
// The command-line parser every program kiln ships shares (examples and benchmarks; the
// `kiln` tool has its own sub-command cli). Declared flags only: `--help` / `-h` prints the
// usage on stdout and exits 0, an unknown flag or a malformed value names the flag on
// stderr with the usage and exits 2, so a typo never silently runs the default workload.
// Depends on nothing but the standard library, so benchmarks can include it too.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace example {

/// A bad command line (unknown flag, missing or malformed value); programs exit 2 on it.
class UsageError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// `--name value` (or `--name=value`) flags declared with a default and a description.
class Flags {
 public:
  Flags(std::string program, std::string summary)
      : program_(std::move(program)), summary_(std::move(summary)) {}

  /// Declares a flag with its default ("" reads as "none" in the usage) and a description.
  void add(const std::string& name, const std::string& fallback, const std::string& help) {
    values_[name] = fallback;
    defaults_[name] = fallback;
    order_.push_back({name, help});
  }
  /// Adds a paragraph after the options (environment variables, examples).
  void note(const std::string& text) { notes_ += "\n" + text + "\n"; }

  /// Parses argv. Returns false when the program should exit now with *exit_code: 0 after
  /// --help (usage on stdout), 2 after a usage error (message and usage on stderr).
  bool parse(int argc, char** argv, int* exit_code) {
    try {
      for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--help" || arg == "-h") {
          usage(std::cout);
          *exit_code = 0;
          return false;
        }
        if (arg.rfind("--", 0) != 0 || arg.size() == 2)
          throw UsageError("unexpected argument '" + arg + "' (options start with --)");
        std::string name = arg.substr(2), value;
        const size_t eq = name.find('=');
        const bool inline_value = eq != std::string::npos;
        if (inline_value) {
          value = name.substr(eq + 1);
          name = name.substr(0, eq);
        }
        if (!values_.count(name)) throw UsageError("unknown option --" + name);
        if (!inline_value) {
          if (i + 1 >= argc) throw UsageError("missing value for --" + name);
          value = argv[++i];
        }
        values_[name] = value;
      }
    } catch (const UsageError& e) {
      fail(e.what());
      *exit_code = 2;
      return false;
    }
    return true;
  }

  /// Parses the command line and calls `run(*this)`: usage errors (also from the typed
  /// getters) exit 2; any other error, kiln::Error included (a bad KILN_* variable, a
  /// missing file), prints "program: error: ..." and exits 1.
  template <typename Run>
  int main(int argc, char** argv, Run&& run) {
    int code = 0;
    if (!parse(argc, argv, &code)) return code;
    try {
      return run(*this);
    } catch (const UsageError& e) {
      fail(e.what());
      return 2;
    } catch (const std::exception& e) {
      std::fflush(stdout);  // what the program printed comes first in a log of both streams
      std::fprintf(stderr, "%s: error: %s\n", program_.c_str(), e.what());
      return 1;
    }
  }

  /// The flag's text.
  std::string str(const std::string& name) const { return values_.at(name); }
  /// The flag as a whole number; UsageError naming the flag otherwise.
  int64_t integer(const std::string& name) const {
    const std::string& v = values_.at(name);
    errno = 0;
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno == ERANGE)
      throw UsageError("--" + name + " expects a whole number, got '" + v + "'");
    return n;
  }
  /// The flag as a real number; UsageError naming the flag otherwise.
  double real(const std::string& name) const {
    const std::string& v = values_.at(name);
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0')
      throw UsageError("--" + name + " expects a number, got '" + v + "'");
    return x;
  }
  const std::string& program() const { return program_; }

 private:
  void fail(const std::string& message) const {
    std::cerr << program_ << ": " << message << "\n";
    usage(std::cerr);
  }
  void usage(std::ostream& os) const {
    os << "usage: " << program_ << " [options]\n" << summary_ << "\n\noptions:\n";
    for (const auto& [name, help] : order_) {
      // The declared default, not a value parsed before the usage was printed.
      const std::string& v = defaults_.at(name);
      os << "  --" << name << " (default: " << (v.empty() ? "none" : v) << ")\n      " << help
         << "\n";
    }
    os << "  --help\n      print this text and exit\n" << notes_;
  }
  std::string program_, summary_, notes_;
  std::map<std::string, std::string> defaults_;
  std::map<std::string, std::string> values_;
  std::vector<std::pair<std::string, std::string>> order_;
};

}  // namespace example
