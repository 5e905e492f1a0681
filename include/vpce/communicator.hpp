#pragma once
/// \file communicator.hpp
/// \brief The MPI communicator vpce works on: a duplicate of the user's, freed when the last copy goes.

#include <mpi.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

namespace vpce {

/// A duplicate of the caller's communicator (so vpce's messages never mix with the application's), with
/// its rank and size cached. Copies share the one duplicate; it is freed with the last copy (unless MPI
/// is already finalized). MPI errors on it are returned, and vpce turns them into vpce::Error.
class Communicator {
 public:
  explicit Communicator(MPI_Comm comm);

  MPI_Comm comm() const noexcept { return m_state->comm; }
  int rank() const noexcept { return m_state->rank; }
  int size() const noexcept { return m_state->size; }

  /// A value every rank must have the same of, checked by agree_or_throw.
  struct MustMatch {
    const char* what;
    std::int64_t value;
  };

  /// Collective agreement (one small all-reduce) on errors found by some ranks only, and on values that
  /// must be equal on every rank. Every rank passes its own message (empty when it found nothing); if any
  /// rank found one, every rank throws vpce::Error with the message of the lowest such rank; otherwise, if
  /// a MustMatch value differs between ranks, every rank throws naming it. So all ranks fail alike and
  /// none is left waiting in a collective the others skipped.
  void agree_or_throw(const std::string& local_error, std::initializer_list<MustMatch> must_match = {}) const;

 private:
  struct State {
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0;
    int size = 1;
    ~State();
  };
  std::shared_ptr<State> m_state;
};

}  // namespace vpce
