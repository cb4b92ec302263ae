// The default CPU compiler: Clang 16 as a library, in-process, and ORC LLJIT to load the
// resulting object. This is the only file in kiln that includes LLVM or Clang headers.
//
// compile(): the printed source becomes an in-memory file of a fresh CompilerInstance
// (driven with cc1 arguments, so no driver, no disk, no header search), EmitObjAction
// writes the object into a byte vector. The image is what the kernel cache stores.
// load(): each image goes into its own JITDylib of one process-wide LLJIT, so equal kernel
// names in different images never clash, and unloading a module frees exactly its code.
// Undefined symbols (libm: expf, logf, tanhf, ...) resolve from the process through one
// shared "process symbols" JITDylib that every module links against; libkiln links libm.
//
// Flags, and why (the external compiler uses the same set):
//   -O3 -vectorize-loops -vectorize-slp   cc1 does not enable the vectorizers by itself;
//                                         the clang driver adds these at -O2 and above.
//   host CPU name and features            = -march=native; the cache key carries them.
//   -ffp-contract=off                     no FMA contraction: results match the reference
//                                         evaluator and the external compiler more closely.
//   no -fmath-errno                       math builtins may not set errno, so sqrt etc.
//                                         vectorize (cc1's default; the driver would add
//                                         -fmath-errno on Linux).
//   -fwrapv                               integer kernels wrap like the stored two's
//                                         complement types, as the reference does.
//   -mrelocation-model pic                the object links anywhere in the address space.
#include <clang/Basic/Diagnostic.h>
#include <clang/Basic/DiagnosticOptions.h>
#include <clang/Basic/Version.h>
#include <clang/CodeGen/CodeGenAction.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/CompilerInvocation.h>
#include <clang/Frontend/TextDiagnosticPrinter.h>
#include <clang/Lex/PreprocessorOptions.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/ADT/StringMap.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/TargetParser/Triple.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/thread_pool.h"
#include "jit/compiler.h"

namespace kiln::jit {
namespace {

const std::vector<std::string> kFlags = {
    "-std=c++17",        "-O3",     "-vectorize-loops",   "-vectorize-slp",
    "-ffp-contract=off", "-fwrapv", "-mrelocation-model", "pic",
    "-pic-level",        "2"};
// The quick tier (KILN_JIT_TIERS): no optimisation passes at all. The printed kernels'
// floating point is IEEE without contraction at every level, so a kernel without a
// vectorized float reduction computes the same bits as its -O3 build (the executor sends
// only those to the quick tier).
const std::vector<std::string> kQuickFlags = {
    "-std=c++17",         "-O0", "-ffp-contract=off", "-fwrapv",
    "-mrelocation-model", "pic", "-pic-level",        "2"};

// Caps concurrent compiles at the host thread count: each compile holds a CompilerInstance
// and its module (a few MB), so more compiles than cores would only raise peak memory.
class CompileSlots {
 public:
  explicit CompileSlots(unsigned slots) : free_(std::max(1u, slots)) {}
  void acquire() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return free_ > 0; });
    --free_;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++free_;
    }
    ready_.notify_one();
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  unsigned free_;
};

CompileSlots& compile_slots() {
  static CompileSlots slots(static_cast<unsigned>(usable_cpus()));
  return slots;
}

void initialize_llvm() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
  });
}

struct HostTarget {
  std::string triple;
  std::string cpu;
  std::vector<std::string> features;  // "+avx2", "-avx512f", ... sorted
};

const HostTarget& host_target() {
  static const HostTarget target = [] {
    HostTarget t;
    t.triple = llvm::sys::getProcessTriple();
    t.cpu = llvm::sys::getHostCPUName().str();
    // LLVM names a CPU it does not know (newer than LLVM 16, or hidden by a hypervisor)
    // "generic", which Clang's x86 target rejects; the features below still describe it,
    // so the baseline x86 CPU plus those features is -march=native, as the clang driver
    // does it.
    if (t.cpu.empty() || t.cpu == "generic") {
      const llvm::Triple triple(t.triple);
      if (triple.getArch() == llvm::Triple::x86_64)
        t.cpu = "x86-64";
      else if (triple.getArch() == llvm::Triple::x86)
        t.cpu = "i686";
    }
    llvm::StringMap<bool> map;
    if (llvm::sys::getHostCPUFeatures(map)) {
      for (const auto& entry : map)
        t.features.push_back((entry.second ? "+" : "-") + entry.first().str());
    }
    std::sort(t.features.begin(), t.features.end());
    return t;
  }();
  return target;
}

std::string join(const std::vector<std::string>& words, const char* sep) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : sep) + w;
  return out;
}

// One LLJIT for the process. Never destroyed: modules held by static caches may outlive
// any static destructor order we could choose, and the OS reclaims everything at exit.
struct ProcessJit {
  std::unique_ptr<llvm::orc::LLJIT> jit;
  llvm::orc::JITDylib* process_symbols = nullptr;
  std::mutex mutex;  // guards module creation, lookup and removal
  uint64_t next_module = 0;
  std::mutex errors_mutex;
  std::string session_errors;  // errors ORC reports outside a lookup's own result

  std::string take_session_errors() {
    std::lock_guard<std::mutex> lock(errors_mutex);
    std::string out;
    out.swap(session_errors);
    return out;
  }
};

ProcessJit& process_jit() {
  static ProcessJit* instance = [] {
    initialize_llvm();
    auto made = llvm::orc::LLJITBuilder().create();
    if (!made)
      throw CompileError("[jit] cannot create the LLVM JIT: " + llvm::toString(made.takeError()));
    auto* p = new ProcessJit;
    p->jit = std::move(*made);
    auto& es = p->jit->getExecutionSession();
    // ORC's default reporter prints to stderr; keep the text for the next error message.
    es.setErrorReporter([p](llvm::Error error) {
      std::string text = llvm::toString(std::move(error));
      std::lock_guard<std::mutex> lock(p->errors_mutex);
      p->session_errors += text + "\n";
    });
    auto jd = p->jit->createJITDylib("kiln_process_symbols");
    if (!jd) throw CompileError("[jit] " + llvm::toString(jd.takeError()));
    auto generator = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
        p->jit->getDataLayout().getGlobalPrefix());
    if (!generator) throw CompileError("[jit] " + llvm::toString(generator.takeError()));
    jd->addGenerator(std::move(*generator));
    p->process_symbols = &*jd;
    return p;
  }();
  return *instance;
}

class OrcModule final : public LoadedModule {
 public:
  OrcModule(ProcessJit& jit, llvm::orc::JITDylib& dylib) : jit_(jit), dylib_(dylib) {}
  ~OrcModule() override {
    std::lock_guard<std::mutex> lock(jit_.mutex);
    llvm::consumeError(jit_.jit->getExecutionSession().removeJITDylib(dylib_));
  }
  void* symbol(const std::string& name) override {
    std::lock_guard<std::mutex> lock(jit_.mutex);
    auto address = jit_.jit->lookup(dylib_, name);
    if (!address) {
      std::string why = llvm::toString(address.takeError());
      std::string more = jit_.take_session_errors();
      throw CompileError("[jit] symbol '" + name + "' not available in the loaded kernel module: " +
                         why + (more.empty() ? "" : "\n" + more));
    }
    return address->toPtr<void*>();
  }

 private:
  ProcessJit& jit_;
  llvm::orc::JITDylib& dylib_;
};

class LlvmCompiler final : public CpuCompiler {
 public:
  /// The full build with `quick` as its quick tier (nullptr for a quick compiler itself).
  LlvmCompiler(const std::vector<std::string>& flags, std::unique_ptr<LlvmCompiler> quick)
      : flags_(flags), quick_(std::move(quick)) {
    initialize_llvm();
    // "host-features": images made before the host's features reached the code generator
    // (only the CPU's name did) must not be reused from a cache.
    identity_ = std::string("clang ") + CLANG_VERSION_STRING + " " + host_target().triple + " " +
                join(flags_, " ") + " host-features";
  }

  CpuCompiler* quick_compiler() override { return quick_.get(); }

  std::string name() const override { return "llvm"; }
  std::string identity() const override { return identity_; }

  std::vector<uint8_t> compile(const std::string& source,
                               const std::string& source_path_hint) override {
    // Each compile has its own CompilerInstance; Clang's global state (option tables,
    // target registry) is read-only here, so compiles run concurrently, at most one per
    // core (compile_slots) to bound peak memory.
    compile_slots().acquire();
    struct Release {
      ~Release() { compile_slots().release(); }
    } release;
    const HostTarget& target = host_target();
    // Diagnostics name the saved copy of the source, so the user can open what failed.
    const std::string file = source_path_hint.empty() ? "kiln_kernel.cpp" : source_path_hint;

    std::string log;
    llvm::raw_string_ostream log_stream(log);
    llvm::IntrusiveRefCntPtr<clang::DiagnosticOptions> diag_options =
        new clang::DiagnosticOptions();
    diag_options->ShowColors = false;
    auto* printer = new clang::TextDiagnosticPrinter(log_stream, diag_options.get());

    clang::CompilerInstance ci;
    ci.createDiagnostics(printer, /*ShouldOwnClient=*/true);
    // "N errors generated." goes to the verbose stream, stderr by default.
    ci.setVerboseOutputStream(log_stream);

    std::vector<const char*> args = {
        "-triple",       target.triple.c_str(),  "-emit-obj", "-nostdsysteminc",
        "-nobuiltininc", "-discard-value-names", "-fno-rtti"};
    for (const auto& flag : flags_) args.push_back(flag.c_str());
    args.insert(args.end(), {"-x", "c++", file.c_str()});
    bool ok =
        clang::CompilerInvocation::CreateFromArgs(ci.getInvocation(), args, ci.getDiagnostics());
    std::vector<uint8_t> image;
    if (ok) {
      ci.getTargetOpts().CPU = target.cpu;
      // FeaturesAsWritten, as cc1 -target-feature sets it: Features is recomputed from it
      // when the target is made, and anything set there alone is dropped.
      ci.getTargetOpts().FeaturesAsWritten = target.features;
      // The preprocessor takes ownership of the buffer (RetainRemappedFileBuffers=false).
      ci.getPreprocessorOpts().addRemappedFile(
          file, llvm::MemoryBuffer::getMemBufferCopy(source, file).release());
      llvm::SmallVector<char, 0> object;
      ci.setOutputStream(std::make_unique<llvm::raw_svector_ostream>(object));
      clang::EmitObjAction action;
      ok = ci.ExecuteAction(action) && !ci.getDiagnostics().hasErrorOccurred();
      image.assign(object.begin(), object.end());
    }
    log_stream.flush();
    if (!ok || image.empty())
      throw CompileError("[jit] clang failed to compile kernel source " + file + "\n" + log);
    return image;
  }

  // A full compile and load of a small kernel with float, double and integer vector loops:
  // the code generator makes its type tables (SelectionDAG's value types, ...) as
  // function-local statics on first use, and these die at exit before any exit handler
  // registered earlier runs, so a background compile must never be the one to make them.
  void warm_up() override {
    std::call_once(warmed_, [this] {
      static const char* const kSource =
          "extern \"C\" void kiln_warm_up(float* __restrict a, const double* __restrict b,\n"
          "                              long long* __restrict c, long n) {\n"
          "  for (long i = 0; i < n; ++i) {\n"
          "    a[i] = a[i] * 2.0f + (float)b[i];\n"
          "    c[i] = c[i] * 3 + (long long)(a[i] > 0.0f);\n"
          "  }\n"
          "}\n";
      try {
        std::unique_ptr<LoadedModule> module = load(compile(kSource, "kiln_warm_up.cpp"));
        module->symbol("kiln_warm_up");
      } catch (const std::exception&) {
        // A compiler that cannot build this cannot build kernels either; that error is
        // reported by the compile that needs it.
      }
    });
  }

  std::unique_ptr<LoadedModule> load(const std::vector<uint8_t>& image) override {
    if (image.empty()) throw CompileError("[jit] cannot load an empty kernel image");
    ProcessJit& jit = process_jit();
    std::lock_guard<std::mutex> lock(jit.mutex);
    auto dylib = jit.jit->createJITDylib("kiln_module_" + std::to_string(jit.next_module++));
    if (!dylib) throw CompileError("[jit] " + llvm::toString(dylib.takeError()));
    dylib->addToLinkOrder(*jit.process_symbols);
    llvm::StringRef bytes(reinterpret_cast<const char*>(image.data()), image.size());
    if (auto error = jit.jit->addObjectFile(
            *dylib, llvm::MemoryBuffer::getMemBufferCopy(bytes, "kiln_kernel.o"))) {
      std::string why = llvm::toString(std::move(error));
      llvm::consumeError(jit.jit->getExecutionSession().removeJITDylib(*dylib));
      throw CompileError("[jit] cannot load kernel image: " + why);
    }
    return std::make_unique<OrcModule>(jit, *dylib);
  }

 private:
  std::vector<std::string> flags_;
  std::unique_ptr<LlvmCompiler> quick_;
  std::string identity_;
  std::once_flag warmed_;
};

}  // namespace

namespace detail {

std::unique_ptr<CpuCompiler> make_llvm_compiler() {
  return std::make_unique<LlvmCompiler>(kFlags,
                                        std::make_unique<LlvmCompiler>(kQuickFlags, nullptr));
}

std::string llvm_host_cpu_features() {
  const HostTarget& target = host_target();
  std::vector<std::string> enabled;
  for (const auto& f : target.features)
    if (f[0] == '+') enabled.push_back(f);
  return target.cpu + " " + join(enabled, ",");
}

}  // namespace detail

}  // namespace kiln::jit
