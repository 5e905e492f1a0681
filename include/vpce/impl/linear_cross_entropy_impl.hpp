#pragma once
/// \file linear_cross_entropy_impl.hpp
/// \brief Definitions of vpce::LinearCrossEntropy (included by vpce/definitions.hpp and by the library's
/// explicit instantiations).
///
/// Per chunk of rows [r0, r1): logits = hidden[r0:r1] W_r^T (gemm) -> CrossEntropy::loss_and_grad in
/// place (one collective) -> grad_W_r (+)= dlogits^T hidden[r0:r1], grad_hidden[r0:r1] = dlogits W_r
/// (gemms) -> after the last chunk one SUM all-reduce of grad_hidden.
///
/// The gemms are written for column-major (LayoutLeft) Views, which is what BLAS TPLs take (Kokkos Kernels
/// 3.4 sends only LayoutLeft host gemms to OpenBLAS, and only LayoutLeft ones to cuBLAS): a row-major
/// R x C matrix is the column-major C x R matrix of its transpose, so with H the hidden size:
///   logits^T (V_r x c)      = W_LL^T (V_r x H)      x hidden_LL (H x c)     gemm("T", "N")
///   grad_W^T (H x V_r)     (+)= hidden_LL (H x c)    x dlogits^T^T (c x V_r) gemm("N", "T")
///   grad_hidden^T (H x c)   = W_LL (H x V_r)        x dlogits^T (V_r x c)   gemm("N", "N")
/// where X_LL is the LayoutLeft view of the row-major X's buffer (its transpose).

#include <KokkosBlas3_gemm.hpp>
#include <algorithm>
#include <string>

#include "vpce/error.hpp"
#include "vpce/impl/compat.hpp"
#include "vpce/impl/cross_entropy_impl.hpp"
#include "vpce/impl/staging.hpp"
#include "vpce/linear_cross_entropy.hpp"

namespace vpce {

namespace impl {

inline Options per_chunk_options(Options o) {
  o.reduction = Reduction::none;  // applied over all rows by LinearCrossEntropy
  o.mode = Mode::recompute;       // nothing is kept between calls of the per-chunk CrossEntropy
  return o;
}

/// [a, a + na) and [b, b + nb) overlap (byte ranges; empty ranges never overlap).
inline bool overlaps(const void* a, std::size_t na, const void* b, std::size_t nb) {
  const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

/// Rows of targets that are not ignore_index. A free function, not in the (private) member run(): CUDA's
/// extended __host__ __device__ lambdas must not be defined in a private or protected member function.
template <class ExecSpace, class TargetsView>
std::int64_t count_valid(const ExecSpace& exec, const TargetsView& targets, std::int64_t ignore) {
  std::int64_t n_valid = 0;
  Kokkos::parallel_reduce(
      "vpce::linear::count_valid", Kokkos::RangePolicy<ExecSpace>(exec, 0, targets.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & c) { c += targets(i) != ignore ? 1 : 0; }, n_valid);
  return n_valid;
}

}  // namespace impl

template <class Scalar, class ExecSpace>
LinearCrossEntropy<Scalar, ExecSpace>::LinearCrossEntropy(const Communicator& comm, const VocabPartition& partition,
                                                          std::int64_t hidden_size, const Options& options,
                                                          const LinearOptions& linear, const ExecSpace& exec)
    : m_comm(comm),
      m_part(partition),
      m_opt(options),
      m_exec(exec),
      m_hidden(hidden_size),
      m_ce(comm, partition, impl::per_chunk_options(options), exec) {
  std::string err;
  if (hidden_size < 1) {
    err = "LinearCrossEntropy: hidden_size is " + std::to_string(hidden_size) + ", expected >= 1";
  } else if (linear.chunk_rows < 0 || (linear.chunk_rows == 0 && linear.chunk_bytes < 1)) {
    err = "LinearOptions: chunk_rows must be >= 0, and chunk_bytes >= 1 when chunk_rows is 0";
  }
  // The rows of a chunk come from the widest slice over the ranks, so every rank computes the same value.
  const std::int64_t widest = std::max<std::int64_t>(1, m_part.max_local_size());
  m_chunk_rows = linear.chunk_rows > 0 ? linear.chunk_rows
                                       : std::max<std::int64_t>(1, linear.chunk_bytes / (widest * std::int64_t(sizeof(Scalar))));
  m_comm.agree_or_throw(err, {{"the hidden size", hidden_size},
                              {"LinearOptions (rows per chunk)", m_chunk_rows},
                              {"Options::reduction", static_cast<std::int64_t>(m_opt.reduction)}});
}

template <class Scalar, class ExecSpace>
LinearCrossEntropy<Scalar, ExecSpace>::~LinearCrossEntropy() = default;

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::check_call(const matrix_view& hidden, const matrix_view& weight,
                                                       const targets_view& targets, const loss_view& loss,
                                                       const grad_matrix_view* grad_hidden,
                                                       const grad_matrix_view* grad_weight,
                                                       const grad_loss_view* grad_loss) {
  const std::int64_t n = hidden.extent(0), h = m_hidden, v = m_part.local_size();
  auto shape = [](std::int64_t a, std::int64_t b) { return std::to_string(a) + " x " + std::to_string(b); };
  auto is_matrix = [&](const char* what, std::int64_t rows, std::int64_t cols, std::int64_t want_rows,
                       bool contiguous, std::string* e) {
    if (!e->empty()) return;
    if (rows != want_rows || cols != h)
      *e = std::string("LinearCrossEntropy: ") + what + " is " + shape(rows, cols) + ", expected " +
           shape(want_rows, h);
    else if (!contiguous)
      *e = std::string("LinearCrossEntropy: ") + what + " must be contiguous (rows of stride H)";
  };
  std::string err;
  is_matrix("hidden", hidden.extent(0), hidden.extent(1), n, hidden.span_is_contiguous(), &err);
  is_matrix("weight (this rank's rows)", weight.extent(0), weight.extent(1), v, weight.span_is_contiguous(), &err);
  if (grad_hidden) is_matrix("grad_hidden", grad_hidden->extent(0), grad_hidden->extent(1), n,
                             grad_hidden->span_is_contiguous(), &err);
  if (grad_weight) is_matrix("grad_weight", grad_weight->extent(0), grad_weight->extent(1), v,
                             grad_weight->span_is_contiguous(), &err);
  if (err.empty() && (std::int64_t(targets.extent(0)) != n || std::int64_t(loss.extent(0)) != n))
    err = "LinearCrossEntropy: targets has " + std::to_string(targets.extent(0)) + " rows and loss " +
          std::to_string(loss.extent(0)) + ", hidden has " + std::to_string(n);
  if (err.empty() && grad_loss) {
    if (m_opt.reduction != Reduction::none)
      err = "LinearCrossEntropy: a per-row grad_loss needs Reduction::none (use the scalar overload)";
    else if (std::int64_t(grad_loss->extent(0)) != n)
      err = "LinearCrossEntropy: grad_loss has " + std::to_string(grad_loss->extent(0)) +
            " rows, expected " + std::to_string(n);
  }
  if (err.empty() && (grad_hidden || grad_weight)) {
    const std::size_t s = sizeof(Scalar);
    const void* in[] = {hidden.data(), weight.data()};
    const std::size_t in_n[] = {hidden.span() * s, weight.span() * s};
    for (int i = 0; i < 2; ++i) {
      if ((grad_hidden && impl::overlaps(grad_hidden->data(), grad_hidden->span() * s, in[i], in_n[i])) ||
          (grad_weight && impl::overlaps(grad_weight->data(), grad_weight->span() * s, in[i], in_n[i])))
        err = "LinearCrossEntropy: the gradients must not share memory with hidden or weight";
    }
    if (grad_hidden && grad_weight &&
        impl::overlaps(grad_hidden->data(), grad_hidden->span() * s, grad_weight->data(), grad_weight->span() * s))
      err = "LinearCrossEntropy: grad_hidden and grad_weight share memory";
  }
  // The number of chunks (one collective each) follows from N: it must be the same on every rank.
  m_comm.agree_or_throw(err, {{"the number of tokens N", n}});
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::forward(const matrix_view& hidden, const matrix_view& weight,
                                                    const targets_view& targets, const loss_view& loss) {
  m_have_forward = false;
  check_call(hidden, weight, targets, loss, nullptr, nullptr, nullptr);
  run(hidden, weight, targets, loss, impl::Write::loss, nullptr, nullptr, nullptr, Scalar(1), false);
  m_saved_hidden = hidden;
  m_saved_weight = weight;
  m_saved_targets = targets;
  m_have_forward = true;
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::backward(const grad_loss_view& grad_loss,
                                                     const grad_matrix_view& grad_hidden,
                                                     const grad_matrix_view& grad_weight, bool accumulate_weight) {
  backward_impl(&grad_loss, Scalar(1), grad_hidden, grad_weight, accumulate_weight);
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::backward(Scalar grad_scale, const grad_matrix_view& grad_hidden,
                                                     const grad_matrix_view& grad_weight, bool accumulate_weight) {
  backward_impl(nullptr, grad_scale, grad_hidden, grad_weight, accumulate_weight);
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::backward_impl(const grad_loss_view* grad_loss, Scalar grad_scale,
                                                          const grad_matrix_view& grad_hidden,
                                                          const grad_matrix_view& grad_weight,
                                                          bool accumulate_weight) {
  VPCE_THROW_IF(!m_have_forward, "LinearCrossEntropy::backward() without a forward()");
  const std::int64_t n = m_saved_hidden.extent(0);
  if (std::int64_t(m_scratch_loss.extent(0)) < n)
    m_scratch_loss = loss_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::linear::loss"), n);
  auto loss = Kokkos::subview(m_scratch_loss, std::make_pair(std::int64_t(0), n));
  check_call(m_saved_hidden, m_saved_weight, m_saved_targets, loss, &grad_hidden, &grad_weight, grad_loss);
  run(m_saved_hidden, m_saved_weight, m_saved_targets, loss, impl::Write::grad, &grad_hidden, &grad_weight, grad_loss,
      grad_scale, accumulate_weight);
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::loss_and_grad(const matrix_view& hidden, const matrix_view& weight,
                                                          const targets_view& targets, const loss_view& loss,
                                                          const grad_matrix_view& grad_hidden,
                                                          const grad_matrix_view& grad_weight, Scalar grad_scale,
                                                          bool accumulate_weight) {
  m_have_forward = false;
  check_call(hidden, weight, targets, loss, &grad_hidden, &grad_weight, nullptr);
  run(hidden, weight, targets, loss, impl::Write::grad, &grad_hidden, &grad_weight, nullptr, grad_scale, accumulate_weight);
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::loss_and_grad(const matrix_view& hidden, const matrix_view& weight,
                                                          const targets_view& targets, const loss_view& loss,
                                                          const grad_matrix_view& grad_hidden,
                                                          const grad_matrix_view& grad_weight,
                                                          const grad_loss_view& grad_loss, bool accumulate_weight) {
  m_have_forward = false;
  check_call(hidden, weight, targets, loss, &grad_hidden, &grad_weight, &grad_loss);
  run(hidden, weight, targets, loss, impl::Write::grad, &grad_hidden, &grad_weight, &grad_loss, Scalar(1),
      accumulate_weight);
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::run(const matrix_view& hidden, const matrix_view& weight,
                                                const targets_view& targets, const loss_view& loss, impl::Write what,
                                                const grad_matrix_view* grad_hidden,
                                                const grad_matrix_view* grad_weight, const grad_loss_view* grad_loss,
                                                Scalar grad_scale, bool accumulate_weight) {
  using LL = Kokkos::View<Scalar**, Kokkos::LayoutLeft, Kokkos::Device<ExecSpace, memory_space>,
                          Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using ConstLL = Kokkos::View<const Scalar**, Kokkos::LayoutLeft, Kokkos::Device<ExecSpace, memory_space>,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Chunk = Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  impl::ScopedRegion region("vpce::linear_cross_entropy");
  const std::int64_t n = hidden.extent(0), h = m_hidden, v = m_part.local_size();
  const bool grad = what == impl::Write::grad;

  // The mean's divisor counts the valid rows of all chunks before the first gradient is written.
  const std::int64_t n_valid = impl::count_valid(m_exec, targets, m_opt.ignore_index);
  Scalar scale = grad_scale;
  if (m_opt.reduction == Reduction::mean) scale = n_valid > 0 ? grad_scale / Scalar(n_valid) : Scalar(0);

  const std::int64_t rows = std::min(m_chunk_rows, std::max<std::int64_t>(n, 1));
  if (std::int64_t(m_buf.extent(0)) < rows * v)
    m_buf = Kokkos::View<Scalar*, memory_space>();  // free before allocating the larger one
  if (std::int64_t(m_buf.extent(0)) < rows * v)
    m_buf = Kokkos::View<Scalar*, memory_space>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::linear::chunk"),
                                                rows * v);
  if (std::int64_t(m_lse.extent(0)) != n)
    m_lse = Kokkos::View<Scalar*, memory_space>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::linear::lse"), n);

  // The gemms below do nothing for empty shapes: outputs they would leave untouched are zeroed here.
  if (grad && v == 0) Kokkos::deep_copy(m_exec, *grad_hidden, Scalar(0));
  if (grad && n == 0 && !accumulate_weight) Kokkos::deep_copy(m_exec, *grad_weight, Scalar(0));

  const ConstLL w_ll(weight.data(), h, v);
  double total = 0;
  for (std::int64_t r0 = 0; r0 < n; r0 += rows) {
    const std::int64_t r1 = std::min(n, r0 + rows), c = r1 - r0;
    const auto span = std::make_pair(r0, r1);
    const Chunk logits(m_buf.data(), c, v);
    const LL logits_t(m_buf.data(), v, c);
    const ConstLL hidden_ll(hidden.data() + r0 * h, h, c);
    if (v > 0) {
      impl::ScopedRegion r("vpce::linear::gemm_logits");
      KokkosBlas::gemm("T", "N", Scalar(1), w_ll, hidden_ll, Scalar(0), logits_t);
    }
    const auto targets_c = Kokkos::subview(targets, span);
    const auto loss_c = Kokkos::subview(loss, span);
    try {
      if (!grad) {
        m_ce.forward(logits, targets_c, loss_c);
      } else if (grad_loss) {
        m_ce.loss_and_grad(logits, targets_c, loss_c, logits, Kokkos::subview(*grad_loss, span));
      } else {
        m_ce.loss_and_grad(logits, targets_c, loss_c, logits, scale);
      }
    } catch (const Error& e) {  // thrown alike on every rank: the rows it names count from the chunk's first
      throw Error(e.message() + " (LinearCrossEntropy: in the chunk of rows " + std::to_string(r0) + " to " +
                      std::to_string(r1 - 1) + "; row numbers count from " + std::to_string(r0) + ")",
                  e.where());
    }
    total += m_ce.reduced_loss();
    Kokkos::deep_copy(m_exec, Kokkos::subview(m_lse, span), m_ce.lse());
    if (grad && v > 0) {
      impl::ScopedRegion r("vpce::linear::gemm_grad");
      const ConstLL dlogits_t(m_buf.data(), v, c);
      const LL grad_w_ll(grad_weight->data(), h, v);
      const LL grad_h_ll(grad_hidden->data() + r0 * h, h, c);
      KokkosBlas::gemm("N", "T", Scalar(1), hidden_ll, dlogits_t, Scalar(accumulate_weight || r0 > 0 ? 1 : 0),
                       grad_w_ll);
      KokkosBlas::gemm("N", "N", Scalar(1), w_ll, dlogits_t, Scalar(0), grad_h_ll);
    }
  }

  if (grad && m_comm.size() > 1 && n > 0) {
    impl::ScopedRegion r("vpce::collective");
    impl::allreduce(m_exec, impl::Staged<grad_matrix_view>(*grad_hidden).part(Kokkos::ALL, Kokkos::ALL), MPI_SUM,
                    m_comm.comm());
  }
  impl::fence(m_exec, "vpce::linear::done");
  m_n_valid = n_valid;
  m_reduced_loss = m_opt.reduction == Reduction::mean ? (n_valid > 0 ? total / double(n_valid) : 0.0) : total;
}

}  // namespace vpce
