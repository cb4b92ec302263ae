#include "settings.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "error.h"

namespace kiln::settings {
namespace {

using W = ReadWhen;

// The registry. docs/user-guide.md ("Environment variables") mirrors this table; keep the
// two in step.
const std::vector<Variable> kVariables = {
    {"KILN_NUM_THREADS", "a whole number in [1, 4096]",
     "CPU threads that run kernels (default: one per core)", W::PerProcess},
    {"KILN_SEED", "an unsigned 64-bit integer, decimal or 0x-hex (e.g. 42 or 0x2a)",
     "initial seed of the default random generator (default 0)", W::PerProcess},
    {"KILN_MEMORY_BUDGET",
     // memory/pools/budget_spec.cpp's accepted_budget_forms(Pool), word for word (a test checks).
     "a size: whole bytes (4096) or a number with a unit, KB MB GB TB (powers of 1000) or KiB "
     "MiB GiB TiB (powers of 1024), such as 300MB, 512MiB or 1.5GiB; a percentage of device "
     "memory (physical RAM for the cpu) such as 50%; or none",
     "memory budget of every evaluation; set_budget() overrides it (default: none)", W::PerProcess},
    {"KILN_DEVICE_MEMORY_LIMIT", "a size such as 4GiB, 512MB or a number of bytes",
     "limit of each CUDA device pool, read when the pool is created (default: none)",
     W::PerProcess},
    {"KILN_RESERVE_WORK_LIMIT", "a real number >= 0, or inf",
     "share of a step's work the planner may add to keep reserves (default 0.05)", W::PerProcess},
    {"KILN_RECORD_STEPS", "1/true/on/yes or 0/false/off/no",
     "record every training step for memory pictures (default off)", W::PerProcess},
    {"KILN_PLAN_DUMP", "a file path in a writable directory; %n becomes the evaluation's number",
     "write the last training step's graph for `kiln plan`, or with %n every evaluation's, "
     "numbered from 000000 (default: off)",
     W::PerUse},
    {"KILN_EXECUTOR", "jit or reference", "the executor evaluations use (default jit)",
     W::PerProcess},
    {"KILN_CPU_COMPILER", "llvm or external",
     "compiler of CPU kernels (default llvm when built with LLVM)", W::PerProcess},
    {"KILN_CACHE_DIR", "a directory, or off",
     "disk kernel cache (default $XDG_CACHE_HOME/kiln or ~/.cache/kiln)", W::PerProcess},
    {"KILN_CACHE_MAX_MB", "a whole number of megabytes", "size cap of the disk kernel cache",
     W::PerProcess},
    {"KILN_LOG", "debug", "print every compile, disk load and eviction", W::PerUse},
    {"KILN_JIT_TIERS", "1/true/on/yes or 0/false/off/no",
     "run new CPU kernels from a quick build first, rebuilt at -O3 in the background (default on)",
     W::PerProcess},
    {"KILN_DUMP_KERNELS", "1/true/on/yes or 0/false/off/no",
     "print each kernel's source when it is compiled", W::PerUse},
    {"KILN_DISABLE_SIMPLIFY", "1/true/on/yes or 0/false/off/no",
     "skip the simplify pass (CSE, folding)", W::PerUse},
    {"KILN_DISABLE_FUSION", "1/true/on/yes or 0/false/off/no", "one kernel per node, no fusion",
     W::PerProcess},
    {"KILN_DISABLE_LIBRARY", "1/true/on/yes or 0/false/off/no",
     "no library GEMM: matmuls become generated reductions", W::PerProcess},
    {"KILN_DISABLE_CONV", "1/true/on/yes or 0/false/off/no",
     "no library convolution: conv2d runs as im2col + library GEMM", W::PerProcess},
    {"KILN_CONV_LAYOUT", "auto, blocked, plain or gemm",
     "how library convolutions run: oneDNN on its blocked layouts with reorders or on kiln's "
     "tensors as stored, kiln's GEMM calls (1x1 convolutions), or chosen per pass and shape "
     "(default auto)",
     W::PerUse},
    {"KILN_DISABLE_ACCUMULATE", "1/true/on/yes or 0/false/off/no",
     "no in-place gradient accumulation", W::PerProcess},
    {"KILN_DISABLE_ROUNDING", "1/true/on/yes or 0/false/off/no",
     "half GEMMs store a float32 product and round it in a kernel of its own", W::PerProcess},
    {"KILN_DISABLE_ROWS", "1/true/on/yes or 0/false/off/no",
     "every reduction in a kernel of its own (no row stages inside its consumer's kernel)",
     W::PerProcess},
    {"KILN_DISABLE_REGENERATE", "1/true/on/yes or 0/false/off/no",
     "store a value computed from sources alone (a dropout mask) when several kernels read it, "
     "instead of regenerating it in each",
     W::PerProcess},
    {"KILN_DISABLE_INLINE_REBUILD", "1/true/on/yes or 0/false/off/no",
     "rebuild a released value only with its own kernel, never inside the kernel that reads it "
     "(a fused rebuild of an elementwise value under a memory budget)",
     W::PerProcess},
    {"KILN_DISABLE_PLAN_CACHE", "1/true/on/yes or 0/false/off/no",
     "re-plan every evaluation instead of replaying a cached plan", W::PerProcess},
    {"KILN_DISABLE_REPLAY", "1/true/on/yes or 0/false/off/no",
     "lower every kernel again at each evaluation instead of reusing a cached plan's lowered "
     "kernels",
     W::PerProcess},
    {"KILN_DISABLE_ARENA", "1/true/on/yes or 0/false/off/no",
     "give each value its own pool block instead of a planned arena", W::PerUse},
    {"KILN_NVRTC_CHECK", "a comma-separated list of CUDA architectures such as 80,90",
     "also compile every CPU kernel's CUDA twin with NVRTC for these architectures", W::PerProcess},
    {"KILN_CUDA_DRIVER", "a path to libcuda", "the CUDA driver to open (default libcuda.so.1)",
     W::PerProcess},
    {"KILN_DIST_BACKEND", "auto, single or mpi",
     "the communicator dist::world() makes: MPI when a launcher started the process, or one "
     "process (default auto)",
     W::PerProcess},
    {"KILN_DIST_TIMEOUT", "a real number of seconds above 0",
     "how long a collective may wait for the other ranks before a TimeoutError (default 300)",
     W::PerUse},
    {"KILN_NCCL_LIBRARY", "a path to libnccl",
     "the NCCL library dist opens for CUDA tensors (default libnccl.so.2)", W::PerUse},
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

}  // namespace

const std::vector<Variable>& variables() { return kVariables; }

const Variable& variable(std::string_view name) {
  for (const Variable& v : kVariables)
    if (name == v.name) return v;
  throw ValueError("[settings] " + std::string(name) +
                   " is not a registered kiln variable (core/settings.cpp lists them)");
}

void reject(std::string_view name, const std::string& value, const std::string& why) {
  const Variable& v = variable(name);
  throw ValueError("[" + std::string(name) + "] '" + value + "' is not accepted; expected " +
                   v.accepted + (why.empty() ? "" : " (" + why + ")") + "; unset " +
                   std::string(name) + " for the default");
}

std::optional<std::string> text(std::string_view name) {
  const Variable& v = variable(name);
  const char* raw = std::getenv(v.name);
  if (raw == nullptr || *raw == '\0') return std::nullopt;
  return std::string(raw);
}

std::optional<int64_t> integer(std::string_view name, int64_t lo, int64_t hi) {
  std::optional<std::string> t = text(name);
  if (!t) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(t->c_str(), &end, 10);
  if (end == t->c_str() || *end != '\0' || errno == ERANGE) reject(name, *t, "not a whole number");
  if (value < lo || value > hi) reject(name, *t, "out of range");
  return static_cast<int64_t>(value);
}

std::optional<uint64_t> unsigned64(std::string_view name) {
  std::optional<std::string> t = text(name);
  if (!t) return std::nullopt;
  const std::string& s = *t;
  // Decimal or 0x-hex; base 0 would read a leading zero as octal, which surprises.
  const bool hex = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(s.c_str(), &end, hex ? 16 : 10);
  // strtoull accepts a sign and wraps negative numbers around; refuse both.
  if (s.find_first_of("+- ") != std::string::npos || errno == ERANGE || end == s.c_str() ||
      *end != '\0')
    reject(name, s);
  return static_cast<uint64_t>(value);
}

std::optional<double> real(std::string_view name, double lo) {
  std::optional<std::string> t = text(name);
  if (!t) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(t->c_str(), &end);
  if (end == t->c_str() || *end != '\0' || std::isnan(value)) reject(name, *t, "not a number");
  if (value < lo) reject(name, *t, "out of range");
  return value;
}

bool flag(std::string_view name, bool fallback) {
  std::optional<std::string> t = text(name);
  if (!t) return fallback;
  const std::string v = lower(*t);
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  reject(name, *t);
}

std::optional<std::string> choice(std::string_view name, const std::vector<std::string>& choices) {
  std::optional<std::string> t = text(name);
  if (!t) return std::nullopt;
  for (const std::string& c : choices)
    if (*t == c) return t;
  reject(name, *t);
}

}  // namespace kiln::settings
