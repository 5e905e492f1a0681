#pragma once
/// \file linear_cross_entropy_impl.hpp
/// \brief Definitions of vpce::LinearCrossEntropy (included by vpce/definitions.hpp and by the library's
/// explicit instantiations).
///
/// Per chunk of rows [r0, r1): (sequence-parallel input: all-gather the chunk's hidden rows) -> logits =
/// hidden[r0:r1] W_r^T + bias (gemm) -> CrossEntropy::loss_and_grad in place (one collective) -> grad_W_r
/// (+)= dlogits^T hidden[r0:r1], grad_bias (+)= dlogits^T 1 (gemv), grad_hidden[r0:r1] = dlogits W_r (gemms)
/// -> after the last chunk one SUM all-reduce of grad_hidden (sequence-parallel: a SUM reduce-scatter of
/// each chunk's rows instead). 16-bit hidden and weight are converted to float first: the hidden rows chunk
/// by chunk, the weight rows in blocks of at most LinearOptions::chunk_bytes (the gemms are then done block
/// by block of vocabulary columns, through a block-sized buffer when there is more than one block).
///
/// The gemms are written for column-major (LayoutLeft) Views, which is what BLAS TPLs take (Kokkos Kernels
/// 3.4 sends only LayoutLeft host gemms to OpenBLAS, and only LayoutLeft ones to cuBLAS): a row-major
/// R x C matrix is the column-major C x R matrix of its transpose, so with H the hidden size:
///   logits^T (V_r x c)      = W_LL^T (V_r x H)      x hidden_LL (H x c)     gemm("T", "N")
///   grad_W^T (H x V_r)     (+)= hidden_LL (H x c)    x dlogits^T^T (c x V_r) gemm("N", "T")
///   grad_hidden^T (H x c)   = W_LL (H x V_r)        x dlogits^T (V_r x c)   gemm("N", "N")
/// where X_LL is the LayoutLeft view of the row-major X's buffer (its transpose).

#include <KokkosBlas2_gemv.hpp>
#include <KokkosBlas3_gemm.hpp>
#include <algorithm>
#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "vpce/error.hpp"
#include "vpce/impl/compat.hpp"
#include "vpce/impl/cross_entropy_impl.hpp"
#include "vpce/impl/kernels.hpp"
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

/// dst[k] = S(src[k]) for k in [0, n): 16-bit values to float.
template <class ExecSpace, class D, class S>
void convert(const ExecSpace& exec, const S* src, D* dst, std::int64_t n) {
  Kokkos::parallel_for(
      "vpce::linear::convert", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t k) { dst[k] = D(src[k]); });
}

/// Row i of a rows x cols block: dst[i * dst_ld + j] = src[i * src_ld + j] (+ bias[j]), as for_rows runs
/// it (a vectorised loop per row on the host, a team per row on a device). src may be dst (a bias added in
/// place).
template <class T, class B>
struct CopyRows {
  T* dst;
  std::int64_t dst_ld;
  const T* src;
  std::int64_t src_ld;
  const B* bias;  // null: none
  std::int64_t cols;
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& inner, std::int64_t i) const {
    T* d = dst + i * dst_ld;
    const T* s = src + i * src_ld;
    if (bias != nullptr)
      inner.for_each(cols, [&](std::int64_t j) { d[j] = s[j] + T(bias[j]); });
    else
      inner.for_each(cols, [&](std::int64_t j) { d[j] = s[j]; });
  }
};

template <class ExecSpace, class T, class B>
void copy_rows(const ExecSpace& exec, std::int64_t rows, std::int64_t cols, T* dst, std::int64_t dst_ld, const T* src,
               std::int64_t src_ld, const B* bias) {
  if (cols > 0)
    for_rows("vpce::linear::copy_rows", exec, 0, rows, CopyRows<T, B>{dst, dst_ld, src, src_ld, bias, cols},
             !is_host_space_v<ExecSpace>);
}

/// Sets a LinearCrossEntropy call's gradient outputs (`Call` is its private description of one call).
template <class Call, class Matrix, class Vector>
void set_gradients(Call* call, const Matrix& grad_hidden, const Matrix& grad_weight, const Vector& grad_bias,
                   bool accumulate) {
  call->grad = true;
  call->grad_hidden = grad_hidden;
  call->grad_weight = grad_weight;
  call->grad_bias = grad_bias;
  call->accumulate = accumulate;
}

/// An MPI datatype freed when it goes out of scope.
struct ScopedType {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  explicit ScopedType(int bytes) {  // `bytes` contiguous bytes
    VPCE_MPI_CHECK(MPI_Type_contiguous(bytes, MPI_BYTE, &type));
    VPCE_MPI_CHECK(MPI_Type_commit(&type));
  }
  ~ScopedType() { MPI_Type_free(&type); }
  ScopedType(const ScopedType&) = delete;
  ScopedType& operator=(const ScopedType&) = delete;
};

/// Makes `v` hold at least n values (reallocated without initialising, the old one freed first).
template <class View>
void ensure_size(View* v, std::int64_t n, const char* label) {
  if (std::int64_t(v->extent(0)) >= n) return;
  *v = View();
  *v = View(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n);
}

}  // namespace impl

template <class Scalar, class ExecSpace>
struct LinearCrossEntropy<Scalar, ExecSpace>::Call {
  matrix_view hidden, weight;
  bias_view bias;  // data() null: no bias
  targets_view targets;
  loss_view loss;
  bool grad = false;  // also the gradients
  grad_matrix_view grad_hidden, grad_weight;
  grad_bias_view grad_bias;
  bool per_row = false;  // grad_loss (per row) instead of grad_scale
  grad_loss_view grad_loss;
  compute_type grad_scale = 1;
  bool accumulate = false;
};

template <class Scalar, class ExecSpace>
LinearCrossEntropy<Scalar, ExecSpace>::LinearCrossEntropy(const Communicator& comm, const VocabPartition& partition,
                                                          std::int64_t hidden_size, const Options& options,
                                                          const LinearOptions& linear, const ExecSpace& exec)
    : m_comm(comm),
      m_part(partition),
      m_opt(options),
      m_linear(linear),
      m_exec(exec),
      m_hidden(hidden_size),
      m_ce(comm, partition, impl::per_chunk_options(options), exec) {
  std::string err;
  if (hidden_size < 1) {
    err = "LinearCrossEntropy: hidden_size is " + std::to_string(hidden_size) + ", expected >= 1";
  } else if (linear.chunk_rows < 0 || linear.chunk_bytes < 1) {
    err = "LinearOptions: chunk_rows must be >= 0 and chunk_bytes >= 1";
  } else if (options.probability_targets) {
    err = "LinearCrossEntropy: Options::probability_targets is not supported (target ids only)";
  }
  // The rows of a chunk come from the widest slice over the ranks, so every rank computes the same value.
  const std::int64_t widest = std::max<std::int64_t>(1, m_part.max_local_size());
  const std::int64_t budget = std::max<std::int64_t>(1, linear.chunk_bytes);
  m_chunk_rows = linear.chunk_rows > 0
                     ? linear.chunk_rows
                     : std::max<std::int64_t>(1, budget / (widest * std::int64_t(sizeof(compute_type))));
  // A sequence-parallel chunk is reduce-scattered in one MPI call: at most INT_MAX values.
  if (linear.sequence_parallel)
    m_chunk_rows = std::min<std::int64_t>(m_chunk_rows,
                                          std::max<std::int64_t>(1, INT_MAX / std::max<std::int64_t>(1, hidden_size)));
  // 16-bit weight rows are multiplied block by block of their float copies.
  const std::int64_t v = std::max<std::int64_t>(1, m_part.local_size());
  m_block_rows = is_16bit_v<Scalar>
                     ? std::clamp<std::int64_t>(
                           budget / (std::max<std::int64_t>(1, hidden_size) * std::int64_t(sizeof(compute_type))), 1, v)
                     : v;
  m_comm.agree_or_throw(err, {{"the hidden size", hidden_size},
                              {"LinearOptions (rows per chunk)", m_chunk_rows},
                              {"LinearOptions::sequence_parallel", linear.sequence_parallel ? 1 : 0},
                              {"Options::reduction", static_cast<std::int64_t>(m_opt.reduction)}});
}

template <class Scalar, class ExecSpace>
LinearCrossEntropy<Scalar, ExecSpace>::~LinearCrossEntropy() = default;

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::check_call(const Call& call) {
  const std::int64_t n_here = call.hidden.extent(0), h = m_hidden, v = m_part.local_size();
  // With sequence-parallel input, N is the sum of every rank's rows, and rank r's are the global rows
  // [m_row_begin[r], m_row_begin[r + 1]).
  std::int64_t n = n_here;
  if (m_linear.sequence_parallel) {
    std::vector<std::int64_t> counts(m_comm.size());
    const MPI_Datatype i64 = impl::mpi_datatype<std::int64_t>();
    VPCE_MPI_CHECK(MPI_Allgather(&n_here, 1, i64, counts.data(), 1, i64, m_comm.comm()));
    m_row_begin.assign(counts.size() + 1, 0);
    for (std::size_t r = 0; r < counts.size(); ++r) m_row_begin[r + 1] = m_row_begin[r] + counts[r];
    n = m_row_begin.back();
  }
  auto shape = [](std::int64_t a, std::int64_t b) { return std::to_string(a) + " x " + std::to_string(b); };
  std::string err;
  auto is_matrix = [&](const char* what, std::int64_t rows, std::int64_t cols, std::int64_t want_rows,
                       bool contiguous) {
    if (!err.empty()) return;
    if (rows != want_rows || cols != h)
      err =
          std::string("LinearCrossEntropy: ") + what + " is " + shape(rows, cols) + ", expected " + shape(want_rows, h);
    else if (!contiguous)
      err = std::string("LinearCrossEntropy: ") + what + " must be contiguous (rows of stride H)";
  };
  auto is_vector = [&](const char* what, std::int64_t len, std::int64_t want, const char* meaning) {
    if (err.empty() && len != want)
      err = std::string("LinearCrossEntropy: ") + what + " has " + std::to_string(len) + " values, expected " +
            std::to_string(want) + " (" + meaning + ")";
  };
  const bool has_bias = call.bias.data() != nullptr;
  is_matrix("hidden", call.hidden.extent(0), call.hidden.extent(1), n_here, call.hidden.span_is_contiguous());
  is_matrix("weight (this rank's rows)", call.weight.extent(0), call.weight.extent(1), v,
            call.weight.span_is_contiguous());
  if (has_bias) is_vector("bias", call.bias.extent(0), v, "this rank's rows of the weight");
  if (call.grad) {
    is_matrix("grad_hidden", call.grad_hidden.extent(0), call.grad_hidden.extent(1), n_here,
              call.grad_hidden.span_is_contiguous());
    is_matrix("grad_weight", call.grad_weight.extent(0), call.grad_weight.extent(1), v,
              call.grad_weight.span_is_contiguous());
    if (has_bias)
      is_vector("grad_bias", call.grad_bias.extent(0), v, "the call has a bias");
    else if (err.empty() && call.grad_bias.extent(0) > 0)
      err = "LinearCrossEntropy: grad_bias is given but the call has no bias";
  }
  is_vector("targets", call.targets.extent(0), n, "one per token");
  is_vector("loss", call.loss.extent(0), n, "one per token");
  if (call.per_row) {
    if (err.empty() && m_opt.reduction != Reduction::none)
      err = "LinearCrossEntropy: a per-row grad_loss needs Reduction::none (use the scalar overload)";
    is_vector("grad_loss", call.grad_loss.extent(0), n, "one per token");
  }
  if (err.empty() && call.grad) {
    auto bytes = [](const auto& view) {
      return std::make_pair(static_cast<const void*>(view.data()),
                            view.span() * sizeof(typename std::decay_t<decltype(view)>::value_type));
    };
    const std::pair<const void*, std::size_t> in[] = {bytes(call.hidden), bytes(call.weight), bytes(call.bias)};
    const std::pair<const void*, std::size_t> out[] = {bytes(call.grad_hidden), bytes(call.grad_weight),
                                                       bytes(call.grad_bias)};
    for (const auto& o : out)
      for (const auto& i : in)
        if (impl::overlaps(o.first, o.second, i.first, i.second))
          err = "LinearCrossEntropy: the gradients must not share memory with hidden, weight or bias";
    for (int a = 0; a < 3; ++a)
      for (int b = a + 1; b < 3; ++b)
        if (impl::overlaps(out[a].first, out[a].second, out[b].first, out[b].second))
          err = "LinearCrossEntropy: grad_hidden, grad_weight and grad_bias must not share memory";
  }
  // The number of chunks (one collective each) follows from N: it must be the same on every rank.
  m_comm.agree_or_throw(err, {{"the number of tokens N", n}});
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::forward(const matrix_view& hidden, const matrix_view& weight,
                                                    const bias_view& bias, const targets_view& targets,
                                                    const loss_view& loss) {
  m_have_forward = false;
  Call call;
  call.hidden = hidden;
  call.weight = weight;
  call.bias = bias;
  call.targets = targets;
  call.loss = loss;
  check_call(call);
  run(call);
  m_saved_hidden = hidden;
  m_saved_weight = weight;
  m_saved_bias = bias;
  m_saved_targets = targets;
  m_have_forward = true;
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::backward(const grad_loss_view& grad_loss,
                                                     const grad_matrix_view& grad_hidden,
                                                     const grad_matrix_view& grad_weight,
                                                     const grad_bias_view& grad_bias, bool accumulate_weight) {
  Call call;
  impl::set_gradients(&call, grad_hidden, grad_weight, grad_bias, accumulate_weight);
  call.per_row = true;
  call.grad_loss = grad_loss;
  backward_impl(call);
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::backward(compute_type grad_scale, const grad_matrix_view& grad_hidden,
                                                     const grad_matrix_view& grad_weight,
                                                     const grad_bias_view& grad_bias, bool accumulate_weight) {
  Call call;
  impl::set_gradients(&call, grad_hidden, grad_weight, grad_bias, accumulate_weight);
  call.grad_scale = grad_scale;
  backward_impl(call);
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::backward_impl(Call call) {
  VPCE_THROW_IF(!m_have_forward, "LinearCrossEntropy::backward() without a forward()");
  const std::int64_t n = m_saved_targets.extent(0);
  impl::ensure_size(&m_scratch_loss, n, "vpce::linear::loss");
  call.hidden = m_saved_hidden;
  call.weight = m_saved_weight;
  call.bias = m_saved_bias;
  call.targets = m_saved_targets;
  call.loss = Kokkos::subview(m_scratch_loss, std::make_pair(std::int64_t(0), n));
  check_call(call);
  run(call);
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::loss_and_grad(const matrix_view& hidden, const matrix_view& weight,
                                                          const bias_view& bias, const targets_view& targets,
                                                          const loss_view& loss, const grad_matrix_view& grad_hidden,
                                                          const grad_matrix_view& grad_weight,
                                                          const grad_bias_view& grad_bias, compute_type grad_scale,
                                                          bool accumulate_weight) {
  m_have_forward = false;
  const Call call{hidden, weight, bias,       targets,          loss, true, grad_hidden, grad_weight, grad_bias,
                  false,  {},     grad_scale, accumulate_weight};
  check_call(call);
  run(call);
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::loss_and_grad(const matrix_view& hidden, const matrix_view& weight,
                                                          const bias_view& bias, const targets_view& targets,
                                                          const loss_view& loss, const grad_matrix_view& grad_hidden,
                                                          const grad_matrix_view& grad_weight,
                                                          const grad_bias_view& grad_bias,
                                                          const grad_loss_view& grad_loss, bool accumulate_weight) {
  m_have_forward = false;
  const Call call{hidden,           weight,      bias,      targets, loss,      true,
                  grad_hidden,      grad_weight, grad_bias, true,    grad_loss, compute_type(1),
                  accumulate_weight};
  check_call(call);
  run(call);
}

template <class Scalar, class ExecSpace>
void LinearCrossEntropy<Scalar, ExecSpace>::run(const Call& call) {
  using T = compute_type;
  using Dev = Kokkos::Device<ExecSpace, memory_space>;
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  using LL = Kokkos::View<T**, Kokkos::LayoutLeft, Dev, Unmanaged>;
  using ConstLL = Kokkos::View<const T**, Kokkos::LayoutLeft, Dev, Unmanaged>;
  using Vec = Kokkos::View<T*, Kokkos::LayoutLeft, Dev, Unmanaged>;
  using ConstVec = Kokkos::View<const T*, Kokkos::LayoutLeft, Dev, Unmanaged>;
  using Chunk = Kokkos::View<T**, Kokkos::LayoutRight, memory_space, Unmanaged>;
  using Flat = Kokkos::View<T*, memory_space>;
  constexpr bool convert = !std::is_same_v<Scalar, T>;
  impl::ScopedRegion region("vpce::linear_cross_entropy");
  const bool grad = call.grad, sp = m_linear.sequence_parallel, has_bias = call.bias.data() != nullptr;
  const std::int64_t n = call.targets.extent(0), h = m_hidden, v = m_part.local_size();
  const std::int64_t rows = std::min(m_chunk_rows, std::max<std::int64_t>(n, 1));
  const std::int64_t vb = std::min(m_block_rows, std::max<std::int64_t>(v, 1));
  const std::int64_t blocks = v > 0 ? (v + vb - 1) / vb : 0;
  const int rank = m_comm.rank(), nranks = m_comm.size();
  const std::int64_t my_begin = sp ? m_row_begin[rank] : 0;

  // The mean's divisor counts the valid rows of all chunks before the first gradient is written.
  const std::int64_t n_valid = impl::count_valid(m_exec, call.targets, m_opt.ignore_index);
  T scale = call.grad_scale;
  if (m_opt.reduction == Reduction::mean) scale = n_valid > 0 ? call.grad_scale / T(n_valid) : T(0);

  impl::ensure_size(&m_buf, rows * v, "vpce::linear::chunk");
  if (std::int64_t(m_lse.extent(0)) != n)
    m_lse = Flat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::linear::lse"), n);
  if (blocks > 1) impl::ensure_size(&m_block_out, vb * rows, "vpce::linear::block");
  if (convert) impl::ensure_size(&m_weight_block, vb * h, "vpce::linear::weight_block");
  if (convert) impl::ensure_size(&m_hidden_chunk, rows * h, "vpce::linear::hidden_chunk");
  if (sp) impl::ensure_size(&m_gathered, rows * h, "vpce::linear::gathered");
  if (sp && grad) impl::ensure_size(&m_grad_chunk, rows * h, "vpce::linear::grad_chunk");
  if (has_bias && grad && v > 0) {
    impl::ensure_size(&m_ones, rows, "vpce::linear::ones");
    Kokkos::deep_copy(m_exec, m_ones, T(1));
  }

  // The gemms below do nothing for empty shapes: outputs they would leave untouched are zeroed here.
  if (grad && v == 0) {
    Kokkos::deep_copy(m_exec, call.grad_hidden, T(0));
    if (sp) Kokkos::deep_copy(m_exec, m_grad_chunk, T(0));
  }
  if (grad && n == 0 && !call.accumulate) {
    Kokkos::deep_copy(m_exec, call.grad_weight, T(0));
    if (has_bias) Kokkos::deep_copy(m_exec, call.grad_bias, T(0));
  }

  // Weight rows [j0, j0 + nb) as an H x nb column-major float matrix: the caller's rows, or their float copy
  // (converted once per call when there is one block, else at each use).
  bool converted = false;
  auto weight_block = [&](std::int64_t j0, std::int64_t nb) {
    if constexpr (convert) {
      if (blocks > 1 || !converted) impl::convert(m_exec, call.weight.data() + j0 * h, m_weight_block.data(), nb * h);
      converted = true;
      return ConstLL(m_weight_block.data(), h, nb);
    } else {
      return ConstLL(call.weight.data() + j0 * h, h, nb);
    }
  };

  // Sequence-parallel: each rank's rows of the chunk (rows of H values: one MPI datatype).
  std::unique_ptr<impl::ScopedType> row_type;
  impl::Staged<Kokkos::View<Scalar*, memory_space>> gathered;
  impl::Staged<Flat> grad_chunk;
  impl::Staged<Kokkos::View<T*, memory_space, Unmanaged>> my_grad;
  std::vector<int> counts(nranks), displs(nranks), value_counts(nranks);
  if (sp) {
    row_type = std::make_unique<impl::ScopedType>(int(h * std::int64_t(sizeof(Scalar))));
    gathered = decltype(gathered)(m_gathered);
    if (grad) {
      grad_chunk = decltype(grad_chunk)(m_grad_chunk);
      my_grad = decltype(my_grad)(
          Kokkos::View<T*, memory_space, Unmanaged>(call.grad_hidden.data(), call.grad_hidden.span()));
    }
  }

  double total = 0;
  for (std::int64_t r0 = 0; r0 < n; r0 += rows) {
    const std::int64_t r1 = std::min(n, r0 + rows), c = r1 - r0;
    const auto span = std::make_pair(r0, r1);
    // This chunk's hidden rows, in the caller's type.
    const Scalar* hidden_c = sp ? m_gathered.data() : call.hidden.data() + r0 * h;
    std::int64_t mine0 = 0, mine1 = 0;  // this rank's rows of the chunk, counted from r0
    if (sp) {
      impl::ScopedRegion r("vpce::linear::allgather");
      for (int q = 0; q < nranks; ++q) {
        const std::int64_t a = std::clamp(m_row_begin[q], r0, r1), b = std::clamp(m_row_begin[q + 1], r0, r1);
        counts[q] = int(b - a);
        displs[q] = int(a - r0);
        value_counts[q] = int((b - a) * h);
      }
      mine0 = displs[rank];
      mine1 = mine0 + counts[rank];
      const auto mine = std::make_pair(mine0 * h, mine1 * h);
      if (mine1 > mine0)
        Kokkos::deep_copy(m_exec, Kokkos::subview(gathered.view(), mine),
                          Kokkos::View<const Scalar*, memory_space, Unmanaged>(
                              call.hidden.data() + (r0 + mine0 - my_begin) * h, (mine1 - mine0) * h));
      impl::allgatherv_in_place(m_exec, gathered.part(mine), gathered.part(std::make_pair(std::int64_t(0), c * h)),
                                counts, displs, row_type->type, m_comm.comm());
    }
    const T* hidden_f = nullptr;
    if constexpr (convert) {
      impl::convert(m_exec, hidden_c, m_hidden_chunk.data(), c * h);
      hidden_f = m_hidden_chunk.data();
    } else {
      hidden_f = hidden_c;
    }
    const ConstLL hidden_ll(hidden_f, h, c);

    // The chunk's logits (c x v row-major = v x c column-major), block by block of weight rows.
    {
      impl::ScopedRegion r("vpce::linear::gemm_logits");
      for (std::int64_t j0 = 0; j0 < v; j0 += vb) {
        const std::int64_t nb = std::min(vb, v - j0);
        const auto w_ll = weight_block(j0, nb);
        T* out = blocks > 1 ? m_block_out.data() : m_buf.data();
        KokkosBlas::gemm("T", "N", T(1), w_ll, hidden_ll, T(0), LL(out, nb, c));
        const Scalar* b = has_bias ? call.bias.data() + j0 : nullptr;
        if (blocks > 1 || b != nullptr) impl::copy_rows(m_exec, c, nb, m_buf.data() + j0, v, out, nb, b);
      }
    }
    const Chunk logits(m_buf.data(), c, v);
    const auto targets_c = Kokkos::subview(call.targets, span);
    const auto loss_c = Kokkos::subview(call.loss, span);
    try {
      if (!grad) {
        m_ce.forward(logits, targets_c, loss_c);
      } else if (call.per_row) {
        m_ce.loss_and_grad(logits, targets_c, loss_c, logits, Kokkos::subview(call.grad_loss, span));
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
    if (!grad) continue;

    // The gradients, block by block of weight rows (dlogits' block copied out when there are several).
    T* grad_h = sp ? m_grad_chunk.data() : call.grad_hidden.data() + r0 * h;
    if (v > 0) {
      impl::ScopedRegion r("vpce::linear::gemm_grad");
      const T keep = call.accumulate || r0 > 0 ? T(1) : T(0);
      for (std::int64_t j0 = 0; j0 < v; j0 += vb) {
        const std::int64_t nb = std::min(vb, v - j0);
        const T* d = m_buf.data();
        if (blocks > 1) {
          impl::copy_rows(m_exec, c, nb, m_block_out.data(), nb, m_buf.data() + j0, v,
                          static_cast<const Scalar*>(nullptr));
          d = m_block_out.data();
        }
        const ConstLL dlogits_t(d, nb, c);
        const auto w_ll = weight_block(j0, nb);
        KokkosBlas::gemm("N", "T", T(1), hidden_ll, dlogits_t, keep, LL(call.grad_weight.data() + j0 * h, h, nb));
        KokkosBlas::gemm("N", "N", T(1), w_ll, dlogits_t, T(j0 > 0 ? 1 : 0), LL(grad_h, h, c));
        if (has_bias)
          KokkosBlas::gemv("N", T(1), dlogits_t, ConstVec(m_ones.data(), c), keep, Vec(call.grad_bias.data() + j0, nb));
      }
    }
    if (sp) {
      impl::ScopedRegion r("vpce::collective");
      // This rank's rows of the chunk in its own gradient; none: an empty part at its start, never a
      // pointer past its end (which may be another buffer's, e.g. the chunk's: MPI rejects aliased buffers).
      const std::int64_t g0 = mine1 > mine0 ? (r0 + mine0 - my_begin) * h : 0;
      impl::reduce_scatter_sum(m_exec, grad_chunk.part(std::make_pair(std::int64_t(0), c * h)),
                               my_grad.part(std::make_pair(g0, g0 + (mine1 - mine0) * h)), value_counts, m_comm.comm());
    }
  }

  if (grad && !sp && nranks > 1 && n > 0) {
    impl::ScopedRegion r("vpce::collective");
    impl::allreduce(m_exec, impl::Staged<grad_matrix_view>(call.grad_hidden).part(Kokkos::ALL, Kokkos::ALL), MPI_SUM,
                    m_comm.comm());
  }
  impl::fence(m_exec, "vpce::linear::done");
  m_n_valid = n_valid;
  m_reduced_loss = m_opt.reduction == Reduction::mean ? (n_valid > 0 ? total / double(n_valid) : 0.0) : total;
}

}  // namespace vpce
