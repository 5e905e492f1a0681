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
#include <vector>

#include "vpce/communicator.hpp"
#include "vpce/cross_entropy.hpp"
#include "vpce/half.hpp"
#include "vpce/impl/call.hpp"
#include "vpce/options.hpp"
#include "vpce/partition.hpp"

namespace vpce {

/// How LinearCrossEntropy cuts the work into chunks, and where the hidden states are.
struct LinearOptions {
  /// Rows per chunk; 0: the most rows whose logits (rows x the widest slice over the ranks) fit in
  /// `chunk_bytes`. Every rank uses the same value (checked at construction).
  std::int64_t chunk_rows = 0;
  /// Memory budget of one chunk's logits (the largest buffer LinearCrossEntropy allocates) and, for 16-bit
  /// inputs, of one block of weight rows converted to float.
  std::int64_t chunk_bytes = std::int64_t(64) << 20;
  /// Sequence-parallel input (Megatron's sequence parallelism): each rank passes only its own slice of the
  /// tokens' hidden states (N_r x H; rank 0's rows first, then rank 1's, ...; N = the sum over the ranks,
  /// slices may differ in size or be empty). Each chunk of rows is all-gathered when it is needed, so the
  /// N x H gathered hidden states never exist; targets and loss still have all N rows (the same on every
  /// rank), and grad_hidden is this rank's N_r rows (the sum over the ranks, reduce-scattered per chunk).
  bool sequence_parallel = false;
};

/// Cross entropy of logits = hidden x W^T (+ bias), with the vocabulary (the rows of W) split across the ranks.
///
/// `hidden` (N x H, LayoutRight, the same on every rank; or this rank's rows with
/// LinearOptions::sequence_parallel) holds the tokens' last hidden states, `weight` (V_local x H,
/// LayoutRight) this rank's rows [partition.begin(), end()) of the output embedding, `bias` (V_local, optional)
/// the same rows of the output bias, `targets` (N) global ids or Options::ignore_index. The loss is exactly
/// CrossEntropy's on the logits hidden x W^T + bias (with every Options field: label smoothing, z-loss,
/// logit_scale, softcap, ignore_index, reduction, entropy_weight), but rows are processed in chunks: per
/// chunk one gemm gives its logits, CrossEntropy::loss_and_grad turns them into their gradient in place (its
/// collective), and two gemms take that gradient into grad_weight (local: dW_r = dlogits^T hidden),
/// grad_bias (the column sums of dlogits) and grad_hidden (dlogits W_r, summed over the ranks by ONE MPI
/// all-reduce at the end: identical on every rank; or reduce-scattered per chunk with sequence-parallel
/// input). Extra memory: one chunk of logits plus CrossEntropy's per-row buffers (and, for 16-bit inputs, a
/// block of weight rows in float; with sequence-parallel input, one chunk of gathered hidden states).
///
/// `Scalar` is the type of hidden, weight and bias: float, double, vpce::bfloat16 or vpce::float16. 16-bit
/// inputs are converted to float chunk by chunk (hidden) and block by block (weight) and multiplied in float,
/// so the logits, the loss, lse and the gradients are in `compute_type` (float): the gradients accumulate
/// over the chunks in float, and no float copy of the whole head is made (Liger's accum_dtype=float32).
/// The gemms go to the BLAS TPL of Kokkos Kernels (OpenBLAS on CPUs, cuBLAS on CUDA when Kokkos Kernels
/// has it). Options::mode is ignored (nothing N x V is ever kept); Options::reduction is applied over all N
/// rows, not per chunk. Options::probability_targets is not supported (target ids only).
///
/// All calls are collective. Errors (shapes, targets, non-finite logits) throw the same vpce::Error on
/// every rank; an error found in a chunk may leave the outputs partly written.
template <class Scalar, class ExecSpace = Kokkos::DefaultExecutionSpace>
class LinearCrossEntropy {
  static_assert(std::is_same_v<Scalar, float> || std::is_same_v<Scalar, double> || is_16bit_v<Scalar>,
                "vpce::LinearCrossEntropy supports float, double, vpce::bfloat16 and vpce::float16");

 public:
  using scalar_type = Scalar;
  using compute_type = compute_type_t<Scalar>;
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using matrix_view = Kokkos::View<const Scalar**, Kokkos::LayoutRight, memory_space>;
  using bias_view = Kokkos::View<const Scalar*, memory_space>;
  using grad_matrix_view = Kokkos::View<compute_type**, Kokkos::LayoutRight, memory_space>;
  using grad_bias_view = Kokkos::View<compute_type*, memory_space>;
  using targets_view = Kokkos::View<const std::int64_t*, memory_space>;
  using loss_view = Kokkos::View<compute_type*, memory_space>;
  using grad_loss_view = Kokkos::View<const compute_type*, memory_space>;

  /// Collective: checks that the options, the partition, hidden_size and the chunking agree on every rank.
  LinearCrossEntropy(const Communicator& comm, const VocabPartition& partition, std::int64_t hidden_size,
                     const Options& options = {}, const LinearOptions& linear = {},
                     const ExecSpace& exec = ExecSpace());
  ~LinearCrossEntropy();
  LinearCrossEntropy(const LinearCrossEntropy&) = delete;
  LinearCrossEntropy& operator=(const LinearCrossEntropy&) = delete;

  /// Per-token loss (0 for ignored rows): one gemm per chunk. Keeps references to hidden, weight, bias and
  /// targets for backward(); they must stay unchanged until then. The overloads without `bias` have none.
  void forward(const matrix_view& hidden, const matrix_view& weight, const bias_view& bias, const targets_view& targets,
               const loss_view& loss);
  void forward(const matrix_view& hidden, const matrix_view& weight, const targets_view& targets,
               const loss_view& loss) {
    forward(hidden, weight, bias_view(), targets, loss);
  }

  /// Gradients of sum_i grad_loss(i) * loss_i (Reduction::none only) with respect to the hidden states and
  /// this rank's weight (and bias) rows, for the inputs of the last forward(). Recomputes each chunk's
  /// logits (three gemms per chunk). grad_weight and grad_bias are overwritten, or added to with
  /// accumulate_weight. grad_bias is needed when the forward() had a bias, and not allowed otherwise.
  void backward(const grad_loss_view& grad_loss, const grad_matrix_view& grad_hidden,
                const grad_matrix_view& grad_weight, const grad_bias_view& grad_bias, bool accumulate_weight = false);
  void backward(const grad_loss_view& grad_loss, const grad_matrix_view& grad_hidden,
                const grad_matrix_view& grad_weight, bool accumulate_weight = false) {
    backward(grad_loss, grad_hidden, grad_weight, grad_bias_view(), accumulate_weight);
  }
  /// Gradients of grad_scale * L (L as CrossEntropy::backward(scalar) defines it for the reduction).
  void backward(compute_type grad_scale, const grad_matrix_view& grad_hidden, const grad_matrix_view& grad_weight,
                const grad_bias_view& grad_bias, bool accumulate_weight = false);
  void backward(compute_type grad_scale, const grad_matrix_view& grad_hidden, const grad_matrix_view& grad_weight,
                bool accumulate_weight = false) {
    backward(grad_scale, grad_hidden, grad_weight, grad_bias_view(), accumulate_weight);
  }

  /// Loss and the gradients in one pass over the chunks (three gemms and one collective per chunk, one
  /// all-reduce of grad_hidden): the training step.
  void loss_and_grad(const matrix_view& hidden, const matrix_view& weight, const bias_view& bias,
                     const targets_view& targets, const loss_view& loss, const grad_matrix_view& grad_hidden,
                     const grad_matrix_view& grad_weight, const grad_bias_view& grad_bias,
                     compute_type grad_scale = compute_type(1), bool accumulate_weight = false);
  void loss_and_grad(const matrix_view& hidden, const matrix_view& weight, const bias_view& bias,
                     const targets_view& targets, const loss_view& loss, const grad_matrix_view& grad_hidden,
                     const grad_matrix_view& grad_weight, const grad_bias_view& grad_bias,
                     const grad_loss_view& grad_loss, bool accumulate_weight = false);
  void loss_and_grad(const matrix_view& hidden, const matrix_view& weight, const targets_view& targets,
                     const loss_view& loss, const grad_matrix_view& grad_hidden, const grad_matrix_view& grad_weight,
                     compute_type grad_scale = compute_type(1), bool accumulate_weight = false) {
    loss_and_grad(hidden, weight, bias_view(), targets, loss, grad_hidden, grad_weight, grad_bias_view(), grad_scale,
                  accumulate_weight);
  }
  void loss_and_grad(const matrix_view& hidden, const matrix_view& weight, const targets_view& targets,
                     const loss_view& loss, const grad_matrix_view& grad_hidden, const grad_matrix_view& grad_weight,
                     const grad_loss_view& grad_loss, bool accumulate_weight = false) {
    loss_and_grad(hidden, weight, bias_view(), targets, loss, grad_hidden, grad_weight, grad_bias_view(), grad_loss,
                  accumulate_weight);
  }

  /// log-sum-exp per row of the last call (N).
  Kokkos::View<const compute_type*, memory_space> lse() const { return m_lse; }
  /// The per-token losses of the last call reduced as Options::reduction says (the sum for none), summed
  /// in row order.
  double reduced_loss() const noexcept { return m_reduced_loss; }
  /// Rows of the last call whose target is not ignore_index.
  std::int64_t num_valid() const noexcept { return m_n_valid; }
  /// Rows per chunk (the same on every rank).
  std::int64_t chunk_rows() const noexcept { return m_chunk_rows; }
  /// Weight rows multiplied at a time: V_local, or for 16-bit inputs the rows whose float copy fits in
  /// LinearOptions::chunk_bytes.
  std::int64_t weight_block_rows() const noexcept { return m_block_rows; }
  std::int64_t hidden_size() const noexcept { return m_hidden; }
  const Communicator& communicator() const noexcept { return m_comm; }
  const VocabPartition& partition() const noexcept { return m_part; }
  const Options& options() const noexcept { return m_opt; }
  const LinearOptions& linear_options() const noexcept { return m_linear; }

 private:
  /// What one call reads and writes (pointers: absent when null or empty).
  struct Call;
  /// The chunks of one call.
  void run(const Call& call);
  /// Checks the shapes on every rank (and, with sequence-parallel input, learns each rank's rows).
  void check_call(const Call& call);
  void backward_impl(Call call);

  Communicator m_comm;
  VocabPartition m_part;
  Options m_opt;
  LinearOptions m_linear;
  ExecSpace m_exec;
  std::int64_t m_hidden = 0;
  std::int64_t m_chunk_rows = 1;
  std::int64_t m_block_rows = 1;
  CrossEntropy<compute_type, ExecSpace> m_ce;  // reduction none, recompute: per chunk

  Kokkos::View<compute_type*, memory_space> m_buf;           // one chunk of logits / their gradient
  Kokkos::View<compute_type*, memory_space> m_block_out;     // one block of a chunk's logits (blocks > 1)
  Kokkos::View<compute_type*, memory_space> m_weight_block;  // weight rows in float (16-bit inputs)
  Kokkos::View<compute_type*, memory_space> m_hidden_chunk;  // a chunk of hidden in float (16-bit inputs)
  Kokkos::View<Scalar*, memory_space> m_gathered;            // a chunk of gathered hidden (sequence-parallel)
  Kokkos::View<compute_type*, memory_space> m_grad_chunk;    // a chunk's grad_hidden before its reduce-scatter
  Kokkos::View<compute_type*, memory_space> m_ones;          // the column sums' vector (bias)
  Kokkos::View<compute_type*, memory_space> m_scratch_loss;  // chunk losses backward() does not return
  Kokkos::View<compute_type*, memory_space> m_lse;
  std::vector<std::int64_t> m_row_begin;  // sequence-parallel: first row of each rank, and N

  matrix_view m_saved_hidden, m_saved_weight;
  bias_view m_saved_bias;
  targets_view m_saved_targets;
  bool m_have_forward = false;
  std::int64_t m_n_valid = 0;
  double m_reduced_loss = 0;
};

extern template class LinearCrossEntropy<float, Kokkos::DefaultExecutionSpace>;
extern template class LinearCrossEntropy<double, Kokkos::DefaultExecutionSpace>;
extern template class LinearCrossEntropy<bfloat16, Kokkos::DefaultExecutionSpace>;
extern template class LinearCrossEntropy<float16, Kokkos::DefaultExecutionSpace>;

}  // namespace vpce
