// Option names. The explicit instantiations are in cross_entropy_<type>.cpp (one per logits type, so that
// they compile in parallel).
#include <string>

#include "vpce/cross_entropy.hpp"
#include "vpce/error.hpp"

namespace vpce {

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
