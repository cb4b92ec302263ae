// User kernels in the JIT. The printed source wraps the user's body in an entry point that
// binds every declared input and output to a typed pointer and its sizes; the kernel cache
// keys it by that source like any generated kernel. A Custom node holds one payload per
// output; all outputs of a launch share one compiled kernel, and a node computes its own
// output (the others go to scratch), so a memory plan may drop and rerun any of them.
#include "custom_kernel.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>

#include "../core/cuda_driver.h"
#include "../core/error.h"
#include "../core/structural_hash.h"
#include "../core/thread_pool.h"
#include "compiler.h"
#include "hash.h"
#include "kernel_cache.h"
#include "nvrtc.h"
#include "printer_common.h"

namespace kiln::jit {
namespace {

// The element type a pointer is declared with: the generated kernels' storage types (bool
// as unsigned char, int64 as i64). Halves would need the prelude's conversions: not yet.
std::string c_type(DType d) {
  if (d == DType::Float16 || d == DType::BFloat16)
    throw DTypeError(
        "[custom_kernel] " + std::string(dtype_name(d)) +
        " is not supported by custom kernels (float32, float64, integers and bool are)");
  return printing::storage_type(d);
}

// The bindings of every input and output: a typed pointer and its sizes read from `sizes`
// (k-th size array in declaration order), shared by both printers. `buf(i)` prints the
// expression of the i-th buffer pointer.
std::string bindings(const CustomKernelSignature& s, const std::string& restrict_kw,
                     std::string (*buf)(size_t)) {
  std::string out;
  size_t slot = 0, next_size = 0;
  auto bind = [&](const std::string& name, DType dtype, int rank, bool output) {
    const std::string t = c_type(dtype);
    out += "  " + std::string(output ? "" : "const ") + t + "* " + restrict_kw + " " + name +
           " = (" + (output ? "" : "const ") + t + "*)" + buf(slot++) + ";\n";
    out += "  const int " + name + "_ndim = " + std::to_string(rank) + ";\n";
    out += "  const long long " + name + "_shape[" + std::to_string(std::max(rank, 1)) + "] = {";
    for (int d = 0; d < rank; ++d)
      out += (d ? ", " : "") + std::string("kiln_sizes[") + std::to_string(next_size++) + "]";
    if (rank == 0) out += "1";
    out += "};\n";
    out += "  const long long " + name + "_numel = 1";
    for (int d = 0; d < rank; ++d) out += " * " + name + "_shape[" + std::to_string(d) + "]";
    out += ";\n";
    out += "  (void)" + name + "_ndim; (void)" + name + "_shape; (void)" + name + "_numel;\n";
  };
  for (size_t i = 0; i < s.input_names.size(); ++i)
    bind(s.input_names[i], s.input_dtypes[i], s.input_ranks[i], false);
  for (size_t i = 0; i < s.output_names.size(); ++i)
    bind(s.output_names[i], s.output_dtypes[i], s.output_ranks[i], true);
  return out;
}

std::string header_comment(const CustomKernelSignature& s) {
  std::string out = "// kiln custom kernel \"" + s.name + "\"\n// inputs:";
  for (size_t i = 0; i < s.input_names.size(); ++i)
    out += " " + s.input_names[i] + " " + std::string(dtype_name(s.input_dtypes[i])) + "[rank " +
           std::to_string(s.input_ranks[i]) + "]";
  out += "\n// outputs:";
  for (size_t i = 0; i < s.output_names.size(); ++i)
    out += " " + s.output_names[i] + " " + std::string(dtype_name(s.output_dtypes[i])) + "[rank " +
           std::to_string(s.output_ranks[i]) + "]";
  return out + "\ntypedef long long i64;  // the generated kernels' int64 storage type\n";
}

// `#line` makes the compiler's diagnostics point into the user's own text.
std::string user_code(const std::string& code, const std::string& file) {
  return "#line 1 \"" + file + "\"\n" + code + "\n";
}

int total_rank(const CustomKernelSignature& s) {
  int n = 0;
  for (int r : s.input_ranks) n += r;
  for (int r : s.output_ranks) n += r;
  return n;
}

// One compiled use of a user kernel: its source and entry point on one device, plus the
// exact output shapes of the nodes built with it.
struct CustomInstance {
  CustomKernelSignature sig;
  Device device = Device::cpu();
  std::string source;
  std::vector<Shape> output_shapes;
  uint64_t source_hash = 0;
  KernelHandle cpu;                              // CPU kernels
  const std::vector<uint8_t>* image = nullptr;   // CUDA kernels: the image
  std::mutex mutex;                              // guards functions
  std::vector<std::pair<int, void*>> functions;  // CUDA: (device, CUfunction)
};

class CustomOutput final : public CustomKernelOp {
 public:
  CustomOutput(std::shared_ptr<CustomInstance> instance, size_t index)
      : instance_(std::move(instance)), index_(index) {}
  const std::string& name() const override { return instance_->sig.name; }
  uint64_t hash() const override {
    return hash_combine(hash_combine(instance_->source_hash, index_),
                        static_cast<uint64_t>(instance_->device.is_cuda()));
  }
  bool same_as(const CustomKernelOp& other) const override {
    return same_kernel(other) && static_cast<const CustomOutput&>(other).instance_->output_shapes ==
                                     instance_->output_shapes;
  }
  bool same_kernel(const CustomKernelOp& other) const override {
    auto* o = dynamic_cast<const CustomOutput*>(&other);
    if (o == nullptr || o->index_ != index_) return false;
    return o->instance_ == instance_ ||
           (o->instance_->source == instance_->source && o->instance_->device == instance_->device);
  }
  void run(const Node& n, const std::vector<const void*>& inputs, void* out) const override;
  const CustomInstance& instance() const { return *instance_; }
  size_t index() const { return index_; }

 private:
  std::shared_ptr<CustomInstance> instance_;
  size_t index_;
};

// Every size of every input and output, in declaration order (the kernel's `kiln_sizes`).
std::vector<long long> sizes_of(const Node& n, const CustomInstance& c) {
  std::vector<long long> sizes;
  for (const NodePtr& in : n.inputs)
    for (int64_t d : in->shape) sizes.push_back(d);
  for (const Shape& s : c.output_shapes)
    for (int64_t d : s) sizes.push_back(d);
  if (sizes.empty()) sizes.push_back(0);
  return sizes;
}

void CustomOutput::run(const Node& n, const std::vector<const void*>& inputs, void* out) const {
  const CustomInstance& c = *instance_;
  if (c.device.is_cuda())
    throw DeviceError("[custom_kernel] kernel '" + c.sig.name +
                      "' was compiled for CUDA; only the JIT executor runs it there");
  // The other outputs of the launch go to scratch: this node's value is all it keeps.
  std::vector<std::vector<unsigned char>> scratch(c.output_shapes.size());
  std::vector<char*> bufs;
  for (const void* p : inputs) bufs.push_back(static_cast<char*>(const_cast<void*>(p)));
  for (size_t k = 0; k < c.output_shapes.size(); ++k) {
    if (k == index_) {
      bufs.push_back(static_cast<char*>(out));
      continue;
    }
    scratch[k].resize(std::max<size_t>(
        static_cast<size_t>(numel(c.output_shapes[k])) * itemsize(c.sig.output_dtypes[k]), 1));
    bufs.push_back(reinterpret_cast<char*>(scratch[k].data()));
  }
  std::vector<long long> sizes = sizes_of(n, c);
  auto started = std::chrono::steady_clock::now();
  if (c.sig.cpu_tasks.empty()) {
    auto fn = reinterpret_cast<void (*)(char**, const long long*)>(c.cpu.entry());
    fn(bufs.data(), sizes.data());
  } else {
    // The body owns the split's correctness (each task writes its own elements), so the
    // value is the same whatever chunks the pool makes of the range.
    using Entry = long long (*)(char**, const long long*, long long, long long);
    auto fn = reinterpret_cast<Entry>(c.cpu.entry());
    const long long tasks = fn(bufs.data(), sizes.data(), -1, -1);
    thread_pool().parallel_for(tasks, 1, [&](int64_t b, int64_t e) {
      fn(bufs.data(), sizes.data(), static_cast<long long>(b), static_cast<long long>(e));
    });
  }
  count_use(c.cpu.record, c.cpu.record_mutex, 0, 1,
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
                .count());
}

// Loads the instance's image on `device` once and returns its entry point.
void* cuda_function(CustomInstance& c, int device) {
  std::lock_guard lock(c.mutex);
  for (auto& [d, f] : c.functions)
    if (d == device) return f;
  void* module = cuda::load_module(device, *c.image);
  void* f = cuda::get_function(module, custom_entry(c.sig));
  c.functions.emplace_back(device, f);
  return f;
}

void run_on_cuda(Node& node, const CustomOutput& payload) {
  auto& c = const_cast<CustomInstance&>(payload.instance());
  const int device = node.device.index;
  cuda::set_current(device);
  void* fn = cuda_function(c, device);
  std::vector<Buffer::Use> uses;
  uses.reserve(node.inputs.size() + c.output_shapes.size());
  std::vector<void*> pointers;
  for (const NodePtr& in : node.inputs) {
    uses.emplace_back(*in->buffer, false);
    pointers.push_back(uses.back().data());
  }
  std::vector<std::shared_ptr<Buffer>> scratch;
  if (!node.buffer) node.buffer = std::make_shared<Buffer>(node.nbytes(), node.device);
  for (size_t k = 0; k < c.output_shapes.size(); ++k) {
    if (k == payload.index()) {
      uses.emplace_back(*node.buffer, true);
    } else {
      scratch.push_back(std::make_shared<Buffer>(
          std::max<size_t>(
              static_cast<size_t>(numel(c.output_shapes[k])) * itemsize(c.sig.output_dtypes[k]), 1),
          node.device));
      uses.emplace_back(*scratch.back(), true);
    }
    pointers.push_back(uses.back().data());
  }
  // The argument struct: the buffer pointers, then every size (print_custom_cuda's order).
  std::vector<uint64_t> blob;
  for (void* p : pointers) blob.push_back(reinterpret_cast<uint64_t>(p));
  for (long long s : sizes_of(node, c)) blob.push_back(static_cast<uint64_t>(s));
  const int64_t threads = std::max<int64_t>(numel(c.output_shapes.at(0)), 1);
  const int64_t block = c.sig.cuda_block;
  void* params[] = {blob.data()};
  cuda::launch(device, fn, static_cast<unsigned>((threads + block - 1) / block),
               static_cast<unsigned>(block), 0, params);
}

std::string buffer_cpp(size_t i) { return "kiln_buffers[" + std::to_string(i) + "]"; }
std::string buffer_cuda(size_t i) { return "(char*)kiln_args.b[" + std::to_string(i) + "]"; }

}  // namespace

std::string custom_entry(const CustomKernelSignature& s) { return "kiln_custom_" + s.name; }

std::string print_custom_cpp(const CustomKernelSignature& s) {
  std::string out = header_comment(s);
  if (!s.header.empty()) out += user_code(s.header, s.name + ".header");
  if (s.cpu_tasks.empty()) {
    out += "extern \"C\" void " + custom_entry(s) +
           "(char** kiln_buffers, const long long* kiln_sizes) {\n";
    out += bindings(s, "__restrict", &buffer_cpp);
    out += "  (void)kiln_sizes;\n  {\n" + user_code(s.body, s.name + ".cpp") + "  }\n}\n";
    return out;
  }
  // One symbol for both questions the runner asks: how many tasks, and run these tasks.
  out += "extern \"C\" long long " + custom_entry(s) +
         "(char** kiln_buffers, const long long* kiln_sizes, long long kiln_task_begin, long "
         "long kiln_task_end) {\n";
  out += bindings(s, "__restrict", &buffer_cpp);
  out += "  (void)kiln_sizes;\n  if (kiln_task_begin < 0) return (long long)(\n" +
         user_code(s.cpu_tasks, s.name + ".tasks") + "  );\n  {\n" +
         user_code(s.body, s.name + ".cpp") + "  }\n  return 0;\n}\n";
  return out;
}

std::string print_custom_cuda(const CustomKernelSignature& s) {
  std::string out = header_comment(s);
  const size_t buffers = s.input_names.size() + s.output_names.size();
  out += "struct KilnCustomArgs {\n  unsigned long long b[" + std::to_string(buffers) +
         "];\n  long long sizes[" + std::to_string(std::max(total_rank(s), 1)) + "];\n};\n";
  if (!s.header.empty()) out += user_code(s.header, s.name + ".header");
  out += "extern \"C\" __global__ void " + custom_entry(s) + "(const KilnCustomArgs kiln_args) {\n";
  out += "  const long long* kiln_sizes = kiln_args.sizes;\n";
  out += bindings(s, "__restrict__", &buffer_cuda);
  out += "  {\n" + user_code(s.body, s.name + ".cu") + "  }\n}\n";
  return out;
}

std::vector<std::shared_ptr<const CustomKernelOp>> compile_custom_kernel(
    const CustomKernelSignature& s, Device device, const std::vector<Shape>& output_shapes) {
  auto c = std::make_shared<CustomInstance>();
  c->sig = s;
  c->device = device;
  c->output_shapes = output_shapes;
  c->source = device.is_cuda() ? print_custom_cuda(s) : print_custom_cpp(s);
  c->source_hash = hash128(c->source).lo;
  const std::vector<std::string> ops{"custom_kernel:" + s.name};
  try {
    if (device.is_cuda()) {
      const cuda::DeviceProperties p = cuda::properties(device.index);
      static std::mutex mutex;
      static std::map<int, std::unique_ptr<ImageCompiler>> compilers;
      ImageCompiler* compiler;
      {
        std::lock_guard lock(mutex);
        auto& slot = compilers[p.major * 10 + p.minor];
        if (!slot) slot = make_nvrtc_compiler(p.major * 10 + p.minor);
        compiler = slot.get();
      }
      c->image = kernel_cache().get_image(c->source, custom_entry(s), ops, *compiler).image;
    } else {
      c->cpu = kernel_cache().get(c->source, custom_entry(s), ops, cpu_compiler());
    }
  } catch (const CompileError& e) {
    throw CompileError("[custom_kernel] kernel '" + s.name + "' does not compile for " +
                       (device.is_cuda() ? "CUDA" : "the CPU") + ":\n" + e.what());
  }
  std::vector<std::shared_ptr<const CustomKernelOp>> out;
  for (size_t k = 0; k < output_shapes.size(); ++k)
    out.push_back(std::make_shared<const CustomOutput>(c, k));
  return out;
}

void run_custom_kernel(Node& node) {
  if (node.custom == nullptr) throw ValueError("[custom_kernel] node without a kernel");
  // A user kernel (CustomOutput) or one of kiln's own host ops (ops/selection.cpp's sort),
  // which have no device code.
  const auto* payload = dynamic_cast<const CustomOutput*>(node.custom.get());
  if (node.device.is_cuda()) {
    if (payload == nullptr)
      throw DeviceError("[" + node.custom->name() + "] has no CUDA kernel; it runs on the host");
    return run_on_cuda(node, *payload);
  }
  if (!node.buffer) node.buffer = std::make_shared<Buffer>(node.nbytes(), node.device);
  std::vector<const void*> inputs;
  for (const NodePtr& in : node.inputs) inputs.push_back(in->buffer->data());
  try {
    node.custom->run(node, inputs, node.buffer->data());
  } catch (...) {
    node.buffer.reset();
    throw;
  }
}

}  // namespace kiln::jit
