#pragma once
/// \file row_stats.hpp
/// \brief The per-row record that travels in the collective, and its merge.

#include <Kokkos_Core.hpp>
#include <cmath>
#include <type_traits>

#include "vpce/impl/math.hpp"

namespace vpce::impl {

/// Per-row partial statistics of one rank, and after the collective the merged ones:
/// m = max logit, s = sum exp(x - m), t = the target's logit (0 where the target is not local), a = the
/// sum of the logits (only computed with label smoothing, else 0).
/// A row with a NaN or +inf logit is marked by s = NaN (and m = 0, so the merge stays defined).
template <class T>
struct RowStats {
  T m, s, t, a;
};

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
/// contributes 0 without evaluating exp(-inf - -inf). Symmetric in its arguments bit for bit.
template <class T>
KOKKOS_INLINE_FUNCTION RowStats<T> merge(const RowStats<T>& a, const RowStats<T>& b) {
  const bool a_big = a.m > b.m || (a.m == b.m && a.s >= b.s);
  const RowStats<T>& hi = a_big ? a : b;
  const RowStats<T>& lo = a_big ? b : a;
  RowStats<T> r;
  r.m = hi.m;
  r.s = hi.s + (lo.m == neg_inf<T>() ? T(0) * lo.s : lo.s * fast_exp(lo.m - hi.m));
  r.t = a.t + b.t;
  r.a = a.a + b.a;
  return r;
}

}  // namespace vpce::impl
