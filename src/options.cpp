// Option names, and the default block size. Kokkos-free (the tool's fuzz harness builds it too).
#if __has_include(<unistd.h>)
#include <unistd.h>
#endif

#include <algorithm>
#include <cstdint>
#include <string>

#include "vpce/error.hpp"
#include "vpce/options.hpp"

namespace vpce {

std::int64_t l2_cache_bytes() {
  static const std::int64_t bytes = [] {
    long l2 = -1;
#if defined(_SC_LEVEL2_CACHE_SIZE)
    l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);  // glibc: from cpuid; 0 or -1 where unknown
#endif
    return std::int64_t(l2 > 0 ? l2 : 0);
  }();
  return bytes;
}

std::int64_t default_block_bytes_per_thread() {
  const std::int64_t l2 = l2_cache_bytes();
  if (l2 == 0) return std::int64_t(512) << 10;
  return std::clamp<std::int64_t>(l2 / 2, std::int64_t(128) << 10, std::int64_t(8) << 20);
}

Strategy strategy_from_string(const std::string& s) {
  if (s == "fused") return Strategy::fused;
  if (s == "seed") return Strategy::seed;
  VPCE_THROW_IF(true, "unknown strategy '" + s + "' (expected fused or seed)");
}

Mode mode_from_string(const std::string& s) {
  if (s == "stash" || s == "stash_softmax") return Mode::stash_softmax;
  if (s == "recompute") return Mode::recompute;
  VPCE_THROW_IF(true, "unknown memory mode '" + s + "' (expected stash or recompute)");
}

Reduction reduction_from_string(const std::string& s) {
  if (s == "none") return Reduction::none;
  if (s == "sum") return Reduction::sum;
  if (s == "mean") return Reduction::mean;
  VPCE_THROW_IF(true, "unknown reduction '" + s + "' (expected none, sum or mean)");
}

const char* to_string(Reduction r) { return r == Reduction::none ? "none" : (r == Reduction::sum ? "sum" : "mean"); }

const char* to_string(Strategy s) { return s == Strategy::fused ? "fused" : "seed"; }
const char* to_string(Mode m) { return m == Mode::stash_softmax ? "stash" : "recompute"; }

}  // namespace vpce
