#pragma once
/// \file options.hpp
/// \brief Choices that shape how vpce computes: collective strategy, memory mode, checks, blocking.

#include <cstdint>
#include <string>

namespace vpce {

/// How the per-row statistics are combined across ranks in the forward.
enum class Strategy {
  fused,  ///< ONE MPI_Allreduce of (max, sum of exp, target logit) records with a user-defined op
  seed    ///< the seed's (Megatron-LM's) three all-reduces: MAX, then SUM of exp, then SUM of the target logit
};

/// What forward() keeps for backward().
enum class Mode {
  stash_softmax,  ///< the normalised softmax, N x V_local (the seed's way)
  recompute       ///< only lse per row; backward() recomputes the softmax from the caller's logits
};

/// What a NaN or +inf logit gets.
enum class NonFinite {
  error,     ///< every rank throws vpce::Error naming the row (default)
  propagate  ///< no check: the row's loss and gradient become NaN
};

struct Options {
  Strategy strategy = Strategy::fused;
  Mode mode = Mode::recompute;
  NonFinite non_finite = NonFinite::error;
  /// Rows per block in the fused strategy (statistics, collective and loss/gradient of a block are done
  /// before the next block, so the block is still in cache when its gradient is written). 0: chosen from
  /// the slice width so that a thread's share of a block is about `block_bytes_per_thread`.
  std::int64_t block_rows = 0;
  std::int64_t block_bytes_per_thread = std::int64_t(1) << 20;
  /// Run the device form of the kernels (a team per row) on a host execution space too. For testing the
  /// GPU code path on CPUs; slower there.
  bool force_team_kernels = false;
};

Strategy strategy_from_string(const std::string& s);
Mode mode_from_string(const std::string& s);
const char* to_string(Strategy s);
const char* to_string(Mode m);

}  // namespace vpce
