// The one gtest main of vpce's unit tests: MPI_Init_thread -> Kokkos::initialize -> RUN_ALL_TESTS ->
// Kokkos::finalize -> MPI_Finalize. Only rank 0 prints the usual gtest output; the other ranks print
// their failed assertions only, prefixed with the rank. The exit code is non-zero on every rank if any
// rank failed.

#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <string>
#include <vector>

namespace {

/// Failed assertions of a rank other than 0 (its default printer is removed).
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : m_rank(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", m_rank, r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.summary());
    std::fflush(stderr);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", m_rank, info.test_suite_name(), info.name());
    std::fflush(stderr);
  }

 private:
  int m_rank;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Kokkos::initialize(argc, argv);
  int result = 0;
  {
    ::testing::InitGoogleTest(&argc, argv);
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (rank != 0) {
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new FailurePrinter(rank));
    }
    result = RUN_ALL_TESTS();
  }
  // Every rank learns which ranks failed; rank 0 names them.
  const int failed = result != 0 ? 1 : 0;
  std::vector<int> all(size, 0);
  MPI_Allgather(&failed, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int any = 0;
  std::string names;
  for (int r = 0; r < size; ++r) {
    if (!all[r]) continue;
    any = 1;
    names += " " + std::to_string(r);
  }
  if (rank == 0 && any) std::fprintf(stderr, "vpce unit tests FAILED on rank(s):%s of %d\n", names.c_str(), size);
  Kokkos::finalize();
  MPI_Finalize();
  return any;
}
