#pragma once
// The one place that reads KILN_* environment variables. Every variable kiln reads is
// registered here with the values it accepts and when it is read, and is parsed by one of
// the typed readers below, so a bad value is the same clear ValueError wherever it is read:
//   [KILN_NUM_THREADS] 'lots' is not accepted; expected a whole number in [1, 4096] ...
// Readers never cache: a variable read "per process" is cached by its caller only once it
// parsed, so a bad value raises again from every call that needs it, never from a static
// initialiser and never as std::terminate.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::settings {

/// When kiln reads a variable: once per process (changing it later has no effect), or every
/// time it is needed (each evaluation, compile or call).
enum class ReadWhen { PerProcess, PerUse };

/// One registered variable: its name, the values it accepts, what it does, and when it is
/// read.
struct Variable {
  const char* name;
  const char* accepted;
  const char* meaning;
  ReadWhen when;
};

/// Every KILN_* variable kiln reads, in documentation order (`kiln info` lists them).
const std::vector<Variable>& variables();
/// The registered variable `name`; throws ValueError for a name that is not registered.
const Variable& variable(std::string_view name);

/// The raw value of a registered variable; nullopt when unset or empty.
std::optional<std::string> text(std::string_view name);
/// A whole number in [lo, hi]; nullopt when unset or empty; ValueError otherwise.
std::optional<int64_t> integer(std::string_view name, int64_t lo, int64_t hi);
/// An unsigned 64-bit integer, decimal or 0x-hex; nullopt when unset or empty.
std::optional<uint64_t> unsigned64(std::string_view name);
/// A real number >= lo ("inf" allowed when lo allows it); nullopt when unset or empty.
std::optional<double> real(std::string_view name, double lo);
/// A switch: 1/true/on/yes or 0/false/off/no (any case); `fallback` when unset or empty.
bool flag(std::string_view name, bool fallback = false);
/// One of `choices`; nullopt when unset or empty; ValueError naming the choices otherwise.
std::optional<std::string> choice(std::string_view name, const std::vector<std::string>& choices);

/// Throws the ValueError every reader throws for a bad value: "[NAME] 'value' is not
/// accepted; expected <accepted>" plus `why` when given. For parsers kept next to their
/// subsystem (memory sizes, budgets).
[[noreturn]] void reject(std::string_view name, const std::string& value,
                         const std::string& why = "");

}  // namespace kiln::settings
