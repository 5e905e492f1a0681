#pragma once
/// \file linear_input.hpp
/// \brief `vpce linear`'s command line and the checks of its input file, apart from the computation (no Kokkos
/// here: the fuzz harness in fuzz/ compiles this with loss_input.cpp, h5io.cpp and cli.cpp alone).

#include <cstdint>
#include <string>
#include <vector>

#include "h5io.hpp"
#include "loss_input.hpp"
#include "tool.hpp"
#include "vpce/communicator.hpp"
#include "vpce/dtype.hpp"

namespace vpce::tool {

extern const char* const linear_help;

/// `vpce linear`'s options: `vpce loss`'s shared ones (LossOptions), the rows per chunk and the input's layout.
struct LinearConfig : LossOptions {
  std::int64_t chunk_rows = 0;     ///< 0: the library's default (LinearOptions)
  bool sequence_parallel = false;  ///< each rank reads (and gets the gradient of) an even share of /hidden's rows
};

/// `vpce linear`'s options (argv without the command), for `nranks` ranks; UsageError on a bad command line. Not
/// collective. With -h/--help only `help` is set.
LinearConfig parse_linear_args(const std::vector<std::string>& argv, int nranks);

/// What the input file of `vpce linear` holds, once checked.
struct LinearInput {
  std::int64_t n = 0;           ///< tokens (rows of /hidden)
  std::int64_t h = 0;           ///< hidden size (columns of /hidden and /weight)
  std::int64_t v = 0;           ///< vocabulary (rows of /weight)
  DType type = DType::float32;  ///< of /hidden, /weight and /bias
  bool bias = false;            ///< the file has /bias (V values)
};

/// Checks /hidden (N x H), /weight (V x H, the same type), the optional /bias (V, the same type) and /targets (N,
/// integers) from the file's metadata and
/// the --partition against V; collective (errors agreed: vpce::Error, or UsageError for a --partition that does
/// not add up to V, the same on every rank).
LinearInput check_linear_input(const Communicator& comm, const H5File& in, const LinearConfig& cfg);

/// An error message (empty if none) when a rank's memory for `vpce linear` (hidden and its gradient N x H, its
/// weight rows and their gradient max_rows x H, one chunk of logits, the per-row arrays) could not even be
/// addressed. `chunk_rows` as given (0: the library's default). Not collective.
std::string linear_size_error(const std::string& file, std::int64_t n, std::int64_t h, std::int64_t v,
                              std::int64_t max_rows, std::int64_t chunk_rows, std::size_t elem_bytes);

}  // namespace vpce::tool
