#include "bench.hpp"

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include "vpce/config.hpp"
#include "vpce/dtype.hpp"
#include "vpce/impl/stream.hpp"
#include "vpce/vpce.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace vpce::bench {

namespace {

using Exec = Kokkos::DefaultExecutionSpace;

// Time inside the Kokkos Tools regions time_op measures (vpce::collective: MPI calls, staging, waiting for the
// other ranks), from region callbacks installed while it runs (not when a Kokkos tool is loaded).
std::string g_region_prefix;
std::vector<std::pair<std::string, double>> g_regions;
double g_region_s = 0;
void push_region(const char* name) { g_regions.emplace_back(name, MPI_Wtime()); }
void pop_region() {
  if (g_regions.empty()) return;
  if (g_regions.back().first.rfind(g_region_prefix, 0) == 0) g_region_s += MPI_Wtime() - g_regions.back().second;
  g_regions.pop_back();
}
struct RegionTimer {
  bool active = !Kokkos::Profiling::profileLibraryLoaded();
  explicit RegionTimer(const std::string& prefix) {
    if (!active) return;
    g_region_prefix = prefix;
    g_regions.clear();
    Kokkos::Tools::Experimental::set_push_region_callback(push_region);
    Kokkos::Tools::Experimental::set_pop_region_callback(pop_region);
  }
  ~RegionTimer() {
    if (!active) return;
    Kokkos::Tools::Experimental::set_push_region_callback(nullptr);
    Kokkos::Tools::Experimental::set_pop_region_callback(nullptr);
  }
  RegionTimer(const RegionTimer&) = delete;
  RegionTimer& operator=(const RegionTimer&) = delete;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool wanted(const Config& c, const std::string& name) {
  if (c.only.empty()) return true;
  for (const auto& p : c.only) {
    if (!p.empty() && p.back() == '$') {  // "name$": that record only
      if (name == p.substr(0, p.size() - 1)) return true;
    } else if (name.rfind(p, 0) == 0) {
      return true;
    }
  }
  return false;
}

/// Advises the whole 2 MiB pages inside [p, p + bytes) MADV_HUGEPAGE (Linux; nothing elsewhere). Whether the
/// kernel gave huge pages shows in the records' huge_page_share.
void advise_huge_pages(void* p, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::size_t huge = std::size_t(2) << 20;
  const std::size_t skip = (huge - reinterpret_cast<std::uintptr_t>(p) % huge) % huge;  // to the first boundary
  if (bytes >= skip + huge) madvise(static_cast<char*>(p) + skip, (bytes - skip) / huge * huge, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

/// The process's anonymous memory in transparent huge pages, in bytes (/proc/self/smaps_rollup); -1: unknown.
double anon_huge_bytes() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string key;
  double kib = 0;
  while (in >> key) {
    if (key == "AnonHugePages:" && in >> kib) return kib * 1024.0;
    in.ignore(1 << 20, '\n');
  }
  return -1;
}

/// The read-only ceiling's pass over one row on the host: the sum of its values, for 16-bit logits of their raw
/// patterns as integers (float16's conversion to float is scalar code, which made this "ceiling" slower than the
/// forward). Four sums over the row's quarters at once, each a vector in registers: with one, the adds' latency
/// bounded fp32 (0.56 ms against 0.23 over 128 rows of 32768 in L3 in SSE2, 0.28 against 0.19 in AVX-512; AMD
/// Zen 5), and 32 partial sums in an array stayed in memory, a store and a load per 32 columns.
template <class S, class T>
KOKKOS_INLINE_FUNCTION T read_row(const S* x, std::int64_t cols) {
  using Sum = std::conditional_t<sizeof(S) == 2, std::uint32_t, T>;
  auto at = [x](std::int64_t j) -> Sum {
    if constexpr (sizeof(S) == 2) {
      std::uint16_t b;
      std::memcpy(&b, x + j, 2);
      return b;
    } else {
      return T(x[j]);
    }
  };
  const std::int64_t q = cols / 4;
  Sum s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (std::int64_t j = 0; j < q; ++j) {
    s0 += at(j);
    s1 += at(q + j);
    s2 += at(2 * q + j);
    s3 += at(3 * q + j);
  }
  Sum s = s0 + s1 + s2 + s3;
  for (std::int64_t j = 4 * q; j < cols; ++j) s += at(j);
  return T(s);
}

#if VPCE_HOST_CLONES
template <class S, class T>
struct ReadRow {  // a class, not a generic lambda: binutils 2.40 cannot demangle one in the copies' names
  const S* x;
  std::int64_t cols;
  T* r;
  template <class Level>
  void operator()(Level) const {
    *r = read_row<S, T>(x, cols);
  }
};
#endif

/// read_row compiled for the instruction sets the library's rows run with on this CPU: in a build with run-time
/// copies of the row loops (a build without -march on x86-64, vpce/impl/isa.hpp) the copy's, so that the ceiling
/// and the calls it is compared with use the same vectors. In the build's baseline (SSE2) the 16-bit read ran at
/// 0.55x its AVX-512 speed (fp32 0.86x; rows in L3, one thread, AMD Zen 5).
template <class S, class T>
KOKKOS_INLINE_FUNCTION T read_row_at_level(const S* x, std::int64_t cols) {
#if VPCE_HOST_CLONES
  T r = 0;
  impl::at_level(impl::host_level(), ReadRow<S, T>{x, cols, &r});
  return r;
#else
  return read_row<S, T>(x, cols);
#endif
}

/// Deterministic pseudo-random logits shaped like an LM head's: triangular noise with a column bias.
/// One flat index over all elements, so that device threads write consecutive addresses.
template <class S>
void fill(Kokkos::View<S**, Kokkos::LayoutRight> x, std::int64_t begin, std::uint64_t seed) {
  using T = compute_type_t<S>;
  const std::int64_t v = x.extent(1);
  if (v == 0) return;
  Kokkos::parallel_for(
      "vpce_bench::fill", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, std::int64_t(x.size())),
      KOKKOS_LAMBDA(std::int64_t k) {
        const std::int64_t i = k / v, j = k % v;
        std::uint64_t h = (std::uint64_t(i) * 0x9E3779B97F4A7C15ull) ^ (std::uint64_t(j + begin) + seed);
        h ^= h >> 33;
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
        const double u1 = double(h & 0xffffffu) / 16777216.0, u2 = double((h >> 24) & 0xffffffu) / 16777216.0;
        x(i, j) = S(T(4.0 * (u1 + u2 - 1.0) - 2.0 * double(j + begin) / double(v + begin + 1)));
      });
}

/// S: the logits' storage type; the gradient is written in S too (bytes counted at sizeof(S) per logit).
template <class S>
std::vector<Record> run_typed(const Communicator& comm, const Config& cfg) {
  using T = compute_type_t<S>;
  const auto part = VocabPartition::even(cfg.vocab, comm);
  const std::int64_t n = cfg.tokens, v = part.local_size(), v_max = part.max_local_size();

  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Exec::memory_space>::accessible;
  VPCE_THROW_IF(cfg.huge_pages && !host, "bench: huge pages apply to host memory only (this build's space is " +
                                             std::string(Exec::memory_space::name()) + ")");
  const double huge_before = host ? anon_huge_bytes() : -1;
  Kokkos::View<S**, Kokkos::LayoutRight> logits(Kokkos::view_alloc(Kokkos::WithoutInitializing, "logits"), n, v);
  Kokkos::View<S**, Kokkos::LayoutRight> out(Kokkos::view_alloc(Kokkos::WithoutInitializing, "out"), n, v);
  if (cfg.huge_pages) {  // before the first touch (fill, deep_copy below)
    advise_huge_pages(logits.data(), logits.span() * sizeof(S));
    advise_huge_pages(out.data(), out.span() * sizeof(S));
  }
  Kokkos::View<std::int64_t*> targets("targets", n);
  Kokkos::View<T*> loss("loss", n);
  fill(logits, part.begin(), 12345);
  const std::int64_t vocab = cfg.vocab;
  Kokkos::parallel_for(
      "vpce_bench::targets", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { targets(i) = std::int64_t((std::uint64_t(i) * 2654435761ull) % vocab); });
  Kokkos::deep_copy(out, S(T(0)));  // first touch
  Kokkos::fence();
  // The share of the two buffers in huge pages (the smallest over the ranks; -1 where a rank cannot tell).
  double huge_share = -1;
  if (host) {
    const double after = anon_huge_bytes(), buffers = 2.0 * double(logits.span()) * sizeof(S);
    double mine =
        huge_before < 0 || after < 0 || buffers == 0 ? -1 : std::clamp((after - huge_before) / buffers, 0.0, 1.0);
    MPI_Allreduce(MPI_IN_PLACE, &mine, 1, MPI_DOUBLE, MPI_MIN, comm.comm());
    huge_share = mine;
  }

  const double elem_bytes = double(n) * double(v_max) * sizeof(S);
  std::vector<Record> recs;
  auto record = [&](const std::string& name, double bytes, const Timing& t) {
    Record r;
    r.name = name;
    r.ranks = comm.size();
    r.threads = Exec().concurrency();
    r.tokens = n;
    r.vocab_local = v_max;
    r.dtype = cfg.dtype;
    r.ms_median = t.median_ms;
    r.ms_min = t.min_ms;
    r.collective_ms = t.region_ms;
    r.collective_min_ms = t.region_min_ms;
    r.bytes = bytes;
    r.gbps = bytes / (t.median_ms * 1e6);
    r.huge_page_share = huge_share;
    return r;
  };
  auto add = [&](const std::string& name, double bytes, const std::function<void()>& op) {
    if (wanted(cfg, name)) recs.push_back(record(name, bytes, time_op(comm, cfg.reps, op)));
  };

  // The ceilings, each over the same logits. "copy": read + write, with plain stores (on the host memcpy of
  // each row by the threads, a plain loop did not vectorise for the 16-bit types; on a device the runtime's
  // device-to-device copy): each written line is read first (read-for-ownership), 3 units of traffic for 2.
  // "copy_stream": read + write with streaming stores on the host (the STREAM convention: 2 units; a device
  // writes whole lines anyway, the same copy). "read": a read-only pass (read_row_at_level). Timed first and again
  // after the calls; each ceiling's median is over both sets of repetitions, so that a drift of the memory's speed
  // during the run does not move the ratios.
  using Rows = Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>;
  auto copy = [&](const bool stream) {
    if constexpr (host) {
      Kokkos::parallel_for(
          stream ? "vpce_bench::copy_stream" : "vpce_bench::copy", Rows(0, n), KOKKOS_LAMBDA(std::int64_t i) {
            if (stream) {
              impl::stream_copy(&out(i, 0), &logits(i, 0), v * sizeof(S));
            } else {
              std::memcpy(&out(i, 0), &logits(i, 0), v * sizeof(S));
            }
          });
    } else {
      Kokkos::deep_copy(out, logits);
    }
  };
  T read_sum = 0;
  auto read = [&] {
    if constexpr (host) {
      Kokkos::parallel_reduce(
          "vpce_bench::read", Rows(0, n),
          KOKKOS_LAMBDA(std::int64_t i, T & acc) { acc += read_row_at_level<S, T>(&logits(i, 0), v); }, read_sum);
    } else if constexpr (sizeof(S) == 2) {
      // 4-byte words, two 16-bit patterns each: one 2-byte load per thread kept an H200 at 3.2 of the 4.2 TB/s
      // it reads fp32 at. An odd n x v leaves its last pattern unread.
      const std::int64_t words = n * v / 2;
      const auto* x = reinterpret_cast<const std::uint32_t*>(logits.data());
      Kokkos::parallel_reduce(
          "vpce_bench::read", Rows(0, words),
          KOKKOS_LAMBDA(std::int64_t k, T & acc) { acc += T(float(x[k] >> 16u) + float(x[k] & 0xffffu)); }, read_sum);
    } else {
      const std::int64_t total = n * v;
      const S* x = logits.data();
      Kokkos::parallel_reduce(
          "vpce_bench::read", Rows(0, total), KOKKOS_LAMBDA(std::int64_t k, T & acc) { acc += T(x[k]); }, read_sum);
    }
  };
  struct Ceiling {
    std::string name;
    double bytes;
    std::function<void()> op;
    std::vector<double> ms;  // the first timing's repetitions
  };
  std::vector<Ceiling> ceilings = {{"copy", 2 * elem_bytes, [&] { copy(false); }, {}},
                                   {"copy_stream", 2 * elem_bytes, [&] { copy(true); }, {}},
                                   {"read", elem_bytes, read, {}}};
  for (auto& c : ceilings) {
    const Timing t = time_op(comm, cfg.reps, c.op);
    recs.push_back(record(c.name, c.bytes, t));
    c.ms = t.ms;
  }

  Options base;
  if (cfg.block_bytes_per_thread > 0) base.block_bytes_per_thread = cfg.block_bytes_per_thread;
  for (auto strategy : {Strategy::fused, Strategy::seed}) {
    const std::string s = to_string(strategy);
    if (wanted(cfg, "loss_and_grad/" + s)) {
      Options opt = base;
      opt.strategy = strategy;
      CrossEntropy<S> ce(comm, part, opt);
      add("loss_and_grad/" + s, 2 * elem_bytes, [&] { ce.loss_and_grad(logits, targets, loss, out, T(1)); });
    }
    for (auto mode : {Mode::recompute, Mode::stash_softmax}) {
      const std::string suffix = s + "/" + to_string(mode);
      if (!wanted(cfg, "forward/" + suffix) && !wanted(cfg, "backward/" + suffix) &&
          !wanted(cfg, "forward_backward/" + suffix))
        continue;
      Options opt = base;
      opt.strategy = strategy;
      opt.mode = mode;
      CrossEntropy<S> ce(comm, part, opt);
      const bool stash = mode == Mode::stash_softmax;
      // forward reads the logits (and writes the stash, in the compute type); backward reads logits or
      // stash and writes the gradient.
      const double stash_bytes = elem_bytes * double(sizeof(T)) / double(sizeof(S));
      add("forward/" + suffix, elem_bytes + (stash ? stash_bytes : 0), [&] { ce.forward(logits, targets, loss); });
      if (!wanted(cfg, "forward/" + suffix)) ce.forward(logits, targets, loss);  // backward needs one forward first
      add("backward/" + suffix, (stash ? stash_bytes : elem_bytes) + elem_bytes, [&] { ce.backward(T(1), out); });
      add("forward_backward/" + suffix, (stash ? 2 * stash_bytes + 2 * elem_bytes : 3 * elem_bytes), [&] {
        ce.forward(logits, targets, loss);
        ce.backward(T(1), out);
      });
    }
  }
  // In place: the gradient over the logits' own buffer (the lines are in cache when the gradient is written).
  // From the second call on the logits are gradients: finite values, the same work. Restored after.
  if (wanted(cfg, "loss_and_grad/fused/in_place")) {
    Kokkos::deep_copy(out, logits);
    CrossEntropy<S> ce(comm, part, base);
    add("loss_and_grad/fused/in_place", 2 * elem_bytes, [&] { ce.loss_and_grad(logits, targets, loss, logits, T(1)); });
    Kokkos::deep_copy(logits, out);
  }
  // The per-row outputs and the entropy in the loss: loss_and_grad/fused with one option on, each to be read
  // against loss_and_grad/fused of the same run (their cost). The output is asked for after each call, as a
  // user would: entropy (its statistic in the records: 5 values per row instead of 4), the target's
  // log-prob, the z-loss terms (with a z-loss); the entropy weight changes the gradient (no stored exps).
  // Class weights (all V gathered once, before the timing): alone (a row constant), and with label smoothing
  // (a term per column: the weights are read beside the logits, no stored exps).
  struct OutputCase {
    const char* name;
    void (*set)(Options&);
    Kokkos::View<const T*, typename CrossEntropy<S>::memory_space> (CrossEntropy<S>::*get)() const;
    bool weights = false;
  };
  const OutputCase output_cases[] = {
      {"loss_and_grad/fused/entropy", [](Options& o) { o.entropy = true; }, &CrossEntropy<S>::entropy},
      {"loss_and_grad/fused/logprob", [](Options&) {}, &CrossEntropy<S>::logprob},
      {"loss_and_grad/fused/z_loss_out", [](Options& o) { o.z_loss = 1e-4; }, &CrossEntropy<S>::z_loss_terms},
      {"loss_and_grad/fused/entropy_weight", [](Options& o) { o.entropy_weight = 0.1; }, nullptr},
      {"loss_and_grad/fused/weights", [](Options&) {}, nullptr, true},
      {"loss_and_grad/fused/smoothing", [](Options& o) { o.label_smoothing = 0.1; }, nullptr},
      {"loss_and_grad/fused/weights_smoothing", [](Options& o) { o.label_smoothing = 0.1; }, nullptr, true}};
  for (const auto& oc : output_cases) {
    if (!wanted(cfg, oc.name)) continue;
    Options opt = base;
    oc.set(opt);
    CrossEntropy<S> ce(comm, part, opt);
    if (oc.weights) {
      Kokkos::View<T*, typename CrossEntropy<S>::memory_space> w("vpce_bench::class_weights", part.local_size());
      Kokkos::deep_copy(w, T(0.5));
      ce.set_class_weights(w);
    }
    add(oc.name, 2 * elem_bytes, [&] {
      ce.loss_and_grad(logits, targets, loss, out, T(1));
      if (oc.get != nullptr) (ce.*oc.get)();
    });
  }
  // Probability targets (Options::probability_targets): a target distribution per row (uniform, 1/V each,
  // exact in every type) read beside the logits: one more read of N x V_local, and no stored exps. Also the
  // recompute backward with them (after one forward): q read beside the logits.
  if (wanted(cfg, "loss_and_grad/fused/probs") || wanted(cfg, "backward/fused/recompute/probs")) {
    Kokkos::View<S**, Kokkos::LayoutRight> probs(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce_bench::probs"),
                                                 n, v);
    Kokkos::deep_copy(probs, S(T(1.0 / double(part.vocab_size()))));
    const typename CrossEntropy<S>::probs_view q(probs);
    Options opt = base;
    opt.probability_targets = true;
    if (wanted(cfg, "loss_and_grad/fused/probs")) {
      CrossEntropy<S> ce(comm, part, opt);
      add("loss_and_grad/fused/probs", 3 * elem_bytes, [&] { ce.loss_and_grad(logits, q, loss, out, T(1)); });
    }
    if (wanted(cfg, "backward/fused/recompute/probs")) {
      opt.mode = Mode::recompute;
      CrossEntropy<S> ce(comm, part, opt);
      ce.forward(logits, q, loss);
      add("backward/fused/recompute/probs", 3 * elem_bytes, [&] { ce.backward(T(1), out); });
    }
  }
  for (std::size_t k = 0; k < ceilings.size(); ++k) {  // the ceilings again, after the calls
    std::vector<double> ms = ceilings[k].ms;
    const Timing t = time_op(comm, cfg.reps, ceilings[k].op);
    ms.insert(ms.end(), t.ms.begin(), t.ms.end());
    Record& r = recs[k];
    r.ms_median = median(ms);
    r.ms_min = *std::min_element(ms.begin(), ms.end());
    r.gbps = r.bytes / (r.ms_median * 1e6);
  }
  const double copy_ms = recs[0].ms_median, stream_ms = recs[1].ms_median, read_ms = recs[2].ms_median;
  for (auto& r : recs) {
    r.ratio_to_copy = r.ms_median / copy_ms;
    r.ratio_to_stream = r.ms_median / stream_ms;
    r.ratio_to_read = r.ms_median / read_ms;
  }
  return recs;
}

}  // namespace

std::vector<Record> run(const Communicator& comm, const Config& config) {
  VPCE_THROW_IF(config.tokens < 1 || config.vocab < 1 || config.reps < 1,
                "bench: --tokens, --vocab and --reps must be positive");
  const std::optional<DType> dtype = parse_dtype(config.dtype);
  VPCE_THROW_IF(!dtype, "bench: unknown dtype '" + config.dtype + "' (expected float32, float64, bfloat16 or float16)");
  return dispatch(*dtype, [&](auto tag) { return run_typed<typename decltype(tag)::type>(comm, config); });
}

Timing time_op(const Communicator& comm, int reps, const std::function<void()>& op, const std::string& region) {
  const RegionTimer timer(region);
  op();
  Kokkos::fence();
  std::vector<double> ms, in_region, in_region_min;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(comm.comm());
    g_region_s = 0;
    const double t0 = MPI_Wtime();
    op();
    Kokkos::fence();
    // The max of the time and the region time, and the min of the region time (as a max of its negative).
    double mine[3] = {(MPI_Wtime() - t0) * 1e3, g_region_s * 1e3, -g_region_s * 1e3}, worst[3];
    MPI_Allreduce(mine, worst, 3, MPI_DOUBLE, MPI_MAX, comm.comm());
    ms.push_back(worst[0]);
    in_region.push_back(worst[1]);
    in_region_min.push_back(-worst[2]);
  }
  Timing t;
  t.ms = ms;
  t.median_ms = median(ms);
  t.min_ms = *std::min_element(ms.begin(), ms.end());
  t.region_ms = timer.active ? median(in_region) : -1;
  t.region_min_ms = timer.active ? median(in_region_min) : -1;
  return t;
}

std::ostream& JsonRecord::field(const std::string& key) {
  m_os << (m_empty ? "{" : ", ") << '"' << key << "\": ";
  m_empty = false;
  return m_os;
}

JsonRecord& JsonRecord::add(const std::string& key, const std::string& value) {
  std::ostream& os = field(key);
  os << '"';
  for (const char c : value) {
    if (c == '"' || c == '\\') os << '\\';
    os << c;
  }
  os << '"';
  return *this;
}

std::string to_json(const std::vector<Record>& records) {
  std::ostringstream os;
  os << "[\n";
  for (std::size_t k = 0; k < records.size(); ++k) {
    const auto& r = records[k];
    JsonRecord j;
    j.add("name", r.name).add("ranks", r.ranks).add("threads", r.threads).add("tokens", r.tokens);
    j.add("vocab_local", r.vocab_local).add("dtype", r.dtype).add("ms_median", r.ms_median).add("ms_min", r.ms_min);
    j.add("bytes", r.bytes).add("gbps", r.gbps).add("ratio_to_copy", r.ratio_to_copy);
    j.add("ratio_to_stream", r.ratio_to_stream).add("ratio_to_read", r.ratio_to_read);
    j.add("collective_ms", r.collective_ms)
        .add("collective_min_ms", r.collective_min_ms)
        .add("huge_page_share", r.huge_page_share)
        .add("backend", Exec::name())
        .add("kokkos_version", KOKKOS_VERSION);
    j.add("vpce_version", VPCE_VERSION_STRING);
    os << "  " << j.str() << (k + 1 < records.size() ? "," : "") << "\n";
  }
  os << "]\n";
  return os.str();
}

std::string to_table(const std::vector<Record>& records) {
  std::ostringstream os;
  char line[256];
  if (!records.empty()) {
    std::snprintf(line, sizeof line, "%d rank(s) x %d thread(s), %lld tokens, V_local %lld, %s\n", records[0].ranks,
                  records[0].threads, (long long)records[0].tokens, (long long)records[0].vocab_local,
                  records[0].dtype.c_str());
    os << line;
    if (records[0].huge_page_share >= 0) {
      std::snprintf(line, sizeof line, "logits and output in huge pages: %.0f%% (the smallest share over the ranks)\n",
                    100 * records[0].huge_page_share);
      os << line;
    }
  }
  std::snprintf(line, sizeof line, "%-36s %10s %10s %8s %8s %8s %8s %10s\n", "name", "ms(median)", "ms(min)", "GB/s",
                "x copy", "x stream", "x read", "MPI ms");
  os << line;
  for (const auto& r : records) {
    std::snprintf(line, sizeof line, "%-36s %10.2f %10.2f %8.2f %8.2f %8.2f %8.2f %10.3f\n", r.name.c_str(),
                  r.ms_median, r.ms_min, r.gbps, r.ratio_to_copy, r.ratio_to_stream, r.ratio_to_read, r.collective_ms);
    os << line;
  }
  return os.str();
}

}  // namespace vpce::bench
