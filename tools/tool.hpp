#pragma once
/// \file tool.hpp
/// \brief What the `vpce` tool's source files share: argument parsing, errors, the commands.

#include <cstdint>
#include <map>
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
  Args(std::string command, std::vector<Spec> specs, const std::vector<std::string>& argv);

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

int cmd_demo(const Communicator& comm, const std::vector<std::string>& argv);
int cmd_bench(const Communicator& comm, const std::vector<std::string>& argv);

extern const char* const demo_help;
extern const char* const bench_help;

}  // namespace vpce::tool
