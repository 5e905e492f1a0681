// Explicit instantiations for the default execution space, compiled with vpce's own flags
// (-fopenmp-simd for the vectorised row loops). Other spaces are instantiated from the headers.
#include "vpce/cross_entropy.hpp"

#include <string>

#include "vpce/error.hpp"

namespace vpce {

template class CrossEntropy<float, Kokkos::DefaultExecutionSpace>;
template class CrossEntropy<double, Kokkos::DefaultExecutionSpace>;

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

const char* to_string(Strategy s) { return s == Strategy::fused ? "fused" : "seed"; }
const char* to_string(Mode m) { return m == Mode::stash_softmax ? "stash" : "recompute"; }

}  // namespace vpce
