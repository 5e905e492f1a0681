#pragma once
/// \file status.hpp
/// \brief The call-status protocol, in one file: how a rank's verdict on its inputs rides in a call's first
/// collective, and how a row's verdict on its logits rides in its record; how both are read back after the
/// merge. Everything here is read the same way on every rank, so every rank takes the same branch.
///
/// - The call status (CallStatus): whether this rank's inputs passed its local checks, and the values that
///   must be equal on every rank (N, a checksum of the targets, the call), as `status_size` values of the
///   compute type, each an integer of at most 21 bits (exact in float), combined across ranks by max:
///   [error, N in 3 chunks, -(N's chunks), the checksum in 3 chunks, -(its chunks), call, -call]. After the max, some
///   rank found an error or the ranks disagree exactly when status_needs_agreement() says so; every rank
///   then goes on to Communicator::agree, which builds the message (the error path only).
///   - Fused strategy: the values are `status_records` trailing RowStats records of the head block's
///     all-reduce, three values per record in (m, t, a) (h, where records have one, is 0), marked by s = -1
///     (a real record's sum of exps is >= 0 or NaN); merge_records() combines them field by field with max
///     (the MPI op calls it).
///   - Seed strategy: the values follow the row maxima of the first MAX all-reduce, padded with -inf to
///     `seed_head_rows` rows: its size never depends on N, so ranks that disagree on N still match.
/// - A row's verdict (after the merge, row_verdict()): a NaN or +inf logit marks the row's record with
///   s = NaN (and m = 0, so that the merge stays defined; mark_row()); a row of -inf only ends with m = -inf.
///   In the seed strategy a +inf logit makes the row max +inf (seed_row_max()), and the sum NaN.

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>

#include "vpce/half.hpp"
#include "vpce/impl/row_stats.hpp"

namespace vpce::impl {

struct CallStatus {
  bool error = false;         ///< this rank's inputs failed a local check
  std::int64_t n_rows = 0;    ///< N, >= 0
  std::int64_t checksum = 0;  ///< of the targets, >= 0
  /// Which call (a Write value: forward, forward keeping a stash, loss_and_grad): the fused strategy's blocks
  /// depend on it, so ranks making different calls would not make the same collectives.
  std::int64_t call = 0;
};

inline constexpr int status_size = 15;

template <class T>
void encode_status(const CallStatus& s, T* out) {
  constexpr std::int64_t mask = (std::int64_t(1) << 21) - 1;
  out[0] = s.error ? T(1) : T(0);
  for (int k = 0; k < 3; ++k) {
    const T n = T((s.n_rows >> (21 * k)) & mask), c = T((s.checksum >> (21 * k)) & mask);
    out[1 + k] = n;
    out[4 + k] = -n;
    out[7 + k] = c;
    out[10 + k] = -c;
  }
  out[13] = T(s.call);
  out[14] = -T(s.call);
}

/// On the merged values: true when some rank found an error or the ranks' N, checksums or calls differ.
template <class T>
bool status_needs_agreement(const T* merged) {
  if (merged[0] != T(0) || merged[13] != -merged[14]) return true;
  for (int k = 0; k < 3; ++k) {
    if (merged[1 + k] != -merged[4 + k] || merged[7 + k] != -merged[10 + k]) return true;
  }
  return false;
}

// --- the fused strategy: the status as trailing records -------------------------------------------------

inline constexpr int status_records = (status_size + 2) / 3;

/// The status records, flat (`width` values each, record_width()): (m, t, a) hold the values, s = -1.
template <class T>
void encode_status_records(const CallStatus& s, T* out, int width) {
  T v[3 * status_records] = {};
  encode_status(s, v);
  for (int r = 0; r < status_records; ++r) {
    T* p = out + r * width;
    for (int k = 0; k < width; ++k) p[k] = T(0);
    p[0] = v[3 * r];
    p[1] = T(-1);
    p[2] = v[3 * r + 1];
    p[3] = v[3 * r + 2];
  }
}

template <class T>
bool status_records_need_agreement(const T* merged, int width) {
  T v[3 * status_records];
  for (int r = 0; r < status_records; ++r) {
    const T* p = merged + r * width;
    v[3 * r] = p[0];
    v[3 * r + 1] = p[2];
    v[3 * r + 2] = p[3];
  }
  return status_needs_agreement(v);
}

/// What the MPI op does on n flat records of `layout`: inout[i] = in[i] merged with inout[i] -- merge() for
/// a row's records, the fieldwise max for the status records (s < 0).
template <class T>
void merge_records(const T* in, T* inout, int n, RecordLayout layout) {
  const int width = layout.width();
  const Records<const T, Kokkos::HostSpace> a{
      Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(in, std::size_t(n) * std::size_t(width)),
      layout};
  const Records<T, Kokkos::HostSpace> b{
      Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(inout, std::size_t(n) * std::size_t(width)), layout};
  for (int i = 0; i < n; ++i) {
    T* q = inout + std::int64_t(i) * width;
    if (q[1] < T(0)) {  // a status record
      const T* p = in + std::int64_t(i) * width;
      for (int k = 0; k < width; ++k) q[k] = p[k] > q[k] ? p[k] : q[k];
    } else {
      b.store(i, merge(a.load(i), b.load(i)));
    }
  }
}

// --- the seed strategy: the status after the padded row maxima -------------------------------------------

inline constexpr std::int64_t seed_head_rows = 8192;

// --- a row's verdict -------------------------------------------------------------------------------------

/// A row's record as the statistics kernels store it: s = NaN when the row holds NaN or +inf (zmax, the
/// max of the raw logits, is +inf even when the softcap makes x finite), and then m = 0.
template <class T>
KOKKOS_INLINE_FUNCTION RowStats<T> mark_row(T m, T s, T t, T a, T h, T zmax) {
  if (zmax == -neg_inf<T>()) s = zmax - zmax;
  RowStats<T> r{m, s, t, a, h, T(0), T(0)};
  if (!(s == s)) r.m = 0;
  return r;
}

/// The seed strategy's local row max: +inf when the raw max zmax is +inf (whatever the softcap makes of it),
/// else the transformed max.
template <class T>
KOKKOS_INLINE_FUNCTION T seed_row_max(T zmax, T x_max) {
  return zmax == -neg_inf<T>() ? zmax : x_max;
}
/// Whether a merged seed row max says the row holds +inf.
template <class T>
KOKKOS_INLINE_FUNCTION bool seed_max_is_marked(T m) {
  return m == -neg_inf<T>();
}

/// How far a row of probability targets may sum from 1, by their storage type S: 1e-4 for float and double,
/// 1e-2 for bfloat16 (8 significant bits), 2e-3 for float16. A row with a negative entry has q = -inf.
template <class S>
constexpr double probability_tolerance() {
  if constexpr (std::is_same_v<S, bfloat16>) {
    return 1e-2;
  } else if constexpr (std::is_same_v<S, float16>) {
    return 2e-3;
  } else {
    return 1e-4;
  }
}

enum class RowVerdict { ok, non_finite, all_neg_inf };

/// The verdict of a merged record (the same on every rank): NaN/+inf somewhere, every logit -inf, or fine.
template <class T>
RowVerdict row_verdict(const RowStats<T>& r) {
  if (std::isnan(r.s)) return RowVerdict::non_finite;
  if (r.m == neg_inf<T>()) return RowVerdict::all_neg_inf;
  return RowVerdict::ok;
}

}  // namespace vpce::impl
