#pragma once
// Typed errors. Every message starts with "[op]" and names the shapes/dtypes involved and
// what was expected, so a user can act on it without reading kiln's source.
#include <stdexcept>
#include <string>

namespace kiln {

/// Base of every error kiln throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// Shapes that do not fit the op (mismatch, bad reshape, axis out of range, ...).
class ShapeError : public Error {
  using Error::Error;
};
/// A dtype the op does not accept (bitwise op on floats, mean of integers, ...).
class DTypeError : public Error {
  using Error::Error;
};
/// A device that is missing or does not match.
class DeviceError : public Error {
  using Error::Error;
};
/// A kernel failed to compile; carries the source path and compiler log in the message.
class CompileError : public Error {
  using Error::Error;
};
/// An allocation would exceed a limit or the machine's memory; carries the memory report.
class OutOfMemoryError : public Error {
  using Error::Error;
};
/// Reading or writing files failed.
class IOError : public Error {
  using Error::Error;
};
/// An argument value is invalid (negative size, bad step, ...).
class ValueError : public Error {
  using Error::Error;
};
/// An index read from data is out of range (gather, index_select, scatter_add, ...).
class IndexError : public Error {
  using Error::Error;
};

}  // namespace kiln
