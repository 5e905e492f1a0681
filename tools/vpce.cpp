/// \file vpce.cpp
/// \brief The `vpce` command-line tool: main, argument parsing, and `vpce loss`.

#include "vpce/vpce.hpp"

#include <H5public.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
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
    "Reads /logits (N x V, float32 or float64) and /targets (N, int64; other integer types are converted) from\n"
    "IN.h5 with parallel HDF5, each rank only its own columns of the logits, and writes /loss (N, the logits'\n"
    "type) and, with --grad, /grad_logits (N x V): the gradient of the SUM of the per-token losses. OUT.h5 is\n"
    "written under a temporary name in the same folder and renamed when complete; on an error it is not created\n"
    "(an existing one is left as it was).\n"
    "\n"
    "Options:\n"
    "  --input FILE          input HDF5 file (required)\n"
    "  --output FILE         output HDF5 file (required)\n"
    "  --grad                also write /grad_logits\n"
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
  Strategy strategy = Strategy::fused;
  std::string mode = "fused";  // fused | stash | recompute
  bool quiet = false;
  bool have_partition = false;
  std::vector<std::int64_t> partition;
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

template <class T>
void run_loss(const Communicator& comm, const LossConfig& cfg, H5File& in, std::int64_t n, std::int64_t v,
              const VocabPartition& part) {
  using CE = CrossEntropy<T>;
  using mem = typename CE::memory_space;
  const std::int64_t vl = part.local_size();
  std::int64_t max_vl = 0;
  for (int r = 0; r < comm.size(); ++r) max_vl = std::max(max_vl, part.local_size(r));

  Kokkos::View<T**, Kokkos::LayoutRight, mem> logits;
  Kokkos::View<std::int64_t*, mem> targets;
  Kokkos::View<T*, mem> loss;
  Kokkos::View<T**, Kokkos::LayoutRight, mem> grad;
  collectively(comm, [&] {
    logits = decltype(logits)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::tool::logits"), n, vl);
    targets = decltype(targets)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::tool::targets"), n);
    loss = decltype(loss)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::tool::loss"), n);
    if (cfg.grad) grad = decltype(grad)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::tool::grad"), n, vl);
  });

  // Read: this rank's columns of the logits, all the targets. (Host mirrors are the Views themselves on CPUs.)
  {
    auto h_logits = Kokkos::create_mirror_view(logits);
    auto h_targets = Kokkos::create_mirror_view(targets);
    in.read_columns<T>("/logits", n, part.begin(), vl, max_vl, h_logits.data());
    in.read_all<std::int64_t>("/targets", n, h_targets.data());
    in.close();
    std::string err;
    for (std::int64_t i = 0; i < n && err.empty(); ++i) {
      const std::int64_t t = h_targets(i);
      if (t < 0 || t >= v)
        err = "vpce: " + cfg.input + ": dataset /targets: entry " + std::to_string(i) + " is " + std::to_string(t) +
              ", outside the vocabulary [0, " + std::to_string(v) + ")";
    }
    agree(comm, err);
    Kokkos::deep_copy(logits, h_logits);
    Kokkos::deep_copy(targets, h_targets);
  }

  // Compute. Library errors (NaN logits, ...) are the same on every rank; name the input file in them.
  collectively(comm, [&] {
    try {
      Options opt;
      opt.strategy = cfg.strategy;
      opt.mode = cfg.mode == "stash" ? Mode::stash_softmax : Mode::recompute;
      CE ce(comm, part, opt);
      if (cfg.grad && cfg.mode == "fused") {
        ce.loss_and_grad(logits, targets, loss, grad, T(1));
      } else {
        ce.forward(logits, targets, loss);
        if (cfg.grad) ce.backward(T(1), grad);
      }
      Kokkos::fence();
    } catch (const std::exception& e) {
      throw Error("vpce: " + cfg.input + ": " + strip_prefix(clean_message(e.what())));
    }
  });
  logits = decltype(logits)();  // free before writing

  auto h_loss = Kokkos::create_mirror_view(loss);
  Kokkos::deep_copy(h_loss, loss);
  decltype(Kokkos::create_mirror_view(grad)) h_grad;
  if (cfg.grad) {
    h_grad = Kokkos::create_mirror_view(grad);
    Kokkos::deep_copy(h_grad, grad);
  }

  // Write under a temporary name; rename when every rank has closed it.
  long long pid = ::getpid();
  VPCE_MPI_CHECK(MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, comm.comm()));
  const std::string tmp = cfg.output + ".tmp." + std::to_string(pid);
  try {
    H5File out = H5File::create(tmp, comm, cfg.output);
    out.create_dataset<T>("/loss", {n});
    if (cfg.grad) out.create_dataset<T>("/grad_logits", {n, v});
    out.write_attribute("vpce_version", VPCE_VERSION_STRING);
    out.write_attribute("input", cfg.input);
    out.write_attribute("strategy", to_string(cfg.strategy));
    out.write_attribute("mode", cfg.grad ? cfg.mode : std::string("forward"));
    out.write_attribute("ranks", std::to_string(comm.size()));
    out.write_all<T>("/loss", n, h_loss.data(), 0);
    if (cfg.grad) out.write_columns<T>("/grad_logits", n, part.begin(), vl, max_vl, h_grad.data());
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
    double sum = 0;
    for (std::int64_t i = 0; i < n; ++i) sum += double(h_loss(i));
    std::ostringstream msg;
    msg.precision(6);
    msg << cfg.output << ": " << n << " tokens x " << v << " vocabulary (" << (sizeof(T) == 4 ? "float32" : "float64")
        << ", " << comm.size() << " rank" << (comm.size() > 1 ? "s" : "") << ", strategy " << to_string(cfg.strategy)
        << ", " << (cfg.grad ? "mode " + cfg.mode : std::string("loss only")) << "): mean loss "
        << (n > 0 ? sum / double(n) : 0.0) << "\n";
    print0(comm, msg.str());
  }
}

int cmd_loss(const Communicator& comm, const std::vector<std::string>& argv) {
  Args args("loss",
            {{"input", true},
             {"output", true},
             {"grad", false},
             {"strategy", true},
             {"mode", true},
             {"partition", true},
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
  cfg.strategy = args.get_choice("strategy", "fused", {"fused", "seed"}) == "seed" ? Strategy::seed : Strategy::fused;
  cfg.mode = args.get_choice("mode", "fused", {"fused", "stash", "recompute"});
  cfg.quiet = args.has("quiet");
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
  check(!li.exists, "no dataset /logits (expected N x V float32 or float64 logits)");
  check(li.exists && li.type_name == "not a dataset", "/logits is not a dataset");
  check(li.dims.size() != 2,
        "dataset /logits " + shape_phrase(li.dims) + "; expected 2 dimensions (tokens x vocabulary)");
  check(li.kind != DatasetInfo::Kind::floating || (li.type_size != 4 && li.type_size != 8),
        "dataset /logits has type " + li.type_name + "; expected float32 or float64");
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

  if (li.type_size == 4)
    run_loss<float>(comm, cfg, in, n, v, part);
  else
    run_loss<double>(comm, cfg, in, n, v, part);
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
