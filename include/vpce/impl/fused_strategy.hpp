#pragma once
/// \file fused_strategy.hpp
/// \brief The fused strategy (the default): per block of rows, local (m, s, t, a) records, ONE all-reduce
/// of them (the merge of row_stats.hpp), then loss and gradient from the merged records.
///
/// The first block (the head) has min(N, head_rows) rows, and its all-reduce always carries head_rows
/// records plus the call status (status.hpp): the same size on every rank whatever its N. Until the status
/// is known nothing the caller sees is written. The other blocks are pipelined: block k+1's statistics run
/// while block k's all-reduce is in flight, and block k's loss/gradient is written in the same launch as
/// block k+2's statistics (while block k+1's all-reduce is in flight); so three blocks are live at a time,
/// and no request is pending when a bad row throws.
///
/// On the host (and without the softcap, for calls that write a gradient or a stash) the statistics store
/// exp(x - m) in a scratch of three blocks (block k in slot k % 3), which stays in cache, and Finalize
/// rescales them: one exp per element, one read of the logits, the caller's rows only written, once, with
/// streaming stores, also for a 16-bit gradient and in place. In the launch that holds both, each thread writes a
/// gradient row in step with the statistics row it reads (StatsWithGradient): the read stream and the write stream then
/// overlap, which two launches one after the other did not (perf_tests/NOTES.md, issue 12, fifth round). On one rank
/// (and the host, the exps kept) no collective makes a block wait: after the head, the rows run chained in one launch
/// (ChainedRows). In place over logits of the compute type, the rows after the head keep their exps in the
/// logits' own rows instead (FusedStrategy::keeps_exps_in_logits). A device stores no exps: its statistics read each
/// row once and Finalize recomputes the exps from the logits (2 reads + 1 write of N x V_local in all).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "vpce/impl/cross_entropy_core.hpp"

namespace vpce::impl {

/// The host's scratch of exps for n rows in the fused strategy: up to three slots of `slot` rows, block k
/// (the head is block 0) in slot k % 3.
struct ScratchSlots {
  std::int64_t slot = 0, rows = 0;
};
inline ScratchSlots scratch_slots(std::int64_t n, std::int64_t head_rows, std::int64_t block_rows) {
  const std::int64_t h0 = std::min(n, head_rows);
  const std::int64_t blocks = n <= h0 ? 1 : 1 + (n - h0 + block_rows - 1) / block_rows;
  const std::int64_t slot = std::max(h0, std::min(n - h0, block_rows));
  return {slot, std::min<std::int64_t>(blocks, 3) * slot};
}

/// Whether a call runs its rows after the head chained (ChainedRows): on one rank, where no collective makes
/// a block wait for the others, on the host, where it keeps its exps.
inline bool fused_chains(int ranks, bool host, bool stores_exps) { return ranks == 1 && host && stores_exps; }

/// Rows of the host's scratch of exps for n rows: the three slots of scratch_slots, or, for a chained call
/// (`chain_threads` > 0), the head's rows and then two rows per thread.
inline std::int64_t fused_scratch_rows(std::int64_t n, std::int64_t head_rows, std::int64_t block_rows,
                                       std::int64_t chain_threads) {
  if (chain_threads <= 0) return scratch_slots(n, head_rows, block_rows).rows;
  const std::int64_t h0 = std::min(n, head_rows);
  return std::max(h0, 2 * std::min(chain_threads, n - h0));
}

/// Block b+1's statistics and block b-1's gradient (from its stored exps) in one launch, on the host: index i
/// reads statistics row s0 + i and writes gradient row f0 + i in step with it, the columns up to where the
/// statistics have read (their pace, HostInner::online_stats) each time they report, cut at the gradient
/// row's 64-byte lines so that every line is written whole by streaming stores. Both rows are streamed
/// through the same core; the gradient row's exps were stored by the same thread (the same index in the
/// launch two blocks before), so they are in its cache.
template <class Stats, class Fin>
struct StatsWithGradient {
  Stats stats;
  Fin fin;
  std::int64_t s0, ns, f0, nf, cols;
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t i) const {
    if (i >= nf) {
      stats.row(in, s0 + i);
      return;
    }
    const auto k = fin.begin(f0 + i);
    std::int64_t done = 0;
    if (i < ns) {
      constexpr std::int64_t lanes = 64 / std::int64_t(sizeof(*k.yr));  // columns per line
      const std::int64_t lead = std::int64_t(reinterpret_cast<std::uintptr_t>(k.yr) % 64) / std::int64_t(sizeof(*k.yr));
      auto pace = [&](std::int64_t j) {
        const std::int64_t upto = j - (lead + j) % lanes;
        if (upto > done) {
          write(in, k, done, upto);
          done = upto;
        }
      };
      stats.row(in, s0 + i, pace);
    }
    fin.write(in, k, done, cols);
    fin.end(in, k);
  }

 private:
  /// Columns [a, b) of a gradient row, not fenced (the row's last piece is). A call, not inlined into the
  /// statistics' loop (flattened, VPCE_FLATTEN): inlined there it cost ~10% of `loss_and_grad` (the loop's
  /// code around it got worse), called it costs a call per 32 x Lanes columns.
  template <class Inner, class Row>
  KOKKOS_INLINE_FUNCTION void write(const Inner& in, const Row& k, std::int64_t a, std::int64_t b) const {
    Apart<Inner::isa, false>::call([&] { fin.write(in, k, a, b, /*fence=*/false); });
  }
};

/// On one rank, the rows after the head in ONE launch (no block waits for a collective): index c of `chunks`
/// runs rows [r0 + (n - r0) c / chunks, r0 + (n - r0) (c + 1) / chunks) in order, row r's statistics in step
/// with row r - 1's gradient (StatsWithGradient), their exps in two rows of the scratch of its own (row r's
/// in rows[r % 2]), or in their own rows of the logits where `logits` is set. So every thread reads and writes its own
/// rows without waiting for the other threads, which ~1000 launches of cache-sized blocks did at 1 rank x 2 threads: ~3
/// us each, 7-9% of `loss_and_grad` (perf_tests/NOTES.md, issue 12, ninth round).
template <class T, class Stats, class Fin>
struct ChainedRows {
  Stats stats;
  Fin fin;
  T* scratch;
  std::int64_t ld, r0, n, chunks, cols;
  RowPtr<T> logits;  ///< the logits' rows, where they keep the exps (FusedStrategy::keeps_exps_in_logits)
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t c) const {
    const std::int64_t a = r0 + (n - r0) * c / chunks, b = r0 + (n - r0) * (c + 1) / chunks;  // a < b
    T* const rows[2] = {scratch + 2 * c * ld, scratch + (2 * c + 1) * ld};
    auto exps = [&](std::int64_t r) { return logits.data != nullptr ? logits : RowPtr<T>{rows[r % 2], ld, r}; };
    for (std::int64_t r = a; r <= b; ++r) {  // r = b: row b - 1's gradient only
      const RowPtr<T> prev = exps(r - 1);
      const StatsWithGradient<Stats, Fin> both{stats.with_exps(exps(r)),
                                               fin.with_exps({prev.data, prev.ld, prev.row0}),
                                               r,
                                               r < b ? 1 : 0,
                                               r - 1,
                                               r > a ? 1 : 0,
                                               cols};
      // Apart, so that the row's loops are compiled in a function without `both`'s cleanup (the destructors of
      // its Views): in the copies (VPCE_HOST_CLONES), flattened into this one, GCC kept the statistics' sums
      // and maxima in memory in 20 of its 20 exp loops (fp32 `loss_and_grad` 1.5x the native build's time on one
      // rank; perf_tests/NOTES.md, issue 12, forty-fourth round).
      Apart<Inner::isa, false>::call([&] { both.row(in, 0); });
    }
  }
};

/// How many times larger the blocks of a call that keeps no exps are (FusedStrategy::rows_per_block): 128 MiB
/// of fp32 logits per thread with the default blocks of half a 1 MiB L2.
inline constexpr std::int64_t loss_block_factor = 256;

/// Whether a call keeps the host's exps in the scratch (see the file comment).
inline bool fused_stores_exps(Write what, bool capped, bool teams) { return what != Write::loss && !capped && !teams; }

template <class Ctx>
class FusedStrategy {
 public:
  explicit FusedStrategy(const Ctx& c)
      : c(c),
        ws(c.core.ws),
        store_exps(fused_stores_exps(c.what, Ctx::capped, c.core.use_teams())),
        block_rows(rows_per_block(c)),
        chained(fused_chains(c.core.comm.size(), is_host_space_v<Exec>, store_exps)),
        logits_keep_exps(store_exps && keeps_exps_in_logits(c)),
        grad_store(grad_store_for(c, chained ? threads() : block_rows, logits_keep_exps)) {}

  void run() {
    const std::int64_t n = c.n_rows;
    const std::int64_t h0 = std::min(n, c.core.head_rows);
    // The head block: its statistics (where this rank's inputs are valid), then its all-reduce, which
    // carries the call status; then the error path, or the check of its rows.
    if (c.ok()) launch({0, 0, h0}, {});
    if (head_allreduce(h0)) c.throw_agreed();
    c.check(0, h0, /*written_rows=*/0);  // only the scratch was written
    if (chained) {
      chain(h0);
      return;
    }
    // The other blocks, pipelined; `due`: the block whose loss/gradient is written in the next launch.
    Block due{0, 0, h0};
    std::optional<Pending> pending;
    if (h0 < n) {
      launch({1, h0, block_end(h0)}, due);
      due = {};
      pending = start_allreduce(h0, block_end(h0));
    }
    for (std::int64_t r0 = h0, block = 1; r0 < n; ++block) {
      const std::int64_t r1 = block_end(r0);
      const std::int64_t r2 = block_end(r1);  // the next block is [r1, r2), empty after the last
      launch({block + 1, r1, r2}, due);
      finish_allreduce(*pending);
      c.check(r0, r1, /*written_rows=*/logits_keep_exps ? r2 : r0);  // rows [r0, r2) may hold exps
      if (r1 < n) pending = start_allreduce(r1, r2);
      due = {block, r0, r1};
      r0 = r1;
    }
    launch({}, due);
  }

 private:
  using T = typename Ctx::T;
  using memory_space = typename Ctx::memory_space;
  using Exec = std::decay_t<decltype(std::declval<const Ctx&>().core.exec)>;
  using Stats = LocalStats<typename Ctx::Scalar, T, memory_space, Ctx::transform>;
  using Part = decltype(std::declval<const Workspace<T, memory_space>&>().record_part(0, 0));
  using Pending = PendingReduction<Part>;

  std::int64_t block_end(std::int64_t r0) const { return c.n_rows - r0 <= block_rows ? c.n_rows : r0 + block_rows; }

  /// Rows per block after the head: the core's block_rows for a call that may keep its exps (their three
  /// blocks must stay in cache), loss_block_factor times that, where the size was chosen from the cache
  /// (Options::block_rows = 0), for a call that keeps none whatever the kernels' form (the loss only, the
  /// softcap): there a block holds nothing in cache, and each block costs a launch and
  /// a collective, ~6 us (measured, fp32 forward at N 4096 x V_local 32768: 4x the cached size 25.9 / 52.0 ms
  /// at 1 rank x 2 threads / 2 ranks x 1 thread, 256x 24.6 / 48.6; perf_tests/NOTES.md, issue 12, ninth
  /// round). Decided by the call and the options alone, the same on every rank.
  static std::int64_t rows_per_block(const Ctx& c) {
    const std::int64_t rows = c.core.block_rows;
    const bool keeps_none = c.what == Write::loss || Ctx::capped;
    if (!keeps_none || c.core.opt.block_rows != 0) return rows;
    constexpr std::int64_t most = std::numeric_limits<std::int64_t>::max();
    return rows > most / loss_block_factor ? most : rows * loss_block_factor;
  }

  /// How StatsWithGradient writes the gradient: with plain stores where the gradient rows are the logits' own
  /// (in place) and a thread's share of the three live blocks fits in its L2 -- the logits of two, read since
  /// the rows it writes were, and the exps of three, none where they go over the logits (`exps_in_logits`,
  /// keeps_exps_in_logits). Those rows' lines are then still in L2, a plain store needs no read from memory,
  /// and a streaming store to a line in cache was slower (fp32 in place, 1 rank x 2 threads: 45.7 -> 37.1 ms,
  /// 0.92x the copy; perf_tests/NOTES.md, issue 12, seventh round; bfloat16 in place at 2 ranks x 1 thread
  /// 1.60 -> 1.44x its copy; fp32 in place over the logits at 2 ranks x 1 thread with blocks of L2/2, 92.0 ->
  /// 67.1 ms, fifteenth round). Not for float16 logits, whose in-place call was 14% slower with plain stores
  /// (not explained; ninth round). Else the core's choice (streaming stores on the host).
  static Store grad_store_for(const Ctx& c, std::int64_t block_rows, bool exps_in_logits) {
    const Store core = c.core.template store<std::remove_pointer_t<decltype(c.y.data)>>();
    if (core == Store::plain || !in_place(c) || std::is_same_v<typename Ctx::Scalar, float16>) return core;
    const std::int64_t threads = std::max<std::int64_t>(1, c.core.exec.concurrency());
    const std::int64_t rows = (std::min(block_rows, c.n_rows) + threads - 1) / threads;
    const std::int64_t bytes_per_column =
        2 * std::int64_t(sizeof(typename Ctx::Scalar)) + (exps_in_logits ? 0 : 3 * std::int64_t(sizeof(T)));
    const std::int64_t l2 = l2_cache_bytes();
    return l2 > 0 && rows <= l2 / bytes_per_column / std::max<std::int64_t>(1, c.args.n) ? Store::plain : core;
  }

  /// Whether the gradient rows are the logits' own (the same buffer and stride).
  static bool in_place(const Ctx& c) {
    return static_cast<const void*>(c.y.data) == static_cast<const void*>(c.args.x) && c.y.ld == c.args.ld_x;
  }

  /// Whether the rows after the head keep their exps in the logits' own rows rather than the scratch: on the
  /// host, in place over logits of the compute type (the exps' type), where neither the entropy (its sum needs
  /// x - m beside each exp when a chunk is done again), the entropy weight (its gradient reads the logits) nor
  /// probability targets (their sums read the row after its statistics) are asked for. The statistics store each exp
  /// where they have just read its logit, and the gradient where it reads the exp: lines already in L1 (a chunk done
  /// again reads its logits back from the values stored: HostInner::online_stats). Fewer lines through the caches than
  /// a scratch beside the logits: fp32 in place, N 4096 x V_local 32768 on a Zen 4, -7 to -14% (-19% in cache;
  /// perf_tests/NOTES.md, issue 12, fourteenth round). The head keeps its exps in the scratch: nothing the caller sees
  /// is written before the status is known.
  static bool keeps_exps_in_logits(const Ctx& c) {
    using G = std::remove_pointer_t<decltype(c.y.data)>;
    constexpr bool same_type = std::is_same_v<typename Ctx::Scalar, T> && std::is_same_v<G, T>;
    return is_host_space_v<Exec> && same_type && c.what == Write::grad && in_place(c) && !c.args.p.entropy &&
           c.args.p.beta == T(0) && !c.args.probs;
  }
  /// The gradient's rows (the logits'), where they keep the exps of the rows after the head, else none.
  RowPtr<T> logits_rows() const {
    if constexpr (std::is_same_v<std::remove_pointer_t<decltype(c.y.data)>, T>) {
      if (logits_keep_exps) return {c.y.data, c.y.ld, c.y.row0};
    }
    return {};
  }

  /// Block `index` of the call: rows [r0, r1).
  struct Block {
    std::int64_t index = 0, r0 = 0, r1 = 0;
    bool empty() const { return r1 <= r0; }
  };

  /// Where block `block` (first row r0) keeps its exps: its slot of the scratch, the logits' rows (after the
  /// head, where logits_keep_exps), or nowhere.
  RowPtr<T> exps(const Block& b) const {
    if (!store_exps || ws.exp_scratch.span() == 0) return {};  // not kept, or no rows or no columns
    if (b.index > 0 && logits_keep_exps) return logits_rows();
    const std::int64_t slot_row = b.index % 3 * scratch_slots(c.n_rows, c.core.head_rows, c.core.block_rows).slot;
    const std::int64_t ld = ws.exp_scratch.stride(0);
    return {ws.exp_scratch.data() + slot_row * ld, ld, b.r0};
  }

  /// The local records of block s, and the loss/gradient of block f (its records merged and checked): in one
  /// launch where f's exps are stored on the host (StatsWithGradient), else one launch after the other. (For
  /// 16-bit logits the two launches were kept until the blocks were sized by their exps: in step, bfloat16
  /// `loss_and_grad` at 2 ranks x 1 thread 1.53 -> 1.42x its copy, in place 1.52 -> 1.44x;
  /// perf_tests/NOTES.md, issue 12, ninth round.)
  void launch(const Block& s, const Block& f) const {
    if constexpr (is_host_space_v<Exec>) {
      auto in_step = [&](const auto& fin) {
        const StatsWithGradient<Stats, std::decay_t<decltype(fin)>> both{
            Stats(c.args, ws.recs(), exps(s), ws.chunk_max), fin, s.r0, s.r1 - s.r0, f.r0, f.r1 - f.r0, c.args.n};
        impl::for_rows("vpce::stats_loss_grad", c.core.exec, 0, std::max(s.r1 - s.r0, f.r1 - f.r0), both,
                       /*use_teams=*/false);
      };
      if (!s.empty() && !f.empty() && exps(f).data != nullptr && with_piecewise_finalize(exps(f), in_step)) return;
    }
    if (!s.empty()) {
      ScopedRegion region("vpce::stats");
      c.for_rows("vpce::local_stats", s.r0, s.r1, Stats(c.args, ws.recs(), exps(s), ws.chunk_max));
    }
    if (!f.empty()) c.finalize(f.r0, f.r1, exps(f));
  }

  /// run(fin) with the call's Finalize functor over the exps at `e`, where that functor writes a row in
  /// pieces (Fin::piecewise: exps stored on the host), so that a launch can run it in step with statistics;
  /// in the region "vpce::stats_loss_grad". False (nothing run) where it does not.
  template <class Run>
  bool with_piecewise_finalize(const RowPtr<T>& e, const Run& run) const {
    bool ran = false;
    c.with_finalize(e, grad_store, [&](const auto& fin) {
      if constexpr (std::decay_t<decltype(fin)>::piecewise) {
        ScopedRegion region("vpce::stats_loss_grad");
        run(fin);
        ran = true;
      }
    });
    return ran;
  }

  std::int64_t threads() const { return std::max<std::int64_t>(1, c.core.exec.concurrency()); }

  /// A chained call (one rank): the head's loss/gradient, then the other rows in one launch (ChainedRows),
  /// then their checks, on the records as they are (one rank's are the merged ones): at a bad row every
  /// output written becomes NaN, as at a bad row of a later block in the pipeline.
  void chain(std::int64_t h0) const {
    const std::int64_t n = c.n_rows;
    c.finalize(0, h0, exps({0, 0, h0}));
    if (h0 >= n) return;
    if constexpr (is_host_space_v<Exec>) {
      const RowPtr<T> scratch{ws.exp_scratch.data(), std::int64_t(ws.exp_scratch.stride(0)), 0};
      const bool chained = with_piecewise_finalize(scratch, [&](const auto& fin) {
        const std::int64_t chunks = std::min(threads(), n - h0);
        const ChainedRows<T, Stats, std::decay_t<decltype(fin)>> rows{Stats(c.args, ws.recs(), scratch, ws.chunk_max),
                                                                      fin,
                                                                      scratch.data,
                                                                      scratch.ld,
                                                                      h0,
                                                                      n,
                                                                      chunks,
                                                                      c.args.n,
                                                                      logits_rows()};
        impl::for_rows("vpce::chained_rows", c.core.exec, 0, chunks, rows, /*use_teams=*/false);
      });
      if (!chained) throw Error("internal error: a chained call without stored exps");
    }
    c.check(h0, n, /*written_rows=*/n);
  }

  /// The head block's all-reduce: head_rows records (this rank's statistics of its rows, the merge's identity
  /// where it has none) and the call status behind them. True when the ranks must take the error path.
  bool head_allreduce(std::int64_t h0) const {
    ScopedRegion region("vpce::collective");
    const std::int64_t head = c.core.head_rows;
    const std::int64_t mine = c.ok() ? h0 : 0;  // rows with this rank's statistics
    const int w = ws.width();
    std::vector<T> tail((head - mine + status_records) * w, T(0));  // the identity: m = -inf, the rest 0
    for (std::int64_t r = 0; r < head - mine; ++r) tail[r * w] = neg_inf<T>();
    encode_status_records(c.status, tail.data() + (head - mine) * w, w);
    const auto behind = std::make_pair(mine * w, (head + status_records) * w);
    Kokkos::deep_copy(c.core.exec, Kokkos::subview(ws.records.view(), behind),
                      Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(tail.data(), tail.size()));
    allreduce(c.core.exec, ws.record_part(0, head + status_records), c.core.reduction, c.core.comm.comm());
    return status_records_need_agreement(ws.records.mpi().data() + head * w, w);
  }

  /// A block's all-reduce is non-blocking: started after its statistics, finished after the next block's.
  /// The region "vpce::collective" covers only the time the ranks spend in MPI.
  Pending start_allreduce(std::int64_t r0, std::int64_t r1) const {
    ScopedRegion region("vpce::collective");
    return impl::start_allreduce(c.core.exec, ws.record_part(r0, r1), c.core.reduction, c.core.comm.comm());
  }
  void finish_allreduce(Pending& pending) const {
    ScopedRegion region("vpce::collective");
    pending.finish(c.core.exec);
  }

  const Ctx& c;
  const Workspace<T, memory_space>& ws;
  const bool store_exps;
  const std::int64_t block_rows;
  const bool chained;           ///< fused_chains
  const bool logits_keep_exps;  ///< keeps_exps_in_logits, where the call stores exps
  const Store grad_store;
};

}  // namespace vpce::impl
