// The VPCE_ENABLE_GPU_AWARE_MPI code path, where MPI is given the View's own buffers (device buffers on a
// GPU) instead of staged host copies. On a CPU both are host memory, so the path can run here: this
// program compiles CrossEntropy with the switch on (for Kokkos::Serial, which the library itself does not
// instantiate, so the two forms never meet) and checks the seed strategy -- the one the switch changes --
// against a float64 reference, with and without label smoothing (its fourth all-reduce).
#ifndef VPCE_ENABLE_GPU_AWARE_MPI
#define VPCE_ENABLE_GPU_AWARE_MPI
#endif
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdio>
#include <vector>

#include "vpce/definitions.hpp"  // Kokkos::Serial instances (the library has the default space's)
#include "vpce/vpce.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int failed = 0;
#if defined(KOKKOS_ENABLE_SERIAL)
  {
    vpce::Communicator comm(MPI_COMM_WORLD);
    const std::int64_t vocab = 37, n = 11;
    auto part = vpce::VocabPartition::even(vocab, comm);
    auto z = [](std::int64_t i, std::int64_t j) { return 3.0 * std::sin(0.9 * double(i) + 0.31 * double(j * j)); };
    auto target = [&](std::int64_t i) { return (i * 13) % vocab; };
    for (double alpha : {0.0, 0.2}) {
      vpce::Options opt;
      opt.strategy = vpce::Strategy::seed;
      opt.label_smoothing = alpha;
      vpce::CrossEntropy<double, Kokkos::Serial> ce(comm, part, opt);
      Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace> x("x", n, part.local_size());
      Kokkos::View<std::int64_t*, Kokkos::HostSpace> t("t", n);
      Kokkos::View<double*, Kokkos::HostSpace> loss("loss", n);
      for (std::int64_t i = 0; i < n; ++i) {
        t(i) = target(i);
        for (std::int64_t j = 0; j < part.local_size(); ++j) x(i, j) = z(i, part.begin() + j);
      }
      ce.loss_and_grad(x, t, loss, x, 1.0);  // the gradient overwrites x
      double worst = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        double m = -1e300, s = 0, a = 0;
        for (std::int64_t j = 0; j < vocab; ++j) m = std::max(m, z(i, j));
        for (std::int64_t j = 0; j < vocab; ++j) s += std::exp(z(i, j) - m), a += z(i, j);
        const double lse = m + std::log(s);
        worst = std::max(worst, std::abs(loss(i) - (lse - (1 - alpha) * z(i, target(i)) - alpha * a / vocab)));
        for (std::int64_t j = 0; j < part.local_size(); ++j) {
          const std::int64_t gj = part.begin() + j;
          const double g = std::exp(z(i, gj) - lse) - alpha / vocab - (gj == target(i) ? 1 - alpha : 0);
          worst = std::max(worst, std::abs(x(i, j) - g));
        }
      }
      if (!(worst < 1e-12)) failed = 1;
      if (comm.rank() == 0)
        std::printf("GPU-aware MPI path, seed strategy, label smoothing %.1f: max error %.2e\n", alpha, worst);
    }
  }
#else
  std::printf("Kokkos::Serial is not enabled: nothing to test\n");
#endif
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  Kokkos::finalize();
  MPI_Finalize();
  return any;
}
