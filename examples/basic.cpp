// The smallest complete use of vpce: each rank holds its slice of the vocabulary, the loss and the
// gradient come out of one collective call. Run: mpirun -np 2 ./vpce_example_basic
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdio>
#include <vpce/vpce.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int rc = 0;
  try {
    vpce::Communicator comm(MPI_COMM_WORLD);  // a duplicate of the caller's communicator
    const std::int64_t vocab = 50304, tokens = 512;
    auto part = vpce::VocabPartition::even(vocab, comm);  // this rank owns [part.begin(), part.end())
    vpce::CrossEntropy<float> ce(comm, part);             // fused strategy, recompute mode by default

    Kokkos::View<float**, Kokkos::LayoutRight> logits("logits", tokens, part.local_size());
    Kokkos::View<std::int64_t*> targets("targets", tokens);  // global ids, the same on every rank
    Kokkos::View<float*> loss("loss", tokens);
    const std::int64_t begin = part.begin();
    Kokkos::parallel_for(
        "fill", tokens, KOKKOS_LAMBDA(std::int64_t i) {
          targets(i) = (i * 7919) % vocab;
          for (std::int64_t j = 0; j < logits.extent_int(1); ++j)
            logits(i, j) = 3.0f * std::sin(0.001f * float(i * (j + begin) % 9973));
        });

    // Training step: loss and gradient of the mean loss in one pass; the gradient overwrites the logits.
    ce.loss_and_grad(logits, targets, loss, logits, 1.0f / tokens);

    double sum = 0;
    Kokkos::parallel_reduce(
        "mean", tokens, KOKKOS_LAMBDA(std::int64_t i, double& s) { s += loss(i); }, sum);
    if (comm.rank() == 0)
      std::printf("mean loss over %lld tokens, V = %lld on %d rank(s): %.6f (log V = %.6f)\n", (long long)tokens,
                  (long long)vocab, comm.size(), sum / tokens, std::log(double(vocab)));
    rc = std::isfinite(sum) ? 0 : 1;
  } catch (const vpce::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());  // every rank gets the same error
    rc = 1;
  }
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
