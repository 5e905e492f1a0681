/// \file fault.cpp
/// \brief When things go wrong beyond an error message: the test-only fault switch (VPCE_TOOL_FAULT), the removal
/// of the temporary output file when the job is ended by a signal (a rank died and mpiexec terminates the
/// others), and a watchdog over clean-ups that could wait forever.

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "tool.hpp"

namespace vpce::tool {

namespace {

// Where the tool may be stopped: after reading its input (every rank holds its columns, the input is closed),
// before the collective computation, after writing the temporary output (before closing it), before the
// rename of the complete temporary file.
const char* const fault_phases[] = {"read", "collective", "write", "rename"};

struct Fault {
  bool set = false;
  int rank = -1;
  std::string phase;
};

/// Parses VPCE_TOOL_FAULT; `error` gets a message if it is malformed.
Fault parse_fault(std::string* error) {
  Fault f;
  const char* env = std::getenv("VPCE_TOOL_FAULT");
  if (!env || !*env) return f;
  const std::string s(env);
  const auto bad = [&] {
    *error =
        "VPCE_TOOL_FAULT=" + s + ": expected kill:<rank>:<phase>, phase one of read | collective | " + "write | rename";
    return Fault{};
  };
  const auto c1 = s.find(':');
  const auto c2 = c1 == std::string::npos ? std::string::npos : s.find(':', c1 + 1);
  if (c2 == std::string::npos || s.substr(0, c1) != "kill") return bad();
  const std::string rank = s.substr(c1 + 1, c2 - c1 - 1);
  char* end = nullptr;
  const long r = std::strtol(rank.c_str(), &end, 10);
  if (rank.empty() || *end != '\0' || r < 0 || r > 1000000) return bad();
  f.phase = s.substr(c2 + 1);
  bool known = false;
  for (const char* p : fault_phases) known = known || f.phase == p;
  if (!known) return bad();
  f.set = true;
  f.rank = static_cast<int>(r);
  return f;
}

// The file removed on a terminating signal: a fixed buffer, since the handler may only call async-signal-safe
// functions (unlink, sigaction, raise).
char g_remove_path[4096];
volatile std::sig_atomic_t g_remove_armed = 0;
const int g_signals[] = {SIGTERM, SIGINT, SIGHUP};
struct sigaction g_previous[3];
bool g_installed[3] = {false, false, false};

extern "C" void remove_and_reraise(int sig) {
  if (g_remove_armed) {
    g_remove_armed = 0;
    ::unlink(g_remove_path);
  }
  for (int k = 0; k < 3; ++k)
    if (g_signals[k] == sig) sigaction(sig, &g_previous[k], nullptr);
  raise(sig);  // the previous disposition (by default: the process ends with this signal)
}

}  // namespace

double abort_timeout() {
  if (const char* env = std::getenv("VPCE_ABORT_TIMEOUT")) {
    char* end = nullptr;
    const double t = std::strtod(env, &end);
    if (end != env && t >= 0) return t;
  }
  return 30;
}

void wait_or_abort(MPI_Request* request, const std::string& message, int code) {
  const double timeout = abort_timeout();
  const auto start = std::chrono::steady_clock::now();
  int done = 0;
  while (true) {
    MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout) {
      int rank = -1;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      std::fprintf(stderr, "%s (rank %d; the other ranks did not stop within %g s: ending the job)\n",
                   printed_message(message).c_str(), rank, timeout);
      std::fflush(stderr);
      if (g_remove_armed) ::unlink(g_remove_path);  // the temporary output, if one is being written
      MPI_Abort(MPI_COMM_WORLD, code);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

struct CleanupWatchdog::State {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::thread thread;
};

CleanupWatchdog::CleanupWatchdog(std::string message, std::string path, double seconds)
    : m_state(std::make_unique<State>()) {
  State* st = m_state.get();
  st->thread = std::thread([st, message = std::move(message), path = std::move(path), seconds] {
    std::unique_lock<std::mutex> lock(st->mutex);
    if (st->cv.wait_for(lock, std::chrono::duration<double>(seconds), [st] { return st->done; })) return;
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);  // a local query (the thread makes no communication)
    std::fprintf(stderr, "%s (rank %d: cleaning up after the error did not finish within %g s: ending the job)\n",
                 printed_message(message).c_str(), rank, seconds);
    std::fflush(stderr);
    if (!path.empty()) ::unlink(path.c_str());
    std::_Exit(1);
  });
}

CleanupWatchdog::~CleanupWatchdog() {
  {
    std::lock_guard<std::mutex> lock(m_state->mutex);
    m_state->done = true;
  }
  m_state->cv.notify_all();
  m_state->thread.join();
}

void check_fault_setting() {
  std::string err;
  parse_fault(&err);
  if (!err.empty()) throw UsageError(err);
}

void fault_point(const char* phase) {
  std::string err;
  static const Fault fault = parse_fault(&err);
  if (!fault.set || fault.phase != phase) return;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != fault.rank) return;
  std::fprintf(stderr, "vpce (test fault switch): rank %d kills itself at phase %s\n", rank, phase);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

RemoveOnSignal::RemoveOnSignal(const std::string& path) {
  const std::size_t len = std::min(path.size(), sizeof g_remove_path - 1);
  std::memcpy(g_remove_path, path.data(), len);
  g_remove_path[len] = '\0';
  g_remove_armed = path.size() < sizeof g_remove_path ? 1 : 0;
  struct sigaction sa {};
  sa.sa_handler = remove_and_reraise;
  sigemptyset(&sa.sa_mask);
  for (int k = 0; k < 3; ++k) {
    g_installed[k] = false;
    if (sigaction(g_signals[k], nullptr, &g_previous[k]) != 0 || g_previous[k].sa_handler == SIG_IGN) continue;
    g_installed[k] = sigaction(g_signals[k], &sa, nullptr) == 0;  // an ignored signal stays ignored
  }
}

RemoveOnSignal::~RemoveOnSignal() {
  g_remove_armed = 0;
  for (int k = 0; k < 3; ++k)
    if (g_installed[k]) sigaction(g_signals[k], &g_previous[k], nullptr);
}

}  // namespace vpce::tool
