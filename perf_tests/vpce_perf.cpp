// vpce_perf: the benchmark without HDF5.
// Usage: mpirun -np R vpce_perf [tokens] [vocab] [float32|float64|bfloat16|float16] [reps] [json] [only,prefixes]
// VPCE_PERF_BLOCK_BYTES=B sets Options::block_bytes_per_thread (the fused strategy's block size);
// VPCE_PERF_HUGE_PAGES=1 advises the logits and the output MADV_HUGEPAGE (Config::huge_pages).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "bench.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  Kokkos::initialize(argc, argv);
  int rc = 0;
  {
    try {
      vpce::Communicator comm(MPI_COMM_WORLD);
      vpce::bench::Config cfg;
      if (argc > 1) cfg.tokens = std::stoll(argv[1]);
      if (argc > 2) cfg.vocab = std::stoll(argv[2]);
      if (argc > 3) cfg.dtype = argv[3];
      if (argc > 4) cfg.reps = std::stoi(argv[4]);
      if (const char* b = std::getenv("VPCE_PERF_BLOCK_BYTES")) cfg.block_bytes_per_thread = std::stoll(b);
      if (const char* h = std::getenv("VPCE_PERF_HUGE_PAGES")) cfg.huge_pages = std::string(h) == "1";
      if (argc > 6) {
        std::string only = argv[6];
        for (std::size_t pos = 0; pos <= only.size();) {
          const std::size_t comma = std::min(only.find(',', pos), only.size());
          if (comma > pos) cfg.only.push_back(only.substr(pos, comma - pos));
          pos = comma + 1;
        }
      }
      const auto recs = vpce::bench::run(comm, cfg);
      if (comm.rank() == 0) {
        std::printf("%s", vpce::bench::to_table(recs).c_str());
        if (argc > 5 && std::string(argv[5]) != "-") std::ofstream(argv[5]) << vpce::bench::to_json(recs);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "vpce_perf: %s\n", e.what());
      rc = 1;
    }
  }
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
