#pragma once
/// \file collective.hpp
/// \brief The MPI side: the datatype and user-defined op that merge RowStats records in one all-reduce,
/// and the built-in all-reduces of the seed strategy. Knows nothing about Kokkos kernels.

#include <mpi.h>

#include <cstdint>

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

/// Owns the contiguous datatype of RowStats<T> and the commutative op that applies merge().
template <class T>
class StatsReduction {
 public:
  StatsReduction();
  ~StatsReduction();
  StatsReduction(const StatsReduction&) = delete;
  StatsReduction& operator=(const StatsReduction&) = delete;

  /// In-place all-reduce of `count` records in host-accessible memory (split into calls of < 2^31).
  void allreduce(RowStats<T>* records, std::int64_t count, MPI_Comm comm) const;

 private:
  MPI_Datatype m_type = MPI_DATATYPE_NULL;
  MPI_Op m_op = MPI_OP_NULL;
};

/// In-place all-reduce of `count` scalars with a built-in op (split into calls of < 2^31).
template <class T>
void allreduce_builtin(T* data, std::int64_t count, MPI_Op op, MPI_Comm comm);

extern template class StatsReduction<float>;
extern template class StatsReduction<double>;

}  // namespace vpce::impl
