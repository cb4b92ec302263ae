#pragma once
// Feature rows from CSV text: one sample per line, comma-separated numbers.
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace embed {

/// Samples read from CSV: `features` is row-major [rows, features per row].
struct CsvSamples {
  int64_t rows = 0;
  std::vector<double> features;
  std::vector<int64_t> labels;  // filled only when the rows carry a label column
};

/// Reads lines of `features` numbers (plus a last column with an integer label >= 0 when
/// `with_labels`). Blank lines and lines starting with '#' are skipped, and so is a first
/// line with no number in it (a header). Anything else malformed throws kiln::ValueError
/// naming `source` and the line.
CsvSamples read_csv(std::istream& in, const std::string& source, int64_t features,
                    bool with_labels);

}  // namespace embed
