#pragma once
// CPU compilers: turn a printed kernel (self-contained C++, no #include) into a relocatable
// object image, and load such images into the process.
//
// Two implementations share this interface:
//   "llvm"     Clang 16 as a library, in-process (compiler_llvm.cpp); ORC LLJIT loads the
//              object. Only in builds with KILN_WITH_LLVM.
//   "external" the system C++ compiler as a subprocess producing a shared object; dlopen
//              loads it (compiler_external.cpp). Always present.
// Images are plain bytes so that the kernel cache can store them on disk and a later
// process can load them without compiling. No LLVM type appears here: kiln's headers must
// not leak LLVM to code that includes them.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::jit {

/// A compiled module loaded into the process; symbols stay valid while it lives.
class LoadedModule {
 public:
  virtual ~LoadedModule() = default;
  /// Address of an extern "C" symbol; throws CompileError if missing.
  virtual void* symbol(const std::string& name) = 0;
};

/// Turns self-contained C++ source (no #include) into a relocatable object image and loads
/// such images.
class CpuCompiler {
 public:
  virtual ~CpuCompiler() = default;
  /// "llvm" or "external".
  virtual std::string name() const = 0;
  /// Compiler identity and version plus flags, e.g. "clang 16.0.6 -O3 -ffp-contract=off";
  /// part of the cache key.
  virtual std::string identity() const = 0;
  /// Compiles `source`; throws kiln::CompileError whose message contains the compiler log
  /// and `source_path_hint` (where the source is saved).
  virtual std::vector<uint8_t> compile(const std::string& source,
                                       const std::string& source_path_hint) = 0;
  /// Loads an image produced by compile() (possibly in another process, read back from
  /// disk). Throws CompileError when the image cannot be loaded.
  virtual std::unique_ptr<LoadedModule> load(const std::vector<uint8_t>& image) = 0;
  /// The compiler of this one's quick builds (first tier: lower optimisation, bit-identical
  /// results for kernels whose float operations do not depend on vectorization; its own
  /// identity, so its objects never share a key with full builds), or nullptr if none.
  virtual CpuCompiler* quick_compiler() { return nullptr; }
  /// Makes, on the calling thread, what a compile creates once per process on first use
  /// (LLVM's function-local statics), so that a background compile never creates it; see
  /// KernelCache::queue_rebuild. Runs once; a no-op for compilers that run as subprocesses.
  virtual void warm_up() {}
};

/// The compiler named by KILN_CPU_COMPILER ("llvm" | "external"), default llvm when built
/// with it; process-wide, thread-safe. Throws kiln::ValueError for an unknown or
/// unavailable name.
CpuCompiler& cpu_compiler();
/// A compiler by name, or nullptr if this build lacks it.
std::unique_ptr<CpuCompiler> make_cpu_compiler(const std::string& name);
/// Host CPU name and feature string, e.g. "znver4 +avx2,+avx512f,..." (same for both
/// compilers; part of the cache key).
const std::string& host_cpu_features();
/// True when kiln was built with LLVM.
bool have_llvm();

namespace detail {
// Factories and probes behind the functions above; compiler.cpp selects among them.
// The LLVM ones are defined only in builds with LLVM (compiler_llvm.cpp).
std::unique_ptr<CpuCompiler> make_external_compiler();
std::unique_ptr<CpuCompiler> make_llvm_compiler();
std::string llvm_host_cpu_features();
}  // namespace detail

}  // namespace kiln::jit
