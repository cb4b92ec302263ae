#pragma once
// kiln's lines on stderr (warnings, debug logs, dumped kernels).
#include <string>

namespace kiln {

/// Writes `line` and a newline to stderr in one write(2), so that lines from several
/// threads or processes do not interleave.
void log_line(const std::string& line);

/// True when KILN_LOG=debug asks for debug lines (compiles, disk loads, plans made).
bool debug_log();

}  // namespace kiln
