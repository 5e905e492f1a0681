#pragma once
/// \file collective.hpp
/// \brief The MPI side: the datatype and user-defined op that merge RowStats records in one all-reduce,
/// the built-in all-reduces of the seed strategy, and the call status that rides in a call's first
/// collective. Knows nothing about Kokkos kernels.

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

// ---------------------------------------------------------------------------------------------------------
// The call status: what the ranks must agree on before any result of a collective call is used.

/// Whether this rank's inputs passed its local checks (shapes, targets, grad_loss, ...), and the values that
/// must be equal on every rank. It travels INSIDE the first collective of a call, so an error-free call
/// makes no MPI call for it: as `status_size` values of the compute type, each an integer of at most 21
/// bits (exact in float), combined across ranks by max: [error, N in 3 chunks, -(N's chunks), the checksum
/// in 3 chunks, -(its chunks)]. After the max, every rank holds the same values and so takes the same
/// branch: when some rank found an error or N or the checksum differ (max != -max(-x) for a chunk), every
/// rank goes on to Communicator::agree_or_throw, which builds the message (the error path only).
struct CallStatus {
  bool error = false;         ///< this rank's inputs failed a local check
  std::int64_t n_rows = 0;    ///< N, >= 0
  std::int64_t checksum = 0;  ///< of the targets, >= 0
};

inline constexpr int status_size = 13;

template <class T>
void encode_status(const CallStatus& s, T* out) {
  constexpr std::int64_t mask = (std::int64_t(1) << 21) - 1;
  out[0] = s.error ? T(1) : T(0);
  for (int k = 0; k < 3; ++k) {
    const T n = T((s.n_rows >> (21 * k)) & mask), c = T((s.checksum >> (21 * k)) & mask);
    out[1 + k] = n;
    out[4 + k] = -n;
    out[7 + k] = c;
    out[10 + k] = -c;
  }
}

/// On the merged values: true when some rank found an error or the ranks' N or checksums differ.
template <class T>
bool status_needs_agreement(const T* merged) {
  if (merged[0] != T(0)) return true;
  for (int k = 0; k < 3; ++k) {
    if (merged[1 + k] != -merged[4 + k] || merged[7 + k] != -merged[10 + k]) return true;
  }
  return false;
}

/// The status as trailing RowStats records of the fused strategy's first all-reduce: three values per
/// record in (m, t, a), marked by s = -1 (a real record's sum of exp is >= 0 or NaN), which the merge op
/// combines field by field with max.
inline constexpr int status_records = (status_size + 2) / 3;

template <class T>
void encode_status_records(const CallStatus& s, RowStats<T>* out) {
  T v[3 * status_records] = {};
  encode_status(s, v);
  for (int r = 0; r < status_records; ++r) out[r] = {v[3 * r], T(-1), v[3 * r + 1], v[3 * r + 2]};
}

template <class T>
bool status_records_need_agreement(const RowStats<T>* merged) {
  T v[3 * status_records];
  for (int r = 0; r < status_records; ++r) {
    v[3 * r] = merged[r].m;
    v[3 * r + 1] = merged[r].t;
    v[3 * r + 2] = merged[r].a;
  }
  return status_needs_agreement(v);
}

/// The seed strategy's first MAX all-reduce covers the row max of rows [0, min(N, seed_head_rows)), padded
/// with -inf to seed_head_rows entries, then the status: its size never depends on N, so ranks that
/// disagree on N still make matching calls. Rows beyond it go in a second MAX (N > seed_head_rows only).
inline constexpr std::int64_t seed_head_rows = 8192;

// ---------------------------------------------------------------------------------------------------------

/// Owns the contiguous datatype of RowStats<T> and the commutative op that applies merge() (and the
/// fieldwise max to status records).
template <class T>
class StatsReduction {
 public:
  StatsReduction();
  ~StatsReduction();
  StatsReduction(const StatsReduction&) = delete;
  StatsReduction& operator=(const StatsReduction&) = delete;

  /// In-place all-reduce of `count` records in host-accessible memory: start() then wait_all().
  void allreduce(RowStats<T>* records, std::int64_t count, MPI_Comm comm) const;

  /// The same, non-blocking (MPI_Iallreduce, split into calls of < 2^31 records): the requests are appended
  /// to `pending`; `records` must not be touched until wait_all(pending) returns. Every rank must start its
  /// all-reduces in the same order.
  void start(RowStats<T>* records, std::int64_t count, MPI_Comm comm, std::vector<MPI_Request>* pending) const;

 private:
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
