#pragma once
/// \file cross_entropy.hpp
/// \brief vpce::CrossEntropy: the vocab-parallel softmax cross-entropy loss and its gradient.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "vpce/communicator.hpp"
#include "vpce/error.hpp"
#include "vpce/options.hpp"
#include "vpce/impl/row_stats.hpp"
#include "vpce/partition.hpp"

namespace vpce {

namespace impl {
template <class T>
class StatsReduction;
}  // namespace impl

/// Cross entropy over logits whose vocabulary is split across the ranks of a communicator.
///
/// Row i of `logits` (N x V_local, LayoutRight) holds this rank's columns [partition.begin(), end()) of
/// token i; `targets` (N, int64, the same on every rank) holds global column ids in [0, V). Per token,
/// loss_i = log(sum_j exp(x_ij)) - x_{i,target_i} over the GLOBAL vocabulary, and the gradient of
/// sum_i g_i * loss_i with respect to the local logits is (softmax - onehot) * g_i.
///
/// forward(), loss_and_grad() and the constructor are collective over the communicator; backward() does
/// not communicate. Every collective call checks its inputs on every rank and, if any rank found a
/// problem, throws the same vpce::Error on every rank. Results are complete when a call returns.
template <class Scalar, class ExecSpace = Kokkos::DefaultExecutionSpace>
class CrossEntropy {
  static_assert(std::is_same_v<Scalar, float> || std::is_same_v<Scalar, double>,
                "vpce::CrossEntropy supports float and double logits");

 public:
  using scalar_type = Scalar;
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using logits_view = Kokkos::View<const Scalar**, Kokkos::LayoutRight, memory_space>;
  using targets_view = Kokkos::View<const std::int64_t*, memory_space>;
  using loss_view = Kokkos::View<Scalar*, memory_space>;
  using grad_view = Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space>;
  using grad_loss_view = Kokkos::View<const Scalar*, memory_space>;

  /// Collective: checks that the partition and the options are the same on every rank.
  CrossEntropy(const Communicator& comm, const VocabPartition& partition, const Options& options = {},
               const ExecSpace& exec = ExecSpace());
  ~CrossEntropy();
  CrossEntropy(const CrossEntropy&) = delete;
  CrossEntropy& operator=(const CrossEntropy&) = delete;

  /// Per-token loss. Keeps for backward() what options().mode says: the softmax (stash_softmax) or the
  /// per-row lse together with a reference to `logits`, which must then stay unchanged until backward().
  void forward(const logits_view& logits, const targets_view& targets, const loss_view& loss);

  /// Gradient of sum_i grad_loss(i) * loss_i with respect to the logits of the last forward().
  void backward(const grad_loss_view& grad_loss, const grad_view& grad_logits);
  /// The same with grad_loss(i) = grad_scale for every row (grad_scale = 1: the gradient of the sum).
  void backward(Scalar grad_scale, const grad_view& grad_logits);

  /// Loss and gradient in one collective call and one pass over the logits, with nothing kept.
  /// `grad_logits` may be the logits' own buffer (the gradient then overwrites them).
  void loss_and_grad(const logits_view& logits, const targets_view& targets, const loss_view& loss,
                     const grad_view& grad_logits, Scalar grad_scale = Scalar(1));
  void loss_and_grad(const logits_view& logits, const targets_view& targets, const loss_view& loss,
                     const grad_view& grad_logits, const grad_loss_view& grad_loss);

  /// log(sum_j exp(x_ij)) over the global vocabulary, per row, of the last forward() or loss_and_grad().
  Kokkos::View<const Scalar*, memory_space> lse() const { return m_lse_out; }

  const Communicator& communicator() const noexcept { return m_comm; }
  const VocabPartition& partition() const noexcept { return m_part; }
  const Options& options() const noexcept { return m_opt; }
  /// Rows per block of the fused strategy (agreed by all ranks at construction).
  std::int64_t block_rows() const noexcept { return m_block_rows; }

 private:
  enum class Out { loss, stash, grad };
  void run(const logits_view& logits, const targets_view& targets, const loss_view& loss, Out out,
           const grad_view& grad, const grad_loss_view& grad_loss, Scalar grad_scale);
  std::string check_targets(const targets_view& targets, std::int64_t* checksum) const;
  void ensure_capacity(std::int64_t n_rows, bool stash);
  void check_rows(std::int64_t row0, std::int64_t row1) const;
  void backward_impl(const grad_loss_view& grad_loss, Scalar grad_scale, const grad_view& grad_logits);
  bool use_teams() const noexcept;

  Communicator m_comm;
  VocabPartition m_part;
  Options m_opt;
  ExecSpace m_exec;
  std::int64_t m_block_rows = 1;
  std::unique_ptr<impl::StatsReduction<Scalar>> m_reduction;

  // Work buffers, grown on demand, reused across calls.
  // (View::HostMirror is deprecated in Kokkos 5: the mirror types are spelled through create_mirror_view.)
  using records_view = Kokkos::View<impl::RowStats<Scalar>*, memory_space>;
  using seed_view = Kokkos::View<Scalar**, Kokkos::LayoutLeft, memory_space>;
  records_view m_records;
  decltype(Kokkos::create_mirror_view(std::declval<records_view>())) m_records_host;
  seed_view m_seed;  // N x 3 (max, sum, target) for the seed strategy
  decltype(Kokkos::create_mirror_view(std::declval<seed_view>())) m_seed_host;
  Kokkos::View<Scalar*, memory_space> m_lse;
  Kokkos::View<Scalar*, memory_space> m_local_max;  // this rank's row max, kept between the two kernels
  Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space> m_stash;

  // What forward() keeps for backward().
  Kokkos::View<const Scalar*, memory_space> m_lse_out;
  logits_view m_saved_logits;
  targets_view m_saved_targets;
  bool m_have_forward = false;
};

extern template class CrossEntropy<float, Kokkos::DefaultExecutionSpace>;
extern template class CrossEntropy<double, Kokkos::DefaultExecutionSpace>;

}  // namespace vpce

#include "vpce/impl/cross_entropy_impl.hpp"
