/// \file loss_input.cpp
/// \brief `vpce loss`: its command line and the checks of its input file (metadata, sizes, targets).

#include "loss_input.hpp"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "vpce/error.hpp"

namespace vpce::tool {

const char* const loss_help =
    "Usage: mpirun -n W vpce loss --input IN.h5 --output OUT.h5 [--grad] [OPTIONS]\n"
    "\n"
    "Reads /logits (N x V) and /targets (N, int64; other integer types are converted) from IN.h5 with parallel\n"
    "HDF5, each rank only its own columns of the logits. /logits is float32, float64, or 16-bit: uint16 bit\n"
    "patterns with a string attribute dtype = \"bfloat16\" or \"float16\" (computed in float32). Writes OUT.h5:\n"
    "  /loss         --reduction none: N per-token losses (0 for ignored tokens); sum or mean: 1 value, the\n"
    "                reduced loss. float64 for float64 logits, else float32\n"
    "  /grad_logits  with --grad, N x V: the gradient of the sum of the per-token losses (none), or of the\n"
    "                reduced loss (sum, mean); its type: see --grad-dtype\n"
    "  /lse          with --lse, N: each row's log-sum-exp over the whole vocabulary (of the transformed\n"
    "                logits), in /loss's type\n"
    "  /entropy      with --entropy, N: each row's entropy H = lse - sum_j softmax_j x_j of the softmax over the\n"
    "                whole vocabulary (ignored rows too), in /loss's type\n"
    "  /logprob      with --logprob, N: the target's log-softmax x_t - lse (0 for ignored rows)\n"
    "  /z_loss       with --z-loss-out, N: each row's z-loss term Z * lse^2, already in /loss (0 if ignored)\n"
    "Instead of /targets, IN.h5 may hold /target_probs: N x V target probabilities (distillation's soft labels)\n"
    "in the logits' type (16-bit: with the same dtype attribute), each row >= 0 and summing to 1 (within 1e-4;\n"
    "1e-2 for bfloat16, 2e-3 for float16), each rank reading its own columns. The loss of a token is then\n"
    "-sum_j c_j log softmax_j, c = (1 - A) q + A / V (times w with /weights); every token counts (no ignore\n"
    "index; --reduction mean divides by N); /logprob cannot be written.\n"
    "An optional dataset /weights in IN.h5 (V values, float32 or float64, finite and >= 0; each rank reads its\n"
    "own columns) holds class weights w, PyTorch's `weight`: the loss below becomes\n"
    "  (1 - A) w_t (lse - x_t) + A / V (W lse - sum_j w_j x_j) + Z * lse^2 + B * H,   W = sum_j w_j\n"
    "and --reduction mean divides by the sum of w_t over the tokens not ignored.\n"
    "OUT.h5 is written under a temporary name in the same folder and renamed when complete; on an error it is\n"
    "not created (an existing one is left as it was).\n"
    "\n"
    "Per token, with z its logits, x = S * z, then x = C * tanh(x / C) if C > 0 (a -inf logit stays -inf),\n"
    "lse = log(sum_j exp(x_j)) over the whole vocabulary, t the target:\n"
    "  loss = lse - (1 - A) * x_t - A * mean_j(x_j) + Z * lse^2 + B * H     (0 if t is the ignore index)\n"
    "  d/dz_j = (softmax_j * (1 + 2 Z lse + B (mu - x_j)) - (1 - A) [j = t] - A / V) * dx_j/dz_j  (0 if ignored)\n"
    "with mu = sum_j softmax_j x_j, H = lse - mu the entropy, and A, Z, B, S, C the values of\n"
    "--label-smoothing, --z-loss, --entropy-weight, --logit-scale, --softcap; the gradient is\n"
    "divided by the number of tokens not ignored for --reduction mean. The same for any number of ranks,\n"
    "partition, strategy and mode.\n"
    "\n"
    "Options:\n"
    "  --input FILE          input HDF5 file (required)\n"
    "  --output FILE         output HDF5 file (required)\n"
    "  --grad                also write /grad_logits\n"
    "  --grad-dtype D        /grad_logits' type (with --grad): float32 | logits: the logits' own type (16-bit\n"
    "                        logits: uint16 bits with the same dtype attribute). Default: float32, float64 for\n"
    "                        float64 logits (a float64 gradient written as float32 is rounded on the way)\n"
    "  --lse                 also write /lse\n"
    "  --reduction R         none (default) | sum: the sum of the per-token losses | mean: that sum divided by\n"
    "                        the number of tokens not ignored (loss and gradient 0 if every token is ignored)\n"
    "  --ignore-index I      tokens whose target is I get loss 0 and a zero gradient row and do not count in\n"
    "                        the mean; default -100 (PyTorch's). Other targets must be in [0, V)\n"
    "  --label-smoothing A   A in [0, 1], default 0: the target distribution is (1 - A) * one-hot + A / V over\n"
    "                        the whole vocabulary (PyTorch's meaning)\n"
    "  --z-loss Z            Z >= 0, default 0: adds Z * lse^2 to each token's loss (PaLM's z-loss)\n"
    "  --entropy-weight B    finite, default 0: adds B * H (the entropy) to each token's loss before the\n"
    "                        reduction; B < 0 is an entropy bonus\n"
    "  --entropy             also write /entropy\n"
    "  --logprob             also write /logprob\n"
    "  --z-loss-out          also write /z_loss\n"
    "  --logit-scale S       S > 0, default 1: the logits are multiplied by S first\n"
    "  --softcap C           C >= 0, default 0 (off): soft-capping x = C * tanh(x / C) after the scale (Gemma's)\n"
    "  --strategy S          fused (one all-reduce, default) | seed (Megatron-LM's three all-reduces)\n"
    "  --mode M              fused: loss and gradient in one call (default) | stash: forward keeps the softmax,\n"
    "                        then backward | recompute: forward keeps log-sum-exp, backward recomputes\n"
    "                        (without --grad only the forward runs)\n"
    "  --partition n0,n1,..  columns per rank (one size per rank, adding up to V; 0 is allowed);\n"
    "                        default: even, the first V % W ranks get one column more\n"
    "  --quiet               print nothing on success\n"
    "  -h, --help            this help\n";

namespace {

std::vector<std::int64_t> parse_partition(const Args& args, const std::string& text) {
  std::vector<std::int64_t> sizes;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || end == item.c_str() || *end != '\0' || errno == ERANGE || v < 0)
      args.usage_error("--partition " + text + ": '" + item + "' is not a column count (an integer >= 0)");
    sizes.push_back(v);
  }
  if (!text.empty() && text.back() == ',') args.usage_error("--partition " + text + ": a size is missing at the end");
  return sizes;
}

std::string dimensions(std::size_t n) { return std::to_string(n) + (n == 1 ? " dimension" : " dimensions"); }

}  // namespace

std::string shape_phrase(const DatasetInfo& info) {
  if (info.null_space) return "is empty (a null dataspace, no elements)";
  if (info.dims.empty()) return "is a scalar";
  return "has shape " + shape_string(info.dims) + " (" + dimensions(info.dims.size()) + ")";
}

bool huge(const DatasetInfo& info) {
  for (auto d : info.dims)
    if (d < 0) return true;  // above 2^63 in the file
  return false;
}

DType stored_dtype(const H5File& in, const std::string& name, const DatasetInfo& info, std::string* err) {
  const std::string& file = in.display_name();
  const std::string expected =
      "expected float32 or float64, or uint16 bits with a string attribute dtype = \"bfloat16\" or \"float16\"";
  if (info.kind == DatasetInfo::Kind::floating && info.type_size == 4) return DType::float32;
  if (info.kind == DatasetInfo::Kind::floating && info.type_size == 8) return DType::float64;
  if (info.type_name != "uint16") {
    *err = file + ": dataset " + name + " has type " + info.type_name + "; " + expected;
    return DType::float32;
  }
  const AttributeInfo a = in.attribute(name, "dtype");
  if (!a.exists) {
    *err = file + ": dataset " + name +
           " is uint16 but has no attribute dtype; expected dtype = \"bfloat16\" or \"float16\" (16-bit values), "
           "or float32 or float64";
  } else if (!a.is_string) {
    *err = file + ": dataset " + name + " (uint16): attribute dtype is " + a.type_name +
           ", not a string; expected \"bfloat16\" or \"float16\"";
  } else if (a.value == "bfloat16") {
    return DType::bfloat16;
  } else if (a.value == "float16") {
    return DType::float16;
  } else {
    *err = file + ": dataset " + name + " (uint16): attribute dtype is \"" + a.value +
           "\"; expected \"bfloat16\" or \"float16\"";
  }
  return DType::float32;
}

std::vector<Args::Spec> loss_option_specs() {
  return {{"input", true},     {"output", true},       {"grad", false},     {"strategy", true},
          {"partition", true}, {"ignore-index", true}, {"reduction", true}, {"label-smoothing", true},
          {"z-loss", true},    {"logit-scale", true},  {"softcap", true},   {"quiet", false}};
}

void parse_loss_options(const Args& args, int nranks, LossOptions* opt) {
  LossOptions& cfg = *opt;
  cfg.input = args.required("input");
  cfg.output = args.required("output");
  cfg.grad = args.has("grad");
  cfg.strategy = args.get_choice("strategy", "fused", {"fused", "seed"}) == "seed" ? Strategy::seed : Strategy::fused;
  cfg.quiet = args.has("quiet");
  cfg.ignore_index = args.get_int("ignore-index", -100, std::numeric_limits<std::int64_t>::min(),
                                  std::numeric_limits<std::int64_t>::max());
  const std::string reduction = args.get_choice("reduction", "none", {"none", "sum", "mean"});
  cfg.reduction = reduction == "sum" ? Reduction::sum : reduction == "mean" ? Reduction::mean : Reduction::none;
  // The library checks these too (vpce::Error on every rank); here they are command-line errors.
  auto real = [&](const char* name, double fallback, bool ok(double), const char* want) {
    const double x = args.get_double(name, fallback);
    if (!ok(x)) args.usage_error(std::string("--") + name + " " + args.get(name) + ": must be " + want);
    return x;
  };
  cfg.label_smoothing = real(
      "label-smoothing", 0, [](double x) { return x >= 0 && x <= 1; }, "in [0, 1]");
  cfg.z_loss = real(
      "z-loss", 0, [](double x) { return std::isfinite(x) && x >= 0; }, "a finite number >= 0");
  cfg.logit_scale = real(
      "logit-scale", 1, [](double x) { return std::isfinite(x) && x > 0; }, "a finite number > 0");
  cfg.softcap = real(
      "softcap", 0, [](double x) { return std::isfinite(x) && x >= 0; }, "a finite number >= 0 (0: off)");
  if (args.has("partition")) {
    cfg.have_partition = true;
    cfg.partition_text = args.get("partition");
    cfg.partition = parse_partition(args, cfg.partition_text);
    if (static_cast<int>(cfg.partition.size()) != nranks)
      args.usage_error("--partition " + cfg.partition_text + " gives " + std::to_string(cfg.partition.size()) +
                       " sizes but there are " + std::to_string(nranks) + " ranks");
  }
}

Options library_options(const LossOptions& cfg) {
  Options opt;
  opt.strategy = cfg.strategy;
  opt.ignore_index = cfg.ignore_index;
  opt.reduction = cfg.reduction;
  opt.label_smoothing = cfg.label_smoothing;
  opt.z_loss = cfg.z_loss;
  opt.logit_scale = cfg.logit_scale;
  opt.softcap = cfg.softcap;
  return opt;
}

LossConfig parse_loss_args(const std::vector<std::string>& argv, int nranks) {
  std::vector<Args::Spec> specs = loss_option_specs();
  specs.insert(specs.end(), {{"grad-dtype", true},
                             {"lse", false},
                             {"mode", true},
                             {"entropy", false},
                             {"logprob", false},
                             {"z-loss-out", false},
                             {"entropy-weight", true}});
  Args args("loss", specs, argv);
  LossConfig cfg;
  if (args.help()) {
    cfg.help = true;
    return cfg;
  }
  parse_loss_options(args, nranks, &cfg);
  cfg.lse = args.has("lse");
  cfg.entropy = args.has("entropy");
  cfg.logprob = args.has("logprob");
  cfg.z_loss_out = args.has("z-loss-out");
  cfg.entropy_weight = args.get_double("entropy-weight", 0);
  if (!std::isfinite(cfg.entropy_weight))
    args.usage_error("--entropy-weight " + args.get("entropy-weight") + ": must be a finite number");
  cfg.mode = args.get_choice("mode", "fused", {"fused", "stash", "recompute"});
  if (args.has("grad-dtype")) {
    cfg.grad_dtype = args.get_choice("grad-dtype", "", {"float32", "logits"});
    if (!cfg.grad) args.usage_error("--grad-dtype " + cfg.grad_dtype + " needs --grad");
  }
  return cfg;
}

LossInput check_loss_input(const Communicator& comm, const H5File& in, const LossConfig& cfg) {
  // Metadata checks: every rank reads the same metadata; the decision is agreed all the same.
  const DatasetInfo li = in.info("/logits");
  const DatasetInfo ti = in.info("/targets");
  const std::string& file = in.display_name();
  std::string err;
  auto check = [&](bool bad, const std::string& what) {
    if (err.empty() && bad) err = file + ": " + what;
  };
  check(!li.exists, "no dataset /logits (expected N x V float32, float64 or 16-bit logits)");
  check(li.exists && li.type_name == "not a dataset", "/logits is not a dataset");
  check(li.dims.size() != 2, "dataset /logits " + shape_phrase(li) + "; expected 2 dimensions (tokens x vocabulary)");
  check(huge(li), "dataset /logits has a dimension above 2^63");
  LossInput r;
  if (err.empty()) r.type = stored_dtype(in, "/logits", li, &err);
  check(li.dims.size() == 2 && li.dims[1] == 0, "dataset /logits has 0 columns; the vocabulary must not be empty");
  // Target ids (/targets), or target probabilities (/target_probs: N x V, the logits' type), not both.
  const DatasetInfo pi = in.info("/target_probs");
  r.probs = pi.exists;
  if (r.probs) {
    check(ti.exists, "both /targets and /target_probs: give target ids or target probabilities, not both");
    check(pi.type_name == "not a dataset", "/target_probs is not a dataset");
    check(pi.dims != li.dims,
          "dataset /target_probs " + shape_phrase(pi) + "; expected the shape of /logits, " + shape_string(li.dims));
    check(pi.type_name != li.type_name || pi.type_size != li.type_size,
          "dataset /target_probs has type " + pi.type_name + "; expected the logits' type, " + li.type_name);
    if (err.empty() && pi.type_name == "uint16") {
      const AttributeInfo a = in.attribute("/target_probs", "dtype");
      check(!a.exists || !a.is_string || a.value != to_string(r.type),
            "dataset /target_probs (uint16) needs the attribute dtype = \"" + std::string(to_string(r.type)) +
                "\", as /logits has");
    }
  } else if (err.empty()) {
    err = targets_metadata_error(file, ti, li.dims.size() == 2 ? li.dims[0] : -1, "/logits");
  }
  agree(comm, err);
  r.n = li.dims[0];
  r.v = li.dims[1];
  // Optional class weights: V values, float32 or float64 (the values are checked by the library).
  const DatasetInfo wi = in.info("/weights");
  if (wi.exists) {
    r.weights = true;
    check(wi.type_name == "not a dataset", "/weights is not a dataset");
    check(wi.dims.size() != 1 || wi.dims[0] != r.v, "dataset /weights " + shape_phrase(wi) + "; expected " +
                                                        std::to_string(r.v) +
                                                        " class weights (one per column of /logits)");
    check(!(wi.kind == DatasetInfo::Kind::floating && (wi.type_size == 4 || wi.type_size == 8)),
          "dataset /weights has type " + wi.type_name + "; expected float32 or float64");
  }
  agree(comm, err);

  check_partition_sum(cfg, r.v, "loss", "columns", "/logits", file);
  return r;
}

std::string targets_metadata_error(const std::string& file, const DatasetInfo& ti, std::int64_t rows,
                                   const std::string& rows_of) {
  std::string err;
  auto check = [&](bool bad, const std::string& what) {
    if (err.empty() && bad) err = file + ": " + what;
  };
  check(!ti.exists, "no dataset /targets (expected N int64 target ids)");
  check(ti.exists && ti.type_name == "not a dataset", "/targets is not a dataset");
  check(ti.dims.size() != 1, "dataset /targets " + shape_phrase(ti) + "; expected 1 dimension (one target per token)");
  check(huge(ti), "dataset /targets has a dimension above 2^63");
  check(ti.kind != DatasetInfo::Kind::integer, "dataset /targets has type " + ti.type_name + "; expected int64");
  check(ti.dims.size() == 1 && rows >= 0 && ti.dims[0] != rows,
        "dataset /targets has " + std::to_string(ti.dims.empty() ? 0 : ti.dims[0]) + " entries but " + rows_of +
            " has " + std::to_string(rows) + " rows");
  return err;
}

void check_partition_sum(const LossOptions& cfg, std::int64_t v, const std::string& command, const std::string& unit,
                         const std::string& dataset, const std::string& file) {
  if (!cfg.have_partition) return;
  // Sizes are >= 0 (parse_loss_options); stop adding once past v, so the sum cannot overflow.
  std::int64_t sum = 0;
  bool over = false;
  for (auto s : cfg.partition) {
    if (s > v - sum) {
      over = true;
      break;
    }
    sum += s;
  }
  if (over || sum != v)
    throw UsageError(command + ": --partition " + cfg.partition_text + " adds up to " +
                     (over ? std::string("more than ") + std::to_string(v) : std::to_string(sum)) + " " + unit +
                     " but dataset " + dataset + " in " + file + " has " + std::to_string(v) + " (see 'vpce " +
                     command + " --help')");
}

bool too_large(std::initializer_list<std::array<std::int64_t, 3>> terms) {
  using u128 = unsigned __int128;
  const u128 limit = u128(1) << 62;
  // Saturating: a product or sum at or above the limit stays there (every factor is below 2^63).
  auto mul = [&](u128 a, std::int64_t b) { return b != 0 && a >= limit / u128(b) ? limit : a * u128(b); };
  u128 total = 0;
  for (const auto& t : terms) {
    if (t[0] < 0 || t[1] < 0 || t[2] < 0) return true;
    total += mul(mul(u128(t[0]), t[1]), t[2]);
    if (total >= limit) return true;
  }
  return false;
}

std::string size_error(const std::string& file, std::int64_t n, std::int64_t v, std::int64_t max_cols,
                       std::size_t elem_bytes) {
  // The logits and a gradient of at most 8 bytes an element, then per row: target, loss, lse (8 bytes each at
  // most) and a record of the collective (32 bytes at most). Kept below 2^62 bytes: no size_t or ptrdiff_t
  // computation on the way (Kokkos', HDF5's, MPI's) can overflow.
  if (v < 0 || too_large({{n, max_cols, std::int64_t(elem_bytes) + 8}, {n, 56, 1}}))
    return file + ": dataset /logits has shape " + std::to_string(n) + " x " + std::to_string(v) + ": too large (" +
           std::to_string(max_cols) + " columns of it on one rank cannot be held in memory)";
  return {};
}

std::string targets_error(const std::string& file, const std::int64_t* targets, std::int64_t n, std::int64_t v,
                          std::int64_t ignore_index) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t t = targets[i];
    if ((t < 0 || t >= v) && t != ignore_index)
      return file + ": dataset /targets: entry " + std::to_string(i) + " is " + std::to_string(t) +
             ", outside the vocabulary [0, " + std::to_string(v) + ") and not the --ignore-index (" +
             std::to_string(ignore_index) + ")";
  }
  return {};
}

}  // namespace vpce::tool
