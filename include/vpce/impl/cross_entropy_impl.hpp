#pragma once
/// \file cross_entropy_impl.hpp
/// \brief Definitions of vpce::CrossEntropy (included by cross_entropy.hpp).
///
/// Data flow of a collective call: input Views -> row statistics kernel -> one all-reduce -> loss /
/// gradient kernel -> output Views; in the fused strategy this runs block by block of rows so that a
/// block's logits are still in cache when its gradient is written.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "vpce/cross_entropy.hpp"
#include "vpce/impl/collective.hpp"
#include "vpce/impl/compat.hpp"
#include "vpce/impl/kernels.hpp"

namespace vpce {

namespace impl {
inline std::string shape(std::int64_t a, std::int64_t b) { return std::to_string(a) + " x " + std::to_string(b); }
inline std::int64_t bits_of(double d) {
  std::int64_t b;
  std::memcpy(&b, &d, sizeof(b));
  return b;
}
/// Local checks of the options; empty when they are fine.
inline std::string check_options(const Options& o) {
  auto bad = [](const char* what, double v, const char* want) {
    return std::string("Options::") + what + " is " + std::to_string(v) + ", expected " + want;
  };
  if (o.block_rows < 0 || o.block_bytes_per_thread < 1)
    return "Options::block_rows must be >= 0 and block_bytes_per_thread >= 1";
  if (!(o.label_smoothing >= 0 && o.label_smoothing <= 1)) return bad("label_smoothing", o.label_smoothing, "[0, 1]");
  if (!(o.z_loss >= 0 && std::isfinite(o.z_loss))) return bad("z_loss", o.z_loss, "a finite value >= 0");
  if (!(o.logit_scale > 0 && std::isfinite(o.logit_scale)))
    return bad("logit_scale", o.logit_scale, "a finite value > 0");
  if (!(o.softcap >= 0 && std::isfinite(o.softcap))) return bad("softcap", o.softcap, "a finite value >= 0 (0: off)");
  return {};
}
/// The first block of the fused strategy: at most this many rows (its all-reduce is padded to them), and
/// its rows at most this many bytes of exps (head rows x V_local, in the host's scratch).
inline constexpr std::int64_t max_head_rows = 1024;
inline constexpr std::int64_t max_head_scratch_bytes = std::int64_t(64) << 20;
/// The host's scratch of exps for n rows in the fused strategy: two slots, the head block (h0 rows) and
/// the even blocks in slot 0, the odd ones in slot 1; where slot 1 starts and the rows of both.
struct ScratchSlots {
  std::int64_t slot1 = 0, rows = 0;
};
inline ScratchSlots scratch_slots(std::int64_t n, std::int64_t head_rows, std::int64_t block_rows) {
  const std::int64_t h0 = std::min(n, head_rows);
  if (n <= h0) return {0, n};
  const std::int64_t slot1 = n - h0 > block_rows ? block_rows : h0;  // block 2 (slot 0) exists or not
  return {slot1, slot1 + std::min(n - h0, block_rows)};
}
}  // namespace impl

template <class Scalar, class ExecSpace>
CrossEntropy<Scalar, ExecSpace>::CrossEntropy(const Communicator& comm, const VocabPartition& partition,
                                              const Options& options, const ExecSpace& exec)
    : m_comm(comm), m_part(partition), m_opt(options), m_exec(exec) {
  std::string err = impl::check_options(m_opt);
  if (m_part.num_ranks() != m_comm.size()) {
    err = "the partition is for " + std::to_string(m_part.num_ranks()) + " ranks, the communicator has " +
          std::to_string(m_comm.size());
  } else if (m_part.rank() != m_comm.rank()) {
    err = "the partition was made for rank " + std::to_string(m_part.rank()) + " but this is rank " +
          std::to_string(m_comm.rank());
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
                              {"Options::non_finite", static_cast<std::int64_t>(m_opt.non_finite)},
                              {"Options::ignore_index", m_opt.ignore_index},
                              {"Options::reduction", static_cast<std::int64_t>(m_opt.reduction)},
                              {"Options::label_smoothing (bits)", impl::bits_of(m_opt.label_smoothing)},
                              {"Options::z_loss (bits)", impl::bits_of(m_opt.z_loss)},
                              {"Options::logit_scale (bits)", impl::bits_of(m_opt.logit_scale)},
                              {"Options::softcap (bits)", impl::bits_of(m_opt.softcap)}});
  // The head (first block) is at most max_head_rows, and its scratch at most max_head_scratch_bytes.
  const std::int64_t scratch_row_bytes = std::max<std::int64_t>(1, m_part.local_size()) * std::int64_t(sizeof(T));
  const std::int64_t head =
      std::min(impl::max_head_rows, std::max<std::int64_t>(1, impl::max_head_scratch_bytes / scratch_row_bytes));
  const std::int64_t mine[2] = {rows, head};
  std::int64_t agreed[2] = {0, 0};
  VPCE_MPI_CHECK(MPI_Allreduce(mine, agreed, 2, MPI_INT64_T, MPI_MIN, m_comm.comm()));
  m_block_rows = agreed[0];
  m_head_rows = std::min(agreed[0], agreed[1]);
  m_reduction = std::make_unique<impl::StatsReduction<T>>();
  if (m_opt.strategy == Strategy::seed) {
    m_seed_head = Kokkos::View<T*, memory_space>("vpce::seed_head", impl::seed_head_rows + impl::status_size);
    m_seed_head_host = Kokkos::create_mirror_view(staging(), m_seed_head);
  }
}

template <class Scalar, class ExecSpace>
CrossEntropy<Scalar, ExecSpace>::~CrossEntropy() = default;

template <class Scalar, class ExecSpace>
bool CrossEntropy<Scalar, ExecSpace>::use_teams() const noexcept {
  return !impl::is_host_space_v<ExecSpace> || m_opt.force_team_kernels;
}

template <class Scalar, class ExecSpace>
template <class G>
bool CrossEntropy<Scalar, ExecSpace>::streaming() const noexcept {
  // Host rows of at least a KiB: each piece copied out ends with a store fence, which shorter rows would not
  // pay for.
  return impl::have_streaming_stores && !use_teams() && m_part.local_size() * std::int64_t(sizeof(G)) >= 1024;
}

template <class Scalar, class ExecSpace>
impl::Params<typename CrossEntropy<Scalar, ExecSpace>::T> CrossEntropy<Scalar, ExecSpace>::params() const {
  impl::Params<T> p;
  p.scale = T(m_opt.logit_scale);
  p.cap = T(m_opt.softcap);
  p.inv_cap = m_opt.softcap > 0 ? T(1.0 / m_opt.softcap) : T(0);
  p.alpha = T(m_opt.label_smoothing);
  p.zeta = T(m_opt.z_loss);
  p.inv_vocab = T(1.0 / double(m_part.vocab_size()));
  p.ignore_index = m_opt.ignore_index;
  return p;
}

// --- public entry points ---------------------------------------------------------------------------------

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::forward(const logits_view& logits, const targets_view& targets,
                                              const loss_view& loss) {
  const bool stash = m_opt.mode == Mode::stash_softmax;
  m_have_forward = false;
  run<T>(logits, targets, loss, stash ? Out::stash : Out::loss, nullptr, 0, 0, 0, nullptr, T(1));
  m_saved_logits = stash ? logits_view() : logits;
  m_saved_targets = targets;
  m_have_forward = true;
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const targets_view& targets,
                                                    const loss_view& loss, const grad_view& grad, T grad_scale) {
  m_have_forward = false;
  run(logits, targets, loss, Out::grad, grad.data(), grad.extent(0), grad.extent(1), grad.stride(0), nullptr,
      grad_scale);
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const targets_view& targets,
                                                    const loss_view& loss, const grad_storage_view& grad,
                                                    T grad_scale) {
  m_have_forward = false;
  if constexpr (is_16bit_v<Scalar>)
    run(logits, targets, loss, Out::grad, grad.data(), grad.extent(0), grad.extent(1), grad.stride(0), nullptr,
        grad_scale);
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const targets_view& targets,
                                                    const loss_view& loss, const grad_view& grad,
                                                    const grad_loss_view& grad_loss) {
  m_have_forward = false;
  run(logits, targets, loss, Out::grad, grad.data(), grad.extent(0), grad.extent(1), grad.stride(0), &grad_loss, T(1));
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const targets_view& targets,
                                                    const loss_view& loss, const grad_storage_view& grad,
                                                    const grad_loss_view& grad_loss) {
  m_have_forward = false;
  if constexpr (is_16bit_v<Scalar>)
    run(logits, targets, loss, Out::grad, grad.data(), grad.extent(0), grad.extent(1), grad.stride(0), &grad_loss,
        T(1));
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::backward(const grad_loss_view& grad_loss, const grad_view& grad) {
  backward_impl(&grad_loss, T(1), grad.data(), grad.extent(0), grad.extent(1), grad.stride(0));
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::backward(const grad_loss_view& grad_loss, const grad_storage_view& grad) {
  if constexpr (is_16bit_v<Scalar>)
    backward_impl(&grad_loss, T(1), grad.data(), grad.extent(0), grad.extent(1), grad.stride(0));
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::backward(T grad_scale, const grad_view& grad) {
  backward_impl(nullptr, grad_scale, grad.data(), grad.extent(0), grad.extent(1), grad.stride(0));
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::backward(T grad_scale, const grad_storage_view& grad) {
  if constexpr (is_16bit_v<Scalar>)
    backward_impl(nullptr, grad_scale, grad.data(), grad.extent(0), grad.extent(1), grad.stride(0));
}

// --- internals -------------------------------------------------------------------------------------------

template <class Scalar, class ExecSpace>
std::string CrossEntropy<Scalar, ExecSpace>::check_targets(const targets_view& targets, std::int64_t* checksum) {
  const std::int64_t v = m_part.vocab_size();
  const auto c = impl::check_targets(m_exec, targets, v, m_opt.ignore_index);
  m_n_valid = c.n_valid;
  *checksum = c.checksum;
  if (c.first_bad == std::int64_t(targets.extent(0))) return {};
  std::int64_t bad = 0;
  Kokkos::deep_copy(bad, Kokkos::subview(targets, c.first_bad));
  return "target " + std::to_string(bad) + " of row " + std::to_string(c.first_bad) + " is outside [0, " +
         std::to_string(v) + ") and is not ignore_index (" + std::to_string(m_opt.ignore_index) + ")";
}

template <class Scalar, class ExecSpace>
impl::GradScale<typename CrossEntropy<Scalar, ExecSpace>::T, typename ExecSpace::memory_space>
CrossEntropy<Scalar, ExecSpace>::grad_scale_for(const grad_loss_view* grad_loss, T grad_scale, std::string* err) const {
  if (grad_loss != nullptr && m_opt.reduction != Reduction::none && err->empty())
    *err = std::string("a per-row grad_loss needs Options::reduction none, not ") + to_string(m_opt.reduction);
  T value = grad_scale;
  if (m_opt.reduction == Reduction::mean) value = m_n_valid > 0 ? grad_scale / T(m_n_valid) : T(0);
  return {grad_loss != nullptr ? *grad_loss : grad_loss_view(), value};
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::ensure_capacity(std::int64_t n, bool stash, std::int64_t scratch_rows) {
  auto alloc = [](const char* label) { return Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)); };
  // The records also hold the first all-reduce: head rows (padded) and the status records behind them.
  const std::int64_t n_records = std::max(n, m_head_rows + impl::status_records);
  if (std::int64_t(m_records.extent(0)) < n_records) {
    m_records = records_view(alloc("vpce::records"), n_records);
    m_records_host = Kokkos::create_mirror_view(staging(), m_records);
    m_lse = Kokkos::View<T*, memory_space>(alloc("vpce::lse"), n_records);
    m_chunk_max = decltype(m_chunk_max)(alloc("vpce::chunk_max"), n_records,
                                        std::max<std::int64_t>(1, impl::num_chunks(m_part.local_size())));
  }
  if (std::int64_t(m_exp_scratch.extent(0)) < scratch_rows ||
      (scratch_rows > 0 && std::int64_t(m_exp_scratch.extent(1)) != m_part.local_size())) {
    m_exp_scratch = decltype(m_exp_scratch)();
    m_exp_scratch = decltype(m_exp_scratch)(alloc("vpce::exp_scratch"), scratch_rows, m_part.local_size());
  }
  if (m_opt.strategy == Strategy::seed && std::int64_t(m_seed.extent(0)) < n) {
    m_seed = seed_view(alloc("vpce::seed_stats"), n, 4);
    m_seed_host = Kokkos::create_mirror_view(staging(), m_seed);
  }
  if (stash && (std::int64_t(m_stash.extent(0)) < n || std::int64_t(m_stash.extent(1)) != m_part.local_size())) {
    m_stash = decltype(m_stash)();
    m_stash = decltype(m_stash)(alloc("vpce::softmax_stash"), n, m_part.local_size());
    m_stash_target = Kokkos::View<T*, memory_space>(alloc("vpce::stash_target"), n);
  }
}

template <class Scalar, class ExecSpace>
std::string CrossEntropy<Scalar, ExecSpace>::check_rows(std::int64_t row0, std::int64_t row1) const {
  if (m_opt.non_finite != NonFinite::error) return {};
  // The records are the all-reduced ones, identical on every rank: every rank fails alike.
  for (std::int64_t i = row0; i < row1; ++i) {
    const auto& r = m_records_host(i);
    if (std::isnan(r.s)) return "row " + std::to_string(i) + " of the logits holds NaN or +inf";
    if (r.m == impl::neg_inf<T>())
      return "every logit of row " + std::to_string(i) + " is -inf: the loss is undefined";
  }
  return {};
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::throw_agreed(const std::string& err, const impl::CallStatus& status) const {
  m_comm.agree_or_throw(err,
                        {{"the number of tokens N", status.n_rows}, {"the targets (a checksum)", status.checksum}});
  // Not reached: the status said that some rank found an error or that N or the checksum differ.
  throw Error("internal error: the call status and the agreement on the inputs differ");
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::reduce_loss(const loss_view& loss) {
  const double total = impl::ordered_sum(m_exec, loss);
  m_reduced_loss = m_opt.reduction == Reduction::mean ? (m_n_valid > 0 ? total / double(m_n_valid) : 0.0) : total;
}

template <class Scalar, class ExecSpace>
template <class G>
void CrossEntropy<Scalar, ExecSpace>::run(const logits_view& logits, const targets_view& targets, const loss_view& loss,
                                          Out out, G* grad, std::int64_t grad_rows, std::int64_t grad_cols,
                                          std::int64_t ld_grad, const grad_loss_view* grad_loss, T grad_scale) {
  impl::ScopedRegion region("vpce::cross_entropy");
  m_lse_out = {};
  m_reduced_loss = std::numeric_limits<double>::quiet_NaN();
  const std::int64_t n_rows = targets.extent(0);
  const std::int64_t v_local = m_part.local_size();
  // Local checks. Their outcome (and N, and a checksum of the targets) rides in the first collective of
  // compute(): a rank whose inputs are bad still takes part in it, but runs no kernel on them.
  std::string err;
  if (std::int64_t(logits.extent(1)) != v_local) {
    err = "the logits have " + std::to_string(logits.extent(1)) + " columns, the partition gives this rank " +
          std::to_string(v_local);
  } else if (std::int64_t(logits.extent(0)) != n_rows) {
    err = "the logits have " + std::to_string(logits.extent(0)) + " rows but there are " +
          std::to_string(n_rows) + " targets";
  } else if (std::int64_t(loss.extent(0)) != n_rows) {
    err = "the loss has " + std::to_string(loss.extent(0)) + " entries, expected " + std::to_string(n_rows);
  } else if (out == Out::grad && (grad_rows != n_rows || grad_cols != v_local)) {
    err = "the gradient is " + impl::shape(grad_rows, grad_cols) + ", expected " + impl::shape(n_rows, v_local);
  } else if (out == Out::grad && grad_loss != nullptr && std::int64_t(grad_loss->extent(0)) != n_rows) {
    err =
        "grad_loss has " + std::to_string(grad_loss->extent(0)) + " entries, expected " + std::to_string(n_rows);
  }
  std::int64_t checksum = 0;
  if (err.empty()) err = check_targets(targets, &checksum);
  const auto g = grad_scale_for(grad_loss, grad_scale, &err);
  const impl::CallStatus status{!err.empty(), n_rows, checksum};

  // The fused strategy keeps the host's exp(x - m) in a scratch of two blocks (see compute()).
  const bool scratch = err.empty() && out != Out::loss && m_opt.softcap <= 0 && m_opt.strategy == Strategy::fused;
  const std::int64_t scratch_rows =
      scratch && !use_teams() ? impl::scratch_slots(n_rows, m_head_rows, m_block_rows).rows : 0;
  ensure_capacity(n_rows, out == Out::stash && err.empty(), scratch_rows);
  G* y = out == Out::grad ? grad : nullptr;
  std::int64_t ld_y = ld_grad;
  if constexpr (std::is_same_v<G, T>) {
    if (out == Out::stash) {
      y = m_stash.data();
      ld_y = m_stash.stride(0);
    }
  }
  if (m_opt.softcap > 0) {
    compute<G, true>(logits, targets, loss, out, y, ld_y, g, status, err);
  } else {
    compute<G, false>(logits, targets, loss, out, y, ld_y, g, status, err);
  }
  m_lse_out = Kokkos::subview(m_lse, std::make_pair(std::int64_t(0), n_rows));
  reduce_loss(loss);
  impl::fence(m_exec, "vpce::cross_entropy");
}

template <class Scalar, class ExecSpace>
template <class G, bool Capped>
void CrossEntropy<Scalar, ExecSpace>::compute(const logits_view& logits, const targets_view& targets,
                                              const loss_view& loss, Out out, G* y, std::int64_t ld_y,
                                              const impl::GradScale<T, memory_space>& g, const impl::CallStatus& status,
                                              const std::string& err) {
  const std::int64_t n_rows = targets.extent(0);
  const bool ok = !status.error;  // this rank's inputs passed the local checks: its kernels may run
  impl::KernelArgs<Scalar, T, memory_space> args{
      logits.data(), std::int64_t(logits.stride(0)), m_part.local_size(), m_part.begin(), targets, params()};
  const bool teams = use_teams();
  const MPI_Comm comm = m_comm.comm();
  // The fused strategy on the host: the statistics store exp(x - m) in a scratch of two blocks (block k in
  // slot k % 2: two blocks are live while the pipeline runs), which stays in cache, and Finalize rescales
  // them into the gradient or the stash: one exp per element, one read of the logits, and the caller's rows
  // only written, once, with streaming stores (never read first; stream.hpp), also for a 16-bit gradient
  // and in place. Nothing the caller sees is written before the call status is known. Not for forward-only
  // calls, with the softcap (the chain rule needs x again), in the seed strategy. A device stores no exps:
  // its statistics read each row once (a running max and sum per thread, merged across the team) and
  // Finalize recomputes the exps from the logits: 2 reads + 1 write of N x V_local in all.
  struct Exps {
    T* e = nullptr;  // row i at e + (i - row0) * ld
    std::int64_t ld = 0, row0 = 0;
  };
  const bool fused_store = !Capped && !teams && m_opt.strategy == Strategy::fused && out != Out::loss;
  auto exps = [&](std::int64_t block, std::int64_t r0) {
    Exps x;
    if (!fused_store || m_exp_scratch.span() == 0) return x;  // no rows or no columns: nothing to keep
    const std::int64_t slot_row = block % 2 * impl::scratch_slots(n_rows, m_head_rows, m_block_rows).slot1;
    x.e = m_exp_scratch.data() + slot_row * std::int64_t(m_exp_scratch.stride(0));
    x.ld = m_exp_scratch.stride(0);
    x.row0 = r0;
    return x;
  };
  const bool stream = streaming<G>();

  // Loss/lse and the gradient or stash of rows [r0, r1), from the stored exps where there are some.
  auto finalize = [&](std::int64_t r0, std::int64_t r1, const Exps& ex) {
    impl::ScopedRegion r("vpce::loss_grad");
    auto launch = [&](auto what, auto from) {
      impl::Finalize<Scalar, T, G, memory_space, decltype(what)::value, decltype(from)::value, Capped> f{
          args, m_records, loss, m_lse, y, ld_y, g, m_chunk_max, m_stash_target, true, ex.e, ex.ld, ex.row0, stream};
      impl::for_rows("vpce::finalize", m_exec, r0, r1, f, teams);
    };
    using W = impl::Write;
    using S = impl::Source;
    auto with_source = [&](auto from) {
      if (out == Out::grad)
        launch(std::integral_constant<W, W::grad>(), from);
      else if (out == Out::stash)
        launch(std::integral_constant<W, W::stash>(), from);
      else
        launch(std::integral_constant<W, W::loss>(), from);
    };
    if constexpr (!Capped) {
      if (ex.e != nullptr) {
        with_source(std::integral_constant<S, S::stored_exp>());
        return;
      }
    }
    with_source(std::integral_constant<S, S::logits>());
  };
  // A NaN/+inf or all -inf row found after outputs were written (the loss, and gradient rows [0, written_rows)):
  // they become NaN, then every rank throws.
  auto fail_non_finite = [&](const std::string& msg, std::int64_t written_rows) {
    if (written_rows > 0) {
      Kokkos::deep_copy(m_exec, loss, std::numeric_limits<T>::quiet_NaN());
      if (out == Out::grad)
        impl::fill_rows("vpce::poison_grad", m_exec, y, ld_y, written_rows, m_part.local_size(),
                        G(std::numeric_limits<T>::quiet_NaN()));
      impl::fence(m_exec, "vpce::poison");
    }
    throw Error(msg);
  };

  if (m_opt.strategy == Strategy::seed) {
    // The seed's communication: MAX of the row max, then SUM of exp against it, then SUM of the target
    // logit (and, with label smoothing only, a SUM of the logit sums). The first MAX also carries the call
    // status, in a buffer of a fixed size (impl::seed_head_rows + status): see collective.hpp.
    constexpr std::int64_t head = impl::seed_head_rows;
    if (ok) {
      impl::ScopedRegion r("vpce::stats");
      impl::for_rows("vpce::seed_max", m_exec, 0, n_rows, impl::LocalMax<Scalar, T, memory_space, Capped>{args, m_seed},
                     teams);
    }
    auto rows = [](auto& v, std::int64_t a, std::int64_t b) { return Kokkos::subview(v, std::make_pair(a, b)); };
    auto column = [&](auto& v, int col, std::int64_t r0) {
      return Kokkos::subview(v, std::make_pair(r0, n_rows), col);
    };
    // Built-in ops work on device buffers with a GPU-aware MPI; otherwise the column is staged on the host.
    auto reduce_column = [&](int col, MPI_Op op, std::int64_t r0) {
      if (r0 >= n_rows) return;
      impl::ScopedRegion r("vpce::collective");
#if defined(VPCE_ENABLE_GPU_AWARE_MPI)
      impl::fence(m_exec, "vpce::before_allreduce");
      impl::allreduce_builtin(column(m_seed, col, r0).data(), n_rows - r0, op, comm);
#else
      Kokkos::deep_copy(m_exec, column(m_seed_host, col, r0), column(m_seed, col, r0));
      impl::fence(m_exec, "vpce::before_allreduce");
      impl::allreduce_builtin(column(m_seed_host, col, r0).data(), n_rows - r0, op, comm);
      Kokkos::deep_copy(m_exec, column(m_seed, col, r0), column(m_seed_host, col, r0));
#endif
    };
    bool disagree = false;
    {
      impl::ScopedRegion r("vpce::collective");
#if defined(VPCE_ENABLE_GPU_AWARE_MPI)
      auto& buf = m_seed_head;
#else
      auto& buf = m_seed_head_host;
#endif
      const std::int64_t h0 = ok ? std::min(n_rows, head) : 0;
      if (h0 > 0)
        Kokkos::deep_copy(m_exec, rows(buf, 0, h0), Kokkos::subview(m_seed, std::make_pair(std::int64_t(0), h0), 0));
      std::vector<T> tail(head - h0 + impl::status_size, impl::neg_inf<T>());
      impl::encode_status(status, tail.data() + (head - h0));
      Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> tail_view(tail.data(), tail.size());
      Kokkos::deep_copy(m_exec, rows(buf, h0, head + impl::status_size), tail_view);
      impl::fence(m_exec, "vpce::before_allreduce");
      impl::allreduce_builtin(buf.data(), head + impl::status_size, MPI_MAX, comm);
      T merged[impl::status_size];
      Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> merged_view(merged, impl::status_size);
      Kokkos::deep_copy(m_exec, merged_view, rows(buf, head, head + impl::status_size));
      if (h0 > 0)
        Kokkos::deep_copy(m_exec, Kokkos::subview(m_seed, std::make_pair(std::int64_t(0), h0), 0), rows(buf, 0, h0));
      impl::fence(m_exec, "vpce::seed_head");
      disagree = impl::status_needs_agreement(merged);
    }
    if (disagree) throw_agreed(err, status);
    reduce_column(0, MPI_MAX, head);  // rows beyond the head (N > seed_head_rows only)
    {
      impl::ScopedRegion r("vpce::stats");
      impl::for_rows("vpce::seed_sum_gather", m_exec, 0, n_rows,
                     impl::LocalSumGather<Scalar, T, memory_space, Capped>{args, m_seed}, teams);
    }
    for (int col = 1; col < (m_opt.label_smoothing > 0 ? 4 : 3); ++col) reduce_column(col, MPI_SUM, 0);
    Kokkos::deep_copy(m_exec, m_seed_host, m_seed);
    impl::fence(m_exec, "vpce::seed_stats");
    for (std::int64_t i = 0; i < n_rows; ++i)
      m_records_host(i) = {m_seed_host(i, 0), m_seed_host(i, 1), m_seed_host(i, 2), m_seed_host(i, 3)};
    const std::string bad = check_rows(0, n_rows);
    if (!bad.empty()) fail_non_finite(bad, 0);  // nothing written yet
    Kokkos::deep_copy(m_exec, m_records, m_records_host);
    finalize(0, n_rows, Exps{});
  } else {
    // Fused: per block, local (max, sumexp, target, sum) records, ONE all-reduce of them, then loss/gradient.
    // The first block (the head) has min(N, head_rows) rows and its all-reduce always head_rows records plus
    // the status records: the same size on every rank whatever its N. Until the status is known nothing the
    // caller sees is written: the head's exps go to the scratch (see exps above), never to the gradient.
    auto stats = [&](std::int64_t block, std::int64_t r0, std::int64_t r1) {
      impl::ScopedRegion r("vpce::stats");
      impl::LocalStats<Scalar, T, memory_space, Capped> f{args, m_records, nullptr, 0, m_chunk_max};
      const Exps ex = exps(block, r0);
      f.y = ex.e;
      f.ld_y = ex.ld;
      f.y_row0 = ex.row0;
      impl::for_rows("vpce::local_stats", m_exec, r0, r1, f, teams);
    };
    // A block's all-reduce is non-blocking: started after its statistics, completed after the next block's
    // (see the loop below). The region "vpce::collective" covers only the time the ranks spend in MPI.
    std::vector<MPI_Request> pending;
    auto start = [&](std::int64_t r0, std::int64_t r1) {
      impl::ScopedRegion r("vpce::collective");
      const auto range = std::make_pair(r0, r1);
      Kokkos::deep_copy(m_exec, Kokkos::subview(m_records_host, range), Kokkos::subview(m_records, range));
      impl::fence(m_exec, "vpce::before_allreduce");
      m_reduction->start(m_records_host.data() + r0, r1 - r0, comm, &pending);
    };
    auto finish = [&](std::int64_t r0, std::int64_t r1) {
      impl::ScopedRegion r("vpce::collective");
      impl::wait_all(&pending);
      const auto range = std::make_pair(r0, r1);
      Kokkos::deep_copy(m_exec, Kokkos::subview(m_records, range), Kokkos::subview(m_records_host, range));
    };
    const std::int64_t head = m_head_rows;
    const std::int64_t h0 = std::min(n_rows, head);
    if (ok) stats(0, 0, h0);
    bool disagree = false;
    {
      impl::ScopedRegion r("vpce::collective");
      const std::int64_t mine = ok ? h0 : 0;  // rows with this rank's statistics; the rest: the merge's identity
      const auto range = std::make_pair(std::int64_t(0), mine);
      Kokkos::deep_copy(m_exec, Kokkos::subview(m_records_host, range), Kokkos::subview(m_records, range));
      impl::fence(m_exec, "vpce::before_allreduce");
      for (std::int64_t i = mine; i < head; ++i) m_records_host(i) = {impl::neg_inf<T>(), T(0), T(0), T(0)};
      impl::encode_status_records(status, &m_records_host(head));
      m_reduction->allreduce(m_records_host.data(), head + impl::status_records, comm);
      disagree = impl::status_records_need_agreement(&m_records_host(head));
      if (!disagree)
        Kokkos::deep_copy(m_exec, Kokkos::subview(m_records, range), Kokkos::subview(m_records_host, range));
    }
    if (disagree) throw_agreed(err, status);
    std::string bad = check_rows(0, h0);
    if (!bad.empty()) fail_non_finite(bad, 0);  // only the scratch was written
    finalize(0, h0, exps(0, 0));
    // The other blocks, pipelined: block k+1's statistics run while block k's all-reduce is in flight, and
    // block k's loss/gradient while block k+1's is. So two blocks are live in cache at a time (the block
    // size counts for that), and no request is pending when a bad row throws.
    auto block_end = [&](std::int64_t r0) { return std::min(n_rows, r0 + m_block_rows); };
    if (h0 < n_rows) {
      stats(1, h0, block_end(h0));
      start(h0, block_end(h0));
    }
    for (std::int64_t r0 = h0, block = 1; r0 < n_rows; ++block) {
      const std::int64_t r1 = block_end(r0);
      const std::int64_t r2 = block_end(r1);  // the next block is [r1, r2), empty after the last
      if (r1 < n_rows) stats(block + 1, r1, r2);
      finish(r0, r1);
      bad = check_rows(r0, r1);
      if (!bad.empty()) fail_non_finite(bad, r0);  // the caller's gradient is written up to r0
      if (r1 < n_rows) start(r1, r2);
      finalize(r0, r1, exps(block, r0));
      r0 = r1;
    }
  }
}

template <class Scalar, class ExecSpace>
template <class G>
void CrossEntropy<Scalar, ExecSpace>::backward_impl(const grad_loss_view* grad_loss, T grad_scale, G* grad,
                                                    std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  // No communication here, so the checks are local.
  VPCE_THROW_IF(!m_have_forward, "backward() needs a forward() first (loss_and_grad() keeps nothing)");
  const std::int64_t n_rows = m_saved_targets.extent(0);
  const std::int64_t v_local = m_part.local_size();
  VPCE_THROW_IF(rows != n_rows || cols != v_local,
                "the gradient is " + impl::shape(rows, cols) + ", expected " + impl::shape(n_rows, v_local));
  VPCE_THROW_IF(
      grad_loss != nullptr && std::int64_t(grad_loss->extent(0)) != n_rows,
      "grad_loss has " + std::to_string(grad_loss->extent(0)) + " entries, expected " + std::to_string(n_rows));
  std::string err;
  const auto g = grad_scale_for(grad_loss, grad_scale, &err);
  VPCE_THROW_IF(!err.empty(), err);
  impl::ScopedRegion region("vpce::backward");
  if (m_opt.softcap > 0) {
    backward_rows<G, true>(g, grad, ld);
  } else {
    backward_rows<G, false>(g, grad, ld);
  }
  impl::fence(m_exec, "vpce::backward");
}

template <class Scalar, class ExecSpace>
template <class G, bool Capped>
void CrossEntropy<Scalar, ExecSpace>::backward_rows(const impl::GradScale<T, memory_space>& g, G* y,
                                                    std::int64_t ld_y) {
  const std::int64_t n_rows = m_saved_targets.extent(0);
  if (m_opt.mode == Mode::stash_softmax) {
    impl::KernelArgs<T, T, memory_space> args{m_stash.data(),      std::int64_t(m_stash.stride(0)),
                                              m_part.local_size(), m_part.begin(),
                                              m_saved_targets,     params()};
    impl::BackwardFromStash<T, G, memory_space> f{args, m_stash_target, y, ld_y, g, streaming<G>()};
    impl::for_rows("vpce::backward_stash", m_exec, 0, n_rows, f, use_teams());
  } else {
    impl::KernelArgs<Scalar, T, memory_space> args{m_saved_logits.data(), std::int64_t(m_saved_logits.stride(0)),
                                                   m_part.local_size(),   m_part.begin(),
                                                   m_saved_targets,       params()};
    impl::Finalize<Scalar, T, G, memory_space, impl::Write::grad, impl::Source::logits, Capped> f{
        args,        m_records,      loss_view(), m_lse,   y, ld_y, g,
        m_chunk_max, m_stash_target, false,       nullptr, 0, 0,    streaming<G>()};
    // The records hold the merged statistics of the last forward; lse is recomputed from them.
    impl::for_rows("vpce::backward_recompute", m_exec, 0, n_rows, f, use_teams());
  }
}

}  // namespace vpce
