/// \file vpce.cpp
/// \brief The `vpce` command-line tool: main, the command table, help and version, and the exit status every rank
/// agrees on (finish). The commands are in loss.cpp, linear.cpp and demo.cpp.

#include "vpce/vpce.hpp"

#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

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
