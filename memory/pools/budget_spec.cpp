#include "budget_spec.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "caching_pool.h"

namespace kiln::memory {
namespace {

constexpr const char* kPoolForms =
    "a size: whole bytes (4096) or a number with a unit, KB MB GB TB (powers of 1000) or KiB "
    "MiB GiB TiB (powers of 1024), such as 300MB, 512MiB or 1.5GiB; a percentage of device "
    "memory (physical RAM for the cpu) such as 50%; or none";
constexpr const char* kPlanFileForms =
    "a size: whole bytes (4096) or a number with a unit, KB MB GB TB (powers of 1000) or KiB "
    "MiB GiB TiB (powers of 1024), such as 300MB, 512MiB or 1.5GiB; or a percentage of the "
    "bytes the step releases such as 50%releasable";

struct Unit {
  const char* name;
  double scale;
};
constexpr Unit kUnits[] = {{"b", 1.0},         {"kb", 1e3},           {"mb", 1e6},
                           {"gb", 1e9},        {"tb", 1e12},          {"kib", 1024.0},
                           {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "50", "12.5": a share in percent as the hint and the description print it.
std::string percent_text(double percent) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", percent);
  return buf;
}

}  // namespace

const char* accepted_budget_forms(BudgetContext context) {
  return context == BudgetContext::Pool ? kPoolForms : kPlanFileForms;
}

size_t BudgetSpec::bytes_of(size_t whole) const {
  switch (kind) {
    case Kind::None:
      return 0;
    case Kind::Bytes:
      return bytes;
    case Kind::ShareOfMemory:
    case Kind::ShareOfReleasable:
      return static_cast<size_t>(share * static_cast<double>(whole));
  }
  return 0;
}

std::string BudgetSpec::description() const {
  switch (kind) {
    case Kind::None:
      return "none";
    case Kind::Bytes:
      return format_bytes(bytes);
    case Kind::ShareOfMemory:
      return percent_text(100 * share) + "% of device memory";
    case Kind::ShareOfReleasable:
      return percent_text(100 * share) + "% of the releasable bytes";
  }
  return "none";
}

BudgetSpec parse_budget(const std::string& text, const std::string& source, BudgetContext context) {
  const bool pool = context == BudgetContext::Pool;
  auto refuse = [&](const std::string& why) -> BudgetSpec {
    throw BudgetError("[" + source + "] '" + text + "' is not accepted: " + why + "; expected " +
                      accepted_budget_forms(context));
  };
  const std::string s = lower(trim(text));
  if (s.empty()) return refuse("it is empty");
  if (s == "none") {
    if (!pool)
      return refuse("kiln plan replays the step at budgets; leave BUDGET out for its defaults");
    return {};
  }
  if (s[0] == '-' || s[0] == '+') return refuse("a budget is a size or a share, without a sign");

  // The number: digits with at most one decimal point (no exponent, no sign).
  size_t i = 0;
  bool point = false, digits = false;
  for (; i < s.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(s[i])))
      digits = true;
    else if (s[i] == '.' && !point)
      point = true;
    else
      break;
  }
  if (!digits) return refuse("it does not start with a number");
  const std::string number = s.substr(0, i);
  const double value = std::strtod(number.c_str(), nullptr);
  const std::string suffix = trim(s.substr(i));

  if (!suffix.empty() && suffix[0] == '%') {
    const std::string whole = trim(suffix.substr(1));
    if (whole == "releasable") {
      if (pool)
        return refuse(
            "a share of a step's releasable bytes is for kiln plan only; the budget of "
            "evaluations is a size or a share of device memory (" +
            percent_text(value) + "%)");
    } else if (!whole.empty()) {
      return refuse("'%" + whole + "' is not a share kiln knows; write " + percent_text(value) +
                    (pool ? "% (of device memory)" : "%releasable (of the releasable bytes)"));
    } else if (!pool) {
      return refuse("kiln plan needs a share to say of what: write " + percent_text(value) +
                    "%releasable for that share of the bytes the step releases (a share of "
                    "device memory does not apply to a step read from a file)");
    }
    if (!(value > 0)) return refuse("a share must be above 0%");
    if (value > 100) return refuse("a share must be at most 100%");
    return {whole.empty() ? BudgetSpec::Kind::ShareOfMemory : BudgetSpec::Kind::ShareOfReleasable,
            0, value / 100};
  }

  if (suffix.empty() || suffix == "b") {
    if (point) {
      const std::string share = pool ? "%" : "%releasable";
      if (value > 0 && value <= 1)
        return refuse("a bare number is a count of bytes, and bytes are whole; for that share of " +
                      std::string(pool ? "device memory" : "the releasable bytes") + " write " +
                      percent_text(100 * value) + share);
      return refuse(
          "a bare number is a count of bytes, and bytes are whole; give a unit for a fraction "
          "(1.5GiB) or write a share as a percentage (50" +
          share + ")");
    }
  }
  const std::string unit = suffix.empty() ? "b" : suffix;
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    const double bytes = std::round(value * u.scale);
    if (!std::isfinite(bytes) || bytes >= 9.0e18) return refuse("it is too large");
    if (bytes < 1)
      return refuse(pool ? "a budget below one byte holds nothing; write none for no budget"
                         : "a budget below one byte holds nothing");
    return {BudgetSpec::Kind::Bytes, static_cast<size_t>(bytes), 0};
  }
  if (suffix == "k" || suffix == "m" || suffix == "g" || suffix == "t" || suffix == "ki" ||
      suffix == "mi" || suffix == "gi" || suffix == "ti") {
    std::string upper(1, static_cast<char>(std::toupper(static_cast<unsigned char>(suffix[0]))));
    return refuse("'" + suffix + "' is not a unit: write " + upper + "B (powers of 1000) or " +
                  upper + "iB (powers of 1024)");
  }
  return refuse("'" + suffix + "' is not a unit");
}

}  // namespace kiln::memory
