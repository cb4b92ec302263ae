// The misuse catalogue: mistakes a user makes across the public API (tensor ops, factories,
// nn modules, losses, optimizers, schedulers, serialization, checkpoint, data helpers,
// KILN_* variables, devices and dtypes), each with the kiln::Error subclass it must raise
// and the op its message must name. One table, run twice: in this process (type and
// message), and each case in a forked child, so that a case that crashes (a signal, an
// abort, std::terminate) fails the test instead of taking the whole run down with it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/settings.h"
#include "frontend/kiln.h"

using kiln::DType;
using kiln::Shape;
using kiln::Tensor;
namespace nn = kiln::nn;
namespace optim = kiln::optim;

namespace {

// What a case raised, from most to least specific; the values are the forked child's exit
// codes (0 and small codes are left to the runtime, 134 is an abort).
enum class Raised : int {
  Nothing = 10,
  Shape,
  DType,
  Device,
  Compile,
  OutOfMemory,
  IO,
  Value,
  Index,
  OtherKilnError,  // kiln::Error itself, untyped
  NotKiln,         // std::exception that is no kiln::Error
};

const char* raised_name(Raised r) {
  switch (r) {
    case Raised::Nothing:
      return "nothing";
    case Raised::Shape:
      return "ShapeError";
    case Raised::DType:
      return "DTypeError";
    case Raised::Device:
      return "DeviceError";
    case Raised::Compile:
      return "CompileError";
    case Raised::OutOfMemory:
      return "OutOfMemoryError";
    case Raised::IO:
      return "IOError";
    case Raised::Value:
      return "ValueError";
    case Raised::Index:
      return "IndexError";
    case Raised::OtherKilnError:
      return "kiln::Error";
    case Raised::NotKiln:
      return "a non-kiln exception";
  }
  return "?";
}

struct Outcome {
  Raised raised = Raised::Nothing;
  std::string message;
};

Outcome run_case(const std::function<void()>& fn) {
  try {
    fn();
    return {};
  } catch (const kiln::ShapeError& e) {
    return {Raised::Shape, e.what()};
  } catch (const kiln::DTypeError& e) {
    return {Raised::DType, e.what()};
  } catch (const kiln::DeviceError& e) {
    return {Raised::Device, e.what()};
  } catch (const kiln::CompileError& e) {
    return {Raised::Compile, e.what()};
  } catch (const kiln::OutOfMemoryError& e) {
    return {Raised::OutOfMemory, e.what()};
  } catch (const kiln::IOError& e) {
    return {Raised::IO, e.what()};
  } catch (const kiln::ValueError& e) {
    return {Raised::Value, e.what()};
  } catch (const kiln::IndexError& e) {
    return {Raised::Index, e.what()};
  } catch (const kiln::Error& e) {
    return {Raised::OtherKilnError, e.what()};
  } catch (const std::exception& e) {
    return {Raised::NotKiln, e.what()};
  }
}

struct Case {
  const char* name;
  Raised expected;
  // Must appear in the message: the op in brackets, e.g. "[matmul]".
  const char* op;
  std::function<void()> run;
};

// Sets an environment variable for one case and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

Tensor f32(const Shape& s) { return kiln::full(s, 0.5f); }
Tensor i64(const std::vector<int64_t>& v) { return kiln::from_vector<int64_t>(v); }

std::string temp_path(const std::string& leaf) {
  return (std::filesystem::temp_directory_path() /
          ("kiln-errors-" + std::to_string(::getpid()) + "-" + leaf))
      .string();
}

// A file with these bytes, for the malformed-safetensors cases.
std::string file_with(const std::string& leaf, const std::string& bytes) {
  std::string path = temp_path(leaf);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// A module whose layers the user forgot to register: it has no parameters.
struct Unregistered : nn::Module {
  Unregistered() : nn::Module("Unregistered") {}
  nn::Linear layer{2, 2};  // a member, never passed to register_module
};

// A two-parameter model and one training step's gradients.
struct Trained {
  nn::Linear model{3, 2};
  Trained() {
    Tensor loss = kiln::sum(model.forward(f32({4, 3})));
    loss.backward();
  }
};

std::vector<Case> catalogue() {
  using R = Raised;
  using kiln::IndexExpr;
  std::vector<Case> c;
  // ---- elementwise and broadcasting ----
  c.push_back({"add of unbroadcastable shapes", R::Shape, "[add]", [] {
                 (void)(f32({2, 3}) + f32({4}));
               }});
  c.push_back({"mul of unbroadcastable shapes", R::Shape, "[mul]", [] {
                 (void)(f32({3, 1, 2}) * f32({4, 3}));
               }});
  c.push_back({"comparison of unbroadcastable shapes", R::Shape, "[lt]",
               [] { (void)(f32({2}) < f32({3})); }});
  c.push_back({"where with a float condition", R::DType, "[where]",
               [] { (void)kiln::where(f32({2}), f32({2}), f32({2})); }});
  c.push_back({"bitwise and of floats", R::DType, "[bitwise_and]",
               [] { (void)kiln::bitwise_and(f32({2}), f32({2})); }});
  c.push_back({"subtracting bools", R::DType, "[sub]", [] {
                 Tensor b = kiln::full({2}, true, DType::Bool);
                 (void)kiln::sub(b, b);
               }});
  c.push_back({"add of an undefined tensor", R::Value, "[add]",
               [] { (void)kiln::add(Tensor(), f32({2})); }});
  c.push_back({"exp of an undefined tensor", R::Value, "[exp]", [] { (void)kiln::exp(Tensor()); }});
  c.push_back({"cast of an undefined tensor", R::Value, "[cast]",
               [] { (void)kiln::cast(Tensor(), DType::Int32); }});
  c.push_back({"clamp with a bound of the wrong shape", R::Shape, "[clamp]",
               [] { (void)kiln::clamp(f32({5}), f32({2}), Tensor()); }});
  c.push_back({"broadcast_to a smaller rank", R::Shape, "[broadcast_to]", [] {
                 (void)kiln::broadcast_to(f32({2, 3}), {3});
               }});
  c.push_back({"broadcast of shapes whose product overflows", R::Value, "[add]", [] {
                 (void)(kiln::zeros({int64_t{1} << 32, 1}) + kiln::zeros({1, int64_t{1} << 32}));
               }});
  // ---- factories ----
  c.push_back({"ones with 2^64 elements", R::Value, "[full]", [] {
                 (void)kiln::ones({int64_t{1} << 32, int64_t{1} << 32});
               }});
  c.push_back({"zeros whose element count overflows int64", R::Value, "[full]", [] {
                 (void)kiln::zeros({3037000500, 3037000500});
               }});
  c.push_back({"zeros whose byte size overflows int64", R::Value, "[full]",
               [] { (void)kiln::zeros({int64_t{1} << 61}, DType::Float64); }});
  c.push_back({"randn with an overflowing shape", R::Value, "[randn]", [] {
                 (void)kiln::randn({int64_t{1} << 40, int64_t{1} << 40});
               }});
  c.push_back({"full with a negative size", R::Value, "[full]", [] {
                 (void)kiln::full({2, -3}, 1.0);
               }});
  c.push_back(
      {"arange with a zero step", R::Value, "[arange]", [] { (void)kiln::arange(0, 10, 0); }});
  c.push_back(
      {"arange to infinity", R::Value, "[arange]", [] { (void)kiln::arange(0.0, INFINITY); }});
  c.push_back(
      {"arange of 1e30 elements", R::Value, "[arange]", [] { (void)kiln::arange(0, 1e30); }});
  c.push_back({"arange over the whole int64 range", R::Value, "[arange]",
               [] { (void)kiln::arange(INT64_MIN, INT64_MAX, 1); }});
  c.push_back({"from_data of a null pointer", R::Value, "[from_data]", [] {
                 (void)kiln::from_data(nullptr, {2, 3}, DType::Float32);
               }});
  c.push_back({"from_vector with too few values", R::Value, "[from_vector]", [] {
                 std::vector<float> three = {1, 2, 3};
                 three.reserve(64);
                 (void)kiln::from_vector<float>(three, {2, 2});
               }});
  c.push_back({"rand of an integer dtype", R::DType, "[rand]",
               [] { (void)kiln::rand({2}, DType::Int32); }});
  c.push_back(
      {"randint with low >= high", R::Value, "[randint]", [] { (void)kiln::randint(5, 5, {2}); }});
  c.push_back(
      {"bernoulli with p > 1", R::Value, "[bernoulli]", [] { (void)kiln::bernoulli({2}, 1.5); }});
  c.push_back({"index along a missing axis", R::Shape, "[index]", [] {
                 (void)kiln::index({2, 3}, 2);
               }});
  // ---- shape ops ----
  c.push_back({"reshape to a different element count", R::Shape, "[reshape]", [] {
                 (void)kiln::reshape(f32({2, 3}), {4});
               }});
  c.push_back({"reshape with two -1", R::Value, "[reshape]", [] {
                 (void)kiln::reshape(f32({2, 3}), {-1, -1});
               }});
  c.push_back({"reshape to an overflowing shape", R::Value, "[reshape]", [] {
                 (void)kiln::reshape(f32({4}), {-1, int64_t{1} << 32, int64_t{1} << 32});
               }});
  c.push_back({"transpose of a missing axis", R::Shape, "[transpose]", [] {
                 (void)kiln::transpose(f32({2, 3}), 0, 2);
               }});
  c.push_back({"permute that is no permutation", R::Shape, "[permute]", [] {
                 (void)kiln::permute(f32({2, 3}), {0, 0});
               }});
  c.push_back({"squeeze of a missing axis", R::Shape, "[squeeze]", [] {
                 (void)kiln::squeeze(f32({2, 3}), 2);
               }});
  c.push_back({"unsqueeze beyond the rank", R::Shape, "[unsqueeze]", [] {
                 (void)kiln::unsqueeze(f32({2, 3}), 4);
               }});
  c.push_back({"slice with a zero step", R::Value, "[slice]",
               [] { (void)kiln::slice(f32({4}), 0, 0, 4, 0); }});
  c.push_back({"concat of mismatched shapes", R::Shape, "[concat]", [] {
                 (void)kiln::concat({f32({2, 3}), f32({2, 4})}, 0);
               }});
  c.push_back({"concat of nothing", R::Value, "[concat]", [] { (void)kiln::concat({}, 0); }});
  c.push_back({"concat of mixed ranks", R::Shape, "[concat]", [] {
                 (void)kiln::concat({f32({2}), f32({2, 1})}, 0);
               }});
  c.push_back({"concat whose size overflows", R::Value, "[concat]", [] {
                 Tensor half = kiln::zeros({INT64_MAX / 2 + 1}, DType::Bool);
                 (void)kiln::concat({half, half}, 0);
               }});
  c.push_back({"stack of different shapes", R::Shape, "[stack]", [] {
                 (void)kiln::stack({f32({2}), f32({3})});
               }});
  c.push_back({"pad with more pairs than dimensions", R::Shape, "[pad]", [] {
                 (void)kiln::pad(f32({2}), {{1, 1}, {1, 1}});
               }});
  c.push_back({"pad whose result overflows", R::Value, "[pad]", [] {
                 (void)kiln::pad(f32({2, 2}), {{0, INT64_MAX - 4}, {0, INT64_MAX - 4}});
               }});
  c.push_back({"flip of a repeated axis", R::Shape, "[flip]", [] {
                 (void)kiln::flip(f32({2, 3}), {0, 0});
               }});
  c.push_back({"tril of a vector", R::Shape, "[tril]", [] { (void)kiln::tril(f32({3})); }});
  // ---- indexing ----
  c.push_back({"gather with float indices", R::DType, "[gather]", [] {
                 (void)kiln::gather(f32({3, 4}), 1, f32({3, 1}));
               }});
  c.push_back({"gather out of range at evaluation", R::Index, "[gather]", [] {
                 kiln::gather(f32({2, 4}), 1, kiln::from_vector<int64_t>({0, 9}, {2, 1})).eval();
               }});
  c.push_back({"index_select out of range at evaluation", R::Index, "[index_select]", [] {
                 kiln::index_select(f32({3, 2}), 0, i64({0, 3})).eval();
               }});
  c.push_back(
      {"scatter_add with a mismatched source", R::Shape, "[scatter_add]", [] {
         (void)kiln::scatter_add(f32({3, 4}), 1, kiln::zeros({3, 2}, DType::Int64), f32({2, 2}));
       }});
  c.push_back({"one_hot with zero classes", R::Value, "[one_hot]", [] {
                 (void)kiln::one_hot(i64({1, 2}), 0);
               }});
  c.push_back({"one_hot out of range at evaluation", R::Index, "[one_hot]", [] {
                 kiln::one_hot(i64({1, 5}), 3).eval();
               }});
  c.push_back({"reindex map of the wrong length", R::Shape, "[reindex]", [] {
                 (void)kiln::reindex(f32({2, 3}), {2, 3}, {IndexExpr::var(0)});
               }});
  // ---- reductions and linalg ----
  c.push_back({"sum over a missing axis", R::Shape, "[sum]", [] {
                 (void)kiln::sum(f32({2, 3}), {2});
               }});
  c.push_back({"mean of integers", R::DType, "[mean]",
               [] { (void)kiln::mean(kiln::zeros({3}, DType::Int32)); }});
  c.push_back({"max of an empty tensor", R::Value, "[max]", [] { (void)kiln::max(f32({0})); }});
  c.push_back({"argmax over a missing axis", R::Shape, "[argmax]", [] {
                 (void)kiln::argmax(f32({2, 3}), 5);
               }});
  c.push_back({"softmax over a missing axis", R::Shape, "[softmax]", [] {
                 (void)kiln::softmax(f32({2, 3}), 3);
               }});
  c.push_back({"matmul of mismatched inner dimensions", R::Shape, "[matmul]", [] {
                 (void)kiln::matmul(f32({3, 4}), f32({5, 2}));
               }});
  c.push_back({"matmul of scalars", R::Shape, "[matmul]",
               [] { (void)kiln::matmul(kiln::tensor(1.0f), f32({2})); }});
  c.push_back({"matmul of an undefined tensor", R::Value, "[matmul]", [] {
                 (void)kiln::matmul(Tensor(), f32({2, 2}));
               }});
  c.push_back(
      {"matmul whose output overflows", R::Value, "[matmul]", [] {
         (void)kiln::matmul(kiln::zeros({int64_t{1} << 32, 2}), kiln::zeros({2, int64_t{1} << 32}));
       }});
  c.push_back({"linear with a wrong weight", R::Shape, "[linear]", [] {
                 (void)kiln::linear(f32({2, 3}), f32({4, 5}));
               }});
  // ---- reading values ----
  c.push_back({"item of a vector", R::Value, "[item]", [] { (void)f32({2, 3}).item<float>(); }});
  c.push_back({"data of the wrong type", R::DType, "[data]", [] {
                 (void)kiln::from_vector<int32_t>({1, 2}).data<float>();
               }});
  c.push_back({"size of a missing axis", R::Shape, "[size]", [] { (void)f32({2, 3}).size(2); }});
  c.push_back({"eval of an undefined tensor", R::Value, "[eval]", [] { Tensor().eval(); }});
  // ---- devices ----
  c.push_back({"zeros on a missing GPU", R::Device, "cuda:0",
               [] { (void)kiln::zeros({2}, DType::Float32, kiln::Device::cuda(0)); }});
  c.push_back(
      {"to a missing GPU", R::Device, "cuda:3", [] { (void)f32({2}).to(kiln::Device::cuda(3)); }});
  // ---- autograd ----
  c.push_back({"backward of a non-scalar without a gradient", R::Shape, "[backward]", [] {
                 Tensor w = f32({3});
                 w.requires_grad_();
                 (w * 2.0f).backward();
               }});
  c.push_back({"grad of an integer tensor", R::DType, "[requires_grad_]",
               [] { kiln::zeros({2}, DType::Int64).requires_grad_(); }});
  c.push_back({"assign of a different shape", R::Shape, "[assign]", [] {
                 Tensor p = f32({2});
                 p.assign(f32({3}));
               }});
  // ---- nn modules ----
  c.push_back({"Linear with the wrong feature size", R::Shape, "[Linear]", [] {
                 (void)nn::Linear(784, 10).forward(kiln::zeros({32, 100}));
               }});
  c.push_back({"Linear with zero in_features", R::Value, "[Linear]", [] { nn::Linear(0, 3); }});
  c.push_back({"Conv2d with the wrong channel count", R::Shape, "[Conv2d]", [] {
                 (void)nn::Conv2d(3, 8, 3).forward(kiln::zeros({2, 4, 8, 8}));
               }});
  c.push_back({"Conv2d with a zero stride", R::Value, "[Conv2d]", [] { nn::Conv2d(3, 8, 3, 0); }});
  c.push_back({"max_pool2d with too much padding", R::Value, "[max_pool2d]", [] {
                 (void)nn::F::max_pool2d(kiln::zeros({1, 1, 5, 5}), 2, 2, 2);
               }});
  c.push_back({"LSTM with the wrong input size", R::Shape, "[LSTM]", [] {
                 (void)nn::LSTM(4, 6, 2).forward(kiln::zeros({5, 2, 3}));
               }});
  c.push_back({"MultiheadAttention with indivisible heads", R::Value, "[MultiheadAttention]",
               [] { nn::MultiheadAttention(10, 3); }});
  c.push_back({"GRU with the wrong input size", R::Shape, "[GRU]", [] {
                 (void)nn::GRU(4, 6, 1, true, false, 0.0, true).forward(kiln::zeros({5, 2, 3}));
               }});
  c.push_back({"LSTM with proj_size not below hidden_size", R::Value, "[LSTM]",
               [] { nn::LSTM(4, 6, 1, true, false, 0.0, false, 6); }});
  c.push_back({"Conv1d with the wrong channel count", R::Shape, "[Conv1d]", [] {
                 (void)nn::Conv1d(3, 8, 3).forward(kiln::zeros({2, 4, 8}));
               }});
  c.push_back({"ConvTranspose2d with output_padding not below stride", R::Value,
               "[ConvTranspose2d]", [] { nn::ConvTranspose2d(4, 4, 3, 2, 0, 2); }});
  c.push_back({"GroupNorm with indivisible channels", R::Value, "[GroupNorm]",
               [] { nn::GroupNorm(3, 4); }});
  c.push_back({"InstanceNorm2d with the wrong rank", R::Shape, "[InstanceNorm2d]", [] {
                 (void)nn::InstanceNorm2d(3).forward(kiln::zeros({2, 3}));
               }});
  c.push_back(
      {"MultiheadAttention with a key of the wrong kdim", R::Shape, "[MultiheadAttention]", [] {
         Tensor q = kiln::zeros({3, 2, 8});
         (void)nn::MultiheadAttention(8, 2, 0.0, true, false, 4, 4)
             .forward(q, q, kiln::zeros({3, 2, 4}));
       }});
  c.push_back(
      {"TransformerDecoderLayer without memory", R::Value, "[TransformerDecoderLayer]", [] {
         (void)nn::TransformerDecoderLayer(8, 2, 16).forward(kiln::zeros({3, 2, 8}), Tensor());
       }});
  c.push_back({"BatchNorm2d with the wrong channels", R::Shape, "[BatchNorm2d]", [] {
                 (void)nn::BatchNorm2d(3).forward(kiln::zeros({2, 4, 5, 5}));
               }});
  c.push_back({"LayerNorm with the wrong trailing shape", R::Shape, "[LayerNorm]", [] {
                 (void)nn::LayerNorm({4, 5}).forward(kiln::zeros({2, 5, 4}));
               }});
  c.push_back({"Embedding of float indices", R::DType, "[Embedding]",
               [] { (void)nn::Embedding(10, 4).forward(kiln::zeros({3})); }});
  c.push_back({"embedding index out of range at evaluation", R::Index, "[embedding]", [] {
                 nn::F::embedding(i64({1, 12}), f32({10, 4})).eval();
               }});
  c.push_back({"Dropout with p > 1", R::Value, "[Dropout]", [] { nn::Dropout(1.5); }});
  c.push_back({"Sequential index out of range", R::Index, "[Sequential]", [] {
                 nn::Sequential s;
                 (void)s[3];
               }});
  c.push_back({"load_state_dict with a missing key", R::Value, "load_state_dict]", [] {
                 nn::Linear lin(3, 2);
                 kiln::StateDict d = lin.state_dict();
                 d.erase("bias");
                 lin.load_state_dict(d);
               }});
  c.push_back({"load_state_dict with a wrong shape", R::Shape, "load_state_dict]", [] {
                 nn::Linear lin(3, 2);
                 kiln::StateDict d = lin.state_dict();
                 d["weight"] = f32({5, 5});
                 lin.load_state_dict(d);
               }});
  c.push_back({"load_state_dict with an unexpected key", R::Value, "load_state_dict]", [] {
                 nn::Linear lin(3, 2);
                 kiln::StateDict d = lin.state_dict();
                 d["extra"] = f32({1});
                 lin.load_state_dict(d);
               }});
  c.push_back({"ModuleList index out of range", R::Index, "[ModuleList]", [] {
                 nn::ModuleList l;
                 (void)l[0];
               }});
  c.push_back({"ModuleDict missing key", R::Value, "[ModuleDict]", [] {
                 nn::ModuleDict d;
                 (void)d["head"];
               }});
  // ---- losses ----
  c.push_back({"cross_entropy class index out of range", R::Index, "[cross_entropy]", [] {
                 nn::F::cross_entropy(f32({2, 3}), i64({0, 7})).eval();
               }});
  c.push_back({"cross_entropy with targets of the wrong shape", R::Shape, "[cross_entropy]", [] {
                 (void)nn::F::cross_entropy(f32({2, 3}), i64({0, 1, 2}));
               }});
  c.push_back({"cross_entropy with bool targets", R::DType, "[cross_entropy]", [] {
                 (void)nn::F::cross_entropy(f32({2, 3}), kiln::zeros({2}, DType::Bool));
               }});
  c.push_back({"cross_entropy with label_smoothing > 1", R::Value, "[cross_entropy]", [] {
                 (void)nn::F::cross_entropy(f32({2, 3}), i64({0, 1}), {.label_smoothing = 2.0});
               }});
  c.push_back({"nll_loss class index out of range", R::Index, "[nll_loss]", [] {
                 nn::F::nll_loss(f32({2, 3}), i64({3, 0})).eval();
               }});
  c.push_back({"nll_loss negative class index", R::Index, "[nll_loss]", [] {
                 nn::F::nll_loss(f32({2, 3}), i64({-2, 0})).eval();
               }});
  c.push_back({"mse_loss of different shapes", R::Shape, "[mse_loss]", [] {
                 (void)nn::F::mse_loss(f32({2, 3}), f32({3}));
               }});
  c.push_back({"binary_cross_entropy_with_logits of integers", R::DType,
               "[binary_cross_entropy_with_logits]", [] {
                 (void)nn::F::binary_cross_entropy_with_logits(kiln::zeros({2}, DType::Int32),
                                                               kiln::zeros({2}, DType::Int32));
               }});
  c.push_back({"smooth_l1_loss with a negative beta", R::Value, "[smooth_l1_loss]",
               [] { (void)nn::F::smooth_l1_loss(f32({2}), f32({2}), nn::Reduction::Mean, -1.0); }});
  c.push_back({"kl_div of different shapes", R::Shape, "[kl_div]", [] {
                 (void)nn::F::kl_div(f32({2, 3}), f32({3}));
               }});
  c.push_back({"huber_loss with delta 0", R::Value, "[huber_loss]",
               [] { (void)nn::F::huber_loss(f32({2}), f32({2}), nn::Reduction::Mean, 0.0); }});
  c.push_back({"binary_cross_entropy with a weight that does not broadcast", R::Shape,
               "[binary_cross_entropy]", [] {
                 (void)nn::F::binary_cross_entropy(f32({2, 3}), f32({2, 3}), {.weight = f32({2})});
               }});
  // ---- optimizers and schedulers ----
  c.push_back({"SGD over an empty parameter list", R::Value, "[SGD]",
               [] { optim::SGD opt(std::vector<Tensor>{}, {}); }});
  c.push_back({"Adam over a module with unregistered layers", R::Value, "[Adam]", [] {
                 Unregistered m;
                 optim::Adam opt(m.parameters(), {});
               }});
  c.push_back({"SGD with a negative learning rate", R::Value, "[SGD]", [] {
                 Trained t;
                 optim::SGD opt(t.model.parameters(), {.lr = -1});
               }});
  c.push_back({"Adam with beta1 >= 1", R::Value, "[Adam]", [] {
                 Trained t;
                 optim::Adam opt(t.model.parameters(), {.betas = {1.0, 0.999}});
               }});
  c.push_back({"SGD over a computed tensor", R::Value, "[SGD]", [] {
                 Tensor w = f32({2});
                 w.requires_grad_();
                 optim::SGD opt({w * 2.0f}, {});
               }});
  c.push_back({"SGD over the same parameter twice", R::Value, "[SGD]", [] {
                 Trained t;
                 Tensor w = t.model.parameters()[0];
                 optim::SGD opt({w, w}, {});
               }});
  c.push_back({"optimizer load_state_dict from another optimizer", R::Value, "[SGD]", [] {
                 Trained t;
                 optim::SGD opt(t.model.parameters(), {.momentum = 0.9});
                 kiln::StateDict d;
                 d["state.7.momentum_buffer"] = f32({2});
                 opt.load_state_dict(d);
               }});
  c.push_back({"optimizer params of a missing group", R::Index, "[SGD]", [] {
                 Trained t;
                 optim::SGD opt(t.model.parameters(), {});
                 (void)opt.params(4);
               }});
  c.push_back({"StepLR with a zero step size", R::Value, "[StepLR]", [] {
                 Trained t;
                 optim::SGD opt(t.model.parameters(), {});
                 optim::StepLR s(opt, 0);
               }});
  c.push_back({"CosineAnnealingLR with T_max 0", R::Value, "[CosineAnnealingLR]", [] {
                 Trained t;
                 optim::SGD opt(t.model.parameters(), {});
                 optim::CosineAnnealingLR s(opt, 0);
               }});
  c.push_back({"clip_grad_norm with a negative max_norm", R::Value, "[clip_grad_norm]", [] {
                 Trained t;
                 (void)optim::clip_grad_norm(t.model.parameters(), -1.0);
               }});
  c.push_back({"clip_grad_norm of an infinite gradient with error_if_nonfinite", R::Value,
               "[clip_grad_norm]", [] {
                 Tensor w = f32({2});
                 w.requires_grad_();
                 w.set_grad(kiln::full({2}, INFINITY));
                 (void)optim::clip_grad_norm({w}, 1.0, 2.0, true);
               }});
  c.push_back({"RMSprop with a negative alpha", R::Value, "[RMSprop]", [] {
                 Trained t;
                 optim::RMSprop opt(t.model.parameters(), {.alpha = -1});
               }});
  c.push_back({"Adagrad with a negative lr_decay", R::Value, "[Adagrad]", [] {
                 Trained t;
                 optim::Adagrad opt(t.model.parameters(), {.lr_decay = -1});
               }});
  c.push_back({"OneCycleLR cycling the momentum of Adagrad", R::Value, "[OneCycleLR]", [] {
                 Trained t;
                 optim::Adagrad opt(t.model.parameters(), {});
                 optim::OneCycleLR s(opt, 0.1, 10);
               }});
  c.push_back({"OneCycleLR stepped past total_steps", R::Value, "[OneCycleLR]", [] {
                 Trained t;
                 optim::SGD opt(t.model.parameters(), {});
                 optim::OneCycleLR s(opt, 0.1, 1);
                 s.step();
                 s.step();
               }});
  c.push_back({"ReduceLROnPlateau with factor >= 1", R::Value, "[ReduceLROnPlateau]", [] {
                 Trained t;
                 optim::SGD opt(t.model.parameters(), {});
                 optim::ReduceLROnPlateau s(opt, {.factor = 2});
               }});
  c.push_back({"scheduler load_state_dict of another kind", R::Value, "[LRScheduler]", [] {
                 Trained t;
                 optim::SGD opt(t.model.parameters(), {});
                 optim::ReduceLROnPlateau plateau(opt);
                 optim::StepLR s(opt, 2);
                 s.load_state_dict(plateau.state_dict());
               }});
  // ---- serialization and files ----
  c.push_back({"load_safetensors of a missing file", R::IO, "[load_safetensors]",
               [] { (void)kiln::load_safetensors("/nonexistent-dir/model.safetensors"); }});
  c.push_back({"load_safetensors of a truncated file", R::IO, "[load_safetensors]", [] {
                 std::string p = file_with("truncated.safetensors", std::string("\x40\0\0", 3));
                 (void)kiln::load_safetensors(p);
               }});
  c.push_back(
      {"load_safetensors with a header longer than the file", R::IO, "[load_safetensors]", [] {
         std::string p = file_with("long.safetensors", std::string("\xff\xff\0\0\0\0\0\0{}", 10));
         (void)kiln::load_safetensors(p);
       }});
  c.push_back({"save_safetensors into a missing directory", R::IO, "[save_safetensors]", [] {
                 kiln::save_safetensors("/nonexistent-dir/x.safetensors", {{"w", f32({2})}});
               }});
  c.push_back({"save_safetensors of an undefined tensor", R::Value, "[save_safetensors]", [] {
                 kiln::save_safetensors(temp_path("undefined.safetensors"), {{"w", Tensor()}});
               }});
  c.push_back({"read_csv of a missing file", R::IO, "[read_csv]",
               [] { (void)kiln::data::read_csv("/nonexistent-dir/data.csv"); }});
  c.push_back({"read_csv of a non-numeric cell", R::Value, "[read_csv]",
               [] { (void)kiln::data::read_csv(file_with("bad.csv", "1,2\n3,x\n")); }});
  c.push_back({"read_text_file of a missing file", R::IO, "[read_text_file]",
               [] { (void)kiln::data::read_text_file("/nonexistent-dir/t.txt"); }});
  // ---- data helpers and checkpoint ----
  c.push_back({"TensorDataset of unequal lengths", R::Shape, "[TensorDataset]", [] {
                 kiln::data::TensorDataset d(f32({4, 2}), f32({3}));
               }});
  c.push_back({"TensorDataset index out of range", R::Index, "[TensorDataset]", [] {
                 kiln::data::TensorDataset d(f32({4, 2}), f32({4}));
                 (void)d.get({0, 4});
               }});
  c.push_back({"DataLoader with batch size 0", R::Value, "[DataLoader]", [] {
                 kiln::data::DataLoader l(kiln::data::TensorDataset(f32({4, 2}), f32({4})),
                                          {.batch_size = 0});
               }});
  c.push_back({"train_test_split with a fraction above 1", R::Value, "[train_test_split]",
               [] { (void)kiln::data::train_test_split(10, 1.5, 0); }});
  c.push_back({"checkpoint of an empty function", R::Value, "[checkpoint]",
               [] { (void)kiln::checkpoint(std::function<Tensor(const Tensor&)>(), f32({2})); }});
  c.push_back(
      {"checkpoint of a function that misuses an op", R::Shape, "[matmul]", [] {
         (void)kiln::checkpoint([](const Tensor& x) { return kiln::matmul(x, x); }, f32({2, 3}));
       }});
  // ---- environment variables (read through the registry the library uses) ----
  c.push_back({"KILN_NUM_THREADS that is not a number", R::Value, "[KILN_NUM_THREADS]", [] {
                 ScopedEnv env("KILN_NUM_THREADS", "lots");
                 (void)kiln::settings::integer("KILN_NUM_THREADS", 1, 4096);
               }});
  c.push_back({"KILN_NUM_THREADS of zero", R::Value, "[KILN_NUM_THREADS]", [] {
                 ScopedEnv env("KILN_NUM_THREADS", "0");
                 (void)kiln::settings::integer("KILN_NUM_THREADS", 1, 4096);
               }});
  c.push_back({"KILN_SEED that is negative", R::Value, "[KILN_SEED]", [] {
                 ScopedEnv env("KILN_SEED", "-1");
                 (void)kiln::settings::unsigned64("KILN_SEED");
               }});
  c.push_back({"KILN_DISABLE_FUSION that is no switch", R::Value, "[KILN_DISABLE_FUSION]", [] {
                 ScopedEnv env("KILN_DISABLE_FUSION", "maybe");
                 (void)kiln::settings::flag("KILN_DISABLE_FUSION");
               }});
  c.push_back({"a variable kiln does not have", R::Value, "[settings]",
               [] { (void)kiln::settings::text("KILN_NO_SUCH_VARIABLE"); }});
  c.push_back({"set_budget of an unparseable size", R::Value, "[set_budget]",
               [] { kiln::memory::set_budget(std::string("lots")); }});
  c.push_back({"set_budget of a bare fraction", R::Value, "[set_budget]",
               [] { kiln::memory::set_budget(std::string("0.5")); }});
  c.push_back({"set_budget of a share above 100%", R::Value, "[set_budget]",
               [] { kiln::memory::set_budget(std::string("150%")); }});
  return c;
}

}  // namespace

TEST_CASE("errors catalogue: every misuse raises its type naming the op", "[errors]") {
  const std::vector<Case> cases = catalogue();
  CHECK(cases.size() >= 80);
  for (const Case& c : cases) {
    INFO("case: " << c.name);
    Outcome o = run_case(c.run);
    INFO("raised " << raised_name(o.raised) << ": " << o.message);
    CHECK(raised_name(o.raised) == std::string(raised_name(c.expected)));
    CHECK(o.message.find(c.op) != std::string::npos);
  }
}

namespace {

// How a forked child that ran one case ended.
struct ChildEnd {
  bool hung = false;
  int signal = 0;  // nonzero: killed by this signal (a crash)
  int code = -1;   // the exit code otherwise
};

ChildEnd run_in_child(const std::function<void()>& fn) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    // The test framework's crash handlers would report from the child; a crash here must
    // reach the parent as the signal itself.
    for (int sig : {SIGABRT, SIGSEGV, SIGFPE, SIGILL, SIGBUS}) std::signal(sig, SIG_DFL);
    _exit(static_cast<int>(run_case(fn).raised));
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  pid_t done = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ChildEnd end;
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    end.hung = true;
  } else if (WIFSIGNALED(status)) {
    end.signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    end.code = WEXITSTATUS(status);
  }
  return end;
}

}  // namespace

TEST_CASE("errors catalogue: the child harness tells a crash from an error", "[errors]") {
  ChildEnd crash = run_in_child([] { std::abort(); });
  CHECK(crash.signal == SIGABRT);
  ChildEnd error = run_in_child([] { (void)kiln::matmul(f32({3, 4}), f32({5, 2})); });
  CHECK(error.signal == 0);
  CHECK(error.code == static_cast<int>(Raised::Shape));
  CHECK(run_in_child([] {}).code == static_cast<int>(Raised::Nothing));
}

TEST_CASE("errors catalogue: every misuse in a child process exits normally", "[errors]") {
  // Forked before this process runs anything (CTest runs each test case in a fresh
  // process), so the child inherits no kiln threads or locks; each child starts kiln itself.
  for (const Case& c : catalogue()) {
    INFO("case: " << c.name);
    const ChildEnd end = run_in_child(c.run);
    CHECK_FALSE(end.hung);
    INFO("killed by signal " << end.signal);
    CHECK(end.signal == 0);  // a crash: the misuse must raise, not kill
    const int code = end.code;
    INFO("child raised " << (code >= 10 && code <= 20 ? raised_name(static_cast<Raised>(code))
                                                      : "an unexpected exit code"));
    CHECK(code == static_cast<int>(c.expected));
  }
}
