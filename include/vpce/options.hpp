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

/// How the per-token losses are reduced (docs/design.md, section 1).
enum class Reduction {
  none,  ///< per-token losses; backward takes one incoming gradient per row (or one scalar for all)
  sum,   ///< the sum over non-ignored tokens; backward's scalar is the gradient of that sum
  mean   ///< the sum divided by the number of non-ignored tokens (0 of them: loss 0, gradient 0)
};

/// What a NaN or +inf logit gets.
enum class NonFinite {
  error,     ///< every rank throws vpce::Error naming the row (default)
  propagate  ///< no check: the row's loss and gradient become NaN
};

/// The per-core L2 cache of this machine in bytes (sysconf's _SC_LEVEL2_CACHE_SIZE), or 0 where not known.
std::int64_t l2_cache_bytes();

/// Half of l2_cache_bytes(), within [128 KiB, 8 MiB]; 512 KiB where the size is not known. Options's
/// default. It matters only where blocks are made (several ranks: one on a single rank runs its rows after
/// the first block chained), and there every block pays a collective: blocks of L2/2 left the exps of three
/// blocks partly in L3 but were faster than L2/8 at 2 ranks x 1 thread (perf_tests/NOTES.md, issue 12,
/// fifteenth round).
std::int64_t default_block_bytes_per_thread();

/// Everything is combinable, and supported by every strategy and memory mode. Must be the same on every
/// rank (checked when a CrossEntropy is built). With the transforms x = softcap * tanh(logit_scale * z /
/// softcap) (softcap > 0) or x = logit_scale * z, and lse = log(sum_j exp(x_j)) over the GLOBAL vocabulary:
///   loss = lse - (1 - label_smoothing) * x_target - label_smoothing * mean_j(x_j) + z_loss * lse^2
///     + entropy_weight * H,   H = lse - sum_j softmax_j x_j (the entropy of the softmax)
/// for a row whose target is not ignore_index (else 0), and the gradient with respect to the stored z is
///   (softmax_j * (1 + 2 z_loss lse + entropy_weight (mu - x_j)) - (1 - label_smoothing) [j == target]
///    - label_smoothing / V) * dx/dz * g,   mu = sum_k softmax_k x_k.
/// A -inf logit stays -inf (masked) through the transforms.
struct Options {
  Strategy strategy = Strategy::fused;
  Mode mode = Mode::recompute;
  NonFinite non_finite = NonFinite::error;
  /// Rows whose target is this value get loss 0 and a zero gradient, and do not count in the mean.
  std::int64_t ignore_index = -100;
  Reduction reduction = Reduction::none;
  /// PyTorch's label smoothing over the GLOBAL vocabulary, in [0, 1]: the same for any number of ranks.
  double label_smoothing = 0;
  /// PaLM's z-loss coefficient (on lse^2), >= 0.
  double z_loss = 0;
  /// Logits are multiplied by this (> 0) before anything else.
  double logit_scale = 1;
  /// Gemma's soft-capping c * tanh(x / c) when > 0.
  double softcap = 0;
  /// Keep each row's entropy for CrossEntropy::entropy(). Its statistic rides in the same collective: each
  /// row's record grows by one value (5 instead of 4).
  bool entropy = false;
  /// Adds entropy_weight * H to each non-ignored row's loss (its gradient too); finite, may be negative (an
  /// entropy bonus). Nonzero implies the entropy's statistic, as Options::entropy.
  double entropy_weight = 0;
  /// The calls take target probabilities q (N x V_local, the logits' type; PyTorch's "class probabilities",
  /// for distillation) instead of target ids: loss = -sum_j c_j log softmax_j with c = (1 - label_smoothing)
  /// q + label_smoothing / V (times the class weights), every row counts (no ignore_index), the mean divides
  /// by N. Each row of q must be >= 0 and sum to 1 (within 1e-4; 1e-2 for bfloat16, 2e-3 for float16), else
  /// vpce::Error on every rank. Each record grows by two values (sum q, sum w q).
  bool probability_targets = false;
  /// Rows per block in the fused strategy. A block's all-reduce (non-blocking) is in flight while the
  /// next block's statistics run; then its loss/gradient is written in the same launch as the statistics of
  /// the block after, while that one's all-reduce is in flight: three blocks are live at a time, and a block's
  /// exps are still in cache when its gradient is written. 0: chosen from the slice width so that a thread's
  /// share of a block's exps (in the compute type: float for 16-bit logits) is about `block_bytes_per_thread`
  /// (by default half a core's L2 cache), and 256x that for calls that keep no exps (the loss only,
  /// the softcap, probability targets), whose blocks hold nothing in cache: there each block only costs a
  /// launch and a collective.
  std::int64_t block_rows = 0;
  std::int64_t block_bytes_per_thread = default_block_bytes_per_thread();
  /// Run the device form of the kernels (a team per row) on a host execution space too. For testing the
  /// GPU code path on CPUs; slower there.
  bool force_team_kernels = false;
};

Strategy strategy_from_string(const std::string& s);
Mode mode_from_string(const std::string& s);
Reduction reduction_from_string(const std::string& s);
const char* to_string(Strategy s);
const char* to_string(Mode m);
const char* to_string(Reduction r);

}  // namespace vpce
