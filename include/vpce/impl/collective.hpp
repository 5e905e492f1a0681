#pragma once
/// \file collective.hpp
/// \brief The MPI side: the datatype and user-defined op that merge RowStats records in one all-reduce, and
/// the built-in all-reduces of the seed strategy, on memory MPI can access (staging.hpp puts the buffers
/// there). Knows nothing about Kokkos; what the merged records mean is status.hpp's.

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "vpce/impl/row_stats.hpp"

namespace vpce::impl {

/// MPI datatype of a scalar type (one table for the whole library).
template <class T>
MPI_Datatype mpi_datatype();
template <>
inline MPI_Datatype mpi_datatype<float>() {
  return MPI_FLOAT;
}
template <>
inline MPI_Datatype mpi_datatype<double>() {
  return MPI_DOUBLE;
}
template <>
inline MPI_Datatype mpi_datatype<std::int64_t>() {
  return MPI_INT64_T;
}

template <class T>
class StatsReduction;

/// An all-reduce of records that StatsReduction::start began; finish() completes it, and the records then
/// hold every rank's merged. Until then they must not be touched.
template <class T>
class StartedReduction {
 public:
  void finish();

 private:
  friend class StatsReduction<T>;
  std::vector<MPI_Request> m_requests;
  std::vector<T> m_received;  ///< exchange: the other ranks' records, in rank order (empty: MPI_Iallreduce)
  T* m_records = nullptr;
  std::int64_t m_count = 0;
  int m_rank = 0, m_ranks = 1;
  RecordLayout m_layout;
};

/// Owns the contiguous datatype of one record (layout.width() values of T) and the commutative op that
/// applies merge_records() (status.hpp) for that layout (an op function per layout: MPI gives it no state).
///
/// On at most `exchange_ranks` ranks the records are not all-reduced by MPI but exchanged: each rank sends
/// its records to every other (MPI_Isend / MPI_Irecv) and merges them all on finish(), in rank order, so
/// that every rank gets the same bits. An exchange needs nothing from the other ranks once they have
/// started it, where MPI_Iallreduce's rounds (a reduce, then a broadcast) move on only while both ranks are
/// inside MPI: the fused strategy's wait per block went from ~3-4 us to ~0.3 us at 2 ranks
/// (perf_tests/NOTES.md, issue 12, ninth round). Its messages grow with the ranks: beyond a few,
/// MPI_Iallreduce.
template <class T>
class StatsReduction {
 public:
  static constexpr int default_exchange_ranks = 8;
  explicit StatsReduction(RecordLayout layout, int exchange_ranks = default_exchange_ranks);
  ~StatsReduction();
  StatsReduction(const StatsReduction&) = delete;
  StatsReduction& operator=(const StatsReduction&) = delete;

  /// In-place all-reduce of `count` records (count x width values) in host-accessible memory: start(), then
  /// finish().
  void allreduce(T* records, std::int64_t count, MPI_Comm comm) const;

  /// The same, non-blocking (in pieces of < 2^31 records); `records` must not be touched until finish()
  /// returns. Every rank must start its all-reduces in the same order.
  StartedReduction<T> start(T* records, std::int64_t count, MPI_Comm comm) const;
  int width() const noexcept { return m_layout.width(); }
  RecordLayout layout() const noexcept { return m_layout; }

 private:
  RecordLayout m_layout;
  int m_exchange_ranks;
  MPI_Datatype m_type = MPI_DATATYPE_NULL;
  MPI_Op m_op = MPI_OP_NULL;
};

/// In-place all-reduce of `count` scalars with a built-in op (split into calls of < 2^31).
template <class T>
void allreduce_builtin(T* data, std::int64_t count, MPI_Op op, MPI_Comm comm);

extern template class StartedReduction<float>;
extern template class StartedReduction<double>;
extern template class StatsReduction<float>;
extern template class StatsReduction<double>;

}  // namespace vpce::impl
