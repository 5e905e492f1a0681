// The records' all-reduce (vpce::impl::StatsReduction), both of its mechanisms: the exchange of a few ranks
// (every rank sends its records to every other and merges them all in rank order) and MPI_Iallreduce with
// the records' op (forced here with exchange_ranks = 1). Every rank must end with the merge of every rank's
// records -- the exchange the same bits on every rank --, with two reductions in flight at once,
// blocking or not, status records (merged by max) and identity records (m = -inf) among them.

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "test_utils.hpp"
#include "vpce/impl/bits.hpp"
#include "vpce/impl/collective.hpp"
#include "vpce/impl/status.hpp"

namespace {

using vpce::impl::RecordLayout;
using vpce::impl::StatsReduction;

constexpr std::int64_t rows = 37;

/// Rank r's records: pseudo-random (m, s, t, a, h) per row; row 3 the merge's identity on odd ranks (m = -inf,
/// the rest 0); the last row a status record (its second value < 0), merged value by value with max.
std::vector<float> records_of(int r, RecordLayout layout) {
  const int w = layout.width();
  std::vector<float> v(std::size_t(rows * w));
  std::uint32_t state = 12345u + 7919u * std::uint32_t(r);
  auto next = [&]() {
    state = state * 1664525u + 1013904223u;
    return float(state >> 8) / float(1u << 24);  // [0, 1)
  };
  for (std::int64_t i = 0; i < rows; ++i) {
    float* q = v.data() + i * w;
    for (int k = 0; k < w; ++k) q[k] = 10 * next() - 5;
    q[1] = 0.5f + 100 * next();  // s > 0
    if (i == 3 && r % 2 == 1) {
      for (int k = 0; k < w; ++k) q[k] = 0;
      q[0] = -std::numeric_limits<float>::infinity();
    }
    if (i == rows - 1) q[1] = -1.0f - float(r);
  }
  return v;
}

TEST(StatsReduction, EveryRankGetsTheMergeOfEveryRanksRecords) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const RecordLayout layout{false, true};
  std::vector<float> expected = records_of(0, layout);
  for (int r = 1; r < ranks; ++r) {
    const std::vector<float> other = records_of(r, layout);
    vpce::impl::merge_records(other.data(), expected.data(), int(rows), layout);
  }
  for (const int exchange_ranks : {StatsReduction<float>::default_exchange_ranks, 1}) {
    const bool exchange = ranks <= exchange_ranks;
    SCOPED_TRACE(exchange ? "exchange" : "MPI_Iallreduce");
    const StatsReduction<float> reduction(layout, exchange_ranks);
    std::vector<float> a = records_of(rank, layout), b = records_of(rank, layout), c = records_of(rank, layout);
    auto first = reduction.start(a.data(), rows, MPI_COMM_WORLD);
    auto second = reduction.start(b.data(), rows, MPI_COMM_WORLD);
    first.finish();
    second.finish();
    reduction.allreduce(c.data(), rows, MPI_COMM_WORLD);
    for (auto* got : {&a, &b, &c}) {
      int far = 0, differ = 0;  // counted, not asserted: every rank reaches the broadcast
      for (std::size_t k = 0; k < expected.size(); ++k) {
        const float v = (*got)[k], e = expected[k];
        if (v != e && !(std::abs(v - e) <= 1e-5f * std::abs(e))) ++far;  // (-inf - -inf is NaN: v != e first)
      }
      if (exchange) {  // the same bits on every rank: rank 0's
        std::vector<float> zero = *got;
        MPI_Bcast(zero.data(), int(zero.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
        for (std::size_t k = 0; k < zero.size(); ++k)
          differ += vpce::impl::as_bits((*got)[k]) != vpce::impl::as_bits(zero[k]);
      }
      EXPECT_EQ(far, 0) << "rank " << rank << ": values far from the merge of every rank's records";
      EXPECT_EQ(differ, 0) << "rank " << rank << ": values whose bits differ from rank 0's";
    }
  }
}

}  // namespace
