#include "library_conv.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "../core/error.h"
#include "../core/settings.h"
#include "../core/thread_pool.h"
#include "blas.h"
#include "library_gemm.h"

#ifndef KILN_WITH_DNNL
#define KILN_WITH_DNNL 0
#endif

#if KILN_WITH_DNNL
#include <dnnl.h>
#endif

namespace kiln::jit {
namespace {

bool is_half(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

// The product's domain dimensions by role; -1 for a role of extent 1 (nothing to read).
enum Role : int { kG, kN, kOH, kOW, kCG, kKH, kKW, kOG, kRoles };
using RoleDims = std::array<int, kRoles>;

// One convolution, with PyTorch's names.
struct Geometry {
  int64_t n = 1, c = 1, h = 1, w = 1;  // the image
  int64_t groups = 1, cg = 1, og = 1;  // channels per group, in and out
  int64_t oh = 1, ow = 1, kh = 1, kw = 1;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
};

// conv2d's im2col map: image [N, C, H, W] at [n, g*Cg + c, oh*sh - ph + i*dh,
// ow*sw - pw + j*dw] for patch coordinates [g, n, oh, ow, c, i, j] (a read for the patches,
// a sum for col2im). A coordinate of extent 1 is always 0: its coefficient is free.
bool parse_im2col(const std::vector<IndexExpr>& map, const Shape& p, const Shape& image,
                  Geometry* g) {
  if (map.size() != 4 || p.size() != 7 || image.size() != 4) return false;
  *g = Geometry{};
  g->groups = p[0], g->n = p[1], g->oh = p[2], g->ow = p[3], g->cg = p[4], g->kh = p[5],
  g->kw = p[6];
  g->c = image[1], g->h = image[2], g->w = image[3];
  if (image[0] != g->n || g->c != g->groups * g->cg) return false;
  std::array<std::vector<int64_t>, 4> coef;
  std::array<int64_t, 4> off{};
  for (size_t k = 0; k < 4; ++k) {
    coef[k].assign(7, 0);
    if (!affine_in_coordinates(map[k], &coef[k], &off[k])) return false;
  }
  // Image dimension k reads only the patch dimensions `dims`.
  auto only = [&](size_t k, std::initializer_list<int> dims) {
    for (int d = 0; d < 7; ++d)
      if (p[static_cast<size_t>(d)] > 1 && coef[k][static_cast<size_t>(d)] != 0 &&
          std::find(dims.begin(), dims.end(), d) == dims.end())
        return false;
    return true;
  };
  auto is = [&](size_t k, int d, int64_t want) {
    return p[static_cast<size_t>(d)] == 1 || coef[k][static_cast<size_t>(d)] == want;
  };
  auto positive = [&](size_t k, int d, int64_t* out) {
    if (p[static_cast<size_t>(d)] == 1) return true;
    *out = coef[k][static_cast<size_t>(d)];
    return *out > 0;
  };
  if (!only(0, {1}) || !only(1, {0, 4}) || !only(2, {2, 5}) || !only(3, {3, 6})) return false;
  if (off[0] != 0 || off[1] != 0 || !is(0, 1, 1) || !is(1, 0, g->cg) || !is(1, 4, 1)) return false;
  if (!positive(2, 2, &g->sh) || !positive(2, 5, &g->dh) || !positive(3, 3, &g->sw) ||
      !positive(3, 6, &g->dw))
    return false;
  g->ph = -off[2];
  g->pw = -off[3];
  return g->ph >= 0 && g->pw >= 0;
}

// A constant 0, possibly broadcast (the `x + 0.0` that keeps conv2d's patches stored).
bool is_zero(const Node* z) {
  while (z->op == OpCode::Reindex && z->inputs.size() == 1) z = z->inputs[0].get();
  return z->op == OpCode::Full && z->scalar.to_double() == 0.0;
}

// One factor of the product: the tensor the library reads, and how it reads the domain.
struct Operand {
  Node* source = nullptr;    // a stored tensor: dy or a weight, or the image behind patches
  Node* im2col = nullptr;    // the patches' reindex, when the factor is conv2d's patches
  std::vector<Node*> chain;  // the nodes between the product and `source`
  std::vector<int64_t> st;   // per domain dimension, the stride in `source` (or the patches)
  int64_t offset = 0;
};

bool operand_of(Node* r, const Shape& dom, Operand* op) {
  if (r->op != OpCode::Reindex || r->inputs.size() != 1 || r->is_evaluated()) return false;
  Node* s = r->inputs[0].get();
  op->chain = {r};
  if (!operand_strides(r->index_map, s->shape, dom, &op->st, &op->offset)) return false;
  // conv2d multiplies half inputs widened to float32; the library reads the halves.
  if (!s->is_evaluated() && s->op == OpCode::Cast && s->dtype == DType::Float32 &&
      is_half(s->inputs[0]->dtype)) {
    op->chain.push_back(s);
    s = s->inputs[0].get();
  }
  if (!s->is_evaluated() && s->op == OpCode::Add && s->inputs.size() == 2) {
    for (size_t i = 0; i < 2; ++i) {
      Node* p = s->inputs[i].get();
      if (!p->is_evaluated() && p->op == OpCode::Reindex && p->inputs.size() == 1 &&
          p->scalar.to_double() == 0.0 && is_zero(s->inputs[1 - i].get())) {
        op->im2col = p;
        op->chain.push_back(s);
        op->chain.push_back(p);
        op->source = p->inputs[0].get();
        return true;
      }
    }
  }
  op->source = s;
  return true;
}

// Roles from the strides at which a contiguous patch-shaped tensor [G, N, OH, OW, Cg, kh,
// kw] reads the domain; the one other dimension of extent > 1 is Og.
bool patch_roles(const std::vector<int64_t>& st, const Shape& p, const Shape& dom, RoleDims* r) {
  r->fill(-1);
  const std::vector<int64_t> cs = contiguous_strides(p);
  for (size_t d = 0; d < dom.size(); ++d) {
    if (dom[d] == 1) continue;
    int role = -1;
    for (size_t j = 0; j < p.size() && st[d] >= 0; ++j)
      if (p[j] > 1 && cs[j] == st[d] && p[j] == dom[d] && (*r)[j] == -1) role = static_cast<int>(j);
    if (st[d] >= 0 && role < 0) return false;
    if (st[d] < 0) {
      if ((*r)[kOG] != -1) return false;
      role = kOG;
    }
    (*r)[static_cast<size_t>(role)] = static_cast<int>(d);
  }
  for (size_t j = 0; j < p.size(); ++j)
    if (p[j] > 1 && (*r)[j] == -1) return false;
  return true;
}

// Whether a tensor reads exactly the roles `want` (among those of extent > 1).
bool reads_exactly(const std::vector<int64_t>& st, const RoleDims& r,
                   std::initializer_list<Role> want) {
  for (int role = 0; role < kRoles; ++role) {
    const int d = r[static_cast<size_t>(role)];
    if (d < 0) continue;
    const bool wanted = std::find(want.begin(), want.end(), role) != want.end();
    if (wanted != (st[static_cast<size_t>(d)] >= 0)) return false;
  }
  return true;
}

// What a call computes: the pass, its geometry, the tensors and their strides.
struct Problem {
  ConvPass pass = ConvPass::Forward;
  Geometry g;
  DType in = DType::Float32;   // the dtype of the operands read
  DType out = DType::Float32;  // the result's
  Node* root = nullptr;
  Node* product = nullptr;
  Node* a = nullptr;
  Node* b = nullptr;
  std::vector<Node*> absorbed;
  std::array<int64_t, 4> dy{};  // strides of [N, O, OH, OW] (y or dy)
  int64_t dy_offset = 0;
  std::array<int64_t, 5> w{};  // strides of [G, Og, Cg, kh, kw]
  int64_t w_offset = 0;
  Node* bias = nullptr;  // forward: the float32 per-channel bias added to the result
  int64_t bias_offset = 0;
  Node* value = nullptr;  // the forward's result before the bias (root without one)
};

// [N, O, OH, OW] strides of a tensor that reads roles N, G, Og, OH, OW; the channel is
// g*Og + og, so the group stride must be Og channel strides. Roles of extent 1 get the
// contiguous stride.
bool image_strides(const std::vector<int64_t>& st, const RoleDims& r, const Geometry& g,
                   std::array<int64_t, 4>* out) {
  const int64_t o = g.groups * g.og;
  *out = {o * g.oh * g.ow, g.oh * g.ow, g.ow, 1};
  auto at = [&](Role role) { return st[static_cast<size_t>(r[role])]; };
  if (r[kN] >= 0) (*out)[0] = at(kN);
  if (r[kOH] >= 0) (*out)[2] = at(kOH);
  if (r[kOW] >= 0) (*out)[3] = at(kOW);
  if (r[kG] >= 0 && r[kOG] >= 0) {
    if (at(kG) != g.og * at(kOG)) return false;
    (*out)[1] = at(kOG);
  } else if (r[kG] >= 0) {
    (*out)[1] = at(kG);
  } else if (r[kOG] >= 0) {
    (*out)[1] = at(kOG);
  }
  return true;
}

// [G, Og, Cg, kh, kw] strides of a tensor that reads those roles.
std::array<int64_t, 5> weight_strides(const std::vector<int64_t>& st, const RoleDims& r,
                                      const Geometry& g) {
  const int64_t k = g.cg * g.kh * g.kw;
  std::array<int64_t, 5> out{g.og * k, k, g.kh * g.kw, g.kw, 1};
  const Role roles[5] = {kG, kOG, kCG, kKH, kKW};
  for (size_t i = 0; i < 5; ++i)
    if (r[roles[i]] >= 0) out[i] = st[static_cast<size_t>(r[roles[i]])];
  return out;
}

// The whole recognition, used to match (fusion) and again to run (the nodes are the same;
// only `root` may hold a buffer by then, one the memory plan handed it).
// When `root` permutes the dimensions of a pending value (NCHW from conv2d's NHWC
// product), that value, with perm[i] the root dimension that is the value's dimension i;
// else nullptr.
Node* permuted(Node* root, std::vector<int>* perm) {
  if (root->op != OpCode::Reindex || root->inputs.size() != 1) return nullptr;
  Node* in = root->inputs[0].get();
  if (in->is_evaluated() || in->shape.size() != root->shape.size()) return nullptr;
  perm->assign(root->shape.size(), -1);
  std::vector<bool> used(root->shape.size(), false);
  for (size_t i = 0; i < root->index_map.size(); ++i) {
    const IndexExpr& e = root->index_map[i];
    if (e.kind() != IndexExpr::Kind::Var) return nullptr;
    const auto d = static_cast<size_t>(e.value());
    if (d >= used.size() || used[d] || root->shape[d] != in->shape[i]) return nullptr;
    used[d] = true;
    (*perm)[i] = static_cast<int>(d);
  }
  return in;
}

bool analyze(Node* root, bool running, Problem* pr) {
  if (root->device.is_cuda() || (!running && root->is_evaluated())) return false;
  *pr = Problem{};
  pr->root = root;
  // The forward may add a per-channel bias (root = value + bias read by channel) and store
  // NCHW directly (value = permute(product)).
  Node* value = root;
  Node* bias_read = nullptr;
  if (root->op == OpCode::Add && root->inputs.size() == 2 && root->dtype == DType::Float32) {
    for (size_t i = 0; i < 2 && !bias_read; ++i) {
      Node* v = root->inputs[i].get();
      Node* b = root->inputs[1 - i].get();
      if (!v->is_evaluated() && v->shape == root->shape && v->dtype == DType::Float32 &&
          (v->op == OpCode::Reindex || v->op == OpCode::ReindexReduce) &&
          b->op == OpCode::Reindex && b->inputs.size() == 1 && !b->is_evaluated() &&
          b->inputs[0]->dtype == DType::Float32) {
        value = v;
        bias_read = b;
      }
    }
    if (!bias_read) return false;
    pr->absorbed.push_back(value);
    pr->absorbed.push_back(bias_read);
  }
  pr->value = value;
  std::vector<int> perm;
  Node* product = value;
  if (Node* in = permuted(value, &perm)) {
    product = in;
    pr->absorbed.push_back(product);
  } else {
    perm.clear();
  }
  if (product->op != OpCode::ReindexReduce || product->reduce != ReduceOp::Sum ||
      product->inputs.size() != 1)
    return false;
  Node* widened = nullptr;  // backward data of a half image: the sum's cast back to the half
  Node* in = product->inputs[0].get();
  if (in->op == OpCode::Cast && !in->is_evaluated()) {
    widened = in;
    in = in->inputs[0].get();
  }
  const bool data = in->op == OpCode::ReindexReduce && !in->is_evaluated() && product == root;
  if (data) {
    if (!parse_im2col(root->index_map, in->shape, root->shape, &pr->g)) return false;
    product = in;
    if (widened) pr->absorbed.push_back(widened);
    pr->absorbed.push_back(product);
  } else if (widened) {
    return false;
  }
  if (product->reduce != ReduceOp::Sum || product->inputs.size() != 1 ||
      product->dtype != DType::Float32)
    return false;
  Node* mul = product->inputs[0].get();
  if (mul->op != OpCode::Mul || mul->inputs.size() != 2 || mul->is_evaluated()) return false;
  const Shape& dom = mul->shape;
  Operand ops[2];
  for (size_t i = 0; i < 2; ++i)
    if (!operand_of(mul->inputs[i].get(), dom, &ops[i])) return false;
  std::vector<int64_t> sc;
  int64_t oc = 0;
  if (!operand_strides(product->index_map, product->shape, dom, &sc, &oc) || oc != 0) return false;
  if (!perm.empty()) {
    // Where the permuted root stores each domain coordinate: the product's dimension i is
    // the root's dimension perm[i].
    std::vector<IndexExpr> composed(root->shape.size(), IndexExpr::constant(0));
    for (size_t i = 0; i < perm.size(); ++i)
      composed[static_cast<size_t>(perm[i])] = product->index_map[i];
    if (!operand_strides(composed, root->shape, dom, &sc, &oc) || oc != 0) return false;
  }
  pr->product = product;
  pr->absorbed.push_back(mul);
  for (const Operand& op : ops)
    pr->absorbed.insert(pr->absorbed.end(), op.chain.begin(), op.chain.end());
  RoleDims r;
  const Operand* dy = nullptr;
  const Operand* w = nullptr;
  if (data) {
    if (ops[0].im2col || ops[1].im2col || !patch_roles(sc, product->shape, dom, &r)) return false;
    pr->pass = ConvPass::BackwardData;
    for (size_t i = 0; i < 2 && !dy; ++i) {
      if (reads_exactly(ops[i].st, r, {kN, kG, kOG, kOH, kOW}) &&
          reads_exactly(ops[1 - i].st, r, {kG, kOG, kCG, kKH, kKW})) {
        dy = &ops[i];
        w = &ops[1 - i];
      }
    }
    if (!dy) return false;
    pr->a = dy->source;
    pr->b = w->source;
  } else {
    const size_t pi = ops[0].im2col ? 0 : 1;
    const Operand& patches = ops[pi];
    const Operand& other = ops[1 - pi];
    if (!patches.im2col || other.im2col || patches.offset != 0) return false;
    if (!parse_im2col(patches.im2col->index_map, patches.im2col->shape, patches.source->shape,
                      &pr->g) ||
        !patch_roles(patches.st, patches.im2col->shape, dom, &r))
      return false;
    // Forward sums over Cg, kh, kw into [N, O, OH, OW]; the weight gradient over N, OH, OW
    // into the weight's shape.
    if (reads_exactly(other.st, r, {kG, kOG, kCG, kKH, kKW}) &&
        reads_exactly(sc, r, {kN, kG, kOG, kOH, kOW})) {
      pr->pass = ConvPass::Forward;
      w = &other;
    } else if (reads_exactly(other.st, r, {kN, kG, kOG, kOH, kOW}) &&
               reads_exactly(sc, r, {kG, kOG, kCG, kKH, kKW})) {
      pr->pass = ConvPass::BackwardWeights;
      dy = &other;
    } else {
      return false;
    }
    pr->a = patches.source;
    pr->b = other.source;
  }
  pr->g.og = r[kOG] >= 0 ? dom[static_cast<size_t>(r[kOG])] : 1;
  if (pr->pass == ConvPass::Forward) {
    if (!image_strides(sc, r, pr->g, &pr->dy)) return false;
  } else if (!image_strides(dy->st, r, pr->g, &pr->dy)) {
    return false;
  } else {
    pr->dy_offset = dy->offset;
  }
  if (pr->pass == ConvPass::BackwardWeights) {
    pr->w = weight_strides(sc, r, pr->g);
  } else {
    pr->w = weight_strides(w->st, r, pr->g);
    pr->w_offset = w->offset;
  }
  pr->in = pr->a->dtype;
  pr->out = root->dtype;
  if (pr->b->dtype != pr->in || pr->a->device != root->device || pr->b->device != root->device)
    return false;
  if ((!perm.empty() || bias_read) && pr->pass != ConvPass::Forward) return false;
  if (bias_read) {
    // The bias must read the channel alone, at unit stride (oneDNN's bias is a plain vector).
    std::vector<int64_t> bs;
    int64_t bo = 0;
    if (!operand_strides(bias_read->index_map, bias_read->inputs[0]->shape, root->shape, &bs, &bo))
      return false;
    const std::vector<int64_t> cs = contiguous_strides(root->shape);
    const int64_t o = pr->g.groups * pr->g.og;
    bool channel_read = o == 1;
    for (size_t d = 0; d < root->shape.size(); ++d) {
      if (root->shape[d] == 1) continue;
      const bool channel = root->shape[d] == o && cs[d] == pr->dy[1];
      if (channel && bs[d] == 1) {
        channel_read = true;
      } else if (bs[d] >= 0) {
        return false;
      }
    }
    if (!channel_read) return false;
    pr->bias = bias_read->inputs[0].get();
    pr->bias_offset = bo;
  }
  if (pr->out != DType::Float32 && pr->out != pr->in) return false;
  return pr->in == DType::Float32 || is_half(pr->in);
}

#if KILN_WITH_DNNL

dnnl_engine_t engine() {
  static dnnl_engine_t e = [] {
    dnnl_engine_t made = nullptr;
    if (dnnl_engine_create(&made, dnnl_cpu, 0) != dnnl_success) made = nullptr;
    return made;
  }();
  return e;
}

dnnl_data_type_t dnnl_type(DType t) {
  switch (t) {
    case DType::BFloat16:
      return dnnl_bf16;
    case DType::Float16:
      return dnnl_f16;
    default:
      return dnnl_f32;
  }
}

// The three tensors of a convolution, by their place in its signature.
enum Slot : size_t { kImage, kWeights, kDy };

// Where a call's three tensors are laid out for oneDNN:
//   Blocked  oneDNN's own choice (format_tag::any: nChw16c and the like), with reorders from
//            and back to kiln's tensors around the primitive
//   Plain    kiln's tensors as they are stored (NCHW, OIHW or whatever strides the match
//            found): no reorders; oneDNN runs its GEMM-based convolution on them
enum class Layout : uint8_t { Blocked, Plain };

// One pass of one shape and layout: the primitive, and the reorders from and to kiln's
// plain layouts where its own differ.
struct Primitive {
  dnnl_primitive_t conv = nullptr;
  Layout layout = Layout::Blocked;
  std::array<dnnl_memory_desc_t, 3> user{}, inner{};
  std::array<dnnl_primitive_t, 3> reorder{};  // user -> inner for inputs, back for the result
  dnnl_memory_desc_t bias{};                  // forward with a bias: a plain float32 vector
  // What one execution of the convolution and of each reorder needs as scratchpad: every
  // call brings its thread's own (see `build`).
  dnnl_memory_desc_t conv_scratch{};
  std::array<dnnl_memory_desc_t, 3> reorder_scratch{};
  std::string impl;

  Primitive() = default;
  Primitive(const Primitive&) = delete;
  Primitive& operator=(const Primitive&) = delete;
  Primitive(Primitive&& o) noexcept { *this = std::move(o); }
  Primitive& operator=(Primitive&& o) noexcept {
    std::swap(conv, o.conv);
    std::swap(reorder, o.reorder);
    layout = o.layout, user = o.user, inner = o.inner, bias = o.bias, impl = std::move(o.impl);
    conv_scratch = o.conv_scratch, reorder_scratch = o.reorder_scratch;
    return *this;
  }
  ~Primitive() {
    if (conv) dnnl_primitive_destroy(conv);
    for (dnnl_primitive_t r : reorder)
      if (r) dnnl_primitive_destroy(r);
  }
  // oneDNN has a kernel for it other than its reference code (which is slower than any
  // other path, im2col + GEMM included).
  bool usable() const { return conv != nullptr && impl.find("ref") == std::string::npos; }
};

// An oneDNN call's status as an error.
void check(dnnl_status_t s, const char* what) {
  if (s != dnnl_success)
    throw ValueError(std::string("[conv2d] oneDNN ") + what + " failed (status " +
                     std::to_string(static_cast<int>(s)) + ")");
}

Slot result_slot(ConvPass pass) {
  return pass == ConvPass::Forward ? kDy : pass == ConvPass::BackwardData ? kImage : kWeights;
}

// Builds the primitive of `pr` on `layout` (nullptr conv when oneDNN has no implementation).
Primitive build(const Problem& pr, int64_t crop_h, int64_t crop_w, Layout layout) {
  const Geometry& g = pr.g;
  Primitive p;
  p.layout = layout;
  const dnnl_data_type_t in = dnnl_type(pr.in), out = dnnl_type(pr.out);
  std::array<dnnl_data_type_t, 3> types{in, in, in};
  types[result_slot(pr.pass)] = out;
  const int64_t o = g.groups * g.og;
  // The image: contiguous NCHW, less the rows and columns no window reaches.
  const dnnl_dims_t image_dims = {g.n, g.c, g.h - crop_h, g.w - crop_w};
  const dnnl_dims_t image_strides = {g.c * g.h * g.w, g.h * g.w, g.w, 1};
  const dnnl_dims_t dy_dims = {g.n, o, g.oh, g.ow};
  const dnnl_dims_t dy_strides = {pr.dy[0], pr.dy[1], pr.dy[2], pr.dy[3]};
  const bool grouped = g.groups > 1;
  const dnnl_dims_t w_dims5 = {g.groups, g.og, g.cg, g.kh, g.kw};
  const dnnl_dims_t w_dims4 = {o, g.cg, g.kh, g.kw};
  const dnnl_dims_t w_strides5 = {pr.w[0], pr.w[1], pr.w[2], pr.w[3], pr.w[4]};
  const dnnl_dims_t w_strides4 = {pr.w[1], pr.w[2], pr.w[3], pr.w[4]};
  const int wn = grouped ? 5 : 4;
  const std::array<int, 3> ndims{4, wn, 4};
  const std::array<const int64_t*, 3> dims{image_dims, grouped ? w_dims5 : w_dims4, dy_dims};
  const std::array<const int64_t*, 3> strides{image_strides, grouped ? w_strides5 : w_strides4,
                                              dy_strides};
  // Slot k as the primitive sees it, of dtype `t`: kiln's own strides on the plain layout,
  // else oneDNN's choice.
  auto layout_desc = [&](size_t k, dnnl_data_type_t t) {
    dnnl_memory_desc_t d;
    if (layout == Layout::Plain)
      check(dnnl_memory_desc_init_by_strides(&d, ndims[k], dims[k], t, strides[k]),
            "memory descriptor");
    else
      check(dnnl_memory_desc_init_by_tag(&d, ndims[k], dims[k], t, dnnl_format_tag_any),
            "memory descriptor");
    return d;
  };
  std::array<dnnl_memory_desc_t, 3> any{};
  for (size_t k = 0; k < 3; ++k) {
    check(dnnl_memory_desc_init_by_strides(&p.user[k], ndims[k], dims[k], types[k], strides[k]),
          "memory descriptor");
    any[k] = layout_desc(k, types[k]);
  }
  const dnnl_dims_t conv_strides = {g.sh, g.sw}, dilates = {g.dh - 1, g.dw - 1},
                    pad_l = {g.ph, g.pw};
  const dnnl_dims_t pad_r = {(g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1 - (g.h - crop_h) - g.ph,
                             (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1 - (g.w - crop_w) - g.pw};
  const dnnl_alg_kind_t alg = dnnl_convolution_direct;
  // The forward descriptor (the backward passes' hint), on the operands' dtype.
  dnnl_memory_desc_t fwd_src = any[kImage], fwd_w = any[kWeights], fwd_dst = any[kDy];
  if (pr.pass != ConvPass::Forward) {
    fwd_src = layout_desc(kImage, in);
    fwd_w = layout_desc(kWeights, in);
    fwd_dst = layout_desc(kDy, in);
  }
  dnnl_convolution_desc_t fwd;
  const dnnl_dims_t bias_dims = {o}, bias_strides = {1};
  const bool with_bias = pr.bias && pr.pass == ConvPass::Forward;
  if (with_bias)
    check(dnnl_memory_desc_init_by_strides(&p.bias, 1, bias_dims, dnnl_f32, bias_strides),
          "memory descriptor");
  if (dnnl_dilated_convolution_forward_desc_init(
          &fwd, dnnl_forward_training, alg, &fwd_src, &fwd_w, with_bias ? &p.bias : nullptr,
          &fwd_dst, conv_strides, dilates, pad_l, pad_r) != dnnl_success)
    return p;
  dnnl_primitive_desc_t hint = nullptr, pd = nullptr;
  // Primitives are cached and run from any thread, several at once; oneDNN's default
  // scratchpad is shared by all primitives and safe only on the creating thread, so each
  // primitive takes a user scratchpad and each call passes its thread's own.
  dnnl_primitive_attr_t raw_attr = nullptr;
  check(dnnl_primitive_attr_create(&raw_attr), "attribute creation");
  const std::unique_ptr<std::remove_pointer_t<dnnl_primitive_attr_t>,
                        dnnl_status_t (*)(dnnl_primitive_attr_t)>
      attr(raw_attr, dnnl_primitive_attr_destroy);
  check(dnnl_primitive_attr_set_scratchpad_mode(attr.get(), dnnl_scratchpad_mode_user),
        "scratchpad mode");
  // The forward's descriptor is its own primitive's (with the attribute), else only a hint.
  if (dnnl_primitive_desc_create(&hint, &fwd, pr.pass == ConvPass::Forward ? attr.get() : nullptr,
                                 engine(), nullptr) != dnnl_success)
    return p;
  dnnl_convolution_desc_t desc;
  dnnl_status_t s = dnnl_success;
  if (pr.pass == ConvPass::Forward) {
    pd = hint;
    hint = nullptr;
  } else if (pr.pass == ConvPass::BackwardData) {
    s = dnnl_dilated_convolution_backward_data_desc_init(
        &desc, alg, &any[kImage], &any[kWeights], &any[kDy], conv_strides, dilates, pad_l, pad_r);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &desc, attr.get(), engine(), hint);
  } else {
    s = dnnl_dilated_convolution_backward_weights_desc_init(&desc, alg, &any[kImage],
                                                            &any[kWeights], nullptr, &any[kDy],
                                                            conv_strides, dilates, pad_l, pad_r);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &desc, attr.get(), engine(), hint);
  }
  if (hint) dnnl_primitive_desc_destroy(hint);
  if (s != dnnl_success || pd == nullptr) return p;
  const char* impl = nullptr;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
    p.impl = impl;
  const dnnl_query_t queries[3][3] = {
      {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md},             // forward
      {dnnl_query_diff_src_md, dnnl_query_weights_md, dnnl_query_diff_dst_md},   // data
      {dnnl_query_src_md, dnnl_query_diff_weights_md, dnnl_query_diff_dst_md}};  // weights
  const auto pass = static_cast<size_t>(pr.pass);
  for (size_t k = 0; k < 3; ++k)
    p.inner[k] = *dnnl_primitive_desc_query_md(pd, queries[pass][k], 0);
  p.conv_scratch = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  check(dnnl_primitive_create(&p.conv, pd), "primitive creation");
  dnnl_primitive_desc_destroy(pd);
  const Slot result = result_slot(pr.pass);
  for (size_t k = 0; k < 3; ++k) {
    if (dnnl_memory_desc_equal(&p.user[k], &p.inner[k])) continue;
    dnnl_primitive_desc_t rpd = nullptr;
    const bool back = k == result;
    check(dnnl_reorder_primitive_desc_create(&rpd, back ? &p.inner[k] : &p.user[k], engine(),
                                             back ? &p.user[k] : &p.inner[k], engine(), attr.get()),
          "reorder");
    p.reorder_scratch[k] = *dnnl_primitive_desc_query_md(rpd, dnnl_query_scratchpad_md, 0);
    check(dnnl_primitive_create(&p.reorder[k], rpd), "reorder");
    dnnl_primitive_desc_destroy(rpd);
  }
  return p;
}

// The most that oneDNN's own layouts grow one of the call's tensors by padding a blocked
// dimension: 1 when nothing is padded, 16/3 for the stem's 3 image channels in nChw16c.
double padding_growth(const Primitive& p) {
  double most = 1;
  for (const dnnl_memory_desc_t& d : p.inner) {
    double real = 1, padded = 1;
    for (int i = 0; i < d.ndims; ++i) {
      real *= static_cast<double>(d.dims[i]);
      padded *= static_cast<double>(d.padded_dims[i]);
    }
    if (real > 0) most = std::max(most, padded / real);
  }
  return most;
}

// Whether oneDNN's convolution on plain layouts is one GEMM per image on the tensors as they
// are stored: a 1x1 kernel at stride 1 without padding (nothing to gather into patches).
bool im2col_free(const Geometry& g, int64_t crop_h, int64_t crop_w) {
  return g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0 &&
         crop_h == 0 && crop_w == 0;
}

// The layout a oneDNN call runs on (KILN_CONV_LAYOUT=blocked or plain forces one where oneDNN
// has a kernel for it; float32 1x1 convolutions at stride 1 without padding do not get here,
// see run_gemms). The rule, from what each layout costs besides the convolution itself:
// blocked layouts pay the reorders of the image and dy (a read and a write of each), plain
// layouts pay oneDNN's im2col (a copy of kh*kw times the image) and its GEMM, which measured
// 1.8-2.4x the blocked kernels with their reorders on bench_conv's 3x3 and stem passes. So:
//   * plain where it needs no im2col (1x1, stride 1, no padding): the same GEMM with no
//     copies at all (bench_conv's 1x1 forward and backward data: 0.6x the blocked time);
//   * plain where the blocked layout pads a tensor to 2x or more, since the blocked kernels
//     then compute on as many zeros as values or more (the stem's backward data, whose 3
//     image channels become 16: 0.47x the blocked time);
//   * else blocked.
// The weight gradient stays blocked whatever it costs: oneDNN's GEMM-based one sums partial
// gradients per thread, so its bits change with the thread count (a 1x1 weight gradient on
// 1 thread differs from 2), and kiln's results may not.
Primitive choose(const Problem& pr, int64_t crop_h, int64_t crop_w, const std::string& want) {
  auto other = [](Layout l) { return l == Layout::Plain ? Layout::Blocked : Layout::Plain; };
  auto try_in_order = [&](Layout first) {
    Primitive p = build(pr, crop_h, crop_w, first);
    if (p.usable()) return p;
    Primitive q = build(pr, crop_h, crop_w, other(first));
    return q.usable() ? std::move(q) : std::move(p);
  };
  if (want == "plain") return try_in_order(Layout::Plain);
  // Never the GEMM-based weight gradient unless forced, not even in place of reference code.
  if (pr.pass == ConvPass::BackwardWeights) return build(pr, crop_h, crop_w, Layout::Blocked);
  if (want == "blocked") return try_in_order(Layout::Blocked);
  if (im2col_free(pr.g, crop_h, crop_w)) return try_in_order(Layout::Plain);
  Primitive blocked = build(pr, crop_h, crop_w, Layout::Blocked);
  if (blocked.usable() && padding_growth(blocked) < 2) return blocked;
  Primitive plain = build(pr, crop_h, crop_w, Layout::Plain);
  return plain.usable() || !blocked.usable() ? std::move(plain) : std::move(blocked);
}

// KILN_CONV_LAYOUT: auto (the rule), blocked, plain (oneDNN on kiln's tensors) or gemm
// (kiln's GEMM calls where the convolution is one GEMM per image, else the rule).
std::string requested_layout() {
  return settings::choice("KILN_CONV_LAYOUT", {"auto", "blocked", "plain", "gemm"})
      .value_or("auto");
}

// The cached primitive of a problem (its every size, stride and dtype is the key).
std::shared_ptr<const Primitive> primitive_for(const Problem& pr, int64_t crop_h, int64_t crop_w) {
  static std::mutex mutex;
  static std::map<std::vector<int64_t>, std::shared_ptr<const Primitive>> cache;
  const std::string want = requested_layout();
  const Geometry& g = pr.g;
  std::vector<int64_t> key{static_cast<int64_t>(pr.pass),
                           static_cast<int64_t>(pr.in),
                           static_cast<int64_t>(pr.out),
                           crop_h,
                           crop_w,
                           pr.bias ? 1 : 0,
                           want == "plain"     ? 2
                           : want == "blocked" ? 1
                                               : 0};  // gemm: the rule, where GEMMs cannot run
  for (int64_t v : {g.n, g.c, g.h, g.w, g.groups, g.cg, g.og, g.oh, g.ow, g.kh, g.kw, g.sh, g.sw,
                    g.ph, g.pw, g.dh, g.dw})
    key.push_back(v);
  key.insert(key.end(), pr.dy.begin(), pr.dy.end());
  key.insert(key.end(), pr.w.begin(), pr.w.end());
  std::lock_guard lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  // Bounded: a workload with very many shapes drops them all and starts again (a call in
  // flight on another thread keeps its primitive alive through its shared pointer).
  if (cache.size() >= 512) cache.clear();
  auto made = std::make_shared<Primitive>(choose(pr, crop_h, crop_w, want));
  cache.emplace(std::move(key), made);
  return made;
}

// A 64-byte aligned scratch block per thread and slot, grown on demand and kept: a blocked
// copy of a tensor is remade on every call, and fresh pages would be faulted in each time.
void* scratch(size_t slot, size_t bytes) {
  struct Block {
    void* data = nullptr;
    size_t size = 0;
    ~Block() { std::free(data); }
  };
  thread_local std::array<Block, 4> blocks;
  Block& b = blocks[slot];
  if (b.size < bytes) {
    std::free(b.data);
    b.size = (bytes + 63) / 64 * 64;
    b.data = std::aligned_alloc(64, b.size);
    if (!b.data) throw ValueError("[conv2d] out of host memory for a oneDNN scratch block");
  }
  return b.data;
}

// oneDNN runs on OpenMP: its team gets the kiln pool's thread count for the call (the pool
// is idle meanwhile), and the calling thread's own setting (1 for GEMM callers) is restored.
class OpenMpThreads {
 public:
  explicit OpenMpThreads(int threads) {
    using Set = void (*)(int);
    using Get = int (*)();
    static const auto set = reinterpret_cast<Set>(::dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    static const auto get = reinterpret_cast<Get>(::dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    if (set && get) {
      set_ = set;
      before_ = get();
      set(threads);
    }
  }
  ~OpenMpThreads() {
    if (set_) set_(before_);
  }
  OpenMpThreads(const OpenMpThreads&) = delete;
  OpenMpThreads& operator=(const OpenMpThreads&) = delete;

 private:
  void (*set_)(int) = nullptr;
  int before_ = 1;
};

// Runs `prim` with `args` and this thread's scratchpad (slot 3 of `scratch`) of `scratchpad`.
void execute(dnnl_primitive_t prim, dnnl_stream_t stream, const dnnl_memory_desc_t& scratchpad,
             std::initializer_list<dnnl_exec_arg_t> args) {
  dnnl_memory_t pad = nullptr;
  check(dnnl_memory_create(&pad, &scratchpad, engine(),
                           scratch(3, std::max<size_t>(dnnl_memory_desc_get_size(&scratchpad), 1))),
        "scratchpad");
  std::vector<dnnl_exec_arg_t> all(args);
  all.push_back({DNNL_ARG_SCRATCHPAD, pad});
  const dnnl_status_t s =
      dnnl_primitive_execute(prim, stream, static_cast<int>(all.size()), all.data());
  dnnl_memory_destroy(pad);
  check(s, "execution");
}

void release(std::array<dnnl_memory_t, 3>& um, std::array<dnnl_memory_t, 3>& im,
             dnnl_memory_t bias) {
  for (dnnl_memory_t m : um)
    if (m) dnnl_memory_destroy(m);
  for (dnnl_memory_t m : im)
    if (m) dnnl_memory_destroy(m);
  if (bias) dnnl_memory_destroy(bias);
}

std::atomic<size_t> g_blocked_calls{0}, g_plain_calls{0}, g_gemm_calls{0};

// A float32 matrix in memory: element (i, j) at p[i * rs + j * cs].
struct Matrix {
  float* p;
  int64_t rows, cols, rs, cs;
  Matrix t() const { return {p, cols, rows, cs, rs}; }
};

// How BLAS reads `m` as a row-major operand: as stored (cs 1, ld rs) or transposed (rs 1, ld
// cs). A dimension of extent 1 takes any stride. False when neither stride is 1.
bool blas_operand(const Matrix& m, bool* trans, int64_t* ld) {
  if (m.cs == 1 || m.cols == 1) {
    *trans = false;
    *ld = std::max(m.rs, m.cols);
    return m.rows == 1 || m.rs >= m.cols;
  }
  if (m.rs == 1 || m.rows == 1) {
    *trans = true;
    *ld = std::max(m.cs, m.rows);
    return m.cols == 1 || m.cs >= m.rows;
  }
  return false;
}

// c = a @ b (+ c when `accumulate`) on one thread; false when a layout is not one BLAS
// reads (nothing is computed then).
bool gemm(const Matrix& a, const Matrix& b, const Matrix& c, bool accumulate, bool dry_run) {
  // A result whose rows are contiguous is computed as its transpose: c^T = b^T @ a^T.
  if (c.cs != 1 && c.cols > 1) {
    if (c.rs != 1 && c.rows > 1) return false;
    return gemm(b.t(), a.t(), c.t(), accumulate, dry_run);
  }
  bool ta = false, tb = false;
  int64_t lda = 0, ldb = 0;
  if (!blas_operand(a, &ta, &lda) || !blas_operand(b, &tb, &ldb)) return false;
  const int64_t ldc = std::max(c.rs, c.cols);
  if (c.rows > 1 && c.rs < c.cols) return false;
  if (!dry_run)
    cpu_gemm(DType::Float32, ta, tb, c.rows, c.cols, a.cols, a.p, lda, b.p, ldb, accumulate, c.p,
             ldc);
  return true;
}

// Width of the fixed blocks a GEMM convolution is cut into: every block is one BLAS call
// whatever the thread count, so each result element is summed in the same order on any
// number of threads (library GEMM's own row split would change with it).
constexpr int64_t kGemmBlock = 1024;
constexpr int64_t kWeightBlock = 64;

// A 1x1 convolution at stride 1 without padding (im2col_free) as kiln's own float32 GEMM
// calls on the thread pool, reading and writing kiln's tensors as stored: per image and
// group, forward y = w @ x (+ bias), backward data dx = w^T @ dy, and the weight gradient
// dw = sum over images of dy @ x^T (images added in order). oneDNN's GEMM convolution does
// the same products with no reorders, but its weight gradient's bits change with the thread
// count, and its two OpenMP threads spin in libgomp's barriers whenever one of them is
// descheduled: on a 2-core machine shared with two busy processes its 1x1 forward took
// 96-188 ms (12 ms on one thread); these calls are one pool job of independent BLAS calls.
// False (nothing run) when a tensor's layout is not one BLAS reads.
bool run_gemms(const Problem& pr, bool dry_run) {
  const Geometry& g = pr.g;
  if (pr.in != DType::Float32 || pr.out != DType::Float32 || !im2col_free(g, 0, 0)) return false;
  const int64_t hw = g.h * g.w;
  // dy's OH and OW must flatten into one stride, as the image's do.
  if (g.oh > 1 && g.ow > 1 && pr.dy[2] != g.ow * pr.dy[3]) return false;
  const int64_t dy_hw = g.ow > 1 ? pr.dy[3] : pr.dy[2];
  Node& out = *pr.root;
  std::shared_ptr<Buffer> buffer;
  float* result = nullptr;
  if (!dry_run) {
    buffer = out.buffer ? out.buffer : std::make_shared<Buffer>(out.nbytes(), out.device);
    result = static_cast<float*>(buffer->data());
  }
  auto data = [](Node* n) { return n ? static_cast<float*>(n->buffer->data()) : nullptr; };
  float* image = pr.pass == ConvPass::BackwardData ? result : dry_run ? nullptr : data(pr.a);
  float* weights = pr.pass == ConvPass::BackwardWeights ? result
                   : dry_run                            ? nullptr
                                                        : data(pr.b) + pr.w_offset;
  float* dy = pr.pass == ConvPass::Forward ? result
              : dry_run                    ? nullptr
                        : data(pr.pass == ConvPass::BackwardData ? pr.a : pr.b) + pr.dy_offset;
  // The matrices of image n, group gi.
  auto x_of = [&](int64_t n, int64_t gi) {
    return Matrix{image ? image + n * g.c * hw + gi * g.cg * hw : nullptr, g.cg, hw, hw, 1};
  };
  auto w_of = [&](int64_t gi) {
    return Matrix{weights ? weights + gi * pr.w[0] : nullptr, g.og, g.cg, pr.w[1], pr.w[2]};
  };
  auto dy_of = [&](int64_t n, int64_t gi) {
    return Matrix{dy ? dy + n * pr.dy[0] + gi * g.og * pr.dy[1] : nullptr, g.og, hw, pr.dy[1],
                  dy_hw};
  };
  auto cols = [](const Matrix& m, int64_t c0, int64_t c1) {
    return Matrix{m.p ? m.p + c0 * m.cs : nullptr, m.rows, c1 - c0, m.rs, m.cs};
  };
  auto rows = [](const Matrix& m, int64_t r0, int64_t r1) {
    return Matrix{m.p ? m.p + r0 * m.rs : nullptr, r1 - r0, m.cols, m.rs, m.cs};
  };
  // Whether BLAS reads every matrix: the first block of each kind stands for all.
  const int64_t blocks = (hw + kGemmBlock - 1) / kGemmBlock;
  const bool weight_rows = g.og >= g.cg;  // the weight gradient's blocks cut its longer side
  const int64_t wblocks = ((weight_rows ? g.og : g.cg) + kWeightBlock - 1) / kWeightBlock;
  auto block = [&](int64_t task, bool dry) {
    if (pr.pass == ConvPass::BackwardWeights) {
      const int64_t gi = task / wblocks, b = task % wblocks;
      const int64_t lo = b * kWeightBlock;
      const int64_t hi = std::min(lo + kWeightBlock, weight_rows ? g.og : g.cg);
      for (int64_t n = 0; n < g.n; ++n) {
        Matrix d = dy_of(n, gi), x = x_of(n, gi), w = w_of(gi);
        if (weight_rows) {
          d = rows(d, lo, hi);
          w = rows(w, lo, hi);
        } else {
          x = rows(x, lo, hi);
          w = cols(w, lo, hi);
        }
        if (!gemm(d, x.t(), w, n > 0, dry)) return false;
        if (dry) break;
      }
      return true;
    }
    const int64_t n = task / (g.groups * blocks), gi = task / blocks % g.groups;
    const int64_t c0 = task % blocks * kGemmBlock, c1 = std::min(c0 + kGemmBlock, hw);
    if (pr.pass == ConvPass::BackwardData)
      return gemm(w_of(gi).t(), cols(dy_of(n, gi), c0, c1), cols(x_of(n, gi), c0, c1), false, dry);
    const Matrix y = cols(dy_of(n, gi), c0, c1);
    const float* bias = pr.bias && !dry ? data(pr.bias) + pr.bias_offset : nullptr;
    // y holds the bias, and the GEMM adds the products to it (BLAS beta = 1).
    if (bias)
      for (int64_t o = 0; o < y.rows; ++o)
        for (int64_t j = 0; j < y.cols; ++j) y.p[o * y.rs + j * y.cs] = bias[gi * g.og + o];
    return gemm(w_of(gi), cols(x_of(n, gi), c0, c1), y, bias != nullptr, dry);
  };
  if (!block(0, true)) return false;
  if (dry_run) return true;
  const int64_t tasks =
      pr.pass == ConvPass::BackwardWeights ? g.groups * wblocks : g.n * g.groups * blocks;
  thread_pool().parallel_for(tasks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      if (!block(t, false))  // the first block's layout stands for all: never taken
        throw ValueError("[conv2d] a GEMM block of a 1x1 convolution has no BLAS layout");
  });
  out.buffer = std::move(buffer);
  g_gemm_calls.fetch_add(1);
  return true;
}

void run_dnnl(const Problem& pr) {
  const Geometry& g = pr.g;
  // Rows and columns past the last window (floor division of the output size) are never
  // read: oneDNN wants them cut off rather than a negative right padding.
  const int64_t span_h = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1 - g.ph;
  const int64_t span_w = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1 - g.pw;
  const int64_t crop_h = std::max<int64_t>(0, g.h - span_h);
  const int64_t crop_w = std::max<int64_t>(0, g.w - span_w);
  const std::shared_ptr<const Primitive> held = primitive_for(pr, crop_h, crop_w);
  const Primitive& p = *held;
  if (!p.conv)
    throw ValueError("[conv2d] oneDNN has no convolution for this shape and dtype (" +
                     std::string(dtype_name(pr.in)) + ")");
  Node& out = *pr.root;
  std::shared_ptr<Buffer> buffer =
      out.buffer ? out.buffer : std::make_shared<Buffer>(out.nbytes(), out.device);
  const Slot result = result_slot(pr.pass);
  // The user buffers of the three slots.
  std::array<char*, 3> user{};
  const size_t in_size = itemsize(pr.in);
  auto base = [&](Node* n) { return static_cast<char*>(n->buffer->data()); };
  char* image = pr.pass == ConvPass::BackwardData ? static_cast<char*>(buffer->data()) : base(pr.a);
  char* weights = pr.pass == ConvPass::BackwardWeights
                      ? static_cast<char*>(buffer->data())
                      : base(pr.b) + pr.w_offset * static_cast<int64_t>(in_size);
  char* dy = pr.pass == ConvPass::Forward ? static_cast<char*>(buffer->data())
                                          : base(pr.pass == ConvPass::BackwardData ? pr.a : pr.b) +
                                                pr.dy_offset * static_cast<int64_t>(in_size);
  user = {image, weights, dy};
  if (pr.pass == ConvPass::BackwardData && (crop_h > 0 || crop_w > 0))
    std::memset(buffer->data(), 0, out.nbytes());
  thread_local dnnl_stream_t stream = [] {
    dnnl_stream_t s = nullptr;
    if (dnnl_stream_create(&s, engine(), dnnl_stream_default_flags) != dnnl_success) s = nullptr;
    return s;
  }();
  if (!stream) throw ValueError("[conv2d] could not create a oneDNN stream");
  OpenMpThreads threads(static_cast<int>(thread_pool().size()));
  std::array<dnnl_memory_t, 3> um{}, im{};
  dnnl_memory_t bias = nullptr;
  try {
    if (pr.bias)
      check(dnnl_memory_create(&bias, &p.bias, engine(),
                               static_cast<float*>(pr.bias->buffer->data()) + pr.bias_offset),
            "memory");
    for (size_t k = 0; k < 3; ++k) {
      check(dnnl_memory_create(&um[k], &p.user[k], engine(), user[k]), "memory");
      if (!p.reorder[k]) continue;
      void* data = scratch(k, dnnl_memory_desc_get_size(&p.inner[k]));
      check(dnnl_memory_create(&im[k], &p.inner[k], engine(), data), "memory");
      if (k != result)
        execute(p.reorder[k], stream, p.reorder_scratch[k],
                {{DNNL_ARG_FROM, um[k]}, {DNNL_ARG_TO, im[k]}});
    }
    auto arg = [&](size_t k) { return im[k] ? im[k] : um[k]; };
    if (pr.pass == ConvPass::Forward && bias)
      execute(p.conv, stream, p.conv_scratch,
              {{DNNL_ARG_SRC, arg(kImage)},
               {DNNL_ARG_WEIGHTS, arg(kWeights)},
               {DNNL_ARG_BIAS, bias},
               {DNNL_ARG_DST, arg(kDy)}});
    else if (pr.pass == ConvPass::Forward)
      execute(p.conv, stream, p.conv_scratch,
              {{DNNL_ARG_SRC, arg(kImage)},
               {DNNL_ARG_WEIGHTS, arg(kWeights)},
               {DNNL_ARG_DST, arg(kDy)}});
    else if (pr.pass == ConvPass::BackwardData)
      execute(p.conv, stream, p.conv_scratch,
              {{DNNL_ARG_DIFF_SRC, arg(kImage)},
               {DNNL_ARG_WEIGHTS, arg(kWeights)},
               {DNNL_ARG_DIFF_DST, arg(kDy)}});
    else
      execute(p.conv, stream, p.conv_scratch,
              {{DNNL_ARG_SRC, arg(kImage)},
               {DNNL_ARG_DIFF_WEIGHTS, arg(kWeights)},
               {DNNL_ARG_DIFF_DST, arg(kDy)}});
    if (p.reorder[result])
      execute(p.reorder[result], stream, p.reorder_scratch[result],
              {{DNNL_ARG_FROM, im[result]}, {DNNL_ARG_TO, um[result]}});
    check(dnnl_stream_wait(stream), "stream wait");
  } catch (...) {
    release(um, im, bias);
    throw;
  }
  release(um, im, bias);
  out.buffer = std::move(buffer);
  (p.layout == Layout::Plain ? g_plain_calls : g_blocked_calls).fetch_add(1);
}

// A 3x3 convolution of `dtype` on 16 channels: whether oneDNN has all three passes for it on
// this CPU (not its reference code), and the forward's implementation name.
std::string probe(DType dtype) {
  Problem pr;
  pr.in = dtype;
  pr.g = Geometry{1, 16, 8, 8, 1, 16, 16, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1};
  pr.dy = {16 * 64, 64, 8, 1};
  pr.w = {16 * 144, 144, 9, 3, 1};
  std::string impl;
  for (ConvPass pass : {ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardWeights}) {
    pr.pass = pass;
    pr.out = pass == ConvPass::BackwardData ? dtype : DType::Float32;
    const Primitive p = choose(pr, 0, 0, "blocked");
    if (!p.usable()) return "";
    if (pass == ConvPass::Forward) impl = p.impl;
  }
  return impl;
}

const std::string& probed(DType dtype) {
  static const std::string f32 = probe(DType::Float32), bf16 = probe(DType::BFloat16),
                           f16 = probe(DType::Float16);
  return dtype == DType::BFloat16 ? bf16 : dtype == DType::Float16 ? f16 : f32;
}

#endif

}  // namespace

bool cpu_conv_available(DType dtype) {
#if KILN_WITH_DNNL
  if (dtype != DType::Float32 && !is_half(dtype)) return false;
  return !probed(dtype).empty();
#else
  (void)dtype;
  return false;
#endif
}

std::string conv_path(DType dtype) {
#if KILN_WITH_DNNL
  if (cpu_conv_available(dtype)) {
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch) + " convolution, " + gemm_path(DType::Float32).kernels + " (" +
           probed(dtype) + " on a 3x3 probe)" +
           (dtype == DType::Float32 ? "; 1x1 at stride 1 without padding: GEMM calls" : "");
  }
#endif
  (void)dtype;
  return "im2col + GEMM";
}

ConvLayoutCalls conv_layout_calls() {
#if KILN_WITH_DNNL
  return {g_blocked_calls.load(), g_plain_calls.load(), g_gemm_calls.load()};
#else
  return {};
#endif
}

bool match_conv(Node* root, const std::function<bool(Node*)>& single_use, ConvMatch* match) {
  Problem pr;
  if (!analyze(root, false, &pr)) return false;
  // What the call computes inside must be needed by it alone: the product (and the backward
  // data's sum into the image) and the product's factors.
  Node* mul = pr.product->inputs[0].get();
  // The forward's value before the bias and before the permute: needed by the call alone.
  if (!single_use(mul) || (pr.value != root && !single_use(pr.value)) ||
      (pr.product != root && !single_use(pr.product)))
    return false;
  if (pr.pass == ConvPass::BackwardData) {
    if (!single_use(pr.product)) return false;
    if (root->inputs[0].get() != pr.product && !single_use(root->inputs[0].get())) return false;
  }
  if (!cpu_conv_available(pr.in)) return false;
  match->pass = pr.pass;
  match->root = root;
  match->product = pr.product;
  match->absorbed = pr.absorbed;
  match->a = pr.a;
  match->b = pr.b;
  match->bias = pr.bias;
  return true;
}

void run_conv(const ConvMatch& match) {
  Problem pr;
  if (!analyze(match.root, true, &pr) || pr.pass != match.pass)
    throw ValueError("[conv2d] the library convolution no longer matches its plan");
#if KILN_WITH_DNNL
  // A float32 1x1 convolution at stride 1 without padding is kiln's GEMM calls (run_gemms),
  // unless a layout of oneDNN's convolution is forced.
  const std::string want = requested_layout();
  if ((want == "auto" || want == "gemm") && run_gemms(pr, false)) return;
  run_dnnl(pr);
#else
  throw ValueError("[conv2d] a library convolution was planned in a build without oneDNN");
#endif
}

}  // namespace kiln::jit
