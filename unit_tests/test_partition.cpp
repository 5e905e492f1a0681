// vpce::VocabPartition: the even split (V not divisible by the number of ranks, V < W), per-rank widths,
// explicit sizes with zero-width ranks, and the errors of each factory (thrown on every rank).

#include <gtest/gtest.h>

#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "test_utils.hpp"

namespace {

using namespace vpce_test;

/// Checks a partition against the sizes it should have: offsets are the prefix sums, this rank's range.
void expect_partition(const vpce::VocabPartition& part, const std::vector<std::int64_t>& sizes, int rank,
                      const std::string& what) {
  SCOPED_TRACE(what);
  const std::int64_t v = std::accumulate(sizes.begin(), sizes.end(), std::int64_t(0));
  EXPECT_EQ(part.num_ranks(), int(sizes.size()));
  EXPECT_EQ(part.vocab_size(), v);
  EXPECT_EQ(part.rank(), rank);
  EXPECT_EQ(part.sizes(), sizes);
  std::int64_t begin = 0;
  for (int r = 0; r < int(sizes.size()); ++r) {
    EXPECT_EQ(part.begin(r), begin) << "rank " << r;
    EXPECT_EQ(part.local_size(r), sizes[r]) << "rank " << r;
    begin += sizes[r];
    EXPECT_EQ(part.end(r), begin) << "rank " << r;
  }
  EXPECT_EQ(part.begin(), part.begin(rank));
  EXPECT_EQ(part.end(), part.end(rank));
  EXPECT_EQ(part.local_size(), sizes[rank]);
}

class PartitionTest : public ::testing::Test {
 protected:
  vpce::Communicator comm{MPI_COMM_WORLD};
  int w = comm.size();
  int r = comm.rank();

  /// After an error: a valid collective factory call still works on every rank.
  void expect_in_step() {
    const auto part = vpce::VocabPartition::from_local_size(r + 1, comm);
    EXPECT_EQ(part.vocab_size(), std::int64_t(w) * (w + 1) / 2);
    EXPECT_EQ(part.begin(), std::int64_t(r) * (r + 1) / 2);
  }
};

// even(V): the first V % W ranks get one column more; V below, equal to, and not a multiple of W.
TEST_F(PartitionTest, EvenSplit) {
  for (std::int64_t v : {std::int64_t(1), std::int64_t(w) - 1, std::int64_t(w), std::int64_t(w) + 1, std::int64_t(97),
                         std::int64_t(100), std::int64_t(16) * w}) {
    if (v < 1) continue;
    std::vector<std::int64_t> sizes(w);
    for (int k = 0; k < w; ++k) sizes[k] = v / w + (k < v % w ? 1 : 0);
    expect_partition(vpce::VocabPartition::even(v, comm), sizes, r, "even(" + std::to_string(v) + ")");
  }
  // Spelled out for 97 columns, so that the formula above is not the only check.
  const std::vector<std::vector<std::int64_t>> expected{{97}, {49, 48}, {33, 32, 32}, {25, 24, 24, 24}};
  if (w <= 4) expect_partition(vpce::VocabPartition::even(97, comm), expected[w - 1], r, "even(97), spelled out");
}

// from_local_size: each rank its own width, zero widths included.
TEST_F(PartitionTest, FromLocalSize) {
  std::vector<std::int64_t> sizes(w);
  for (int k = 0; k < w; ++k) sizes[k] = (k % 2 == 1) ? 0 : 3 + 4 * k;
  expect_partition(vpce::VocabPartition::from_local_size(sizes[r], comm), sizes, r, "from_local_size");
}

// from_sizes: explicit sizes with zeros, with and without the vocabulary size to check against.
TEST_F(PartitionTest, FromSizes) {
  std::vector<std::int64_t> sizes(w, 0);
  sizes[w - 1] = 12;
  if (w > 2) sizes[1] = 5;
  const std::int64_t v = std::accumulate(sizes.begin(), sizes.end(), std::int64_t(0));
  expect_partition(vpce::VocabPartition::from_sizes(sizes, comm), sizes, r, "from_sizes");
  expect_partition(vpce::VocabPartition::from_sizes(sizes, comm, v), sizes, r, "from_sizes with V");
}

TEST_F(PartitionTest, FromSizesNotAddingUpToTheVocabularySize) {
  const std::vector<std::int64_t> sizes(w, 6);
  expect_error_on_all_ranks([&] { vpce::VocabPartition::from_sizes(sizes, comm, 6 * w + 1); },
                            "the partition sizes add up to " + std::to_string(6 * w) + ", not to the vocabulary size " +
                                std::to_string(6 * w + 1));
  expect_in_step();
}

TEST_F(PartitionTest, FromSizesDifferingBetweenRanks) {
  if (w < 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<std::int64_t> sizes(w, 6);
  if (r == 1) sizes[0] = 7;
  expect_error_on_all_ranks([&] { vpce::VocabPartition::from_sizes(sizes, comm); },
                            "the partition (a checksum of its sizes) differs between ranks");
  expect_in_step();
}

TEST_F(PartitionTest, FromSizesWrongCountOnOneRank) {
  std::vector<std::int64_t> sizes(w, 6);
  if (r == w - 1) sizes.push_back(6);
  expect_error_on_all_ranks(
      [&] { vpce::VocabPartition::from_sizes(sizes, comm); },
      "the partition has " + std::to_string(w + 1) + " sizes for " + std::to_string(w) + " ranks");
  expect_in_step();
}

TEST_F(PartitionTest, FromSizesNegativeOrAllZero) {
  std::vector<std::int64_t> sizes(w, 6);
  sizes[0] = -3;
  expect_error_on_all_ranks([&] { vpce::VocabPartition::from_sizes(sizes, comm); },
                            "partition sizes must be >= 0, got -3");
  expect_in_step();
  expect_error_on_all_ranks([&] { vpce::VocabPartition::from_sizes(std::vector<std::int64_t>(w, 0), comm); },
                            "the vocabulary is empty");
  expect_in_step();
}

// Sizes whose sum overflows int64 (found by the tool's fuzzer: {2^63-1, 2^63-1, 25} wrapped around to 23).
TEST_F(PartitionTest, SizesAddingUpPastInt64) {
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  std::vector<std::int64_t> sizes(w, 1);
  sizes[0] = big;
  sizes[w - 1] = w > 1 ? big : 0;  // one rank: max + 0 fits; check the wrap with two ranks or more
  if (w > 1) {
    expect_error_on_all_ranks([&] { vpce::VocabPartition::from_sizes(sizes, comm); }, "more than 2^63 - 1");
    expect_error_on_all_ranks([&] { vpce::VocabPartition::from_local_size(r == 0 || r == w - 1 ? big : 1, comm); },
                              "more than 2^63 - 1");
  }
  expect_in_step();
}

TEST_F(PartitionTest, FromLocalSizeErrors) {
  expect_error_on_all_ranks([&] { vpce::VocabPartition::from_local_size(r == w - 1 ? -1 : 4, comm); },
                            "the local vocabulary size must be >= 0, got -1");
  expect_in_step();
  expect_error_on_all_ranks([&] { vpce::VocabPartition::from_local_size(0, comm); },
                            "the vocabulary is empty on every rank");
  expect_in_step();
}

TEST_F(PartitionTest, EvenErrors) {
  expect_error_on_all_ranks([&] { vpce::VocabPartition::even(0, comm); },
                            "the vocabulary size must be at least 1, got 0");
  expect_in_step();
  if (w > 1) {
    expect_error_on_all_ranks([&] { vpce::VocabPartition::even(r == 0 ? 51 : 50, comm); },
                              "the vocabulary size differs between ranks");
    expect_in_step();
  }
}

}  // namespace
