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

/// Owns the contiguous datatype of one record (layout.width() values of T) and the commutative op that
/// applies merge_records() (status.hpp) for that layout (an op function per layout: MPI gives it no state).
template <class T>
class StatsReduction {
 public:
  explicit StatsReduction(RecordLayout layout);
  ~StatsReduction();
  StatsReduction(const StatsReduction&) = delete;
  StatsReduction& operator=(const StatsReduction&) = delete;

  /// In-place all-reduce of `count` records (count x width values) in host-accessible memory: start() then wait_all().
  void allreduce(T* records, std::int64_t count, MPI_Comm comm) const;

  /// The same, non-blocking (MPI_Iallreduce, split into calls of < 2^31 records): the requests are appended
  /// to `pending`; `records` must not be touched until wait_all(pending) returns. Every rank must start its
  /// all-reduces in the same order.
  void start(T* records, std::int64_t count, MPI_Comm comm, std::vector<MPI_Request>* pending) const;
  int width() const noexcept { return m_layout.width(); }
  RecordLayout layout() const noexcept { return m_layout; }

 private:
  RecordLayout m_layout;
  MPI_Datatype m_type = MPI_DATATYPE_NULL;
  MPI_Op m_op = MPI_OP_NULL;
};

/// Completes the requests of StatsReduction::start (and empties `pending`).
void wait_all(std::vector<MPI_Request>* pending);

/// In-place all-reduce of `count` scalars with a built-in op (split into calls of < 2^31).
template <class T>
void allreduce_builtin(T* data, std::int64_t count, MPI_Op op, MPI_Comm comm);

extern template class StatsReduction<float>;
extern template class StatsReduction<double>;

}  // namespace vpce::impl
