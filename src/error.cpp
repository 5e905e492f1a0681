#include "vpce/error.hpp"

#include <mpi.h>

#include <string>

namespace vpce::impl {

void throw_error(const std::string& msg, const char* file, int line) {
  throw Error("vpce: " + msg + " [" + file + ":" + std::to_string(line) + "]");
}

void check_mpi(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw_error(std::string("MPI call failed: ") + call + ": " + std::string(text, len), file, line);
}

}  // namespace vpce::impl
