// embed: runs a trained MLP classifier saved as safetensors on feature rows from a CSV file
// or stdin, printing each sample's predicted class and probability as CSV.
//
//   embed --weights model.safetensors --input samples.csv [--labels] [--all-probs]
//         [--scale S] [--prefix NAME.]
//
// Exit status: 0 on success, 1 when the files or their contents are wrong, 2 on bad usage.
#include <kiln/frontend/serialize.h>
#include <kiln/kiln.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "csv_input.h"
#include "sequential_mlp.h"

namespace {

constexpr const char* kUsage = R"(usage: embed --weights FILE.safetensors [--input FILE.csv|-]
             [--labels] [--all-probs] [--scale S] [--prefix NAME.]

Runs the classifier nn.Sequential(Linear, ReLU, ..., Linear) stored in the weights file
(tensors '0.weight', '0.bias', '2.weight', ...) on each CSV row and prints
  sample,class,probability[,label][,p0,p1,...]

  --weights FILE   safetensors file (required)
  --input FILE     CSV rows of input features; '-' or absent: standard input
  --labels         each row ends with the true class; adds a label column and reports
                   the accuracy on stderr
  --all-probs      adds the probability of every class
  --scale S        multiplies every feature by S first (the training preprocessing,
                   e.g. 0.0625 for pixel values 0..16 trained as 0..1)
  --prefix NAME.   the tensors are named 'NAME.0.weight', ... (a Sequential inside a module)
)";

struct Options {
  std::string weights;
  std::string input = "-";
  std::string prefix;
  double scale = 1.0;
  bool labels = false;
  bool all_probs = false;
};

struct UsageError {
  std::string message;
};

std::optional<Options> parse_args(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError{arg + " needs a value"};
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return std::nullopt;
    } else if (arg == "--weights") {
      options.weights = value();
    } else if (arg == "--input") {
      options.input = value();
    } else if (arg == "--prefix") {
      options.prefix = value();
    } else if (arg == "--scale") {
      const std::string text = value();
      try {
        size_t used = 0;
        options.scale = std::stod(text, &used);
        if (used != text.size()) throw std::invalid_argument(text);
      } catch (const std::logic_error&) {
        throw UsageError{"--scale expects a number, got '" + text + "'"};
      }
    } else if (arg == "--labels") {
      options.labels = true;
    } else if (arg == "--all-probs") {
      options.all_probs = true;
    } else {
      throw UsageError{"unknown argument '" + arg + "'"};
    }
  }
  if (options.weights.empty()) throw UsageError{"--weights is required"};
  return options;
}

void require_file(const std::string& path, const char* what) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    throw kiln::IOError(
        std::string("") + what + " '" + path + "' " +
        (std::filesystem::exists(path, error) ? "is not a regular file" : "does not exist"));
  }
}

int run(const Options& options) {
  require_file(options.weights, "weights file");
  const embed::SequentialMlp mlp = embed::SequentialMlp::from_state_dict(
      kiln::load_safetensors(options.weights), options.prefix);

  embed::CsvSamples samples;
  if (options.input == "-") {
    samples = embed::read_csv(std::cin, "<stdin>", mlp.in_features(), options.labels);
  } else {
    require_file(options.input, "input file");
    std::ifstream file(options.input);
    if (!file) throw kiln::IOError("cannot open input file '" + options.input + "'");
    samples = embed::read_csv(file, options.input, mlp.in_features(), options.labels);
  }

  // Inference only: no gradient bookkeeping, one evaluation for probabilities and classes.
  kiln::NoGradGuard no_grad;
  kiln::Tensor x = kiln::from_vector(samples.features, {samples.rows, mlp.in_features()});
  x = kiln::cast(x, mlp.dtype());
  if (options.scale != 1.0) x = x * options.scale;
  const kiln::Tensor probs = mlp.probabilities(x);
  const kiln::Tensor classes = kiln::argmax(probs, 1);
  kiln::eval({probs, classes});
  const std::vector<double> p = probs.to_vector<double>();
  const std::vector<int64_t> predicted = classes.to_vector<int64_t>();

  const int64_t k = mlp.out_features();
  std::cout << "sample,class,probability" << (options.labels ? ",label" : "");
  if (options.all_probs) {
    for (int64_t c = 0; c < k; ++c) std::cout << ",p" << c;
  }
  std::cout << "\n";
  int64_t correct = 0;
  char number[32];
  for (int64_t i = 0; i < samples.rows; ++i) {
    const int64_t c = predicted[static_cast<size_t>(i)];
    std::snprintf(number, sizeof number, "%.6f", p[static_cast<size_t>(i * k + c)]);
    std::cout << i << "," << c << "," << number;
    if (options.labels) {
      const int64_t label = samples.labels[static_cast<size_t>(i)];
      std::cout << "," << label;
      correct += label == c;
    }
    if (options.all_probs) {
      for (int64_t j = 0; j < k; ++j) {
        std::snprintf(number, sizeof number, "%.6f", p[static_cast<size_t>(i * k + j)]);
        std::cout << "," << number;
      }
    }
    std::cout << "\n";
  }
  std::cerr << "embed: MLP " << mlp.sizes() << " (" << kiln::dtype_name(mlp.dtype()) << ") on "
            << samples.rows << " samples";
  if (options.labels) {
    std::snprintf(number, sizeof number, "%.2f",
                  100.0 * static_cast<double>(correct) / static_cast<double>(samples.rows));
    std::cerr << ", accuracy " << number << "% (" << correct << "/" << samples.rows << ")";
  }
  std::cerr << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::optional<Options> options = parse_args(argc, argv);
    return options ? run(*options) : 0;
  } catch (const UsageError& error) {
    std::cerr << "embed: " << error.message << "\n" << kUsage;
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "embed: error: " << error.what() << "\n";
    return 1;
  }
}
