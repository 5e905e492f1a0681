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
/// sum of the logits (only computed with label smoothing, else 0; with class weights sum w_j x_j), h =
/// sum exp(x - m) (x - m) (only with the entropy, else 0: the entropy of the row is log(s) - h / s).
/// With probability targets q: t = sum_j w_j q_j x_j (w_j = 1 without class weights), q = sum_j q_j (-inf if
/// some q_j < 0), wq = sum_j w_j q_j.
/// A row with a NaN or +inf logit is marked by s = NaN (and m = 0, so the merge stays defined).
template <class T>
struct RowStats {
  T m, s, t, a, h, q, wq;
};

/// Which values a record carries in the collective: (m, s, t, a) always; (q, wq) with probability targets;
/// h with the entropy. Fixed per CrossEntropy (its options).
struct RecordLayout {
  bool probs = false;
  bool entropy = false;
  KOKKOS_INLINE_FUNCTION constexpr int width() const { return 4 + (probs ? 2 : 0) + (entropy ? 1 : 0); }
  KOKKOS_INLINE_FUNCTION constexpr int h() const { return probs ? 6 : 4; }  ///< where h is (with the entropy)
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

/// The (m, s, h) part of merge() below: the larger max wins, the other partial's s and h are moved to it.
/// A is the sums' type (T, or double for a device thread's running totals). Values are selected, never
/// references: on a GPU a reference chosen between two objects puts both in local memory (in the per-element
/// add of the device's statistics that was 14 local stores per element: 0.28 of an H200's 4.2 TB/s).
template <class T, class A>
KOKKOS_INLINE_FUNCTION void merge_msh(T am, A as, A ah, T bm, A bs, A bh, T& m, A& s, A& h) {
  const bool a_big = am > bm || (am == bm && as >= bs);
  const T hm = a_big ? am : bm, lm = a_big ? bm : am;
  const A hs = a_big ? as : bs, ls = a_big ? bs : as;
  const A hh = a_big ? ah : bh, lh = a_big ? bh : ah;
  m = hm;
  if (lm == neg_inf<T>()) {
    s = hs + A(0) * ls;
    h = hh + A(0) * lh;
  } else {
    const T d = lm - hm;
    const A e = A(fast_exp_no_overflow<ExpAccuracy::full, Isa::build>(d));
    s = hs + ls * e;
    h = hh + (lh + A(d) * ls) * e;
  }
}

/// The associative, commutative merge of two partials (docs/design.md, section 1). A partial whose m is -inf
/// contributes 0 without evaluating exp(-inf - -inf). Symmetric in its arguments bit for bit. h is moved to
/// the larger max as s is: sum e^(x - hi.m) (x - hi.m) = e^d (lo.h + d lo.s), d = lo.m - hi.m.
template <class T>
KOKKOS_INLINE_FUNCTION RowStats<T> merge(const RowStats<T>& a, const RowStats<T>& b) {
  RowStats<T> r;
  merge_msh(a.m, a.s, a.h, b.m, b.s, b.h, r.m, r.s, r.h);
  r.t = a.t + b.t;
  r.a = a.a + b.a;
  r.q = a.q + b.q;
  r.wq = a.wq + b.wq;
  return r;
}

/// Records stored flat, layout.width() values each: what the statistics kernels write, the collective merges
/// and Finalize reads. load() gives 0 for the values the layout does not carry.
template <class T, class MemSpace>
struct Records {
  using value_type = std::remove_const_t<T>;
  Kokkos::View<T*, MemSpace> data;
  RecordLayout layout;
  KOKKOS_INLINE_FUNCTION RowStats<value_type> load(std::int64_t i) const {
    const T* p = data.data() + i * layout.width();
    RowStats<value_type> r{p[0], p[1], p[2], p[3], value_type(0), value_type(0), value_type(0)};
    if (layout.entropy) r.h = p[layout.h()];
    if (layout.probs) {
      r.q = p[4];
      r.wq = p[5];
    }
    return r;
  }
  /// The same records, read-only (not for records that already are: nvcc warns of a conversion to itself).
  template <class U = T, class = std::enable_if_t<!std::is_const_v<U>>>
  operator Records<const U, MemSpace>() const {  // NOLINT(google-explicit-constructor)
    return {data, layout};
  }
  KOKKOS_INLINE_FUNCTION void store(std::int64_t i, const RowStats<T>& r) const {
    T* p = data.data() + i * layout.width();
    p[0] = r.m;
    p[1] = r.s;
    p[2] = r.t;
    p[3] = r.a;
    if (layout.entropy) p[layout.h()] = r.h;
    if (layout.probs) {
      p[4] = r.q;
      p[5] = r.wq;
    }
  }
};

}  // namespace vpce::impl
