#pragma once
// A text as a sequence of character ids, for the character-level examples: the vocabulary
// is the set of bytes that occur, and training batches are random windows of the text.
#include <kiln/kiln.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/example_util.h"
#include "frontend/data.h"

namespace example {

class TextCorpus {
 public:
  /// Reads `path` (plain or gzip); throws kiln::ValueError when it is too short to train on.
  explicit TextCorpus(const std::string& path) : text_(kiln::data::read_text_file(path)) {
    if (text_.size() < 1024) {
      throw kiln::ValueError("[TextCorpus] " + path + " has " + std::to_string(text_.size()) +
                             " characters; at least 1024 are needed to train on");
    }
    id_of_.fill(-1);
    for (unsigned char ch : text_) {
      if (id_of_[ch] < 0) id_of_[ch] = 0;
    }
    for (int b = 0; b < 256; ++b) {
      if (id_of_[b] >= 0) {
        id_of_[b] = static_cast<int64_t>(chars_.size());
        chars_.push_back(static_cast<char>(b));
      }
    }
    ids_.reserve(text_.size());
    for (unsigned char ch : text_) ids_.push_back(id_of_[ch]);
  }

  size_t size() const { return text_.size(); }
  int64_t vocab_size() const { return static_cast<int64_t>(chars_.size()); }
  /// The ids of `s` as a 1-D int64 tensor; characters absent from the text map to id 0.
  kiln::Tensor encode(const std::string& s) const {
    std::vector<int64_t> ids;
    for (unsigned char ch : s) ids.push_back(id_of_[ch] < 0 ? 0 : id_of_[ch]);
    return kiln::from_vector(ids);
  }
  char decode(int64_t id) const { return chars_.at(static_cast<size_t>(id)); }

  /// `batch` random windows of `seq` ids (inputs) and the same windows shifted by one
  /// character (targets), both [batch, seq] int64.
  std::pair<kiln::Tensor, kiln::Tensor> batch(int64_t batch, int64_t seq,
                                              std::mt19937_64& rng) const {
    std::uniform_int_distribution<size_t> start(0, ids_.size() - static_cast<size_t>(seq) - 2);
    std::vector<int64_t> x, y;
    x.reserve(static_cast<size_t>(batch * seq));
    y.reserve(static_cast<size_t>(batch * seq));
    for (int64_t b = 0; b < batch; ++b) {
      size_t s = start(rng);
      x.insert(x.end(), ids_.begin() + static_cast<std::ptrdiff_t>(s),
               ids_.begin() + static_cast<std::ptrdiff_t>(s + seq));
      y.insert(y.end(), ids_.begin() + static_cast<std::ptrdiff_t>(s + 1),
               ids_.begin() + static_cast<std::ptrdiff_t>(s + seq + 1));
    }
    return {kiln::from_vector(x, {batch, seq}), kiln::from_vector(y, {batch, seq})};
  }

 private:
  std::string text_;
  std::array<int64_t, 256> id_of_{};
  std::vector<char> chars_;
  std::vector<int64_t> ids_;
};

/// A character drawn from the softmax of `logits` ([vocab]) at `temperature`.
inline int64_t sample_token(const kiln::Tensor& logits, double temperature, std::mt19937_64& rng) {
  std::vector<double> probs = kiln::softmax(logits / temperature, 0).to_vector<double>();
  return std::discrete_distribution<int64_t>(probs.begin(), probs.end())(rng);
}

/// Prints the smoothed loss at the first and last step of `monitor` against uniform guessing
/// over `vocab` classes ("loss 4.190 -> 2.102 (uniform guessing: 4.190)").
inline void print_loss_change(const kiln::TrainingMonitor& monitor, int64_t vocab) {
  std::printf("loss %.3f -> %.3f (uniform guessing: %.3f)\n", monitor.first().smoothed_loss,
              monitor.last().smoothed_loss, std::log(static_cast<double>(vocab)));
}

}  // namespace example
