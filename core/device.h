#pragma once
// Where a tensor's value lives. Only the CPU executes today; CUDA devices are part of the
// type system so that device checks and placement are in place before the backend lands.
#include <string>

namespace kiln {

/// A memory space and executor: the host CPU or CUDA device `index`.
struct Device {
  enum class Kind : unsigned char { CPU, CUDA };
  Kind kind = Kind::CPU;
  int index = 0;

  /// The host CPU.
  static constexpr Device cpu() { return Device{Kind::CPU, 0}; }
  /// CUDA device `i`.
  static constexpr Device cuda(int i = 0) { return Device{Kind::CUDA, i}; }
  /// "cpu" or "cuda:0".
  std::string str() const { return kind == Kind::CPU ? "cpu" : "cuda:" + std::to_string(index); }
  friend bool operator==(const Device&, const Device&) = default;
};

}  // namespace kiln
