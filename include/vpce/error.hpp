#pragma once
/// \file error.hpp
/// \brief vpce's exception type and the two throw macros (the only ways the library builds one).

#include <stdexcept>
#include <string>

namespace vpce {

/// Thrown for every bad input and every MPI failure. Collective calls throw it on every rank of the
/// communicator with the same message, so a caller can catch it without desynchronising the ranks.
///
/// message(): what went wrong, one line, without any prefix; where(): the source location that raised it
/// ("file:line"), empty for an error the ranks agreed on (Communicator::agree). what() is
/// "vpce: <message> [<where>]", formatted here and nowhere else.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, const std::string& where = {});
  const std::string& message() const noexcept { return m_message; }
  const std::string& where() const noexcept { return m_where; }

 private:
  std::string m_message;
  std::string m_where;
};

namespace impl {
/// "file:line" of a throw site.
std::string source_location(const char* file, int line);
/// Throws unless the MPI call returned MPI_SUCCESS.
void check_mpi(int rc, const char* call, const char* file, int line);
}  // namespace impl

}  // namespace vpce

/// Throws vpce::Error with the message and the source location when `cond` is true.
#define VPCE_THROW_IF(cond, msg)                                                             \
  do {                                                                                       \
    if (cond) throw ::vpce::Error((msg), ::vpce::impl::source_location(__FILE__, __LINE__)); \
  } while (0)

/// Throws vpce::Error naming the call and MPI's error text unless `call` returns MPI_SUCCESS.
#define VPCE_MPI_CHECK(call) ::vpce::impl::check_mpi((call), #call, __FILE__, __LINE__)
