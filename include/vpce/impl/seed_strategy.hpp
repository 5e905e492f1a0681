#pragma once
/// \file seed_strategy.hpp
/// \brief The seed strategy: Megatron's forward, collective by collective. MAX all-reduce of the row max,
/// then SUM of exp against it, then SUM of the target logit (and, with label smoothing only, a SUM of the
/// logit sums; with the entropy only, a SUM of its h). The first MAX also carries the call status, in a buffer of a
/// fixed size (seed_head_rows + status_size, status.hpp). Kept as the reference the fused strategy is compared with.

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "vpce/impl/cross_entropy_core.hpp"

namespace vpce::impl {

/// records(i) = the seed strategy's merged (max, sum, target logit, logit sum[, h]) of row i.
template <class T, class MemSpace>
struct SeedToRecords {
  seed_stats_view<T, MemSpace> seed;
  Records<T, MemSpace> records;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    // The seed's columns are the records' values, in the same order.
    const RecordLayout l = records.layout;
    RowStats<T> r{seed(i, 0), seed(i, 1), seed(i, 2), seed(i, 3), T(0), T(0), T(0)};
    if (l.entropy) r.h = seed(i, l.h());
    if (l.probs) {
      r.q = seed(i, 4);
      r.wq = seed(i, 5);
    }
    records.store(i, r);
  }
};

template <class Ctx>
class SeedStrategy {
 public:
  explicit SeedStrategy(const Ctx& c) : c(c), ws(c.core.ws) {}

  void run() {
    const std::int64_t n = c.n_rows;
    using Scalar = typename Ctx::Scalar;
    // 1. The local row max; its MAX all-reduce (the head rows with the call status, then the other rows).
    if (c.ok()) {
      ScopedRegion region("vpce::stats");
      c.for_rows("vpce::seed_max", 0, n, LocalMax<Scalar, T, memory_space, Ctx::transform>(c.args, ws.seed.view()));
    }
    if (head_allreduce()) c.throw_agreed();
    column_allreduce(0, MPI_MAX, seed_head_rows);
    // 2. The sum of exp against the global max, the target logit, the logit sum; a SUM all-reduce of each.
    {
      ScopedRegion region("vpce::stats");
      c.for_rows("vpce::seed_sum_gather", 0, n,
                 LocalSumGather<Scalar, T, memory_space, Ctx::transform>(c.args, ws.seed.view()));
      if (c.args.probs)
        c.for_rows("vpce::target_prob_sums", 0, n,
                   TargetProbSums<Scalar, T, memory_space, Ctx::transform>(c.args, ws.seed.view()));
    }
    for (int col = 1; col < (c.core.opt.label_smoothing > 0 ? 4 : 3); ++col) column_allreduce(col, MPI_SUM, 0);
    for (int col = 4; col < c.core.ws.width(); ++col) column_allreduce(col, MPI_SUM, 0);  // probs' sums, h
    // 3. The merged records: checked (nothing is written yet), then the loss and gradient.
    merged_records();
    c.check(0, n, /*written_rows=*/0);
    c.finalize(0, n, RowPtr<T>{});
  }

 private:
  using T = typename Ctx::T;
  using memory_space = typename Ctx::memory_space;
  using ExecSpace = decltype(std::declval<Ctx>().core.exec);

  /// The first MAX: the row max of rows [0, min(N, seed_head_rows)) (none where this rank's inputs are bad),
  /// padded with -inf to seed_head_rows, then the status. True when the ranks must take the error path.
  bool head_allreduce() const {
    ScopedRegion region("vpce::collective");
    constexpr std::int64_t head = seed_head_rows;
    const std::int64_t h0 = c.ok() ? std::min(c.n_rows, head) : 0;
    const auto& exec = c.core.exec;
    const auto rows = [](std::int64_t a, std::int64_t b) { return std::make_pair(a, b); };
    const auto& buf = ws.seed_head.view();
    if (h0 > 0)
      Kokkos::deep_copy(exec, Kokkos::subview(buf, rows(0, h0)), Kokkos::subview(ws.seed.view(), rows(0, h0), 0));
    std::vector<T> tail(head - h0 + status_size, neg_inf<T>());
    encode_status(c.status, tail.data() + (head - h0));
    Kokkos::deep_copy(exec, Kokkos::subview(buf, rows(h0, head + status_size)),
                      Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(tail.data(), tail.size()));
    allreduce(exec, ws.seed_head.part(Kokkos::ALL), MPI_MAX, c.core.comm.comm());
    T merged[status_size];
    Kokkos::deep_copy(exec, Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(merged, status_size),
                      Kokkos::subview(buf, rows(head, head + status_size)));
    if (h0 > 0)
      Kokkos::deep_copy(exec, Kokkos::subview(ws.seed.view(), rows(0, h0), 0), Kokkos::subview(buf, rows(0, h0)));
    fence(exec, "vpce::seed_head");
    return status_needs_agreement(merged);
  }

  /// In-place all-reduce of rows [r0, N) of one column of the statistics (none when r0 >= N).
  void column_allreduce(int col, MPI_Op op, std::int64_t r0) const {
    if (r0 >= c.n_rows) return;
    ScopedRegion region("vpce::collective");
    allreduce(c.core.exec, ws.seed.part(std::make_pair(r0, c.n_rows), col), op, c.core.comm.comm());
  }

  /// The merged statistics as records: on the device for Finalize, on MPI's (host) side for the check.
  void merged_records() const {
    const std::int64_t n = c.n_rows;
    Kokkos::parallel_for("vpce::seed_records",
                         Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(c.core.exec, 0, n),
                         SeedToRecords<T, memory_space>{ws.seed.view(), ws.recs()});
    ws.record_part(0, n).to_mpi(c.core.exec);
    fence(c.core.exec, "vpce::seed_stats");
  }

  const Ctx& c;
  const Workspace<T, memory_space>& ws;
};

}  // namespace vpce::impl
