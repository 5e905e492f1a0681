#include "vpce/error.hpp"

#include <mpi.h>

#include <string>

namespace vpce {

Error::Error(const std::string& message, const std::string& where)
    : std::runtime_error("vpce: " + message + (where.empty() ? std::string() : " [" + where + "]")),
      m_message(message),
      m_where(where) {}

namespace impl {

std::string source_location(const char* file, int line) { return std::string(file) + ":" + std::to_string(line); }

void check_mpi(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string("MPI call failed: ") + call + ": " + std::string(text, len), source_location(file, line));
}

}  // namespace impl
}  // namespace vpce
