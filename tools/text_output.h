#pragma once
// Formatting for the tool's human-readable output: sizes, times, aligned tables.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::cli {

/// "512 B", "3.4 KiB", "12.0 MiB", ...
std::string human_size(uint64_t bytes);
/// Time since `unix_seconds` relative to `now`: "just now", "42 s ago", "3 min ago",
/// "5 h ago", "2 days ago"; the ISO date (UTC) beyond 30 days, "never" for 0.
std::string relative_time(int64_t unix_seconds, int64_t now);
/// ISO 8601 UTC time, e.g. "2024-05-01T12:30:00Z"; "-" for 0.
std::string iso_time(int64_t unix_seconds);
/// `value` with `digits` decimals.
std::string fixed(double value, int digits);

/// Columns padded to their widest cell; numeric columns are right-aligned.
class TextTable {
 public:
  /// `right_aligned[i]` says whether column i is right-aligned.
  TextTable(std::vector<std::string> header, std::vector<bool> right_aligned);
  void add_row(std::vector<std::string> cells);
  /// The table, one line per row, header first; columns separated by two spaces.
  std::string render() const;

 private:
  std::vector<std::vector<std::string>> rows_;
  std::vector<bool> right_aligned_;
};

}  // namespace kiln::cli
