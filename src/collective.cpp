#include "vpce/impl/collective.hpp"

#include <algorithm>
#include <climits>

#include "vpce/error.hpp"
#include "vpce/impl/status.hpp"

namespace vpce::impl {

namespace {
template <class T, bool Probs, bool Entropy>
void merge_op(void* in, void* inout, int* len, MPI_Datatype*) {
  merge_records(static_cast<const T*>(in), static_cast<T*>(inout), *len, RecordLayout{Probs, Entropy});
}
template <class T>
MPI_User_function* merge_op_for(RecordLayout l) {
  if (l.probs) return l.entropy ? &merge_op<T, true, true> : &merge_op<T, true, false>;
  return l.entropy ? &merge_op<T, false, true> : &merge_op<T, false, false>;
}
constexpr std::int64_t max_count = INT_MAX / 4;
}  // namespace

template <class T>
StatsReduction<T>::StatsReduction(RecordLayout layout) : m_layout(layout) {
  VPCE_MPI_CHECK(MPI_Type_contiguous(layout.width(), mpi_datatype<T>(), &m_type));
  VPCE_MPI_CHECK(MPI_Type_commit(&m_type));
  VPCE_MPI_CHECK(MPI_Op_create(merge_op_for<T>(layout), /*commute=*/1, &m_op));
}

template <class T>
StatsReduction<T>::~StatsReduction() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (m_op != MPI_OP_NULL) MPI_Op_free(&m_op);
  if (m_type != MPI_DATATYPE_NULL) MPI_Type_free(&m_type);
}

template <class T>
void StatsReduction<T>::allreduce(T* records, std::int64_t count, MPI_Comm comm) const {
  // Through start(): every block of a call, blocking or not, goes through the same MPI collective (and so
  // the same merge order across ranks).
  std::vector<MPI_Request> pending;
  start(records, count, comm, &pending);
  wait_all(&pending);
}

template <class T>
void StatsReduction<T>::start(T* records, std::int64_t count, MPI_Comm comm,
                              std::vector<MPI_Request>* pending) const {
  for (std::int64_t done = 0; done < count; done += max_count) {
    const int n = static_cast<int>(std::min(max_count, count - done));
    pending->push_back(MPI_REQUEST_NULL);
    VPCE_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, records + done * m_layout.width(), n, m_type, m_op, comm, &pending->back()));
  }
}

void wait_all(std::vector<MPI_Request>* pending) {
  if (pending->empty()) return;
  VPCE_MPI_CHECK(MPI_Waitall(static_cast<int>(pending->size()), pending->data(), MPI_STATUSES_IGNORE));
  pending->clear();
}

template <class T>
void allreduce_builtin(T* data, std::int64_t count, MPI_Op op, MPI_Comm comm) {
  for (std::int64_t done = 0; done < count; done += max_count) {
    const int n = static_cast<int>(std::min(max_count, count - done));
    VPCE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + done, n, mpi_datatype<T>(), op, comm));
  }
}

template class StatsReduction<float>;
template class StatsReduction<double>;
template void allreduce_builtin<float>(float*, std::int64_t, MPI_Op, MPI_Comm);
template void allreduce_builtin<double>(double*, std::int64_t, MPI_Op, MPI_Comm);
template void allreduce_builtin<std::int64_t>(std::int64_t*, std::int64_t, MPI_Op, MPI_Comm);

}  // namespace vpce::impl
