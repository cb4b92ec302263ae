// The `kiln` command-line tool, run as a program (popen) against a cache directory that a
// child process populated by evaluating real kiln graphs through the JIT.
//
// The global kernel cache reads KILN_CACHE_DIR once per process, and this shared test
// binary may already have used it, so the graphs are evaluated in a fresh process: this
// binary again, running only the hidden "[.][cli_child]" case with KILN_CACHE_DIR set.
#include <kiln/kiln.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "jit/blas.h"
#include "memory/reports/step_graph_file.h"

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kiln-cli-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    root_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  const std::string& root() const { return root_; }
  std::string cache() const { return root_ + "/cache"; }

 private:
  std::string root_;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct RunResult {
  int status = -1;  // exit status, -1 if it did not exit normally
  std::string out, err;
};

// Runs `command` through the shell; stdout is returned, stderr goes to a file in `dir`.
RunResult run_shell(const std::string& command, const std::string& dir) {
  RunResult r;
  const std::string err_path = dir + "/stderr.txt";
  FILE* f = ::popen((command + " 2>" + quote(err_path)).c_str(), "r");
  REQUIRE(f != nullptr);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) r.out.append(buf.data(), n);
  int status = ::pclose(f);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_text(err_path);
  return r;
}

// `kiln --cache-dir <tmp cache> <args>`
RunResult kiln_cli(const TempDir& tmp, const std::string& args) {
  return run_shell(quote(KILN_CLI_PATH) + " --cache-dir " + quote(tmp.cache()) + " " + args,
                   tmp.root());
}

// Evaluates the child's graphs in a fresh process whose kernel cache is `dir`.
void populate(const TempDir& tmp) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  RunResult r = run_shell("KILN_CLI_TEST_CHILD=1 KILN_CACHE_DIR=" + quote(tmp.cache()) + " " +
                              quote(self) + " '[cli_child]'",
                          tmp.root());
  INFO("child output:\n" << r.out << r.err);
  REQUIRE(r.status == 0);
}

size_t entry_files(const std::string& dir) {
  size_t n = 0;
  for (const auto& p : fs::directory_iterator(dir)) n += p.path().extension() == ".kk";
  return n;
}

// The key of the listed kernel generated from op `op`.
std::string key_with_op(const Json& list, const std::string& op) {
  for (const Json& e : list.at("entries")) {
    auto ops = e.at("source_ops").get<std::vector<std::string>>();
    if (std::find(ops.begin(), ops.end(), op) != ops.end()) return e.at("key").get<std::string>();
  }
  FAIL("no listed kernel has source op " << op << ":\n" << list.dump(2));
  return "";
}

}  // namespace

// Body of the populating process; does nothing unless run by populate().
TEST_CASE("kiln CLI child: evaluate graphs into KILN_CACHE_DIR", "[.][cli_child]") {
  if (!std::getenv("KILN_CLI_TEST_CHILD")) return;
  kiln::Tensor a = kiln::rand({64, 33}), b = kiln::rand({64, 33}), c = kiln::rand({64, 33});
  kiln::Tensor fused = kiln::sum(kiln::relu(kiln::add(kiln::mul(a, b), c)));
  kiln::Tensor x = kiln::rand({1000});
  kiln::Tensor e = kiln::exp(x);
  kiln::eval({fused, e});
  CHECK(fused.item<float>() > 0);
  CHECK(e.to_vector<float>().size() == 1000);
}

TEST_CASE("kiln CLI: cache list, show, stats, verify, clear on a populated cache", "[cli]") {
  TempDir tmp;
  populate(tmp);
  populate(tmp);  // the second run loads from disk, so entries have hits
  const size_t files = entry_files(tmp.cache());
  REQUIRE(files >= 2);

  RunResult list = kiln_cli(tmp, "cache list");
  INFO("cache list:\n" << list.out << list.err);
  REQUIRE(list.status == 0);
  CHECK(list.out.find("KEY") != std::string::npos);
  CHECK(list.out.find("LAST USED") != std::string::npos);
  CHECK(list.out.find("exp") != std::string::npos);
  CHECK(list.out.find("relu") != std::string::npos);
  CHECK(list.out.find(std::to_string(files) + " kernel") != std::string::npos);

  RunResult list_json = kiln_cli(tmp, "cache list --json");
  REQUIRE(list_json.status == 0);
  const Json listed = Json::parse(list_json.out);
  CHECK(listed.at("count").get<size_t>() == files);
  REQUIRE(listed.at("entries").size() == files);
  for (const Json& e : listed.at("entries")) {
    CHECK(e.at("key").get<std::string>().size() == 32);
    CHECK(e.at("hits").get<uint64_t>() >= 1);
    CHECK(e.at("object_bytes").get<size_t>() > 0);
  }
  const std::string exp_key = key_with_op(listed, "exp");
  const std::string relu_key = key_with_op(listed, "relu");
  CHECK(exp_key != relu_key);
  // The table shows a 16-character key prefix.
  CHECK(list.out.find(exp_key.substr(0, 16)) != std::string::npos);

  {  // show by unique prefix prints metadata and the source
    RunResult show = kiln_cli(tmp, "cache show " + exp_key.substr(0, 10));
    INFO(show.out << show.err);
    REQUIRE(show.status == 0);
    CHECK(show.out.find(exp_key) != std::string::npos);
    CHECK(show.out.find("source ops") != std::string::npos);
    CHECK(show.out.find("--- source ---") != std::string::npos);
    CHECK(show.out.find("extern \"C\"") != std::string::npos);

    RunResult show_json = kiln_cli(tmp, "--json cache show " + exp_key.substr(0, 10));
    REQUIRE(show_json.status == 0);
    Json shown = Json::parse(show_json.out);
    CHECK(shown.at("key") == exp_key);
    CHECK(shown.at("source").get<std::string>().find("extern \"C\"") != std::string::npos);

    RunResult missing = kiln_cli(tmp, "cache show ffffffffffffffffffffffffffffffff0");
    CHECK(missing.status == 1);
    CHECK(missing.err.rfind("kiln: error: ", 0) == 0);
    CHECK(std::count(missing.err.begin(), missing.err.end(), '\n') == 1);
  }

  {  // stats counts entries, size and hits
    RunResult stats = kiln_cli(tmp, "cache stats");
    INFO(stats.out << stats.err);
    REQUIRE(stats.status == 0);
    CHECK(stats.out.find("entries") != std::string::npos);
    CHECK(stats.out.find(tmp.cache()) != std::string::npos);

    RunResult stats_json = kiln_cli(tmp, "cache stats --json");
    REQUIRE(stats_json.status == 0);
    Json s = Json::parse(stats_json.out);
    CHECK(s.at("entries").get<size_t>() == files);
    CHECK(s.at("total_bytes").get<size_t>() > 0);
    CHECK(s.at("disk_enabled") == true);
    CHECK(s.at("directory") == tmp.cache());
    CHECK(s.at("total_hits").get<uint64_t>() >= files);
    CHECK(s.at("compile_ms_total").get<double>() > 0);
  }

  {  // verify removes a corrupted entry and exits 1, then 0
    RunResult clean = kiln_cli(tmp, "cache verify");
    INFO(clean.out << clean.err);
    CHECK(clean.status == 0);
    CHECK(clean.out.find(std::to_string(files) + " entries ok, 0 removed") != std::string::npos);

    // Flip bytes in the object at the end of the file: only the checksum notices.
    const std::string path = tmp.cache() + "/" + relu_key + ".kk";
    {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      REQUIRE(f);
      f.seekg(-8, std::ios::end);
      std::array<char, 4> bytes{};
      f.read(bytes.data(), bytes.size());
      for (char& byte : bytes) byte = static_cast<char>(~byte);
      f.seekp(-8, std::ios::end);
      f.write(bytes.data(), bytes.size());
    }
    RunResult bad = kiln_cli(tmp, "cache verify");
    INFO(bad.out << bad.err);
    CHECK(bad.status == 1);
    CHECK(bad.out.find("removed " + relu_key + ": checksum mismatch") != std::string::npos);
    CHECK(!fs::exists(path));

    RunResult again = kiln_cli(tmp, "cache verify --json");
    CHECK(again.status == 0);
    Json v = Json::parse(again.out);
    CHECK(v.at("ok").get<size_t>() == files - 1);
    CHECK(v.at("removed").empty());
    CHECK(Json::parse(kiln_cli(tmp, "cache list --json").out).at("count").get<size_t>() ==
          files - 1);
  }

  {  // clear removes every entry
    RunResult clear = kiln_cli(tmp, "cache clear");
    INFO(clear.out << clear.err);
    CHECK(clear.status == 0);
    CHECK(clear.out.find("removed " + std::to_string(files - 1) + " entr") != std::string::npos);
    CHECK(entry_files(tmp.cache()) == 0);
    RunResult empty = kiln_cli(tmp, "--json cache list");
    CHECK(Json::parse(empty.out).at("count") == 0);
    CHECK(Json::parse(kiln_cli(tmp, "cache clear --json").out).at("removed") == 0);
  }
}

TEST_CASE("kiln CLI: KILN_CACHE_DIR selects the directory, --cache-dir overrides it", "[cli]") {
  TempDir tmp;
  populate(tmp);
  const size_t files = entry_files(tmp.cache());
  RunResult by_env = run_shell(
      "KILN_CACHE_DIR=" + quote(tmp.cache()) + " " + quote(KILN_CLI_PATH) + " cache stats --json",
      tmp.root());
  REQUIRE(by_env.status == 0);
  CHECK(Json::parse(by_env.out).at("entries").get<size_t>() == files);

  RunResult overridden =
      run_shell("KILN_CACHE_DIR=" + quote(tmp.cache()) + " " + quote(KILN_CLI_PATH) +
                    " cache stats --json --cache-dir " + quote(tmp.root() + "/other"),
                tmp.root());
  REQUIRE(overridden.status == 0);
  CHECK(Json::parse(overridden.out).at("entries") == 0);
  CHECK(Json::parse(overridden.out).at("directory") == tmp.root() + "/other");
}

TEST_CASE("kiln CLI: info prints version, compilers, CPU features and devices", "[cli]") {
  TempDir tmp;
  RunResult info = kiln_cli(tmp, "info");
  INFO(info.out << info.err);
  REQUIRE(info.status == 0);
  CHECK(info.out.find("0.") != std::string::npos);
  CHECK(info.out.find("cpu features") != std::string::npos);
  const int gpus = kiln::cuda::device_count();
  if (gpus == 0)
    CHECK(info.out.find("no CUDA devices") != std::string::npos);
  else
    CHECK(info.out.find(kiln::cuda::properties(0).name) != std::string::npos);
  CHECK(info.out.find(tmp.cache()) != std::string::npos);

  RunResult info_json = kiln_cli(tmp, "info --json");
  REQUIRE(info_json.status == 0);
  Json j = Json::parse(info_json.out);
  CHECK(!j.at("version").get<std::string>().empty());
  CHECK(j.at("cpu_features").get<std::string>().find('+') != std::string::npos);
  CHECK(j.at("threads").get<int>() >= 1);
  CHECK(j.at("compilers").at("external").at("available") == true);
  CHECK(j.at("cuda_devices").size() == static_cast<size_t>(gpus));
  CHECK(j.at("cache").at("directory") == tmp.cache());
  // The GEMM library of each dtype, as the library itself reports it in this process.
  CHECK(info.out.find("gemm float32") != std::string::npos);
  for (kiln::DType dtype : {kiln::DType::Float32, kiln::DType::Float64}) {
    const kiln::jit::GemmPath p = kiln::jit::gemm_path(dtype);
    const Json& g = j.at("gemm").at(std::string(kiln::dtype_name(dtype)));
    CHECK(g.at("library") == p.library);
    CHECK(g.at("version") == p.version);
    CHECK(g.at("kernels") == p.kernels);
    CHECK(g.at("generic") == p.generic);
  }
}

TEST_CASE("kiln CLI: usage errors exit 2, --help exits 0", "[cli]") {
  TempDir tmp;
  for (const char* args : {"", "bogus", "cache", "cache frobnicate", "cache show",
                           "cache list extra", "info --no-such-option", "--cache-dir"}) {
    RunResult r = kiln_cli(tmp, args);
    INFO("kiln " << args << "\n" << r.out << r.err);
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    CHECK(r.err.find("usage: kiln") != std::string::npos);
  }
  RunResult help = kiln_cli(tmp, "--help");
  CHECK(help.status == 0);
  CHECK(help.out.find("cache verify") != std::string::npos);
  RunResult cache_help = kiln_cli(tmp, "cache list --help");
  CHECK(cache_help.status == 0);
  CHECK(cache_help.out.find("show KEY") != std::string::npos);
}

TEST_CASE("kiln CLI: plan replays a dumped step in every kernel order", "[cli]") {
  TempDir tmp;
  // x1 -> x2 -> x3 (10 bytes each), each also read by a 1-byte sink, and a result reading
  // the sinks (the hand-derived case of "planner kernel orders have the hand-derived
  // peaks"): 32 bytes as given, 23 when each sink runs as soon as it frees its input.
  kiln::memory::StepGraphFile file;
  auto value = [&](size_t bytes, int producer, bool output) {
    file.graph.values.push_back({bytes, producer, output, false});
    return static_cast<int>(file.graph.values.size()) - 1;
  };
  auto op = [&](std::vector<int> inputs, size_t bytes, bool output = false) {
    const int v = value(bytes, static_cast<int>(file.graph.kernels.size()), output);
    kiln::memory::PlanKernel k;
    k.inputs = std::move(inputs);
    k.output = v;
    k.cost = 1e-6;
    file.graph.kernels.push_back(k);
    file.kernel_names.push_back("op" + std::to_string(v));
    return v;
  };
  const int leaf = value(1, -1, false);
  file.graph.start_bytes = 1;
  const int x1 = op({leaf}, 10), x2 = op({x1}, 10), x3 = op({x2}, 10);
  op({op({x1}, 1), op({x2}, 1), op({x3}, 1)}, 1, true);
  const std::string path = tmp.root() + "/step.graph";
  kiln::memory::save_step_graph(file, path);

  RunResult r = kiln_cli(tmp, "--json plan " + path + " 23 32 50%releasable");
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  Json j = Json::parse(r.out);
  CHECK(j.at("kernels") == 7);
  CHECK(j.at("orders").at(0).at("order") == "given");
  CHECK(j.at("orders").at(0).at("unplanned_peak") == 32);
  CHECK(j.at("orders").at(1).at("unplanned_peak") == 23);
  const Json& tight = j.at("budgets").at(0);
  CHECK(tight.at("budget_bytes") == 23);
  CHECK(tight.at("chosen") != "given");
  CHECK(tight.at("chosen_feasible") == true);
  // With room for the given order too, the tie in recomputation goes to the lower peak.
  CHECK(j.at("budgets").at(1).at("chosen") == "eager");
  // A share is of what the step releases in the order it runs unbudgeted, the lowest peak:
  // start 1 + kept 1 + 0.5 x (23 - 2), rounded down.
  CHECK(j.at("budgets").at(2).at("budget_bytes") == 12);
  CHECK(j.at("budgets").at(2).at("budget") == "50%releasable");
  // The chosen plan's arena: the six values freed in the step (x1..x3, the sinks) pack with
  // no gap, so the arena is the most of them alive at once, the eager order's peak of 23
  // less the 1-byte leaf beside it. Its reserve is the pool's arena segment (just over
  // 1 MiB), over these budgets, and said so. A budget that cannot be planned has no arena.
  for (int i : {0, 1}) {
    const Json& b = j.at("budgets").at(i);
    INFO(b.dump());
    CHECK(b.at("arena_live_peak") > 0);
    CHECK(b.at("arena_bytes") >= b.at("arena_live_peak"));
    CHECK(b.at("arena_bytes") <= 33);
    CHECK(b.at("reserve_held") == false);
    CHECK(b.at("reserve_bytes") > (1u << 20));
  }
  const Json& roomy = j.at("budgets").at(1);
  CHECK(roomy.at("arena_bytes") == 22);
  CHECK(roomy.at("arena_live_peak") == 22);
  CHECK(roomy.at("fitted_extra_work_pct") == 0);
  CHECK_FALSE(j.at("budgets").at(2).contains("arena_bytes"));
  // The work floor (memory/planner/work_floor.h): none at 23, where the eager order recomputes
  // nothing; at 12 making x2 needs the leaf, x1 and x2 at once (21 bytes), in any order.
  CHECK(tight.at("work_floor_feasible") == true);
  CHECK(tight.at("work_floor_pct") == 0);
  CHECK(j.at("budgets").at(2).at("work_floor_feasible") == false);
  CHECK(j.at("budgets").at(2).at("work_floor_kernel") == 1);

  RunResult text = kiln_cli(tmp, "plan " + path);
  CHECK(text.status == 0);
  CHECK(text.out.find("kiln would run") != std::string::npos);
  CHECK(text.out.find("no plan fits: what must be resident while kernel 1 op2 runs") !=
        std::string::npos);
  RunResult roomy_text = kiln_cli(tmp, "plan " + path + " 32");
  CHECK(roomy_text.out.find("arena 22 B for 22 B alive at once") != std::string::npos);
  CHECK(roomy_text.out.find("over the budget") != std::string::npos);

  std::ofstream(tmp.root() + "/bad.graph") << "kiln-step-graph 1\nbudget x\n";
  RunResult bad = kiln_cli(tmp, "plan " + tmp.root() + "/bad.graph");
  CHECK(bad.status == 1);
  CHECK(bad.err.find("bad.graph:2") != std::string::npos);
  CHECK(kiln_cli(tmp, "plan").status == 2);
}

TEST_CASE("kiln CLI: plan reads BUDGETs with the one budget parser", "[cli][memory]") {
  TempDir tmp;
  kiln::memory::StepGraphFile file;
  file.graph.values.push_back({1, -1, false, false});
  file.graph.values.push_back({10, 0, true, false});
  kiln::memory::PlanKernel k;
  k.inputs = {0};
  k.output = 1;
  k.cost = 1e-6;
  file.graph.kernels.push_back(k);
  file.kernel_names.push_back("op1");
  const std::string path = tmp.root() + "/step.graph";
  kiln::memory::save_step_graph(file, path);

  // Sizes as everywhere else; shares must say they are of the releasable bytes.
  RunResult ok = kiln_cli(tmp, "--json plan " + path + " 4096 1KiB 1KB 20%releasable");
  INFO(ok.out << ok.err);
  REQUIRE(ok.status == 0);
  Json j = Json::parse(ok.out);
  CHECK(j.at("budgets").at(0).at("budget_bytes") == 4096);
  CHECK(j.at("budgets").at(1).at("budget_bytes") == 1024);
  CHECK(j.at("budgets").at(2).at("budget_bytes") == 1000);
  // Without BUDGETs: the three shares of the releasable bytes.
  RunResult defaults = kiln_cli(tmp, "--json plan " + path);
  REQUIRE(defaults.status == 0);
  CHECK(Json::parse(defaults.out).at("budgets").at(0).at("budget") == "50%releasable");

  // A bare fraction is refused before any planning, with the spelling that works; so is a
  // share of device memory, which means nothing for a step read from a file. Exit 2 with
  // the usage, as any other command line that does not parse.
  RunResult bare = kiln_cli(tmp, "plan " + path + " 0.5");
  CHECK(bare.status == 2);
  CHECK(bare.out.empty());
  CHECK(bare.err.find("[kiln plan BUDGET] '0.5' is not accepted") != std::string::npos);
  CHECK(bare.err.find("write 50%releasable") != std::string::npos);
  CHECK(bare.err.find("usage: kiln [--json] plan") != std::string::npos);
  RunResult memory_share = kiln_cli(tmp, "plan " + path + " 50%");
  CHECK(memory_share.status == 2);
  CHECK(memory_share.err.find("write 50%releasable") != std::string::npos);
  CHECK(kiln_cli(tmp, "plan " + path + " none").status == 2);
  CHECK(kiln_cli(tmp, "plan " + path + " 2M").err.find("write MB") != std::string::npos);
}
