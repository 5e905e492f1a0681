// A user's translation unit: what including <vpce/vpce.hpp> brings in is checked by check_include_graph.py
// (the vpce_include_graph test). It must compile and link against the library's explicit instantiations.
#include <vpce/vpce.hpp>

int vpce_include_graph_user(MPI_Comm comm) {
  const vpce::Communicator c(comm);
  const auto part = vpce::VocabPartition::even(8, c);
  vpce::CrossEntropy<float> ce(c, part);
  return static_cast<int>(ce.block_rows() > 0);
}
