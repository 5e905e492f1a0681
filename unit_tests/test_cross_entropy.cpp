// Correctness of vpce::CrossEntropy against the float64 host reference of the GLOBAL loss and gradient:
// every strategy x memory mode x call path, over several partitions (uneven, zero-width ranks), block
// sizes and the team-per-row kernels, lse(), zero tokens, and buffer reuse across calls.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "test_utils.hpp"

namespace {

using namespace vpce_test;

template <class C>
class CrossEntropyTest : public ::testing::Test {
 protected:
  using scalar = typename C::scalar;
  using cross_entropy = typename C::cross_entropy;
  vpce::Communicator comm{MPI_COMM_WORLD};

  /// Runs `path` with `opt` on `p` and EXPECTs the reference. Returns the outputs.
  Outputs check(const vpce::VocabPartition& part, const vpce::Options& opt, const Problem& p, const Reference& ref,
                Path path, const std::string& label) {
    cross_entropy ce(comm, part, opt);
    const auto in = make_local<C>(p, part);
    const Outputs out = run_path<C>(ce, in, path);
    const std::string what = label + ", " + describe(opt) + ", " + to_string(path);
    expect_matches_reference<C>(out, ref, p, part.begin(), part.local_size(), path_scale(p, path), what);
    expect_inputs_unchanged<C>(in, p, part.begin(), what);
    return out;
  }
  /// check() for each of `paths` with both strategies, host and team kernels, in automatic blocks of a few rows.
  void check_strategies_and_kernels(const vpce::VocabPartition& part, const Problem& p, const std::vector<Path>& paths,
                                    const std::string& label) {
    const Reference ref = reference(p);
    for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
      for (bool teams : {false, true}) {
        vpce::Options opt;
        opt.strategy = strategy;
        opt.force_team_kernels = teams;
        opt.block_bytes_per_thread = 4096;
        for (Path path : paths) check(part, opt, p, ref, path, label);
      }
    }
  }
};

TYPED_TEST_SUITE(CrossEntropyTest, AllConfigs, ConfigName);

// Every strategy x memory mode x path x partition matches the reference.
TYPED_TEST(CrossEntropyTest, MatchesReferenceEveryStrategyModeAndPath) {
  using scalar = typename TestFixture::scalar;
  std::uint64_t seed = 1;
  for (const auto& np : test_partitions(this->comm)) {
    const Problem p = make_problem<scalar>(37, np.part.vocab_size(), seed++);
    const Reference ref = reference(p);
    for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
      for (auto mode : {vpce::Mode::stash_softmax, vpce::Mode::recompute}) {
        vpce::Options opt;
        opt.strategy = strategy;
        opt.mode = mode;
        for (Path path : all_paths()) this->check(np.part, opt, p, ref, path, np.name);
      }
    }
  }
}

// A larger problem (several vector lengths per row with a remainder, several OpenMP threads, N not a
// multiple of the automatic block), host and team kernels, both strategies.
TYPED_TEST(CrossEntropyTest, LargerProblem) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(4099, this->comm);
  const Problem p = make_problem<scalar>(67, part.vocab_size(), 4099);
  this->check_strategies_and_kernels(part, p, {Path::fused_view, Path::forward_backward_scalar}, "V 4099");
}

/// Rows whose max grows along the row by more than e^80 (the host kernels' running max then does a chunk again
/// in two passes): a jump inside the first chunk past its first 64 columns, a jump in a later chunk, rising and
/// falling ramps, over rows of several 4096-column chunks per rank of `part`.
template <class scalar>
Problem rising_max_problem(const vpce::VocabPartition& part, int ranks) {
  Problem p = make_problem<scalar>(5, part.vocab_size(), 11);
  const std::int64_t v = p.v;
  for (std::int64_t j = 0; j < v; ++j) {
    const double noise = p.at(2, j) - std::floor(p.at(2, j));  // in [0, 1)
    p.at(0, j) = static_cast<scalar>(-300.0 + noise);
    p.at(1, j) = static_cast<scalar>(-200.0 + 400.0 * double(j) / double(v) + noise);
    p.at(3, j) = static_cast<scalar>(200.0 - 400.0 * double(j) / double(v) + noise);
  }
  for (int r = 0; r < ranks; ++r) {  // on every rank: column 100 and 5000 of its slice
    const std::int64_t b = part.begin(r);
    p.at(0, b + 100) = static_cast<scalar>(100.0 + double(r));
    p.at(0, b + 5000) = static_cast<scalar>(250.0 - double(r));
  }
  return p;
}

// rising_max_problem() (so that a chunk is done again), host and team kernels, every path.
TYPED_TEST(CrossEntropyTest, RowsWhoseMaxGrowsByMoreThanE80) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(3 * 4096 * this->comm.size() + 7, this->comm);
  const Problem p = rising_max_problem<scalar>(part, this->comm.size());
  this->check_strategies_and_kernels(part, p, all_paths(), "rising max");
}

// Label smoothing over rising_max_problem()'s rows: its sum of x is the exps' second sum, and a chunk done again
// keeps the sum of its first pass; with and without class weights, out of place, in place (over fp32/fp64 logits
// the exps over their own logits) and forward + backward, host and team kernels, both strategies.
TYPED_TEST(CrossEntropyTest, SmoothingWhereTheMaxGrowsByMoreThanE80) {
  using compute = typename TestFixture::cross_entropy::compute_type;
  const auto part = vpce::VocabPartition::even(3 * 4096 * this->comm.size() + 7, this->comm);
  const Problem p = rising_max_problem<typename TestFixture::scalar>(part, this->comm.size());
  std::vector<double> w(p.v);
  for (std::int64_t j = 0; j < p.v; ++j) w[j] = j % 7 == 3 ? 0.0 : 0.5 + double(j % 4) * 0.375;
  Kokkos::View<compute*, typename TypeParam::memory_space> local_w("w", part.local_size());
  auto h_w = Kokkos::create_mirror_view(local_w);
  for (std::int64_t j = 0; j < part.local_size(); ++j) h_w(j) = compute(w[part.begin() + j]);
  Kokkos::deep_copy(local_w, h_w);
  const auto in = make_local<TypeParam>(p, part);
  for (const bool weighted : {false, true}) {
    vpce::Options base;
    base.label_smoothing = 0.1;
    const Reference ref = reference(p, base, weighted ? &w : nullptr);
    for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
      for (bool teams : {false, true}) {
        vpce::Options opt = base;
        opt.strategy = strategy;
        opt.force_team_kernels = teams;
        opt.block_bytes_per_thread = 4096;
        typename TestFixture::cross_entropy ce(this->comm, part, opt);
        if (weighted) ce.set_class_weights(local_w);
        for (Path path : {Path::fused_scalar, Path::fused_in_place_scalar, Path::forward_backward_scalar}) {
          const Outputs out = run_path<TypeParam>(ce, in, path);
          const std::string what =
              std::string(weighted ? "class weights, " : "") + "smoothing, " + describe(opt) + ", " + to_string(path);
          expect_matches_reference<TypeParam>(out, ref, p, part.begin(), part.local_size(), path_scale(p, path), what);
        }
      }
    }
  }
}

// In place (the gradient over the logits' own buffer) gives the same bits as out of place. In place over fp32
// or fp64 logits the rows after the head keep each exp over the logit it comes from, and a chunk done again
// takes its terms from the values stored: rising_max_problem()'s rows (chunks done again after their exps
// were stored) over several chunks, blocks of one row (after the head: chained rows on one rank, pipelined
// blocks on several) and the automatic ones, with options that change the gradient's terms (and the entropy
// weight, whose gradient reads the logits: there the exps stay in the scratch).
TYPED_TEST(CrossEntropyTest, InPlaceGivesTheSameBitsAsOutOfPlace) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(3 * 4096 * this->comm.size() + 7, this->comm);
  const Problem p = rising_max_problem<scalar>(part, this->comm.size());
  const auto in = make_local<TypeParam>(p, part);
  std::vector<vpce::Options> opts(4);
  opts[1].label_smoothing = 0.1;
  opts[1].z_loss = 1e-4;
  opts[2].logit_scale = 0.5;
  opts[3].entropy_weight = 0.01;
  for (std::int64_t block_bytes : {std::int64_t(4096), std::int64_t(0)}) {
    for (vpce::Options opt : opts) {
      if (block_bytes > 0) opt.block_bytes_per_thread = block_bytes;
      SCOPED_TRACE(describe(opt));
      typename TestFixture::cross_entropy ce(this->comm, part, opt);
      const Outputs out = run_path<TypeParam>(ce, in, Path::fused_view);
      const Outputs ip = run_path<TypeParam>(ce, in, Path::fused_in_place_view);
      auto expect_same = [&](const std::vector<double>& a, const std::vector<double>& b, const char* what) {
        ASSERT_EQ(a.size(), b.size()) << what;
        std::size_t k = 0;
        while (k < a.size() && a[k] == b[k]) ++k;
        EXPECT_EQ(k, a.size()) << "rank " << world_rank() << ": " << what << " differs first at element " << k
                               << " (row " << k / std::size_t(part.local_size()) << "): in place "
                               << (k < a.size() ? a[k] : 0.0) << ", out of place " << (k < b.size() ? b[k] : 0.0);
      };
      expect_same(ip.loss, out.loss, "loss");
      expect_same(ip.lse, out.lse, "lse");
      expect_same(ip.grad, out.grad, "gradient");
    }
  }
}

// One token.
TYPED_TEST(CrossEntropyTest, OneToken) {
  using scalar = typename TestFixture::scalar;
  for (const auto& np : test_partitions(this->comm)) {
    const Problem p = make_problem<scalar>(1, np.part.vocab_size(), 3);
    const Reference ref = reference(p);
    for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
      vpce::Options opt;
      opt.strategy = strategy;
      for (Path path : all_paths()) this->check(np.part, opt, p, ref, path, np.name + ", N 1");
    }
  }
}

// lse() is empty before the first call.
TYPED_TEST(CrossEntropyTest, LseIsEmptyBeforeTheFirstCall) {
  typename TestFixture::cross_entropy ce(this->comm, vpce::VocabPartition::even(10, this->comm));
  EXPECT_EQ(ce.lse().extent(0), 0u);
}

// Fused and seed strategies give the same loss, lse and gradient as each other (strategy vs strategy).
TYPED_TEST(CrossEntropyTest, FusedAndSeedStrategiesAgree) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(211, this->comm);
  const Problem p = make_problem<scalar>(41, part.vocab_size(), 7);
  const auto in = make_local<TypeParam>(p, part);
  std::vector<Outputs> outs;
  for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
    vpce::Options opt;
    opt.strategy = strategy;
    typename TestFixture::cross_entropy ce(this->comm, part, opt);
    outs.push_back(run_path<TypeParam>(ce, in, Path::fused_view));
  }
  expect_allclose(outs[1].loss, outs[0].loss, Tolerance<scalar>::loss, "seed vs fused: loss");
  expect_allclose(outs[1].lse, outs[0].lse, Tolerance<scalar>::loss, "seed vs fused: lse");
  expect_allclose(outs[1].grad, outs[0].grad, Tolerance<scalar>::grad, "seed vs fused: grad", part.local_size());
  // And both against the reference, so that two equally wrong strategies cannot pass.
  const Reference ref = reference(p);
  expect_matches_reference<TypeParam>(outs[0], ref, p, part.begin(), part.local_size(), p.g, "fused");
  expect_matches_reference<TypeParam>(outs[1], ref, p, part.begin(), part.local_size(), p.g, "seed");
}

// lse() is the per-row log-sum-exp over the global vocabulary, after forward() and after loss_and_grad(),
// with one entry per row of the last call.
TYPED_TEST(CrossEntropyTest, LseIsTheGlobalLogSumExp) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(53, this->comm);
  for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
    vpce::Options opt;
    opt.strategy = strategy;
    typename TestFixture::cross_entropy ce(this->comm, part, opt);
    for (std::int64_t n : {19, 6}) {
      const Problem p = make_problem<scalar>(n, part.vocab_size(), 100 + n);
      const Reference ref = reference(p);
      const auto in = make_local<TypeParam>(p, part);
      auto loss = poisoned_vector<TypeParam>(n);
      ce.forward(in.x, in.y, loss);
      EXPECT_EQ(ce.lse().extent(0), std::size_t(n));
      expect_allclose(to_host(ce.lse()), ref.lse, Tolerance<scalar>::loss, "lse after forward");
      auto grad = poisoned_matrix<TypeParam>(n, part.local_size());
      ce.loss_and_grad(in.x, in.y, loss, grad);
      EXPECT_EQ(ce.lse().extent(0), std::size_t(n));
      expect_allclose(to_host(ce.lse()), ref.lse, Tolerance<scalar>::loss, "lse after loss_and_grad");
    }
  }
}

// Options::block_rows 1, 3 (does not divide N), automatic, and larger than N; automatic with tiny blocks;
// each with the host kernels and with the team-per-row (GPU-style) kernels: all match the reference and
// each other.
TYPED_TEST(CrossEntropyTest, BlockRowsAndTeamKernelsGiveTheSameResult) {
  using scalar = typename TestFixture::scalar;
  const std::int64_t n = 23;
  for (const auto& np : test_partitions(this->comm)) {
    const Problem p = make_problem<scalar>(n, np.part.vocab_size(), 31);
    const Reference ref = reference(p);
    const auto in = make_local<TypeParam>(p, np.part);
    for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
      std::vector<Outputs> outs;
      const std::int64_t block_rows[] = {1, 3, 0, n + 100, -1};  // -1: automatic with tiny blocks
      for (std::int64_t rows : block_rows) {
        for (bool teams : {false, true}) {
          vpce::Options opt;
          opt.strategy = strategy;
          opt.mode = vpce::Mode::stash_softmax;
          opt.force_team_kernels = teams;
          opt.block_rows = rows < 0 ? 0 : rows;
          if (rows < 0) opt.block_bytes_per_thread = 1;  // automatic, one row per thread
          typename TestFixture::cross_entropy ce(this->comm, np.part, opt);
          if (rows > 0) {
            EXPECT_EQ(ce.block_rows(), rows);
          }
          EXPECT_GE(ce.block_rows(), 1);
          const std::string what = np.name + ", " + describe(opt);
          for (Path path : {Path::fused_view, Path::forward_backward_view}) {
            outs.push_back(run_path<TypeParam>(ce, in, path));
            expect_matches_reference<TypeParam>(outs.back(), ref, p, np.part.begin(), np.part.local_size(), p.g,
                                                what + ", " + to_string(path));
          }
        }
      }
      for (std::size_t k = 1; k < outs.size(); ++k) {
        expect_allclose(outs[k].loss, outs[0].loss, Tolerance<scalar>::loss, np.name + ": loss vs the first");
        expect_allclose(outs[k].grad, outs[0].grad, Tolerance<scalar>::grad, np.name + ": grad vs the first",
                        np.part.local_size());
      }
    }
  }
}

// Ranks asking for different block_rows agree on the smallest (the fused strategy has one collective per
// block, so every rank must use the same blocks).
TYPED_TEST(CrossEntropyTest, DifferentBlockRowsPerRankAgreeOnTheSmallest) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(40, this->comm);
  vpce::Options opt;
  opt.block_rows = 2 + this->comm.rank();
  typename TestFixture::cross_entropy ce(this->comm, part, opt);
  EXPECT_EQ(ce.block_rows(), 2);
  const Problem p = make_problem<scalar>(17, part.vocab_size(), 5);
  const auto out = run_path<TypeParam>(ce, make_local<TypeParam>(p, part), Path::fused_view);
  expect_matches_reference<TypeParam>(out, reference(p), p, part.begin(), part.local_size(), p.g, "block_rows 2+r");
}

// N = 0 tokens: every call works and returns empty results; the object still works afterwards.
TYPED_TEST(CrossEntropyTest, ZeroTokens) {
  using scalar = typename TestFixture::scalar;
  for (const auto& np : test_partitions(this->comm)) {
    for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
      for (auto mode : {vpce::Mode::stash_softmax, vpce::Mode::recompute}) {
        vpce::Options opt;
        opt.strategy = strategy;
        opt.mode = mode;
        typename TestFixture::cross_entropy ce(this->comm, np.part, opt);
        const Problem empty = make_problem<scalar>(0, np.part.vocab_size(), 1);
        const auto in = make_local<TypeParam>(empty, np.part);
        for (Path path : all_paths()) {
          bool threw = false;
          try {
            const Outputs out = run_path<TypeParam>(ce, in, path);
            EXPECT_TRUE(out.loss.empty() && out.lse.empty() && out.grad.empty());
          } catch (const std::exception& e) {
            threw = true;
            ADD_FAILURE() << np.name << ", " << describe(opt) << ", " << to_string(path) << ": N = 0 threw "
                          << e.what();
          }
          EXPECT_TRUE(all_ranks(!threw));
        }
        expect_in_step<TypeParam>(ce);
      }
    }
  }
}

// One object, calls with growing and shrinking N (work buffers reallocated and reused), every mode.
TYPED_TEST(CrossEntropyTest, RepeatedCallsWithDifferentN) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(45, this->comm);
  for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
    for (auto mode : {vpce::Mode::stash_softmax, vpce::Mode::recompute}) {
      vpce::Options opt;
      opt.strategy = strategy;
      opt.mode = mode;
      opt.block_rows = 4;
      typename TestFixture::cross_entropy ce(this->comm, part, opt);
      std::uint64_t seed = 300;
      for (std::int64_t n : {13, 3, 29, 1, 29}) {
        const Problem p = make_problem<scalar>(n, part.vocab_size(), seed++);
        const Reference ref = reference(p);
        const auto in = make_local<TypeParam>(p, part);
        for (Path path : {Path::forward_backward_scalar, Path::fused_view}) {
          const auto out = run_path<TypeParam>(ce, in, path);
          expect_matches_reference<TypeParam>(out, ref, p, part.begin(), part.local_size(), path_scale(p, path),
                                              describe(opt) + ", N " + std::to_string(n) + ", " + to_string(path));
        }
      }
    }
  }
}

// backward() may be called again after one forward(), with another scale: the forward's state is kept.
TYPED_TEST(CrossEntropyTest, BackwardCanBeRepeated) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(33, this->comm);
  const Problem p = make_problem<scalar>(11, part.vocab_size(), 77);
  const Reference ref = reference(p);
  const auto in = make_local<TypeParam>(p, part);
  for (auto mode : {vpce::Mode::stash_softmax, vpce::Mode::recompute}) {
    vpce::Options opt;
    opt.mode = mode;
    typename TestFixture::cross_entropy ce(this->comm, part, opt);
    auto loss = poisoned_vector<TypeParam>(p.n);
    ce.forward(in.x, in.y, loss);
    expect_allclose(to_host(loss), ref.loss, Tolerance<scalar>::loss, describe(opt) + ": loss");
    for (double scale : {1.0, -3.5, 0.125}) {
      auto grad = poisoned_matrix<TypeParam>(p.n, part.local_size());
      ce.backward(static_cast<scalar>(scale), grad);
      expect_allclose(
          to_host(grad), expected_grad(ref, p, part.begin(), part.local_size(), std::vector<double>(p.n, scale)),
          Tolerance<scalar>::grad, describe(opt) + ": grad, scale " + std::to_string(scale), part.local_size());
    }
  }
}

// The default grad_scale of loss_and_grad is 1 (the gradient of the sum of the losses).
TYPED_TEST(CrossEntropyTest, DefaultGradScaleIsOne) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(30, this->comm);
  const Problem p = make_problem<scalar>(9, part.vocab_size(), 8);
  const auto in = make_local<TypeParam>(p, part);
  typename TestFixture::cross_entropy ce(this->comm, part);
  auto loss = poisoned_vector<TypeParam>(p.n);
  auto grad = poisoned_matrix<TypeParam>(p.n, part.local_size());
  ce.loss_and_grad(in.x, in.y, loss, grad);
  const Reference ref = reference(p);
  expect_allclose(to_host(loss), ref.loss, Tolerance<scalar>::loss, "loss");
  expect_allclose(to_host(grad), expected_grad(ref, p, part.begin(), part.local_size(), std::vector<double>(p.n, 1.0)),
                  Tolerance<scalar>::grad, "grad", part.local_size());
}

}  // namespace
