// Determinism: for a fixed number of ranks and a fixed partition, loss, lse and gradient are the same bits
//  - when a call is repeated (a second object, fresh buffers),
//  - on Kokkos::Serial and on the default (OpenMP) execution space (the same host kernels, compiled with the
//    same flags: this file gets the library's -march=native; a translation unit compiled for another
//    instruction set rounds differently where it fuses multiply-adds differently),
//  - whatever the rows per block of the fused strategy (block_rows() follows the number of threads: this is
//    what differs between OMP_NUM_THREADS=1 and 2 besides the threads themselves),
//  - and for OMP_NUM_THREADS=1 and 2: each run writes a hash of every result to the file named by
//    VPCE_DETERMINISM_HASH_FILE, and CTest compares the two files (unit_tests/CMakeLists.txt).
// Why it holds: every row is reduced by ONE thread in a fixed order (chunks of 4096 columns, sums of 512 in
// vector lanes added in double); a row's records are merged across ranks in an order that depends only on
// the number of ranks (MPI's algorithm for a message of that size); reduced_loss is summed on the host in
// row order. Across different numbers of ranks the merge order differs, so results agree only to rounding:
// AcrossRankCounts measures by how much (and prints it).

#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_utils.hpp"
#include "vpce/definitions.hpp"  // the bfloat16 Kokkos::Serial instance (float, double: serial_instances.cpp)

namespace {

using namespace vpce_test;

/// The bytes of one call's results, as the library wrote them.
struct Bits {
  std::vector<unsigned char> loss, lse, grad;
  double reduced = 0;
  bool operator==(const Bits& o) const {
    return loss == o.loss && lse == o.lse && grad == o.grad && std::memcmp(&reduced, &o.reduced, sizeof(double)) == 0;
  }
};

template <class V>
std::vector<unsigned char> bytes_of(const V& v) {
  Kokkos::View<typename V::non_const_data_type, typename V::array_layout, Kokkos::HostSpace> h("h", v.layout());
  Kokkos::deep_copy(h, v);
  const auto* b = reinterpret_cast<const unsigned char*>(h.data());
  return std::vector<unsigned char>(b, b + h.span() * sizeof(typename V::value_type));
}

inline std::uint64_t fnv1a(const std::vector<unsigned char>& b, std::uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : b) h = (h ^ c) * 1099511628211ull;
  return h;
}

inline std::uint64_t hash_of(const Bits& b) {
  std::vector<unsigned char> r(sizeof(double));
  std::memcpy(r.data(), &b.reduced, sizeof(double));
  return fnv1a(r, fnv1a(b.grad, fnv1a(b.lse, fnv1a(b.loss))));
}

enum class Call { loss_and_grad, forward_backward, in_place };

const char* name_of(Call c) {
  return c == Call::loss_and_grad ? "loss_and_grad" : c == Call::forward_backward ? "forward+backward" : "in place";
}

/// One call of `how` on this rank's slice of `p`, logits stored as S, on execution space E.
template <class S, class E>
Bits run_case(const vpce::Communicator& comm, const vpce::VocabPartition& part, const vpce::Options& opt,
              const Problem& p, Call how) {
  using CE = vpce::CrossEntropy<S, E>;
  using T = typename CE::compute_type;
  using mem = typename E::memory_space;
  const std::int64_t n = p.n, w = part.local_size();
  Kokkos::View<S**, Kokkos::LayoutRight, mem> x("x", n, w);
  Kokkos::View<std::int64_t*, mem> y("y", n);
  Kokkos::View<T*, mem> g("g", n), loss("loss", n);
  Kokkos::View<T**, Kokkos::LayoutRight, mem> grad("grad", n, w);
  {
    auto hx = Kokkos::create_mirror_view(x);
    auto hy = Kokkos::create_mirror_view(y);
    auto hg = Kokkos::create_mirror_view(g);
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < w; ++j) hx(i, j) = S(static_cast<T>(p.at(i, part.begin() + j)));
      hy(i) = p.y[i];
      hg(i) = static_cast<T>(p.g[i]);
    }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(y, hy);
    Kokkos::deep_copy(g, hg);
  }
  CE ce(comm, part, opt);
  Bits b;
  const bool per_row = opt.reduction == vpce::Reduction::none;
  switch (how) {
    case Call::loss_and_grad:
      if (per_row) {
        ce.loss_and_grad(x, y, loss, grad, g);
      } else {
        ce.loss_and_grad(x, y, loss, grad, T(0.625));
      }
      b.grad = bytes_of(grad);
      break;
    case Call::forward_backward:
      ce.forward(x, y, loss);
      if (per_row) {
        ce.backward(g, grad);
      } else {
        ce.backward(T(0.625), grad);
      }
      b.grad = bytes_of(grad);
      break;
    case Call::in_place:  // the gradient over the logits, in the logits' type
      ce.loss_and_grad(x, y, loss, x, T(0.625));
      b.grad = bytes_of(x);
      break;
  }
  b.loss = bytes_of(loss);
  b.lse = bytes_of(ce.lse());
  b.reduced = ce.reduced_loss();
  return b;
}

/// The cases every determinism check runs: both strategies and memory modes, the training options together
/// (with ignored rows, mean reduction), the transforms, and the team kernels on the host; each with the
/// calls that take different kernels.
struct Variant {
  std::string name;
  vpce::Options opt;
  std::vector<Call> calls;
};

std::vector<Variant> variants() {
  const Call l = Call::loss_and_grad, fb = Call::forward_backward, ip = Call::in_place;
  std::vector<Variant> out;
  vpce::Options o;
  out.push_back({"fused", o, {l, fb, ip}});
  o.mode = vpce::Mode::stash_softmax;
  out.push_back({"fused stash", o, {fb}});
  o = {};
  o.strategy = vpce::Strategy::seed;
  out.push_back({"seed", o, {l, fb}});
  o = {};
  o.label_smoothing = 0.1;
  o.z_loss = 1e-4;
  o.reduction = vpce::Reduction::mean;
  out.push_back({"fused smoothing+z-loss, mean", o, {l, ip}});
  o.strategy = vpce::Strategy::seed;
  out.push_back({"seed smoothing+z-loss, mean", o, {l}});
  o = {};
  o.softcap = 30;
  o.logit_scale = 0.5;
  out.push_back({"fused softcap+scale", o, {l, fb}});
  o = {};
  o.force_team_kernels = true;
  out.push_back({"fused team kernels", o, {l}});
  return out;
}

/// N x V: rows of 3 chunks and a bit at 2 ranks; some rows ignored.
Problem problem() {
  Problem p = make_problem<float>(37, 20011, 2024);
  p.y[5] = -100;
  p.y[20] = -100;
  return p;
}

template <class S>
const char* type_name() {
  if constexpr (std::is_same_v<S, float>) return "float";
  if constexpr (std::is_same_v<S, double>) return "double";
  if constexpr (std::is_same_v<S, vpce::bfloat16>) return "bfloat16";
  return "float16";
}

/// For each variant and call: the results of a repeat, of Kokkos::Serial and of other block sizes are the
/// same bits as the first; returns the first results' hashes, one line each.
template <class S>
std::vector<std::string> check_type(const vpce::Communicator& comm) {
  const auto part = vpce::VocabPartition::even(20011, comm);
  const Problem p = problem();
  std::vector<std::string> lines;
  for (const auto& v : variants()) {
    for (Call how : v.calls) {
      const std::string what = std::string(type_name<S>()) + ", " + v.name + ", " + name_of(how);
      SCOPED_TRACE(what);
      const Bits first = run_case<S, DefaultExec>(comm, part, v.opt, p, how);
      EXPECT_TRUE(all_ranks(run_case<S, DefaultExec>(comm, part, v.opt, p, how) == first)) << what << ": repeat";
#if defined(KOKKOS_ENABLE_SERIAL)
      // (On a device the default space runs the team kernels: not the same code path as Serial.)
      if constexpr (!std::is_same_v<DefaultExec, Kokkos::Serial> && vpce::impl::is_host_space_v<DefaultExec>) {
        EXPECT_TRUE(all_ranks(run_case<S, Kokkos::Serial>(comm, part, v.opt, p, how) == first))
            << what << ": Serial vs " << DefaultExec::name();
      }
#endif
      if (v.opt.strategy == vpce::Strategy::fused) {
        for (std::int64_t rows : {1, 5}) {
          vpce::Options o = v.opt;
          o.block_rows = rows;
          EXPECT_TRUE(all_ranks(run_case<S, DefaultExec>(comm, part, o, p, how) == first))
              << what << ": block_rows " << rows;
        }
      }
      std::ostringstream line;
      line << what << ": " << std::hex << hash_of(first);
      lines.push_back(line.str());
    }
  }
  return lines;
}

TEST(Determinism, BitwiseAcrossRepeatsSpacesBlocksAndThreads) {
  const vpce::Communicator comm(MPI_COMM_WORLD);
  std::vector<std::string> lines;
  for (auto f : {&check_type<float>, &check_type<double>, &check_type<vpce::bfloat16>}) {
    const auto l = f(comm);
    lines.insert(lines.end(), l.begin(), l.end());
  }
  // The hash file: every rank's hash of every case, in rank order (rank 0 writes it).
  const char* file = std::getenv("VPCE_DETERMINISM_HASH_FILE");
  if (file == nullptr || *file == '\0') return;
  std::string mine;
  for (const auto& l : lines) mine += l + "\n";
  const int size = world_size(), rank = world_rank();
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(size), offsets(size);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < size; ++r) offsets[r] = total, total += lens[r];
  std::string all(rank == 0 ? total : 0, '\0');
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  bool written = true;
  if (rank == 0) {
    std::ofstream out(file, std::ios::trunc);
    for (int r = 0; r < size; ++r) out << "rank " << r << "\n" << all.substr(offsets[r], lens[r]);
    written = static_cast<bool>(out);
  }
  EXPECT_TRUE(all_ranks(written)) << "could not write " << file;
}

// The same global problem on 1, 2, ..., W ranks (sub-communicators of the first k ranks, even partitions):
// the results differ only by rounding (the merge order of the per-rank sums). Prints the largest relative
// differences from the 1-rank results and checks them against bounds a little above what was measured.
template <class S>
void across_rank_counts(double loss_bound, double grad_bound) {
  const int w = world_size(), rank = world_rank();
  const std::int64_t n = 32, v = 50304;
  const Problem p = make_problem<S>(n, v, 77);
  for (const char* opts : {"plain", "smoothing+z-loss"}) {
    vpce::Options opt;
    if (std::string(opts) != "plain") {
      opt.label_smoothing = 0.1;
      opt.z_loss = 1e-4;
    }
    std::vector<std::vector<double>> loss(w), grad(w);
    for (int k = 1; k <= w; ++k) {
      MPI_Comm sub = MPI_COMM_NULL;
      MPI_Comm_split(MPI_COMM_WORLD, rank < k ? 0 : MPI_UNDEFINED, rank, &sub);
      std::vector<double> l(n, 0.0), gr(n * v, 0.0);  // this rank's part of the global results, zeros elsewhere
      if (sub != MPI_COMM_NULL) {
        const vpce::Communicator comm(sub);
        const auto part = vpce::VocabPartition::even(v, comm);
        using C = Config<S, DefaultExec>;
        typename C::cross_entropy ce(comm, part, opt);
        const auto out = run_path<C>(ce, make_local<C>(p, part), Path::fused_view);
        for (std::int64_t i = 0; i < n; ++i) {
          if (comm.rank() == 0) l[i] = out.loss[i];
          for (std::int64_t j = 0; j < part.local_size(); ++j)
            gr[i * v + part.begin() + j] = out.grad[i * part.local_size() + j];
        }
        MPI_Comm_free(&sub);
      }
      loss[k - 1].assign(n, 0.0);
      grad[k - 1].assign(n * v, 0.0);
      MPI_Reduce(l.data(), loss[k - 1].data(), int(n), MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
      MPI_Reduce(gr.data(), grad[k - 1].data(), int(n * v), MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    }
    bool ok = true;
    if (rank == 0) {
      double grad_max = 0;
      for (double gv : grad[0]) grad_max = std::max(grad_max, std::abs(gv));
      for (int k = 2; k <= w; ++k) {
        double dl = 0, dg = 0, dg_abs = 0;
        for (std::int64_t i = 0; i < n; ++i)
          dl = std::max(dl, std::abs(loss[k - 1][i] - loss[0][i]) / std::abs(loss[0][i]));
        for (std::size_t e = 0; e < grad[0].size(); ++e) {
          const double d = std::abs(grad[k - 1][e] - grad[0][e]);
          dg_abs = std::max(dg_abs, d);
          if (std::abs(grad[0][e]) > 1e-6 * grad_max) dg = std::max(dg, d / std::abs(grad[0][e]));
        }
        std::printf(
            "[rank counts] %s, %s, N %lld, V %lld: %d ranks vs 1: loss max rel diff %.3g; gradient max rel diff %.3g "
            "(entries above 1e-6 of the largest), max abs diff %.3g (largest entry %.3g)\n",
            type_name<S>(), opts, static_cast<long long>(n), static_cast<long long>(v), k, dl, dg, dg_abs, grad_max);
        EXPECT_LE(dl, loss_bound) << type_name<S>() << ", " << opts << ", " << k << " ranks: loss";
        EXPECT_LE(dg, grad_bound) << type_name<S>() << ", " << opts << ", " << k << " ranks: gradient";
        ok = ok && dl <= loss_bound && dg <= grad_bound;
      }
      std::fflush(stdout);
    }
    EXPECT_TRUE(all_ranks(ok || rank != 0));
  }
}

TEST(Determinism, AcrossRankCounts) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  across_rank_counts<float>(1e-6, 2e-5);
  across_rank_counts<double>(1e-14, 1e-13);
}

}  // namespace
