// `kiln`: the command-line tool. Parses the command line and dispatches to the commands
// (cache_commands.cpp, info_command.cpp); see docs/cli.md.
//
// Exit status: 0 success, 1 an error (one line `kiln: error: ...`) or, for `cache verify`,
// entries were bad; 2 a command line that does not parse (usage on stderr).
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "core/error.h"
#include "tools/cli.h"

namespace kiln::cli {
namespace {

constexpr const char* kUsage =
    "usage: kiln [--cache-dir DIR] [--json] <command> [arguments]\n"
    "\n"
    "commands:\n"
    "  cache list          kernels in the disk cache, most recently used first\n"
    "  cache show KEY      one kernel's metadata and source (KEY: a unique key prefix)\n"
    "  cache stats         entries, size, cap, directory, total hits and compile time\n"
    "  cache verify        check and load every entry; remove bad ones (exit 1 if any were bad)\n"
    "  cache clear         remove every entry\n"
    "  info                version, compilers, CPU features, threads, cache, devices\n"
    "  plan FILE [BUDGET]  replay the memory planner on a step written by KILN_PLAN_DUMP\n"
    "\n"
    "options (anywhere on the command line):\n"
    "  --json              machine-readable output (one JSON document on stdout)\n"
    "  --cache-dir DIR     use DIR as the kernel cache (overrides KILN_CACHE_DIR)\n"
    "  --help, -h          this help\n"
    "  --version           print the kiln version\n"
    "\n"
    "environment: KILN_CACHE_DIR (default ~/.cache/kiln; 'off' = memory only),\n"
    "KILN_CACHE_MAX_MB, KILN_CPU_COMPILER, KILN_NUM_THREADS\n";

constexpr const char* kCacheUsage =
    "usage: kiln [--cache-dir DIR] [--json] cache <list|show KEY|stats|verify|clear>\n"
    "\n"
    "  list      kernels in the disk cache, most recently used first\n"
    "  show KEY  one kernel's metadata and source (KEY: a unique key prefix)\n"
    "  stats     entries, size, cap, directory, total hits and compile time\n"
    "  verify    check every entry; remove bad ones (exit 1 if any were removed)\n"
    "  clear     remove every entry\n";

constexpr const char* kPlanUsage =
    "usage: kiln [--json] plan FILE [BUDGET...]\n"
    "\n"
    "Replays the memory planner on the step tables FILE (written by KILN_PLAN_DUMP=FILE)\n"
    "in every kernel order: unplanned peak and smallest budget per order, then at each\n"
    "BUDGET the peak, extra work and rebuilds per order, the order kiln would run, and\n"
    "its arena and pool reserve as a CPU step fits them (held within the budget or over).\n"
    "A BUDGET is a size: whole bytes (4096) or a number with a unit, KB MB GB TB (powers\n"
    "of 1000) or KiB MiB GiB TiB (powers of 1024), such as 40MiB or 1.5GiB; or a share of\n"
    "the bytes the step releases (unplanned peak less what it starts with and keeps) on top\n"
    "of those, written as a percentage: 50%releasable. A bare 0.5 is refused (bytes are\n"
    "whole). Without BUDGETs: 50%releasable 33%releasable 20%releasable.\n";

constexpr const char* kInfoUsage =
    "usage: kiln [--json] info\n"
    "\n"
    "Prints the kiln version, the CPU compilers this build has and which one is the\n"
    "default, the host CPU features, the thread count, the cache directory and devices.\n";

struct ParsedLine {
  Invocation inv;
  bool help = false;
  bool version = false;
  const char* cache_dir = nullptr;
};

ParsedLine parse(int argc, char** argv) {
  ParsedLine p;
  bool options_done = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (options_done || arg.empty() || arg[0] != '-' || arg == "-") {
      p.inv.words.push_back(arg);
    } else if (arg == "--") {
      options_done = true;
    } else if (arg == "--json") {
      p.inv.json = true;
    } else if (arg == "--help" || arg == "-h") {
      p.help = true;
    } else if (arg == "--version") {
      p.version = true;
    } else if (arg == "--cache-dir") {
      if (i + 1 >= argc) throw UsageError{"--cache-dir needs a directory"};
      p.cache_dir = argv[++i];
    } else if (arg.rfind("--cache-dir=", 0) == 0) {
      p.cache_dir = argv[i] + std::strlen("--cache-dir=");
    } else {
      throw UsageError{"unknown option '" + arg + "'"};
    }
  }
  return p;
}

// The usage text for the command named so far (for --help and usage errors).
const char* usage_for(const std::vector<std::string>& words) {
  if (!words.empty() && words[0] == "cache") return kCacheUsage;
  if (!words.empty() && words[0] == "info") return kInfoUsage;
  if (!words.empty() && words[0] == "plan") return kPlanUsage;
  return kUsage;
}

// Checks the command words' shape so that commands can index them without checking.
void check_words(const std::vector<std::string>& w) {
  if (w.empty()) throw UsageError{"no command given"};
  if (w[0] == "info") {
    if (w.size() > 1) throw UsageError{"info takes no arguments"};
    return;
  }
  if (w[0] == "plan") {
    if (w.size() < 2) throw UsageError{"plan needs a FILE written by KILN_PLAN_DUMP"};
    return;
  }
  if (w[0] != "cache") throw UsageError{"unknown command '" + w[0] + "'"};
  if (w.size() < 2) throw UsageError{"cache needs a subcommand"};
  const std::string& sub = w[1];
  if (sub == "show") {
    if (w.size() != 3) throw UsageError{"cache show needs exactly one KEY (or key prefix)"};
  } else if (sub == "list" || sub == "stats" || sub == "verify" || sub == "clear") {
    if (w.size() != 2) throw UsageError{"cache " + sub + " takes no arguments"};
  } else {
    throw UsageError{"unknown cache command '" + sub + "'"};
  }
}

int usage_error(const UsageError& e, const std::vector<std::string>& words) {
  std::cerr << "kiln: " << e.message << "\n\n" << usage_for(words);
  return 2;
}

int run(int argc, char** argv) {
  ParsedLine p;
  try {
    p = parse(argc, argv);
  } catch (const UsageError& e) {
    return usage_error(e, {});
  }
  if (p.help) {
    std::cout << usage_for(p.inv.words);
    return 0;
  }
  if (p.version) {
    std::cout << "kiln " << kiln_version() << "\n";
    return 0;
  }
  try {
    check_words(p.inv.words);
  } catch (const UsageError& e) {
    return usage_error(e, p.inv.words);
  }
  // Must precede the first use of kernel_cache(), which reads the variable once.
  if (p.cache_dir) {
    if (!*p.cache_dir) return usage_error(UsageError{"--cache-dir needs a directory"}, p.inv.words);
    ::setenv("KILN_CACHE_DIR", p.cache_dir, 1);
  }
  try {
    if (p.inv.words[0] == "info") return run_info_command(p.inv);
    if (p.inv.words[0] == "plan") return run_plan_command(p.inv);
    return run_cache_command(p.inv);
  } catch (const UsageError& e) {
    return usage_error(e, p.inv.words);
  }
}

}  // namespace

const char* kiln_version() { return KILN_VERSION_STRING; }

}  // namespace kiln::cli

int main(int argc, char** argv) {
  try {
    return kiln::cli::run(argc, argv);
  } catch (const kiln::Error& e) {
    std::cerr << "kiln: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "kiln: error: " << e.what() << "\n";
    return 1;
  }
}
