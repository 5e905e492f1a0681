// Built against an installed vpce: CrossEntropy on Kokkos::Serial, instantiated HERE through the opt-in
// <vpce/definitions.hpp> (the target vpce::definitions), against the library's own instance for the default
// execution space: the same losses.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdio>
#include <vpce/definitions.hpp>
#include <vpce/vpce.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int rc = 0;
#if defined(KOKKOS_ENABLE_SERIAL)
  {
    vpce::Communicator comm(MPI_COMM_WORLD);
    auto part = vpce::VocabPartition::even(1000, comm);
    const std::int64_t n = 5, vl = part.local_size();
    using Host = Kokkos::Serial::memory_space;
    Kokkos::View<double**, Kokkos::LayoutRight, Host> x("x", n, vl);
    Kokkos::View<std::int64_t*, Host> t("t", n);
    for (std::int64_t i = 0; i < n; ++i) {
      t(i) = (i * 197) % 1000;
      for (std::int64_t j = 0; j < vl; ++j) x(i, j) = std::sin(0.37 * double(i + 1) * double(part.begin() + j));
    }
    Kokkos::View<double*, Host> loss_serial("loss_serial", n);
    vpce::CrossEntropy<double, Kokkos::Serial> serial(comm, part);
    serial.forward(x, t, loss_serial);
    auto x_d = Kokkos::create_mirror_view_and_copy(Kokkos::DefaultExecutionSpace::memory_space(), x);
    auto t_d = Kokkos::create_mirror_view_and_copy(Kokkos::DefaultExecutionSpace::memory_space(), t);
    Kokkos::View<double*> loss("loss", n);
    vpce::CrossEntropy<double> lib(comm, part);
    lib.forward(x_d, t_d, loss);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), loss);
    for (std::int64_t i = 0; i < n; ++i)
      if (!(std::abs(h(i) - loss_serial(i)) <= 1e-12 * std::abs(h(i)))) rc = 1;
    if (comm.rank() == 0)
      std::printf("consumer of vpce/definitions.hpp: Kokkos::Serial instance vs the library's: %s\n",
                  rc ? "FAILED" : "ok");
  }
#endif
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
