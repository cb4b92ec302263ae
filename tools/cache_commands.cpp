// `kiln cache ...`: inspection and maintenance of the on-disk kernel cache.
//
// The tool uses the process-wide kernel_cache(), so it finds the same directory (and cap)
// as any kiln program run with the same environment; `--cache-dir` works by setting
// KILN_CACHE_DIR before the cache is first touched (kiln.cpp). Listing, showing and
// verifying read every directory (read-only layers too); verify removes bad entries only
// from the written directory, and clear needs that directory to be writable.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "jit/compiler.h"
#include "jit/kernel_cache.h"
#include "tools/cli.h"
#include "tools/text_output.h"

namespace kiln::cli {
namespace {

using Json = nlohmann::json;
using jit::KernelRecord;

// Characters of the key shown in tables; enough to be unique in any realistic cache, and
// `cache show` accepts any unique prefix.
constexpr size_t kShortKey = 16;

int64_t now_unix() { return static_cast<int64_t>(std::time(nullptr)); }

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

// The CPU name without its feature list ("znver4 +avx2,..." -> "znver4"): the full string
// is hundreds of characters; `cache show` and --json give it whole.
std::string cpu_name(const std::string& target) { return target.substr(0, target.find(' ')); }

Json record_json(const KernelRecord& r) {
  return {{"key", r.key},
          {"name", r.name},
          {"source_ops", r.source_ops},
          {"compiler", r.compiler},
          {"target", r.target},
          {"compile_ms", r.compile_ms},
          {"object_bytes", r.object_bytes},
          {"created_unix", r.created_unix},
          {"last_used_unix", r.last_used_unix},
          {"hits", r.hits},
          {"launches", r.launches},
          {"run_ms_total", r.run_ms_total}};
}

// clear changes the directory, which a memory-only or read-only cache does not have.
void require_writable_directory(const std::string& command) {
  jit::KernelCache& cache = jit::kernel_cache();
  if (cache.directory().empty())
    throw Error("[cache " + command +
                "] the kernel cache is memory-only (KILN_CACHE_DIR is empty or 'off'); "
                "there are no disk entries");
  if (!cache.disk_enabled())
    throw Error("[cache " + command + "] the cache directory " + cache.directory() +
                " is not usable (missing and cannot be created, or read-only)");
}

int cache_list(const Invocation& inv) {
  jit::KernelCache& cache = jit::kernel_cache();
  const std::vector<KernelRecord> records = cache.disk_records();
  if (inv.json) {
    Json entries = Json::array();
    for (const KernelRecord& r : records) entries.push_back(record_json(r));
    Json out = {{"directory", cache.directory()}, {"count", records.size()}, {"entries", entries}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (cache.directory().empty()) {
    std::cout << "kernel cache is memory-only (KILN_CACHE_DIR is empty or 'off')\n";
    return 0;
  }
  if (records.empty()) {
    std::cout << "no kernels in " << cache.directory() << "\n";
    return 0;
  }
  const int64_t now = now_unix();
  TextTable table({"KEY", "SOURCE OPS", "SIZE", "COMPILE MS", "HITS", "LAST USED", "TARGET"},
                  {false, false, true, true, true, false, false});
  for (const KernelRecord& r : records)
    table.add_row({r.key.substr(0, kShortKey), join(r.source_ops, ","), human_size(r.object_bytes),
                   fixed(r.compile_ms, 1), std::to_string(r.hits),
                   relative_time(r.last_used_unix, now), cpu_name(r.target)});
  std::cout << table.render() << records.size() << (records.size() == 1 ? " kernel" : " kernels")
            << " in " << cache.directory() << "\n";
  return 0;
}

int cache_show(const Invocation& inv) {
  const auto [r, source] = jit::kernel_cache().show(inv.words[2]);
  if (inv.json) {
    Json out = record_json(r);
    out["source"] = source;
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  const int64_t now = now_unix();
  TextTable table({"key", r.key}, {false, false});
  table.add_row({"entry point", r.name});
  table.add_row({"source ops", join(r.source_ops, ", ")});
  table.add_row({"compiler", r.compiler});
  table.add_row({"target", r.target});
  table.add_row({"compile ms", fixed(r.compile_ms, 2)});
  table.add_row({"object size",
                 human_size(r.object_bytes) + " (" + std::to_string(r.object_bytes) + " bytes)"});
  table.add_row(
      {"created", iso_time(r.created_unix) + " (" + relative_time(r.created_unix, now) + ")"});
  table.add_row({"last used",
                 iso_time(r.last_used_unix) + " (" + relative_time(r.last_used_unix, now) + ")"});
  table.add_row({"hits", std::to_string(r.hits)});
  table.add_row({"launches", std::to_string(r.launches)});
  table.add_row({"run ms total", fixed(r.run_ms_total, 3)});
  std::cout << table.render() << "\n--- source ---\n" << source;
  if (!source.empty() && source.back() != '\n') std::cout << "\n";
  return 0;
}

int cache_stats(const Invocation& inv) {
  jit::KernelCache& cache = jit::kernel_cache();
  const std::vector<KernelRecord> records = cache.disk_records();
  const jit::CacheStats stats = cache.stats();
  uint64_t hits = 0, launches = 0;
  double compile_ms = 0;
  for (const KernelRecord& r : records) {
    hits += r.hits;
    launches += r.launches;
    compile_ms += r.compile_ms;
  }
  const uint64_t cap = cache.max_bytes();
  // Each entry was compiled once; every later request for it was a hit (all processes).
  const double requests = static_cast<double>(hits) + static_cast<double>(records.size());
  const double hit_rate = requests > 0 ? static_cast<double>(hits) / requests : 0.0;
  if (inv.json) {
    Json out = {{"entries", records.size()},
                {"total_bytes", stats.disk_bytes},
                {"cap_bytes", cap},
                {"directory", cache.directory()},
                {"disk_enabled", cache.disk_enabled()},
                {"read_only_directories", cache.read_only_directories()},
                {"total_hits", hits},
                {"hit_rate", hit_rate},
                {"total_launches", launches},
                {"compile_ms_total", compile_ms}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  TextTable table({"entries", std::to_string(records.size())}, {false, false});
  table.add_row({"total size", human_size(stats.disk_bytes)});
  table.add_row({"size cap", cap ? human_size(cap) : "none"});
  table.add_row(
      {"directory", cache.directory().empty() ? "(none: memory only)" : cache.directory()});
  table.add_row({"disk enabled", cache.disk_enabled() ? "yes" : "no"});
  if (!cache.read_only_directories().empty())
    table.add_row({"read-only", join(cache.read_only_directories(), ", ")});
  table.add_row({"total hits", std::to_string(hits)});
  table.add_row({"hit rate", fixed(100.0 * hit_rate, 1) + "% (hits / (hits + entries compiled))"});
  table.add_row({"total launches", std::to_string(launches)});
  table.add_row({"compile ms total", fixed(compile_ms, 1)});
  std::cout << table.render();
  return 0;
}

// The loaders verify() may use: both CPU compilers this build has, so that an entry is
// load-checked by the compiler that made it whichever one this process would pick.
std::vector<std::unique_ptr<jit::CpuCompiler>> cpu_loaders() {
  std::vector<std::unique_ptr<jit::CpuCompiler>> out;
  for (const char* name : {"llvm", "external"})
    if (auto c = jit::make_cpu_compiler(name)) out.push_back(std::move(c));
  return out;
}

int cache_verify(const Invocation& inv) {
  jit::KernelCache& cache = jit::kernel_cache();
  if (cache.directory().empty() && cache.read_only_directories().empty())
    throw Error(
        "[cache verify] the kernel cache is memory-only (KILN_CACHE_DIR is empty or "
        "'off'); there are no disk entries");
  const auto loaders = cpu_loaders();
  std::vector<jit::CpuCompiler*> loader_ptrs;
  for (const auto& c : loaders) loader_ptrs.push_back(c.get());
  const jit::VerifyReport report = cache.verify(loader_ptrs);
  if (inv.json) {
    Json removed = Json::array(), kept = Json::array();
    for (const jit::VerifyProblem& p : report.problems)
      (p.removed ? removed : kept)
          .push_back({{"key", p.key}, {"path", p.path}, {"reason", p.reason}});
    Json out = {{"directory", cache.directory()},
                {"read_only_directories", cache.read_only_directories()},
                {"ok", report.ok},
                {"load_checked", report.load_checked},
                {"removed", removed},
                {"bad_left_in_place", kept},
                {"stray_files_removed", report.stray_files_removed}};
    std::cout << out.dump(2) << "\n";
  } else {
    size_t removed = 0;
    for (const jit::VerifyProblem& p : report.problems) {
      if (p.removed) {
        removed++;
        std::cout << "removed " << p.key << ": " << p.reason << "\n";
      } else {
        std::cout << "bad " << p.path << ": " << p.reason << " (left in place)\n";
      }
    }
    std::cout << report.ok << (report.ok == 1 ? " entry" : " entries") << " ok, " << removed
              << " removed";
    if (report.problems.size() > removed)
      std::cout << ", " << report.problems.size() - removed << " bad left in place";
    std::cout << " (" << report.load_checked << " of the good objects loaded and checked)\n";
  }
  return report.problems.empty() ? 0 : 1;
}

int cache_clear(const Invocation& inv) {
  require_writable_directory("clear");
  jit::KernelCache& cache = jit::kernel_cache();
  const size_t removed = cache.clear();
  if (inv.json) {
    std::cout << Json{{"directory", cache.directory()}, {"removed", removed}}.dump(2) << "\n";
  } else {
    std::cout << "removed " << removed << (removed == 1 ? " entry" : " entries") << " from "
              << cache.directory() << "\n";
  }
  return 0;
}

}  // namespace

int run_cache_command(const Invocation& inv) {
  // words[0] is "cache"; kiln.cpp has checked words[1] names a subcommand and the count.
  const std::string& sub = inv.words.at(1);
  if (sub == "list") return cache_list(inv);
  if (sub == "show") return cache_show(inv);
  if (sub == "stats") return cache_stats(inv);
  if (sub == "verify") return cache_verify(inv);
  if (sub == "clear") return cache_clear(inv);
  throw UsageError{"unknown cache command '" + sub + "'"};
}

}  // namespace kiln::cli
