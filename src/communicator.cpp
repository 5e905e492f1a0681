#include "vpce/communicator.hpp"

#include <string>
#include <vector>

#include "vpce/error.hpp"

namespace vpce {

Communicator::Communicator(MPI_Comm comm) : m_state(std::make_shared<State>()) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  VPCE_THROW_IF(!initialized, "MPI must be initialized before a vpce::Communicator is made");
  VPCE_THROW_IF(comm == MPI_COMM_NULL, "the communicator is MPI_COMM_NULL");
  VPCE_MPI_CHECK(MPI_Comm_dup(comm, &m_state->comm));
  MPI_Comm_set_errhandler(m_state->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(m_state->comm, &m_state->rank);
  MPI_Comm_size(m_state->comm, &m_state->size);
}

Communicator::State::~State() {
  if (comm == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm);
}

Communicator::Agreement Communicator::agree(const std::string& local_error, std::initializer_list<MustMatch> must_match,
                                            const Wait& wait) const {
  // One MAX all-reduce carries: -(lowest rank with an error), whether some rank found none, and (v, -v)
  // for each value to match.
  std::vector<std::int64_t> in{-static_cast<std::int64_t>(local_error.empty() ? size() : rank()),
                               local_error.empty() ? 1 : 0};
  for (const auto& m : must_match) {
    in.push_back(m.value);
    in.push_back(-m.value);
  }
  std::vector<std::int64_t> out(in.size());
  MPI_Request request = MPI_REQUEST_NULL;
  const std::int64_t* const in_data = in.data();  // typed as int64_t for clang-tidy's mpi-type-mismatch
  std::int64_t* const out_data = out.data();
  VPCE_MPI_CHECK(
      MPI_Iallreduce(in_data, out_data, static_cast<int>(in.size()), MPI_INT64_T, MPI_MAX, comm(), &request));
  if (wait)
    wait(&request);
  else
    VPCE_MPI_CHECK(MPI_Wait(&request, MPI_STATUS_IGNORE));
  Agreement a;
  const int first = static_cast<int>(-out[0]);
  if (first < size()) {
    int len = static_cast<int>(local_error.size());
    VPCE_MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, first, comm()));
    a.message = local_error;
    a.message.resize(len);
    VPCE_MPI_CHECK(MPI_Bcast(a.message.data(), len, MPI_CHAR, first, comm()));
    a.rank = first;
    a.everywhere = out[1] == 0;
    return a;
  }
  std::size_t k = 2;
  for (const auto& m : must_match) {
    const std::int64_t hi = out[k], lo = -out[k + 1];
    k += 2;
    if (hi != lo) {
      a.message = std::string(m.what) + " differs between ranks (from " + std::to_string(lo) + " to " +
                  std::to_string(hi) + ")";
      a.everywhere = true;
      return a;
    }
  }
  return a;
}

std::string Communicator::Agreement::text() const {
  return everywhere || rank < 0 ? message : message + " (found on rank " + std::to_string(rank) + ")";
}

void Communicator::agree_or_throw(const std::string& local_error, std::initializer_list<MustMatch> must_match) const {
  const Agreement a = agree(local_error, must_match);
  if (a.failed()) throw Error(a.text());
}

}  // namespace vpce
