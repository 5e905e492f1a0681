#pragma once
/// \file partition.hpp
/// \brief How the global vocabulary is split into contiguous column ranges, one per rank.

#include <cstdint>
#include <vector>

#include "vpce/communicator.hpp"

namespace vpce {

/// Rank r owns the global columns [begin(r), end(r)); sizes may differ and may be 0. The same object
/// (same sizes) must be built on every rank; the constructors that take a communicator check that.
class VocabPartition {
 public:
  /// Even split of V columns: the first V % W ranks get one column more.
  static VocabPartition even(std::int64_t vocab_size, const Communicator& comm);
  /// Each rank gives its own width; collective (one all-gather).
  static VocabPartition from_local_size(std::int64_t local_size, const Communicator& comm);
  /// Explicit sizes, one per rank, identical on every rank; checks the count, the signs, and (collective)
  /// that every rank passed the same sizes; with vocab_size >= 0 also that they add up to it.
  static VocabPartition from_sizes(const std::vector<std::int64_t>& sizes, const Communicator& comm,
                                   std::int64_t vocab_size = -1);

  std::int64_t vocab_size() const noexcept { return m_offsets.back(); }
  int num_ranks() const noexcept { return static_cast<int>(m_offsets.size()) - 1; }
  /// This rank's range.
  std::int64_t begin() const noexcept { return m_offsets[m_rank]; }
  std::int64_t end() const noexcept { return m_offsets[m_rank + 1]; }
  std::int64_t local_size() const noexcept { return end() - begin(); }
  /// Any rank's range.
  std::int64_t begin(int rank) const { return m_offsets.at(rank); }
  std::int64_t end(int rank) const { return m_offsets.at(rank + 1); }
  std::int64_t local_size(int rank) const { return end(rank) - begin(rank); }
  /// The widest range over all ranks, max_r local_size(r) (no communication: every rank holds every range).
  /// E.g. the column count a buffer must hold to serve any rank, or the rank whose share sets how many
  /// collective transfers every rank makes.
  std::int64_t max_local_size() const noexcept;
  int rank() const noexcept { return m_rank; }
  std::vector<std::int64_t> sizes() const;

 private:
  VocabPartition(std::vector<std::int64_t> offsets, int rank) : m_offsets(std::move(offsets)), m_rank(rank) {}
  std::vector<std::int64_t> m_offsets;  // W + 1 prefix sums
  int m_rank = 0;
};

}  // namespace vpce
