/// \file vpce.cpp
/// \brief The `vpce` command-line tool: main, the command table, and `vpce loss`'s computation and output.

#include "vpce/vpce.hpp"

#include <H5public.h>
#include <mpi.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "command.hpp"
#include "h5io.hpp"
#include "loss_input.hpp"
#include "tool.hpp"

namespace vpce::tool {

namespace {

/// The commands: to add one, write its `int cmd_x(const Communicator&, const std::vector<std::string>& argv)`
/// (argv: the arguments after the command's name) and add a line here; help and messages follow.
struct Command {
  const char* name;
  int (*run)(const Communicator& comm, const std::vector<std::string>& argv);
  const char* summary;
};

int cmd_loss(const Communicator& comm, const std::vector<std::string>& argv);

const Command commands[] = {
    {"loss", cmd_loss, "loss (and gradient) of the logits in an HDF5 file, the vocabulary split over the ranks"},
    {"linear", cmd_linear,
     "the LM head fused with the loss: loss (and gradients) of hidden x weight^T, chunk by chunk (Kokkos Kernels)"},
    {"bench", cmd_bench, "time the strategies and memory modes against a copy of the same logits"},
    {"demo", cmd_demo,
     "a realistic batch: check the strategies against each other and a float64 reference, then time them"},
};

/// "loss, bench or demo"
std::string command_list() {
  std::string s;
  const std::size_t count = sizeof commands / sizeof commands[0];
  for (std::size_t k = 0; k < count; ++k)
    s += (k == 0 ? "" : k + 1 == count ? " or " : ", ") + std::string(commands[k].name);
  return s;
}

std::string program_help() {
  std::string s =
      "vpce - vocab-parallel softmax cross-entropy (Megatron-LM's, on Kokkos + MPI)\n"
      "\n"
      "Usage: mpirun -n W vpce COMMAND [OPTIONS]\n"
      "\n"
      "Commands:\n";
  for (const auto& c : commands) {
    std::string name = c.name;
    name.resize(std::max<std::size_t>(name.size() + 2, 8), ' ');
    s += "  " + name + c.summary + "\n";
  }
  s += "\n"
       "Options:\n"
       "  -h, --help     this help ('vpce COMMAND --help' for a command's)\n"
       "  --version      versions of vpce, Kokkos, HDF5 and MPI\n"
       "\n"
       "Kokkos options (--kokkos-num-threads=N, ...) are taken by Kokkos. Errors print one line on rank 0's stderr;\n"
       "the exit status is 0 on success, 1 on an error, 2 on a bad command line, on every rank. If a process dies\n"
       "(killed, out of memory), mpiexec ends the job with a non-zero status and no output file appears.\n";
  return s;
}

}  // namespace

// ------------------------------------------------------------------------------------------------ loss

std::string number_text(double x) {
  for (int prec = 1; prec <= 17; ++prec) {
    std::ostringstream s;
    s.precision(prec);
    s << x;
    if (std::strtod(s.str().c_str(), nullptr) == x) return s.str();
  }
  return std::to_string(x);
}

void write_common_attributes(H5File& out, const Communicator& comm, const LossOptions& cfg, std::int64_t n_valid) {
  out.write_attribute("vpce_version", VPCE_VERSION_STRING);
  out.write_attribute("input", cfg.input);
  out.write_attribute("strategy", to_string(cfg.strategy));
  out.write_attribute("ranks", std::to_string(comm.size()));
  out.write_attribute("reduction", to_string(cfg.reduction));
  out.write_attribute("ignore_index", std::to_string(cfg.ignore_index));
  out.write_attribute("label_smoothing", number_text(cfg.label_smoothing));
  out.write_attribute("z_loss", number_text(cfg.z_loss));
  out.write_attribute("logit_scale", number_text(cfg.logit_scale));
  out.write_attribute("softcap", number_text(cfg.softcap));
  out.write_attribute("num_valid", std::to_string(n_valid));
}

namespace {

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
    try {
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
    } catch (const std::exception&) {
      // Kokkos' message is a paragraph: say what did not fit instead.
      const double bytes = double(n) * double(vl) * double(sizeof(Scalar) + (cfg.grad && !in_place ? sizeof(T) : 0)) +
                           double(n) * 8 * (cfg.lse ? 3 : 2);
      std::ostringstream msg;
      msg.precision(3);
      msg << cfg.input << ": not enough memory for this rank's " << n << " x " << vl << " logits"
          << (cfg.grad ? " and their gradient" : "") << " (" << bytes / double(1 << 30) << " GiB)";
      throw Error(msg.str());
    }
  });

  // Read: this rank's columns of the logits, all the targets. (Host mirrors are the Views themselves on CPUs.)
  {
    auto h_logits = Kokkos::create_mirror_view(logits);
    auto h_targets = Kokkos::create_mirror_view(targets);
    in.read_columns<FileElem>("/logits", n, part.begin(), vl, max_vl, reinterpret_cast<FileElem*>(h_logits.data()));
    in.read_all<std::int64_t>("/targets", n, h_targets.data());
    in.close();
    fault_point("read");
    agree(comm, targets_error(cfg.input, h_targets.data(), n, v, cfg.ignore_index));
    Kokkos::deep_copy(logits, h_logits);
    Kokkos::deep_copy(targets, h_targets);
  }

  // Compute. Library errors (NaN logits, ...) are the same on every rank; name the input file in them.
  double reduced_loss = 0;
  std::int64_t n_valid = 0;
  fault_point("collective");
  collectively(comm, [&] {
    try {
      Options opt = library_options(cfg);
      opt.mode = cfg.mode == "stash" ? Mode::stash_softmax : Mode::recompute;
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
    } catch (const Error& e) {
      throw Error(cfg.input + ": " + e.message());
    } catch (const std::exception& e) {
      throw Error(cfg.input + ": " + e.what());
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
  // A full disk is found before anything is allocated in the file: the metadata block, the datasets, and room for
  // the small-data block and rounding.
  const std::int64_t grad_elem = !cfg.grad         ? 0
                                 : grad_in_storage ? std::int64_t(sizeof(Scalar))
                                 : grad_as_float32 ? 4
                                                   : std::int64_t(sizeof(T));
  const std::int64_t reserve = std::int64_t(128) * 1024 + (reduced ? 1 : n) * std::int64_t(sizeof(T)) + n * v * grad_elem +
                               (cfg.lse ? n * std::int64_t(sizeof(T)) : 0);
  write_output(comm, cfg.output, reserve, [&](H5File& out) {
    out.create_dataset("/loss", {reduced ? 1 : n}, little_endian_type<T>());
    if (cfg.grad) {
      const hid_t type = grad_in_storage   ? little_endian_type<Scalar>()
                         : grad_as_float32 ? H5T_IEEE_F32LE
                                           : little_endian_type<T>();
      out.create_dataset("/grad_logits", {n, v}, type);
      if (grad_in_storage) out.write_attribute("dtype", dtype_name<Scalar>(), "/grad_logits");
    }
    if (cfg.lse) out.create_dataset("/lse", {n}, little_endian_type<T>());
    out.write_attribute("logits_dtype", dtype_name<Scalar>());
    out.write_attribute("mode", cfg.grad ? cfg.mode : std::string("forward"));
    write_common_attributes(out, comm, cfg, n_valid);
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
  });

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

int cmd_loss(const Communicator& comm, const std::vector<std::string>& argv) {
  const LossConfig cfg = parse_loss_args(argv, comm.size());
  if (cfg.help) {
    print0(comm, loss_help);
    return 0;
  }
  check_fault_setting();
  check_writable(comm, cfg.output, "output");
  H5File in = H5File::open_read(cfg.input, comm);
  const LossInput input = check_loss_input(comm, in, cfg);
  const std::int64_t n = input.n, v = input.v;
  const VocabPartition part =
      cfg.have_partition ? VocabPartition::from_sizes(cfg.partition, comm, v) : VocabPartition::even(v, comm);
  std::int64_t max_vl = 0;
  for (int r = 0; r < comm.size(); ++r) max_vl = std::max(max_vl, part.local_size(r));
  agree(comm, size_error(cfg.input, n, v, max_vl, element_size(input.type)), false);

  const LogitsType type = input.type;
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
  if (args.empty()) throw UsageError("no command given (expected " + command_list() + "; see 'vpce --help')");
  const std::string cmd = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    print0(comm, program_help());
    return 0;
  }
  if (cmd == "--version" || cmd == "-V" || cmd == "version") {
    print0(comm, version_text());
    return 0;
  }
  for (const auto& c : commands)
    if (cmd == c.name) return c.run(comm, rest);
  if (cmd.rfind('-', 0) == 0) throw UsageError("unknown option '" + cmd + "' (see 'vpce --help')");
  throw UsageError("unknown command '" + cmd + "' (expected " + command_list() + "; see 'vpce --help')");
}

/// Agrees on the exit status over every rank (Communicator::agree) and prints the first failing rank's message on
/// rank 0. A rank that failed waits a bounded time for the others (they may be stuck in a collective it left)
/// and then aborts the job, so a failure can never hang.
int finish(MPI_Comm comm, int code, const std::string& message) {
  const Communicator c(comm);
  const auto a = c.agree(code != 0 ? message : std::string(), {}, [&](MPI_Request* request) {
    if (code != 0)
      wait_or_abort(request, message, code);
    else
      MPI_Wait(request, MPI_STATUS_IGNORE);
  });
  if (!a.failed()) return 0;
  int agreed_code = code;
  MPI_Bcast(&agreed_code, 1, MPI_INT, a.rank, c.comm());
  if (c.rank() == 0) {
    std::fprintf(stderr, "%s\n", printed_message(a.message).c_str());
    std::fflush(stderr);
  }
  return agreed_code;
}

}  // namespace
}  // namespace vpce::tool

int main(int argc, char** argv) {
  vpce::tool::set_mpi_io_defaults();
  // A write past the file-size limit (ulimit -f) fails with EFBIG and is reported like a full disk, instead of
  // SIGXFSZ killing the rank (and leaving the temporary output behind).
  std::signal(SIGXFSZ, SIG_IGN);
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
    message = e.message();
  } catch (const vpce::Error& e) {
    code = 1;
    message = e.message();
  } catch (const std::exception& e) {
    code = 1;
    message = e.what();
  } catch (...) {
    code = 1;
  }
  if (code != 0 && message.empty()) message = "unknown error";
  Kokkos::finalize();
  code = vpce::tool::finish(final_comm, code, message);
  MPI_Comm_free(&final_comm);
  MPI_Finalize();
  return code;
}
