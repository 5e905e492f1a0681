#pragma once
/// \file cross_entropy_impl.hpp
/// \brief Definitions of vpce::CrossEntropy and of its core (included by vpce/definitions.hpp and by the
/// library's explicit instantiations).
///
/// The path of one collective call: CrossEntropy::loss_and_grad -> CrossEntropyCore::call (the local checks,
/// the call status) -> run_strategy -> FusedStrategy::run or SeedStrategy::run (statistics kernels, the
/// all-reduces through staging.hpp, the check, Finalize) -> the reduced loss.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "vpce/cross_entropy.hpp"
#include "vpce/impl/cross_entropy_core.hpp"
#include "vpce/impl/fused_strategy.hpp"
#include "vpce/impl/seed_strategy.hpp"

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
  if (!std::isfinite(o.entropy_weight)) return bad("entropy_weight", o.entropy_weight, "a finite value");
  return {};
}
/// The first block of the fused strategy: at most this many rows (its all-reduce is padded to them), and
/// its rows at most this many bytes of exps (head rows x V_local, in the host's scratch).
inline constexpr std::int64_t max_head_rows = 1024;
inline constexpr std::int64_t max_head_scratch_bytes = std::int64_t(64) << 20;

// --- Workspace ---------------------------------------------------------------------------------------------

template <class T, class MemSpace>
void Workspace<T, MemSpace>::reserve(std::int64_t n, std::int64_t head_rows, std::int64_t v_local,
                                     std::int64_t scratch_rows, bool seed_stats, bool stash_rows) {
  auto alloc = [](const char* label) { return Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)); };
  const std::int64_t n_records = std::max(n, head_rows + status_records);
  if (std::int64_t(records.view().extent(0)) < n_records * width()) {
    records = decltype(records)(records_view<T, MemSpace>(alloc("vpce::records"), n_records * width()));
    lse = Kokkos::View<T*, MemSpace>(alloc("vpce::lse"), n_records);
    chunk_max = chunk_max_view<T, MemSpace>(alloc("vpce::chunk_max"), n_records,
                                            std::max<std::int64_t>(1, num_chunks(v_local)));
  }
  if (std::int64_t(exp_scratch.extent(0)) < scratch_rows ||
      (scratch_rows > 0 && std::int64_t(exp_scratch.extent(1)) != v_local)) {
    exp_scratch = decltype(exp_scratch)();  // free before allocating the larger one
    exp_scratch = decltype(exp_scratch)(alloc("vpce::exp_scratch"), scratch_rows, v_local);
  }
  if (seed_stats && std::int64_t(seed.view().extent(0)) < n)
    seed = decltype(seed)(seed_stats_view<T, MemSpace>(alloc("vpce::seed_stats"), n, width()));
  if (seed_stats && seed_head.view().extent(0) == 0)
    seed_head = decltype(seed_head)(Kokkos::View<T*, MemSpace>("vpce::seed_head", seed_head_rows + status_size));
  if (stash_rows && (std::int64_t(stash.extent(0)) < n || std::int64_t(stash.extent(1)) != v_local)) {
    stash = decltype(stash)();
    stash = decltype(stash)(alloc("vpce::softmax_stash"), n, v_local);
    stash_target = Kokkos::View<T*, MemSpace>(alloc("vpce::stash_target"), n);
  }
}

// --- CrossEntropyCore ---------------------------------------------------------------------------------------

template <class Scalar, class ExecSpace>
CrossEntropyCore<Scalar, ExecSpace>::CrossEntropyCore(const Communicator& comm_, const VocabPartition& partition,
                                                      const Options& options, const ExecSpace& exec_)
    : comm(comm_),
      part(partition),
      opt(options),
      exec(exec_),
      reduction(RecordLayout{options.probability_targets, wants_entropy(options)}) {
  ws.layout = reduction.layout();
  std::string err = check_options(opt);
  if (part.num_ranks() != comm.size()) {
    err = "the partition is for " + std::to_string(part.num_ranks()) + " ranks, the communicator has " +
          std::to_string(comm.size());
  } else if (part.rank() != comm.rank()) {
    err = "the partition was made for rank " + std::to_string(part.rank()) + " but this is rank " +
          std::to_string(comm.rank());
  }
  // Rows per block: a thread's share of a block should fit in its cache. What stays there is the block's
  // exps, in the compute type: 16-bit logits take half the rows of float's (perf_tests/NOTES.md, issue 12,
  // ninth round). The fused strategy makes one collective per block, so every rank must use the same value:
  // the smallest wins.
  std::int64_t rows = opt.block_rows;
  if (rows == 0) {
    const std::int64_t row_bytes = std::max<std::int64_t>(1, part.local_size()) * std::int64_t(sizeof(T));
    const std::int64_t per_thread = std::max<std::int64_t>(1, opt.block_bytes_per_thread / row_bytes);
    rows = is_host_space_v<ExecSpace> ? per_thread * std::max(1, int(exec.concurrency())) : (1 << 30);
    if (part.local_size() == 0) rows = std::int64_t(1) << 40;  // no data here: let the others decide
  }
  std::uint64_t part_sum = 0;
  for (auto s : part.sizes()) part_sum = part_sum * 1000003u + static_cast<std::uint64_t>(s);
  comm.agree_or_throw(err, {{"the vocabulary size", part.vocab_size()},
                            {"the partition (a checksum of its sizes)", static_cast<std::int64_t>(part_sum >> 1)},
                            {"the logits' scalar size in bytes", std::int64_t(sizeof(Scalar))},
                            {"Options::strategy", static_cast<std::int64_t>(opt.strategy)},
                            {"Options::mode", static_cast<std::int64_t>(opt.mode)},
                            {"Options::non_finite", static_cast<std::int64_t>(opt.non_finite)},
                            {"Options::ignore_index", opt.ignore_index},
                            {"Options::reduction", static_cast<std::int64_t>(opt.reduction)},
                            {"Options::label_smoothing (bits)", bits_of(opt.label_smoothing)},
                            {"Options::z_loss (bits)", bits_of(opt.z_loss)},
                            {"Options::logit_scale (bits)", bits_of(opt.logit_scale)},
                            {"Options::softcap (bits)", bits_of(opt.softcap)},
                            {"Options::entropy", opt.entropy ? 1 : 0},
                            {"Options::probability_targets", opt.probability_targets ? 1 : 0},
                            {"Options::entropy_weight (bits)", bits_of(opt.entropy_weight)}});
  // The head (first block) is at most max_head_rows, and its scratch at most max_head_scratch_bytes.
  const std::int64_t scratch_row_bytes = std::max<std::int64_t>(1, part.local_size()) * std::int64_t(sizeof(T));
  const std::int64_t head =
      std::min(max_head_rows, std::max<std::int64_t>(1, max_head_scratch_bytes / scratch_row_bytes));
  std::int64_t agreed[2] = {rows, head};
  allreduce_builtin(agreed, 2, MPI_MIN, comm.comm());
  block_rows = agreed[0];
  head_rows = std::min(agreed[0], agreed[1]);
}

template <class Scalar, class ExecSpace>
Params<typename CrossEntropyCore<Scalar, ExecSpace>::T> CrossEntropyCore<Scalar, ExecSpace>::params() const {
  Params<T> p;
  p.scale = T(opt.logit_scale);
  p.cap = T(opt.softcap);
  p.inv_cap = opt.softcap > 0 ? T(1.0 / opt.softcap) : T(0);
  p.alpha = T(opt.label_smoothing);
  p.zeta = T(opt.z_loss);
  p.inv_vocab = T(1.0 / double(part.vocab_size()));
  p.beta = T(opt.entropy_weight);
  p.entropy = wants_entropy(opt);
  if (weights.extent(0) > 0) {
    p.weights = weights.data();
    p.w_over_v = T(weight_sum / double(part.vocab_size()));
  }
  p.ignore_index = opt.ignore_index;
  return p;
}

template <class Scalar, class ExecSpace>
std::string CrossEntropyCore<Scalar, ExecSpace>::check_targets(const targets_view& targets, std::int64_t* checksum) {
  const std::int64_t v = part.vocab_size();
  const auto c = impl::check_targets(exec, targets, v, opt.ignore_index);
  n_valid = c.n_valid;
  valid_weight = double(n_valid);
  *checksum = c.checksum;
  if (c.first_bad == std::int64_t(targets.extent(0))) {
    if (weights.extent(0) > 0) {  // in row order on the host: the same bits for any thread count
      auto t = Kokkos::create_mirror_view(targets);
      Kokkos::deep_copy(exec, t, targets);
      exec.fence();
      valid_weight = 0;
      for (std::size_t i = 0; i < t.extent(0); ++i)
        if (t(i) != opt.ignore_index) valid_weight += double(weights_host(t(i)));
    }
    return {};
  }
  std::int64_t bad = 0;
  Kokkos::deep_copy(bad, Kokkos::subview(targets, c.first_bad));
  return "target " + std::to_string(bad) + " of row " + std::to_string(c.first_bad) + " is outside [0, " +
         std::to_string(v) + ") and is not ignore_index (" + std::to_string(opt.ignore_index) + ")";
}

template <class Scalar, class ExecSpace>
GradScale<typename CrossEntropyCore<Scalar, ExecSpace>::T, typename ExecSpace::memory_space>
CrossEntropyCore<Scalar, ExecSpace>::grad_scale_for(const grad_loss_view* grad_loss, T grad_scale,
                                                    std::string* err) const {
  if (grad_loss != nullptr && opt.reduction != Reduction::none && err->empty())
    *err = std::string("a per-row grad_loss needs Options::reduction none, not ") + to_string(opt.reduction);
  T value = grad_scale;
  if (opt.reduction == Reduction::mean) value = valid_weight > 0 ? grad_scale / T(valid_weight) : T(0);
  return {grad_loss != nullptr ? *grad_loss : grad_loss_view(), value};
}

template <class Scalar, class ExecSpace>
template <class G>
void CrossEntropyCore<Scalar, ExecSpace>::call(const logits_view& logits, const targets_view& targets,
                                               const loss_view& loss, Write what, G* grad, std::int64_t grad_rows,
                                               std::int64_t grad_cols, std::int64_t ld_grad,
                                               const grad_loss_view* grad_loss, T grad_scale, const probs_view* probs) {
  ScopedRegion region("vpce::cross_entropy");
  lse_out = {};
  last_targets = {};
  reduced_loss = std::numeric_limits<double>::quiet_NaN();
  const std::int64_t n_rows = probs != nullptr ? probs->extent(0) : targets.extent(0);
  const std::int64_t v_local = part.local_size();
  // Local checks. Their outcome (and N, and a checksum of the targets) rides in the strategy's first
  // collective: a rank whose inputs are bad still takes part in it, but runs no kernel on them.
  std::string err;
  if (opt.probability_targets && probs == nullptr) {
    err = "Options::probability_targets is set: pass the target probabilities (N x V_local), not target ids";
  } else if (!opt.probability_targets && probs != nullptr) {
    err = "target probabilities need Options::probability_targets (set when the CrossEntropy is built)";
  } else if (probs != nullptr && std::int64_t(probs->extent(1)) != v_local) {
    err = "the target probabilities have " + std::to_string(probs->extent(1)) +
          " columns, the partition gives this rank " + std::to_string(v_local);
  } else if (std::int64_t(logits.extent(1)) != v_local) {
    err = "the logits have " + std::to_string(logits.extent(1)) + " columns, the partition gives this rank " +
          std::to_string(v_local);
  } else if (std::int64_t(logits.extent(0)) != n_rows) {
    err = "the logits have " + std::to_string(logits.extent(0)) + " rows but there are " + std::to_string(n_rows) +
          (probs != nullptr ? " rows of target probabilities" : " targets");
  } else if (std::int64_t(loss.extent(0)) != n_rows) {
    err = "the loss has " + std::to_string(loss.extent(0)) + " entries, expected " + std::to_string(n_rows);
  } else if (what == Write::grad && (grad_rows != n_rows || grad_cols != v_local)) {
    err = "the gradient is " + shape(grad_rows, grad_cols) + ", expected " + shape(n_rows, v_local);
  } else if (what == Write::grad && grad_loss != nullptr && std::int64_t(grad_loss->extent(0)) != n_rows) {
    err = "grad_loss has " + std::to_string(grad_loss->extent(0)) + " entries, expected " + std::to_string(n_rows);
  }
  std::int64_t checksum = 0;
  if (err.empty() && probs == nullptr) err = check_targets(targets, &checksum);
  if (probs != nullptr) {  // every row counts; the mean divides by N (PyTorch's)
    n_valid = n_rows;
    valid_weight = double(n_rows);
  }
  const auto g = grad_scale_for(grad_loss, grad_scale, &err);
  const CallStatus status{!err.empty(), n_rows, checksum, static_cast<std::int64_t>(what)};

  const bool capped = transform() == Transform::softcap;
  const bool fused = opt.strategy == Strategy::fused;
  const bool stores_exps = err.empty() && fused && fused_stores_exps(what, capped, use_teams());
  const std::int64_t chain_threads = fused_chains(comm.size(), is_host_space_v<ExecSpace>, stores_exps)
                                         ? std::max<std::int64_t>(1, exec.concurrency())
                                         : 0;
  const std::int64_t scratch_rows = stores_exps ? fused_scratch_rows(n_rows, head_rows, block_rows, chain_threads) : 0;
  ws.reserve(n_rows, head_rows, v_local, scratch_rows, !fused, what == Write::stash && err.empty());
  RowPtr<G> y{what == Write::grad ? grad : nullptr, ld_grad, 0};
  if constexpr (std::is_same_v<G, T>) {
    if (what == Write::stash) y = {ws.stash.data(), std::int64_t(ws.stash.stride(0)), 0};
  }
  const auto args =
      kernel_args(logits.data(), std::int64_t(logits.stride(0)), targets, probs != nullptr ? *probs : probs_view());
  with_transform([&](auto xf) { run_strategy<G, decltype(xf)::value>(args, n_rows, loss, what, y, g, status, err); });
  lse_out = Kokkos::subview(ws.lse, std::make_pair(std::int64_t(0), n_rows));
  last_targets = targets;
  const double total = ordered_sum(exec, loss);
  reduced_loss = opt.reduction == Reduction::mean ? (valid_weight > 0 ? total / valid_weight : 0.0) : total;
  fence(exec, "vpce::cross_entropy");
}

template <class Scalar, class ExecSpace>
template <class G, Transform Xf>
void CrossEntropyCore<Scalar, ExecSpace>::run_strategy(const KernelArgs<Scalar, T, memory_space>& args,
                                                       std::int64_t n_rows, const loss_view& loss, Write what,
                                                       const RowPtr<G>& y, const GradScale<T, memory_space>& g,
                                                       const CallStatus& status, const std::string& err) {
  using Ctx = CallContext<CrossEntropyCore, G, Xf>;
  const Ctx c{*this, args, n_rows, loss, what, y, g, status, err};
  if constexpr (Xf != Transform::none) {  // the seed strategy takes `scale` with logit_scale 1 (transform())
    if (opt.strategy == Strategy::seed) return SeedStrategy<Ctx>(c).run();
  }
  FusedStrategy<Ctx>(c).run();
}

template <class Scalar, class ExecSpace>
template <class G>
void CrossEntropyCore<Scalar, ExecSpace>::backward(const grad_loss_view* grad_loss, T grad_scale, G* grad,
                                                   std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  // No communication here, so the checks are local.
  VPCE_THROW_IF(!have_forward, "backward() needs a forward() first (loss_and_grad() keeps nothing)");
  const std::int64_t n_rows = opt.probability_targets ? saved_probs.extent(0) : saved_targets.extent(0);
  const std::int64_t v_local = part.local_size();
  VPCE_THROW_IF(rows != n_rows || cols != v_local,
                "the gradient is " + shape(rows, cols) + ", expected " + shape(n_rows, v_local));
  VPCE_THROW_IF(
      grad_loss != nullptr && std::int64_t(grad_loss->extent(0)) != n_rows,
      "grad_loss has " + std::to_string(grad_loss->extent(0)) + " entries, expected " + std::to_string(n_rows));
  std::string err;
  const auto g = grad_scale_for(grad_loss, grad_scale, &err);
  VPCE_THROW_IF(!err.empty(), err);
  ScopedRegion region("vpce::backward");
  const RowPtr<G> y{grad, ld, 0};
  with_transform([&](auto xf) { backward_rows<G, decltype(xf)::value>(g, y); });
  fence(exec, "vpce::backward");
}

template <class Scalar, class ExecSpace>
template <class G, Transform Xf>
void CrossEntropyCore<Scalar, ExecSpace>::backward_rows(const GradScale<T, memory_space>& g, const RowPtr<G>& y) {
  const std::int64_t n_rows = opt.probability_targets ? saved_probs.extent(0) : saved_targets.extent(0);
  if (opt.mode == Mode::stash_softmax) {
    KernelArgs<T, T, memory_space> args{
        ws.stash.data(), std::int64_t(ws.stash.stride(0)), part.local_size(), part.begin(), saved_targets, params()};
    args.probs = opt.probability_targets;  // the stash holds every term: no target column
    const BackwardFromStash<T, G, memory_space> f(args, ws.stash_target, y, g, store<G>());
    for_rows("vpce::backward_stash", exec, 0, n_rows, f, use_teams());
  } else {
    // The records hold the merged statistics of the last forward; lse is recomputed from them.
    const Finalize<Scalar, T, G, memory_space, Write::grad, Source::logits, Xf> f(
        kernel_args(saved_logits.data(), std::int64_t(saved_logits.stride(0)), saved_targets, saved_probs), ws.recs(),
        LossOut<T, memory_space>::none(), y, g, ws.stash_target, StoredExps<T, memory_space>{}, store<G>());
    for_rows("vpce::backward_recompute", exec, 0, n_rows, f, use_teams());
  }
}

template <class Scalar, class ExecSpace>
void CrossEntropyCore<Scalar, ExecSpace>::set_class_weights(const Kokkos::View<const T*, memory_space>& local,
                                                            bool clear) {
  // Local checks (the same error on every rank through the agreement), then every rank gathers all V.
  const std::int64_t v_local = part.local_size();
  std::string err;
  std::vector<T> mine;
  if (!clear && std::int64_t(local.extent(0)) != v_local) {
    err = "the class weights have " + std::to_string(local.extent(0)) + " entries, this rank owns " +
          std::to_string(v_local) + " columns";
  } else if (!clear) {
    mine.resize(v_local);
    Kokkos::deep_copy(exec, Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(mine.data(), mine.size()),
                      local);
    exec.fence();
    for (std::int64_t j = 0; j < v_local; ++j) {
      if (!(mine[j] >= T(0) && std::isfinite(double(mine[j])))) {
        err = "class weight " + std::to_string(double(mine[j])) + " of column " + std::to_string(part.begin() + j) +
              " is negative or not finite (expected finite weights >= 0)";
        break;
      }
    }
  }
  if (err.empty() && part.vocab_size() > std::numeric_limits<int>::max())
    err = "class weights need a vocabulary below 2^31 entries";
  comm.agree_or_throw(err, {{"whether class weights are set or removed", clear ? 0 : 1}});
  weights = {};
  weights_host = {};
  weight_sum = 0;
  if (clear) return;
  std::vector<int> counts(comm.size()), displs(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    counts[r] = static_cast<int>(part.end(r) - part.begin(r));
    displs[r] = static_cast<int>(part.begin(r));
  }
  Kokkos::View<T*, Kokkos::HostSpace> all("vpce::class_weights_host", part.vocab_size());
  VPCE_MPI_CHECK(MPI_Allgatherv(mine.data(), static_cast<int>(v_local), mpi_datatype<T>(), all.data(), counts.data(),
                                displs.data(), mpi_datatype<T>(), comm.comm()));
  for (std::int64_t j = 0; j < part.vocab_size(); ++j) weight_sum += double(all(j));  // in order: the same everywhere
  weights = Kokkos::View<T*, memory_space>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("vpce::class_weights")), part.vocab_size());
  Kokkos::deep_copy(exec, weights, all);
  exec.fence();
  weights_host = Kokkos::create_mirror_view(weights);
  Kokkos::deep_copy(weights_host, all);
}

template <class Scalar, class ExecSpace>
Kokkos::View<const typename CrossEntropyCore<Scalar, ExecSpace>::T*, typename ExecSpace::memory_space>
CrossEntropyCore<Scalar, ExecSpace>::row_output(RowOutput what) {
  VPCE_THROW_IF(what == RowOutput::entropy && !wants_entropy(opt),
                "entropy() needs Options::entropy (or an entropy_weight): the entropy's statistic travels in the "
                "collective only when asked for");
  VPCE_THROW_IF(what == RowOutput::logprob && opt.probability_targets,
                "logprob() needs target ids: with probability targets there is no target column");
  const std::int64_t n = lse_out.extent(0);
  if (n == 0) return {};  // the last call failed, or had no rows
  if (std::int64_t(ws.row_output.extent(0)) < n)
    ws.row_output = Kokkos::View<T*, memory_space>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("vpce::row_output")), n);
  const RowOutputs<T, memory_space> f{Records<const T, memory_space>{ws.records.view(), ws.layout},
                                      lse_out,
                                      last_targets,
                                      ws.row_output,
                                      what,
                                      opt.ignore_index,
                                      T(opt.z_loss),
                                      opt.probability_targets};
  Kokkos::parallel_for("vpce::row_output", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
                       f);
  fence(exec, "vpce::row_output");
  return Kokkos::subview(ws.row_output, std::make_pair(std::int64_t(0), n));
}

}  // namespace impl

// --- the public class: each member forwards to the core -----------------------------------------------------

template <class Scalar, class ExecSpace>
CrossEntropy<Scalar, ExecSpace>::CrossEntropy(const Communicator& comm, const VocabPartition& partition,
                                              const Options& options, const ExecSpace& exec)
    : m_core(std::make_unique<impl::CrossEntropyCore<Scalar, ExecSpace>>(comm, partition, options, exec)) {}

template <class Scalar, class ExecSpace>
CrossEntropy<Scalar, ExecSpace>::~CrossEntropy() = default;

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::forward(const logits_view& logits, const targets_view& targets,
                                              const loss_view& loss) {
  const bool stash = m_core->opt.mode == Mode::stash_softmax;
  m_core->have_forward = false;
  m_core->template call<compute_type>(logits, targets, loss, stash ? impl::Write::stash : impl::Write::loss, nullptr, 0,
                                      0, 0, nullptr, compute_type(1));
  m_core->saved_logits = stash ? logits_view() : logits;
  m_core->saved_targets = targets;
  m_core->saved_probs = {};
  m_core->have_forward = true;
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::forward(const logits_view& logits, const probs_view& target_probs,
                                              const loss_view& loss) {
  const bool stash = m_core->opt.mode == Mode::stash_softmax;
  m_core->have_forward = false;
  m_core->template call<compute_type>(logits, targets_view(), loss, stash ? impl::Write::stash : impl::Write::loss,
                                      nullptr, 0, 0, 0, nullptr, compute_type(1), &target_probs);
  m_core->saved_logits = stash ? logits_view() : logits;
  m_core->saved_targets = {};
  m_core->saved_probs = target_probs;  // in stash mode only its row count is used
  m_core->have_forward = true;
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const probs_view& target_probs,
                                                    const loss_view& loss, const grad_view& grad,
                                                    compute_type grad_scale) {
  m_core->have_forward = false;
  m_core->call(logits, targets_view(), loss, impl::Write::grad, grad.data(), grad.extent(0), grad.extent(1),
               grad.stride(0), nullptr, grad_scale, &target_probs);
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const probs_view& target_probs,
                                                    const loss_view& loss, const grad_storage_view& grad,
                                                    compute_type grad_scale) {
  m_core->have_forward = false;
  if constexpr (is_16bit_v<Scalar>)
    m_core->call(logits, targets_view(), loss, impl::Write::grad, grad.data(), grad.extent(0), grad.extent(1),
                 grad.stride(0), nullptr, grad_scale, &target_probs);
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const probs_view& target_probs,
                                                    const loss_view& loss, const grad_view& grad,
                                                    const grad_loss_view& grad_loss) {
  m_core->have_forward = false;
  m_core->call(logits, targets_view(), loss, impl::Write::grad, grad.data(), grad.extent(0), grad.extent(1),
               grad.stride(0), &grad_loss, compute_type(1), &target_probs);
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const probs_view& target_probs,
                                                    const loss_view& loss, const grad_storage_view& grad,
                                                    const grad_loss_view& grad_loss) {
  m_core->have_forward = false;
  if constexpr (is_16bit_v<Scalar>)
    m_core->call(logits, targets_view(), loss, impl::Write::grad, grad.data(), grad.extent(0), grad.extent(1),
                 grad.stride(0), &grad_loss, compute_type(1), &target_probs);
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const targets_view& targets,
                                                    const loss_view& loss, const grad_view& grad,
                                                    compute_type grad_scale) {
  m_core->have_forward = false;
  m_core->call(logits, targets, loss, impl::Write::grad, grad.data(), grad.extent(0), grad.extent(1), grad.stride(0),
               nullptr, grad_scale);
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const targets_view& targets,
                                                    const loss_view& loss, const grad_storage_view& grad,
                                                    compute_type grad_scale) {
  m_core->have_forward = false;
  if constexpr (is_16bit_v<Scalar>)
    m_core->call(logits, targets, loss, impl::Write::grad, grad.data(), grad.extent(0), grad.extent(1), grad.stride(0),
                 nullptr, grad_scale);
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const targets_view& targets,
                                                    const loss_view& loss, const grad_view& grad,
                                                    const grad_loss_view& grad_loss) {
  m_core->have_forward = false;
  m_core->call(logits, targets, loss, impl::Write::grad, grad.data(), grad.extent(0), grad.extent(1), grad.stride(0),
               &grad_loss, compute_type(1));
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::loss_and_grad(const logits_view& logits, const targets_view& targets,
                                                    const loss_view& loss, const grad_storage_view& grad,
                                                    const grad_loss_view& grad_loss) {
  m_core->have_forward = false;
  if constexpr (is_16bit_v<Scalar>)
    m_core->call(logits, targets, loss, impl::Write::grad, grad.data(), grad.extent(0), grad.extent(1), grad.stride(0),
                 &grad_loss, compute_type(1));
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::backward(const grad_loss_view& grad_loss, const grad_view& grad) {
  m_core->backward(&grad_loss, compute_type(1), grad.data(), grad.extent(0), grad.extent(1), grad.stride(0));
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::backward(const grad_loss_view& grad_loss, const grad_storage_view& grad) {
  if constexpr (is_16bit_v<Scalar>)
    m_core->backward(&grad_loss, compute_type(1), grad.data(), grad.extent(0), grad.extent(1), grad.stride(0));
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::backward(compute_type grad_scale, const grad_view& grad) {
  m_core->backward(nullptr, grad_scale, grad.data(), grad.extent(0), grad.extent(1), grad.stride(0));
}

template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::backward(compute_type grad_scale, const grad_storage_view& grad) {
  if constexpr (is_16bit_v<Scalar>)
    m_core->backward(nullptr, grad_scale, grad.data(), grad.extent(0), grad.extent(1), grad.stride(0));
}

template <class Scalar, class ExecSpace>
Kokkos::View<const typename CrossEntropy<Scalar, ExecSpace>::compute_type*,
             typename CrossEntropy<Scalar, ExecSpace>::memory_space>
CrossEntropy<Scalar, ExecSpace>::lse() const {
  return m_core->lse_out;
}
template <class Scalar, class ExecSpace>
Kokkos::View<const typename CrossEntropy<Scalar, ExecSpace>::compute_type*,
             typename CrossEntropy<Scalar, ExecSpace>::memory_space>
CrossEntropy<Scalar, ExecSpace>::entropy() const {
  return m_core->row_output(impl::RowOutput::entropy);
}
template <class Scalar, class ExecSpace>
Kokkos::View<const typename CrossEntropy<Scalar, ExecSpace>::compute_type*,
             typename CrossEntropy<Scalar, ExecSpace>::memory_space>
CrossEntropy<Scalar, ExecSpace>::logprob() const {
  return m_core->row_output(impl::RowOutput::logprob);
}
template <class Scalar, class ExecSpace>
Kokkos::View<const typename CrossEntropy<Scalar, ExecSpace>::compute_type*,
             typename CrossEntropy<Scalar, ExecSpace>::memory_space>
CrossEntropy<Scalar, ExecSpace>::z_loss_terms() const {
  return m_core->row_output(impl::RowOutput::z_loss);
}
template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::set_class_weights(
    const Kokkos::View<const compute_type*, memory_space>& local_weights) {
  m_core->set_class_weights(local_weights, false);
}
template <class Scalar, class ExecSpace>
void CrossEntropy<Scalar, ExecSpace>::clear_class_weights() {
  m_core->set_class_weights({}, true);
}
template <class Scalar, class ExecSpace>
double CrossEntropy<Scalar, ExecSpace>::valid_weight() const noexcept {
  return m_core->valid_weight;
}
template <class Scalar, class ExecSpace>
double CrossEntropy<Scalar, ExecSpace>::reduced_loss() const noexcept {
  return m_core->reduced_loss;
}
template <class Scalar, class ExecSpace>
std::int64_t CrossEntropy<Scalar, ExecSpace>::num_valid() const noexcept {
  return m_core->n_valid;
}
template <class Scalar, class ExecSpace>
const Communicator& CrossEntropy<Scalar, ExecSpace>::communicator() const noexcept {
  return m_core->comm;
}
template <class Scalar, class ExecSpace>
const VocabPartition& CrossEntropy<Scalar, ExecSpace>::partition() const noexcept {
  return m_core->part;
}
template <class Scalar, class ExecSpace>
const Options& CrossEntropy<Scalar, ExecSpace>::options() const noexcept {
  return m_core->opt;
}
template <class Scalar, class ExecSpace>
std::int64_t CrossEntropy<Scalar, ExecSpace>::block_rows() const noexcept {
  return m_core->block_rows;
}
template <class Scalar, class ExecSpace>
std::int64_t CrossEntropy<Scalar, ExecSpace>::head_rows() const noexcept {
  return m_core->head_rows;
}

}  // namespace vpce
