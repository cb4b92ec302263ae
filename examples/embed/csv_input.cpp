#include "csv_input.h"

#include <kiln/kiln.h>

#include <charconv>
#include <cmath>

namespace embed {
namespace {

std::string_view trim(std::string_view s) {
  const char* space = " \t\r";
  const size_t first = s.find_first_not_of(space);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(space) - first + 1);
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    fields.push_back(trim(line.substr(start, comma - start)));
    if (comma == std::string_view::npos) return fields;
    start = comma + 1;
  }
}

// A whole field as a finite number; from_chars rejects the leading '+' that CSV writers
// sometimes emit, so it is skipped here.
bool parse_number(std::string_view field, double& value) {
  if (!field.empty() && field.front() == '+') field.remove_prefix(1);
  if (field.empty()) return false;
  auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  return error == std::errc() && end == field.data() + field.size() && std::isfinite(value);
}

}  // namespace

CsvSamples read_csv(std::istream& in, const std::string& source, int64_t features,
                    bool with_labels) {
  const size_t columns = static_cast<size_t>(features) + (with_labels ? 1 : 0);
  const std::string what = std::to_string(columns) + " comma-separated numbers (" +
                           std::to_string(features) + " input features" +
                           (with_labels ? " and a label)" : ")");
  CsvSamples samples;
  std::string line;
  bool first_content_line = true;
  for (int64_t line_number = 1; std::getline(in, line); ++line_number) {
    const std::string_view text = trim(line);
    if (text.empty() || text.front() == '#') continue;
    const std::string where = "" + source + " line " + std::to_string(line_number) + ": ";
    const std::vector<std::string_view> fields = split_fields(text);

    std::vector<double> values(fields.size());
    size_t numbers = 0;
    for (size_t i = 0; i < fields.size(); ++i) numbers += parse_number(fields[i], values[i]);
    if (first_content_line && numbers == 0) {  // column names
      first_content_line = false;
      continue;
    }
    first_content_line = false;

    if (fields.size() != columns) {
      const bool label_column = !with_labels && fields.size() == columns + 1;
      throw kiln::ValueError(
          where + "expected " + what + ", got " + std::to_string(fields.size()) + " values" +
          (label_column ? " (use --labels when the last column is the class)" : ""));
    }
    for (size_t i = 0; i < fields.size(); ++i) {
      if (!parse_number(fields[i], values[i])) {
        throw kiln::ValueError(where + "column " + std::to_string(i + 1) + " is '" +
                               std::string(fields[i]) + "', expected a finite number");
      }
    }
    if (with_labels) {
      const double label = values.back();
      if (label < 0 || label != std::floor(label)) {
        throw kiln::ValueError(where + "label '" + std::string(fields.back()) +
                               "' is not a class index (an integer >= 0)");
      }
      samples.labels.push_back(static_cast<int64_t>(label));
      values.pop_back();
    }
    samples.features.insert(samples.features.end(), values.begin(), values.end());
    ++samples.rows;
  }
  if (in.bad()) throw kiln::IOError("reading " + source + " failed");
  if (samples.rows == 0) throw kiln::ValueError("" + source + " holds no samples");
  return samples;
}

}  // namespace embed
