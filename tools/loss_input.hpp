#pragma once
/// \file loss_input.hpp
/// \brief `vpce loss`'s command line and the checks of its input file, apart from the computation (no Kokkos
/// here: the fuzz harness in fuzz/ compiles this with h5io.cpp and cli.cpp alone).

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "h5io.hpp"
#include "tool.hpp"
#include "vpce/communicator.hpp"
#include "vpce/dtype.hpp"
#include "vpce/options.hpp"

namespace vpce::tool {

extern const char* const loss_help;

/// The options `vpce loss` and `vpce linear` share: files, --grad, the partition and the library's training
/// options (vpce::Options).
struct LossOptions {
  bool help = false;
  std::string input, output;
  bool grad = false;
  Strategy strategy = Strategy::fused;
  bool quiet = false;
  bool have_partition = false;
  std::vector<std::int64_t> partition;
  std::string partition_text;  // as given, for messages
  // The library's training options (vpce::Options).
  std::int64_t ignore_index = -100;
  Reduction reduction = Reduction::none;
  double label_smoothing = 0, z_loss = 0, logit_scale = 1, softcap = 0;
};

struct LossConfig : LossOptions {
  bool lse = false;
  bool entropy = false, logprob = false, z_loss_out = false;  // the per-row outputs /entropy, /logprob, /z_loss
  double entropy_weight = 0;
  std::string mode = "fused";  // fused | stash | recompute
  std::string grad_dtype;      // "" (the compute type) | float32 | logits
};

/// The command-line specs of LossOptions' flags (--input, --output, --grad, --strategy, --partition,
/// --ignore-index, --reduction, --label-smoothing, --z-loss, --logit-scale, --softcap, --quiet).
std::vector<Args::Spec> loss_option_specs();
/// Reads LossOptions from parsed arguments (`args` was built with loss_option_specs() among its specs, and is
/// not a --help line), for `nranks` ranks; UsageError on a bad value. Not collective.
void parse_loss_options(const Args& args, int nranks, LossOptions* opt);
/// The library's options for them (Options::mode left at its default).
Options library_options(const LossOptions& opt);

/// `vpce loss`'s options (argv without the command), for `nranks` ranks; UsageError on a bad command line. Not
/// collective (every rank parses the same line alike). With -h/--help only `help` is set.
LossConfig parse_loss_args(const std::vector<std::string>& argv, int nranks);

/// What the input file holds, once checked.
struct LossInput {
  std::int64_t n = 0;           ///< tokens (rows)
  std::int64_t v = 0;           ///< vocabulary (columns)
  DType type = DType::float32;  ///< float32, float64, or 16-bit (uint16 bits with a dtype attribute)
  bool weights = false;         ///< the file has /weights (V class weights)
  bool probs = false;           ///< /target_probs (N x V) instead of /targets
};

/// Checks /logits and /targets from the file's metadata (existence, dimensions, types, the dtype attribute of
/// 16-bit logits, N agreeing; /weights, if there: V float32 or float64 values) and the --partition against V;
/// collective (errors agreed: vpce::Error, or UsageError for a --partition that does not add up to V, the same on every
/// rank). `file` names the input.
LossInput check_loss_input(const Communicator& comm, const H5File& in, const LossConfig& cfg);

/// "has shape 6 x 23 x 1 (3 dimensions)", "is a scalar", "is empty (a null dataspace, no elements)".
std::string shape_phrase(const DatasetInfo& info);
/// A dimension of the dataset is above 2^63 (it reads back negative).
bool huge(const DatasetInfo& info);

/// The floating-point type the dataset `name` (metadata `info`) of `in` holds: float32, float64, or uint16 bits
/// with a string attribute dtype = "bfloat16" or "float16". `err` gets a message if it is none of them.
DType stored_dtype(const H5File& in, const std::string& name, const DatasetInfo& info, std::string* err);

/// The first problem (empty if none) of the dataset /targets `ti` of `file`: missing, not a dataset, not 1-D, not
/// integers, or (when rows >= 0) not `rows` entries, the rows of `rows_of` (e.g. "/logits").
std::string targets_metadata_error(const std::string& file, const DatasetInfo& ti, std::int64_t rows,
                                   const std::string& rows_of);

/// UsageError (command `command`) when the --partition of `opt` does not add up to `v`, the `unit` ("columns",
/// "rows") of `dataset` in `file`. Overflow-safe. Nothing without --partition.
void check_partition_sum(const LossOptions& opt, std::int64_t v, const std::string& command, const std::string& unit,
                         const std::string& dataset, const std::string& file);

/// Whether a rank's memory of sum_k a_k * b_k * c_k bytes (every factor >= 0) reaches 2^62 bytes: an absurd
/// shape declared in a file is an error, not an overflowing size computation (saturating, never wraps).
bool too_large(std::initializer_list<std::array<std::int64_t, 3>> terms);

/// An error message (empty if none) when a rank's share of the logits, `n` rows of `max_cols` columns of
/// `elem_bytes` bytes (plus the gradient and the per-row arrays of a run) could not even be addressed: an absurd
/// shape declared in a file is an error, not an overflowing size computation. Not collective.
std::string size_error(const std::string& file, std::int64_t n, std::int64_t v, std::int64_t max_cols,
                       std::size_t elem_bytes);

/// The first target that is neither in [0, v) nor `ignore_index`, as a message naming `file`; empty if none.
std::string targets_error(const std::string& file, const std::int64_t* targets, std::int64_t n, std::int64_t v,
                          std::int64_t ignore_index);

}  // namespace vpce::tool
