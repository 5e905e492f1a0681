#pragma once
/// \file communicator.hpp
/// \brief The MPI communicator vpce works on: a duplicate of the user's, freed when the last copy goes.

#include <mpi.h>

#include <cstdint>
#include <functional>
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

  /// What agree() found. failed(): some rank passed an error, or a MustMatch value differs between ranks.
  struct Agreement {
    int rank = -1;            ///< the lowest rank that passed an error, -1 when none did
    bool everywhere = false;  ///< every rank passed one
    std::string message;      ///< that rank's message; or which MustMatch value differs; empty: all is well
    bool failed() const noexcept { return !message.empty(); }
    /// The message as every rank reports it: tagged with the rank that found it unless every rank did.
    std::string text() const;
  };
  /// How a rank waits for agree()'s exchange: MPI_Wait by default. (The `vpce` tool waits a bounded time on a
  /// rank that failed, then ends the job: the others may be stuck in a collective that rank left.)
  using Wait = std::function<void(MPI_Request*)>;

  /// Collective agreement on errors found by some ranks only, and on values that must be equal on every
  /// rank: one small all-reduce (and, on the error path only, two broadcasts of the message). Every rank
  /// passes its own message (empty when it found nothing) and gets the same Agreement: the message of the
  /// lowest rank that found one, else the first MustMatch value that differs. The one place where vpce's
  /// ranks agree on an error, so that all ranks fail alike and none is left waiting in a collective the
  /// others skipped.
  Agreement agree(const std::string& local_error, std::initializer_list<MustMatch> must_match = {},
                  const Wait& wait = {}) const;
  /// agree(), then, if it failed, throws vpce::Error(text()) on every rank.
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
