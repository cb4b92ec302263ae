#pragma once
// Data helpers: an in-memory dataset of tensors sharing their first dimension, a batch
// iterator with seeded shuffling, numeric CSV and text readers that read gzip
// transparently, and a seeded train/test split.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../core/tensor.h"

namespace kiln::data {

/// One batch: a slice of each dataset tensor, in the dataset's order.
struct Batch {
  std::vector<Tensor> tensors;
  /// tensors[0], the inputs by convention.
  const Tensor& features() const { return tensors.at(0); }
  /// tensors[1], the targets by convention.
  const Tensor& targets() const { return tensors.at(1); }
  /// Number of examples (first dimension).
  int64_t size() const { return tensors.empty() ? 0 : tensors[0].size(0); }
};

/// Examples stored as rows of tensors that share their first dimension (features,
/// targets, ...), like torch.utils.data.TensorDataset. Values are read from host memory,
/// so the tensors are evaluated once on construction.
class TensorDataset {
 public:
  /// Any number of tensors of rank >= 1 with equal first dimensions; throws ShapeError
  /// otherwise.
  explicit TensorDataset(std::vector<Tensor> tensors);
  /// The usual pair: features [n, ...] and targets [n, ...].
  TensorDataset(Tensor features, Tensor targets);

  /// Number of examples.
  int64_t size() const { return size_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  /// Rows `indices` of every tensor, stacked into constants (each index in [0, size())).
  Batch get(const std::vector<int64_t>& indices) const;
  /// The examples at `indices` as a new dataset (see train_test_split).
  TensorDataset subset(const std::vector<int64_t>& indices) const;

 private:
  std::vector<Tensor> tensors_;
  int64_t size_ = 0;
};

/// Which examples a DataLoader visits in an epoch, and in what order (dist::
/// DistributedSampler gives each rank its shard). Implementations are pure functions of
/// the epoch, so every rank and every rerun sees the same order.
class Sampler {
 public:
  virtual ~Sampler() = default;
  /// Number of indices indices() returns (the same every epoch).
  virtual int64_t size() const = 0;
  /// The dataset indices of epoch `epoch`, in visiting order.
  virtual std::vector<int64_t> indices(uint64_t epoch) const = 0;
};

/// How DataLoader forms batches.
struct DataLoaderOptions {
  int64_t batch_size = 1;
  /// Visit examples in a new seeded random order every epoch.
  bool shuffle = false;
  uint64_t seed = 0;
  /// Leave out the last batch when it has fewer than batch_size examples.
  bool drop_last = false;
  /// Visit the sampler's indices instead of the whole dataset (not with shuffle: the
  /// sampler orders them).
  std::shared_ptr<const Sampler> sampler = nullptr;
};

/// Iterates over a dataset in batches. Each `for (const Batch& b : loader)` is one epoch;
/// with shuffle, epoch e visits the examples in the order permutation(e), a pure function
/// of (seed, e), so runs are reproducible.
class DataLoader {
 public:
  DataLoader(TensorDataset dataset, DataLoaderOptions options);

  /// Batches per epoch.
  int64_t num_batches() const;
  /// The example order of epoch `epoch` (identity without shuffle; the sampler's indices
  /// with one).
  std::vector<int64_t> permutation(uint64_t epoch) const;
  /// Batch `index` of epoch `epoch`.
  Batch batch(uint64_t epoch, int64_t index) const;
  /// The epoch the next begin() starts (0 at first; each begin() advances it).
  uint64_t next_epoch() const { return next_epoch_; }
  /// Makes the next begin() start epoch `epoch` (e.g. when resuming).
  void set_epoch(uint64_t epoch) { next_epoch_ = epoch; }
  const TensorDataset& dataset() const { return dataset_; }

  /// Walks the batches of one epoch; each batch is built when dereferenced.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = const Batch*;
    using reference = const Batch&;

    Iterator() = default;
    const Batch& operator*() const;
    const Batch* operator->() const { return &**this; }
    Iterator& operator++();
    bool operator==(const Iterator& other) const { return index_ == other.index_; }

   private:
    friend class DataLoader;
    Iterator(const DataLoader* loader, std::vector<int64_t> order, int64_t index);
    const DataLoader* loader_ = nullptr;
    std::vector<int64_t> order_;
    int64_t index_ = 0;
    mutable Batch current_;
    mutable bool loaded_ = false;
  };

  /// Starts the next epoch.
  Iterator begin();
  Iterator end() const;

 private:
  Batch batch_of(const std::vector<int64_t>& order, int64_t index) const;

  TensorDataset dataset_;
  DataLoaderOptions options_;
  uint64_t next_epoch_ = 0;
};

/// `n` indices split at random into (train, test): the test part has ceil(n *
/// test_fraction) of them (as scikit-learn); both are in a seeded random order.
std::pair<std::vector<int64_t>, std::vector<int64_t>> train_test_split(int64_t n,
                                                                       double test_fraction,
                                                                       uint64_t seed);

/// A seeded random permutation of 0..n-1 (Fisher-Yates over Philox draws; the same for a
/// given (n, seed, stream) on every machine).
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, uint64_t stream = 0);

/// How read_csv parses.
struct CsvOptions {
  char delimiter = ',';
  /// The first line holds column names.
  bool header = false;
  /// Element type of the result: a floating or integer dtype.
  DType dtype = DType::Float32;
};

/// A numeric table: column names (empty without a header) and the values, [rows, columns].
struct CsvTable {
  std::vector<std::string> columns;
  Tensor values;
};

/// Reads a numeric CSV file (gzip-compressed or plain). Blank lines are skipped, fields
/// are trimmed, "nan"/"inf" are accepted for floats. Malformed content raises ValueError
/// naming the file, line and field; an unreadable file raises IOError.
CsvTable read_csv(const std::string& path, const CsvOptions& options = {});

/// The whole content of a file, decompressed if it is gzip (for character-level models).
std::string read_text_file(const std::string& path);

/// Writes `text` to `path`, gzip-compressed when `compress` (e.g. for a ".gz" path).
void write_text_file(const std::string& path, const std::string& text, bool compress = false);

}  // namespace kiln::data
