// Non-finite logits: -inf (vocabulary padding, masked tokens) scattered, over a whole rank's slice of a
// row, at the target; a whole row of -inf (an error); NaN and +inf (an error by default, propagated with
// NonFinite::propagate). Each case runs with both strategies and with the host and the team kernels.

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "test_utils.hpp"

namespace {

using namespace vpce_test;

template <class C>
class NonFiniteTest : public ::testing::Test {
 protected:
  using scalar = typename C::scalar;
  using cross_entropy = typename C::cross_entropy;
  vpce::Communicator comm{MPI_COMM_WORLD};

  /// Both strategies, host and team kernels, blocks of 3 rows (the fused strategy checks block by block).
  static std::vector<vpce::Options> variants(bool teams) {
    std::vector<vpce::Options> out;
    for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
      vpce::Options opt;
      opt.strategy = strategy;
      opt.block_rows = 3;
      opt.force_team_kernels = teams;
      out.push_back(opt);
    }
    return out;
  }
  static std::vector<vpce::Options> variants() {
    auto out = variants(false);
    for (const auto& o : variants(true)) out.push_back(o);
    return out;
  }

  /// Every path of every variant matches the reference, and the gradient is exactly 0 where the logit is
  /// -inf (except at the target, where it is -g).
  void expect_all_paths_match(const vpce::VocabPartition& part, const Problem& p, const std::string& label) {
    const Reference ref = reference(p);
    const auto in = make_local<C>(p, part);
    for (const auto& opt0 : variants()) {
      for (auto mode : {vpce::Mode::stash_softmax, vpce::Mode::recompute}) {
        vpce::Options opt = opt0;
        opt.mode = mode;
        cross_entropy ce(comm, part, opt);
        for (Path path : all_paths()) {
          const std::string what = label + ", " + describe(opt) + ", " + to_string(path);
          Outputs out;
          bool threw = false;
          try {
            out = run_path<C>(ce, in, path);
          } catch (const std::exception& e) {
            threw = true;
            ADD_FAILURE() << "rank " << world_rank() << ": " << what << ": threw " << e.what();
          }
          EXPECT_TRUE(all_ranks(!threw)) << what;
          if (threw) continue;
          expect_matches_reference<C>(out, ref, p, part.begin(), part.local_size(), path_scale(p, path), what);
          int nonzero = 0;
          for (std::int64_t i = 0; i < p.n; ++i)
            for (std::int64_t j = 0; j < part.local_size(); ++j)
              if (p.at(i, part.begin() + j) == -kInf && part.begin() + j != p.y[i] &&
                  out.grad[i * part.local_size() + j] != 0.0)
                ++nonzero;
          EXPECT_EQ(nonzero, 0) << "rank " << world_rank() << ": " << what
                                << ": gradient not 0 at -inf logits (other than the target's)";
        }
      }
    }
  }
};

TYPED_TEST_SUITE(NonFiniteTest, AllConfigs, ConfigName);

/// The columns [first, last) of "a whole rank's slice": the last rank's (or the first rank's) columns when
/// there are several ranks, the upper (lower) half of the vocabulary on one rank.
std::pair<std::int64_t, std::int64_t> slice_of(const vpce::VocabPartition& part, bool last) {
  if (part.num_ranks() == 1) {
    const std::int64_t half = part.vocab_size() / 2;
    return last ? std::make_pair(half, part.vocab_size()) : std::make_pair(std::int64_t(0), half);
  }
  const int r = last ? part.num_ranks() - 1 : 0;
  return {part.begin(r), part.end(r)};
}

// About a quarter of the logits -inf, at random, never the target.
TYPED_TEST(NonFiniteTest, ScatteredNegativeInfinity) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(61, this->comm);
  Problem p = make_problem<scalar>(29, part.vocab_size(), 11);
  Rng rng(12);
  int count = 0;
  for (std::int64_t i = 0; i < p.n; ++i)
    for (std::int64_t j = 0; j < p.v; ++j)
      if (j != p.y[i] && rng.below(4) == 0) p.at(i, j) = -kInf, ++count;
  ASSERT_GT(count, 100);  // the same on every rank
  this->expect_all_paths_match(part, p, "scattered -inf");
}

// A whole rank's slice of a row is -inf (vocabulary padding): the loss is finite and right, the gradient 0
// there. Rows 1, 4, ...: the last rank's slice; rows 2, 5, ...: the first rank's; the target elsewhere.
TYPED_TEST(NonFiniteTest, WholeSliceOfARowIsNegativeInfinity) {
  using scalar = typename TestFixture::scalar;
  for (const auto& part : {vpce::VocabPartition::even(50, this->comm), vpce::VocabPartition::even(7, this->comm)}) {
    Problem p = make_problem<scalar>(16, part.vocab_size(), 13);
    for (std::int64_t i = 0; i < p.n; ++i) {
      if (i % 3 == 0) continue;
      const auto [first, last] = slice_of(part, i % 3 == 1);
      for (std::int64_t j = first; j < last; ++j) p.at(i, j) = -kInf;
      p.y[i] = i % 3 == 1 ? 0 : p.v - 1;
    }
    this->expect_all_paths_match(part, p, "a rank's slice -inf, V " + std::to_string(part.vocab_size()));
  }
}

// The target's logit is -inf: that row's loss is +inf, no NaN anywhere, the gradient is still right
// (-g at the target, softmax * g elsewhere), and no error is raised.
TYPED_TEST(NonFiniteTest, TargetLogitIsNegativeInfinity) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(43, this->comm);
  Problem p = make_problem<scalar>(9, part.vocab_size(), 17);
  p.at(2, p.y[2]) = -kInf;
  p.at(5, p.y[5]) = -kInf;
  p.at(5, (p.y[5] + 1) % p.v) = -kInf;
  const Reference ref = reference(p);
  ASSERT_EQ(ref.loss[2], kInf);
  ASSERT_EQ(ref.loss[5], kInf);
  this->expect_all_paths_match(part, p, "target -inf");
}

// A row whose every logit is -inf has no defined loss: every rank throws, then works again.
TYPED_TEST(NonFiniteTest, WholeRowOfNegativeInfinityIsAnError) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(22, this->comm);
  Problem p = make_problem<scalar>(8, part.vocab_size(), 19);
  for (std::int64_t j = 0; j < p.v; ++j) p.at(3, j) = -kInf;
  const auto in = make_local<TypeParam>(p, part);
  for (const auto& opt : this->variants(false)) {
    typename TestFixture::cross_entropy ce(this->comm, part, opt);
    for (Path path : {Path::fused_view, Path::forward_backward_view}) {
      SCOPED_TRACE(describe(opt) + ", " + to_string(path));
      expect_error_on_all_ranks([&] { run_path<TypeParam>(ce, in, path); }, "every logit of row 3 is -inf");
      expect_in_step<TypeParam>(ce);
    }
  }
}

// The same with the team-per-row kernels.
TYPED_TEST(NonFiniteTest, WholeRowOfNegativeInfinityIsAnErrorWithTeamKernels) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(22, this->comm);
  Problem p = make_problem<scalar>(8, part.vocab_size(), 19);
  for (std::int64_t j = 0; j < p.v; ++j) p.at(3, j) = -kInf;
  const auto in = make_local<TypeParam>(p, part);
  for (const auto& opt : this->variants(true)) {
    typename TestFixture::cross_entropy ce(this->comm, part, opt);
    for (Path path : {Path::fused_view, Path::forward_backward_view}) {
      SCOPED_TRACE(describe(opt) + ", " + to_string(path));
      expect_error_on_all_ranks([&] { run_path<TypeParam>(ce, in, path); }, "every logit of row 3 is -inf");
      expect_in_step<TypeParam>(ce);
    }
  }
}

// A NaN logit on one rank only (the last), a NaN target logit (rank 0), a +inf logit, a row that is all NaN
// (col -1; in place its NaN must be read before the gradient overwrites it): every rank throws naming the
// row, then works again.
TYPED_TEST(NonFiniteTest, NaNOrPositiveInfinityIsAnErrorOnEveryRank) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(37, this->comm);
  const Problem clean = make_problem<scalar>(10, part.vocab_size(), 23);
  struct Case {
    const char* name;
    std::int64_t row, col;
    double value;
  };
  const std::int64_t last_rank_col = part.begin(part.num_ranks() - 1) + part.local_size(part.num_ranks() - 1) / 2;
  const Case cases[] = {{"NaN on the last rank", 4, last_rank_col, kNaN},
                        {"NaN at the target", 0, 0, kNaN},
                        {"+inf on the last rank", 7, last_rank_col, kInf},
                        {"+inf on rank 0", 9, 1, kInf},
                        {"a row of NaN", 5, -1, kNaN}};
  for (const auto& c : cases) {
    Problem p = clean;
    for (std::int64_t j = c.col < 0 ? 0 : c.col; j < (c.col < 0 ? part.vocab_size() : c.col + 1); ++j)
      p.at(c.row, j) = c.value;
    const auto in = make_local<TypeParam>(p, part);
    for (const auto& opt : this->variants()) {
      typename TestFixture::cross_entropy ce(this->comm, part, opt);
      for (Path path : {Path::fused_scalar, Path::forward_backward_scalar, Path::fused_in_place_scalar}) {
        SCOPED_TRACE(std::string(c.name) + ", " + describe(opt) + ", " + to_string(path));
        expect_error_on_all_ranks([&] { run_path<TypeParam>(ce, in, path); },
                                  "row " + std::to_string(c.row) + " of the logits holds NaN or +inf");
        expect_in_step<TypeParam>(ce);
      }
    }
  }
}

/// Row 4 holds one NaN among -inf logits, the target elsewhere:
///  - "slice": the last rank's slice of row 4 is -inf but for a NaN (on one rank: the upper half of V);
///  - "chunk": V = 600, columns [0, 512) of row 4 are -inf but for a NaN at column 5 (the host kernels
///    read a row in chunks of 512 columns, with a running max that is still -inf after this chunk).
struct NaNCase {
  std::string name;
  vpce::VocabPartition part;
  Problem p;
};

std::vector<NaNCase> nan_among_negative_infinity(const vpce::Communicator& comm, std::uint64_t seed) {
  std::vector<NaNCase> out;
  {
    const auto part = vpce::VocabPartition::even(37, comm);
    Problem p = make_problem<double>(10, part.vocab_size(), seed);
    const auto [first, last] = slice_of(part, true);
    for (std::int64_t j = first; j < last; ++j) p.at(4, j) = -kInf;
    p.at(4, last - 1) = kNaN;
    p.y[4] = 0;
    out.push_back({"slice", part, p});
  }
  {
    const auto part = vpce::VocabPartition::even(600, comm);
    Problem p = make_problem<double>(10, part.vocab_size(), seed);
    for (std::int64_t j = 0; j < 512; ++j) p.at(4, j) = -kInf;
    p.at(4, 5) = kNaN;
    p.y[4] = 599;
    out.push_back({"chunk", part, p});
  }
  return out;
}

bool is_fused_host(const vpce::Options& o) { return o.strategy == vpce::Strategy::fused && !o.force_team_kernels; }

/// Every variant that `pick` selects throws for both cases of nan_among_negative_infinity().
template <class C, class Pick>
void expect_nan_among_negative_infinity_caught(const vpce::Communicator& comm, const std::vector<vpce::Options>& all,
                                               Pick pick) {
  for (const auto& c : nan_among_negative_infinity(comm, 29)) {
    const auto in = make_local<C>(c.p, c.part);
    for (const auto& opt : all) {
      if (!pick(opt)) continue;
      typename C::cross_entropy ce(comm, c.part, opt);
      SCOPED_TRACE(c.name + ", " + describe(opt));
      expect_error_on_all_ranks([&] { run_path<C>(ce, in, Path::fused_scalar); },
                                "row 4 of the logits holds NaN or +inf");
      expect_in_step<C>(ce);
    }
  }
}

// A NaN among -inf logits must be caught too (here: seed strategy, and the team kernels; the fused strategy
// with the host kernels is the next test).
TYPED_TEST(NonFiniteTest, NaNAmongNegativeInfinityIsAnError) {
  expect_nan_among_negative_infinity_caught<TypeParam>(this->comm, this->variants(),
                                                       [](const vpce::Options& o) { return !is_fused_host(o); });
}

TYPED_TEST(NonFiniteTest, NaNAmongNegativeInfinityIsAnErrorFusedHostKernels) {
  expect_nan_among_negative_infinity_caught<TypeParam>(this->comm, this->variants(false), is_fused_host);
}

// NonFinite::propagate: no error; the rows with a NaN or +inf logit get a NaN loss and lse, every other row
// is right.
TYPED_TEST(NonFiniteTest, PropagateGivesNaNForThatRowOnly) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(37, this->comm);
  Problem p = make_problem<scalar>(10, part.vocab_size(), 31);
  const auto [first, last] = slice_of(part, true);
  p.at(4, first) = kNaN;
  p.at(6, 2) = kInf;
  const Reference ref = reference(p);
  const auto in = make_local<TypeParam>(p, part);
  for (auto opt : this->variants()) {
    opt.non_finite = vpce::NonFinite::propagate;
    for (auto mode : {vpce::Mode::stash_softmax, vpce::Mode::recompute}) {
      opt.mode = mode;
      typename TestFixture::cross_entropy ce(this->comm, part, opt);
      for (Path path : all_paths()) {
        const std::string what = describe(opt) + ", " + to_string(path);
        Outputs out;
        bool threw = false;
        try {
          out = run_path<TypeParam>(ce, in, path);
        } catch (const std::exception& e) {
          threw = true;
          ADD_FAILURE() << what << ": threw " << e.what();
        }
        EXPECT_TRUE(all_ranks(!threw));
        if (threw) continue;
        for (std::int64_t i = 0; i < p.n; ++i) {
          EXPECT_EQ(std::isnan(out.loss[i]), i == 4 || i == 6) << what << ": row " << i << " loss " << out.loss[i];
        }
        // Everything else (the other rows' loss, lse and gradient) against the reference, which has NaN
        // for rows 4 and 6 as well.
        expect_matches_reference<TypeParam>(out, ref, p, part.begin(), part.local_size(), path_scale(p, path), what);
      }
    }
  }
}

/// Under NonFinite::propagate, row 4 of both cases of nan_among_negative_infinity() gets a NaN loss, and
/// no other row does.
template <class C, class Pick>
void expect_nan_among_negative_infinity_propagated(const vpce::Communicator& comm, std::vector<vpce::Options> all,
                                                   Pick pick) {
  for (const auto& c : nan_among_negative_infinity(comm, 37)) {
    const auto in = make_local<C>(c.p, c.part);
    for (auto opt : all) {
      if (!pick(opt)) continue;
      opt.non_finite = vpce::NonFinite::propagate;
      typename C::cross_entropy ce(comm, c.part, opt);
      const Outputs out = run_path<C>(ce, in, Path::fused_scalar);
      for (std::size_t i = 0; i < out.loss.size(); ++i) {
        EXPECT_EQ(std::isnan(out.loss[i]), i == 4)
            << c.name << ", " << describe(opt) << ": row " << i << " loss " << out.loss[i];
      }
    }
  }
}

// The same under NonFinite::propagate (seed strategy, team kernels).
TYPED_TEST(NonFiniteTest, PropagateNaNAmongNegativeInfinity) {
  expect_nan_among_negative_infinity_propagated<TypeParam>(this->comm, this->variants(),
                                                           [](const vpce::Options& o) { return !is_fused_host(o); });
}

TYPED_TEST(NonFiniteTest, PropagateNaNAmongNegativeInfinityFusedHostKernels) {
  expect_nan_among_negative_infinity_propagated<TypeParam>(this->comm, this->variants(false), is_fused_host);
}

}  // namespace

namespace {

/// EXPECTs every element of `got` NaN or equal to `before` (untouched); returns how many are NaN.
std::size_t expect_nan_or_untouched(const std::vector<double>& got, const std::vector<double>& before,
                                    const std::string& what) {
  std::size_t nan = 0, other = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    if (std::isnan(got[k]))
      ++nan;
    else if (!(got[k] == before[k] || (std::isnan(before[k]))))
      ++other;
  }
  EXPECT_EQ(other, 0u) << "rank " << world_rank() << ": " << what << ": " << other
                       << " elements hold a value that is neither the old one nor NaN";
  return nan;
}

// A NaN found after outputs were written (row 7, blocks of 3 rows: the fused strategy has finished rows 0-5
// when it sees it) leaves no valid-looking partial result: every element of the loss and the gradient (of
// the logits too, in place) is afterwards either what it was or NaN. The fused strategy poisons the loss and
// the gradient rows it wrote; the seed strategy finds the NaN before writing anything.
TYPED_TEST(NonFiniteTest, OutputsAfterALateNonFiniteErrorAreNaNOrUntouched) {
  using C = TypeParam;
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(31, this->comm);
  const std::int64_t w = part.local_size();
  Problem p = make_problem<scalar>(10, part.vocab_size(), 41);
  p.at(7, p.v - 1) = kNaN;  // on the last rank
  const auto in = make_local<C>(p, part);
  for (const auto& opt : this->variants()) {
    typename C::cross_entropy ce(this->comm, part, opt);
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(describe(opt) + (in_place ? ", in place" : ""));
      typename C::cross_entropy::loss_view loss("loss", p.n);
      Kokkos::deep_copy(loss, scalar(2.5));
      Kokkos::View<scalar**, Kokkos::LayoutRight, typename C::memory_space> grad("grad", p.n, w);
      if (in_place) {
        Kokkos::deep_copy(grad, in.x);
      } else {
        Kokkos::deep_copy(grad, scalar(3.5));
      }
      const auto loss0 = to_host(loss), grad0 = to_host(grad);
      expect_error_on_all_ranks(
          [&] {
            if (in_place) {
              ce.loss_and_grad(grad, in.y, loss, grad, in.g);
            } else {
              ce.loss_and_grad(in.x, in.y, loss, grad, in.g);
            }
          },
          "row 7 of the logits holds NaN or +inf");
      const std::size_t nan_loss = expect_nan_or_untouched(to_host(loss), loss0, "loss");
      expect_nan_or_untouched(to_host(grad), grad0, in_place ? "logits (in place)" : "gradient");
      if (!in_place) expect_inputs_unchanged(in, p, part.begin(), "logits");
      EXPECT_EQ(nan_loss, opt.strategy == vpce::Strategy::fused ? std::size_t(p.n) : std::size_t(0))
          << "rank " << world_rank() << ": the fused strategy poisons the whole loss, the seed writes nothing";
      EXPECT_TRUE(std::isnan(ce.reduced_loss()));
      EXPECT_EQ(ce.lse().extent(0), 0u);
      expect_in_step<C>(ce);
    }
  }
}

}  // namespace
