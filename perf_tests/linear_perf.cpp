// vpce_linear_perf: the fused LM head (vpce::LinearCrossEntropy::loss_and_grad) against the materialised
// path, in one run (issue #4's benchmark).
//
//   mpiexec -n 2 vpce_linear_perf [N=8192] [H=1024] [V=65536] [reps=3] [json|-]
//
// Per rank, with V_r = V / ranks, fp32, the median over reps (after one warm-up) of the slowest rank (the benchmark
// harness's timing, bench/bench.hpp):
//   blas_alone    the three products on the full shapes straight through the BLAS library (sgemm_):
//                 logits = hidden W_r^T, grad_W = dlogits^T hidden, grad_hidden = dlogits W_r (the ceiling)
//   core_lg       vpce::CrossEntropy::loss_and_grad on the full N x V_r logits (gradient to its own buffer)
//   materialised  KokkosBlas::gemm of the full logits + core_lg + the two gradient gemms + the all-reduce
//   fused         vpce::LinearCrossEntropy::loss_and_grad (chunks; never N x V_r)
//   fused_bias    the same with a bias (V_r) and its gradient (one gemv per chunk)
//   fused_bf16    the same on bfloat16 hidden and weight (converted to float chunk by chunk; float gradients)
//   fused_sp      the same with sequence-parallel input (each rank N / ranks rows of hidden, all-gathered per
//                 chunk; grad_hidden reduce-scattered per chunk)
// and for the fused path: the bytes Kokkos allocated during its first call (peak over the call minus what
// was live before it, from Kokkos Tools allocation callbacks) against the N x V_r logits it avoids, and the
// time in its gemm regions ("vpce::linear::gemm*", median over reps of the slowest rank) as GFLOP/s against
// blas_alone's. Targets: extra memory <= 10% of the logits, fused <= 1.15 x (blas_alone + core_lg), gemm rate
// >= 80% of blas_alone's.
//
// The BLAS library's own threads: with several ranks per node set OPENBLAS_NUM_THREADS (1 rank per core).

#include <mpi.h>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>

#include "bench.hpp"
#include "vpce/linear_cross_entropy.hpp"
#include "vpce/vpce.hpp"

extern "C" void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
                       const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc);

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Mem>;
using LL = Kokkos::View<float**, Kokkos::LayoutLeft, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using ConstLL = Kokkos::View<const float**, Kokkos::LayoutLeft, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// Kokkos Tools allocation callbacks: bytes live, and their peak.
std::int64_t g_live = 0, g_peak = 0;
void on_alloc(Kokkos::Profiling::SpaceHandle, const char*, const void*, std::uint64_t size) {
  g_live += std::int64_t(size);
  g_peak = std::max(g_peak, g_live);
}
void on_dealloc(Kokkos::Profiling::SpaceHandle, const char*, const void*, std::uint64_t size) {
  g_live -= std::int64_t(size);
}

/// The harness's median over reps (after one warm-up) of the slowest rank's milliseconds.
double median_ms(const vpce::Communicator& comm, int reps, const std::function<void()>& op) {
  return vpce::bench::time_op(comm, reps, op).median_ms;
}

void fill(const Matrix& m, std::uint64_t seed, float scale) {
  const auto cols = std::int64_t(m.extent(1));
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<Exec>(0, m.extent(0)), KOKKOS_LAMBDA(std::int64_t i) {
        for (std::int64_t k = 0; k < cols; ++k) {
          std::uint64_t x = seed + std::uint64_t(i) * 0x9E3779B97F4A7C15ull + std::uint64_t(k) * 0xBF58476D1CE4E5B9ull;
          x ^= x >> 31;
          x *= 0x94D049BB133111EBull;
          x ^= x >> 29;
          m(i, k) = scale * (float(x >> 40) / float(1 << 24) - 0.5f);
        }
      });
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  Kokkos::initialize(argc, argv);
  int status = 0;
  {
    vpce::Communicator comm(MPI_COMM_WORLD);
    const std::int64_t n = argc > 1 ? std::atoll(argv[1]) : 8192;
    const std::int64_t h = argc > 2 ? std::atoll(argv[2]) : 1024;
    const std::int64_t v = argc > 3 ? std::atoll(argv[3]) : 65536;
    const int reps = argc > 4 ? std::atoi(argv[4]) : 3;
    const std::string json = argc > 5 ? argv[5] : "-";
    const auto part = vpce::VocabPartition::even(v, comm);
    const std::int64_t vr = part.local_size();
    const double flops = 3 * 2.0 * double(n) * double(h) * double(vr);
    auto gflops = [&](double ms) { return flops / ms * 1e-6; };
    const double logits_bytes = double(n) * double(vr) * sizeof(float);

    Matrix hidden("hidden", n, h), weight("weight", vr, h), grad_h("grad_hidden", n, h), grad_w("grad_weight", vr, h);
    fill(hidden, 1, 2.0f);
    fill(weight, 2, 0.2f);
    Kokkos::View<std::int64_t*, Mem> targets("targets", n);
    Kokkos::parallel_for(
        "targets", Kokkos::RangePolicy<Exec>(0, n), KOKKOS_LAMBDA(std::int64_t i) { targets(i) = (i * 7919) % v; });
    Kokkos::View<float*, Mem> loss("loss", n);
    Kokkos::fence();

    // The fused path first, while the materialised logits do not exist yet: its first call's allocations.
    vpce::LinearCrossEntropy<float, Exec> lce(comm, part, h);
    Kokkos::Tools::Experimental::set_allocate_data_callback(on_alloc);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(on_dealloc);
    g_live = g_peak = 0;
    lce.loss_and_grad(hidden, weight, targets, loss, grad_h, grad_w);
    Kokkos::fence();
    const std::int64_t extra_local = g_peak;
    Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(nullptr);
    std::int64_t extra = 0;
    MPI_Allreduce(&extra_local, &extra, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);

    // The harness's timing (milliseconds): the time of the whole call and of its gemm regions.
    const vpce::bench::Timing fused_t = vpce::bench::time_op(
        comm, reps, [&] { lce.loss_and_grad(hidden, weight, targets, loss, grad_h, grad_w); }, "vpce::linear::gemm");
    const double fused = fused_t.median_ms, fused_gemm = fused_t.region_ms;
    const double fused_loss = lce.reduced_loss();

    // The options of the fused head, each against the plain call (fused).
    double fused_bias = 0, fused_bf16 = 0, fused_sp = 0;
    {
      Kokkos::View<float*, Mem> bias("bias", vr), grad_b("grad_bias", vr);
      Kokkos::deep_copy(bias, 0.01f);
      fused_bias = median_ms(comm, reps,
                             [&] { lce.loss_and_grad(hidden, weight, bias, targets, loss, grad_h, grad_w, grad_b); });
    }
    {
      using B = vpce::bfloat16;
      Kokkos::View<B**, Kokkos::LayoutRight, Mem> hb("hidden_bf16", n, h), wb("weight_bf16", vr, h);
      Kokkos::parallel_for(
          "to_bf16", Kokkos::RangePolicy<Exec>(0, n), KOKKOS_LAMBDA(std::int64_t i) {
            for (std::int64_t k = 0; k < h; ++k) hb(i, k) = B(hidden(i, k));
          });
      Kokkos::parallel_for(
          "to_bf16", Kokkos::RangePolicy<Exec>(0, vr), KOKKOS_LAMBDA(std::int64_t j) {
            for (std::int64_t k = 0; k < h; ++k) wb(j, k) = B(weight(j, k));
          });
      vpce::LinearCrossEntropy<B, Exec> lce_bf16(comm, part, h);
      fused_bf16 = median_ms(comm, reps, [&] { lce_bf16.loss_and_grad(hb, wb, targets, loss, grad_h, grad_w); });
    }
    {
      // Rank r holds rows [r n / W, (r + 1) n / W) of hidden.
      const std::int64_t r0 = n * comm.rank() / comm.size(), r1 = n * (comm.rank() + 1) / comm.size();
      const auto mine = std::make_pair(r0, r1);
      Matrix hs("hidden_slice", r1 - r0, h), gs("grad_hidden_slice", r1 - r0, h);
      Kokkos::deep_copy(hs, Kokkos::subview(hidden, mine, Kokkos::ALL));
      vpce::LinearOptions sp;
      sp.sequence_parallel = true;
      vpce::LinearCrossEntropy<float, Exec> lce_sp(comm, part, h, {}, sp);
      fused_sp = median_ms(comm, reps, [&] { lce_sp.loss_and_grad(hs, weight, targets, loss, gs, grad_w); });
    }

    // The materialised path and its pieces.
    Matrix logits("logits", n, vr);
    const int in = int(n), ih = int(h), iv = int(vr);
    const float one = 1, zero = 0;
    const double blas = median_ms(comm, reps, [&] {
      // Column-major: logits^T (V_r x N) = W_LL^T hidden_LL; grad_W^T (H x V_r) = hidden_LL dlogits_LL^T;
      // grad_hidden^T (H x N) = W_LL dlogits^T (dlogits = the logits buffer here: only the time matters).
      if (vr > 0) {
        sgemm_("T", "N", &iv, &in, &ih, &one, weight.data(), &ih, hidden.data(), &ih, &zero, logits.data(), &iv);
        sgemm_("N", "T", &ih, &iv, &in, &one, hidden.data(), &ih, logits.data(), &iv, &zero, grad_w.data(), &ih);
        sgemm_("N", "N", &ih, &in, &iv, &one, weight.data(), &ih, logits.data(), &iv, &zero, grad_h.data(), &ih);
      }
    });
    vpce::CrossEntropy<float, Exec> ce(comm, part);
    auto refill = [&] {
      if (vr > 0)
        KokkosBlas::gemm("T", "N", 1.0f, ConstLL(weight.data(), h, vr), ConstLL(hidden.data(), h, n), 0.0f,
                         LL(logits.data(), vr, n));
    };
    refill();
    Kokkos::fence();
    // core_lg writes its gradient to a buffer of its own, so the logits stay as they are across reps (a
    // refill timed apart and subtracted left the core's ~0.3 s inside the noise of two 18 s medians).
    double core_lg = 0;
    {
      Matrix dlogits(Kokkos::view_alloc(Kokkos::WithoutInitializing, "dlogits"), n, vr);
      core_lg = median_ms(comm, reps, [&] { ce.loss_and_grad(logits, targets, loss, dlogits); });
    }
    const double materialised = median_ms(comm, reps, [&] {
      refill();
      ce.loss_and_grad(logits, targets, loss, logits);
      if (vr > 0) {
        KokkosBlas::gemm("N", "T", 1.0f, ConstLL(hidden.data(), h, n), ConstLL(logits.data(), vr, n), 0.0f,
                         LL(grad_w.data(), h, vr));
        KokkosBlas::gemm("N", "N", 1.0f, ConstLL(weight.data(), h, vr), ConstLL(logits.data(), vr, n), 0.0f,
                         LL(grad_h.data(), h, n));
      }
      Kokkos::fence();
      if (comm.size() > 1) MPI_Allreduce(MPI_IN_PLACE, grad_h.data(), int(n * h), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    const double materialised_loss = ce.reduced_loss();

    const char* obt = std::getenv("OPENBLAS_NUM_THREADS");
    vpce::bench::JsonRecord js;
    js.add("name", "linear_cross_entropy").add("ranks", comm.size()).add("threads", Exec().concurrency());
    js.add("openblas_num_threads", obt ? obt : "").add("kokkos_version", KOKKOS_VERSION);
    js.add("tokens", n).add("hidden", h).add("vocab", v).add("vocab_local", vr).add("reps", reps);
    js.add("chunk_rows", lce.chunk_rows()).add("fused_ms", fused).add("materialised_ms", materialised);
    js.add("blas_alone_ms", blas).add("core_lg_ms", core_lg).add("fused_gemm_ms", fused_gemm);
    js.add("extra_bytes", extra)
        .add("logits_bytes", logits_bytes)
        .add("extra_over_logits", double(extra) / logits_bytes);
    js.add("fused_over_blas_plus_core", fused / (blas + core_lg)).add("fused_over_materialised", fused / materialised);
    js.add("gemm_rate_over_blas", blas / fused_gemm).add("blas_gflops", gflops(blas));
    js.add("fused_gemm_gflops", gflops(fused_gemm)).add("fused_loss_sum", fused_loss);
    js.add("materialised_loss_sum", materialised_loss);
    js.add("fused_bias_ms", fused_bias).add("fused_bf16_ms", fused_bf16).add("fused_sp_ms", fused_sp);
    js.add("bias_over_fused", fused_bias / fused).add("bf16_over_fused", fused_bf16 / fused);
    js.add("sp_over_fused", fused_sp / fused);
    if (comm.rank() == 0) {
      std::printf("vpce_linear_perf: N %lld H %lld V %lld over %d ranks (V_r %lld), %d threads/rank, chunk %lld rows\n",
                  (long long)n, (long long)h, (long long)v, comm.size(), (long long)vr, Exec().concurrency(),
                  (long long)lce.chunk_rows());
      std::printf("  blas alone (3 sgemm)      %10.1f ms  %6.1f GFLOP/s\n", blas, gflops(blas));
      std::printf("  core loss_and_grad        %10.1f ms\n", core_lg);
      std::printf("  materialised              %10.1f ms\n", materialised);
      std::printf("  fused                     %10.1f ms  (gemms %.1f ms, %6.1f GFLOP/s)\n", fused, fused_gemm,
                  gflops(fused_gemm));
      std::printf("  fused, with a bias        %10.1f ms  (%.3f x fused)\n", fused_bias, fused_bias / fused);
      std::printf("  fused, bfloat16 inputs    %10.1f ms  (%.3f x fused)\n", fused_bf16, fused_bf16 / fused);
      std::printf("  fused, sequence-parallel  %10.1f ms  (%.3f x fused)\n", fused_sp, fused_sp / fused);
      std::printf("  fused / (blas + core)     %10.3f   (target <= 1.15)\n", fused / (blas + core_lg));
      std::printf("  fused gemm rate / blas    %10.3f   (target >= 0.80)\n", blas / fused_gemm);
      std::printf("  extra memory              %10.1f MiB = %.3f of the %.1f MiB logits (target <= 0.10)\n",
                  double(extra) / 1048576.0, double(extra) / logits_bytes, logits_bytes / 1048576.0);
      std::printf("  loss sum fused %.6e, materialised %.6e\n", fused_loss, materialised_loss);
      if (json == "-") {
        std::printf("%s\n", js.str().c_str());
      } else {
        std::ofstream(json) << "[" << js.str() << "]\n";
      }
    }
    const double rel = std::abs(fused_loss - materialised_loss) / std::max(1.0, std::abs(materialised_loss));
    if (rel > 1e-3) {
      if (comm.rank() == 0) std::fprintf(stderr, "vpce_linear_perf: the two paths disagree (relative %.3g)\n", rel);
      status = 1;
    }
  }
  Kokkos::finalize();
  MPI_Finalize();
  return status;
}
