#pragma once
/// \file cross_entropy.hpp
/// \brief vpce::CrossEntropy: the vocab-parallel softmax cross-entropy loss and its gradient.

///
/// Kernel-free: this header declares the class; its definitions (the kernels, the strategies, the staging
/// for MPI) are compiled into the library for the default execution space and the four scalar types. To
/// instantiate CrossEntropy on another execution space, include "vpce/definitions.hpp" as well (README,
/// "Using another execution space").

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "vpce/communicator.hpp"
#include "vpce/config.hpp"
#include "vpce/error.hpp"
#include "vpce/half.hpp"
#include "vpce/options.hpp"
#include "vpce/partition.hpp"

namespace vpce {

namespace impl {
template <class Scalar, class ExecSpace>
class CrossEntropyCore;
}  // namespace impl

/// Cross entropy over logits whose vocabulary is split across the ranks of a communicator.
///
/// Row i of `logits` (N x V_local, LayoutRight) holds this rank's columns [partition.begin(), end()) of
/// token i; `targets` (N, int64, the same on every rank) holds global column ids in [0, V) or
/// Options::ignore_index. Per token, loss_i = log(sum_j exp(x_ij)) - x_{i,target_i} over the GLOBAL
/// vocabulary (plus the options of vpce::Options), and the gradient of sum_i g_i * loss_i with respect to
/// the local logits is (softmax - onehot) * g_i.
///
/// `Scalar` is the logits' storage type: float, double, vpce::bfloat16 or vpce::float16. 16-bit logits
/// are computed in float (`compute_type`); loss, lse and incoming gradients are in `compute_type`; the
/// gradient is written in `compute_type` or, for 16-bit logits, in the logits' own type (caller's choice
/// of View).
///
/// forward(), loss_and_grad() and the constructor are collective over the communicator; backward() does
/// not communicate. Every collective call checks its inputs on every rank and, if any rank found a
/// problem, throws the same vpce::Error on every rank. The outcome of the checks travels inside the call's
/// first collective: an error-free call makes only the collectives of its strategy (the fused strategy one
/// all-reduce per block of rows, see block_rows(); on one rank, for a call that keeps its exps on the host,
/// only the first block's). Input errors (shapes, targets, N) are found before any
/// output is written: the outputs are left as they were. A NaN/+inf logit (NonFinite::error) is found
/// after the collective of its block: outputs written before it (the loss, the gradient rows of the
/// earlier blocks -- on one rank where the rows after the first block are chained, all rows --, with an
/// in-place gradient the logits of those rows) are then overwritten with NaN.
/// After a failed call lse() is empty and reduced_loss() is NaN. Results are complete when a call returns.
template <class Scalar, class ExecSpace = Kokkos::DefaultExecutionSpace>
class CrossEntropy {
  static_assert(std::is_same_v<Scalar, float> || std::is_same_v<Scalar, double> || is_16bit_v<Scalar>,
                "vpce::CrossEntropy supports float, double, vpce::bfloat16 and vpce::float16 logits");
  struct Unused {};

 public:
  using scalar_type = Scalar;
  using compute_type = compute_type_t<Scalar>;
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using logits_view = Kokkos::View<const Scalar**, Kokkos::LayoutRight, memory_space>;
  using targets_view = Kokkos::View<const std::int64_t*, memory_space>;
  using loss_view = Kokkos::View<compute_type*, memory_space>;
  using grad_view = Kokkos::View<compute_type**, Kokkos::LayoutRight, memory_space>;
  /// For 16-bit logits: a gradient in the logits' own type (may be the logits' buffer).
  using grad_storage_view =
      std::conditional_t<is_16bit_v<Scalar>, Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space>, Unused>;
  using grad_loss_view = Kokkos::View<const compute_type*, memory_space>;
  /// Target probabilities (Options::probability_targets): N x V_local, this rank's columns, the logits' type.
  using probs_view = Kokkos::View<const Scalar**, Kokkos::LayoutRight, memory_space>;

  /// Collective: checks the options and that they, and the partition, are the same on every rank.
  CrossEntropy(const Communicator& comm, const VocabPartition& partition, const Options& options = {},
               const ExecSpace& exec = ExecSpace());
  ~CrossEntropy();
  CrossEntropy(const CrossEntropy&) = delete;
  CrossEntropy& operator=(const CrossEntropy&) = delete;

  /// Collective. Class weights (PyTorch's `weight`): `local_weights` holds this rank's V_local values, one per
  /// column it owns, finite and >= 0 (checked on every rank; the same error everywhere). With weights w and
  /// label smoothing A, per non-ignored row (PyTorch's definition, over the GLOBAL vocabulary, W = sum_j w_j):
  ///   loss = (1 - A) w_t (lse - x_t) + A / V (W lse - sum_j w_j x_j) + z_loss lse^2 + entropy_weight H
  /// (the z-loss and entropy terms are not weighted), and Reduction::mean divides the sum by sum_i w_{t_i}
  /// over the non-ignored rows (0 when that is 0). The weights are gathered once here (every rank keeps all
  /// V); the calls' collectives do not change. A rank that owns no columns passes an empty View.
  void set_class_weights(const Kokkos::View<const compute_type*, memory_space>& local_weights);
  /// Collective: no class weights any more.
  void clear_class_weights();

  /// Per-token loss (0 for ignored rows). Keeps for backward() what options().mode says: the stash
  /// (N x V_local) or the per-row lse together with a reference to `logits`, which must then stay
  /// unchanged until backward().
  void forward(const logits_view& logits, const targets_view& targets, const loss_view& loss);

  /// Gradient, with respect to the logits of the last forward(), of sum_i grad_loss(i) * loss_i
  /// (Reduction::none only).
  void backward(const grad_loss_view& grad_loss, const grad_view& grad_logits);
  void backward(const grad_loss_view& grad_loss, const grad_storage_view& grad_logits);
  /// Gradient of grad_scale * L, where L is the sum of the per-token losses (Reduction::none and ::sum)
  /// or their mean over the non-ignored tokens (Reduction::mean).
  void backward(compute_type grad_scale, const grad_view& grad_logits);
  void backward(compute_type grad_scale, const grad_storage_view& grad_logits);

  /// Loss and gradient (as backward() with the same arguments would give) in one collective call and one
  /// pass over the logits, with nothing kept. `grad_logits` may be the logits' own buffer.
  void loss_and_grad(const logits_view& logits, const targets_view& targets, const loss_view& loss,
                     const grad_view& grad_logits, compute_type grad_scale = compute_type(1));
  void loss_and_grad(const logits_view& logits, const targets_view& targets, const loss_view& loss,
                     const grad_storage_view& grad_logits, compute_type grad_scale = compute_type(1));
  void loss_and_grad(const logits_view& logits, const targets_view& targets, const loss_view& loss,
                     const grad_view& grad_logits, const grad_loss_view& grad_loss);
  void loss_and_grad(const logits_view& logits, const targets_view& targets, const loss_view& loss,
                     const grad_storage_view& grad_logits, const grad_loss_view& grad_loss);

  /// The same with target probabilities instead of target ids (Options::probability_targets must be set);
  /// backward() works as after the other forward(). `target_probs` must stay unchanged until backward().
  void forward(const logits_view& logits, const probs_view& target_probs, const loss_view& loss);
  void loss_and_grad(const logits_view& logits, const probs_view& target_probs, const loss_view& loss,
                     const grad_view& grad_logits, compute_type grad_scale = compute_type(1));
  void loss_and_grad(const logits_view& logits, const probs_view& target_probs, const loss_view& loss,
                     const grad_storage_view& grad_logits, compute_type grad_scale = compute_type(1));
  void loss_and_grad(const logits_view& logits, const probs_view& target_probs, const loss_view& loss,
                     const grad_view& grad_logits, const grad_loss_view& grad_loss);
  void loss_and_grad(const logits_view& logits, const probs_view& target_probs, const loss_view& loss,
                     const grad_storage_view& grad_logits, const grad_loss_view& grad_loss);

  /// log(sum_j exp(x_ij)) over the global vocabulary, per row, of the last forward() or loss_and_grad()
  /// (empty if that call failed).
  Kokkos::View<const compute_type*, memory_space> lse() const;
  /// Per row of the last forward() or loss_and_grad() (empty if that call failed), computed from its merged
  /// statistics when asked (a pass over N values, no communication; the View is overwritten by the next
  /// call of these three):
  /// - entropy(): the entropy -sum_j p_j log p_j of the softmax over the GLOBAL vocabulary, for every row
  ///   (ignored ones too); needs Options::entropy or an entropy_weight, else throws vpce::Error;
  /// - logprob(): the target's log-softmax x_target - lse, 0 for ignored rows (not with probability targets);
  /// - z_loss_terms(): the z-loss term z_loss * lse^2 that the loss includes, 0 for ignored rows.
  Kokkos::View<const compute_type*, memory_space> entropy() const;
  Kokkos::View<const compute_type*, memory_space> logprob() const;
  Kokkos::View<const compute_type*, memory_space> z_loss_terms() const;
  /// The per-token losses of the last call reduced as Options::reduction says (the sum for none), summed in
  /// row order (the same bits for any thread count).
  double reduced_loss() const noexcept;
  /// Rows of the last call whose target is not ignore_index.
  std::int64_t num_valid() const noexcept;
  /// The sum of the class weights of those rows' targets (num_valid() without class weights): what
  /// Reduction::mean divides by.
  double valid_weight() const noexcept;

  const Communicator& communicator() const noexcept;
  const VocabPartition& partition() const noexcept;
  const Options& options() const noexcept;
  /// Rows per block of the fused strategy (agreed by all ranks at construction). The first block of a call
  /// has head_rows() rows (at most block_rows()), and its all-reduce always carries head_rows() records
  /// (padded when N is smaller) plus the call status, whatever N is.
  std::int64_t block_rows() const noexcept;
  std::int64_t head_rows() const noexcept;

 private:
  std::unique_ptr<impl::CrossEntropyCore<Scalar, ExecSpace>> m_core;
};

extern template class CrossEntropy<float, Kokkos::DefaultExecutionSpace>;
extern template class CrossEntropy<double, Kokkos::DefaultExecutionSpace>;
extern template class CrossEntropy<bfloat16, Kokkos::DefaultExecutionSpace>;
extern template class CrossEntropy<float16, Kokkos::DefaultExecutionSpace>;

}  // namespace vpce
