#include "cublas.h"

#include <dlfcn.h>

#include <climits>
#include <memory>
#include <mutex>
#include <vector>

#include "../core/cuda_driver.h"
#include "../core/error.h"

namespace kiln::jit {
namespace {

// The few cuBLAS declarations kiln needs (cublas_api.h, library_types.h); no CUDA header is
// included so that kiln builds without the toolkit.
using Status = int;
using Handle = void*;
constexpr Status kSuccess = 0;
constexpr int kOpN = 0, kOpT = 1;                            // cublasOperation_t
constexpr int kR32F = 0, kR64F = 1, kR16F = 2, kR16BF = 14;  // cudaDataType
constexpr int kCompute32F = 68, kCompute64F = 70;            // cublasComputeType_t
constexpr int kGemmDefault = -1;                             // cublasGemmAlgo_t

struct Library {
  bool loaded = false;
  std::string status;
  Status (*create)(Handle*) = nullptr;
  Status (*set_stream)(Handle, void*) = nullptr;
  Status (*set_math_mode)(Handle, int) = nullptr;
  Status (*gemm)(Handle, int, int, int, int, int, const void*, const void*, int, int, long long,
                 const void*, int, int, long long, const void*, void*, int, int, long long, int,
                 int, int) = nullptr;
  const char* (*status_name)(Status) = nullptr;  // optional: not in every version
  std::mutex mutex;  // guards handles; cuBLAS handles are not safe to share across threads
  std::vector<Handle> handles;
};

Library& library() {
  // Loaded once, never unloaded (handles and their workspaces live as long as the process).
  static Library* const lib = [] {
    auto* l = new Library();
    const char* const candidates[] = {"libcublas.so.13",
                                      "libcublas.so.12",
                                      "libcublas.so",
                                      "/usr/local/cuda/lib64/libcublas.so.13",
                                      "/usr/local/cuda/lib64/libcublas.so.12",
                                      "/usr/local/cuda/lib64/libcublas.so"};
    std::string errors;
    for (const char* name : candidates) {
      void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        const char* why = dlerror();
        if (errors.empty()) errors = why != nullptr ? why : name;
        continue;
      }
      l->create = reinterpret_cast<decltype(l->create)>(dlsym(handle, "cublasCreate_v2"));
      l->set_stream =
          reinterpret_cast<decltype(l->set_stream)>(dlsym(handle, "cublasSetStream_v2"));
      l->gemm = reinterpret_cast<decltype(l->gemm)>(dlsym(handle, "cublasGemmStridedBatchedEx"));
      l->set_math_mode =
          reinterpret_cast<decltype(l->set_math_mode)>(dlsym(handle, "cublasSetMathMode"));
      l->status_name =
          reinterpret_cast<decltype(l->status_name)>(dlsym(handle, "cublasGetStatusName"));
      if (l->create == nullptr || l->set_stream == nullptr || l->gemm == nullptr) {
        errors = std::string(name) +
                 " lacks cublasCreate_v2/cublasSetStream_v2/"
                 "cublasGemmStridedBatchedEx";
        dlclose(handle);
        continue;
      }
      l->loaded = true;
      l->status = name;
      return l;
    }
    l->status = "no cuBLAS found (" + errors + ")";
    return l;
  }();
  return *lib;
}

std::string status_text(const Library& l, Status s) {
  const char* name = l.status_name != nullptr ? l.status_name(s) : nullptr;
  return name != nullptr ? name : "cuBLAS status " + std::to_string(s);
}

// The handle of `device`, made on first use and bound to kiln's stream. Caller holds l.mutex.
Handle handle_for(Library& l, int device) {
  if (l.handles.size() <= static_cast<size_t>(device)) {
    l.handles.resize(static_cast<size_t>(device) + 1, nullptr);
  }
  Handle& h = l.handles[static_cast<size_t>(device)];
  if (h == nullptr) {
    Handle created = nullptr;
    if (Status s = l.create(&created); s != kSuccess) {
      throw DeviceError("[cublas] cublasCreate_v2 failed on cuda:" + std::to_string(device) + ": " +
                        status_text(l, s));
    }
    if (Status s = l.set_stream(created, cuda::stream(device)); s != kSuccess) {
      throw DeviceError("[cublas] cublasSetStream_v2 failed on cuda:" + std::to_string(device) +
                        ": " + status_text(l, s));
    }
    // CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION: split-K partial
    // sums of float16/bfloat16 products stay in float32, as the header promises.
    constexpr int kDefaultMathNoReducedReduction = 0 | 16;
    if (l.set_math_mode != nullptr) {
      if (Status s = l.set_math_mode(created, kDefaultMathNoReducedReduction); s != kSuccess) {
        throw DeviceError("[cublas] cublasSetMathMode failed on cuda:" + std::to_string(device) +
                          ": " + status_text(l, s));
      }
    }
    h = created;
  }
  return h;
}

int data_type(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return kR32F;
    case DType::Float16:
      return kR16F;
    case DType::BFloat16:
      return kR16BF;
    case DType::Float64:
      return kR64F;
    default:
      throw DTypeError("[cublas_gemm] dtype " + std::string(dtype_name(dtype)) +
                       " is not supported; expected float32, float16, bfloat16 or float64");
  }
}

int as_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) {
    throw ValueError("[cublas_gemm] " + std::string(what) + " = " + std::to_string(v) +
                     " is outside 0.." + std::to_string(INT_MAX));
  }
  return static_cast<int>(v);
}

}  // namespace

bool cublas_available() { return library().loaded; }

std::string cublas_status() { return library().status; }

void cublas_gemm(int device, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                 int64_t k, const void* a, int64_t lda, int64_t stride_a, const void* b,
                 int64_t ldb, int64_t stride_b, void* c, int64_t ldc, int64_t stride_c,
                 int64_t batch, float alpha, float beta, std::optional<DType> c_dtype) {
  const int type = data_type(dtype);
  const DType out = c_dtype.value_or(dtype);
  const bool half_in = dtype == DType::Float16 || dtype == DType::BFloat16;
  if (out != dtype && !(half_in && out == DType::Float32)) {
    throw DTypeError("[cublas_gemm] a " + std::string(dtype_name(dtype)) +
                     " product cannot write a " + std::string(dtype_name(out)) +
                     " result; expected the operands' dtype, or float32 for float16/bfloat16");
  }
  const int c_type = data_type(out);
  const int im = as_int(m, "m"), in = as_int(n, "n"), ik = as_int(k, "k");
  const int ilda = as_int(lda, "lda"), ildb = as_int(ldb, "ldb"), ildc = as_int(ldc, "ldc");
  const int ibatch = as_int(batch, "batch");
  if (im == 0 || in == 0 || ibatch == 0) return;

  Library& l = library();
  if (!l.loaded) {
    throw DeviceError("[cublas_gemm] " + l.status +
                      "; install the CUDA toolkit's cuBLAS or use the generated GEMM");
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the row-major buffers,
  // read column-major, are already the transposes, so B goes first and m, n swap.
  const int op_first = trans_b ? kOpT : kOpN;
  const int op_second = trans_a ? kOpT : kOpN;
  const bool f64 = dtype == DType::Float64;
  const double alpha64 = alpha, beta64 = beta;
  const void* alpha_ptr = f64 ? static_cast<const void*>(&alpha64) : &alpha;
  const void* beta_ptr = f64 ? static_cast<const void*>(&beta64) : &beta;

  std::lock_guard lock(l.mutex);
  cuda::set_current(device);
  Handle h = handle_for(l, device);
  Status s = l.gemm(h, op_first, op_second, in, im, ik, alpha_ptr, b, type, ildb, stride_b, a, type,
                    ilda, stride_a, beta_ptr, c, c_type, ildc, stride_c, ibatch,
                    f64 ? kCompute64F : kCompute32F, kGemmDefault);
  if (s != kSuccess) {
    throw DeviceError("[cublas_gemm] cublasGemmStridedBatchedEx failed for " +
                      std::string(dtype_name(dtype)) + " m=" + std::to_string(m) +
                      " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                      " batch=" + std::to_string(batch) + " lda=" + std::to_string(lda) +
                      " ldb=" + std::to_string(ldb) + " ldc=" + std::to_string(ldc) +
                      (trans_a ? " trans_a" : "") + (trans_b ? " trans_b" : "") +
                      " on cuda:" + std::to_string(device) + ": " + status_text(l, s));
  }
}

}  // namespace kiln::jit
