#pragma once
/// \file cross_entropy_core.hpp
/// \brief What stands behind a vpce::CrossEntropy: its agreed settings and buffers (CrossEntropyCore), and
/// what one collective call works with (CallContext), which the two strategies (fused_strategy.hpp,
/// seed_strategy.hpp) take. Definitions in cross_entropy_impl.hpp.

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "vpce/communicator.hpp"
#include "vpce/cross_entropy.hpp"
#include "vpce/error.hpp"
#include "vpce/impl/call.hpp"
#include "vpce/impl/collective.hpp"
#include "vpce/impl/compat.hpp"
#include "vpce/impl/kernels.hpp"
#include "vpce/impl/staging.hpp"
#include "vpce/impl/status.hpp"
#include "vpce/options.hpp"
#include "vpce/partition.hpp"

namespace vpce::impl {

/// A number for a message: %g.
inline std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

/// The buffers a CrossEntropy keeps across calls: grown on demand, reused.
template <class T, class MemSpace>
struct Workspace {
  /// Per row: the local, then the merged statistics (the fused strategy's all-reduces, and what Finalize and
  /// backward() read), `width` values each (record_width), staged on the host for the records' merge; the
  /// head block's padding and call status ride behind its rows.
  Staged<records_view<T, MemSpace>, MpiOp::host_function> records;
  RecordLayout layout;
  int width() const noexcept { return layout.width(); }
  Kokkos::View<T*, MemSpace> lse;
  chunk_max_view<T, MemSpace> chunk_max;  ///< per row chunk, the max its stored exps are relative to
  /// The fused strategy's exp(x - m) on the host: three blocks' worth, which stay in cache, so the caller's rows
  /// are written once, with streaming stores, and only after the ranks have agreed that the inputs are
  /// valid. Empty on a device (its statistics store no exps).
  Kokkos::View<T**, Kokkos::LayoutRight, MemSpace> exp_scratch;
  Staged<seed_stats_view<T, MemSpace>> seed;  ///< the seed strategy's N x 4 statistics
  /// The seed strategy's first MAX all-reduce: head rows (padded) and the call status.
  Staged<Kokkos::View<T*, MemSpace>> seed_head;
  Kokkos::View<T**, Kokkos::LayoutRight, MemSpace> stash;  ///< forward() in stash mode: N x V_local
  Kokkos::View<T*, MemSpace> stash_target;
  Kokkos::View<T*, MemSpace> row_output;  ///< entropy(), logprob() or z_loss_terms(), computed when asked

  /// The records as the kernels see them, and their part [r0, r1) as MPI does.
  Records<T, MemSpace> recs() const { return {records.view(), layout}; }
  auto record_part(std::int64_t r0, std::int64_t r1) const {
    return records.part(std::make_pair(r0 * width(), r1 * width()));
  }

  /// Room for n rows (and the fused head's padding and status: head_rows + status_records records), a
  /// scratch of scratch_rows x v_local exps, the seed strategy's statistics, the stash.
  void reserve(std::int64_t n, std::int64_t head_rows, std::int64_t v_local, std::int64_t scratch_rows, bool seed_stats,
               bool stash_rows);
};

/// Settings agreed by every rank at construction, and the buffers. The public CrossEntropy forwards to it.
template <class Scalar, class ExecSpace>
class CrossEntropyCore {
 public:
  using T = compute_type_t<Scalar>;
  using public_type = CrossEntropy<Scalar, ExecSpace>;
  using memory_space = typename ExecSpace::memory_space;
  using logits_view = typename public_type::logits_view;
  using targets_view = typename public_type::targets_view;
  using loss_view = typename public_type::loss_view;
  using grad_loss_view = typename public_type::grad_loss_view;
  using probs_view = typename public_type::probs_view;

  /// Collective: checks the options and that they, and the partition, are the same on every rank; agrees on
  /// the block sizes.
  CrossEntropyCore(const Communicator& comm, const VocabPartition& partition, const Options& options,
                   const ExecSpace& exec);

  /// One collective call (forward() or loss_and_grad()): the local checks, then the strategy, whose first
  /// collective carries the call status. `what`: loss (forward, recompute), stash (forward, stash) or grad
  /// (loss_and_grad; rows of G at grad with row stride ld_grad, checked against grad_rows x grad_cols).
  /// grad_loss: the per-row View of the per-row overloads, nullptr for a scalar grad_scale.
  /// probs: the target probabilities (instead of `targets`, which is then empty), or nullptr.
  template <class G>
  void call(const logits_view& logits, const targets_view& targets, const loss_view& loss, Write what, G* grad,
            std::int64_t grad_rows, std::int64_t grad_cols, std::int64_t ld_grad, const grad_loss_view* grad_loss,
            T grad_scale, const probs_view* probs = nullptr);
  /// set_class_weights() (clear: clear_class_weights()): collective.
  void set_class_weights(const Kokkos::View<const T*, memory_space>& local, bool clear);
  /// backward(): no communication, local checks.
  template <class G>
  void backward(const grad_loss_view* grad_loss, T grad_scale, G* grad, std::int64_t rows, std::int64_t cols,
                std::int64_t ld);

  bool use_teams() const noexcept { return !is_host_space_v<ExecSpace> || opt.force_team_kernels; }
  /// Rows of G written with streaming stores: host rows of at least a KiB (each piece copied out ends with a
  /// store fence, which shorter rows would not pay for).
  template <class G>
  Store store() const noexcept {
    return have_streaming_stores && !use_teams() && part.local_size() * std::int64_t(sizeof(G)) >= 1024
               ? Store::streaming
               : Store::plain;
  }
  Params<T> params() const;
  /// The transform the kernels are compiled for (Transform): `none` where logit_scale is 1 in T, except in
  /// the seed strategy (a reference, compiled for `scale` and `softcap` only: the same bits).
  Transform transform() const noexcept {
    if (opt.softcap > 0) return Transform::softcap;
    return T(opt.logit_scale) == T(1) && opt.strategy == Strategy::fused ? Transform::none : Transform::scale;
  }
  /// f(std::integral_constant<Transform, transform()>{}).
  template <class F>
  void with_transform(const F& f) const {
    switch (transform()) {
      case Transform::softcap:
        return f(std::integral_constant<Transform, Transform::softcap>{});
      case Transform::scale:
        return f(std::integral_constant<Transform, Transform::scale>{});
      case Transform::none:
        return f(std::integral_constant<Transform, Transform::none>{});
    }
  }
  /// Every record carries h (the entropy's sum): the entropy is asked for, or weighs in the loss.
  static bool wants_entropy(const Options& o) noexcept { return o.entropy || o.entropy_weight != 0; }
  /// A per-row output of the last call (entropy(), logprob(), z_loss_terms()), into ws.row_output.
  Kokkos::View<const T*, memory_space> row_output(RowOutput what);
  KernelArgs<Scalar, T, memory_space> kernel_args(const Scalar* x, std::int64_t ld_x, const targets_view& targets,
                                                  const probs_view& probs) const {
    KernelArgs<Scalar, T, memory_space> a{x, ld_x, part.local_size(), part.begin(), targets, params()};
    a.probs = opt.probability_targets;
    a.q = probs.data();
    a.ld_q = probs.extent(0) > 0 ? std::int64_t(probs.stride(0)) : 0;
    return a;
  }

  Communicator comm;
  VocabPartition part;
  Options opt;
  ExecSpace exec;
  std::int64_t block_rows = 1;  ///< rows per block of the fused strategy
  std::int64_t head_rows = 1;   ///< rows of the fused strategy's first block
  StatsReduction<T> reduction;
  Workspace<T, memory_space> ws;

  // What the last call leaves, and what forward() keeps for backward().
  Kokkos::View<const T*, memory_space> lse_out;
  double reduced_loss = 0;
  std::int64_t n_valid = 0;
  double valid_weight = 0;  ///< sum of the targets' class weights over the valid rows (n_valid without weights)
  /// The class weights of the whole vocabulary (empty: none), their sum, and a host copy (for valid_weight).
  Kokkos::View<T*, memory_space> weights;
  typename Kokkos::View<T*, memory_space>::HostMirror weights_host;
  double weight_sum = 0;
  logits_view saved_logits;
  targets_view saved_targets;
  probs_view saved_probs;
  targets_view last_targets;  ///< of the last call, for the per-row outputs
  bool have_forward = false;

 private:
  template <class G, Transform Xf>
  void run_strategy(const KernelArgs<Scalar, T, memory_space>& args, std::int64_t n_rows, const loss_view& loss,
                    Write what, const RowPtr<G>& y, const GradScale<T, memory_space>& g, const CallStatus& status,
                    const std::string& err);
  template <class G, Transform Xf>
  void backward_rows(const GradScale<T, memory_space>& g, const RowPtr<G>& y);
  std::string check_targets(const targets_view& targets, std::int64_t* checksum);
  GradScale<T, memory_space> grad_scale_for(const grad_loss_view* grad_loss, T grad_scale, std::string* err) const;
};

/// One collective call, as the strategies see it: the checked inputs and outputs in the kernels' terms, and
/// the steps both strategies share (launching row kernels, Finalize, the non-finite check, the error path).
/// G: the type of the rows written (gradient or stash); Xf: the logits' transform (Transform).
template <class Core, class G, Transform Xf>
struct CallContext {
  using Scalar = typename Core::public_type::scalar_type;
  using T = typename Core::T;
  using memory_space = typename Core::memory_space;
  static constexpr Transform transform = Xf;
  static constexpr bool capped = Xf == Transform::softcap;

  Core& core;
  KernelArgs<Scalar, T, memory_space> args;
  std::int64_t n_rows;
  typename Core::loss_view loss;
  Write what;
  RowPtr<G> y;  ///< gradient or stash rows (Write::grad, Write::stash)
  GradScale<T, memory_space> g;
  CallStatus status;         ///< this rank's verdict on its inputs, carried by the first collective
  const std::string& error;  ///< this rank's message when status.error

  /// This rank's inputs passed its local checks: its kernels may run.
  bool ok() const noexcept { return !status.error; }

  template <class F>
  void for_rows(const char* label, std::int64_t r0, std::int64_t r1, const F& f) const {
    impl::for_rows(label, core.exec, r0, r1, f, core.use_teams());
  }

  /// Loss/lse and the gradient or stash of rows [r0, r1) from the merged records: from the exps the
  /// statistics stored (exps set: the fused strategy on the host) or from the logits.
  void finalize(std::int64_t r0, std::int64_t r1, const RowPtr<T>& exps) const {
    ScopedRegion region("vpce::loss_grad");
    with_finalize(exps, core.template store<G>(), [&](const auto& f) { for_rows("vpce::finalize", r0, r1, f); });
  }

  /// launch(f) with the Finalize functor of this call (see finalize()), which writes its rows `how`.
  template <class Launch>
  void with_finalize(const RowPtr<T>& exps, Store how, const Launch& run) const {
    auto launch = [&](auto write, auto source) {
      run(Finalize<Scalar, T, G, memory_space, decltype(write)::value, decltype(source)::value, Xf>(
          args, Records<const T, memory_space>{core.ws.records.view(), core.ws.layout},
          LossOut<T, memory_space>{loss, core.ws.lse}, y, g, core.ws.stash_target,
          StoredExps<T, memory_space>{{exps.data, exps.ld, exps.row0}, core.ws.chunk_max}, how));
    };
    auto with_write = [&](auto source) {
      if (what == Write::grad) {
        launch(std::integral_constant<Write, Write::grad>(), source);
      } else if (what == Write::loss) {
        launch(std::integral_constant<Write, Write::loss>(), source);
      } else if constexpr (std::is_same_v<G, T>) {
        launch(std::integral_constant<Write, Write::stash>(), source);
      }
    };
    if constexpr (Xf != Transform::softcap) {
      if (exps.data != nullptr) {
        with_write(std::integral_constant<Source, Source::stored_exp>());
        return;
      }
    }
    with_write(std::integral_constant<Source, Source::logits>());
  }

  /// The checks of rows [r0, r1) on the merged records, which MPI's side holds on the host, the same on
  /// every rank: non-finite logits (NonFinite::error), and target probabilities that are negative or do not
  /// sum to 1 (probability_tolerance()). At a bad row, the outputs written so far (the loss, and gradient
  /// rows [0, written_rows)) become NaN, then every rank throws.
  void check(std::int64_t r0, std::int64_t r1, std::int64_t written_rows) const {
    const bool probs = core.opt.probability_targets;
    if (core.opt.non_finite != NonFinite::error && !probs) return;
    const Records<const T, Kokkos::HostSpace> merged{Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                                         core.ws.records.mpi().data(), core.ws.records.mpi().span()),
                                                     core.ws.layout};
    for (std::int64_t i = r0; i < r1; ++i) {
      const RowStats<T> r = merged.load(i);
      if (probs) {
        const std::string row = "row " + std::to_string(i) + " of the target probabilities ";
        if (r.q == neg_inf<T>()) fail(written_rows, row + "has a negative entry");
        if (!(std::abs(double(r.q) - 1.0) <= probability_tolerance<Scalar>()))
          fail(written_rows, row + "sums to " + short_number(double(r.q)) + ", expected 1 (within " +
                                 short_number(probability_tolerance<Scalar>()) + ")");
      }
      if (core.opt.non_finite != NonFinite::error) continue;
      switch (row_verdict(r)) {
        case RowVerdict::ok:
          break;
        case RowVerdict::non_finite:
          fail(written_rows, "row " + std::to_string(i) + " of the logits holds NaN or +inf");
        case RowVerdict::all_neg_inf:
          fail(written_rows, "every logit of row " + std::to_string(i) + " is -inf: the loss is undefined");
      }
    }
  }

  /// The error path, after the first collective said that some rank found an error or that the ranks
  /// disagree: agrees on the message (Communicator::agree) and throws it on every rank.
  [[noreturn]] void throw_agreed() const {
    core.comm.agree_or_throw(error,
                             {{"the number of tokens N", status.n_rows},
                              {"the targets (a checksum)", status.checksum},
                              {"the call (0: forward, 1: forward keeping a stash, 2: loss_and_grad)", status.call}});
    throw Error("internal error: the call status and the agreement on the inputs differ");
  }

 private:
  [[noreturn]] void fail(std::int64_t written_rows, const std::string& message) const {
    if (written_rows > 0) {
      Kokkos::deep_copy(core.exec, loss, std::numeric_limits<T>::quiet_NaN());
      if (what == Write::grad)
        fill_rows("vpce::poison_grad", core.exec, y.data, y.ld, written_rows, core.part.local_size(),
                  G(std::numeric_limits<T>::quiet_NaN()));
      fence(core.exec, "vpce::poison");
    }
    throw Error(message);
  }
};

}  // namespace vpce::impl
