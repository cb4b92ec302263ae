#include "rank_bytes.h"

#include <map>
#include <mutex>

#include "../pools/caching_pool.h"

namespace kiln::memory {
namespace {

struct Registry {
  std::mutex mutex;
  int next = 1;
  std::map<int, RankBytesSource> sources;  // by id: registration order
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: holders may unregister at exit
  return *r;
}

}  // namespace

int add_rank_bytes_source(RankBytesSource source) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const int id = r.next++;
  r.sources.emplace(id, std::move(source));
  return id;
}

void remove_rank_bytes_source(int id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.sources.erase(id);
}

std::vector<RankBytes> rank_bytes() {
  // Copied out first: a source reads tensors and must not run under the registry's lock.
  std::vector<RankBytesSource> sources;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const auto& [id, source] : r.sources) sources.push_back(source);
  }
  std::vector<RankBytes> out;
  out.reserve(sources.size());
  for (const RankBytesSource& source : sources) out.push_back(source());
  return out;
}

std::string rank_bytes_report() {
  std::string out;
  for (const RankBytes& b : rank_bytes()) {
    out += "[rank " + std::to_string(b.rank) + " of " + std::to_string(b.ranks) + "] " + b.holder +
           ": parameters " + format_bytes(b.parameters) + ", gradients " +
           format_bytes(b.gradients) + ", optimizer state " +
           (b.optimizer_state ? format_bytes(*b.optimizer_state) : std::string("not held here")) +
           "\n";
  }
  return out;
}

}  // namespace kiln::memory
