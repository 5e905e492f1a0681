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
constexpr int exchange_tag = 0x7ce5;  // on vpce's own duplicate of the communicator

void wait_all(std::vector<MPI_Request>* pending) {
  if (pending->empty()) return;
  VPCE_MPI_CHECK(MPI_Waitall(static_cast<int>(pending->size()), pending->data(), MPI_STATUSES_IGNORE));
  pending->clear();
}
}  // namespace

template <class T>
void StartedReduction<T>::finish() {
  wait_all(&m_requests);
  if (m_received.empty()) return;
  // Every rank's records merged in rank order (the same bits on every rank): rank 0's, then 1's into them...
  const std::int64_t values = m_count * m_layout.width();
  auto of_rank = [&](int r) -> T* {
    if (r == m_rank) return m_records;
    return m_received.data() + std::int64_t(r < m_rank ? r : r - 1) * values;
  };
  T* const merged = of_rank(0);  // rank 0's records, merged into where they are
  for (int r = 1; r < m_ranks; ++r) {
    for (std::int64_t done = 0; done < m_count; done += max_count) {
      const auto off = done * m_layout.width();
      merge_records(of_rank(r) + off, merged + off, int(std::min(max_count, m_count - done)), m_layout);
    }
  }
  if (merged != m_records) std::copy(merged, merged + values, m_records);
  m_received.clear();
}

template <class T>
StatsReduction<T>::StatsReduction(RecordLayout layout, int exchange_ranks)
    : m_layout(layout), m_exchange_ranks(exchange_ranks) {
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
  // Through start(): every block of a call, blocking or not, goes through the same mechanism (and so the
  // same merge order across ranks).
  start(records, count, comm).finish();
}

template <class T>
StartedReduction<T> StatsReduction<T>::start(T* records, std::int64_t count, MPI_Comm comm) const {
  StartedReduction<T> s;
  s.m_records = records;
  s.m_count = count;
  s.m_layout = m_layout;
  VPCE_MPI_CHECK(MPI_Comm_rank(comm, &s.m_rank));
  VPCE_MPI_CHECK(MPI_Comm_size(comm, &s.m_ranks));
  if (s.m_ranks == 1 || count == 0) return s;
  const std::int64_t w = m_layout.width();
  if (s.m_ranks <= m_exchange_ranks) {
    s.m_received.resize(std::size_t(s.m_ranks - 1) * std::size_t(count * w));
    for (int r = 0, slot = 0; r < s.m_ranks; ++r) {
      if (r == s.m_rank) continue;
      T* in = s.m_received.data() + std::int64_t(slot++) * count * w;
      for (std::int64_t done = 0; done < count; done += max_count) {
        const int n = static_cast<int>(std::min(max_count, count - done));
        s.m_requests.push_back(MPI_REQUEST_NULL);
        VPCE_MPI_CHECK(MPI_Irecv(in + done * w, n, m_type, r, exchange_tag, comm, &s.m_requests.back()));
        s.m_requests.push_back(MPI_REQUEST_NULL);
        VPCE_MPI_CHECK(MPI_Isend(records + done * w, n, m_type, r, exchange_tag, comm, &s.m_requests.back()));
      }
    }
    return s;
  }
  for (std::int64_t done = 0; done < count; done += max_count) {
    const int n = static_cast<int>(std::min(max_count, count - done));
    s.m_requests.push_back(MPI_REQUEST_NULL);
    VPCE_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, records + done * w, n, m_type, m_op, comm, &s.m_requests.back()));
  }
  return s;
}

template <class T>
void allreduce_builtin(T* data, std::int64_t count, MPI_Op op, MPI_Comm comm) {
  for (std::int64_t done = 0; done < count; done += max_count) {
    const int n = static_cast<int>(std::min(max_count, count - done));
    VPCE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + done, n, mpi_datatype<T>(), op, comm));
  }
}

template class StartedReduction<float>;
template class StartedReduction<double>;
template class StatsReduction<float>;
template class StatsReduction<double>;
template void allreduce_builtin<float>(float*, std::int64_t, MPI_Op, MPI_Comm);
template void allreduce_builtin<double>(double*, std::int64_t, MPI_Op, MPI_Comm);
template void allreduce_builtin<std::int64_t>(std::int64_t*, std::int64_t, MPI_Op, MPI_Comm);

}  // namespace vpce::impl
