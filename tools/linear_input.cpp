/// \file linear_input.cpp
/// \brief `vpce linear`: its command line and the checks of its input file (metadata, sizes).

#include "linear_input.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace vpce::tool {

const char* const linear_help =
    "Usage: mpirun -n W vpce linear --input IN.h5 --output OUT.h5 [--grad] [OPTIONS]\n"
    "\n"
    "The LM head fused with the loss (vpce::LinearCrossEntropy): logits = hidden x weight^T + bias, never held\n"
    "whole, computed chunk by chunk of rows, each rank for its own rows of the weight (its slice of the\n"
    "vocabulary). Needs vpce built with Kokkos Kernels. Reads from IN.h5 with parallel HDF5:\n"
    "  /hidden       N x H, float32, float64, or 16-bit: uint16 bits with a string attribute dtype = \"bfloat16\"\n"
    "                or \"float16\" (multiplied in float32): the tokens' last hidden states (every rank reads all\n"
    "                of it, or with --sequence-parallel an even share of its rows)\n"
    "  /weight       V x H, the same type: the output embedding (each rank reads only its own rows)\n"
    "  /bias         optional, V, the same type: the output bias (each rank reads only its own entries)\n"
    "  /targets      N, int64 (other integer types are converted): ids in [0, V) or the --ignore-index\n"
    "Writes OUT.h5 (in /hidden's type; float32 for 16-bit inputs):\n"
    "  /loss         --reduction none: N per-token losses (0 for ignored tokens); sum or mean: 1 value\n"
    "  /grad_hidden  with --grad, N x H: gradient of the sum of the per-token losses (none), or of the reduced\n"
    "                loss (sum, mean), with respect to /hidden\n"
    "  /grad_weight  with --grad, V x H: the same with respect to /weight (each rank writes its own rows)\n"
    "  /grad_bias    with --grad and /bias, V: the same with respect to /bias\n"
    "The loss of each token is `vpce loss`'s on the logits hidden x weight^T (see 'vpce loss --help' for the\n"
    "formula and the options). OUT.h5 is written under a temporary name in the same folder and renamed when\n"
    "complete; on an error it is not created (an existing one is left as it was).\n"
    "\n"
    "Options:\n"
    "  --input FILE          input HDF5 file (required)\n"
    "  --output FILE         output HDF5 file (required)\n"
    "  --grad                also write /grad_hidden and /grad_weight\n"
    "  --chunk-rows R        rows of logits computed at a time (R >= 0); 0 or absent: the library's default, the\n"
    "                        most rows whose logits (rows x the widest slice over the ranks) fit in 64 MiB\n"
    "  --sequence-parallel   each rank holds only an even share of the tokens' hidden states (the first N % W\n"
    "                        ranks one row more), all-gathered chunk by chunk (Megatron's sequence parallelism);\n"
    "                        the output is the same\n"
    "  --reduction R         none (default) | sum | mean (over the tokens not ignored)\n"
    "  --ignore-index I      default -100: tokens whose target is I get loss 0 and no gradient\n"
    "  --label-smoothing A   A in [0, 1], default 0\n"
    "  --z-loss Z            Z >= 0, default 0: adds Z * lse^2\n"
    "  --logit-scale S       S > 0, default 1: the logits are multiplied by S first\n"
    "  --softcap C           C >= 0, default 0 (off): x = C * tanh(x / C) after the scale\n"
    "  --strategy S          fused (one all-reduce per chunk, default) | seed (Megatron-LM's three)\n"
    "  --partition n0,n1,..  rows of /weight per rank (one size per rank, adding up to V; 0 is allowed);\n"
    "                        default: even, the first V % W ranks get one row more\n"
    "  --quiet               print nothing on success\n"
    "  -h, --help            this help\n";

LinearConfig parse_linear_args(const std::vector<std::string>& argv, int nranks) {
  std::vector<Args::Spec> specs = loss_option_specs();
  specs.push_back({"chunk-rows", true});
  specs.push_back({"sequence-parallel", false});
  Args args("linear", specs, argv);
  LinearConfig cfg;
  if (args.help()) {
    cfg.help = true;
    return cfg;
  }
  parse_loss_options(args, nranks, &cfg);
  cfg.chunk_rows = args.get_int("chunk-rows", 0, 0, std::numeric_limits<std::int64_t>::max());
  cfg.sequence_parallel = args.has("sequence-parallel");
  return cfg;
}

LinearInput check_linear_input(const Communicator& comm, const H5File& in, const LinearConfig& cfg) {
  // Metadata checks: every rank reads the same metadata; the decision is agreed all the same.
  const DatasetInfo hi = in.info("/hidden");
  const DatasetInfo wi = in.info("/weight");
  const DatasetInfo ti = in.info("/targets");
  const std::string& file = in.display_name();
  std::string err;
  auto check = [&](bool bad, const std::string& what) {
    if (err.empty() && bad) err = file + ": " + what;
  };
  LinearInput r;
  auto matrix = [&](const DatasetInfo& d, const std::string& name, const std::string& expected) {
    check(!d.exists, "no dataset " + name + " (expected " + expected + ")");
    check(d.exists && d.type_name == "not a dataset", name + " is not a dataset");
    check(d.dims.size() != 2, "dataset " + name + " " + shape_phrase(d) + "; expected 2 dimensions (" + expected + ")");
    check(huge(d), "dataset " + name + " has a dimension above 2^63");
  };
  // /weight and /bias hold /hidden's type (16-bit: uint16 with the same dtype attribute).
  auto same_type = [&](const DatasetInfo& d, const std::string& name) {
    if (!err.empty()) return;
    const DType t = stored_dtype(in, name, d, &err);
    check(t != r.type, "dataset " + name + " holds " + to_string(t) + " but /hidden holds " + to_string(r.type) +
                           "; they must have the same type");
  };
  matrix(hi, "/hidden", "N x H hidden states");
  if (err.empty()) r.type = stored_dtype(in, "/hidden", hi, &err);
  matrix(wi, "/weight", "V x H weight rows, of /hidden's type");
  same_type(wi, "/weight");
  if (err.empty() && hi.dims[1] != wi.dims[1])
    check(true, "dataset /weight has " + std::to_string(wi.dims[1]) + " columns but /hidden has " +
                    std::to_string(hi.dims[1]) + " (both must be the hidden size H)");
  check(err.empty() && hi.dims[1] == 0, "dataset /hidden has 0 columns; the hidden size must not be 0");
  check(err.empty() && wi.dims[0] == 0, "dataset /weight has 0 rows; the vocabulary must not be empty");
  const DatasetInfo bi = in.info("/bias");
  r.bias = bi.exists;
  if (r.bias) {
    check(bi.type_name == "not a dataset", "/bias is not a dataset");
    check(err.empty() && (bi.dims.size() != 1 || bi.dims[0] != wi.dims[0]),
          "dataset /bias " + shape_phrase(bi) + "; expected " + std::to_string(wi.dims[0]) +
              " values (one per row of /weight)");
    same_type(bi, "/bias");
  }
  if (err.empty()) err = targets_metadata_error(file, ti, hi.dims[0], "/hidden");
  agree(comm, err);
  r.n = hi.dims[0];
  r.h = hi.dims[1];
  r.v = wi.dims[0];
  check_partition_sum(cfg, r.v, "linear", "rows", "/weight", file);
  return r;
}

std::string linear_size_error(const std::string& file, std::int64_t n, std::int64_t h, std::int64_t v,
                              std::int64_t max_rows, std::int64_t chunk_rows, std::size_t elem_bytes) {
  // hidden + grad_hidden (and grad_hidden's host copy for the all-reduce), weight + grad_weight, one chunk of
  // logits (rows x the widest slice; the default chunk is at most 64 MiB), per row: target, loss, lse and the
  // collective's record (56 bytes at most).
  const std::int64_t e = static_cast<std::int64_t>(elem_bytes);
  const std::int64_t chunk = chunk_rows > 0 ? std::min(chunk_rows, n) : 0;
  if (too_large({{n, h, 3 * e}, {max_rows, h, 2 * e}, {chunk, max_rows, e}, {n, 56, 1}, {64 << 20, 1, 1}}))
    return file + ": datasets /hidden (" + std::to_string(n) + " x " + std::to_string(h) + ") and /weight (" +
           std::to_string(v) + " x " + std::to_string(h) + "): too large (" + std::to_string(max_rows) +
           " rows of /weight on one rank" + (chunk > 0 ? ", chunks of " + std::to_string(chunk) + " rows," : "") +
           " cannot be held in memory)";
  return {};
}

}  // namespace vpce::tool
