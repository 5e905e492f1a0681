// Bad input gets a vpce::Error on EVERY rank, with the same message everywhere (DESIGN.md section 7), never a
// hang; after each error a normal call shows that the ranks are still in step.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_utils.hpp"

namespace {

using namespace vpce_test;

template <class C>
class ErrorTest : public ::testing::Test {
 protected:
  using scalar = typename C::scalar;
  using cross_entropy = typename C::cross_entropy;
  using matrix = Kokkos::View<scalar**, Kokkos::LayoutRight, typename C::memory_space>;
  using vector = Kokkos::View<scalar*, typename C::memory_space>;
  using targets = Kokkos::View<std::int64_t*, typename C::memory_space>;

  vpce::Communicator comm{MPI_COMM_WORLD};
  vpce::VocabPartition part = vpce::VocabPartition::even(27, comm);
  Problem p = make_problem<scalar>(7, 27, 41);
  LocalInputs<C> in = make_local<C>(p, part);

  /// Every strategy and memory mode (the checks run before the strategies part ways, but must hold in all).
  static std::vector<vpce::Options> variants() {
    std::vector<vpce::Options> out;
    for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
      for (auto mode : {vpce::Mode::stash_softmax, vpce::Mode::recompute}) {
        vpce::Options opt;
        opt.strategy = strategy;
        opt.mode = mode;
        out.push_back(opt);
      }
    }
    return out;
  }

  /// forward() on good inputs, a forward() that fails in its second block, then backward(): it must throw,
  /// or give the first forward's gradient.
  void check_backward_after_failed_forward(vpce::Strategy strategy) {
    const std::int64_t n = p.n, w = part.local_size();
    Problem bad = make_problem<scalar>(n, part.vocab_size(), 43);
    bad.at(4, 0) = kNaN;
    const auto bad_in = make_local<C>(bad, part);
    const Reference ref = reference(p);
    for (auto opt : variants()) {
      if (opt.strategy != strategy) continue;
      opt.block_rows = 3;
      SCOPED_TRACE(describe(opt));
      cross_entropy ce(comm, part, opt);
      auto loss = poisoned_vector<C>(n);
      ce.forward(in.x, in.y, loss);
      expect_error_on_all_ranks([&] { ce.forward(bad_in.x, bad_in.y, loss); }, "row 4 of the logits holds NaN");
      auto grad = poisoned_matrix<C>(n, w);
      bool threw = false;
      try {
        ce.backward(in.g, grad);
      } catch (const vpce::Error&) {
        threw = true;
      }
      EXPECT_TRUE(same_on_all_ranks(threw ? "threw" : "did not throw"));
      if (!threw) {
        expect_allclose(to_host(grad), expected_grad(ref, p, part.begin(), w, p.g), Tolerance<scalar>::grad,
                        "backward after a failed forward", w);
      }
      expect_in_step<C>(ce);
    }
  }

  /// Targets equal to `in.y` except row `row`, which is `value`.
  targets targets_with(std::int64_t row, std::int64_t value) const {
    targets y("y", p.n);
    Kokkos::deep_copy(y, in.y);
    Kokkos::deep_copy(Kokkos::subview(y, row), value);
    return y;
  }
};

TYPED_TEST_SUITE(ErrorTest, AllConfigs, ConfigName);

// Targets outside [0, V): negative and >= V, in forward() and in both loss_and_grad() forms.
TYPED_TEST(ErrorTest, TargetOutOfRange) {
  const std::int64_t v = this->part.vocab_size();
  for (const auto& opt : this->variants()) {
    typename TestFixture::cross_entropy ce(this->comm, this->part, opt);
    for (std::int64_t bad : {std::int64_t(-1), v, v + 1000, std::int64_t(-7)}) {  // not ignore_index (-100)
      SCOPED_TRACE(describe(opt) + ", target " + std::to_string(bad));
      const auto y = this->targets_with(5, bad);
      const std::string needle = "target " + std::to_string(bad) + " of row 5 is outside [0, " + std::to_string(v);
      auto loss = poisoned_vector<TypeParam>(this->p.n);
      auto grad = poisoned_matrix<TypeParam>(this->p.n, this->part.local_size());
      expect_error_on_all_ranks([&] { ce.forward(this->in.x, y, loss); }, needle);
      expect_in_step<TypeParam>(ce);
      expect_error_on_all_ranks([&] { ce.loss_and_grad(this->in.x, y, loss, grad); }, needle);
      expect_in_step<TypeParam>(ce);
      expect_error_on_all_ranks([&] { ce.loss_and_grad(this->in.x, y, loss, grad, this->in.g); }, needle);
      expect_in_step<TypeParam>(ce);
    }
  }
}

// Targets that differ between ranks (rank 0 has another target in row 2) are caught by their checksum.
TYPED_TEST(ErrorTest, TargetsDifferingBetweenRanks) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  typename TestFixture::cross_entropy ce(this->comm, this->part);
  const auto y = this->comm.rank() == 0 ? this->targets_with(2, (this->p.y[2] + 1) % this->p.v) : this->in.y;
  auto loss = poisoned_vector<TypeParam>(this->p.n);
  expect_error_on_all_ranks([&] { ce.forward(this->in.x, y, loss); }, "the targets (a checksum) differs between ranks");
  expect_in_step<TypeParam>(ce);
}

// Rank 1 has one more token than the others.
TYPED_TEST(ErrorTest, TokenCountDiffersBetweenRanks) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  using scalar = typename TestFixture::scalar;
  const std::int64_t n = this->comm.rank() == 1 ? this->p.n + 1 : this->p.n;
  const Problem p = make_problem<scalar>(n, this->part.vocab_size(), 41);  // rows 0..6 as on the other ranks
  const auto in = make_local<TypeParam>(p, this->part);
  for (const auto& opt : this->variants()) {
    SCOPED_TRACE(describe(opt));
    typename TestFixture::cross_entropy ce(this->comm, this->part, opt);
    auto loss = poisoned_vector<TypeParam>(n);
    auto grad = poisoned_matrix<TypeParam>(n, this->part.local_size());
    const std::string needle = "the number of tokens N differs between ranks";
    expect_error_on_all_ranks([&] { ce.forward(in.x, in.y, loss); }, needle);
    expect_in_step<TypeParam>(ce);
    expect_error_on_all_ranks([&] { ce.loss_and_grad(in.x, in.y, loss, grad, in.g); }, needle);
    expect_in_step<TypeParam>(ce);
  }
}

// The logits have one column too many, or too few, on ONE rank only (the last).
TYPED_TEST(ErrorTest, LogitsWithWrongColumnsOnOneRank) {
  const int bad_rank = this->comm.size() - 1;
  const bool me = this->comm.rank() == bad_rank;
  const std::int64_t w = this->part.local_size();
  const std::int64_t w_bad = this->part.local_size(bad_rank);
  for (std::int64_t delta : {1, -1}) {
    const std::int64_t width = me ? w + delta : w;
    typename TestFixture::matrix x("x", this->p.n, width);
    Kokkos::deep_copy(x, typename TestFixture::scalar(0.5));
    for (const auto& opt : this->variants()) {
      SCOPED_TRACE(describe(opt) + ", delta " + std::to_string(delta));
      typename TestFixture::cross_entropy ce(this->comm, this->part, opt);
      auto loss = poisoned_vector<TypeParam>(this->p.n);
      auto grad = poisoned_matrix<TypeParam>(this->p.n, width);
      const std::string needle = "the logits have " + std::to_string(w_bad + delta) +
                                 " columns, the partition gives this rank " + std::to_string(w_bad) +
                                 (bad_rank > 0 ? " (found on rank " + std::to_string(bad_rank) + ")" : "");
      expect_error_on_all_ranks([&] { ce.forward(x, this->in.y, loss); }, needle);
      expect_in_step<TypeParam>(ce);
      expect_error_on_all_ranks([&] { ce.loss_and_grad(x, this->in.y, loss, grad); }, needle);
      expect_in_step<TypeParam>(ce);
    }
  }
}

// The logits have fewer rows than there are targets (on rank 0 only).
TYPED_TEST(ErrorTest, LogitsWithWrongRowsOnOneRank) {
  const std::int64_t rows = this->comm.rank() == 0 ? this->p.n - 1 : this->p.n;
  typename TestFixture::matrix x("x", rows, this->part.local_size());
  Kokkos::deep_copy(x, typename TestFixture::scalar(0.5));
  typename TestFixture::cross_entropy ce(this->comm, this->part);
  auto loss = poisoned_vector<TypeParam>(this->p.n);
  expect_error_on_all_ranks([&] { ce.forward(x, this->in.y, loss); },
                            "the logits have " + std::to_string(this->p.n - 1) + " rows but there are " +
                                std::to_string(this->p.n) + " targets");
  expect_in_step<TypeParam>(ce);
}

// Wrong loss, gradient and grad_loss shapes on one rank (rank 0) in the collective calls.
TYPED_TEST(ErrorTest, WrongOutputShapesOnOneRank) {
  const bool me = this->comm.rank() == 0;
  const std::int64_t n = this->p.n, w = this->part.local_size(), w0 = this->part.local_size(0);
  auto good_loss = poisoned_vector<TypeParam>(n);
  auto good_grad = poisoned_matrix<TypeParam>(n, w);
  auto bad_loss = poisoned_vector<TypeParam>(me ? n + 2 : n);
  auto bad_grad_rows = poisoned_matrix<TypeParam>(me ? n - 1 : n, w);
  auto bad_grad_cols = poisoned_matrix<TypeParam>(n, me ? w + 3 : w);
  typename TestFixture::vector bad_g("g", me ? n + 1 : n);
  Kokkos::deep_copy(bad_g, typename TestFixture::scalar(1));
  for (const auto& opt : this->variants()) {
    SCOPED_TRACE(describe(opt));
    typename TestFixture::cross_entropy ce(this->comm, this->part, opt);
    const auto& x = this->in.x;
    const auto& y = this->in.y;
    const std::string loss_msg = "the loss has " + std::to_string(n + 2) + " entries, expected " + std::to_string(n);
    expect_error_on_all_ranks([&] { ce.forward(x, y, bad_loss); }, loss_msg);
    expect_in_step<TypeParam>(ce);
    expect_error_on_all_ranks([&] { ce.loss_and_grad(x, y, bad_loss, good_grad); }, loss_msg);
    expect_in_step<TypeParam>(ce);
    expect_error_on_all_ranks([&] { ce.loss_and_grad(x, y, good_loss, bad_grad_rows); },
                              "the gradient is " + std::to_string(n - 1) + " x " + std::to_string(w0) + ", expected " +
                                  std::to_string(n) + " x " + std::to_string(w0));
    expect_in_step<TypeParam>(ce);
    expect_error_on_all_ranks([&] { ce.loss_and_grad(x, y, good_loss, bad_grad_cols, this->in.g); },
                              "the gradient is " + std::to_string(n) + " x " + std::to_string(w0 + 3));
    expect_in_step<TypeParam>(ce);
    expect_error_on_all_ranks([&] { ce.loss_and_grad(x, y, good_loss, good_grad, bad_g); },
                              "grad_loss has " + std::to_string(n + 1) + " entries, expected " + std::to_string(n));
    expect_in_step<TypeParam>(ce);
  }
}

// backward() checks its arguments locally (it does not communicate): wrong shapes on every rank. The
// message names this rank's shapes, which differ between ranks when the slices do.
TYPED_TEST(ErrorTest, BackwardWithWrongShapes) {
  const std::int64_t n = this->p.n, w = this->part.local_size();
  for (const auto& opt : this->variants()) {
    SCOPED_TRACE(describe(opt));
    typename TestFixture::cross_entropy ce(this->comm, this->part, opt);
    auto loss = poisoned_vector<TypeParam>(n);
    ce.forward(this->in.x, this->in.y, loss);
    auto bad_grad = poisoned_matrix<TypeParam>(n + 1, w);
    typename TestFixture::vector bad_g("g", n + 1);
    auto grad = poisoned_matrix<TypeParam>(n, w);
    expect_error_on_all_ranks([&] { ce.backward(typename TestFixture::scalar(1), bad_grad); },
                              "the gradient is " + std::to_string(n + 1) + " x " + std::to_string(w) + ", expected " +
                                  std::to_string(n) + " x " + std::to_string(w),
                              /*same_message=*/false);
    expect_error_on_all_ranks([&] { ce.backward(bad_g, grad); },
                              "grad_loss has " + std::to_string(n + 1) + " entries, expected " + std::to_string(n));
    // The forward's state survives the errors: backward() still gives the right gradient.
    ce.backward(this->in.g, grad);
    const Reference ref = reference(this->p);
    expect_allclose(to_host(grad), expected_grad(ref, this->p, this->part.begin(), w, this->p.g),
                    Tolerance<typename TestFixture::scalar>::grad, "grad after the errors", w);
    expect_in_step<TypeParam>(ce);
  }
}

// backward() without forward(), and after loss_and_grad() (which keeps nothing).
TYPED_TEST(ErrorTest, BackwardWithoutForward) {
  for (const auto& opt : this->variants()) {
    SCOPED_TRACE(describe(opt));
    typename TestFixture::cross_entropy ce(this->comm, this->part, opt);
    auto grad = poisoned_matrix<TypeParam>(this->p.n, this->part.local_size());
    const std::string needle = "backward() needs a forward() first";
    expect_error_on_all_ranks([&] { ce.backward(typename TestFixture::scalar(1), grad); }, needle);
    expect_error_on_all_ranks([&] { ce.backward(this->in.g, grad); }, needle);
    expect_in_step<TypeParam>(ce);  // a loss_and_grad()
    expect_error_on_all_ranks([&] { ce.backward(typename TestFixture::scalar(1), grad); }, needle);
  }
}

// A grad_loss View with no entries while there are N > 0 rows is a wrong shape too, not "scale 1".
TYPED_TEST(ErrorTest, EmptyGradLossView) {
  const std::int64_t n = this->p.n, w = this->part.local_size();
  const typename TestFixture::vector empty;
  const typename TestFixture::vector zero_length("g", 0);
  for (const auto& g : {empty, zero_length}) {
    typename TestFixture::cross_entropy ce(this->comm, this->part);
    auto loss = poisoned_vector<TypeParam>(n);
    auto grad = poisoned_matrix<TypeParam>(n, w);
    const std::string needle = "grad_loss has 0 entries, expected " + std::to_string(n);
    expect_error_on_all_ranks([&] { ce.loss_and_grad(this->in.x, this->in.y, loss, grad, g); }, needle);
    expect_in_step<TypeParam>(ce);
    ce.forward(this->in.x, this->in.y, loss);
    expect_error_on_all_ranks([&] { ce.backward(g, grad); }, needle);
  }
}

// After a forward() that failed (a NaN in row 4, found after rows 0-2 were done: blocks of 3 rows),
// backward() either throws or still gives the gradient of the last forward() that succeeded, never a mix.
TYPED_TEST(ErrorTest, BackwardAfterAFailedForward) {
  for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed})
    this->check_backward_after_failed_forward(strategy);
}

// Options that must be the same on every rank differ (rank 0 has another value): the constructor throws on
// every rank. Then a constructor with equal options works.
TYPED_TEST(ErrorTest, OptionsDifferingBetweenRanks) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const bool me = this->comm.rank() == 0;
  {
    vpce::Options opt;
    opt.strategy = me ? vpce::Strategy::seed : vpce::Strategy::fused;
    expect_error_on_all_ranks([&] { typename TestFixture::cross_entropy ce(this->comm, this->part, opt); },
                              "Options::strategy differs between ranks");
  }
  {
    vpce::Options opt;
    opt.mode = me ? vpce::Mode::stash_softmax : vpce::Mode::recompute;
    expect_error_on_all_ranks([&] { typename TestFixture::cross_entropy ce(this->comm, this->part, opt); },
                              "Options::mode differs between ranks");
  }
  {
    vpce::Options opt;
    opt.non_finite = me ? vpce::NonFinite::propagate : vpce::NonFinite::error;
    expect_error_on_all_ranks([&] { typename TestFixture::cross_entropy ce(this->comm, this->part, opt); },
                              "Options::non_finite differs between ranks");
  }
  typename TestFixture::cross_entropy ce(this->comm, this->part);
  expect_in_step<TypeParam>(ce);
}

// Invalid option values (on one rank): every rank throws.
TYPED_TEST(ErrorTest, InvalidOptions) {
  const bool me = this->comm.rank() == this->comm.size() - 1;
  for (int which = 0; which < 2; ++which) {
    vpce::Options opt;
    if (me && which == 0) opt.block_rows = -2;
    if (me && which == 1) opt.block_bytes_per_thread = 0;
    expect_error_on_all_ranks([&] { typename TestFixture::cross_entropy ce(this->comm, this->part, opt); },
                              "Options::block_rows must be >= 0");
  }
  typename TestFixture::cross_entropy ce(this->comm, this->part);
  expect_in_step<TypeParam>(ce);
}

// A partition made for another communicator (one rank) used with all the ranks.
TYPED_TEST(ErrorTest, PartitionForAnotherCommunicator) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const vpce::Communicator self(MPI_COMM_SELF);
  const auto part = vpce::VocabPartition::even(27, self);
  expect_error_on_all_ranks([&] { typename TestFixture::cross_entropy ce(this->comm, part); },
                            "the partition is for 1 ranks, the communicator has " + std::to_string(world_size()));
  typename TestFixture::cross_entropy ce(this->comm, this->part);
  expect_in_step<TypeParam>(ce);
}

// Rank 0 passes another (collectively built, valid) partition than the other ranks: the same vocabulary
// split differently, or another vocabulary size. The constructor catches both on every rank.
TYPED_TEST(ErrorTest, PartitionDifferingBetweenRanksInTheConstructor) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int w = world_size();
  std::vector<std::int64_t> sizes(w, 4), swapped(w, 4);
  sizes[0] = swapped[1] = 9;
  const auto a = vpce::VocabPartition::from_sizes(sizes, this->comm);
  const auto b = vpce::VocabPartition::from_sizes(swapped, this->comm);
  const auto c = vpce::VocabPartition::even(28, this->comm);
  const bool me = this->comm.rank() == 0;
  expect_error_on_all_ranks([&] { typename TestFixture::cross_entropy ce(this->comm, me ? b : a); },
                            "the partition (a checksum of its sizes) differs between ranks");
  expect_error_on_all_ranks([&] { typename TestFixture::cross_entropy ce(this->comm, me ? c : this->part); },
                            "the vocabulary size differs between ranks");
  typename TestFixture::cross_entropy ce(this->comm, this->part);
  expect_in_step<TypeParam>(ce);
}

// A partition made on a communicator whose ranks are numbered the other way round: every rank throws.
TYPED_TEST(ErrorTest, PartitionFromAPermutedCommunicator) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  MPI_Comm reversed = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, 0, world_size() - 1 - world_rank(), &reversed);
  {
    const vpce::Communicator rev(reversed);
    const auto part = vpce::VocabPartition::even(27, rev);
    expect_error_on_all_ranks([&] { typename TestFixture::cross_entropy ce(this->comm, part); },
                              "the partition was made for rank " + std::to_string(world_size() - 1));
  }
  MPI_Comm_free(&reversed);
  typename TestFixture::cross_entropy ce(this->comm, this->part);
  expect_in_step<TypeParam>(ce);
}

}  // namespace
