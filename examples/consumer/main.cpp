// Built against an installed vpce: one loss_and_grad call, checked against log(V) for equal logits.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdio>
#include <vpce/vpce.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int rc = 1;
  {
    vpce::Communicator comm(MPI_COMM_WORLD);
    auto part = vpce::VocabPartition::even(1000, comm);
    vpce::CrossEntropy<double> ce(comm, part);
    Kokkos::View<double**, Kokkos::LayoutRight> x("x", 4, part.local_size());  // all logits 0: loss = log V
    Kokkos::View<std::int64_t*> t("t", 4);
    Kokkos::View<double*> loss("loss", 4);
    ce.loss_and_grad(x, t, loss, x);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), loss);
    rc = std::abs(h(0) - std::log(1000.0)) < 1e-12 ? 0 : 1;
    if (comm.rank() == 0)
      std::printf("consumer of vpce %s: loss %.12f, log V %.12f: %s\n", VPCE_VERSION_STRING, h(0), std::log(1000.0),
                  rc ? "FAILED" : "ok");
  }
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
