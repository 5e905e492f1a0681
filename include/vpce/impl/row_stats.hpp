#pragma once
/// \file row_stats.hpp
/// \brief The per-row record that travels in the collective, and its merge.

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "vpce/impl/math.hpp"

namespace vpce::impl {

/// Per-row partial statistics of one rank, and after the collective the merged ones:
/// m = max logit, s = sum exp(x - m), t = the target's logit (0 where the target is not local), a = the
/// sum of the logits (only computed with label smoothing, else 0), h = sum exp(x - m) (x - m) (only with
/// the entropy, else 0: the entropy of the row is log(s) - h / s).
/// A row with a NaN or +inf logit is marked by s = NaN (and m = 0, so the merge stays defined).
template <class T>
struct RowStats {
  T m, s, t, a, h;
};

/// Values per record in the collective: (m, s, t, a), and h only when the entropy is asked for.
inline constexpr int record_width(bool entropy) { return entropy ? 5 : 4; }

template <class T>
KOKKOS_INLINE_FUNCTION T neg_inf() {
  // HUGE_VAL(F) are constant expressions on the host and on devices (numeric_limits is host-only in CUDA).
  if constexpr (std::is_same_v<T, float>) {
    return -HUGE_VALF;
  } else {
    return -HUGE_VAL;
  }
}

/// The associative, commutative merge of two partials (docs/design.md, section 1). A partial whose m is -inf
/// contributes 0 without evaluating exp(-inf - -inf). Symmetric in its arguments bit for bit. h is moved to
/// the larger max as s is: sum e^(x - hi.m) (x - hi.m) = e^d (lo.h + d lo.s), d = lo.m - hi.m.
template <class T>
KOKKOS_INLINE_FUNCTION RowStats<T> merge(const RowStats<T>& a, const RowStats<T>& b) {
  const bool a_big = a.m > b.m || (a.m == b.m && a.s >= b.s);
  const RowStats<T>& hi = a_big ? a : b;
  const RowStats<T>& lo = a_big ? b : a;
  RowStats<T> r;
  r.m = hi.m;
  if (lo.m == neg_inf<T>()) {
    r.s = hi.s + T(0) * lo.s;
    r.h = hi.h + T(0) * lo.h;
  } else {
    const T d = lo.m - hi.m, e = fast_exp(d);
    r.s = hi.s + lo.s * e;
    r.h = hi.h + (lo.h + d * lo.s) * e;
  }
  r.t = a.t + b.t;
  r.a = a.a + b.a;
  return r;
}

/// Records stored flat, `width` values each (record_width): what the statistics kernels write, the
/// collective merges and Finalize reads. load() gives h = 0 where the record has no h.
template <class T, class MemSpace>
struct Records {
  Kokkos::View<T*, MemSpace> data;
  int width = 4;
  KOKKOS_INLINE_FUNCTION RowStats<std::remove_const_t<T>> load(std::int64_t i) const {
    const T* p = data.data() + i * width;
    return {p[0], p[1], p[2], p[3], width > 4 ? p[4] : std::remove_const_t<T>(0)};
  }
  /// The same records, read-only.
  operator Records<const T, MemSpace>() const { return {data, width}; }  // NOLINT(google-explicit-constructor)
  KOKKOS_INLINE_FUNCTION void store(std::int64_t i, const RowStats<T>& r) const {
    T* p = data.data() + i * width;
    p[0] = r.m;
    p[1] = r.s;
    p[2] = r.t;
    p[3] = r.a;
    if (width > 4) p[4] = r.h;
  }
};

}  // namespace vpce::impl
