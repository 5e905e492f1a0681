#include "vpce/partition.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "vpce/error.hpp"

namespace vpce {

namespace {
/// Offsets of sizes >= 0 (the same on every rank when called, so its error is too).
std::vector<std::int64_t> prefix(const std::vector<std::int64_t>& sizes) {
  std::vector<std::int64_t> offsets(sizes.size() + 1, 0);
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    VPCE_THROW_IF(sizes[r] > std::numeric_limits<std::int64_t>::max() - offsets[r],
                  "the partition sizes add up to more than 2^63 - 1");
    offsets[r + 1] = offsets[r] + sizes[r];
  }
  return offsets;
}
}  // namespace

VocabPartition VocabPartition::even(std::int64_t vocab_size, const Communicator& comm) {
  // Arguments are checked collectively so that a rank with a bad value cannot leave the others waiting.
  std::string err;
  if (vocab_size < 1) err = "the vocabulary size must be at least 1, got " + std::to_string(vocab_size);
  comm.agree_or_throw(err, {{"the vocabulary size", vocab_size}});
  const int w = comm.size();
  std::vector<std::int64_t> sizes(w, vocab_size / w);
  for (int r = 0; r < vocab_size % w; ++r) ++sizes[r];
  return VocabPartition(prefix(sizes), comm.rank());
}

VocabPartition VocabPartition::from_local_size(std::int64_t local_size, const Communicator& comm) {
  std::string err;
  if (local_size < 0) err = "the local vocabulary size must be >= 0, got " + std::to_string(local_size);
  comm.agree_or_throw(err);
  std::vector<std::int64_t> sizes(comm.size());
  std::int64_t* const all = sizes.data();  // typed as int64_t for clang-tidy's mpi-type-mismatch
  VPCE_MPI_CHECK(MPI_Allgather(&local_size, 1, MPI_INT64_T, all, 1, MPI_INT64_T, comm.comm()));
  auto offsets = prefix(sizes);
  VPCE_THROW_IF(offsets.back() < 1, "VocabPartition::from_local_size: the vocabulary is empty on every rank");
  return VocabPartition(std::move(offsets), comm.rank());
}

VocabPartition VocabPartition::from_sizes(const std::vector<std::int64_t>& sizes, const Communicator& comm,
                                          std::int64_t vocab_size) {
  std::string err;
  if (static_cast<int>(sizes.size()) != comm.size()) {
    err = "the partition has " + std::to_string(sizes.size()) + " sizes for " + std::to_string(comm.size()) + " ranks";
  } else {
    for (auto s : sizes)
      if (s < 0) err = "partition sizes must be >= 0, got " + std::to_string(s);
  }
  // Same sizes everywhere: compare a position-weighted checksum.
  std::uint64_t check = 0;
  for (auto s : sizes) check = check * 1000003u + static_cast<std::uint64_t>(s);
  comm.agree_or_throw(err, {{"the partition (a checksum of its sizes)", static_cast<std::int64_t>(check >> 1)}});
  auto offsets = prefix(sizes);
  VPCE_THROW_IF(offsets.back() < 1, "the partition sizes add up to 0: the vocabulary is empty");
  VPCE_THROW_IF(vocab_size >= 0 && offsets.back() != vocab_size,
                "the partition sizes add up to " + std::to_string(offsets.back()) + ", not to the vocabulary size " +
                    std::to_string(vocab_size));
  return VocabPartition(std::move(offsets), comm.rank());
}

std::int64_t VocabPartition::max_local_size() const noexcept {
  std::int64_t widest = 0;
  for (std::size_t r = 0; r + 1 < m_offsets.size(); ++r) widest = std::max(widest, m_offsets[r + 1] - m_offsets[r]);
  return widest;
}

std::vector<std::int64_t> VocabPartition::sizes() const {
  std::vector<std::int64_t> s(num_ranks());
  for (int r = 0; r < num_ranks(); ++r) s[r] = local_size(r);
  return s;
}

}  // namespace vpce
