/// \file vpce.cpp
/// \brief The `vpce` command-line tool: main, argument parsing, and `vpce loss`.

#include "vpce/vpce.hpp"

#include <H5public.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "h5io.hpp"
#include "tool.hpp"

namespace vpce::tool {

namespace {

const char* const program_help =
    "vpce - vocab-parallel softmax cross-entropy (Megatron-LM's, on Kokkos + MPI)\n"
    "\n"
    "Usage: mpirun -n W vpce COMMAND [OPTIONS]\n"
    "\n"
    "Commands:\n"
    "  loss    loss (and gradient) of the logits in an HDF5 file, the vocabulary split over the ranks\n"
    "  bench   time the strategies and memory modes against a copy of the same logits\n"
    "  demo    a realistic batch: check the strategies against each other and a float64 reference, then time them\n"
    "\n"
    "Options:\n"
    "  -h, --help     this help ('vpce COMMAND --help' for a command's)\n"
    "  --version      versions of vpce, Kokkos, HDF5 and MPI\n"
    "\n"
    "Kokkos options (--kokkos-num-threads=N, ...) are taken by Kokkos. Errors print one line on rank 0's stderr;\n"
    "the exit status is 0 on success, 1 on an error, 2 on a bad command line, on every rank.\n";

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
    "OUT.h5 is written under a temporary name in the same folder and renamed when complete; on an error it is\n"
    "not created (an existing one is left as it was).\n"
    "\n"
    "Per token, with z its logits, x = S * z, then x = C * tanh(x / C) if C > 0 (a -inf logit stays -inf),\n"
    "lse = log(sum_j exp(x_j)) over the whole vocabulary, t the target:\n"
    "  loss = lse - (1 - A) * x_t - A * mean_j(x_j) + Z * lse^2        (0 if t is the ignore index)\n"
    "  d/dz_j = (softmax_j * (1 + 2 Z lse) - (1 - A) [j = t] - A / V) * dx_j/dz_j    (0 if ignored)\n"
    "with A, Z, S, C the values of --label-smoothing, --z-loss, --logit-scale, --softcap; the gradient is\n"
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

std::string clean_message(std::string msg) {
  // Library messages carry their source location ("[.../file.cpp:12]"): useful in a debugger, noise here.
  static const std::regex location(R"( \[[^\[\]]*:[0-9]+\])");
  msg = std::regex_replace(msg, location, "");
  for (auto& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  if (msg.rfind("vpce:", 0) != 0) msg = "vpce: " + msg;
  return msg;
}

std::string dimensions(std::size_t n) { return std::to_string(n) + (n == 1 ? " dimension" : " dimensions"); }

/// "has shape 6 x 23 x 1 (3 dimensions)", or "is a scalar".
std::string shape_phrase(const std::vector<std::int64_t>& dims) {
  if (dims.empty()) return "is a scalar";
  return "has shape " + shape_string(dims) + " (" + dimensions(dims.size()) + ")";
}

std::string strip_prefix(const std::string& msg) { return msg.rfind("vpce: ", 0) == 0 ? msg.substr(6) : msg; }

std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

// ------------------------------------------------------------------------------------------- arguments

Args::Args(std::string command, std::vector<Spec> specs, const std::vector<std::string>& argv)
    : m_command(std::move(command)) {
  // Help wins over anything else on the line (even a mistake in it).
  for (const auto& a : argv)
    if (a == "-h" || a == "--help") m_help = true;
  if (m_help) return;
  for (std::size_t k = 0; k < argv.size(); ++k) {
    const std::string& a = argv[k];
    if (a.rfind("--kokkos-", 0) == 0) continue;  // Kokkos' own (older Kokkos leave them in argv)
    if (a.size() < 3 || a.rfind("--", 0) != 0) usage_error("unexpected argument '" + a + "'");
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const Spec* spec = nullptr;
    for (const auto& s : specs)
      if (s.name == name) spec = &s;
    if (!spec) usage_error("unknown option '--" + name + "'");
    if (spec->takes_value && !inline_value) {
      if (k + 1 >= argv.size() || (argv[k + 1].rfind("--", 0) == 0 && argv[k + 1].size() > 2))
        usage_error("option --" + name + " needs a value");
      value = argv[++k];
    } else if (!spec->takes_value && inline_value) {
      usage_error("option --" + name + " takes no value");
    }
    if (spec->takes_value && value.empty()) usage_error("option --" + name + " needs a value");
    m_values[name] = value;
  }
}

void Args::usage_error(const std::string& what) const {
  throw UsageError("vpce: " + m_command + ": " + what + " (see 'vpce " + m_command + " --help')");
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  const auto it = m_values.find(name);
  return it == m_values.end() ? fallback : it->second;
}

std::string Args::required(const std::string& name) const {
  if (!has(name)) usage_error("option --" + name + " is required");
  return get(name);
}

std::int64_t Args::get_int(const std::string& name, std::int64_t fallback, std::int64_t min, std::int64_t max) const {
  if (!has(name)) return fallback;
  const std::string v = get(name);
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || errno == ERANGE) usage_error("--" + name + " " + v + ": not an integer");
  if (x < min || x > max)
    usage_error("--" + name + " " + v + ": must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  return x;
}

double Args::get_double(const std::string& name, double fallback) const {
  if (!has(name)) return fallback;
  const std::string v = get(name);
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || std::isspace(static_cast<unsigned char>(v[0])))
    usage_error("--" + name + " " + v + ": not a number");
  if (errno == ERANGE && std::isinf(x)) usage_error("--" + name + " " + v + ": out of range");
  return x;
}

std::string Args::get_choice(const std::string& name, const std::string& fallback,
                             const std::vector<std::string>& choices) const {
  const std::string v = get(name, fallback);
  std::string list;
  for (const auto& c : choices) {
    if (c == v) return v;
    list += (list.empty() ? "" : " | ") + c;
  }
  usage_error("--" + name + " " + v + ": expected " + list);
}

// --------------------------------------------------------------------------------------------- helpers

void print0(const Communicator& comm, const std::string& text) {
  if (comm.rank() == 0) {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  }
}

void check_writable(const Communicator& comm, const std::string& path, const std::string& what) {
  std::string err;
  if (comm.rank() == 0) {
    const std::string dir = folder_of(path);
    struct stat st {};
    if (path.empty() || path.back() == '/') {
      err = "vpce: " + what + " '" + path + "' is not a file name";
    } else if (::stat(dir.c_str(), &st) != 0) {
      err = "vpce: " + path + ": cannot write the " + what + ": folder " + dir + ": " + std::strerror(errno);
    } else if (!S_ISDIR(st.st_mode)) {
      err = "vpce: " + path + ": cannot write the " + what + ": " + dir + " is not a folder";
    } else if (::access(dir.c_str(), W_OK | X_OK) != 0) {
      err = "vpce: " + path + ": cannot write the " + what + ": folder " + dir + ": " + std::strerror(errno);
    } else if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      err = "vpce: " + path + ": cannot write the " + what + ": it is a folder";
    }
  }
  agree(comm, err, false);
}

void write_text_file(const Communicator& comm, const std::string& path, const std::string& text) {
  std::string err;
  if (comm.rank() == 0) {
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) {
      err = "vpce: " + path + ": cannot create " + tmp + ": " + std::strerror(errno);
    } else {
      const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
      const bool closed = std::fclose(f) == 0;
      if (!wrote || !closed)
        err = "vpce: " + path + ": writing " + tmp + " failed: " + std::strerror(errno);
      else if (std::rename(tmp.c_str(), path.c_str()) != 0)
        err = "vpce: " + path + ": cannot rename " + tmp + " to it: " + std::strerror(errno);
      if (!err.empty()) std::remove(tmp.c_str());
    }
  }
  agree(comm, err, false);
}

// ------------------------------------------------------------------------------------------------ loss

namespace {

struct LossConfig {
  std::string input, output;
  bool grad = false;
  bool lse = false;
  Strategy strategy = Strategy::fused;
  std::string mode = "fused";  // fused | stash | recompute
  std::string grad_dtype;      // "" (the compute type) | float32 | logits
  bool quiet = false;
  bool have_partition = false;
  std::vector<std::int64_t> partition;
  // The library's training options (vpce::Options).
  std::int64_t ignore_index = -100;
  Reduction reduction = Reduction::none;
  double label_smoothing = 0, z_loss = 0, logit_scale = 1, softcap = 0;
};

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

/// Shortest text that reads back as the same double ("0.1", "1e-05").
std::string number_text(double x) {
  for (int prec = 1; prec <= 17; ++prec) {
    std::ostringstream s;
    s.precision(prec);
    s << x;
    if (std::strtod(s.str().c_str(), nullptr) == x) return s.str();
  }
  return std::to_string(x);
}

/// The name of a logits element type in messages and attributes.
template <class S>
const char* dtype_name() {
  if constexpr (std::is_same_v<S, float>)
    return "float32";
  else if constexpr (std::is_same_v<S, double>)
    return "float64";
  else if constexpr (std::is_same_v<S, bfloat16>)
    return "bfloat16";
  else
    return "float16";
}

template <class S>
hid_t little_endian_type() {
  if constexpr (std::is_same_v<S, float>)
    return H5T_IEEE_F32LE;
  else if constexpr (std::is_same_v<S, double>)
    return H5T_IEEE_F64LE;
  else
    return H5T_STD_U16LE;  // 16-bit logits and gradients: their bits, tagged with a dtype attribute
}

/// Scalar: the logits' type (float, double, bfloat16, float16). Loss and lse are in its compute type; the
/// gradient is computed in the compute type or, for 16-bit logits with --grad-dtype logits, in Scalar.
template <class Scalar>
void run_loss(const Communicator& comm, const LossConfig& cfg, H5File& in, std::int64_t n, std::int64_t v,
              const VocabPartition& part) {
  using CE = CrossEntropy<Scalar>;
  using T = typename CE::compute_type;
  using mem = typename CE::memory_space;
  constexpr bool half = is_16bit_v<Scalar>;
  // The element read from and written to the file: the 16-bit types as their bits.
  using FileElem = std::conditional_t<half, std::uint16_t, Scalar>;
  static_assert(sizeof(FileElem) == sizeof(Scalar) && std::is_trivially_copyable_v<Scalar>);
  const std::int64_t vl = part.local_size();
  std::int64_t max_vl = 0;
  for (int r = 0; r < comm.size(); ++r) max_vl = std::max(max_vl, part.local_size(r));
  const bool reduced = cfg.reduction != Reduction::none;
  // The gradient in the logits' own 16-bit type, or in the compute type (written converted to float32 if asked).
  const bool grad_in_storage = half && cfg.grad_dtype == "logits";
  const bool grad_as_float32 = !std::is_same_v<T, float> && cfg.grad_dtype == "float32";
  // One call computing the loss and the gradient into the logits' own buffer (the library allows it): the
  // gradient's element type must be the logits' one.
  const bool in_place = cfg.grad && cfg.mode == "fused" && (std::is_same_v<Scalar, T> || grad_in_storage);

  using Matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, mem>;
  using GradMatrix = Kokkos::View<T**, Kokkos::LayoutRight, mem>;
  Matrix logits, grad_s;  // grad_s: the gradient in Scalar (16-bit, or in place)
  GradMatrix grad_t;      // the gradient in the compute type
  Kokkos::View<std::int64_t*, mem> targets;
  Kokkos::View<T*, mem> loss, lse;
  auto alloc = [](const char* label) { return Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)); };
  collectively(comm, [&] {
    logits = Matrix(alloc("vpce::tool::logits"), n, vl);
    targets = decltype(targets)(alloc("vpce::tool::targets"), n);
    loss = decltype(loss)(alloc("vpce::tool::loss"), n);
    if (cfg.lse) lse = decltype(lse)(alloc("vpce::tool::lse"), n);
    if (cfg.grad && in_place) {
      grad_s = logits;
    } else if (cfg.grad && grad_in_storage) {
      grad_s = Matrix(alloc("vpce::tool::grad"), n, vl);
    } else if (cfg.grad) {
      grad_t = GradMatrix(alloc("vpce::tool::grad"), n, vl);
    }
  });

  // Read: this rank's columns of the logits, all the targets. (Host mirrors are the Views themselves on CPUs.)
  {
    auto h_logits = Kokkos::create_mirror_view(logits);
    auto h_targets = Kokkos::create_mirror_view(targets);
    in.read_columns<FileElem>("/logits", n, part.begin(), vl, max_vl, reinterpret_cast<FileElem*>(h_logits.data()));
    in.read_all<std::int64_t>("/targets", n, h_targets.data());
    in.close();
    std::string err;
    for (std::int64_t i = 0; i < n && err.empty(); ++i) {
      const std::int64_t t = h_targets(i);
      if ((t < 0 || t >= v) && t != cfg.ignore_index)
        err = "vpce: " + cfg.input + ": dataset /targets: entry " + std::to_string(i) + " is " + std::to_string(t) +
              ", outside the vocabulary [0, " + std::to_string(v) + ") and not the --ignore-index (" +
              std::to_string(cfg.ignore_index) + ")";
    }
    agree(comm, err);
    Kokkos::deep_copy(logits, h_logits);
    Kokkos::deep_copy(targets, h_targets);
  }

  // Compute. Library errors (NaN logits, ...) are the same on every rank; name the input file in them.
  double reduced_loss = 0;
  std::int64_t n_valid = 0;
  collectively(comm, [&] {
    try {
      Options opt;
      opt.strategy = cfg.strategy;
      opt.mode = cfg.mode == "stash" ? Mode::stash_softmax : Mode::recompute;
      opt.ignore_index = cfg.ignore_index;
      opt.reduction = cfg.reduction;
      opt.label_smoothing = cfg.label_smoothing;
      opt.z_loss = cfg.z_loss;
      opt.logit_scale = cfg.logit_scale;
      opt.softcap = cfg.softcap;
      CE ce(comm, part, opt);
      // grad_scale 1: the gradient of the sum of the per-token losses (none), of the sum (sum) or of the mean
      // (mean: the library divides by the number of non-ignored tokens).
      auto compute = [&](const auto& grad) {
        if (cfg.grad && cfg.mode == "fused") {
          ce.loss_and_grad(logits, targets, loss, grad, T(1));
        } else {
          ce.forward(logits, targets, loss);
          if (cfg.grad) ce.backward(T(1), grad);
        }
      };
      if constexpr (half) {
        if (grad_s.data() != nullptr)
          compute(grad_s);  // grad_storage_view: the logits' own type
        else
          compute(grad_t);
      } else {
        compute(grad_s.data() != nullptr ? grad_s : grad_t);  // the same View type here
      }
      if (cfg.lse) Kokkos::deep_copy(lse, ce.lse());
      reduced_loss = ce.reduced_loss();
      n_valid = ce.num_valid();
      Kokkos::fence();
    } catch (const std::exception& e) {
      throw Error("vpce: " + cfg.input + ": " + strip_prefix(clean_message(e.what())));
    }
  });
  if (!in_place) logits = Matrix();  // free before writing

  auto h_loss = Kokkos::create_mirror_view(loss);
  Kokkos::deep_copy(h_loss, loss);
  auto h_lse = Kokkos::create_mirror_view(lse);
  Kokkos::deep_copy(h_lse, lse);
  auto h_grad_s = Kokkos::create_mirror_view(grad_s);
  Kokkos::deep_copy(h_grad_s, grad_s);
  auto h_grad_t = Kokkos::create_mirror_view(grad_t);
  Kokkos::deep_copy(h_grad_t, grad_t);

  // Write under a temporary name; rename when every rank has closed it.
  long long pid = ::getpid();
  VPCE_MPI_CHECK(MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, comm.comm()));
  const std::string tmp = cfg.output + ".tmp." + std::to_string(pid);
  try {
    H5File out = H5File::create(tmp, comm, cfg.output);
    out.create_dataset("/loss", {reduced ? 1 : n}, little_endian_type<T>());
    if (cfg.grad) {
      const hid_t type = grad_in_storage   ? little_endian_type<Scalar>()
                         : grad_as_float32 ? H5T_IEEE_F32LE
                                           : little_endian_type<T>();
      out.create_dataset("/grad_logits", {n, v}, type);
      if (grad_in_storage) out.write_attribute("dtype", dtype_name<Scalar>(), "/grad_logits");
    }
    if (cfg.lse) out.create_dataset("/lse", {n}, little_endian_type<T>());
    out.write_attribute("vpce_version", VPCE_VERSION_STRING);
    out.write_attribute("input", cfg.input);
    out.write_attribute("logits_dtype", dtype_name<Scalar>());
    out.write_attribute("strategy", to_string(cfg.strategy));
    out.write_attribute("mode", cfg.grad ? cfg.mode : std::string("forward"));
    out.write_attribute("ranks", std::to_string(comm.size()));
    out.write_attribute("reduction", to_string(cfg.reduction));
    out.write_attribute("ignore_index", std::to_string(cfg.ignore_index));
    out.write_attribute("label_smoothing", number_text(cfg.label_smoothing));
    out.write_attribute("z_loss", number_text(cfg.z_loss));
    out.write_attribute("logit_scale", number_text(cfg.logit_scale));
    out.write_attribute("softcap", number_text(cfg.softcap));
    out.write_attribute("num_valid", std::to_string(n_valid));
    if (reduced) {
      const T value = T(reduced_loss);
      out.write_all<T>("/loss", 1, &value, 0);
    } else {
      out.write_all<T>("/loss", n, h_loss.data(), 0);
    }
    if (cfg.lse) out.write_all<T>("/lse", n, h_lse.data(), 0);
    if (cfg.grad && h_grad_s.data() != nullptr) {
      out.write_columns<FileElem>("/grad_logits", n, part.begin(), vl, max_vl,
                                  reinterpret_cast<const FileElem*>(h_grad_s.data()));
    } else if (cfg.grad) {
      out.write_columns<T>("/grad_logits", n, part.begin(), vl, max_vl, h_grad_t.data());
    }
    out.close();
    std::string err;
    if (comm.rank() == 0 && std::rename(tmp.c_str(), cfg.output.c_str()) != 0)
      err = "vpce: " + cfg.output + ": cannot rename " + tmp + " to it: " + std::strerror(errno);
    agree(comm, err, false);
  } catch (...) {
    // Every rank gets here together (errors are agreed) and has closed the file: remove it once.
    MPI_Barrier(comm.comm());
    if (comm.rank() == 0) std::remove(tmp.c_str());
    throw;
  }

  if (!cfg.quiet) {
    std::ostringstream msg;
    msg.precision(6);
    msg << cfg.output << ": " << n << " tokens x " << v << " vocabulary (" << dtype_name<Scalar>() << ", "
        << comm.size() << " rank" << (comm.size() > 1 ? "s" : "") << ", strategy " << to_string(cfg.strategy) << ", "
        << (cfg.grad ? "mode " + cfg.mode : std::string("loss only")) << "): ";
    if (cfg.reduction == Reduction::none)
      msg << "mean loss " << (n_valid > 0 ? reduced_loss / double(n_valid) : 0.0);
    else
      msg << to_string(cfg.reduction) << " of the losses " << reduced_loss;
    if (n_valid != n) msg << " (" << n_valid << " tokens not ignored)";
    msg << "\n";
    print0(comm, msg.str());
  }
}

/// What /logits holds; an empty string in `err` if it is usable.
enum class LogitsType { float32, float64, bfloat16, float16 };

LogitsType logits_type(const H5File& in, const DatasetInfo& li, std::string* err) {
  const std::string file = in.display_name();
  const std::string expected =
      "expected float32 or float64, or uint16 bits with a string attribute dtype = \"bfloat16\" or \"float16\"";
  if (li.kind == DatasetInfo::Kind::floating && li.type_size == 4) return LogitsType::float32;
  if (li.kind == DatasetInfo::Kind::floating && li.type_size == 8) return LogitsType::float64;
  if (li.type_name != "uint16") {
    *err = "vpce: " + file + ": dataset /logits has type " + li.type_name + "; " + expected;
    return LogitsType::float32;
  }
  const AttributeInfo a = in.attribute("/logits", "dtype");
  if (!a.exists) {
    *err = "vpce: " + file +
           ": dataset /logits is uint16 but has no attribute dtype; expected dtype = \"bfloat16\" "
           "or \"float16\" (16-bit logits), or float32 or float64 logits";
  } else if (!a.is_string) {
    *err = "vpce: " + file + ": dataset /logits (uint16): attribute dtype is " + a.type_name +
           ", not a string; expected \"bfloat16\" or \"float16\"";
  } else if (a.value == "bfloat16") {
    return LogitsType::bfloat16;
  } else if (a.value == "float16") {
    return LogitsType::float16;
  } else {
    *err = "vpce: " + file + ": dataset /logits (uint16): attribute dtype is \"" + a.value +
           "\"; expected \"bfloat16\" or \"float16\"";
  }
  return LogitsType::float32;
}

int cmd_loss(const Communicator& comm, const std::vector<std::string>& argv) {
  Args args("loss",
            {{"input", true},
             {"output", true},
             {"grad", false},
             {"grad-dtype", true},
             {"lse", false},
             {"strategy", true},
             {"mode", true},
             {"partition", true},
             {"ignore-index", true},
             {"reduction", true},
             {"label-smoothing", true},
             {"z-loss", true},
             {"logit-scale", true},
             {"softcap", true},
             {"quiet", false}},
            argv);
  if (args.help()) {
    print0(comm, loss_help);
    return 0;
  }
  LossConfig cfg;
  cfg.input = args.required("input");
  cfg.output = args.required("output");
  cfg.grad = args.has("grad");
  cfg.lse = args.has("lse");
  cfg.strategy = args.get_choice("strategy", "fused", {"fused", "seed"}) == "seed" ? Strategy::seed : Strategy::fused;
  cfg.mode = args.get_choice("mode", "fused", {"fused", "stash", "recompute"});
  if (args.has("grad-dtype")) {
    cfg.grad_dtype = args.get_choice("grad-dtype", "", {"float32", "logits"});
    if (!cfg.grad) args.usage_error("--grad-dtype " + cfg.grad_dtype + " needs --grad");
  }
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
    cfg.partition = parse_partition(args, args.get("partition"));
    if (static_cast<int>(cfg.partition.size()) != comm.size())
      args.usage_error("--partition " + args.get("partition") + " gives " + std::to_string(cfg.partition.size()) +
                       " sizes but there are " + std::to_string(comm.size()) + " ranks");
  }

  check_writable(comm, cfg.output, "output");
  H5File in = H5File::open_read(cfg.input, comm);

  // Metadata checks: every rank reads the same metadata; the decision is agreed all the same.
  const DatasetInfo li = in.info("/logits");
  const DatasetInfo ti = in.info("/targets");
  const std::string file = cfg.input;
  std::string err;
  auto check = [&](bool bad, const std::string& what) {
    if (err.empty() && bad) err = "vpce: " + file + ": " + what;
  };
  check(!li.exists, "no dataset /logits (expected N x V float32, float64 or 16-bit logits)");
  check(li.exists && li.type_name == "not a dataset", "/logits is not a dataset");
  check(li.dims.size() != 2,
        "dataset /logits " + shape_phrase(li.dims) + "; expected 2 dimensions (tokens x vocabulary)");
  LogitsType type = LogitsType::float32;
  if (err.empty()) type = logits_type(in, li, &err);
  check(li.dims.size() == 2 && li.dims[1] == 0, "dataset /logits has 0 columns; the vocabulary must not be empty");
  check(!ti.exists, "no dataset /targets (expected N int64 target ids)");
  check(ti.exists && ti.type_name == "not a dataset", "/targets is not a dataset");
  check(ti.dims.size() != 1,
        "dataset /targets " + shape_phrase(ti.dims) + "; expected 1 dimension (one target per token)");
  check(ti.kind != DatasetInfo::Kind::integer, "dataset /targets has type " + ti.type_name + "; expected int64");
  check(ti.dims.size() == 1 && li.dims.size() == 2 && ti.dims[0] != li.dims[0],
        "dataset /targets has " + std::to_string(ti.dims.empty() ? 0 : ti.dims[0]) + " entries but /logits has " +
            std::to_string(li.dims.empty() ? 0 : li.dims[0]) + " rows");
  agree(comm, err);
  const std::int64_t n = li.dims[0], v = li.dims[1];

  if (cfg.have_partition) {
    std::int64_t sum = 0;
    for (auto s : cfg.partition) sum += s;
    if (sum != v)
      args.usage_error("--partition " + args.get("partition") + " adds up to " + std::to_string(sum) +
                       " columns but dataset /logits in " + file + " has " + std::to_string(v));
  }
  const VocabPartition part =
      cfg.have_partition ? VocabPartition::from_sizes(cfg.partition, comm, v) : VocabPartition::even(v, comm);

  switch (type) {
    case LogitsType::float32:
      run_loss<float>(comm, cfg, in, n, v, part);
      break;
    case LogitsType::float64:
      run_loss<double>(comm, cfg, in, n, v, part);
      break;
    case LogitsType::bfloat16:
      run_loss<bfloat16>(comm, cfg, in, n, v, part);
      break;
    case LogitsType::float16:
      run_loss<float16>(comm, cfg, in, n, v, part);
      break;
  }
  return 0;
}

// ------------------------------------------------------------------------------------------------ main

std::string version_text() {
  std::ostringstream s;
  s << "vpce " << VPCE_VERSION_STRING << "\n";
  s << "  Kokkos " << KOKKOS_VERSION / 10000 << "." << (KOKKOS_VERSION / 100) % 100 << "." << KOKKOS_VERSION % 100
    << " (" << Kokkos::DefaultExecutionSpace::name() << ")\n";
  s << "  HDF5 " << H5_VERS_MAJOR << "." << H5_VERS_MINOR << "." << H5_VERS_RELEASE << " (parallel)\n";
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(lib, &len);
  std::string mpi(lib, len);
  mpi = mpi.substr(0, mpi.find_first_of("\n,"));
  s << "  MPI: " << mpi << "\n";
  return s.str();
}

int run(int argc, char** argv) {
  const Communicator comm(MPI_COMM_WORLD);
  std::vector<std::string> args;
  for (int k = 1; k < argc; ++k)
    if (std::string(argv[k]).rfind("--kokkos-", 0) != 0) args.emplace_back(argv[k]);
  if (args.empty()) throw UsageError("vpce: no command given (expected loss, bench or demo; see 'vpce --help')");
  const std::string cmd = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    print0(comm, program_help);
    return 0;
  }
  if (cmd == "--version" || cmd == "-V" || cmd == "version") {
    print0(comm, version_text());
    return 0;
  }
  if (cmd == "loss") return cmd_loss(comm, rest);
  if (cmd == "bench") return cmd_bench(comm, rest);
  if (cmd == "demo") return cmd_demo(comm, rest);
  if (cmd.rfind("-", 0) == 0) throw UsageError("vpce: unknown option '" + cmd + "' (see 'vpce --help')");
  throw UsageError("vpce: unknown command '" + cmd + "' (expected loss, bench or demo; see 'vpce --help')");
}

/// Agrees on the exit status over every rank and prints the first failing rank's message on rank 0. A rank
/// that failed waits a bounded time for the others (they may be stuck in a collective it left) and then
/// aborts the job, so a failure can never hang.
int finish(MPI_Comm comm, int code, const std::string& message) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int in[2] = {code, code != 0 ? -rank : -size};
  int out[2] = {0, 0};
  MPI_Request req;
  MPI_Iallreduce(in, out, 2, MPI_INT, MPI_MAX, comm, &req);
  if (code == 0) {
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  } else {
    double timeout = 30;
    if (const char* env = std::getenv("VPCE_ABORT_TIMEOUT")) timeout = std::atof(env);
    const auto start = std::chrono::steady_clock::now();
    int done = 0;
    while (true) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) break;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout) {
        std::fprintf(stderr, "%s (rank %d; the other ranks did not stop: aborting)\n", clean_message(message).c_str(),
                     rank);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, code);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (out[0] == 0) return 0;
  const int first = -out[1];
  int len = static_cast<int>(message.size());
  MPI_Bcast(&len, 1, MPI_INT, first, comm);
  std::string text(message);
  text.resize(len);
  MPI_Bcast(text.data(), len, MPI_CHAR, first, comm);
  if (rank == 0) {
    std::fprintf(stderr, "%s\n", clean_message(text).c_str());
    std::fflush(stderr);
  }
  return out[0];
}

}  // namespace
}  // namespace vpce::tool

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm final_comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &final_comm);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // HDF5's own error stacks: the tool reports one line instead

  int code = 0;
  std::string message;
  // Kokkos 3.4 also reads unprefixed options (--help, --threads=...): give it only its --kokkos-* ones.
  std::vector<char*> kokkos_argv{argv[0]};
  for (int k = 1; k < argc; ++k)
    if (std::string(argv[k]).rfind("--kokkos-", 0) == 0) kokkos_argv.push_back(argv[k]);
  int kokkos_argc = static_cast<int>(kokkos_argv.size());
  kokkos_argv.push_back(nullptr);
  // Kokkos' OpenMP backend warns on every rank when OMP_PROC_BIND is unset. The OpenMP runtime has already read
  // the environment (unset means no binding, the same as false), so this only silences that per-rank warning.
  setenv("OMP_PROC_BIND", "false", 0);
  Kokkos::initialize(kokkos_argc, kokkos_argv.data());
  try {
    code = vpce::tool::run(argc, argv);
  } catch (const vpce::tool::UsageError& e) {
    code = 2;
    message = e.what();
  } catch (const std::exception& e) {
    code = 1;
    message = e.what();
    if (message.empty()) message = "vpce: unknown error";
  } catch (...) {
    code = 1;
    message = "vpce: unknown error";
  }
  Kokkos::finalize();
  code = vpce::tool::finish(final_comm, code, message);
  MPI_Comm_free(&final_comm);
  MPI_Finalize();
  return code;
}
