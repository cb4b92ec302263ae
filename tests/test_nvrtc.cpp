// The CUDA printer and NVRTC, without a GPU: kernels of every kind and dtype family are
// printed for CUDA and compiled for sm_80 and sm_90, and so is every kernel the random
// differential graphs and the op registry plan (compiled in batches through the kernel
// cache, so a warm run compiles nothing). Skips with a visible warning without NVRTC.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "core/error.h"
#include "frontend/kiln.h"
#include "jit/fuse.h"
#include "jit/kernel_ir.h"
#include "jit/nvrtc.h"
#include "jit/printer_cuda.h"
#include "jit/simplify.h"
#include "tests/op_harness.h"
#include "tests/random_graph.h"

using namespace kiln;
using jit::PrintedCudaKernel;

namespace {

bool have_nvrtc() {
  if (jit::nvrtc_available()) return true;
  WARN("NVRTC is not available (no libnvrtc.so); [nvrtc] checks skipped");
  return false;
}

// The kernels the JIT executor would generate for `outs` (simplify, fuse, lower; nothing
// is evaluated). Library GEMM groups generate no kernel.
std::vector<jit::KernelIR> plan_kernels(const std::vector<Tensor>& outs) {
  std::vector<Node*> roots;
  for (const Tensor& t : outs)
    if (!t.node()->is_evaluated()) roots.push_back(t.node().get());
  std::vector<jit::KernelIR> irs;
  if (roots.empty()) return irs;
  jit::SimplifyResult s = jit::simplify(pending_subgraph(roots), roots);
  std::unordered_set<Node*> wanted;
  for (Node* r : jit::aliased_outputs(s, roots)) wanted.insert(r);
  for (const jit::FusionGroup& g : jit::fuse(s.schedule, wanted).groups)
    if (!g.library) irs.push_back(jit::lower(g).ir);
  return irs;
}

bool is_elf(const std::vector<uint8_t>& b) {
  return b.size() > 4 && b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F';
}

// Compiles `k` for sm_80 and sm_90 (directly, not cached) and checks both are CUBIN.
void compile_both(const PrintedCudaKernel& k) {
  for (int arch : {80, 90}) {
    INFO("sm_" << arch << "\n" << k.source);
    jit::CudaImage image = jit::nvrtc_compile(k.source, arch, "test.cu");
    CHECK(image.is_cubin);
    CHECK(image.target == "sm_" + std::to_string(arch));
    CHECK(is_elf(image.bytes));
  }
}

PrintedCudaKernel only_kernel(const Tensor& out) {
  std::vector<jit::KernelIR> irs = plan_kernels({out});
  REQUIRE(irs.size() == 1);
  return jit::print_cuda(irs[0]);
}

Tensor input(const Shape& shape, DType dtype, double scale = 1.0) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = scale * static_cast<double>(static_cast<int64_t>(i % 7) - 3);
  Tensor t = cast(from_vector(v, shape), dtype);
  t.eval();  // an input buffer of that dtype, not a fused cast
  return t;
}

// Several printed kernels as one NVRTC program: the prelude once, each kernel's part in its
// own namespace (their KArgs/Acc types would clash). Entry names are unique per source.
std::string batch_source(const std::vector<const PrintedCudaKernel*>& ks) {
  const std::string open = "namespace kiln {\nstruct KArgs";
  std::string out;
  for (size_t i = 0; i < ks.size(); ++i) {
    const std::string& s = ks[i]->source;
    size_t at = s.find(open);
    if (i == 0) out += s.substr(0, at);
    out += "namespace kiln {\nnamespace k" + std::to_string(i) + " {\nstruct KArgs" +
           s.substr(at + open.size());
    out += "}\n";
  }
  return out;
}

struct CorpusTiming {
  size_t kernels = 0, batches = 0;
  double ms = 0;
};

// Compiles every kernel of `ks` for sm_80 and sm_90 in batches through the kernel cache,
// one thread per architecture (NVRTC programs are independent); a failing batch is retried
// kernel by kernel to name the kernel that does not compile.
void compile_corpus(const std::vector<PrintedCudaKernel>& ks, CorpusTiming& t,
                    bool ptx_only = false) {
  constexpr size_t kBatch = 24;
  auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<const PrintedCudaKernel*>> batches;
  for (size_t b = 0; b < ks.size(); b += kBatch) {
    batches.emplace_back();
    for (size_t i = b; i < std::min(ks.size(), b + kBatch); ++i) batches.back().push_back(&ks[i]);
  }
  const int archs[] = {80, 90};
  std::vector<std::pair<int, size_t>> failed;  // (arch, batch)
  std::mutex failed_mutex;
  std::vector<std::thread> threads;
  for (int arch : archs)
    threads.emplace_back([&, arch] {
      std::unique_ptr<jit::ImageCompiler> compiler = jit::make_nvrtc_compiler(arch, ptx_only);
      for (size_t b = 0; b < batches.size(); ++b) {
        try {
          jit::kernel_cache().get_image(batch_source(batches[b]), "nvrtc_test_batch", {"test"},
                                        *compiler);
        } catch (const CompileError&) {
          std::lock_guard<std::mutex> lock(failed_mutex);
          failed.push_back({arch, b});
        }
      }
    });
  for (std::thread& th : threads) th.join();
  for (const auto& [arch, b] : failed) {
    for (const PrintedCudaKernel* k : batches[b]) {
      INFO("sm_" << arch << " kernel:\n" << k->source);
      REQUIRE_NOTHROW(jit::nvrtc_compile(k->source, arch, "corpus.cu", ptx_only));
    }
    FAIL("the batch fails but each kernel compiles alone:\n" << batch_source(batches[b]));
  }
  t.batches += 2 * batches.size();
  t.kernels += ks.size();
  t.ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

void add_unique(std::vector<PrintedCudaKernel>& ks, std::unordered_set<std::string>& seen,
                const std::vector<jit::KernelIR>& irs) {
  for (const jit::KernelIR& ir : irs) {
    PrintedCudaKernel k = jit::print_cuda(ir);
    if (seen.insert(k.stages[0].entry).second) ks.push_back(std::move(k));
  }
}

}  // namespace

TEST_CASE("nvrtc: elementwise kernels use vector loads and compile for sm_80 and sm_90",
          "[nvrtc]") {
  if (!have_nvrtc()) return;
  Tensor x = input({4, 8}, DType::Float32), y = input({4, 8}, DType::Float32, 0.5);
  PrintedCudaKernel k = only_kernel(exp(x) * y + tanh(x) - sigmoid(y));
  REQUIRE(k.stages.size() == 1);
  CHECK(k.stages[0].extent == jit::CudaStage::Extent::Work);
  CHECK(k.scratch == PrintedCudaKernel::Scratch::None);
  CHECK(k.source.find("load_vec<float, 4>") != std::string::npos);
  CHECK(k.source.find("#include") == std::string::npos);
  compile_both(k);
  // A transposed operand is not contiguous along the last dim: scalar reads.
  PrintedCudaKernel t = only_kernel(permute(input({8, 4}, DType::Float32), {1, 0}) + x);
  compile_both(t);
}

TEST_CASE("nvrtc: float16, bfloat16 and float64 kernels compile", "[nvrtc]") {
  if (!have_nvrtc()) return;
  Tensor h = input({3, 16}, DType::Float16), b = input({3, 16}, DType::BFloat16);
  compile_both(only_kernel(cast(h * h + 1.5, DType::BFloat16) + b));
  compile_both(only_kernel(sum(h * h, {1})));
  compile_both(only_kernel(max(b, {0})));
  compile_both(only_kernel(cast(input({5}, DType::Float64) / 3.0, DType::Float16)));
  PrintedCudaKernel k = only_kernel(exp(h));
  CHECK(k.source.find("cvt.rn.f16.f32") != std::string::npos);
}

TEST_CASE("nvrtc: integer and bool kernels compile", "[nvrtc]") {
  if (!have_nvrtc()) return;
  Tensor i8 = input({2, 16}, DType::Int8), i64 = input({2, 16}, DType::Int64),
         u8 = input({2, 16}, DType::UInt8);
  compile_both(only_kernel(floor_div(i64, 3) + mod(cast(i8, DType::Int64), 5) * pow(i64, 2)));
  compile_both(only_kernel(bitwise_xor(u8, cast(i8, DType::UInt8)) | u8));
  compile_both(only_kernel(cast(input({2, 16}, DType::Float32, 1e9), DType::Int32)));
  compile_both(only_kernel(logical_and(i8 > 0, u8 != 2)));
  compile_both(only_kernel(sum(cast(i8, DType::Int32), {1})));
  for (const jit::KernelIR& ir : plan_kernels({argmax(input({3, 5}, DType::Float32), 1)}))
    compile_both(jit::print_cuda(ir));
}

TEST_CASE("nvrtc: reductions, scatters and rank 0 print their stages and compile", "[nvrtc]") {
  if (!have_nvrtc()) return;
  PrintedCudaKernel rows = only_kernel(sum(input({6, 40}, DType::Float32), {1}));
  REQUIRE(rows.stages.size() == 1);
  CHECK(rows.source.find("warp_reduce") != std::string::npos);
  compile_both(rows);

  PrintedCudaKernel whole = only_kernel(sum(input({6, 40}, DType::Float32)));
  REQUIRE(whole.stages.size() == 2);
  CHECK(whole.scratch == PrintedCudaKernel::Scratch::PerBlock);
  CHECK(whole.scratch_elem_bytes == 4);
  CHECK(whole.stages[1].single_block);
  CHECK(whole.stages[1].extent == jit::CudaStage::Extent::Partials);
  compile_both(whole);

  PrintedCudaKernel scatter = only_kernel(sum(input({6, 5}, DType::Float16), {0}));
  REQUIRE(scatter.stages.size() == 3);
  CHECK(scatter.scratch == PrintedCudaKernel::Scratch::PerOutput);
  CHECK(scatter.scratch_elem_bytes == 8);
  CHECK(scatter.stages[0].extent == jit::CudaStage::Extent::Output);
  CHECK(scatter.stages[1].extent == jit::CudaStage::Extent::Work);
  compile_both(scatter);

  Tensor s = input({}, DType::Float32);
  compile_both(only_kernel(s * 2 + 1));
  compile_both(only_kernel(max(input({}, DType::Int32))));
}

TEST_CASE("nvrtc: rows kernels (reductions as row stages) print and compile", "[nvrtc][rows]") {
  if (!have_nvrtc()) return;
  Tensor x = input({6, 40}, DType::Float32);
  PrintedCudaKernel sm = only_kernel(softmax(x, 1));
  CHECK(sm.source.find("kiln CUDA kernel: rows") != std::string::npos);
  CHECK(sm.source.find("struct Acc1") != std::string::npos);  // max, then sum
  CHECK(sm.source.find("block_reduce<Acc0>") != std::string::npos);
  CHECK(sm.source.find("__shfl_sync") != std::string::npos);
  compile_both(sm);
  Tensor x4 = input({2, 3, 5, 7}, DType::Float32);
  compile_both(only_kernel(
      nn::functional::layer_norm(x4, Shape{5, 7}, input({5, 7}, DType::Float32), Tensor(), 1e-5)));
  compile_both(only_kernel(log_softmax(input({3, 9}, DType::BFloat16), 1)));
  compile_both(only_kernel(var(input({4, 9}, DType::Float64), {1})));
  Tensor xi = input({7, 13}, DType::Int32);
  compile_both(only_kernel(max(xi, {1}, true) - min(xi, {1}, true)));
  compile_both(only_kernel(nn::mse_loss(input({50}, DType::Float32), input({50}, DType::Float32))));
  Tensor target = from_vector(std::vector<int64_t>{1, 0, 3}, {3});
  for (const jit::KernelIR& ir :
       plan_kernels({nn::cross_entropy(input({3, 4}, DType::Float32), target)}))
    compile_both(jit::print_cuda(ir));
}

TEST_CASE("nvrtc: random numbers and index errors compile", "[nvrtc]") {
  if (!have_nvrtc()) return;
  Generator gen(7);
  compile_both(only_kernel(rand({4, 4}, DType::Float32, gen) + randn({4, 4}, DType::Float64, gen)));
  compile_both(only_kernel(rand({4, 4}, DType::BFloat16, gen)));
  Tensor index = from_vector(std::vector<int64_t>{2, 0, 1});
  PrintedCudaKernel k = only_kernel(index_select(input({3, 4}, DType::Float32), 0, index) * 2);
  CHECK(k.source.find("kiln_index_error(err") != std::string::npos);
  compile_both(k);
  Tensor added = scatter_add(input({3, 4}, DType::Float32), 0,
                             from_vector(std::vector<int64_t>{0, 2, 1, 1}, {1, 4}),
                             input({1, 4}, DType::Float32));
  for (const jit::KernelIR& ir : plan_kernels({added})) compile_both(jit::print_cuda(ir));
}

TEST_CASE(
    "nvrtc: compile errors carry the log and the source path, and unknown archs fall back to PTX",
    "[nvrtc]") {
  if (!have_nvrtc()) return;
  try {
    jit::nvrtc_compile("extern \"C\" __global__ void f() { undefined_thing(); }", 90,
                       "/tmp/kiln_bad.cu");
    FAIL("compiled");
  } catch (const CompileError& e) {
    std::string what = e.what();
    CHECK(what.find("/tmp/kiln_bad.cu") != std::string::npos);
    CHECK(what.find("undefined_thing") != std::string::npos);
  }
  // An architecture newer than NVRTC knows gets PTX for the newest one it supports.
  jit::CudaImage ptx = jit::nvrtc_compile("extern \"C\" __global__ void f() {}", 990, "new.cu");
  CHECK_FALSE(ptx.is_cubin);
  CHECK(ptx.target.rfind("compute_", 0) == 0);
  CHECK(std::string(ptx.bytes.begin(), ptx.bytes.end()).find(".entry f") != std::string::npos);
  CHECK(!jit::nvrtc_version().empty());
}

TEST_CASE("nvrtc: device images are cached per target, in memory and on disk", "[nvrtc][cache]") {
  if (!have_nvrtc()) return;
  PrintedCudaKernel k = only_kernel(input({4, 8}, DType::Float32) * 3);
  auto c80 = jit::make_nvrtc_compiler(80), c90 = jit::make_nvrtc_compiler(90);
  CHECK(jit::KernelCache::key_for(k.source, *c80) != jit::KernelCache::key_for(k.source, *c90));
  CHECK(c90->target() == "sm_90");
  CHECK(c90->identity().find("nvrtc " + jit::nvrtc_version()) == 0);

  std::string dir =
      (std::filesystem::temp_directory_path() / ("kiln_nvrtc_cache_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(dir);
  {
    jit::KernelCache cache(dir, 0);
    jit::ImageHandle a = cache.get_image(k.source, "k", {"mul"}, *c90);
    jit::ImageHandle b = cache.get_image(k.source, "k", {"mul"}, *c90);
    CHECK(a.image == b.image);
    CHECK(is_elf(*a.image));
    CHECK(a.record->target == "sm_90");
    cache.get_image(k.source, "k", {"mul"}, *c80);
    CHECK(cache.stats().kernels_compiled == 2);
    CHECK(cache.stats().memory_hits == 1);
  }
  jit::KernelCache again(dir, 0);
  jit::ImageHandle c = again.get_image(k.source, "k", {"mul"}, *c90);
  CHECK(again.stats().disk_hits == 1);
  CHECK(again.stats().kernels_compiled == 0);
  CHECK(is_elf(*c.image));
  std::vector<std::string> targets;
  for (const jit::KernelRecord& r : again.disk_records()) targets.push_back(r.target);
  std::sort(targets.begin(), targets.end());
  CHECK(targets == std::vector<std::string>{"sm_80", "sm_90"});
  std::filesystem::remove_all(dir);
}

TEST_CASE("nvrtc: an image the driver's load check rejects is discarded and compiled again",
          "[nvrtc][cache]") {
  if (!have_nvrtc()) return;
  PrintedCudaKernel k = only_kernel(input({4, 8}, DType::Float32) * 5);
  auto c90 = jit::make_nvrtc_compiler(90);
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("kiln_nvrtc_load_check_" + std::to_string(::getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  const std::string entry = dir + "/" + jit::KernelCache::key_for(k.source, *c90) + ".kk";
  {
    jit::KernelCache cache(dir, 0);
    cache.get_image(k.source, "k", {"mul"}, *c90);
  }
  REQUIRE(std::filesystem::exists(entry));
  // The driver rejects what the disk holds once (an image for another GPU under this key,
  // say): the entry is discarded and compiled again, and the new image is what is kept.
  int checks = 0;
  auto rejects_first = [&](const std::vector<uint8_t>&) {
    if (checks++ == 0) throw kiln::DeviceError("[cuda] cuModuleLoadData failed: invalid image");
  };
  {
    jit::KernelCache again(dir, 0);
    jit::ImageHandle h = again.get_image(k.source, "k", {"mul"}, *c90, rejects_first);
    CHECK(checks == 2);
    CHECK(is_elf(*h.image));
    CHECK(again.stats().disk_errors == 1);
    CHECK(again.stats().kernels_compiled == 1);
    CHECK(again.stats().disk_hits == 0);
  }
  CHECK(std::filesystem::exists(entry));  // the recompiled image was stored
  // A freshly compiled image the driver rejects is never stored, and its error is thrown.
  std::filesystem::remove_all(dir);
  {
    jit::KernelCache fresh(dir, 0);
    auto rejects = [](const std::vector<uint8_t>&) {
      throw kiln::DeviceError("[cuda] cuModuleLoadData failed: no kernel image for this device");
    };
    CHECK_THROWS_AS(fresh.get_image(k.source, "k", {"mul"}, *c90, rejects), kiln::DeviceError);
  }
  CHECK_FALSE(std::filesystem::exists(entry));
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "nvrtc: every kernel of the differential corpus and the op registry compiles for sm_80 and "
    "sm_90",
    "[nvrtc][corpus]") {
  if (!have_nvrtc()) return;
  std::vector<PrintedCudaKernel> ks;
  std::unordered_set<std::string> seen;
  size_t graphs = 0;
  // 30 graphs keep the cold run short (100 graphs + the registry gave 708 kernels, ~110 ms
  // of NVRTC CPU time each per arch);
  // KILN_NVRTC_CHECK on the differential tests covers the full corpus through the cache.
  for (uint64_t seed = 0; seed < 30; ++seed) {
    test::RandomGraph g = test::build_random_graph(seed);
    add_unique(ks, seen, plan_kernels(g.outputs));
    graphs++;
  }
  for (const test::UnaryCase& c : test::unary_cases())
    for (DType d : c.dtypes) {
      try {
        add_unique(ks, seen, plan_kernels({c.build(input({3, 8}, d))}));
      } catch (const DTypeError&) {
      }
    }
  for (const test::BinaryCase& c : test::binary_cases())
    for (DType d : c.dtypes) {
      try {
        add_unique(ks, seen, plan_kernels({c.build(input({3, 8}, d), input({8}, d, 0.5))}));
      } catch (const DTypeError&) {
      }
    }
  CorpusTiming t;
  compile_corpus(ks, t);
  WARN("[nvrtc] corpus: " << graphs << " random graphs + op registry -> " << t.kernels
                          << " distinct CUDA kernels, " << t.batches
                          << " NVRTC programs for sm_80+sm_90 in " << static_cast<int>(t.ms)
                          << " ms");
}

TEST_CASE(
    "nvrtc: every kernel of the 1,000-graph differential corpus compiles to PTX for compute_80 and "
    "compute_90",
    "[nvrtc][corpus]") {
  if (!have_nvrtc()) return;
  // The same seeds as the differential tests (test_differential.cpp), planned without
  // running. PTX (NVRTC's front end and NVVM, where a printer bug shows) keeps the cold run
  // to a few minutes; the case above takes a subset through ptxas to CUBIN.
  std::vector<PrintedCudaKernel> ks;
  std::unordered_set<std::string> seen;
  int graphs = 0;
  for (uint64_t seed = 0; seed < 1000; ++seed, ++graphs) {
    test::RandomGraph g = test::build_random_graph(seed);
    add_unique(ks, seen, plan_kernels(g.outputs));
  }
  CorpusTiming t;
  compile_corpus(ks, t, true);
  WARN("[nvrtc] PTX corpus: " << graphs << " random graphs -> " << t.kernels
                              << " distinct CUDA kernels, " << t.batches
                              << " NVRTC programs for compute_80+compute_90 in "
                              << static_cast<int>(t.ms) << " ms");
}
