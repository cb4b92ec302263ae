#pragma once
// The models the training benchmarks share (bench_train, bench_plan): a character LSTM and
// a small GPT-style Transformer over a 128-token vocabulary.
#include <memory>
#include <vector>

#include "frontend/kiln.h"
#include "frontend/nn/nn.h"

namespace kiln::bench {

/// Embedding(128, 128) -> LSTM(128, 256) -> Linear(256, 128).
class CharLSTM : public nn::Module {
 public:
  CharLSTM() : nn::Module("CharLSTM") {
    embed = register_module("embed", std::make_shared<nn::Embedding>(128, 128));
    lstm = register_module("lstm", std::make_shared<nn::LSTM>(128, 256, 1, true, true));
    head = register_module("head", std::make_shared<nn::Linear>(256, 128));
  }
  /// Logits [batch, seq, 128] of int64 tokens [batch, seq].
  Tensor forward(const Tensor& tokens) {
    return head->forward(lstm->forward(embed->forward(tokens)).output);
  }
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::LSTM> lstm;
  std::shared_ptr<nn::Linear> head;
};

/// Token and position embeddings (d_model 256), `layers` causal encoder layers (4 heads,
/// feed-forward 1024, dropout 0.1, pre-norm), Linear(256, 128); sequences up to `max_len`.
class GPT : public nn::Module {
 public:
  GPT(int layers, int64_t max_len) : nn::Module("GPT") {
    embed = register_module("embed", std::make_shared<nn::Embedding>(128, 256));
    pos = register_module("pos", std::make_shared<nn::Embedding>(max_len, 256));
    auto list = register_module("blocks", std::make_shared<nn::Sequential>());
    for (int i = 0; i < layers; ++i) {
      blocks.push_back(std::make_shared<nn::TransformerEncoderLayer>(
          256, 4, 1024, 0.1, nn::Activation::ReLU, 1e-5, true, true));
      list->push_back(blocks.back());
    }
    head = register_module("head", std::make_shared<nn::Linear>(256, 128));
  }
  /// Logits [batch, seq, 128] of int64 tokens [batch, seq].
  Tensor forward(const Tensor& tokens) {
    Tensor h = embed->forward(tokens) + pos->forward(arange(tokens.size(1)));
    for (auto& b : blocks) h = b->forward(h, Tensor(), Tensor(), true);
    return head->forward(h);
  }
  std::shared_ptr<nn::Embedding> embed, pos;
  std::vector<std::shared_ptr<nn::TransformerEncoderLayer>> blocks;
  std::shared_ptr<nn::Linear> head;
};

}  // namespace kiln::bench
