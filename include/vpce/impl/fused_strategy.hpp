#pragma once
/// \file fused_strategy.hpp
/// \brief The fused strategy (the default): per block of rows, local (m, s, t, a) records, ONE all-reduce
/// of them (the merge of row_stats.hpp), then loss and gradient from the merged records.
///
/// The first block (the head) has min(N, head_rows) rows, and its all-reduce always carries head_rows
/// records plus the call status (status.hpp): the same size on every rank whatever its N. Until the status
/// is known nothing the caller sees is written. The other blocks are pipelined: block k+1's statistics run
/// while block k's all-reduce is in flight, and block k's loss/gradient while block k+1's is; so two blocks
/// are live in cache at a time, and no request is pending when a bad row throws.
///
/// On the host (and without the softcap, for calls that write a gradient or a stash) the statistics store
/// exp(x - m) in a scratch of two blocks (block k in slot k % 2), which stays in cache, and Finalize rescales
/// them: one exp per element, one read of the logits, the caller's rows only written, once, with streaming
/// stores, also for a 16-bit gradient and in place. A device stores no exps: its statistics read each row
/// once and Finalize recomputes the exps from the logits (2 reads + 1 write of N x V_local in all).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "vpce/impl/cross_entropy_core.hpp"

namespace vpce::impl {

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

/// Whether a call keeps the host's exps in the scratch (see the file comment).
/// Not with probability targets: their gradient reads them beside recomputed exps (a per-column term).
inline bool fused_stores_exps(Write what, bool capped, bool teams, bool probs) {
  return what != Write::loss && !capped && !teams && !probs;
}

template <class Ctx>
class FusedStrategy {
 public:
  explicit FusedStrategy(const Ctx& c)
      : c(c),
        ws(c.core.ws),
        store_exps(fused_stores_exps(c.what, Ctx::capped, c.core.use_teams(), c.core.opt.probability_targets)) {}

  void run() {
    const std::int64_t n = c.n_rows;
    const std::int64_t h0 = std::min(n, c.core.head_rows);
    // The head block: its statistics (where this rank's inputs are valid), then its all-reduce, which
    // carries the call status; then the error path, or the check and the loss/gradient of its rows.
    if (c.ok()) statistics(0, 0, h0);
    if (head_allreduce(h0)) c.throw_agreed();
    c.check(0, h0, /*written_rows=*/0);  // only the scratch was written
    c.finalize(0, h0, exps(0, 0));
    // The other blocks, pipelined.
    std::optional<Pending> pending;
    if (h0 < n) {
      statistics(1, h0, block_end(h0));
      pending = start_allreduce(h0, block_end(h0));
    }
    for (std::int64_t r0 = h0, block = 1; r0 < n; ++block) {
      const std::int64_t r1 = block_end(r0);
      const std::int64_t r2 = block_end(r1);  // the next block is [r1, r2), empty after the last
      if (r1 < n) statistics(block + 1, r1, r2);
      finish_allreduce(*pending);
      c.check(r0, r1, /*written_rows=*/r0);
      if (r1 < n) pending = start_allreduce(r1, r2);
      c.finalize(r0, r1, exps(block, r0));
      r0 = r1;
    }
  }

 private:
  using T = typename Ctx::T;
  using memory_space = typename Ctx::memory_space;
  using Part = decltype(std::declval<const Workspace<T, memory_space>&>().record_part(0, 0));
  using Pending = PendingReduction<Part>;

  std::int64_t block_end(std::int64_t r0) const { return std::min(c.n_rows, r0 + c.core.block_rows); }

  /// Where block `block` (first row r0) keeps its exps: its slot of the scratch, or nowhere.
  RowPtr<T> exps(std::int64_t block, std::int64_t r0) const {
    if (!store_exps || ws.exp_scratch.span() == 0) return {};  // not kept, or no rows or no columns
    const std::int64_t slot_row = block % 2 * scratch_slots(c.n_rows, c.core.head_rows, c.core.block_rows).slot1;
    const std::int64_t ld = ws.exp_scratch.stride(0);
    return {ws.exp_scratch.data() + slot_row * ld, ld, r0};
  }

  /// Local records of rows [r0, r1) of block `block`.
  void statistics(std::int64_t block, std::int64_t r0, std::int64_t r1) const {
    ScopedRegion region("vpce::stats");
    using Stats = LocalStats<typename Ctx::Scalar, T, memory_space, Ctx::capped>;
    c.for_rows("vpce::local_stats", r0, r1, Stats(c.args, ws.recs(), exps(block, r0), ws.chunk_max));
    if (c.args.probs)
      c.for_rows("vpce::target_prob_sums", r0, r1,
                 TargetProbSums<typename Ctx::Scalar, T, memory_space, Ctx::capped>(c.args, ws.recs()));
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
};

}  // namespace vpce::impl
