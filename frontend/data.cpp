// Batches are gathered on the host into new constants rather than built as lazy
// index_select graphs: dataset tensors are already in host memory, and a constant batch
// keeps every training step's graph independent of the dataset's size.
#include "data.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string_view>

#include "../core/philox.h"
#include "../ops/sources.h"

namespace kiln::data {
namespace {

int64_t row_bytes(const Tensor& t) {
  return t.size(0) == 0 ? 0 : static_cast<int64_t>(t.node()->nbytes()) / t.size(0);
}

// Uniform integer in [0, bound) from the 64-bit draw `counter` of (seed, stream), with
// rejection of the few values that would bias the modulo.
uint64_t uniform_below(uint64_t bound, uint64_t seed, uint64_t stream, uint64_t& counter) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  while (true) {
    const auto x = philox_block(seed, stream, counter++);
    const uint64_t r = (static_cast<uint64_t>(x[0]) << 32) | x[1];
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// TensorDataset

TensorDataset::TensorDataset(std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {
  if (tensors_.empty()) throw ValueError("[TensorDataset] expected at least one tensor");
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const Tensor& t = tensors_[k];
    if (!t.defined())
      throw ValueError("[TensorDataset] tensor " + std::to_string(k) + " is undefined");
    if (t.ndim() < 1) {
      throw ShapeError("[TensorDataset] tensor " + std::to_string(k) +
                       " must have a first (example) dimension, got a rank-0 " +
                       std::string(dtype_name(t.dtype())));
    }
    if (t.size(0) != tensors_[0].size(0)) {
      throw ShapeError("[TensorDataset] all tensors need the same first dimension; tensor 0 is " +
                       std::string(dtype_name(tensors_[0].dtype())) +
                       shape_str(tensors_[0].shape()) + " and tensor " + std::to_string(k) +
                       " is " + std::string(dtype_name(t.dtype())) + shape_str(t.shape()));
    }
  }
  eval(tensors_);
  size_ = tensors_[0].size(0);
}

TensorDataset::TensorDataset(Tensor features, Tensor targets)
    : TensorDataset(std::vector<Tensor>{std::move(features), std::move(targets)}) {}

Batch TensorDataset::get(const std::vector<int64_t>& indices) const {
  for (int64_t i : indices) {
    if (i < 0 || i >= size_) {
      throw IndexError("[TensorDataset] index " + std::to_string(i) + " is out of range for " +
                       std::to_string(size_) + " examples");
    }
  }
  Batch batch;
  std::vector<unsigned char> bytes;
  for (const Tensor& t : tensors_) {
    const auto row = static_cast<size_t>(row_bytes(t));
    bytes.assign(std::max<size_t>(1, row * indices.size()), 0);
    const auto* src = static_cast<const unsigned char*>(t.numel() > 0 ? t.raw_data() : nullptr);
    for (size_t k = 0; k < indices.size() && row > 0; ++k) {
      std::memcpy(bytes.data() + k * row, src + static_cast<size_t>(indices[k]) * row, row);
    }
    Shape shape = t.shape();
    shape[0] = static_cast<int64_t>(indices.size());
    batch.tensors.push_back(from_data(bytes.data(), shape, t.dtype(), t.device()));
  }
  return batch;
}

TensorDataset TensorDataset::subset(const std::vector<int64_t>& indices) const {
  return TensorDataset(get(indices).tensors);
}

// ---------------------------------------------------------------------------------------
// DataLoader

DataLoader::DataLoader(TensorDataset dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  if (options_.batch_size < 1) {
    throw ValueError("[DataLoader] expected batch_size >= 1, got " +
                     std::to_string(options_.batch_size));
  }
  if (options_.sampler && options_.shuffle) {
    throw ValueError(
        "[DataLoader] takes shuffle or a sampler, not both: the sampler orders "
        "the examples (e.g. DistributedSampler's shuffle option)");
  }
}

int64_t DataLoader::num_batches() const {
  const int64_t n = options_.sampler ? options_.sampler->size() : dataset_.size();
  const int64_t b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

std::vector<int64_t> DataLoader::permutation(uint64_t epoch) const {
  if (options_.sampler) {
    std::vector<int64_t> order = options_.sampler->indices(epoch);
    if (static_cast<int64_t>(order.size()) != options_.sampler->size()) {
      throw ValueError("[DataLoader] the sampler returned " + std::to_string(order.size()) +
                       " indices for epoch " + std::to_string(epoch) + " but its size() is " +
                       std::to_string(options_.sampler->size()));
    }
    return order;
  }
  if (options_.shuffle) return random_permutation(dataset_.size(), options_.seed, epoch);
  std::vector<int64_t> order(static_cast<size_t>(dataset_.size()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  return order;
}

Batch DataLoader::batch_of(const std::vector<int64_t>& order, int64_t index) const {
  if (index < 0 || index >= num_batches()) {
    throw IndexError("[DataLoader] batch " + std::to_string(index) + " is out of range for " +
                     std::to_string(num_batches()) + " batches");
  }
  const int64_t begin = index * options_.batch_size;
  const int64_t end =
      std::min<int64_t>(begin + options_.batch_size, static_cast<int64_t>(order.size()));
  return dataset_.get(std::vector<int64_t>(order.begin() + begin, order.begin() + end));
}

Batch DataLoader::batch(uint64_t epoch, int64_t index) const {
  return batch_of(permutation(epoch), index);
}

DataLoader::Iterator DataLoader::begin() { return Iterator(this, permutation(next_epoch_++), 0); }

DataLoader::Iterator DataLoader::end() const {
  Iterator it;
  it.index_ = num_batches();
  return it;
}

DataLoader::Iterator::Iterator(const DataLoader* loader, std::vector<int64_t> order, int64_t index)
    : loader_(loader), order_(std::move(order)), index_(index) {}

const Batch& DataLoader::Iterator::operator*() const {
  if (!loader_) throw ValueError("[DataLoader] dereferencing an end iterator");
  if (!loaded_) {
    current_ = loader_->batch_of(order_, index_);
    loaded_ = true;
  }
  return current_;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  ++index_;
  loaded_ = false;
  current_ = Batch();
  return *this;
}

// ---------------------------------------------------------------------------------------
// Index helpers

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, uint64_t stream) {
  if (n < 0) throw ValueError("[random_permutation] expected n >= 0, got " + std::to_string(n));
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  uint64_t counter = 0;
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j =
        static_cast<int64_t>(uniform_below(static_cast<uint64_t>(i) + 1, seed, stream, counter));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> train_test_split(int64_t n,
                                                                       double test_fraction,
                                                                       uint64_t seed) {
  if (!(test_fraction >= 0 && test_fraction <= 1)) {
    throw ValueError("[train_test_split] expected test_fraction in [0, 1], got " +
                     Scalar(test_fraction).str());
  }
  std::vector<int64_t> order = random_permutation(n, seed);
  const auto n_test = static_cast<size_t>(std::ceil(test_fraction * static_cast<double>(n)));
  std::vector<int64_t> test(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n_test));
  std::vector<int64_t> train(order.begin() + static_cast<std::ptrdiff_t>(n_test), order.end());
  return {std::move(train), std::move(test)};
}

// ---------------------------------------------------------------------------------------
// Files

namespace {

// The bytes of a file, gunzipped when compressed; errors name `op`, the function the user
// called.
std::string read_file(const std::string& path, const std::string& op) {
  // gzread passes non-gzip files through unchanged, which makes compression transparent.
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) {
    throw IOError("[" + op + "] cannot open " + path + " (" +
                  (errno ? std::strerror(errno) : "out of memory") + ")");
  }
  std::string out;
  std::vector<char> chunk(1 << 16);
  while (true) {
    const int n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      std::string message = gzerror(f, &code);
      if (code == Z_ERRNO) message = std::strerror(errno);
      gzclose(f);
      throw IOError("[" + op + "] " + path + ": reading failed (" + message + ")");
    }
    if (n == 0) break;
    out.append(chunk.data(), static_cast<size_t>(n));
  }
  // A gzip stream that ends early reads as end of file; gzclose_r reports it.
  int code = 0;
  std::string message = gzerror(f, &code);
  const int closed = gzclose(f);
  if (code != Z_OK || closed != Z_OK) {
    throw IOError("[" + op + "] " + path + ": reading failed (" +
                  (code != Z_OK ? message : "the compressed stream is truncated or corrupt") + ")");
  }
  return out;
}

}  // namespace

std::string read_text_file(const std::string& path) { return read_file(path, "read_text_file"); }

void write_text_file(const std::string& path, const std::string& text, bool compress) {
  if (compress) {
    gzFile f = gzopen(path.c_str(), "wb");
    if (!f)
      throw IOError("[write_text_file] cannot create " + path + " (" + std::strerror(errno) + ")");
    size_t done = 0;
    bool ok = true;
    while (ok && done < text.size()) {
      const auto n = static_cast<unsigned>(std::min<size_t>(text.size() - done, 1 << 20));
      ok = gzwrite(f, text.data() + done, n) == static_cast<int>(n);
      done += n;
    }
    if (gzclose(f) != Z_OK) ok = false;
    if (!ok) throw IOError("[write_text_file] writing " + path + " failed");
    return;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    throw IOError("[write_text_file] cannot create " + path + " (" + std::strerror(errno) + ")");
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) throw IOError("[write_text_file] writing " + path + " failed");
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_fields(std::string_view line, char delimiter) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    size_t at = line.find(delimiter, start);
    fields.push_back(trim(
        line.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start)));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
  return fields;
}

// True when the integer v is representable in `dtype`.
bool fits_integer(int64_t v, DType dtype) {
  return visit_dtype(dtype, [v](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      return v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
             (std::is_same_v<T, int64_t> ||
              v <= static_cast<int64_t>(std::numeric_limits<T>::max()));
    } else {
      return true;
    }
  });
}

// False when a finite value would overflow to infinity in `dtype`.
bool fits_float(double v, DType dtype) {
  if (!std::isfinite(v)) return true;
  alignas(8) unsigned char one[8];
  detail::store_double(one, dtype, 0, v);
  return std::isfinite(detail::load_as_double(one, dtype, 0));
}

}  // namespace

CsvTable read_csv(const std::string& path, const CsvOptions& options) {
  const DType dtype = options.dtype;
  if (!is_floating(dtype) && !is_integer(dtype)) {
    throw DTypeError("[read_csv] expected a floating or integer dtype, got " +
                     std::string(dtype_name(dtype)));
  }
  const std::string text = read_file(path, "read_csv");
  const bool floating = is_floating(dtype);
  CsvTable table;
  std::vector<double> reals;
  std::vector<int64_t> ints;
  int64_t columns = -1, rows = 0;
  bool header_pending = options.header;
  size_t line_start = 0;
  for (int64_t line_no = 1; line_start < text.size(); ++line_no) {
    size_t nl = text.find('\n', line_start);
    std::string_view line(text.data() + line_start,
                          (nl == std::string::npos ? text.size() : nl) - line_start);
    line_start = nl == std::string::npos ? text.size() : nl + 1;
    if (trim(line).empty()) continue;
    std::vector<std::string_view> fields = split_fields(line, options.delimiter);
    if (columns < 0) columns = static_cast<int64_t>(fields.size());
    if (static_cast<int64_t>(fields.size()) != columns) {
      throw ValueError("[read_csv] " + path + " line " + std::to_string(line_no) + ": expected " +
                       std::to_string(columns) + " fields, got " + std::to_string(fields.size()));
    }
    if (header_pending) {
      for (std::string_view f : fields) {
        if (f.size() >= 2 && f.front() == '"' && f.back() == '"') f = f.substr(1, f.size() - 2);
        table.columns.emplace_back(f);
      }
      header_pending = false;
      continue;
    }
    for (size_t c = 0; c < fields.size(); ++c) {
      std::string_view f = fields[c];
      if (!f.empty() && f.front() == '+') f.remove_prefix(1);
      const char* last = f.data() + f.size();
      std::from_chars_result r{};
      bool in_range = true;
      if (floating) {
        double v = 0;
        r = std::from_chars(f.data(), last, v);
        in_range = fits_float(v, dtype);
        reals.push_back(v);
      } else {
        int64_t v = 0;
        r = std::from_chars(f.data(), last, v);
        in_range = fits_integer(v, dtype);
        ints.push_back(v);
      }
      auto fail = [&](const std::string& problem) {
        throw ValueError("[read_csv] " + path + " line " + std::to_string(line_no) + ", field " +
                         std::to_string(c + 1) + ": '" + std::string(fields[c]) + "' " + problem);
      };
      if (f.empty() || r.ec == std::errc::invalid_argument || r.ptr != last) {
        fail(floating ? "is not a number" : "is not an integer");
      }
      if (r.ec != std::errc() || !in_range)
        fail("is out of range for " + std::string(dtype_name(dtype)));
    }
    ++rows;
  }
  if (columns < 0) columns = 0;
  std::vector<unsigned char> bytes(
      std::max<size_t>(1, static_cast<size_t>(rows * columns) * itemsize(dtype)));
  for (int64_t i = 0; i < rows * columns; ++i) {
    if (floating)
      detail::store_double(bytes.data(), dtype, i, reals[static_cast<size_t>(i)]);
    else
      detail::store_int64(bytes.data(), dtype, i, ints[static_cast<size_t>(i)]);
  }
  table.values = from_data(bytes.data(), {rows, columns}, dtype);
  return table;
}

}  // namespace kiln::data
