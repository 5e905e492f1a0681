// Bad input gets a vpce::Error on EVERY rank, with the same message everywhere (docs/design.md, section 6), never a
// hang; after each error a normal call shows that the ranks are still in step. The checks' outcome travels
// inside the call's first collective: the MPI calls of every call are counted here (PMPI wrappers below) and
// must be exactly the collectives of the strategy; after an input error no output has been touched.

#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <string>
#include <vector>

#include "test_utils.hpp"
#include "vpce/impl/fused_strategy.hpp"  // fused_chains, loss_block_factor

// ---------------------------------------------------------------------------------------------------------
// Counting MPI calls: this executable defines the MPI functions a library could communicate with, counts
// each call and forwards it to the PMPI entry point (the MPI profiling interface). The library's calls
// resolve to these (it is linked into this executable), so do the tests' own.

namespace vpce_test {
std::atomic<long> g_mpi_calls{0};
}  // namespace vpce_test

#define VPCE_COUNT_CALL ++vpce_test::g_mpi_calls
extern "C" {
int MPI_Allreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  VPCE_COUNT_CALL;
  return PMPI_Allreduce(s, r, n, t, op, c);
}
int MPI_Iallreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request* q) {
  VPCE_COUNT_CALL;
  return PMPI_Iallreduce(s, r, n, t, op, c, q);
}
int MPI_Reduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c) {
  VPCE_COUNT_CALL;
  return PMPI_Reduce(s, r, n, t, op, root, c);
}
int MPI_Bcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  VPCE_COUNT_CALL;
  return PMPI_Bcast(b, n, t, root, c);
}
int MPI_Allgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt, MPI_Comm c) {
  VPCE_COUNT_CALL;
  return PMPI_Allgather(s, sn, st, r, rn, rt, c);
}
int MPI_Allgatherv(const void* s, int sn, MPI_Datatype st, void* r, const int* rn, const int* d, MPI_Datatype rt,
                   MPI_Comm c) {
  VPCE_COUNT_CALL;
  return PMPI_Allgatherv(s, sn, st, r, rn, d, rt, c);
}
int MPI_Gather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt, int root, MPI_Comm c) {
  VPCE_COUNT_CALL;
  return PMPI_Gather(s, sn, st, r, rn, rt, root, c);
}
int MPI_Alltoall(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt, MPI_Comm c) {
  VPCE_COUNT_CALL;
  return PMPI_Alltoall(s, sn, st, r, rn, rt, c);
}
int MPI_Barrier(MPI_Comm c) {
  VPCE_COUNT_CALL;
  return PMPI_Barrier(c);
}
int MPI_Send(const void* b, int n, MPI_Datatype t, int dest, int tag, MPI_Comm c) {
  VPCE_COUNT_CALL;
  return PMPI_Send(b, n, t, dest, tag, c);
}
int MPI_Recv(void* b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Status* st) {
  VPCE_COUNT_CALL;
  return PMPI_Recv(b, n, t, src, tag, c, st);
}
int MPI_Isend(const void* b, int n, MPI_Datatype t, int dest, int tag, MPI_Comm c, MPI_Request* q) {
  VPCE_COUNT_CALL;
  return PMPI_Isend(b, n, t, dest, tag, c, q);
}
int MPI_Irecv(void* b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Request* q) {
  VPCE_COUNT_CALL;
  return PMPI_Irecv(b, n, t, src, tag, c, q);
}
int MPI_Sendrecv(const void* sb, int sn, MPI_Datatype st, int dest, int stag, void* rb, int rn, MPI_Datatype rt,
                 int src, int rtag, MPI_Comm c, MPI_Status* status) {
  VPCE_COUNT_CALL;
  return PMPI_Sendrecv(sb, sn, st, dest, stag, rb, rn, rt, src, rtag, c, status);
}
}  // extern "C"
#undef VPCE_COUNT_CALL

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

// Rank 0 asks for the loss only, the others for the loss and the gradient: the fused strategy's blocks
// depend on the call, so the ranks' collectives would differ; every rank throws at the first one.
TYPED_TEST(ErrorTest, CallDiffersBetweenRanks) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const auto& in = this->in;
  for (const auto& opt : this->variants()) {
    SCOPED_TRACE(describe(opt));
    typename TestFixture::cross_entropy ce(this->comm, this->part, opt);
    auto loss = poisoned_vector<TypeParam>(this->p.n);
    auto grad = poisoned_matrix<TypeParam>(this->p.n, this->part.local_size());
    expect_error_on_all_ranks(
        [&] {
          if (this->comm.rank() == 0) {
            ce.forward(in.x, in.y, loss);
          } else {
            ce.loss_and_grad(in.x, in.y, loss, grad, in.g);
          }
        },
        "the call (0: forward, 1: forward keeping a stash, 2: loss_and_grad) differs between ranks");
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

namespace {

/// MPI calls made by f() on this rank.
template <class F>
long mpi_calls(F&& f) {
  const long before = vpce_test::g_mpi_calls.load();
  f();
  return vpce_test::g_mpi_calls.load() - before;
}

/// The MPI calls an error-free call makes: fused, one all-reduce of records per block (record_reduction_calls()
/// each), the first block head_rows() rows (its all-reduce always there, also for N = 0); seed, MAX (a second one
/// beyond seed_head_rows rows), SUM of exp, SUM of the target logit, a SUM of the logit sums with label smoothing and
/// one of the entropy's sums with the entropy. The fused strategy's records carry the entropy: no call more. A call
/// that keeps no exps (`loss_only`: forward() in recompute mode) has loss_block_factor times larger blocks where their
/// size is chosen automatically. On one rank a host call that keeps its exps runs its rows after the head
/// chained, without collectives (fused_strategy.hpp, ChainedRows).
template <class Exec, class CE>
long expected_collectives(const CE& ce, std::int64_t n, bool loss_only) {
  if (ce.options().strategy == vpce::Strategy::seed) {
    const long sums = n == 0 ? 0 : (ce.options().label_smoothing > 0 ? 3 : 2) + (ce.options().entropy ? 1 : 0);
    return 1 + (n > 8192 ? 1 : 0) + sums;
  }
  if (!loss_only && vpce::impl::fused_chains(ce.communicator().size(), vpce::impl::is_host_space_v<Exec>, true))
    return record_reduction_calls();
  const std::int64_t rest = std::max<std::int64_t>(0, n - ce.head_rows());
  const std::int64_t block =
      ce.block_rows() * (loss_only && ce.options().block_rows == 0 ? vpce::impl::loss_block_factor : 1);
  return (1 + static_cast<long>((rest + block - 1) / block)) * record_reduction_calls();
}

template <class C>
class CollectiveCountTest : public ::testing::Test {};
TYPED_TEST_SUITE(CollectiveCountTest, AllConfigs, ConfigName);

// The counting wrappers see the calls at all (else every count below would be meaningless).
TYPED_TEST(CollectiveCountTest, WrappersCount) {
  EXPECT_EQ(mpi_calls([] { MPI_Barrier(MPI_COMM_WORLD); }), 1);
}

// Every error-free forward() / loss_and_grad() makes exactly the collectives of its strategy (no separate
// agreement on the input checks), backward() none; for several N (0, small, several blocks, beyond the seed's
// first MAX), block sizes and both strategies. The numbers of the calls are asserted, and printed once.
TYPED_TEST(CollectiveCountTest, ExactlyTheCollectivesOfTheStrategy) {
  using C = TypeParam;
  using scalar = typename C::scalar;
  const vpce::Communicator comm(MPI_COMM_WORLD);
  const auto part = vpce::VocabPartition::even(13, comm);
  for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
    for (std::int64_t block_rows : {std::int64_t(0), std::int64_t(3)}) {
      for (double smoothing : {0.0, 0.1}) {
        vpce::Options opt;
        opt.strategy = strategy;
        opt.block_rows = block_rows;
        opt.label_smoothing = smoothing;
        opt.entropy = smoothing > 0;  // the entropy's statistic rides along
        opt.mode = vpce::Mode::recompute;
        typename C::cross_entropy ce(comm, part, opt);
        if (smoothing > 0) {  // class weights too: gathered here, once; the calls' collectives do not change
          Kokkos::View<typename C::cross_entropy::compute_type*, typename C::memory_space> w("w", part.local_size());
          Kokkos::deep_copy(w, 1);
          ce.set_class_weights(w);
        }
        for (std::int64_t n : {0, 2, 7, 8200}) {
          if (n == 8200 && (block_rows != 0 || smoothing > 0)) continue;  // one large case per strategy is enough
          SCOPED_TRACE(describe(opt) + ", smoothing " + std::to_string(smoothing) + ", N " + std::to_string(n));
          const Problem p = make_problem<scalar>(n, part.vocab_size(), 3);
          const auto in = make_local<C>(p, part);
          auto loss = poisoned_vector<C>(n);
          auto grad = poisoned_matrix<C>(n, part.local_size());
          const long want = expected_collectives<typename C::exec>(ce, n, /*loss_only=*/false);
          const long fused = mpi_calls([&] { ce.loss_and_grad(in.x, in.y, loss, grad, in.g); });
          const long fwd = mpi_calls([&] { ce.forward(in.x, in.y, loss); });
          const long bwd = mpi_calls([&] { ce.backward(in.g, grad); });
          EXPECT_EQ(fused, want) << "loss_and_grad";
          EXPECT_EQ(fwd, expected_collectives<typename C::exec>(ce, n, /*loss_only=*/true)) << "forward";
          EXPECT_EQ(bwd, 0) << "backward";
          if (n == 8200) {  // the results of the large case are right too (rows beyond the heads)
            const Reference ref = reference(p, opt);
            expect_allclose(to_host(loss), ref.loss, Tolerance<scalar>::loss, "N 8200: loss");
          }
          if (world_rank() == 0 && block_rows == 3 && smoothing == 0 && n == 7 && std::is_same_v<scalar, float>) {
            std::printf("[collectives] %s, N 7, block_rows 3 (head %lld): loss_and_grad %ld MPI calls\n",
                        vpce::to_string(strategy), static_cast<long long>(ce.head_rows()), fused);
          }
        }
      }
    }
  }
}

// On the error path the first collective is followed by the agreement on the message (a MAX of a few int64,
// then broadcasts of the text's length and of the text): three calls more, on every rank.
TYPED_TEST(CollectiveCountTest, ErrorPathAddsTheAgreement) {
  using C = TypeParam;
  const vpce::Communicator comm(MPI_COMM_WORLD);
  const auto part = vpce::VocabPartition::even(13, comm);
  const Problem p = make_problem<typename C::scalar>(7, part.vocab_size(), 3);
  auto in = make_local<C>(p, part);
  Kokkos::deep_copy(Kokkos::subview(in.y, 3), std::int64_t(13));  // out of range
  for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
    for (bool entropy : {false, true}) {  // records of 4 and of 5 values: the status rides in both
      vpce::Options opt;
      opt.strategy = strategy;
      opt.entropy = entropy;
      typename C::cross_entropy ce(comm, part, opt);
      auto loss = poisoned_vector<C>(p.n);
      std::string message;
      const long calls = mpi_calls([&] {
        try {
          ce.forward(in.x, in.y, loss);
        } catch (const vpce::Error& e) {
          message = e.what();
        }
      });
      const long first = strategy == vpce::Strategy::seed ? 1 : record_reduction_calls();
      EXPECT_EQ(calls, first + 3) << describe(opt) << ", entropy " << entropy;
      EXPECT_NE(message.find("target 13 of row 3"), std::string::npos) << message;
      expect_in_step<C>(ce);
    }
  }
}

/// Outputs filled with `value` (not NaN: an untouched output is told apart from a poisoned one).
template <class C>
Kokkos::View<typename C::scalar**, Kokkos::LayoutRight, typename C::memory_space> filled_matrix(std::int64_t n,
                                                                                                std::int64_t w,
                                                                                                double value) {
  Kokkos::View<typename C::scalar**, Kokkos::LayoutRight, typename C::memory_space> v("filled", n, w);
  Kokkos::deep_copy(v, typename C::scalar(value));
  return v;
}

/// EXPECTs every element of `got` equal to `want` (bit for bit; both host copies).
inline void expect_unchanged(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  int changed = 0;
  for (std::size_t k = 0; k < got.size() && k < want.size(); ++k) changed += !(got[k] == want[k]);
  EXPECT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(changed, 0) << "rank " << world_rank() << ": " << what << ": " << changed << " elements written";
}

template <class C>
class UntouchedOutputsTest : public ::testing::Test {};
TYPED_TEST_SUITE(UntouchedOutputsTest, AllConfigs, ConfigName);

// After an input error no output is touched on any rank: not the loss, not the gradient, not the logits of
// an in-place call, not even on the ranks whose own inputs were fine (which ran the first block's statistics
// before the ranks agreed). Cases: N differs (no rank can see it alone), the loss too long on rank 0 only, a
// target out of range; fused (blocks of 3 rows and automatic) and seed, both memory modes.
TYPED_TEST(UntouchedOutputsTest, InputErrorsLeaveOutputsUntouched) {
  using C = TypeParam;
  using scalar = typename C::scalar;
  const vpce::Communicator comm(MPI_COMM_WORLD);
  const auto part = vpce::VocabPartition::even(29, comm);
  const std::int64_t w = part.local_size();
  const int rank = comm.rank();
  struct Case {
    const char* name;
    std::int64_t n;        // this rank's N
    std::int64_t loss_n;   // this rank's loss length
    std::int64_t bad_row;  // row whose target is out of range, or -1
    const char* needle;
  };
  const bool several = comm.size() > 1;
  std::vector<Case> cases = {
      {"loss too long on rank 0", 8, rank == 0 ? 9 : 8, -1, "the loss has 9 entries, expected 8"},
      {"target out of range", 8, 8, 5, "target 29 of row 5 is outside [0, 29)"}};
  if (several) cases.push_back({"N differs", rank == 1 ? 9 : 8, rank == 1 ? 9 : 8, -1, "N differs between ranks"});
  for (const auto& c : cases) {
    Problem p = make_problem<scalar>(c.n, part.vocab_size(), 7);
    if (c.bad_row >= 0) p.y[c.bad_row] = part.vocab_size();
    const auto in = make_local<C>(p, part);
    for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
      for (std::int64_t block_rows : {std::int64_t(0), std::int64_t(3)}) {
        for (auto mode : {vpce::Mode::recompute, vpce::Mode::stash_softmax}) {
          vpce::Options opt;
          opt.strategy = strategy;
          opt.block_rows = block_rows;
          opt.mode = mode;
          SCOPED_TRACE(std::string(c.name) + ", " + describe(opt));
          typename C::cross_entropy ce(comm, part, opt);
          typename C::cross_entropy::loss_view loss_v("loss", c.loss_n);
          Kokkos::deep_copy(loss_v, scalar(2.5));
          auto grad = filled_matrix<C>(c.n, w, 3.5);
          auto logits = filled_matrix<C>(c.n, w, 0);  // in place: the logits in the gradient's buffer
          Kokkos::deep_copy(logits, in.x);
          const auto loss0 = to_host(loss_v), grad0 = to_host(grad), logits0 = to_host(logits);
          expect_error_on_all_ranks([&] { ce.loss_and_grad(in.x, in.y, loss_v, grad, in.g); }, c.needle);
          expect_unchanged(to_host(loss_v), loss0, "loss after loss_and_grad");
          expect_unchanged(to_host(grad), grad0, "gradient after loss_and_grad");
          expect_error_on_all_ranks([&] { ce.loss_and_grad(logits, in.y, loss_v, logits, scalar(0.5)); }, c.needle);
          expect_unchanged(to_host(logits), logits0, "logits after an in-place loss_and_grad");
          expect_error_on_all_ranks([&] { ce.forward(in.x, in.y, loss_v); }, c.needle);
          expect_unchanged(to_host(loss_v), loss0, "loss after forward");
          EXPECT_EQ(ce.lse().extent(0), 0u) << "lse() after a failed call";
          expect_in_step<C>(ce);
        }
      }
    }
  }
}

// N differs between ranks on either side of the first block (the head): 0 against some, fewer than the head
// rows against more, and around the seed strategy's first MAX (8192 rows). The first collective has the same
// size on every rank whatever N is, so no rank hangs: every rank throws.
TYPED_TEST(ErrorTest, TokenCountDiffersAroundTheFirstBlock) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  using C = TypeParam;
  using scalar = typename C::scalar;
  const bool me = this->comm.rank() == world_size() - 1;
  struct Case {
    vpce::Strategy strategy;
    std::int64_t block_rows, n_others, n_last;
  };
  const Case cases[] = {{vpce::Strategy::fused, 3, 5, 0},     {vpce::Strategy::fused, 3, 2, 11},
                        {vpce::Strategy::fused, 0, 7, 8},     {vpce::Strategy::fused, 3, 11, 12},
                        {vpce::Strategy::seed, 0, 0, 4},      {vpce::Strategy::seed, 0, 100, 8300},
                        {vpce::Strategy::seed, 0, 8200, 8300}};
  for (const auto& c : cases) {
    vpce::Options opt;
    opt.strategy = c.strategy;
    opt.block_rows = c.block_rows;
    SCOPED_TRACE(describe(opt) + ", N " + std::to_string(c.n_others) + " and " + std::to_string(c.n_last));
    const std::int64_t n = me ? c.n_last : c.n_others;
    const Problem p = make_problem<scalar>(n, this->part.vocab_size(), 5);
    const auto in = make_local<C>(p, this->part);
    typename C::cross_entropy ce(this->comm, this->part, opt);
    auto loss = poisoned_vector<C>(n);
    auto grad = poisoned_matrix<C>(n, this->part.local_size());
    expect_error_on_all_ranks([&] { ce.loss_and_grad(in.x, in.y, loss, grad, in.g); },
                              "the number of tokens N differs between ranks");
    expect_in_step<C>(ce);
  }
}

// The logits' type differs between ranks (double on rank 0, float elsewhere): the constructors, which agree
// on the scalar size, throw on every rank.
TYPED_TEST(ErrorTest, LogitsTypeDiffersBetweenRanks) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  using E = typename TypeParam::exec;
  expect_error_on_all_ranks(
      [&] {
        if (this->comm.rank() == 0) {
          vpce::CrossEntropy<double, E> ce(this->comm, this->part);
        } else {
          vpce::CrossEntropy<float, E> ce(this->comm, this->part);
        }
      },
      "the logits' scalar size in bytes differs between ranks");
  typename TestFixture::cross_entropy ce(this->comm, this->part);
  expect_in_step<TypeParam>(ce);
}

}  // namespace
