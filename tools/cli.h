#pragma once
// The `kiln` command-line tool: what its commands share.
//
// main() (kiln.cpp) parses the command line into an Invocation and dispatches; each
// command prints either human-readable text or, with --json, one JSON document on stdout.
// Commands throw kiln::Error for failures the user should see as `kiln: error: ...`.
#include <string>
#include <vector>

namespace kiln::cli {

/// A parsed command line: the command words (e.g. {"cache", "show", "3fa2"}) and options.
struct Invocation {
  std::vector<std::string> words;
  bool json = false;
};

/// Thrown for a command line that does not parse; main prints the usage and exits 2.
struct UsageError {
  std::string message;
};

/// `kiln cache list|show|stats|verify|clear`; returns the exit status.
int run_cache_command(const Invocation& inv);
/// `kiln info`; returns the exit status.
int run_info_command(const Invocation& inv);
/// `kiln plan FILE [BUDGET...]`; returns the exit status.
int run_plan_command(const Invocation& inv);

/// The kiln version this tool was built with (PROJECT_VERSION).
const char* kiln_version();

}  // namespace kiln::cli
