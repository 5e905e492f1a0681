#pragma once
/// \file bench.hpp
/// \brief vpce's MPI-aware benchmark harness (the library vpce_bench), used by `vpce bench`, `vpce demo`,
/// perf_tests/vpce_perf and perf_tests/vpce_linear_perf.
///
/// Every figure is the median over repetitions of the slowest rank's time (time_op). run() times the library's
/// calls and reports them with the bytes the operation must move and as ratios to three ceilings timed in the
/// same run over the same logits: a copy with plain stores ("copy": read + write, each written line read first),
/// a copy with streaming stores ("copy_stream", the STREAM convention) and a read-only pass ("read"), each
/// timed before and after the calls (a drift of the machine's memory speed during the run moves the ceilings
/// with the calls). Records are written as JSON objects of one line (JsonRecord).

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "vpce/communicator.hpp"

namespace vpce::bench {

struct Config {
  std::int64_t tokens = 4096;
  std::int64_t vocab = 65536;               ///< global vocabulary; split evenly over the ranks
  std::string dtype = "float32";            ///< float32 | float64 | bfloat16 | float16 (logits and gradient)
  int reps = 10;                            ///< timed repetitions (after one warm-up)
  std::vector<std::string> only;            ///< if not empty: run only records whose name starts with one of these
                                            ///< ("name$": the record of exactly that name)
  std::int64_t block_bytes_per_thread = 0;  ///< Options::block_bytes_per_thread; 0: the library's default
  bool huge_pages = false;  ///< Linux hosts: the logits and the output advised MADV_HUGEPAGE before their first
                            ///< touch (transparent huge pages in `madvise` mode); what a caller's allocator may do
};

struct Record {
  /// e.g. copy, forward/fused/recompute, forward_backward/seed/stash, loss_and_grad/fused[/in_place]
  std::string name;
  int ranks = 1;
  int threads = 1;  ///< Kokkos concurrency per rank
  std::int64_t tokens = 0;
  std::int64_t vocab_local = 0;  ///< the largest slice over the ranks
  std::string dtype;
  double ms_median = 0;  ///< median over reps of the max over ranks
  double ms_min = 0;
  double bytes = 0;              ///< bytes the operation must move per rank (logits read, gradient/stash written, ...)
  double gbps = 0;               ///< bytes / ms_median
  double ratio_to_copy = 0;      ///< ms_median / the copy's (plain stores: read-for-ownership) ms_median
  double ratio_to_stream = 0;    ///< ms_median / the streaming-store copy's ms_median
  double ratio_to_read = 0;      ///< ms_median / the read-only pass's ms_median
  double collective_ms = 0;      ///< median (slowest rank) time in vpce's collective regions; -1: not measured
  double collective_min_ms = 0;  ///< the same for the rank with the least (Timing::region_min_ms)
  double huge_page_share = -1;   ///< share of the logits' and output's bytes in huge pages (the smallest over the
                                 ///< ranks, from /proc/self/smaps_rollup after their first touch); -1: unknown
};

/// Collective: runs the benchmark; every rank returns the same records.
std::vector<Record> run(const Communicator& comm, const Config& config);

/// JSON array of records (with the Kokkos version, backend, and the vpce version in each record).
std::string to_json(const std::vector<Record>& records);

/// A fixed-width table for humans.
std::string to_table(const std::vector<Record>& records);

/// What time_op measured, in milliseconds.
struct Timing {
  double median_ms = 0;   ///< median over the repetitions of the slowest rank's time
  double min_ms = 0;      ///< the smallest of those
  double region_ms = -1;  ///< median over the repetitions of the slowest rank's time inside the Kokkos Tools regions
                          ///< named by time_op's `region`; -1: not measured (a Kokkos tool is loaded)
  double region_min_ms = -1;  ///< the same for the rank with the least such time: where region_ms is much larger,
                              ///< the ranks waited for each other (one ran slower), not for the collective itself
  std::vector<double> ms;     ///< each repetition's time (the slowest rank's), in the order run
};

/// THE timing of the harness: calls `op` once (warm-up), then `reps` times, each between a barrier and a fence,
/// and returns the median and minimum over the repetitions of the slowest rank's time, and the same median of the
/// time spent inside the Kokkos Tools regions whose name starts with `region` (vpce's "vpce::collective": the MPI
/// calls; "vpce::linear::gemm": LinearCrossEntropy's products), from region callbacks installed during the call
/// unless a Kokkos tool is loaded. Collective; every rank returns the same Timing.
Timing time_op(const Communicator& comm, int reps, const std::function<void()>& op,
               const std::string& region = "vpce::collective");

/// One record as a JSON object on one line, its fields in the order added:
/// `{"name": "copy", "ranks": 2, "ms_median": 1.5}` (numbers as a stream writes them, 6 significant digits).
class JsonRecord {
 public:
  JsonRecord& add(const std::string& key, const std::string& value);
  JsonRecord& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  template <class N, std::enable_if_t<std::is_arithmetic_v<N>, int> = 0>
  JsonRecord& add(const std::string& key, N value) {
    field(key) << value;
    return *this;
  }
  /// The object, "{...}".
  std::string str() const { return m_os.str() + "}"; }

 private:
  std::ostream& field(const std::string& key);
  std::ostringstream m_os;
  bool m_empty = true;
};

}  // namespace vpce::bench
