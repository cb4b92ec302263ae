#pragma once
// Where a tensor's value lives and runs: the host CPU or a CUDA device (core/cuda_driver.h
// finds the devices; without a driver asking for one raises DeviceError).
#include <iosfwd>
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
  bool is_cuda() const { return kind == Kind::CUDA; }
  friend bool operator==(const Device&, const Device&) = default;
};

/// Prints Device::str(): "cpu", "cuda:0".
std::ostream& operator<<(std::ostream& os, const Device& device);

/// The device factories use when none is given (cpu unless set); process-wide.
Device default_device();
/// Sets the default device; throws DeviceError for a CUDA device that is not present.
void set_default_device(Device device);
/// Throws DeviceError naming `op` unless `device` exists here (cpu always does).
void check_device_available(const char* op, Device device);

}  // namespace kiln
