#pragma once
/// \file cross_entropy_impl.hpp
/// \brief Definitions of vpce::CrossEntropy (included by cross_entropy.hpp).
///
/// Data flow of a collective call: input Views -> row statistics kernel -> one all-reduce -> loss /
/// gradient kernel -> output Views; in the fused strategy this runs block by block of rows so that a
/// block's logits are still in cache when its gradient is written.

#include <algorithm>
#include <cmath>
#include <string>

#include "vpce/cross_entropy.hpp"
#include "vpce/impl/collective.hpp"
#include "vpce/impl/compat.hpp"
#include "vpce/impl/kernels.hpp"

namespace vpce {

namespace impl {
inline std::string shape(std::int64_t a, std::int64_t b) {
  return std::to_string(a) + " x " + std::to_string(b);
}
}  // namespace impl

template <class Scalar, class ExecSpace>
CrossEntropy<Scalar, ExecSpace>::CrossEntropy(const Communicator& comm, const VocabPartition& partition,
                                              const Options& options, const ExecSpace& exec)
    : m_comm(comm), m_part(partition), m_opt(options), m_exec(exec) {
  std::string err;
  if (m_part.num_ranks() != m_comm.size()) {
    err = "vpce: the partition is for " + std::to_string(m_part.num_ranks()) + " ranks, the communicator has " +
          std::to_string(m_comm.size());
  } else if (m_part.rank() != m_comm.rank()) {
    err = "vpce: the partition was made for rank " + std::to_string(m_part.rank()) + " but this is rank " +
          std::to_string(m_comm.rank());
  } else if (m_opt.block_rows < 0 || m_opt.block_bytes_per_thread < 1) {
    err = "vpce: Options::block_rows must be >= 0 and block_bytes_per_thread >= 1";
  }
  // Rows per block: a thread's share of a block should fit in its cache. The fused strategy makes one
  // collective per block, so every rank must use the same value: the smallest wins.
  std::int64_t rows = m_opt.block_rows;
  if (rows == 0) {
    const std::int64_t row_bytes = std::max<std::int64_t>(1, m_part.local_size()) * std::int64_t(sizeof(Scalar));
    const std::int64_t per_thread = std::max<std::int64_t>(1, m_opt.block_bytes_per_thread / row_bytes);
    rows = impl::is_host_space_v<ExecSpace> ? per_thread * std::max(1, int(m_exec.concurrency())) : (1 << 30);
    if (m_part.local_size() == 0) rows = std::int64_t(1) << 40;  // no data here: let the others decide
  }
  std::uint64_t part_sum = 0;
  for (auto s : m_part.sizes()) part_sum = part_sum * 1000003u + static_cast<std::uint64_t>(s);
  m_comm.agree_or_throw(err, {{"the vocabulary size", m_part.vocab_size()},
                              {"the partition (a checksum of its sizes)", static_cast<std::int64_t>(part_sum >> 1)},
                              {"the logits' scalar size in bytes", std::int64_t(sizeof(Scalar))},
                              {"Options::strategy", static_cast<std::int64_t>(m_opt.strategy)},
                              {"Options::mode", static_cast<std::int64_t>(m_opt.mode)},
                              {"Options::non_finite", static_cast<std::int64_t>(m_opt.non_finite)}});
  VPCE_MPI_CHECK(MPI_Allreduce(&rows, &m_block_rows, 1, MPI_INT64_T, MPI_MIN, m_comm.comm()));
  m_reduction = std::make_unique<impl::StatsReduction<Scalar>>();
}

template <class Scalar, class ExecSpace>
CrossEntropy<Scalar, ExecSpace>::~CrossEntropy() = default;

template <class Scalar, class ExecSpace>
bool CrossEntropy<Scalar, ExecSpace>::use_teams() const noexcept {
  return !impl::is_host_space_v<ExecSpace> || m_opt.force_team_kernels;
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::forward(const logits_view& logits, const targets_view& targets,
                                              const loss_view& loss) {
  const bool stash = m_opt.mode == Mode::stash_softmax;
  run(logits, targets, loss, stash ? Out::stash : Out::loss, grad_view(), grad_loss_view(), Scalar(1));
  m_saved_logits = stash ? logits_view() : logits;
  m_saved_targets = targets;
  m_have_forward = true;
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const targets_view& targets,
                                                    const loss_view& loss, const grad_view& grad_logits,
                                                    Scalar grad_scale) {
  m_have_forward = false;
  run(logits, targets, loss, Out::grad, grad_logits, grad_loss_view(), grad_scale);
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const targets_view& targets,
                                                    const loss_view& loss, const grad_view& grad_logits,
                                                    const grad_loss_view& grad_loss) {
  m_have_forward = false;
  run(logits, targets, loss, Out::grad, grad_logits, grad_loss, Scalar(1));
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::backward(const grad_loss_view& grad_loss, const grad_view& grad_logits) {
  backward_impl(grad_loss, Scalar(1), grad_logits);
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::backward(Scalar grad_scale, const grad_view& grad_logits) {
  backward_impl(grad_loss_view(), grad_scale, grad_logits);
}

template <class Scalar, class ExecSpace>
std::string CrossEntropy<Scalar, ExecSpace>::check_targets(const targets_view& targets,
                                                           std::int64_t* checksum) const {
  const std::int64_t n = targets.extent(0);
  const std::int64_t v = m_part.vocab_size();
  using policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  std::int64_t first_bad = n;
  Kokkos::parallel_reduce(
      "vpce::check_targets", policy(m_exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & lo) {
        const std::int64_t t = targets(i);
        if ((t < 0 || t >= v) && i < lo) lo = i;
      },
      Kokkos::Min<std::int64_t>(first_bad));
  // Order-independent checksum of (row, target) pairs: ranks given different targets are caught.
  std::uint64_t sum = 0;
  Kokkos::parallel_reduce(
      "vpce::checksum_targets", policy(m_exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i, std::uint64_t & s) {
        std::uint64_t h = static_cast<std::uint64_t>(targets(i)) * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i);
        h ^= h >> 31;
        s += h * 0xBF58476D1CE4E5B9ull;
      },
      sum);
  *checksum = static_cast<std::int64_t>(sum >> 1);
  if (first_bad >= n) return {};  // the Min reducer starts from the largest int64
  std::int64_t bad = 0;
  Kokkos::deep_copy(bad, Kokkos::subview(targets, first_bad));
  return "vpce: target " + std::to_string(bad) + " of row " + std::to_string(first_bad) + " is outside [0, " +
         std::to_string(v) + ")";
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::ensure_capacity(std::int64_t n, bool stash) {
  if (std::int64_t(m_records.extent(0)) < n) {
    m_records = records_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::records"), n);
    m_records_host = Kokkos::create_mirror_view(m_records);
    m_lse = Kokkos::View<Scalar*, memory_space>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::lse"), n);
    m_local_max = Kokkos::View<Scalar*, memory_space>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::m"), n);
  }
  if (m_opt.strategy == Strategy::seed && std::int64_t(m_seed.extent(0)) < n) {
    m_seed = seed_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::seed_stats"), n, 3);
    m_seed_host = Kokkos::create_mirror_view(m_seed);
  }
  if (stash && (std::int64_t(m_stash.extent(0)) < n || std::int64_t(m_stash.extent(1)) != m_part.local_size())) {
    m_stash = decltype(m_stash)();
    m_stash = decltype(m_stash)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::softmax_stash"), n,
                                m_part.local_size());
  }
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::check_rows(std::int64_t row0, std::int64_t row1) const {
  if (m_opt.non_finite != NonFinite::error) return;
  // The records are the all-reduced ones, identical on every rank: every rank throws alike.
  for (std::int64_t i = row0; i < row1; ++i) {
    const auto& r = m_records_host(i);
    VPCE_THROW_IF(std::isnan(r.s), "row " + std::to_string(i) + " of the logits holds NaN or +inf");
    VPCE_THROW_IF(r.m == -std::numeric_limits<Scalar>::infinity(),
                  "every logit of row " + std::to_string(i) + " is -inf: the loss is undefined");
  }
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::run(const logits_view& logits, const targets_view& targets,
                                          const loss_view& loss, Out out, const grad_view& grad,
                                          const grad_loss_view& grad_loss, Scalar grad_scale) {
  impl::ScopedRegion region("vpce::cross_entropy");
  const std::int64_t n_rows = targets.extent(0);
  const std::int64_t v_local = m_part.local_size();
  // Local checks; then one small collective agrees on them, on N and on the targets.
  std::string err;
  if (std::int64_t(logits.extent(1)) != v_local) {
    err = "vpce: the logits have " + std::to_string(logits.extent(1)) + " columns, the partition gives this rank " +
          std::to_string(v_local);
  } else if (std::int64_t(logits.extent(0)) != n_rows) {
    err = "vpce: the logits have " + std::to_string(logits.extent(0)) + " rows but there are " +
          std::to_string(n_rows) + " targets";
  } else if (std::int64_t(loss.extent(0)) != n_rows) {
    err = "vpce: the loss has " + std::to_string(loss.extent(0)) + " entries, expected " + std::to_string(n_rows);
  } else if (out == Out::grad && (std::int64_t(grad.extent(0)) != n_rows || std::int64_t(grad.extent(1)) != v_local)) {
    err = "vpce: the gradient is " + impl::shape(grad.extent(0), grad.extent(1)) + ", expected " +
          impl::shape(n_rows, v_local);
  } else if (out == Out::grad && grad_loss.data() != nullptr && std::int64_t(grad_loss.extent(0)) != n_rows) {
    err = "vpce: grad_loss has " + std::to_string(grad_loss.extent(0)) + " entries, expected " +
          std::to_string(n_rows);
  }
  std::int64_t checksum = 0;
  if (err.empty()) err = check_targets(targets, &checksum);
  m_comm.agree_or_throw(err, {{"the number of tokens N", n_rows}, {"the targets (a checksum)", checksum}});

  ensure_capacity(n_rows, out == Out::stash);
  impl::KernelArgs<Scalar, memory_space> args{logits.data(), std::int64_t(logits.stride(0)), v_local, m_part.begin(),
                                               targets};
  impl::GradScale<Scalar, memory_space> g{grad_loss, grad_scale};
  Scalar* y = out == Out::grad ? grad.data() : (out == Out::stash ? m_stash.data() : nullptr);
  const std::int64_t ld_y = out == Out::grad ? std::int64_t(grad.stride(0)) : std::int64_t(m_stash.stride(0));
  const bool teams = use_teams();
  const MPI_Comm comm = m_comm.comm();

  // The seed strategy recomputes exp from the logits; the fused one rescales what LocalStats stored.
  const bool from_exp = m_opt.strategy == Strategy::fused;
  auto finalize = [&](std::int64_t r0, std::int64_t r1) {
    impl::ScopedRegion r("vpce::loss_grad");
    auto launch = [&](auto what, auto stored) {
      impl::Finalize<Scalar, memory_space, decltype(what)::value, decltype(stored)::value> f{
          args, m_records, loss, m_lse, y, ld_y, g, m_local_max};
      impl::for_rows("vpce::finalize", m_exec, r0, r1, f, teams);
    };
    using W = impl::Write;
    auto run_what = [&](auto stored) {
      if (out == Out::grad) launch(std::integral_constant<W, W::grad>(), stored);
      else if (out == Out::stash) launch(std::integral_constant<W, W::stash>(), stored);
      else launch(std::integral_constant<W, W::loss>(), stored);
    };
    if (from_exp) run_what(std::true_type());
    else run_what(std::false_type());
  };

  if (m_opt.strategy == Strategy::seed) {
    // The seed's communication: MAX of the row max, then SUM of exp against it, then SUM of the target logit.
    {
      impl::ScopedRegion r("vpce::stats");
      impl::for_rows("vpce::seed_max", m_exec, 0, n_rows, impl::LocalMax<Scalar, memory_space>{args, m_seed}, teams);
    }
    auto stage = [&](int col, MPI_Op op) {
      impl::ScopedRegion r("vpce::collective");
      auto dev = Kokkos::subview(m_seed, std::make_pair(std::int64_t(0), n_rows), col);
      auto host = Kokkos::subview(m_seed_host, std::make_pair(std::int64_t(0), n_rows), col);
      Kokkos::deep_copy(m_exec, host, dev);
      impl::fence(m_exec, "vpce::before_allreduce");
      impl::allreduce_builtin(host.data(), n_rows, op, comm);
      Kokkos::deep_copy(m_exec, dev, host);
    };
    stage(0, MPI_MAX);
    {
      impl::ScopedRegion r("vpce::stats");
      impl::for_rows("vpce::seed_sum_gather", m_exec, 0, n_rows, impl::LocalSumGather<Scalar, memory_space>{args, m_seed},
                     teams);
    }
    Kokkos::deep_copy(m_exec, m_seed_host, m_seed);
    impl::fence(m_exec, "vpce::before_allreduce");
    {
      impl::ScopedRegion r("vpce::collective");
      impl::allreduce_builtin(&m_seed_host(0, 1), n_rows, MPI_SUM, comm);
      impl::allreduce_builtin(&m_seed_host(0, 2), n_rows, MPI_SUM, comm);
    }
    for (std::int64_t i = 0; i < n_rows; ++i) m_records_host(i) = {m_seed_host(i, 0), m_seed_host(i, 1), m_seed_host(i, 2)};
    check_rows(0, n_rows);
    Kokkos::deep_copy(m_exec, m_records, m_records_host);
    finalize(0, n_rows);
  } else {
    // Fused: per block, local (max, sumexp, target) records, ONE all-reduce of them, then loss/gradient.
    for (std::int64_t r0 = 0; r0 < n_rows; r0 += m_block_rows) {
      const std::int64_t r1 = std::min(n_rows, r0 + m_block_rows);
      {
        impl::ScopedRegion r("vpce::stats");
        impl::LocalStats<Scalar, memory_space> f{args, m_records, y, ld_y, m_local_max};
        impl::for_rows("vpce::local_stats", m_exec, r0, r1, f, teams);
      }
      {
        impl::ScopedRegion r("vpce::collective");
        const auto range = std::make_pair(r0, r1);
        Kokkos::deep_copy(m_exec, Kokkos::subview(m_records_host, range), Kokkos::subview(m_records, range));
        impl::fence(m_exec, "vpce::before_allreduce");
        m_reduction->allreduce(m_records_host.data() + r0, r1 - r0, comm);
        Kokkos::deep_copy(m_exec, Kokkos::subview(m_records, range), Kokkos::subview(m_records_host, range));
      }
      check_rows(r0, r1);
      finalize(r0, r1);
    }
  }
  impl::fence(m_exec, "vpce::cross_entropy");
  m_lse_out = Kokkos::subview(m_lse, std::make_pair(std::int64_t(0), n_rows));
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::backward_impl(const grad_loss_view& grad_loss, Scalar grad_scale,
                                                    const grad_view& grad) {
  // No communication here, so the checks are local.
  VPCE_THROW_IF(!m_have_forward, "backward() needs a forward() first (loss_and_grad() keeps nothing)");
  const std::int64_t n_rows = m_saved_targets.extent(0);
  const std::int64_t v_local = m_part.local_size();
  VPCE_THROW_IF(std::int64_t(grad.extent(0)) != n_rows || std::int64_t(grad.extent(1)) != v_local,
                "the gradient is " + impl::shape(grad.extent(0), grad.extent(1)) + ", expected " +
                    impl::shape(n_rows, v_local));
  VPCE_THROW_IF(grad_loss.data() != nullptr && std::int64_t(grad_loss.extent(0)) != n_rows,
                "grad_loss has " + std::to_string(grad_loss.extent(0)) + " entries, expected " +
                    std::to_string(n_rows));
  impl::ScopedRegion region("vpce::backward");
  impl::GradScale<Scalar, memory_space> g{grad_loss, grad_scale};
  const bool stash = m_opt.mode == Mode::stash_softmax;
  const Scalar* src = stash ? m_stash.data() : m_saved_logits.data();
  const std::int64_t ld = stash ? std::int64_t(m_stash.stride(0)) : std::int64_t(m_saved_logits.stride(0));
  impl::KernelArgs<Scalar, memory_space> args{src, ld, v_local, m_part.begin(), m_saved_targets};
  if (stash) {
    impl::Backward<Scalar, memory_space, true> f{args, m_lse_out, grad.data(), std::int64_t(grad.stride(0)), g};
    impl::for_rows("vpce::backward_stash", m_exec, 0, n_rows, f, use_teams());
  } else {
    impl::Backward<Scalar, memory_space, false> f{args, m_lse_out, grad.data(), std::int64_t(grad.stride(0)), g};
    impl::for_rows("vpce::backward_recompute", m_exec, 0, n_rows, f, use_teams());
  }
  impl::fence(m_exec, "vpce::backward");
}

}  // namespace vpce
