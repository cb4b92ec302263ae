#pragma once
// A memory budget written as text, and its one parser. KILN_MEMORY_BUDGET, set_budget(text),
// the examples' --memory-budget and `kiln plan`'s BUDGETs all read budgets with
// parse_budget, so a budget is spelled the same and means the same everywhere.
//
// The forms (spaces around the text or between number and unit are ignored, units and
// words may be in any case):
//   4096, 4096B             whole bytes; a bare number is always bytes
//   300KB 300MB 2GB 1TB     decimal units (SI): 1 KB = 1000 bytes, 1 MB = 1000^2, ...
//   64KiB 512MiB 1.5GiB     binary units (IEC): 1 KiB = 1024 bytes, 1 MiB = 1024^2, ...
//   50%                     a share of the memory of the device the step runs on
//                           (physical RAM for the cpu); pool budgets only
//   50%releasable           a share of the bytes a step releases (its unplanned peak less
//                           what it starts with and keeps); `kiln plan` only
//   none                    no budget; pool budgets only
// A number with a unit may have a fraction ("1.5GiB", rounded to whole bytes); a bare number
// may not: "0.5" is refused with a hint to write "50%", never read as a share.
#include <cstddef>
#include <string>

#include "../../core/error.h"

namespace kiln::memory {

/// A budget's text that parse_budget does not accept. The message starts with the source
/// of the text in brackets (the variable, flag or call), quotes the text, says why it was
/// refused and lists the forms accepted where it came from.
class BudgetError : public ValueError {
  using ValueError::ValueError;
};

/// Where a budget is used, which decides the forms it may take.
enum class BudgetContext {
  Pool,      ///< the budget of evaluations: set_budget, KILN_MEMORY_BUDGET, --memory-budget
  PlanFile,  ///< `kiln plan`'s BUDGETs, replayed on a step's tables
};

/// A parsed budget.
struct BudgetSpec {
  enum class Kind {
    None,               ///< no budget
    Bytes,              ///< `bytes`
    ShareOfMemory,      ///< `share` of the device's memory
    ShareOfReleasable,  ///< `share` of the step's releasable bytes
  };
  Kind kind = Kind::None;
  size_t bytes = 0;  ///< For Kind::Bytes; at least 1.
  double share = 0;  ///< For the share kinds; in (0, 1].

  /// The budget in bytes: `bytes`, share × `whole` for a share (whole: the device's memory
  /// or the step's releasable bytes), 0 for none.
  size_t bytes_of(size_t whole) const;
  /// How a report prints it: "none", "512.0 MiB", "50% of device memory",
  /// "50% of the releasable bytes".
  std::string description() const;
};

/// Parses `text` as a budget used in `context`; throws BudgetError naming `source` (e.g.
/// "KILN_MEMORY_BUDGET", "--memory-budget", "set_budget", "kiln plan BUDGET") otherwise.
BudgetSpec parse_budget(const std::string& text, const std::string& source, BudgetContext context);

/// The forms a budget may take in `context`, as error messages and the settings registry
/// list them.
const char* accepted_budget_forms(BudgetContext context);

}  // namespace kiln::memory
