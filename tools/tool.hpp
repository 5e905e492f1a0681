#pragma once
/// \file tool.hpp
/// \brief What the `vpce` tool's source files share: argument parsing, errors, the commands.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "vpce/communicator.hpp"
#include "vpce/error.hpp"

namespace vpce::tool {

/// A bad command line (exit status 2). Every rank parses the same arguments, so every rank throws it alike.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(what) {}
};

/// `--name value`, `--name=value` and `--flag` options of one command; unknown options, missing values and
/// stray arguments are UsageErrors that name the command.
class Args {
 public:
  struct Spec {
    std::string name;  ///< without the dashes
    bool takes_value;
  };
  Args(std::string command, const std::vector<Spec>& specs, const std::vector<std::string>& argv);

  bool has(const std::string& name) const { return m_values.count(name) > 0; }
  bool help() const { return m_help; }
  std::string get(const std::string& name, const std::string& fallback = {}) const;
  /// An integer option in [min, max].
  std::int64_t get_int(const std::string& name, std::int64_t fallback, std::int64_t min, std::int64_t max) const;
  /// A real-number option (any form strtod reads, whole); `fallback` when absent.
  double get_double(const std::string& name, double fallback) const;
  /// An option restricted to a set of words.
  std::string get_choice(const std::string& name, const std::string& fallback,
                         const std::vector<std::string>& choices) const;
  std::string required(const std::string& name) const;
  [[noreturn]] void usage_error(const std::string& what) const;

 private:
  std::string m_command;
  std::map<std::string, std::string> m_values;
  bool m_help = false;
};

/// Checks on rank 0 that a file can be created at `path` (its folder exists and is writable, and `path` is not
/// a folder); collective.
void check_writable(const Communicator& comm, const std::string& path, const std::string& what);

/// Writes `text` to `path` on rank 0 through a temporary name and a rename; collective (errors agreed).
void write_text_file(const Communicator& comm, const std::string& path, const std::string& text);

/// Prints on rank 0 only.
void print0(const Communicator& comm, const std::string& text);

/// An error message (vpce::Error::message(), without the source location) as the tool prints it: "vpce: " in
/// front, one line (newlines become spaces).
std::string printed_message(const std::string& message);

/// The folder of a path ("." for a bare name).
std::string folder_of(const std::string& path);

/// Chooses MPI-IO defaults before MPI_Init (environment variables the user has set win). With Open MPI up to 5:
/// ROMIO rather than OMPIO, whose shared-file-pointer components abort the process on a path of about 245
/// characters or more ("buffer overflow detected"; open-mpi/ompi #13565, fixed in 2025) and leave helper files
/// (NAME.data.0, NAME.metadata.0, NAME-*.loc) next to the files when a job is killed. Call it before MPI_Init.
void set_mpi_io_defaults();

/// Seconds a rank waits for the others before it gives up and ends the job (VPCE_ABORT_TIMEOUT, default 30).
double abort_timeout();

/// Waits for the non-blocking collective `request` of a rank that found an error (`message`): the others may be
/// stuck in a collective this rank left (a transfer that failed on this rank only). After abort_timeout()
/// seconds it prints the message with the rank, removes the temporary output (RemoveOnSignal's file) and
/// calls MPI_Abort(code): the job ends, it never hangs.
void wait_or_abort(MPI_Request* request, const std::string& message, int code);

/// Bounds a clean-up that could wait forever (closing a parallel HDF5 file after a failed transfer): unless it
/// is destroyed within `seconds`, it prints `message` on stderr (with the rank), removes `path` (if not empty)
/// and ends the process with status 1, and mpiexec ends the job.
class CleanupWatchdog {
 public:
  CleanupWatchdog(std::string message, std::string path, double seconds);
  ~CleanupWatchdog();
  CleanupWatchdog(const CleanupWatchdog&) = delete;
  CleanupWatchdog& operator=(const CleanupWatchdog&) = delete;

 private:
  struct State;
  std::unique_ptr<State> m_state;
};

// ------------------------------------------------------------------------------ a rank that dies (tests)

/// The hidden test-only fault switch: with VPCE_TOOL_FAULT=kill:<rank>:<phase> in the environment, the process
/// of rank <rank> (of MPI_COMM_WORLD) raises SIGKILL on itself when it reaches `phase` (fault.cpp lists them),
/// so tests can check what a job with a dead rank does. Without the variable this costs one getenv.
void fault_point(const char* phase);
/// Checks VPCE_TOOL_FAULT's form (UsageError naming it if it is malformed; every rank sees the same value).
void check_fault_setting();

/// While alive, SIGTERM, SIGINT and SIGHUP (what mpiexec sends the surviving ranks when one rank dies, and
/// Ctrl-C) first remove the file `path`, then take their usual course (default: the process ends). Not nested.
class RemoveOnSignal {
 public:
  explicit RemoveOnSignal(const std::string& path);
  ~RemoveOnSignal();
  RemoveOnSignal(const RemoveOnSignal&) = delete;
  RemoveOnSignal& operator=(const RemoveOnSignal&) = delete;
};

// The commands (vpce.cpp's table): argv holds the arguments after the command's name.
int cmd_loss(const Communicator& comm, const std::vector<std::string>& argv);
int cmd_linear(const Communicator& comm, const std::vector<std::string>& argv);
int cmd_demo(const Communicator& comm, const std::vector<std::string>& argv);
int cmd_bench(const Communicator& comm, const std::vector<std::string>& argv);

extern const char* const demo_help;
extern const char* const bench_help;

}  // namespace vpce::tool
