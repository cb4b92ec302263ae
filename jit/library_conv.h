#pragma once
// Library convolution: recognises the three products of the conv2d composition
// (frontend/nn/functional.cpp: im2col by a reindex, a product over
// [G, N, OH, OW, Og, C/G, kh, kw], a sum) and runs each on oneDNN's convolution primitive
// instead of a GEMM over stored patches:
//   forward           out[n, oh, ow, o] = sum patches * weight   (src, weights -> dst)
//   backward data     dx = col2im(sum_og dy * weight)              (diff_dst, weights -> diff_src)
//   backward weights  dw = sum_{n, oh, ow} dy * patches            (src, diff_dst -> diff_weights)
// The patches are never stored: the call reads the image they index. Each pattern is
// identified by the strides at which every operand reads the product's domain (the same
// analysis as library GEMM), so any layout of dy or the weight that a stride describes is
// taken. The composition stays the reference (ops/reference.cpp evaluates it) and the
// fallback: float64, or a build without oneDNN, or a dtype oneDNN has no kernels for on this
// CPU, keeps im2col + library GEMM.
#include <functional>
#include <string>
#include <vector>

#include "../core/node.h"

namespace kiln::jit {

enum class ConvPass : uint8_t { Forward, BackwardData, BackwardWeights };

/// A recognised convolution product, run as one library call that computes `root`.
struct ConvMatch {
  ConvPass pass = ConvPass::Forward;
  Node* root = nullptr;         ///< the value the call computes (stored)
  Node* product = nullptr;      ///< the reindex_reduce over the product's domain
  std::vector<Node*> absorbed;  ///< nodes computed inside the call (root excluded)
  Node* a = nullptr;            ///< forward, weights: the image x; data: dy
  Node* b = nullptr;            ///< forward, data: the weight; weights: dy
  Node* bias = nullptr;         ///< forward: a per-channel bias added to the result, or null
};

/// Matches `root` (a pending reindex_reduce) against one of the three products. `single_use`
/// says whether a pending node has exactly one consumer and is not an output.
bool match_conv(Node* root, const std::function<bool(Node*)>& single_use, ConvMatch* match);

/// Computes match.root's value from the buffers of match.a and match.b.
void run_conv(const ConvMatch& match);

/// Library convolution calls made so far in this process, by how they ran: oneDNN's
/// convolution on its own blocked layouts (with reorders around the primitive) or on kiln's
/// tensors as stored (plain), or kiln's float32 GEMM calls on the tensors as stored (a 1x1
/// convolution at stride 1 without padding is one GEMM per image). Which one a call takes is
/// decided per pass and shape (see `choose` in library_conv.cpp); KILN_CONV_LAYOUT=blocked,
/// plain or gemm forces one where it can run.
struct ConvLayoutCalls {
  size_t blocked = 0;
  size_t plain = 0;
  size_t gemm = 0;
};
ConvLayoutCalls conv_layout_calls();

/// True when convolutions of `dtype` (the dtype of the image and weight) run on a library
/// on this CPU: float32 with oneDNN built in; bfloat16/float16 where oneDNN has kernels.
bool cpu_conv_available(DType dtype);

/// What runs `dtype` convolutions, for `kiln info`: "oneDNN 2.6.3 convolution,
/// avx512_core_amx (brgconv:avx512_core on a 3x3 probe)" (float32 adds that 1x1
/// convolutions at stride 1 without padding are GEMM calls) or "im2col + GEMM".
std::string conv_path(DType dtype);

}  // namespace kiln::jit
