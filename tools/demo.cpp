/// \file demo.cpp
/// \brief `vpce demo` (a realistic batch, checked and timed) and `vpce bench`.

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "h5io.hpp"
#include "tool.hpp"
#include "vpce/vpce.hpp"

namespace vpce::tool {

const char* const demo_help =
    "Usage: mpirun -n W vpce demo [--tokens 4096] [--vocab 50304] [OPTIONS]\n"
    "\n"
    "Builds a batch shaped like a language model's head output on every rank (its own columns of the same\n"
    "deterministic logits: Zipf-like column bias, Gaussian noise, a few large logits, a confident boost of the\n"
    "target; targets drawn from the Zipf distribution), evenly partitioned. Runs both strategies (fused, seed)\n"
    "both ways (loss_and_grad, forward+backward), checks that they agree with each other on every row and with\n"
    "a single-rank float64 computation of the whole vocabulary on sampled rows, prints the mean loss, then times\n"
    "them with the benchmark harness next to a copy of the same logits. Exits 1 if a check fails.\n"
    "\n"
    "Options:\n"
    "  --tokens N       tokens (rows), default 4096\n"
    "  --vocab V        global vocabulary, default 50304 (GPT-2's, padded)\n"
    "  --dtype T        float32 (default) | float64\n"
    "  --check-rows K   rows checked against the float64 reference, default 64 (evenly spaced)\n"
    "  --seed S         generator seed, default 2024\n"
    "  --reps R         timed repetitions, default 5\n"
    "  --no-bench       checks only, no timing\n"
    "  -h, --help       this help\n";

const char* const bench_help =
    "Usage: mpirun -n W vpce bench --tokens N --vocab V [OPTIONS]\n"
    "\n"
    "Times loss_and_grad, forward, backward and forward+backward of both strategies (fused: one all-reduce;\n"
    "seed: Megatron-LM's three) and both memory modes on N x V logits split evenly over the ranks, next to a\n"
    "copy of the same logits (the memory ceiling). Times are medians over repetitions of the slowest rank.\n"
    "\n"
    "Options:\n"
    "  --tokens N       tokens (rows), default 4096\n"
    "  --vocab V        global vocabulary, default 65536\n"
    "  --dtype T        float32 (default) | float64 | bfloat16 | float16 (logits and gradient)\n"
    "  --reps R         timed repetitions after one warm-up, default 10\n"
    "  --only P1,P2     only the records whose name starts with one of these (e.g. loss_and_grad,forward/fused;\n"
    "                   P$: only the record named P)\n"
    "  --json FILE      also write the records as JSON (rank 0, through a temporary name)\n"
    "  --huge-pages     advise the logits and the output MADV_HUGEPAGE before their first touch (Linux hosts,\n"
    "                   transparent huge pages in madvise mode); the table says what share the kernel gave\n"
    "  -h, --help       this help\n";

// A named namespace, not an anonymous one: CUDA's extended lambdas want enclosing functions with a name.
namespace demo_detail {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

/// Counter-based generator: any rank computes any logit (i, j) without communication, and rank 0's
/// whole-vocabulary reference sees exactly the values the ranks hold.
struct Generator {
  std::uint64_t seed = 0;
  double sigma = 1.5;  // noise around the column bias
  double spike = 6.0;  // a few large logits (about 1 in 1024)

  KOKKOS_INLINE_FUNCTION static std::uint64_t mix(std::uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Zero-mean, unit-variance noise (a sum of four 16-bit uniforms, scaled) plus the rare spike.
  KOKKOS_INLINE_FUNCTION double noise(std::int64_t i, std::int64_t j) const {
    const std::uint64_t h = mix(seed ^ mix(std::uint64_t(i) * 0xD1B54A32D192ED03ull + std::uint64_t(j)));
    const double u = double(h & 0xffffu) + double((h >> 16) & 0xffffu) + double((h >> 32) & 0xffffu) + double(h >> 48);
    double x = sigma * (u / 65536.0 - 2.0) * 1.7320508075688772;
    if ((mix(h) & 1023u) == 0) x += spike;
    return x;
  }
  KOKKOS_INLINE_FUNCTION double logit(std::int64_t i, std::int64_t j, double bias, std::int64_t target,
                                      double boost) const {
    return bias + noise(i, j) + (j == target ? boost : 0.0);
  }
  double uniform(std::uint64_t stream, std::int64_t i) const {
    return double(mix(seed ^ mix(stream * 0x9E3779B97F4A7C15ull + std::uint64_t(i))) >> 11) * 0x1.0p-53;
  }
};

/// The frequency rank of column j is (j * p) mod V, so frequent tokens are spread over every rank's columns.
struct ColumnOrder {
  std::int64_t v = 1, p = 1, p_inv = 1;
  explicit ColumnOrder(std::int64_t vocab) : v(vocab) {
    for (std::int64_t cand : {1000003LL, 999983LL, 7919LL, 104729LL, 15485863LL}) {
      if (vocab % cand != 0) {
        p = cand % vocab;
        break;
      }
    }
    // Modular inverse of p (extended Euclid); gcd(p, v) = 1 since p is a prime not dividing v.
    __int128 t = 0, new_t = 1, r = v, new_r = p;
    while (new_r != 0) {
      const __int128 q = r / new_r;
      std::swap(t, new_t);
      new_t -= q * t;
      std::swap(r, new_r);
      new_r -= q * r;
    }
    if (t < 0) t += v;
    p_inv = v == 1 ? 0 : static_cast<std::int64_t>(t);
    if (v == 1) p = 0;
  }
  std::int64_t rank_of(std::int64_t j) const { return static_cast<std::int64_t>((__int128)j * p % v); }
  std::int64_t column_of(std::int64_t r) const { return static_cast<std::int64_t>((__int128)r * p_inv % v); }
};

struct Batch {
  std::int64_t n = 0, v = 0;
  Generator gen;
  std::vector<double> bias;           // all V columns (every rank: cheap, and the reference needs it)
  std::vector<std::int64_t> targets;  // N
  std::vector<double> boost;          // N: how confident the "model" is about the target
};

Batch make_batch(std::int64_t n, std::int64_t v, std::uint64_t seed) {
  Batch b;
  b.n = n;
  b.v = v;
  b.gen.seed = seed;
  const ColumnOrder order(v);
  const double zipf = 1.1;
  b.bias.resize(v);
  for (std::int64_t j = 0; j < v; ++j) b.bias[j] = 4.0 - zipf * std::log1p(double(order.rank_of(j)));
  std::vector<double> cdf(v);
  double acc = 0;
  for (std::int64_t r = 0; r < v; ++r) cdf[r] = (acc += std::pow(double(r + 1), -zipf));
  b.targets.resize(n);
  b.boost.resize(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const double u = b.gen.uniform(1, i) * acc;
    const std::int64_t r = std::min<std::int64_t>(v - 1, std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    b.targets[i] = order.column_of(r);
    b.boost[i] = 10.0 * b.gen.uniform(2, i);
  }
  return b;
}

template <class T>
struct DemoRun {
  std::string name;
  double loss_vs_ref = 0, grad_vs_ref = 0;      // sampled rows, against float64 whole-vocabulary reference
  double loss_vs_first = 0, grad_vs_first = 0;  // every row, against the first run
};

template <class T>
int run_demo(const Communicator& comm, const Args& args) {
  const std::int64_t n = args.get_int("tokens", 4096, 1, std::int64_t(1) << 40);
  const std::int64_t v = args.get_int("vocab", 50304, 1, std::int64_t(1) << 40);
  const std::int64_t check_rows = args.get_int("check-rows", 64, 1, std::int64_t(1) << 40);
  const auto seed = static_cast<std::uint64_t>(args.get_int("seed", 2024, 0, INT64_MAX));
  const int reps = static_cast<int>(args.get_int("reps", 5, 1, 1000000));
  const std::string dtype = sizeof(T) == 4 ? "float32" : "float64";

  const VocabPartition part = VocabPartition::even(v, comm);
  const std::int64_t vl = part.local_size(), begin = part.begin();
  {
    std::ostringstream s;
    s << "vpce demo: " << n << " tokens x " << v << " vocabulary, " << dtype << ", " << comm.size() << " rank(s) x "
      << Exec().concurrency() << " thread(s) (" << Exec::name() << "), " << part.local_size(comm.size() - 1) << ".."
      << part.local_size(0) << " columns per rank\n";
    print0(comm, s.str());
  }

  Batch batch;
  collectively(comm, [&] { batch = make_batch(n, v, seed); });

  using Mat = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
  Mat logits, grad_first, grad;
  Kokkos::View<std::int64_t*, Mem> targets;
  Kokkos::View<T*, Mem> loss_first, loss, lse_first;
  collectively(comm, [&] {
    logits = Mat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::demo::logits"), n, vl);
    grad_first = Mat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::demo::grad_first"), n, vl);
    grad = Mat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "vpce::demo::grad"), n, vl);
    targets = decltype(targets)("vpce::demo::targets", n);
    loss_first = decltype(loss_first)("vpce::demo::loss_first", n);
    loss = decltype(loss)("vpce::demo::loss", n);
    lse_first = decltype(lse_first)("vpce::demo::lse_first", n);

    Kokkos::View<double*, Mem> bias("vpce::demo::bias", vl), boost("vpce::demo::boost", n);
    auto h_bias = Kokkos::create_mirror_view(bias);
    auto h_boost = Kokkos::create_mirror_view(boost);
    auto h_targets = Kokkos::create_mirror_view(targets);
    for (std::int64_t j = 0; j < vl; ++j) h_bias(j) = batch.bias[begin + j];
    for (std::int64_t i = 0; i < n; ++i) {
      h_boost(i) = batch.boost[i];
      h_targets(i) = batch.targets[i];
    }
    Kokkos::deep_copy(bias, h_bias);
    Kokkos::deep_copy(boost, h_boost);
    Kokkos::deep_copy(targets, h_targets);
    const Generator gen = batch.gen;
    const auto x = logits;
    const auto t = targets;
    Kokkos::parallel_for(
        "vpce::demo::generate", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, n),
        KOKKOS_LAMBDA(std::int64_t i) {
          for (std::int64_t j = 0; j < vl; ++j) x(i, j) = T(gen.logit(i, begin + j, bias(j), t(i), boost(i)));
        });
    Kokkos::fence();
  });

  // The float64 whole-vocabulary reference of the sampled rows (every rank computes it: each checks its own
  // gradient columns against it; rank 0's is the single-rank loss).
  std::vector<std::int64_t> rows;
  const std::int64_t k_rows = std::min(check_rows, n);
  for (std::int64_t k = 0; k < k_rows; ++k) rows.push_back(k_rows == 1 ? 0 : k * (n - 1) / (k_rows - 1));
  std::vector<double> ref_lse(rows.size()), ref_loss(rows.size());
  std::vector<double> row(v);
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const std::int64_t i = rows[k];
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < v; ++j) {
      row[j] = double(T(batch.gen.logit(i, j, batch.bias[j], batch.targets[i], batch.boost[i])));
      m = std::max(m, row[j]);
    }
    double s = 0;
    for (std::int64_t j = 0; j < v; ++j) s += std::exp(row[j] - m);
    ref_lse[k] = m + std::log(s);
    ref_loss[k] = ref_lse[k] - row[batch.targets[i]];
  }

  auto h_loss = Kokkos::create_mirror_view(loss);
  Kokkos::View<T*, Kokkos::HostSpace> h_row("vpce::demo::row", vl);
  auto compare_to_reference = [&](const Kokkos::View<T*, Mem>& l, const Mat& g, DemoRun<T>& out) {
    Kokkos::deep_copy(h_loss, l);
    double dl = 0, dg = 0;
    for (std::size_t k = 0; k < rows.size(); ++k) {
      const std::int64_t i = rows[k];
      const double scale = std::max(1.0, std::abs(ref_lse[k]));
      dl = std::max(dl, std::abs(double(h_loss(i)) - ref_loss[k]) / scale);
      Kokkos::deep_copy(h_row, Kokkos::subview(g, i, Kokkos::ALL));
      for (std::int64_t jl = 0; jl < vl; ++jl) {
        const std::int64_t j = begin + jl;
        const double x = double(T(batch.gen.logit(i, j, batch.bias[j], batch.targets[i], batch.boost[i])));
        const double want = std::exp(x - ref_lse[k]) - (j == batch.targets[i] ? 1.0 : 0.0);
        dg = std::max(dg, std::abs(double(h_row(jl)) - want) / scale);
      }
    }
    double in[2] = {dl, dg}, red[2];
    VPCE_MPI_CHECK(MPI_Allreduce(in, red, 2, MPI_DOUBLE, MPI_MAX, comm.comm()));
    out.loss_vs_ref = red[0];
    out.grad_vs_ref = red[1];
  };
  auto compare_to_first = [&](DemoRun<T>& out) {
    double dl = 0, dg = 0;
    const auto &l0 = loss_first, &l1 = loss;
    const auto& lse = lse_first;
    Kokkos::parallel_reduce(
        "vpce::demo::loss_diff", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, n),
        KOKKOS_LAMBDA(std::int64_t i, double& m) {
          const double d = double(l0(i)) - double(l1(i)), a = double(lse(i));
          const double r = (d < 0 ? -d : d) / (a > 1.0 ? a : (a < -1.0 ? -a : 1.0));
          m = r > m ? r : m;
        },
        Kokkos::Max<double>(dl));
    const auto &g0 = grad_first, &g1 = grad;
    Kokkos::parallel_reduce(
        "vpce::demo::grad_diff", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, n),
        KOKKOS_LAMBDA(std::int64_t i, double& m) {
          const double a = double(lse(i));
          const double scale = a > 1.0 ? a : (a < -1.0 ? -a : 1.0);
          for (std::int64_t j = 0; j < vl; ++j) {
            const double d = double(g0(i, j)) - double(g1(i, j));
            const double r = (d < 0 ? -d : d) / scale;
            m = r > m ? r : m;
          }
        },
        Kokkos::Max<double>(dg));
    double in[2] = {dl, dg}, red[2];
    VPCE_MPI_CHECK(MPI_Allreduce(in, red, 2, MPI_DOUBLE, MPI_MAX, comm.comm()));
    out.loss_vs_first = red[0];
    out.grad_vs_first = red[1];
  };

  // The four ways: fused and seed strategies, each as loss_and_grad and as forward + backward (the fused
  // strategy recomputes the softmax in backward; the seed's way stashes it).
  std::vector<DemoRun<T>> results;
  struct Way {
    const char* name;
    Strategy strategy;
    bool fused_call;
    Mode mode;
  };
  const Way ways[] = {{"fused loss_and_grad", Strategy::fused, true, Mode::recompute},
                      {"seed  loss_and_grad", Strategy::seed, true, Mode::recompute},
                      {"fused forward+backward (recompute)", Strategy::fused, false, Mode::recompute},
                      {"seed  forward+backward (stash)", Strategy::seed, false, Mode::stash_softmax}};
  for (const auto& w : ways) {
    const bool first = results.empty();
    const auto l = first ? loss_first : loss;
    const auto g = first ? grad_first : grad;
    DemoRun<T> r;
    r.name = w.name;
    collectively(comm, [&] {
      Options opt;
      opt.strategy = w.strategy;
      opt.mode = w.mode;
      CrossEntropy<T> ce(comm, part, opt);
      if (w.fused_call) {
        ce.loss_and_grad(logits, targets, l, g, T(1));
      } else {
        ce.forward(logits, targets, l);
        ce.backward(T(1), g);
      }
      if (first) Kokkos::deep_copy(lse_first, ce.lse());
      Kokkos::fence();
    });
    compare_to_reference(l, g, r);
    if (!first) compare_to_first(r);
    results.push_back(r);
  }

  double mean = 0;
  {
    auto h = Kokkos::create_mirror_view(loss_first);
    Kokkos::deep_copy(h, loss_first);
    for (std::int64_t i = 0; i < n; ++i) mean += double(h(i));
    mean /= double(n);
  }
  // Errors are measured relative to max(1, |lse|) of the row: the loss is lse minus a logit, and the
  // gradient's largest entries are probabilities times exp of lse's error. Rounding of the sum of V
  // exponentials grows like sqrt(V) ulps (V in the worst case); 4 eps sqrt(V) + 16 eps leaves room for the
  // order of summation, which differs between the strategies and the reference, and no room for a wrong term.
  const double eps = std::numeric_limits<T>::epsilon();
  const double tol_loss = eps * (4.0 * std::sqrt(double(v)) + 16.0), tol_grad = tol_loss;
  bool ok = true;
  std::ostringstream s;
  char line[256];
  std::snprintf(line, sizeof line, "  mean loss %.6f nats (perplexity %.1f) over %lld tokens\n", mean, std::exp(mean),
                (long long)n);
  s << line;
  std::snprintf(line, sizeof line, "  checks: largest error relative to max(1, |lse|) of its row (tolerance %.1e)\n",
                tol_loss);
  s << line;
  std::snprintf(line, sizeof line, "  %-36s %26s %26s\n", "", "vs float64 reference", "vs fused loss_and_grad");
  s << line;
  std::snprintf(line, sizeof line, "  %-36s %12s %13s %12s %13s\n", "", "loss", "gradient", "loss", "gradient");
  s << line;
  for (std::size_t k = 0; k < results.size(); ++k) {
    const auto& r = results[k];
    const bool good = r.loss_vs_ref <= tol_loss && r.grad_vs_ref <= tol_grad && r.loss_vs_first <= tol_loss &&
                      r.grad_vs_first <= tol_grad;
    ok = ok && good;
    if (k == 0) {
      std::snprintf(line, sizeof line, "  %-36s %12.2e %13.2e %12s %13s  %s\n", r.name.c_str(), r.loss_vs_ref,
                    r.grad_vs_ref, "-", "-", good ? "ok" : "FAILED");
    } else {
      std::snprintf(line, sizeof line, "  %-36s %12.2e %13.2e %12.2e %13.2e  %s\n", r.name.c_str(), r.loss_vs_ref,
                    r.grad_vs_ref, r.loss_vs_first, r.grad_vs_first, good ? "ok" : "FAILED");
    }
    s << line;
  }
  std::snprintf(line, sizeof line, "  (%zu rows vs the reference; every row and column vs fused loss_and_grad)\n",
                rows.size());
  s << line;
  print0(comm, s.str());
  if (!ok) throw Error("demo: the strategies disagree beyond the tolerance (see the table above)");

  // Free the demo's buffers before the benchmark allocates its own.
  logits = grad = grad_first = Mat();

  if (!args.has("no-bench")) {
    bench::Config cfg;
    cfg.tokens = n;
    cfg.vocab = v;
    cfg.dtype = dtype;
    cfg.reps = reps;
    cfg.only = {"copy", "loss_and_grad/", "forward_backward/"};
    std::vector<bench::Record> recs;
    collectively(comm, [&] { recs = bench::run(comm, cfg); });
    std::ostringstream t;
    std::snprintf(line, sizeof line,
                  "  timing (median of %d, slowest rank; the benchmark's own %s logits of the same size), with the\n"
                  "  same run's ceilings: copy (read + write, plain stores), copy_stream (streaming stores), read:\n",
                  reps, dtype.c_str());
    t << line;
    std::snprintf(line, sizeof line, "  %-36s %10s %8s %8s %8s %8s\n", "", "ms", "GB/s", "x copy", "x stream",
                  "x read");
    t << line;
    for (const auto& r : recs) {
      std::snprintf(line, sizeof line, "  %-36s %10.2f %8.2f %8.2f %8.2f %8.2f\n", r.name.c_str(), r.ms_median, r.gbps,
                    r.ratio_to_copy, r.ratio_to_stream, r.ratio_to_read);
      t << line;
    }
    print0(comm, t.str());
  }
  return 0;
}

}  // namespace demo_detail

int cmd_demo(const Communicator& comm, const std::vector<std::string>& argv) {
  Args args("demo",
            {{"tokens", true},
             {"vocab", true},
             {"dtype", true},
             {"check-rows", true},
             {"seed", true},
             {"reps", true},
             {"no-bench", false}},
            argv);
  if (args.help()) {
    print0(comm, demo_help);
    return 0;
  }
  const std::string dtype = args.get_choice("dtype", "float32", {"float32", "float64"});
  return dtype == "float32" ? demo_detail::run_demo<float>(comm, args) : demo_detail::run_demo<double>(comm, args);
}

int cmd_bench(const Communicator& comm, const std::vector<std::string>& argv) {
  Args args("bench",
            {{"tokens", true},
             {"vocab", true},
             {"dtype", true},
             {"reps", true},
             {"json", true},
             {"only", true},
             {"huge-pages", false}},
            argv);
  if (args.help()) {
    print0(comm, bench_help);
    return 0;
  }
  bench::Config cfg;
  cfg.tokens = args.get_int("tokens", cfg.tokens, 1, std::int64_t(1) << 40);
  cfg.vocab = args.get_int("vocab", cfg.vocab, 1, std::int64_t(1) << 40);
  cfg.dtype = args.get_choice("dtype", "float32", {"float32", "float64", "bfloat16", "float16"});
  cfg.reps = static_cast<int>(args.get_int("reps", cfg.reps, 1, 1000000));
  if (args.has("only")) cfg.only = demo_detail::split_commas(args.get("only"));
  cfg.huge_pages = args.has("huge-pages");
  const std::string json = args.get("json");
  if (!json.empty()) check_writable(comm, json, "JSON output");
  std::vector<bench::Record> recs;
  collectively(comm, [&] { recs = bench::run(comm, cfg); });
  print0(comm, bench::to_table(recs));
  if (!json.empty()) write_text_file(comm, json, bench::to_json(recs));
  return 0;
}

}  // namespace vpce::tool
