#pragma once
/// \file kernels.hpp
/// \brief The row kernels: local statistics, loss/lse, softmax stash and gradient. They know nothing of MPI.
///
/// Every kernel is written once, per row, against an "inner" policy: on the host a row is one thread's
/// vectorised loop (HostInner); on a device a row is a team with its threads across the vocabulary
/// (TeamInner), which keeps loads coalesced. Kernels take raw row pointers with the row stride so that
/// the inner loops are plain strided-1 loops the compiler can vectorise.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>

#include "vpce/impl/compat.hpp"
#include "vpce/impl/math.hpp"
#include "vpce/impl/row_stats.hpp"

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__SYCL_DEVICE_ONLY__)
#define VPCE_SIMD_REDUCE(op, var)
#define VPCE_SIMD
#else
#define VPCE_PRAGMA(x) _Pragma(#x)
#define VPCE_SIMD_REDUCE(op, var) VPCE_PRAGMA(omp simd reduction(op : var))
#define VPCE_SIMD VPCE_PRAGMA(omp simd)
#endif

namespace vpce::impl {

// ---------------------------------------------------------------------------------------------------------
// Inner policies

struct HostInner {
  template <class T, class F>
  KOKKOS_FORCEINLINE_FUNCTION T max(std::int64_t n, const F& f) const {
    T m = neg_inf<T>();
    VPCE_SIMD_REDUCE(max, m)
    for (std::int64_t j = 0; j < n; ++j) {
      const T v = f(j);
      m = v > m ? v : m;  // std::max here ran 8x slower (no vectorisation)
    }
    return m;
  }
  template <class T, class F>
  KOKKOS_FORCEINLINE_FUNCTION T sum(std::int64_t n, const F& f) const {
    T s = 0;
    VPCE_SIMD_REDUCE(+, s)
    for (std::int64_t j = 0; j < n; ++j) s += f(j);
    return s;
  }
  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION void for_each(std::int64_t n, const F& f) const {
    VPCE_SIMD
    for (std::int64_t j = 0; j < n; ++j) f(j);
  }
  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION void single(const F& f) const {
    f();
  }
  KOKKOS_FORCEINLINE_FUNCTION void barrier() const {}
};

template <class Member>
struct TeamInner {
  const Member& member;
  template <class T, class F>
  KOKKOS_FORCEINLINE_FUNCTION T max(std::int64_t n, const F& f) const {
    T m = neg_inf<T>();
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(member, n),
        [&](std::int64_t j, T& l) {
          const T v = f(j);
          l = v > l ? v : l;
        },
        Kokkos::Max<T>(m));
    return m;
  }
  template <class T, class F>
  KOKKOS_FORCEINLINE_FUNCTION T sum(std::int64_t n, const F& f) const {
    T s = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(member, n), [&](std::int64_t j, T& l) { l += f(j); }, s);
    return s;
  }
  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION void for_each(std::int64_t n, const F& f) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, n), f);
  }
  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION void single(const F& f) const {
    Kokkos::single(Kokkos::PerTeam(member), f);
  }
  KOKKOS_FORCEINLINE_FUNCTION void barrier() const { member.team_barrier(); }
};

/// Runs `functor.row(inner, i)` for rows i in [row0, row1): a vectorised loop per row on the host, a team
/// per row on a device. `UseTeams` can force the device form on the host (tests use it).
template <class ExecSpace, class Functor>
struct RowDriver {
  Functor f;
  std::int64_t row0;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { f.row(HostInner{}, row0 + i); }
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& member) const {
    f.row(TeamInner<Member>{member}, row0 + member.league_rank());
  }
};

template <class ExecSpace, class Functor>
void for_rows(const char* label, const ExecSpace& exec, std::int64_t row0, std::int64_t row1, const Functor& f,
              bool use_teams) {
  if (row1 <= row0) return;
  RowDriver<ExecSpace, Functor> d{f, row0};
  if (use_teams) {
    Kokkos::parallel_for(label, Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(row1 - row0), Kokkos::AUTO), d);
  } else {
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, row1 - row0), d);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Row kernels. Rows are pointers + a row stride (ld); `begin` is the rank's first global column.

template <class T, class MemSpace>
struct KernelArgs {
  const T* x = nullptr;          ///< logits (or, for the stash backward, the softmax)
  std::int64_t ld_x = 0;
  std::int64_t n = 0;            ///< local vocabulary width
  std::int64_t begin = 0;
  Kokkos::View<const std::int64_t*, MemSpace> targets;
  KOKKOS_INLINE_FUNCTION std::int64_t local_target(std::int64_t i) const {
    const std::int64_t c = targets(i) - begin;
    return (c >= 0 && c < n) ? c : -1;
  }
};

/// Local (m, s, t) of each row: a max loop, then an exp loop over the same row (still in L1/L2). With
/// `y` set, the exp loop also stores e_j = exp(x_j - m) there (the stash or gradient rows, possibly the
/// logits' own buffer) and keeps m in `m_local`, so that Finalize only rescales: exp once per element.
template <class T, class MemSpace>
struct LocalStats {
  KernelArgs<T, MemSpace> a;
  Kokkos::View<RowStats<T>*, MemSpace> out;
  T* y = nullptr;
  std::int64_t ld_y = 0;
  Kokkos::View<T*, MemSpace> m_local;
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t i) const {
    const T* x = a.x + i * a.ld_x;
    const T m = in.template max<T>(a.n, [&](std::int64_t j) { return x[j]; });
    const std::int64_t c = a.local_target(i);
    const T t = c >= 0 ? x[c] : T(0);  // read before y (which may alias x) is written
    T s = 0;
    if (y == nullptr) {
      if (m != neg_inf<T>()) s = in.template sum<T>(a.n, [&](std::int64_t j) { return fast_exp(x[j] - m); });
    } else {
      T* yr = y + i * ld_y;
      in.barrier();
      if (m != neg_inf<T>()) {
        s = in.template sum<T>(a.n, [&](std::int64_t j) {
          const T e = fast_exp(x[j] - m);
          yr[j] = e;
          return e;
        });
      } else {
        in.for_each(a.n, [&](std::int64_t j) { yr[j] = T(0); });
      }
    }
    in.single([&]() {
      RowStats<T> r{m, s, t};
      if (!(s == s)) r.m = 0;  // NaN or +inf in the row: s is NaN; keep m finite for the merge
      out(i) = r;
      if (y != nullptr) m_local(i) = m;
    });
  }
};

/// The seed strategy's first pass: the local max only.
template <class T, class MemSpace>
struct LocalMax {
  KernelArgs<T, MemSpace> a;
  Kokkos::View<T**, Kokkos::LayoutLeft, MemSpace> out;  // N x 3: m, s, t
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t i) const {
    const T* x = a.x + i * a.ld_x;
    const T m = in.template max<T>(a.n, [&](std::int64_t j) { return x[j]; });
    in.single([&]() { out(i, 0) = m; });
  }
};

/// The seed strategy's second pass: sum of exp against the GLOBAL max, and the target logit.
template <class T, class MemSpace>
struct LocalSumGather {
  KernelArgs<T, MemSpace> a;
  Kokkos::View<T**, Kokkos::LayoutLeft, MemSpace> out;  // column 0 holds the global max
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t i) const {
    const T* x = a.x + i * a.ld_x;
    const T m = out(i, 0);
    T s = 0;
    if (m != neg_inf<T>()) s = in.template sum<T>(a.n, [&](std::int64_t j) { return fast_exp(x[j] - m); });
    const std::int64_t c = a.local_target(i);
    in.barrier();
    in.single([&]() {
      out(i, 1) = s;
      out(i, 2) = c >= 0 ? x[c] : T(0);
    });
  }
};

/// Per-row incoming gradient: a View (one value per row) or one scalar for all rows.
template <class T, class MemSpace>
struct GradScale {
  Kokkos::View<const T*, MemSpace> per_row;
  T value = 1;
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t i) const { return per_row.extent(0) ? per_row(i) : value; }
};

enum class Write { loss, stash, grad };

/// After the collective: loss and lse per row, and, by `What`, the softmax stash or the gradient
/// ((softmax - onehot) * g). With `FromExp` the rows already hold exp(x - m_local) (LocalStats stored
/// them) and are rescaled by exp(m_local - lse); otherwise they are computed from the logits.
template <class T, class MemSpace, Write What, bool FromExp>
struct Finalize {
  KernelArgs<T, MemSpace> a;
  Kokkos::View<const RowStats<T>*, MemSpace> stats;
  Kokkos::View<T*, MemSpace> loss, lse;
  T* y = nullptr;  ///< stash or gradient rows
  std::int64_t ld_y = 0;
  GradScale<T, MemSpace> g;
  Kokkos::View<const T*, MemSpace> m_local;
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t i) const {
    const RowStats<T> r = stats(i);
    const T l = r.m + kmath::log(r.s);
    if constexpr (What != Write::loss) {
      T* yr = y + i * ld_y;
      const T scale = What == Write::grad ? g(i) : T(1);
      if constexpr (FromExp) {
        const T f = fast_exp(m_local(i) - l) * scale;
        in.for_each(a.n, [&](std::int64_t j) { yr[j] *= f; });
      } else {
        const T* x = a.x + i * a.ld_x;
        in.for_each(a.n, [&](std::int64_t j) { yr[j] = fast_exp(x[j] - l) * scale; });
      }
      if constexpr (What == Write::grad) {
        const std::int64_t c = a.local_target(i);
        in.barrier();
        if (c >= 0) in.single([&]() { yr[c] -= scale; });
      }
    }
    in.single([&]() {
      lse(i) = l;
      loss(i) = l - r.t;
    });
  }
};

/// backward(): gradient rows from the caller's logits and lse (recompute) or from the stash.
template <class T, class MemSpace, bool FromStash>
struct Backward {
  KernelArgs<T, MemSpace> a;
  Kokkos::View<const T*, MemSpace> lse;
  T* y = nullptr;
  std::int64_t ld_y = 0;
  GradScale<T, MemSpace> g;
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t i) const {
    const T* x = a.x + i * a.ld_x;
    T* yr = y + i * ld_y;
    const T scale = g(i);
    if constexpr (FromStash) {
      in.for_each(a.n, [&](std::int64_t j) { yr[j] = x[j] * scale; });
    } else {
      const T l = lse(i);
      in.for_each(a.n, [&](std::int64_t j) { yr[j] = fast_exp(x[j] - l) * scale; });
    }
    const std::int64_t c = a.local_target(i);
    in.barrier();
    if (c >= 0) in.single([&]() { yr[c] -= scale; });
  }
};

}  // namespace vpce::impl
