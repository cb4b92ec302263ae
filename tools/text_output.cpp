// Human-readable formatting for `kiln` output. Times are UTC so that output does not depend
// on the machine's time zone (tests and logs compare it across machines).
#include "tools/text_output.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

namespace kiln::cli {

std::string human_size(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return fixed(value, 1) + " " + units[unit];
}

std::string relative_time(int64_t unix_seconds, int64_t now) {
  if (unix_seconds <= 0) return "never";
  int64_t ago = now - unix_seconds;
  // A clock step or another machine's clock (shared directory) can put a use in the
  // future; that is still "just now" for the reader.
  if (ago < 5) return "just now";
  if (ago < 60) return std::to_string(ago) + " s ago";
  if (ago < 3600) return std::to_string(ago / 60) + " min ago";
  if (ago < 86400) return std::to_string(ago / 3600) + " h ago";
  if (ago < 30 * 86400) {
    int64_t days = ago / 86400;
    return std::to_string(days) + (days == 1 ? " day ago" : " days ago");
  }
  return iso_time(unix_seconds).substr(0, 10);
}

std::string iso_time(int64_t unix_seconds) {
  if (unix_seconds <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

TextTable::TextTable(std::vector<std::string> header, std::vector<bool> right_aligned)
    : right_aligned_(std::move(right_aligned)) {
  right_aligned_.resize(header.size(), false);
  rows_.push_back(std::move(header));
}

void TextTable::add_row(std::vector<std::string> cells) {
  cells.resize(rows_[0].size());
  rows_.push_back(std::move(cells));
}

std::string TextTable::render() const {
  std::vector<size_t> width(rows_[0].size(), 0);
  for (const auto& row : rows_)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::string out;
  for (const auto& row : rows_) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      std::string pad(width[c] - row[c].size(), ' ');
      if (c) line += "  ";
      line += right_aligned_[c] ? pad + row[c] : row[c] + pad;
    }
    // The last column is left-aligned text in every table; no trailing blanks.
    line.erase(line.find_last_not_of(' ') + 1);
    out += line + "\n";
  }
  return out;
}

}  // namespace kiln::cli
