#pragma once
/// \file linear_cross_entropy.hpp
/// \brief vpce::LinearCrossEntropy: the LM head (logits = hidden x W^T) fused with the vocab-parallel
/// cross entropy, chunk by chunk of rows, so that the N x V_local logits never exist.
///
/// Needs Kokkos Kernels (KokkosBlas::gemm): available when vpce was configured with it
/// (VPCE_HAVE_KOKKOSKERNELS in vpce/config.hpp). Kernel-free, like cross_entropy.hpp: the definitions are in
/// the library for the default execution space, and in vpce/definitions.hpp for others.

#include "vpce/config.hpp"

#if !defined(VPCE_HAVE_KOKKOSKERNELS)
#error "vpce/linear_cross_entropy.hpp needs vpce built with Kokkos Kernels (find_package(KokkosKernels) failed)"
#endif

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "vpce/communicator.hpp"
#include "vpce/cross_entropy.hpp"
#include "vpce/impl/call.hpp"
#include "vpce/options.hpp"
#include "vpce/partition.hpp"

namespace vpce {

/// How LinearCrossEntropy cuts the rows into chunks.
struct LinearOptions {
  /// Rows per chunk; 0: the most rows whose logits (rows x the widest slice over the ranks) fit in
  /// `chunk_bytes`. Every rank uses the same value (checked at construction).
  std::int64_t chunk_rows = 0;
  /// Memory budget of one chunk's logits (the largest buffer LinearCrossEntropy allocates).
  std::int64_t chunk_bytes = std::int64_t(64) << 20;
};

/// Cross entropy of logits = hidden x W^T, with the vocabulary (the rows of W) split across the ranks.
///
/// `hidden` (N x H, LayoutRight, the same on every rank) holds the tokens' last hidden states, `weight`
/// (V_local x H, LayoutRight) this rank's rows [partition.begin(), end()) of the output embedding, `targets`
/// (N) global ids or Options::ignore_index. The loss is exactly CrossEntropy's on the logits hidden x W^T
/// (with every Options field: label smoothing, z-loss, logit_scale, softcap, ignore_index, reduction), but
/// rows are processed in chunks: per chunk one gemm gives its logits, CrossEntropy::loss_and_grad turns
/// them into their gradient in place (its collective), and two gemms take that gradient into
/// grad_weight (local: dW_r = dlogits^T hidden) and grad_hidden (dlogits W_r, summed over the ranks by
/// ONE MPI all-reduce at the end: identical on every rank). Extra memory: one chunk of logits plus
/// CrossEntropy's per-row buffers.
///
/// `Scalar` is float or double (the gemms go to the BLAS TPL of Kokkos Kernels: OpenBLAS on CPUs, cuBLAS
/// on CUDA when Kokkos Kernels has it). Options::mode is ignored (nothing N x V is ever kept);
/// Options::reduction is applied over all N rows, not per chunk.
///
/// All calls are collective. Errors (shapes, targets, non-finite logits) throw the same vpce::Error on
/// every rank; an error found in a chunk may leave the outputs partly written.
template <class Scalar, class ExecSpace = Kokkos::DefaultExecutionSpace>
class LinearCrossEntropy {
  static_assert(std::is_same_v<Scalar, float> || std::is_same_v<Scalar, double>,
                "vpce::LinearCrossEntropy supports float and double");

 public:
  using scalar_type = Scalar;
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using matrix_view = Kokkos::View<const Scalar**, Kokkos::LayoutRight, memory_space>;
  using grad_matrix_view = Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space>;
  using targets_view = Kokkos::View<const std::int64_t*, memory_space>;
  using loss_view = Kokkos::View<Scalar*, memory_space>;
  using grad_loss_view = Kokkos::View<const Scalar*, memory_space>;

  /// Collective: checks that the options, the partition, hidden_size and the chunking agree on every rank.
  LinearCrossEntropy(const Communicator& comm, const VocabPartition& partition, std::int64_t hidden_size,
                     const Options& options = {}, const LinearOptions& linear = {},
                     const ExecSpace& exec = ExecSpace());
  ~LinearCrossEntropy();
  LinearCrossEntropy(const LinearCrossEntropy&) = delete;
  LinearCrossEntropy& operator=(const LinearCrossEntropy&) = delete;

  /// Per-token loss (0 for ignored rows): one gemm per chunk. Keeps references to hidden, weight and
  /// targets for backward(); they must stay unchanged until then.
  void forward(const matrix_view& hidden, const matrix_view& weight, const targets_view& targets,
               const loss_view& loss);

  /// Gradients of sum_i grad_loss(i) * loss_i (Reduction::none only) with respect to the hidden states and
  /// this rank's weight rows, for the inputs of the last forward(). Recomputes each chunk's logits (three
  /// gemms per chunk). grad_weight is overwritten, or added to with accumulate_weight.
  void backward(const grad_loss_view& grad_loss, const grad_matrix_view& grad_hidden,
                const grad_matrix_view& grad_weight, bool accumulate_weight = false);
  /// Gradients of grad_scale * L (L as CrossEntropy::backward(scalar) defines it for the reduction).
  void backward(Scalar grad_scale, const grad_matrix_view& grad_hidden, const grad_matrix_view& grad_weight,
                bool accumulate_weight = false);

  /// Loss and both gradients in one pass over the chunks (three gemms and one collective per chunk, one
  /// all-reduce of grad_hidden): the training step.
  void loss_and_grad(const matrix_view& hidden, const matrix_view& weight, const targets_view& targets,
                     const loss_view& loss, const grad_matrix_view& grad_hidden, const grad_matrix_view& grad_weight,
                     Scalar grad_scale = Scalar(1), bool accumulate_weight = false);
  void loss_and_grad(const matrix_view& hidden, const matrix_view& weight, const targets_view& targets,
                     const loss_view& loss, const grad_matrix_view& grad_hidden, const grad_matrix_view& grad_weight,
                     const grad_loss_view& grad_loss, bool accumulate_weight = false);

  /// log-sum-exp per row of the last call (N).
  Kokkos::View<const Scalar*, memory_space> lse() const { return m_lse; }
  /// The per-token losses of the last call reduced as Options::reduction says (the sum for none), summed
  /// in row order.
  double reduced_loss() const noexcept { return m_reduced_loss; }
  /// Rows of the last call whose target is not ignore_index.
  std::int64_t num_valid() const noexcept { return m_n_valid; }
  /// Rows per chunk (the same on every rank).
  std::int64_t chunk_rows() const noexcept { return m_chunk_rows; }
  std::int64_t hidden_size() const noexcept { return m_hidden; }
  const Communicator& communicator() const noexcept { return m_comm; }
  const VocabPartition& partition() const noexcept { return m_part; }
  const Options& options() const noexcept { return m_opt; }

 private:
  /// The chunks of one call: what = loss (forward) or grad (the gradients too, into grad_hidden/grad_weight).
  void run(const matrix_view& hidden, const matrix_view& weight, const targets_view& targets, const loss_view& loss,
           impl::Write what, const grad_matrix_view* grad_hidden, const grad_matrix_view* grad_weight,
           const grad_loss_view* grad_loss, Scalar grad_scale, bool accumulate_weight);
  /// Both backward() overloads: grad_loss per row, or nullptr and grad_scale.
  void backward_impl(const grad_loss_view* grad_loss, Scalar grad_scale, const grad_matrix_view& grad_hidden,
                     const grad_matrix_view& grad_weight, bool accumulate_weight);
  void check_call(const matrix_view& hidden, const matrix_view& weight, const targets_view& targets,
                  const loss_view& loss, const grad_matrix_view* grad_hidden, const grad_matrix_view* grad_weight,
                  const grad_loss_view* grad_loss);

  Communicator m_comm;
  VocabPartition m_part;
  Options m_opt;
  ExecSpace m_exec;
  std::int64_t m_hidden = 0;
  std::int64_t m_chunk_rows = 1;
  CrossEntropy<Scalar, ExecSpace> m_ce;  // reduction none, recompute: per chunk

  Kokkos::View<Scalar*, memory_space> m_buf;  // one chunk of logits / their gradient
  Kokkos::View<Scalar*, memory_space> m_scratch_loss;  // chunk losses backward() does not return
  Kokkos::View<Scalar*, memory_space> m_lse;

  matrix_view m_saved_hidden, m_saved_weight;
  targets_view m_saved_targets;
  bool m_have_forward = false;
  std::int64_t m_n_valid = 0;
  double m_reduced_loss = 0;
};

extern template class LinearCrossEntropy<float, Kokkos::DefaultExecutionSpace>;
extern template class LinearCrossEntropy<double, Kokkos::DefaultExecutionSpace>;

}  // namespace vpce
