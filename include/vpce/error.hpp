#pragma once
/// \file error.hpp
/// \brief vpce's exception type and the argument-check macro.

#include <stdexcept>
#include <string>

namespace vpce {

/// Thrown for every bad input and every MPI failure. Collective calls throw it on every rank of the
/// communicator with the same message, so a caller can catch it without desynchronising the ranks.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace impl {
[[noreturn]] void throw_error(const std::string& msg, const char* file, int line);
/// Throws unless the MPI call returned MPI_SUCCESS.
void check_mpi(int rc, const char* call, const char* file, int line);
}  // namespace impl

}  // namespace vpce

/// Throws vpce::Error with the message and the source location when `cond` is true.
#define VPCE_THROW_IF(cond, msg)                                    \
  do {                                                              \
    if (cond) ::vpce::impl::throw_error((msg), __FILE__, __LINE__); \
  } while (0)

#define VPCE_MPI_CHECK(call) ::vpce::impl::check_mpi((call), #call, __FILE__, __LINE__)
