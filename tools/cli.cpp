/// \file cli.cpp
/// \brief What every command of the `vpce` tool shares: argument parsing, printing, checked output files (no
/// Kokkos here).

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "h5io.hpp"
#include "tool.hpp"

namespace vpce::tool {

std::string printed_message(const std::string& message) {
  std::string line = "vpce: " + message;
  for (auto& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  return line;
}

void set_mpi_io_defaults() {
#if defined(OPEN_MPI) && OPEN_MPI && defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION <= 5
  setenv("OMPI_MCA_io", "^ompio", 0);  // 0: a value the user has set stays
#endif
}

std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// ------------------------------------------------------------------------------------------- arguments

Args::Args(std::string command, const std::vector<Spec>& specs, const std::vector<std::string>& argv)
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
  throw UsageError(m_command + ": " + what + " (see 'vpce " + m_command + " --help')");
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
  std::string v = get(name, fallback);
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
      err = what + " '" + path + "' is not a file name";
    } else if (::stat(dir.c_str(), &st) != 0 || (S_ISDIR(st.st_mode) && ::access(dir.c_str(), W_OK | X_OK) != 0)) {
      err = path + ": cannot write the " + what + ": folder " + dir + ": " + std::strerror(errno);
    } else if (!S_ISDIR(st.st_mode)) {
      err = path + ": cannot write the " + what + ": " + dir + " is not a folder";
    } else if (const int rc = ::stat(path.c_str(), &st); rc == 0 && S_ISDIR(st.st_mode)) {
      err = path + ": cannot write the " + what + ": it is a folder";
    } else if (rc != 0 && errno != ENOENT) {
      err = path + ": cannot write the " + what + ": " + std::strerror(errno);
    } else {
      // The file is written as NAME.tmp.<pid> first: that name must fit too.
      const std::string base = path.substr(path.find_last_of('/') + 1);
      const long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
      if (name_max > 0 && base.size() + 16 > static_cast<std::size_t>(name_max))
        err = path + ": cannot write the " + what + ": its name is too long (" + std::to_string(base.size()) +
              " characters; at most " + std::to_string(name_max - 16) +
              " here, as it is first written under the name plus .tmp.<process id>)";
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
      err = path + ": cannot create " + tmp + ": " + std::strerror(errno);
    } else {
      const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
      const bool closed = std::fclose(f) == 0;
      if (!wrote || !closed)
        err = path + ": writing " + tmp + " failed: " + std::strerror(errno);
      else if (std::rename(tmp.c_str(), path.c_str()) != 0)
        err = path + ": cannot rename " + tmp + " to it: " + std::strerror(errno);
      if (!err.empty()) std::remove(tmp.c_str());
    }
  }
  agree(comm, err, false);
}

}  // namespace vpce::tool
