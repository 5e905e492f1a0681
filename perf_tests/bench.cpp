#include "bench.hpp"

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include "vpce/config.hpp"
#include "vpce/vpce.hpp"

namespace vpce::bench {

namespace {

using Exec = Kokkos::DefaultExecutionSpace;

bool wanted(const Config& c, const std::string& name) {
  if (c.only.empty()) return true;
  for (const auto& p : c.only)
    if (name.rfind(p, 0) == 0) return true;
  return false;
}

/// Median and minimum over reps of the slowest rank's time of `op` (after one warm-up call).
std::pair<double, double> time_op(const Communicator& comm, int reps, const std::function<void()>& op) {
  op();
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(comm.comm());
    const double t0 = MPI_Wtime();
    op();
    Kokkos::fence();
    double dt = (MPI_Wtime() - t0) * 1e3, worst = 0;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, comm.comm());
    ms.push_back(worst);
  }
  std::sort(ms.begin(), ms.end());
  const std::size_t n = ms.size();
  const double median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return {median, ms.front()};
}

/// Deterministic pseudo-random logits shaped like an LM head's: Gaussian-ish noise with a column bias.
template <class S>
void fill(Kokkos::View<S**, Kokkos::LayoutRight> x, std::int64_t begin, std::uint64_t seed) {
  using T = compute_type_t<S>;
  const std::int64_t v = x.extent(1);
  Kokkos::parallel_for(
      "vpce_bench::fill", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, x.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) {
        for (std::int64_t j = 0; j < v; ++j) {
          std::uint64_t h = (std::uint64_t(i) * 0x9E3779B97F4A7C15ull) ^ (std::uint64_t(j + begin) + seed);
          h ^= h >> 33;
          h *= 0xff51afd7ed558ccdull;
          h ^= h >> 33;
          // sum of two uniforms: triangular noise on [-4, 4], plus a smooth column bias
          const double u1 = double(h & 0xffffffu) / 16777216.0, u2 = double((h >> 24) & 0xffffffu) / 16777216.0;
          x(i, j) = S(T(4.0 * (u1 + u2 - 1.0) - 2.0 * double(j + begin) / double(v + begin + 1)));
        }
      });
}

/// S: the logits' storage type; the gradient is written in S too (bytes counted at sizeof(S) per logit).
template <class S>
std::vector<Record> run_typed(const Communicator& comm, const Config& cfg) {
  using T = compute_type_t<S>;
  const auto part = VocabPartition::even(cfg.vocab, comm);
  const std::int64_t n = cfg.tokens, v = part.local_size();
  std::int64_t v_max = 0;
  MPI_Allreduce(&v, &v_max, 1, MPI_INT64_T, MPI_MAX, comm.comm());

  Kokkos::View<S**, Kokkos::LayoutRight> logits(Kokkos::view_alloc(Kokkos::WithoutInitializing, "logits"), n, v);
  Kokkos::View<S**, Kokkos::LayoutRight> out(Kokkos::view_alloc(Kokkos::WithoutInitializing, "out"), n, v);
  Kokkos::View<std::int64_t*> targets("targets", n);
  Kokkos::View<T*> loss("loss", n);
  fill(logits, part.begin(), 12345);
  const std::int64_t vocab = cfg.vocab;
  Kokkos::parallel_for(
      "vpce_bench::targets", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { targets(i) = std::int64_t((std::uint64_t(i) * 2654435761ull) % vocab); });
  Kokkos::deep_copy(out, S(T(0)));  // first touch
  Kokkos::fence();

  const double elem_bytes = double(n) * double(v_max) * sizeof(S);
  std::vector<Record> recs;
  auto add = [&](const std::string& name, double bytes, const std::function<void()>& op) {
    if (!wanted(cfg, name) && name != "copy") return;
    const auto [med, mn] = time_op(comm, cfg.reps, op);
    Record r;
    r.name = name;
    r.ranks = comm.size();
    r.threads = Exec().concurrency();
    r.tokens = n;
    r.vocab_local = v_max;
    r.dtype = cfg.dtype;
    r.ms_median = med;
    r.ms_min = mn;
    r.bytes = bytes;
    r.gbps = bytes / (med * 1e6);
    recs.push_back(r);
  };

  // The ceiling: a copy of the logits, read + write, by a plain vectorised kernel.
  add("copy", 2 * elem_bytes, [&] {
    Kokkos::parallel_for(
        "vpce_bench::copy", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, n), KOKKOS_LAMBDA(std::int64_t i) {
          const S* src = &logits(i, 0);
          S* dst = &out(i, 0);
          for (std::int64_t j = 0; j < v; ++j) dst[j] = src[j];
        });
  });

  for (auto strategy : {Strategy::fused, Strategy::seed}) {
    const std::string s = to_string(strategy);
    if (wanted(cfg, "loss_and_grad/" + s)) {
      Options opt;
      opt.strategy = strategy;
      CrossEntropy<S> ce(comm, part, opt);
      add("loss_and_grad/" + s, 2 * elem_bytes, [&] { ce.loss_and_grad(logits, targets, loss, out, T(1)); });
    }
    for (auto mode : {Mode::recompute, Mode::stash_softmax}) {
      const std::string suffix = s + "/" + to_string(mode);
      if (!wanted(cfg, "forward/" + suffix) && !wanted(cfg, "backward/" + suffix) &&
          !wanted(cfg, "forward_backward/" + suffix))
        continue;
      Options opt;
      opt.strategy = strategy;
      opt.mode = mode;
      CrossEntropy<S> ce(comm, part, opt);
      const bool stash = mode == Mode::stash_softmax;
      // forward reads the logits (and writes the stash, in the compute type); backward reads logits or
      // stash and writes the gradient.
      const double stash_bytes = elem_bytes * double(sizeof(T)) / double(sizeof(S));
      add("forward/" + suffix, elem_bytes + (stash ? stash_bytes : 0), [&] { ce.forward(logits, targets, loss); });
      add("backward/" + suffix, (stash ? stash_bytes : elem_bytes) + elem_bytes, [&] { ce.backward(T(1), out); });
      add("forward_backward/" + suffix, (stash ? 2 * stash_bytes + 2 * elem_bytes : 3 * elem_bytes), [&] {
        ce.forward(logits, targets, loss);
        ce.backward(T(1), out);
      });
    }
  }
  const double copy_ms = recs.front().ms_median;
  for (auto& r : recs) r.ratio_to_copy = r.ms_median / copy_ms;
  return recs;
}

}  // namespace

std::vector<Record> run(const Communicator& comm, const Config& config) {
  VPCE_THROW_IF(config.tokens < 1 || config.vocab < 1 || config.reps < 1,
                "bench: --tokens, --vocab and --reps must be positive");
  if (config.dtype == "float32") return run_typed<float>(comm, config);
  if (config.dtype == "float64") return run_typed<double>(comm, config);
  if (config.dtype == "bfloat16") return run_typed<bfloat16>(comm, config);
  if (config.dtype == "float16") return run_typed<float16>(comm, config);
  VPCE_THROW_IF(true, "bench: unknown dtype '" + config.dtype + "' (expected float32, float64, bfloat16 or float16)");
}

std::string to_json(const std::vector<Record>& records) {
  std::ostringstream os;
  os.precision(6);
  os << "[\n";
  for (std::size_t k = 0; k < records.size(); ++k) {
    const auto& r = records[k];
    os << "  {\"name\": \"" << r.name << "\", \"ranks\": " << r.ranks << ", \"threads\": " << r.threads
       << ", \"tokens\": " << r.tokens << ", \"vocab_local\": " << r.vocab_local << ", \"dtype\": \"" << r.dtype
       << "\", \"ms_median\": " << r.ms_median << ", \"ms_min\": " << r.ms_min << ", \"bytes\": " << r.bytes
       << ", \"gbps\": " << r.gbps << ", \"ratio_to_copy\": " << r.ratio_to_copy << ", \"backend\": \""
       << Exec::name() << "\", \"kokkos_version\": " << KOKKOS_VERSION << ", \"vpce_version\": \""
       << VPCE_VERSION_STRING << "\"}" << (k + 1 < records.size() ? "," : "") << "\n";
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
  }
  std::snprintf(line, sizeof line, "%-36s %10s %10s %8s %8s\n", "name", "ms(median)", "ms(min)", "GB/s", "x copy");
  os << line;
  for (const auto& r : records) {
    std::snprintf(line, sizeof line, "%-36s %10.2f %10.2f %8.2f %8.2f\n", r.name.c_str(), r.ms_median, r.ms_min,
                  r.gbps, r.ratio_to_copy);
    os << line;
  }
  return os.str();
}

}  // namespace vpce::bench
