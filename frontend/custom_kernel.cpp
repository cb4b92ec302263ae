// Custom kernels (custom_kernel.h): validation when the kernel is made and when it is
// called (principle 4: nothing fails late inside a generated kernel because of bad input),
// one OpCode::Custom node per output, and the optional gradient recorded as a custom
// autograd function so that it composes with every other differentiable op.
#include "custom_kernel.h"

#include <cctype>
#include <unordered_set>

#include "../jit/custom_kernel.h"
#include "../ops/custom_function.h"

namespace kiln {
namespace {

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  // Names the printed source uses itself.
  return s.rfind("kiln_", 0) != 0;
}

std::string list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return "(" + out + ")";
}

jit::CustomKernelSignature signature_of(const CustomKernelSpec& spec, const std::string& what,
                                        const std::vector<Tensor>& inputs,
                                        const std::vector<KernelOutput>& outputs, Device device) {
  if (inputs.size() != spec.inputs.size())
    throw ValueError(what + " expects " + std::to_string(spec.inputs.size()) + " inputs " +
                     list(spec.inputs) + ", got " + std::to_string(inputs.size()));
  if (outputs.size() != spec.outputs.size())
    throw ValueError(what + " declares " + std::to_string(spec.outputs.size()) + " outputs " +
                     list(spec.outputs) + ", got " + std::to_string(outputs.size()) +
                     " output shapes");
  const std::string& body = device.is_cuda() ? spec.cuda_source : spec.cpu_source;
  if (body.empty())
    throw DeviceError(what + " has no " + (device.is_cuda() ? "cuda_source" : "cpu_source") +
                      " for a call on " + device.str());
  jit::CustomKernelSignature s;
  s.name = spec.name;
  s.input_names = spec.inputs;
  s.output_names = spec.outputs;
  s.header = spec.header;
  s.body = body;
  if (!device.is_cuda()) s.cpu_tasks = spec.cpu_tasks;
  s.cuda_block = spec.cuda_block;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) throw ValueError(what + " input " + spec.inputs[i] + " is undefined");
    s.input_dtypes.push_back(inputs[i].dtype());
    s.input_ranks.push_back(inputs[i].ndim());
  }
  for (const KernelOutput& o : outputs) {
    check_sizes("custom_kernel " + spec.name, o.shape, itemsize(o.dtype));
    s.output_dtypes.push_back(o.dtype);
    s.output_ranks.push_back(static_cast<int>(o.shape.size()));
  }
  return s;
}

Device device_of(const std::string& what, const CustomKernelSpec& spec,
                 const std::vector<Tensor>& inputs) {
  if (inputs.empty() || !inputs[0].defined()) return default_device();
  const Device d = inputs[0].device();
  for (size_t i = 1; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].device() != d)
      throw DeviceError(what + " input " + spec.inputs[i] + " is on " + inputs[i].device().str() +
                        " but " + spec.inputs[0] + " is on " + d.str());
  return d;
}

}  // namespace

CustomKernel::CustomKernel(CustomKernelSpec spec, CustomKernelGrad grad)
    : spec_(std::move(spec)), grad_(std::move(grad)) {
  const std::string what = "[custom_kernel " + spec_.name + "]";
  if (!is_identifier(spec_.name))
    throw ValueError("[custom_kernel] the name '" + spec_.name +
                     "' must be an identifier (letters, digits, '_'; not starting with kiln_)");
  std::unordered_set<std::string> seen;
  for (const auto* names : {&spec_.inputs, &spec_.outputs})
    for (const std::string& n : *names) {
      if (!is_identifier(n))
        throw ValueError(what + " '" + n + "' is not an identifier (and may not start with kiln_)");
      if (!seen.insert(n).second) throw ValueError(what + " the name '" + n + "' is used twice");
    }
  if (spec_.outputs.empty()) throw ValueError(what + " declares no outputs");
  if (spec_.cpu_source.empty() && spec_.cuda_source.empty())
    throw ValueError(what + " has neither cpu_source nor cuda_source");
  if (spec_.cuda_block < 1 || spec_.cuda_block > 1024)
    throw ValueError(what + " cuda_block must be in [1, 1024], got " +
                     std::to_string(spec_.cuda_block));
}

std::string CustomKernel::source_for(const std::vector<Tensor>& inputs,
                                     const std::vector<KernelOutput>& outputs,
                                     Device device) const {
  jit::CustomKernelSignature s =
      signature_of(spec_, "[custom_kernel " + spec_.name + "]", inputs, outputs, device);
  return device.is_cuda() ? jit::print_custom_cuda(s) : jit::print_custom_cpp(s);
}

std::vector<Tensor> CustomKernel::operator()(const std::vector<Tensor>& inputs,
                                             const std::vector<KernelOutput>& outputs) const {
  const std::string what = "[custom_kernel " + spec_.name + "]";
  const Device device = device_of(what, spec_, inputs);
  check_device_available("custom_kernel", device);
  jit::CustomKernelSignature s = signature_of(spec_, what, inputs, outputs, device);
  std::vector<Shape> shapes;
  for (const KernelOutput& o : outputs) shapes.push_back(o.shape);
  std::vector<std::shared_ptr<const CustomKernelOp>> payloads =
      jit::compile_custom_kernel(s, device, shapes);
  std::vector<NodePtr> in_nodes;
  for (const Tensor& t : inputs) in_nodes.push_back(t.node());
  std::vector<Tensor> values;
  for (size_t k = 0; k < outputs.size(); ++k) {
    auto node = std::make_shared<Node>(OpCode::Custom, in_nodes, outputs[k].shape, outputs[k].dtype,
                                       device);
    node->custom = payloads[k];
    node->origin = "custom_kernel";
    // Differentiable only through a gradient the user gives (recorded below).
    node->requires_grad = false;
    values.emplace_back(std::move(node));
  }
  if (!grad_) return values;
  // The gradient is a custom autograd function's backward; it sees the outputs as recorded,
  // so a gradient built from them can be differentiated again.
  auto ctx = std::make_shared<autograd::AutogradContext>();
  autograd::detail::begin_forward(*ctx, inputs);
  std::vector<Tensor> saved = inputs;
  saved.insert(saved.end(), values.begin(), values.end());
  ctx->save_for_backward(saved);
  const size_t n_in = inputs.size();
  CustomKernelGrad grad = grad_;
  return autograd::detail::record_function(
      spec_.name, inputs, values, ctx,
      [grad, n_in](autograd::AutogradContext* c, std::vector<Tensor> g) {
        std::vector<Tensor> all = c->get_saved_variables();
        std::vector<Tensor> ins(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n_in));
        std::vector<Tensor> outs(all.begin() + static_cast<std::ptrdiff_t>(n_in), all.end());
        return grad(ins, outs, g);
      });
}

}  // namespace kiln
