// NVRTC through dlopen. The few NVRTC entry points kiln needs are declared here (no CUDA
// header is included), resolved once, and used from any thread: NVRTC programs are
// independent objects, so concurrent compiles need no lock.
#include "jit/nvrtc.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "core/error.h"

namespace kiln::jit {
namespace {

using Program = struct NvrtcProgramOpaque*;
using Result = int;  // nvrtcResult; 0 = NVRTC_SUCCESS

struct Nvrtc {
  void* handle = nullptr;
  std::string path, why_missing, include_dir;
  const char* (*error_string)(Result) = nullptr;
  Result (*version)(int*, int*) = nullptr;
  Result (*num_archs)(int*) = nullptr;
  Result (*archs)(int*) = nullptr;
  Result (*create)(Program*, const char*, const char*, int, const char* const*,
                   const char* const*) = nullptr;
  Result (*destroy)(Program*) = nullptr;
  Result (*compile)(Program, int, const char* const*) = nullptr;
  Result (*ptx_size)(Program, size_t*) = nullptr;
  Result (*ptx)(Program, char*) = nullptr;
  Result (*cubin_size)(Program, size_t*) = nullptr;
  Result (*cubin)(Program, char*) = nullptr;
  Result (*log_size)(Program, size_t*) = nullptr;
  Result (*log)(Program, char*) = nullptr;
  std::vector<int> supported;  // architectures NVRTC can emit CUBIN for, ascending
  std::string version_text;
};

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> toolkit_roots() {
  std::vector<std::string> roots;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* v = std::getenv(var); v && *v) roots.push_back(v);
  roots.push_back("/usr/local/cuda");
  return roots;
}

template <class F>
bool resolve(void* handle, const char* name, F& fn) {
  fn = reinterpret_cast<F>(::dlsym(handle, name));
  return fn != nullptr;
}

const Nvrtc& nvrtc() {
  static const Nvrtc* lib = [] {
    auto* n = new Nvrtc;
    std::vector<std::string> candidates = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    for (const std::string& root : toolkit_roots())
      for (const char* file : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"})
        candidates.push_back(root + "/lib64/" + file);
    for (const std::string& c : candidates) {
      if ((n->handle = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL))) {
        n->path = c;
        break;
      }
      if (n->why_missing.empty()) n->why_missing = ::dlerror();
    }
    if (!n->handle) return n;
    bool ok = resolve(n->handle, "nvrtcGetErrorString", n->error_string) &&
              resolve(n->handle, "nvrtcVersion", n->version) &&
              resolve(n->handle, "nvrtcGetNumSupportedArchs", n->num_archs) &&
              resolve(n->handle, "nvrtcGetSupportedArchs", n->archs) &&
              resolve(n->handle, "nvrtcCreateProgram", n->create) &&
              resolve(n->handle, "nvrtcDestroyProgram", n->destroy) &&
              resolve(n->handle, "nvrtcCompileProgram", n->compile) &&
              resolve(n->handle, "nvrtcGetPTXSize", n->ptx_size) &&
              resolve(n->handle, "nvrtcGetPTX", n->ptx) &&
              resolve(n->handle, "nvrtcGetCUBINSize", n->cubin_size) &&
              resolve(n->handle, "nvrtcGetCUBIN", n->cubin) &&
              resolve(n->handle, "nvrtcGetProgramLogSize", n->log_size) &&
              resolve(n->handle, "nvrtcGetProgramLog", n->log);
    int major = 0, minor = 0, count = 0;
    if (ok) ok = n->version(&major, &minor) == 0 && n->num_archs(&count) == 0 && count > 0;
    if (ok) {
      n->supported.resize(static_cast<size_t>(count));
      ok = n->archs(n->supported.data()) == 0;
      std::sort(n->supported.begin(), n->supported.end());
    }
    if (!ok) {
      n->why_missing = n->path + " lacks the NVRTC functions kiln needs (too old?)";
      n->handle = nullptr;  // left loaded: unloading a library is never needed here
      return n;
    }
    n->version_text = std::to_string(major) + "." + std::to_string(minor);
    // The fp16/bf16 headers, for kernels that include them; kiln's own kernels do not.
    for (const std::string& root : toolkit_roots())
      if (is_dir(root + "/include")) {
        n->include_dir = root + "/include";
        break;
      }
    return n;
  }();
  return *lib;
}

const Nvrtc& require_nvrtc(const char* what) {
  const Nvrtc& n = nvrtc();
  if (!n.handle)
    throw CompileError(std::string("[nvrtc] ") + what + ": NVRTC is not available (" +
                       n.why_missing + "); install the CUDA toolkit or set CUDA_HOME");
  return n;
}

// Options that change the generated code, so part of the cache identity. fmad is off
// because the CPU kernels do not contract a * b + c either (bit-equal results).
const std::vector<std::string>& code_options() {
  static const std::vector<std::string> options = {"--std=c++17", "-default-device",
                                                   "--fmad=false"};
  return options;
}

class NvrtcCompiler : public ImageCompiler {
 public:
  NvrtcCompiler(int arch, bool ptx_only) : arch_(arch), ptx_only_(ptx_only) {}
  std::string identity() const override {
    std::string id = "nvrtc " + nvrtc_version();
    for (const std::string& o : code_options()) id += " " + o;
    return id;
  }
  std::string target() const override {
    return (ptx_only_ ? "compute_" : "sm_") + std::to_string(arch_);
  }
  std::vector<uint8_t> compile(const std::string& source, const std::string& hint) override {
    return nvrtc_compile(source, arch_, hint, ptx_only_).bytes;
  }

 private:
  int arch_;
  bool ptx_only_;
};

}  // namespace

bool nvrtc_available() { return nvrtc().handle != nullptr; }

std::string nvrtc_version() { return require_nvrtc("version").version_text; }

CudaImage nvrtc_compile(const std::string& source, int arch, const std::string& source_path_hint,
                        bool ptx_only) {
  const Nvrtc& n = require_nvrtc("compile");
  CudaImage image;
  const bool known = std::binary_search(n.supported.begin(), n.supported.end(), arch);
  const bool cubin = known && !ptx_only;
  if (!cubin && arch < n.supported.front())
    throw CompileError("[nvrtc] sm_" + std::to_string(arch) +
                       " is older than every architecture NVRTC " + n.version_text +
                       " supports (oldest sm_" + std::to_string(n.supported.front()) + ")");
  image.is_cubin = cubin;
  // PTX runs on GPUs at least as new as its target: the newest supported arch not above the
  // device's.
  int ptx_arch = n.supported.front();
  for (int a : n.supported)
    if (a <= arch) ptx_arch = a;
  image.target = (cubin ? "sm_" : "compute_") + std::to_string(known ? arch : ptx_arch);

  std::vector<std::string> options = code_options();
  options.push_back("--gpu-architecture=" + image.target);
  if (!n.include_dir.empty()) options.push_back("-I" + n.include_dir);
  std::vector<const char*> argv;
  for (const std::string& o : options) argv.push_back(o.c_str());

  Program prog = nullptr;
  if (Result r = n.create(&prog, source.c_str(), source_path_hint.c_str(), 0, nullptr, nullptr))
    throw CompileError(std::string("[nvrtc] cannot create a program for ") + source_path_hint +
                       ": " + n.error_string(r));
  std::unique_ptr<Program, void (*)(Program*)> guard(&prog, [](Program* p) { nvrtc().destroy(p); });
  const Result status = n.compile(prog, static_cast<int>(argv.size()), argv.data());
  if (status != 0) {
    size_t size = 0;
    std::string log;
    if (n.log_size(prog, &size) == 0 && size > 1) {
      log.resize(size);
      n.log(prog, log.data());
      log.resize(size - 1);
    }
    throw CompileError("[nvrtc] " + source_path_hint + " does not compile for " + image.target +
                       " (" + n.error_string(status) + "):\n" + log);
  }
  size_t size = 0;
  Result r = cubin ? n.cubin_size(prog, &size) : n.ptx_size(prog, &size);
  if (r == 0) {
    image.bytes.resize(size);
    r = cubin ? n.cubin(prog, reinterpret_cast<char*>(image.bytes.data()))
              : n.ptx(prog, reinterpret_cast<char*>(image.bytes.data()));
  }
  if (r != 0 || image.bytes.empty())
    throw CompileError("[nvrtc] no " + std::string(cubin ? "CUBIN" : "PTX") + " for " +
                       source_path_hint + ": " + n.error_string(r));
  return image;
}

std::unique_ptr<ImageCompiler> make_nvrtc_compiler(int arch, bool ptx_only) {
  return std::make_unique<NvrtcCompiler>(arch, ptx_only);
}

CudaKernelImage cuda_kernel_image(
    const PrintedCudaKernel& k, const std::vector<std::string>& source_ops, int arch,
    const std::function<void(const std::vector<uint8_t>&)>& load_check) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<ImageCompiler>> compilers;
  ImageCompiler* compiler;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto& slot = compilers[arch];
    if (!slot) slot = make_nvrtc_compiler(arch);
    compiler = slot.get();
  }
  // The module's name: the stages' common prefix (kiln_cu<hash>).
  const std::string& first = k.stages.at(0).entry;
  ImageHandle h = kernel_cache().get_image(k.source, first.substr(0, first.rfind('_')), source_ops,
                                           *compiler, load_check);
  return {h.image, h.record, h.record_mutex};
}

}  // namespace kiln::jit
