// Layer input validation and constructor checks: each error is raised when the graph is
// built, with a typed exception naming the layer, what it expected and what it got.
#include "test_nn_support.h"

using namespace nn_test;
namespace nn = kiln::nn;
using Catch::Contains;

TEST_CASE("nn Linear rejects a wrong feature size, rank or dtype", "[nn][errors]") {
  nn::Linear lin(784, 10);
  REQUIRE_THROWS_AS(lin.forward(kiln::zeros({32, 100})), kiln::ShapeError);
  REQUIRE_THROWS_WITH(
      lin.forward(kiln::zeros({32, 100})),
      "[Linear] expected input with last dimension 784 (in_features), got float32[32, 100]");
  REQUIRE_THROWS_AS(lin.forward(kiln::zeros({}, DType::Float32)), kiln::ShapeError);
  REQUIRE_THROWS_AS(lin.forward(kiln::zeros({2, 784}, DType::Int64)), kiln::DTypeError);
  REQUIRE_THROWS_WITH(
      lin.forward(kiln::zeros({2, 784}, DType::Float64)),
      Contains(
          "[Linear] expected input of dtype float32 (the parameters' dtype), got float64[2, 784]"));
  REQUIRE_THROWS_AS(lin.forward(Tensor()), kiln::ValueError);
  REQUIRE_THROWS_WITH(nn::Linear(0, 3), Contains("[Linear] in_features must be >= 1, got 0"));
}

TEST_CASE("nn Conv2d rejects bad inputs and constructor arguments", "[nn][errors][conv]") {
  nn::Conv2d conv(3, 8, 3);
  REQUIRE_THROWS_AS(conv.forward(kiln::zeros({2, 4, 8, 8})), kiln::ShapeError);
  REQUIRE_THROWS_WITH(conv.forward(kiln::zeros({2, 4, 8, 8})),
                      Contains("[Conv2d] expected input with 3 channels (in_channels) in dimension "
                               "1, got float32[2, 4, 8, 8]"));
  REQUIRE_THROWS_WITH(
      conv.forward(kiln::zeros({3, 8})),
      Contains("[Conv2d] expected a 4-D input [N, C, H, W] or 3-D [C, H, W], got float32[3, 8]"));
  REQUIRE_THROWS_WITH(conv.forward(kiln::zeros({2, 3, 8})),
                      Contains("[Conv2d] expected input with 3 channels (in_channels) in dimension "
                               "0, got float32[2, 3, 8]"));
  REQUIRE_THROWS_WITH(conv.forward(kiln::zeros({1, 3, 2, 8})),
                      Contains("smaller than the (dilated) kernel 3"));
  REQUIRE_THROWS_AS(nn::Conv2d(6, 8, 3, 1, 0, 1, 4), kiln::ValueError);
  REQUIRE_THROWS_WITH(nn::Conv2d(6, 8, 3, 1, 0, 1, 4),
                      Contains("[Conv2d] in_channels 6 is not divisible by groups 4"));
  REQUIRE_THROWS_WITH(nn::Conv2d(4, 6, 3, 1, 0, 1, 4),
                      Contains("out_channels 6 is not divisible by groups 4"));
  REQUIRE_THROWS_WITH(nn::Conv2d(3, 8, 3, 0), Contains("[Conv2d] stride must be >= 1, got 0"));
  REQUIRE_THROWS_WITH(nn::Conv2d(3, 8, 3, 1, -1),
                      Contains("[Conv2d] padding must be >= 0, got -1"));
  // The functional form checks the weight against the input too.
  REQUIRE_THROWS_AS(nn::F::conv2d(kiln::zeros({1, 4, 5, 5}), kiln::zeros({2, 3, 3, 3})),
                    kiln::ShapeError);
  REQUIRE_THROWS_WITH(nn::F::max_pool2d(kiln::zeros({1, 1, 5, 5}), 2, 2, 2),
                      Contains("[max_pool2d] padding 2 must be at most half of the kernel size 2"));
}

TEST_CASE("nn LSTM rejects wrong input sizes and initial states", "[nn][errors][lstm]") {
  nn::LSTM lstm(4, 6, 2);
  REQUIRE_THROWS_AS(lstm.forward(kiln::zeros({5, 2, 3})), kiln::ShapeError);
  REQUIRE_THROWS_WITH(lstm.forward(kiln::zeros({5, 2, 3})),
                      Contains("[LSTM] expected input [T, B, 4] (or unbatched [T, 4]) with "
                               "input_size 4, got float32[5, 2, 3]"));
  REQUIRE_THROWS_AS(lstm.forward(kiln::zeros({5, 2, 2, 4})), kiln::ShapeError);
  REQUIRE_THROWS_WITH(
      lstm.forward(kiln::zeros({5, 2, 4}), kiln::zeros({1, 2, 6}), kiln::zeros({1, 2, 6})),
      Contains(
          "[LSTM] expected initial states of shape [2, 2, 6] [num_layers, B, hidden_size], got "
          "float32[1, 2, 6]"));
  REQUIRE_THROWS_AS(lstm.forward(kiln::zeros({5, 2, 4}), kiln::zeros({2, 2, 6})), kiln::ValueError);
  REQUIRE_THROWS_AS(lstm.forward(kiln::zeros({5, 2, 4}, DType::Float64)), kiln::DTypeError);
  REQUIRE_THROWS_WITH(nn::LSTM(4, 6, 1, true, false, 1.5),
                      Contains("[LSTM] dropout must be in [0, 1]"));
}

TEST_CASE("nn MultiheadAttention rejects bad shapes, masks and settings",
          "[nn][errors][attention]") {
  nn::MultiheadAttention mha(8, 2);
  Tensor q = kiln::zeros({3, 2, 8}), kv = kiln::zeros({4, 2, 8});
  REQUIRE_THROWS_AS(mha.forward(kiln::zeros({3, 2, 6}), kv, kv), kiln::ShapeError);
  REQUIRE_THROWS_WITH(
      mha.forward(kiln::zeros({3, 2, 6}), kv, kv),
      Contains(
          "[MultiheadAttention] expected query, key and value [len, N, E] with E = embed_dim 8"));
  REQUIRE_THROWS_WITH(mha.forward(q, kiln::zeros({4, 3, 8}), kiln::zeros({4, 3, 8})),
                      Contains("equal batch sizes"));
  REQUIRE_THROWS_WITH(mha.forward(q, kv, kiln::zeros({5, 2, 8})),
                      Contains("key and value of equal length"));
  REQUIRE_THROWS_WITH(mha.forward(q, kv, kv, kiln::zeros({2, 5}, DType::Bool)),
                      Contains("expected key_padding_mask of shape [2, 4] [N, S], got bool[2, 5]"));
  REQUIRE_THROWS_WITH(
      mha.forward(q, kv, kv, Tensor(), true, kiln::zeros({3, 3}, DType::Bool)),
      Contains(
          "expected attn_mask of shape [3, 4] or [4, 3, 4] [N*num_heads, L, S], got bool[3, 3]"));
  REQUIRE_THROWS_AS(mha.forward(q, kv, kv, Tensor(), true, kiln::zeros({3, 4}, DType::Int64)),
                    kiln::DTypeError);
  REQUIRE_THROWS_WITH(nn::MultiheadAttention(10, 3),
                      Contains("embed_dim 10 must be divisible by num_heads 3"));
  REQUIRE_THROWS_AS(nn::TransformerEncoderLayer(10, 4), kiln::ValueError);
}

TEST_CASE("nn normalisation, embedding and dropout layers reject bad inputs", "[nn][errors]") {
  nn::BatchNorm2d bn(3);
  REQUIRE_THROWS_AS(bn.forward(kiln::zeros({2, 4, 5, 5})), kiln::ShapeError);
  REQUIRE_THROWS_WITH(
      bn.forward(kiln::zeros({2, 4, 5, 5})),
      Contains(
          "[BatchNorm2d] expected input [N, 3, H, W] (num_features 3), got float32[2, 4, 5, 5]"));
  REQUIRE_THROWS_WITH(nn::BatchNorm1d(3).forward(kiln::zeros({1, 3})),
                      Contains("expected more than 1 value per channel when training"));
  nn::LayerNorm ln({4, 5});
  REQUIRE_THROWS_WITH(
      ln.forward(kiln::zeros({2, 5, 4})),
      Contains("[LayerNorm] expected input with trailing dimensions [4, 5] (normalized_shape), got "
               "float32[2, 5, 4]"));
  nn::Embedding emb(10, 4);
  REQUIRE_THROWS_AS(emb.forward(kiln::zeros({3})), kiln::DTypeError);
  REQUIRE_THROWS_WITH(emb.forward(kiln::zeros({3})),
                      Contains("[Embedding] expected integer indices, got float32[3]"));
  REQUIRE_THROWS_AS(nn::Embedding(10, 4, 10), kiln::ValueError);
  REQUIRE_THROWS_WITH(nn::Dropout(1.5),
                      Contains("[Dropout] probability must be in [0, 1], got 1.5"));
  REQUIRE_THROWS_AS(nn::F::dropout(kiln::zeros({3}), -0.1), kiln::ValueError);
}
