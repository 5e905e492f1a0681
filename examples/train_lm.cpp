// Train a small next-byte language model with a vocab-parallel LM head (vpce::LinearCrossEntropy), plain SGD.
//
//   mpirun -np 2 ./vpce_example_train_lm [--text FILE] [--steps S] [--batch N] [--hidden H] [--lr LR]
//                                        [--curve OUT] [--compare REF] [--rtol R]
//
// The text (default: the GPL-3 shipped by Debian's base-files, /usr/share/common-licenses/GPL-3) is read by
// rank 0 and broadcast. Tokens are its bytes (V = 256). The model: hidden_i = E[x_i] + P[x_{i-1}] (two
// embedding tables, the same on every rank), logits_i = W hidden_i, with W's 256 rows split across the ranks
// (each rank holds and updates only its rows). One step: LinearCrossEntropy::loss_and_grad (mean over the
// batch) gives grad_W_r (local) and grad_hidden (identical on every rank), the embeddings' gradients are
// gathered from grad_hidden in batch order (no atomics: the same bits for any thread count), then SGD.
// Parameters are initialised from their global indices, so every rank count trains the same model.
//
// Rank 0 prints the loss every few steps and writes every step's loss to --curve; --compare REF checks the
// curve against one written by another run (e.g. at another rank count) within a relative tolerance. The
// program fails (exit 1) if the loss did not fall or the curves disagree.

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>
#include <vpce/linear_cross_entropy.hpp>
#include <vpce/vpce.hpp>

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Mem>;

struct Args {
  std::string text = "/usr/share/common-licenses/GPL-3";
  int steps = 300;
  std::int64_t batch = 256, hidden = 64;
  float lr = 1.0f;
  std::string curve, compare;
  double rtol = 1e-5;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + k);
      return argv[++i];
    };
    if (k == "--text")
      a.text = value();
    else if (k == "--steps")
      a.steps = std::stoi(value());
    else if (k == "--batch")
      a.batch = std::stoll(value());
    else if (k == "--hidden")
      a.hidden = std::stoll(value());
    else if (k == "--lr")
      a.lr = std::stof(value());
    else if (k == "--curve")
      a.curve = value();
    else if (k == "--compare")
      a.compare = value();
    else if (k == "--rtol")
      a.rtol = std::stod(value());
    else
      throw std::runtime_error("unknown argument " + k);
  }
  if (a.steps < 1 || a.batch < 1 || a.hidden < 1 || !(a.lr > 0)) throw std::runtime_error("bad sizes or rate");
  return a;
}

/// A value in [-scale, scale) from (row, col, seed): initialisation that does not depend on the rank count.
KOKKOS_INLINE_FUNCTION float init_value(std::int64_t row, std::int64_t col, std::uint64_t seed, float scale) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + std::uint64_t(row) * 0xBF58476D1CE4E5B9ull + std::uint64_t(col);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return scale * (2.0f * float(x >> 40) / float(1 << 24) - 1.0f);
}

void init(const Matrix& m, std::int64_t row0, std::uint64_t seed, float scale) {
  const std::int64_t cols = m.extent(1);
  Kokkos::parallel_for(
      "init", Kokkos::RangePolicy<Exec>(0, m.extent(0)), KOKKOS_LAMBDA(std::int64_t i) {
        for (std::int64_t k = 0; k < cols; ++k) m(i, k) = init_value(row0 + i, k, seed, scale);
      });
}

/// Rank 0 reads the file; every rank gets its bytes (empty if it could not be read: the caller fails).
std::vector<unsigned char> read_everywhere(const std::string& path, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::vector<unsigned char> bytes;
  long long size = 0;
  if (rank == 0) {
    std::ifstream in(path, std::ios::binary);
    if (in) bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    size = in ? static_cast<long long>(bytes.size()) : -1;
  }
  MPI_Bcast(&size, 1, MPI_LONG_LONG, 0, comm);
  if (size < 0) return {};
  bytes.resize(size);
  MPI_Bcast(bytes.data(), int(size), MPI_UNSIGNED_CHAR, 0, comm);
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int rc = 0;
  try {
    const Args args = parse(argc, argv);
    vpce::Communicator comm(MPI_COMM_WORLD);
    const std::int64_t vocab = 256, n = args.batch, h = args.hidden;
    const auto text = read_everywhere(args.text, comm.comm());
    if (std::int64_t(text.size()) < n + 2) throw std::runtime_error("cannot read enough text from " + args.text);
    const auto part = vpce::VocabPartition::even(vocab, comm);
    const std::int64_t vr = part.local_size();

    vpce::Options opt;
    opt.reduction = vpce::Reduction::mean;
    vpce::LinearCrossEntropy<float> lce(comm, part, h, opt);

    Matrix emb("E", vocab, h), prev("P", vocab, h), weight("W_r", vr, h);
    Matrix hidden("hidden", n, h), grad_hidden("grad_hidden", n, h), grad_weight("grad_W_r", vr, h);
    init(emb, 0, 1, 0.5f);
    init(prev, 0, 2, 0.5f);
    init(weight, part.begin(), 3, 0.5f);  // global row ids: the same W for any rank count
    Kokkos::View<std::int64_t*, Mem> cur("x", n), before("x_prev", n), targets("y", n);
    auto cur_h = Kokkos::create_mirror_view(cur), before_h = Kokkos::create_mirror_view(before),
         targets_h = Kokkos::create_mirror_view(targets);
    Kokkos::View<float*, Mem> loss("loss", n);

    std::vector<double> curve;
    const std::int64_t span = std::int64_t(text.size()) - n - 1;
    for (int step = 0; step < args.steps; ++step) {
      // The batch: n consecutive positions, walking through the text.
      const std::int64_t p0 = (std::int64_t(step) * n * 7) % span;
      for (std::int64_t i = 0; i < n; ++i) {
        cur_h(i) = text[p0 + i];
        before_h(i) = p0 + i > 0 ? text[p0 + i - 1] : 0;
        targets_h(i) = text[p0 + i + 1];
      }
      Kokkos::deep_copy(cur, cur_h);
      Kokkos::deep_copy(before, before_h);
      Kokkos::deep_copy(targets, targets_h);
      Kokkos::parallel_for(
          "hidden", Kokkos::RangePolicy<Exec>(0, n), KOKKOS_LAMBDA(std::int64_t i) {
            for (std::int64_t k = 0; k < h; ++k) hidden(i, k) = emb(cur(i), k) + prev(before(i), k);
          });

      lce.loss_and_grad(hidden, weight, targets, loss, grad_hidden, grad_weight);
      curve.push_back(lce.reduced_loss());

      // SGD. W_r: local. E and P: row t gets the sum of grad_hidden over the batch rows whose token is t,
      // added in batch order (deterministic).
      const float lr = args.lr;
      Kokkos::parallel_for(
          "sgd_w", Kokkos::RangePolicy<Exec>(0, vr), KOKKOS_LAMBDA(std::int64_t j) {
            for (std::int64_t k = 0; k < h; ++k) weight(j, k) -= lr * grad_weight(j, k);
          });
      Kokkos::parallel_for(
          "sgd_embeddings", Kokkos::RangePolicy<Exec>(0, vocab), KOKKOS_LAMBDA(std::int64_t t) {
            for (std::int64_t i = 0; i < n; ++i) {
              if (cur(i) == t)
                for (std::int64_t k = 0; k < h; ++k) emb(t, k) -= lr * grad_hidden(i, k);
              if (before(i) == t)
                for (std::int64_t k = 0; k < h; ++k) prev(t, k) -= lr * grad_hidden(i, k);
            }
          });
      if (comm.rank() == 0 && (step % 25 == 0 || step == args.steps - 1))
        std::printf("step %4d  loss %.5f\n", step, curve.back());
    }

    // The loss must have fallen: the mean of the last 20 steps against the first step (log 256 = 5.545).
    double tail = 0;
    const int k = std::min<int>(20, args.steps);
    for (int s = args.steps - k; s < args.steps; ++s) tail += curve[s] / k;
    int bad = tail < 0.75 * curve.front() ? 0 : 1;
    if (comm.rank() == 0) {
      std::printf("%d rank(s): loss %.4f at step 0, %.4f over the last %d steps (%s)\n", comm.size(), curve.front(),
                  tail, k, bad ? "did NOT fall enough" : "fell");
      if (!args.curve.empty()) {
        std::ofstream out(args.curve);
        for (std::size_t s = 0; s < curve.size(); ++s) out << s << " " << std::scientific << curve[s] << "\n";
        if (!out) bad = 1, std::fprintf(stderr, "cannot write %s\n", args.curve.c_str());
      }
      if (!args.compare.empty()) {
        std::ifstream in(args.compare);
        std::size_t s = 0, mismatches = 0;
        double worst = 0, ref = 0;
        for (long idx; in >> idx >> ref && s < curve.size(); ++s) {
          const double rel = std::abs(curve[s] - ref) / std::abs(ref);
          worst = std::max(worst, rel);
          if (!(rel <= args.rtol)) ++mismatches;
        }
        std::printf("against %s: %zu steps compared, largest relative difference %.3g (tolerance %.3g)\n",
                    args.compare.c_str(), s, worst, args.rtol);
        if (s != curve.size() || mismatches) bad = 1;
      }
    }
    MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
    rc = bad;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vpce_example_train_lm: %s\n", e.what());
    rc = 1;
  }
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
