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
#include <cstring>
#include <limits>

#include "vpce/half.hpp"
#include "vpce/impl/call.hpp"
#include "vpce/impl/compat.hpp"
#include "vpce/impl/math.hpp"
#include "vpce/impl/row_stats.hpp"
#include "vpce/impl/status.hpp"
#include "vpce/impl/stream.hpp"

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__SYCL_DEVICE_ONLY__)
#define VPCE_SIMD
#define VPCE_SIMD_LINE
#else
#define VPCE_PRAGMA(x) _Pragma(#x)
// VPCE_SIMD: a loop whose iterations touch memory independently, vectorised without a run-time overlap check:
// GCC's `omp simd`, Clang's own pragma. Inside an `omp simd` body Clang calls every function that is not noexcept
// through an `invoke` (no exception may leave an OpenMP region), and an invoke carries no llvm.access.group, so
// the loads and stores of the lambdas inlined into the loop lost the promise: Clang 19 checked at run time that
// the rows do not overlap, with a scalar copy of the loop for when they do (taken in place, where the gradient is
// the logits: 9.4x GCC's time) and the lane sums kept in memory. Its own pragma keeps them plain calls.
// VPCE_SIMD_LINE: the loop over one line's columns, formed by a lambda, inside a loop over lines (round_line,
// values). Clang unrolled it whole, then vectorised the loop over lines with gathers behind an overlap
// check (scalar in place again); `unroll(disable)` leaves it one vector. perf_tests/NOTES.md, issue 12,
// thirty-sixth round. Neither needs -fopenmp-simd.
#if defined(__clang__)
#define VPCE_SIMD VPCE_PRAGMA(clang loop vectorize(assume_safety))
#define VPCE_SIMD_LINE VPCE_PRAGMA(clang loop vectorize(assume_safety) unroll(disable))
#else
#define VPCE_SIMD VPCE_PRAGMA(omp simd)
#define VPCE_SIMD_LINE VPCE_PRAGMA(omp simd)
#endif
#endif
// On HostInner's functions that hold the vector loops: everything they call is inlined into them, whatever
// the compiler's size limits. GCC otherwise stops inlining into a large function ("large-function-growth
// limit reached"), and a lambda called per element then stays a call: the loop is scalar. That happened to
// the statistics of float16 logits under -march=native (20x slower) while the same code was vectorised for
// x86-64-v4: it depends on the TU and the tuning, so it is not left to the heuristics.
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && !defined(__HIPCC__) && \
    !defined(__SYCL_DEVICE_ONLY__)
#define VPCE_FLATTEN __attribute__((flatten))
#define VPCE_NOINLINE __attribute__((noinline))
#else
#define VPCE_FLATTEN
#define VPCE_NOINLINE
#endif

namespace vpce::impl {

// ---------------------------------------------------------------------------------------------------------
// Inner policies

/// x rounded to the storage type G, returned by value: an omp simd loop that stores G(x) straight into an array
/// was left scalar by GCC (the object constructed in the loop's body became a per-lane temporary array).
template <class G, class T>
KOKKOS_FORCEINLINE_FUNCTION G to_storage(T x) {
  return G(x);
}

/// x if x is NaN, else 0: summed over a slice whose max is -inf, it turns a hidden NaN into a NaN sum.
template <class T>
KOKKOS_FORCEINLINE_FUNCTION T nan_or_zero(T x) {
  return select(x != x, x, T(0));
}

/// Lanes of the host's one-pass statistics (HostInner::online_stats) for logits stored as S: a 64-byte line of
/// a 16-bit S (with 16 lanes GCC formed those loops in 256-bit vectors, the width of 16 loaded 16-bit values,
/// half of AVX-512's: 0.66 instead of 0.33 ns per element), else 16. The sums' bits depend on it, never on the
/// ISA.
template <class S>
inline constexpr int sum_lanes = sizeof(S) == 2 ? 32 : 16;

/// The exps per element of logits stored as S (math.hpp's ExpAccuracy): a 16-bit S takes the shorter
/// polynomial, whose error is far below what its 8 or 11 bits carry.
template <class S>
inline constexpr ExpAccuracy exp_accuracy = sizeof(S) == 2 ? ExpAccuracy::input16 : ExpAccuracy::full;

/// Columns per chunk of the host's one-pass statistics: 16 KiB of floats, so the chunk is still in L1 for
/// its exp loop. (512 columns measured slower: per-chunk reductions; a whole row no faster.)
inline constexpr std::int64_t chunk_cols = 4096;
KOKKOS_INLINE_FUNCTION std::int64_t num_chunks(std::int64_t n) { return (n + chunk_cols - 1) / chunk_cols; }

/// The statistics of a row or a slice of it: m = max x, s = sum exp(x - m) (an element of -inf adds
/// nothing, a NaN makes s NaN), zmax = the max of the raw logits (+inf is caught there even when the
/// softcap makes x finite), sx = the sum of x, h = sum exp(x - m) (x - m) (the entropy's term, only where
/// asked for). join() merges two (a device's threads across the team).
template <class T>
struct OnlineStats {
  T m, s, zmax, sx, h;
  KOKKOS_INLINE_FUNCTION void join(T m2, T s2, T zmax2, T sx2, T h2) {
    merge_msh(m, s, h, m2, s2, h2, m, s, h);
    zmax = zmax2 > zmax ? zmax2 : zmax;
    sx += sx2;
  }
};

/// K sums formed in one pass (HostInner::sums_max).
template <class T, int K>
struct Terms {
  T v[K];
};

/// What the host's statistics loops report as they read a row (HostInner::online_stats): pace(j) after each
/// piece of 32 x Lanes columns, j the columns of the row read so far (not always increasing: a chunk done
/// again reports again), so that the caller can do other work in step (the fused strategy writes another
/// row's gradient). NoPace: nothing.
struct NoPace {
  KOKKOS_FORCEINLINE_FUNCTION void operator()(std::int64_t) const {}
};
/// A pace of columns from j0 on: pace(j0 + j).
template <class P>
struct PaceFrom {
  const P& pace;
  std::int64_t j0;
  KOKKOS_FORCEINLINE_FUNCTION void operator()(std::int64_t j) const { pace(j0 + j); }
};

/// Whether a row's reader z (HostInner::online_stats) also reads two adjacent columns from one 32-bit load,
/// z.pair(j) giving columns j and j + 1 as {a, b} (Logits, for 16-bit logits on a little-endian host).
template <class Z, class = void>
struct reads_pairs : std::false_type {};
template <class Z>
struct reads_pairs<Z, std::void_t<decltype(Z::pairs)>> : std::bool_constant<Z::pairs> {};
template <class Z>
inline constexpr bool reads_pairs_v = reads_pairs<Z>::value;

/// A chunk of a row of 16-bit values read from the floats zs it was widened into (HostInner::widen; by the CPU's
/// own instructions where have_widen_hw: float16 with F16C): the logits z of HostInner::online, with z(j) and,
/// where z has them, pair(j) as z's, the same values (a signalling NaN quieted); also float16's target
/// probabilities and logits in row_probability_sums and Finalize::write_stored. 16 float16 values in software take ~10
/// integer operations per vector in every loop that reads them; here one vcvtph2ps, once per column.
template <bool Pairs>
struct Widened {
  static constexpr bool pairs = Pairs;
  struct Pair {
    float a, b;
  };
  const float* zs;
  KOKKOS_FORCEINLINE_FUNCTION float operator()(std::int64_t j) const { return zs[j]; }
  KOKKOS_FORCEINLINE_FUNCTION Pair pair(std::int64_t j) const { return {zs[j], zs[j + 1]}; }
};
/// Whether a chunk reader is a widened chunk's (Widened).
template <class ZC>
struct is_widened : std::false_type {};
template <bool Pairs>
struct is_widened<Widened<Pairs>> : std::true_type {};
template <class ZC>
inline constexpr bool is_widened_v = is_widened<ZC>::value;
/// Whether HostInner<L>::online widens a row reader z's chunks to float first (Widened).
template <class Z, Isa L>
struct widens : std::false_type {};
template <class Z, Isa L>
inline constexpr bool widens_v = widens<Z, L>::value;

/// Whether the terms f of HostInner::sums_max take their exps 16 columns at a time (ExpTerms::in_lanes).
template <class F, class = void>
struct exps_in_lanes : std::false_type {};
template <class F>
struct exps_in_lanes<F, std::void_t<decltype(F::in_lanes)>> : std::bool_constant<F::in_lanes> {};
template <class F>
inline constexpr bool exps_in_lanes_v = exps_in_lanes<F>::value;

/// A column's value that takes one exp: value(j, x_j, e) with x_j = x(j) and e = exp(x_j - shift) by the exp per
/// element at the inner policy's level L (exp_per_element<A, L>), for Inner::store. v(j) on every policy; where
/// exp_in_lanes<T, A, L> (in_lanes), HostInner's lines take their exps 16 columns at a time (HostInner::values),
/// with the same bits.
template <class T, ExpAccuracy A, Isa L, class X, class V>
struct ExpValue {
  static constexpr bool in_lanes = exp_in_lanes<T, A, L>;
  static constexpr ExpAccuracy accuracy = A;
  X x;
  T shift;
  V value;
  KOKKOS_FORCEINLINE_FUNCTION T operator()(std::int64_t j) const {
    const T xj = x(j);
    return value(j, xj, exp_per_element<A, L>(xj - shift));
  }
};

/// ExpValue for logits z of a type the CPU widens (have_widen_hw: float16 with F16C): x_j = transform(z_j),
/// value(j, x_j, exp(x_j - shift)); v(j) on every policy, and at(j, z_j) from z_j widened by HostInner's lines
/// 16 columns at a time (HostInner::values), the same bits. L: as ExpValue's.
template <class T, ExpAccuracy A, Isa L, class S, class Tr, class V>
struct WidenedExpValue {
  static constexpr bool widens = true;  // constructed where have_widen_hw<S, L> (L: the inner policy's)
  const S* z;
  Tr transform;
  T shift;
  V value;
  KOKKOS_FORCEINLINE_FUNCTION T at(std::int64_t j, T zj) const {
    const T xj = transform(zj);
    return value(j, xj, exp_per_element<A, L>(xj - shift));
  }
  KOKKOS_FORCEINLINE_FUNCTION T operator()(std::int64_t j) const { return at(j, T(z[j])); }
};
/// Whether a column's value v (Inner::store) takes its logits widened 16 at a time (WidenedExpValue::widens).
template <class F, class = void>
struct widens_values : std::false_type {};
template <class F>
struct widens_values<F, std::void_t<decltype(F::widens)>> : std::bool_constant<F::widens> {};
template <class F>
inline constexpr bool widens_values_v = widens_values<F>::value;

/// The columns of a row reader z from j0 on: z(j0 + j), and its pairs where z has them.
template <class Z>
struct ColumnsFrom {
  static constexpr bool pairs = reads_pairs_v<Z>;
  const Z& z;
  std::int64_t j0;
  KOKKOS_FORCEINLINE_FUNCTION auto operator()(std::int64_t j) const { return z(j0 + j); }
  KOKKOS_FORCEINLINE_FUNCTION auto pair(std::int64_t j) const { return z.pair(j0 + j); }
  /// z.widen32<L>(j0 + j, w), where z has it (Logits of bfloat16).
  template <Isa L, class W = Z>
  KOKKOS_FORCEINLINE_FUNCTION auto widen32(std::int64_t j, float* w) const
      -> decltype(std::declval<const W&>().template widen32<L>(j, w)) {
    return z.template widen32<L>(j0 + j, w);
  }
};

/// Whether the terms f of HostInner::sums_max read a row that widens 32 columns at a time (Logits::widen32).
template <class F, class = void>
struct widens32 : std::false_type {};
template <class F>
struct widens32<
    F, std::void_t<decltype(std::declval<const F&>().z.template widen32<Isa::build>(std::int64_t(0), (float*)nullptr))>>
    : std::true_type {};

/// Rows of a matrix a kernel writes or reads: row i at data + (i - row0) * ld.
template <class U>
struct RowPtr {
  U* data = nullptr;
  std::int64_t ld = 0;
  std::int64_t row0 = 0;
  KOKKOS_INLINE_FUNCTION U* row(std::int64_t i) const { return data + (i - row0) * ld; }
};

/// How a host kernel writes its output rows (Inner::store): plain stores, or formed in a buffer on the
/// stack and written with streaming stores (stream.hpp). A device always writes plain stores.
enum class Store { plain, streaming };

/// What the second of two sums in the exps' pass adds (HostInner::ExpTerms): the entropy's e (x - m), label
/// smoothing's x, or x times the class weight.
enum class Second { entropy, x, weighted_x };
/// What the second term needs besides the column: the chunk's class weights for Second::weighted_x, else
/// nothing (an empty member, so that the terms' object of the other forms is the size it was: with a pointer
/// in it, whatever the form, calls without label smoothing ran 1-4% slower in cache on a Zen 4).
template <Second S2, class T>
struct SecondTerm {};
template <class T>
struct SecondTerm<Second::weighted_x, T> {
  const T* w;
};

/// The host's policy: a row is one thread's vectorised loops, compiled for the instruction sets L (Isa,
/// stream.hpp): those of the build, or of a copy that RowDriver picks at run time.
template <Isa L>
struct HostInner {
  static constexpr Isa isa = L;
  /// The max of f(j) over [0, n), -inf for n = 0 or a row of -inf (NaN ignored), in 16 lanes (column j in
  /// lane j % 16). Not an `omp simd reduction(max)`: OpenMP leaves the start of a max reduction to the
  /// compiler, and Clang starts it at the lowest finite value, so a row of -inf came out -FLT_MAX and passed as
  /// a finite max (the error for such a row was never raised in Clang builds; perf_tests/NOTES.md, issue 12,
  /// thirty-fifth round). `v > m ? v : m`: std::max here ran 8x slower (no vectorisation).
  template <class T, class F>
  KOKKOS_FORCEINLINE_FUNCTION VPCE_FLATTEN T max(std::int64_t n, const F& f) const {
    T mx[16];
    for (std::int64_t l = 0; l < 16; ++l) mx[l] = neg_inf<T>();
    const std::int64_t whole = n - n % 16;
    for (std::int64_t j = 0; j < whole; j += 16) {
      VPCE_SIMD
      for (std::int64_t l = 0; l < 16; ++l) {
        const T v = f(j + l);
        mx[l] = v > mx[l] ? v : mx[l];
      }
    }
    VPCE_SIMD
    for (std::int64_t l = 0; l < n - whole; ++l) {
      const T v = f(whole + l);
      mx[l] = v > mx[l] ? v : mx[l];
    }
    T m = neg_inf<T>();
    for (std::int64_t l = 0; l < 16; ++l) m = mx[l] > m ? mx[l] : m;
    return m;
  }
  /// Sum in 16 lanes (column j in lane j % 16, whatever the vector width, so the bits do not depend on the
  /// ISA's; sums_max: in Lanes lanes): each lane adds 32 terms in T, then into a lane total in double; the
  /// lane totals are added in order at the end. A plain float sum over a 50k-column row with one dominant
  /// logit lost ~2e-4 nats (every small term rounded against ~1). The lanes are explicit so that the partials
  /// stay in vector registers: a `reduction(+)` per chunk ended each chunk with a serial horizontal sum. The
  /// row f reads from memory is prefetched `ahead` (none by default).
  template <class T, class F, Hint H = Hint::l2>
  KOKKOS_FORCEINLINE_FUNCTION T sum(std::int64_t n, const F& f, const Ahead<H>& ahead = {}) const {
    T unused;
    // f held by value (so are the callers' captures in online_chunk): by reference GCC left bfloat16's
    // weighted sum of x scalar (1.6x slower in cache; perf_tests/NOTES.md, issue 12, twenty-fifth round).
    return sums_max<T, 1>(
               n, [f](std::int64_t j) { return Terms<T, 1>{{f(j)}}; }, [](std::int64_t) { return neg_inf<T>(); },
               &unused, ahead)
        .v[0];
  }
  /// K sums at once, f(j) giving column j's K terms (Terms<T, K>), each summed as sum() does, and *max = the
  /// max of g(j), in one pass (g(j) read before f(j) runs: f may store over what g reads, online_stats over
  /// the logits); the row f reads from memory is prefetched `ahead` (stream.hpp), and pace(j) called after
  /// each piece of 32 x Lanes columns (NoPace). MaxApart (g's values formed from 16-bit logits' bits): the
  /// max taken after each step's loop, by max16_hw where the level has it, from the values kept in an array.
  /// Inside the loop GCC's AVX-512 code selected them in the integer domain (a compare, the conversion done
  /// again under its mask, two moves) where one vmaxps does (bfloat16 `loss_and_grad` -5%, its forward -13%
  /// in cache on a Zen 5: perf_tests/NOTES.md, issue 12, thirty-eighth round). Not for every g: where GCC
  /// vectorises a loop of 16 columns in 256-bit halves, a 512-bit read of the array waits for both halves'
  /// stores (bfloat16 probability targets 1.7x slower). The arrays are alignas(64): GCC raises such an array's
  /// alignment to its vectors' for its own aligned loads, and AddressSanitizer's fake stack frames
  /// (detect_stack_use_after_return) kept only the declared alignment: those loads faulted in the asan build.
  template <class T, int K, int Lanes = 16, bool MaxApart = false, class F, class G, Hint H = Hint::l2,
            class P = NoPace>
  KOKKOS_FORCEINLINE_FUNCTION VPCE_FLATTEN Terms<T, K> sums_max(std::int64_t n, const F& f, const G& g, T* max,
                                                                const Ahead<H>& ahead = {}, const P& pace = P{}) const {
    constexpr std::int64_t lanes = Lanes;
    return chunked_sums<T, K, lanes>(
        n, max, ahead, pace,
        [&](std::int64_t j, T(&part)[K][lanes], T(&mx)[lanes]) {
          if constexpr (exps_in_lanes_v<F>) {
            static_assert(lanes == 16, "16 exps at a time");
            T u[16], e[16];
            VPCE_SIMD
            for (std::int64_t l = 0; l < 16; ++l) {
              const T v = g(j + l);
              u[l] = f.arg(j + l);
              mx[l] = v > mx[l] ? v : mx[l];
            }
            exp_lanes16<F::accuracy, L>(u, e);
            VPCE_SIMD
            for (std::int64_t l = 0; l < 16; ++l) {
              const Terms<T, K> t = f.terms(j + l, u[l], e[l]);
              part[0][l] += t.v[0];
              if constexpr (K > 1) part[1][l] += t.v[1];
            }
          } else if constexpr (MaxApart && have_max16_hw<T, L> && lanes == 32 && have_widen32_hw<L> &&
                               widens32<F>::value) {
            // bfloat16 logits whose exps are stored (loss_and_grad, the stash), where L has AVX512BW and 512-bit
            // loops: the 32 columns widened by two vpermw (Logits::widen32) instead of GCC's extract, two
            // vpmovzxwd and two shifts, on the pipes the exps use; GCC keeps w in registers. The same values in
            // the same lanes: the same bits. bfloat16 `loss_and_grad` -6% with rows in L3 (AMD Zen 5;
            // perf_tests/NOTES.md, issue 12, forty-first round). The loop below with its values taken from w
            // instead of g: one loop for both changed GCC's code for the others (26 to 92 functions of the
            // float and bfloat16 objects of a native build).
            alignas(64) T w[32];
            f.z.template widen32<L>(j, w);
            VPCE_SIMD
            for (std::int64_t l = 0; l < 32; ++l) {
              const Terms<T, K> e = f.at(j + l, w[l]);
              part[0][l] += e.v[0];
              if constexpr (K > 1) part[1][l] += e.v[1];
            }
            max16_hw<L>(w, mx);
            max16_hw<L>(w + 16, mx + 16);
          } else {
            constexpr bool apart = MaxApart && have_max16_hw<T, L>;
            alignas(64) T vs[lanes];  // with `apart`: the values whose max max16_hw takes after the loop
            VPCE_SIMD
            for (std::int64_t l = 0; l < lanes; ++l) {
              const T v = g(j + l);
              const Terms<T, K> e = f(j + l);
              part[0][l] += e.v[0];  // no loop over k here: GCC does not vectorise the l loop around one
              if constexpr (K > 1) part[1][l] += e.v[1];
              if constexpr (apart) {
                vs[l] = v;
              } else {
                mx[l] = v > mx[l] ? v : mx[l];
              }
            }
            if constexpr (apart) {
              for (std::int64_t g16 = 0; g16 < lanes; g16 += 16) max16_hw<L>(vs + g16, mx + g16);
            }
          }
        },
        [&](std::int64_t j) { return g(j); }, [&](std::int64_t j, T) { return f(j); });
  }
  /// sums_max for a row reader z that reads pairs of columns (reads_pairs_v: 16-bit logits), K sums of
  /// f.at(j, z(j)) (column j's terms from its value, as ExpTerms) and *max = the max of z, in 32 lanes: the
  /// columns of each 32 read as 16 pairs, a pair's two columns split by a shift and a mask of one 32-bit lane
  /// and summed in lanes l and 16 + l. Widening 32 loaded 16-bit values to 32-bit lanes one by one took
  /// three shuffles (two vpmovzxwd, an extract), on the same ports as the exps' arithmetic (perf_tests/NOTES.md,
  /// issue 12, nineteenth round). The maxima after the loop by max16_hw where the level has it (sums_max's
  /// MaxApart). The last n % 32 columns a lane each, as sums_max's.
  template <class T, int K, class Z, class F, Hint H, class P>
  KOKKOS_FORCEINLINE_FUNCTION VPCE_FLATTEN Terms<T, K> sums_max_pairs(std::int64_t n, const Z& z, const F& f, T* max,
                                                                      const Ahead<H>& ahead, const P& pace) const {
    constexpr std::int64_t lanes = 32, half = lanes / 2;
    return chunked_sums<T, K, lanes>(
        n, max, ahead, pace,
        [&](std::int64_t j, T(&part)[K][lanes], T(&mx)[lanes]) {
          constexpr bool apart = have_max16_hw<T, L>;
          alignas(64) T va[half], vb[half];  // with `apart`: the pairs' values, their maxima after the loop
          VPCE_SIMD
          for (std::int64_t l = 0; l < half; ++l) {
            const auto v = z.pair(j + 2 * l);
            const Terms<T, K> a = f.at(j + 2 * l, v.a);
            const Terms<T, K> b = f.at(j + 2 * l + 1, v.b);
            part[0][l] += a.v[0];
            part[0][half + l] += b.v[0];
            if constexpr (K > 1) {
              part[1][l] += a.v[1];
              part[1][half + l] += b.v[1];
            }
            if constexpr (apart) {
              va[l] = v.a;
              vb[l] = v.b;
            } else {
              mx[l] = v.a > mx[l] ? v.a : mx[l];
              mx[half + l] = v.b > mx[half + l] ? v.b : mx[half + l];
            }
          }
          if constexpr (apart) {
            max16_hw<L>(va, mx);
            max16_hw<L>(vb, mx + half);
          }
        },
        [&](std::int64_t j) { return z(j); }, [&](std::int64_t j, T v) { return f.at(j, v); });
  }
  /// The skeleton of sums_max and sums_max_pairs: chunks of 32 x lanes columns, the row prefetched `ahead` and
  /// step(j, part, mx) adding the terms and maxima of columns [j, j + lanes) into the chunk's partial sums and
  /// the lanes' maxima, the partials added into lane totals in double after each chunk and pace told; the last
  /// n % lanes columns a lane each, value(j) read before terms(j, value(j)) runs (terms may store over what
  /// value reads).
  template <class T, int K, std::int64_t lanes, Hint H, class P, class Step, class Value, class TermsOf>
  KOKKOS_FORCEINLINE_FUNCTION static Terms<T, K> chunked_sums(std::int64_t n, T* max, const Ahead<H>& ahead,
                                                              const P& pace, const Step& step, const Value& value,
                                                              const TermsOf& terms) {
    static_assert(K == 1 || K == 2, "one or two sums");
    constexpr std::int64_t chunk = 32 * lanes;
    double total[K][lanes] = {};
    T mx[lanes];
    for (std::int64_t l = 0; l < lanes; ++l) mx[l] = neg_inf<T>();
    const std::int64_t whole = n - n % lanes;
    for (std::int64_t j0 = 0; j0 < whole; j0 += chunk) {
      const std::int64_t j1 = j0 + chunk < whole ? j0 + chunk : whole;
      T part[K][lanes] = {}, cmx[lanes];  // the chunk's maxima apart, so that GCC keeps them in registers
      for (std::int64_t l = 0; l < lanes; ++l) cmx[l] = neg_inf<T>();
      for (std::int64_t j = j0; j < j1; j += lanes) {
        ahead.at(j, lanes);
        step(j, part, cmx);
      }
      VPCE_SIMD
      for (std::int64_t l = 0; l < lanes; ++l) mx[l] = cmx[l] > mx[l] ? cmx[l] : mx[l];
      for (int k = 0; k < K; ++k) {
        for (std::int64_t g16 = 0; g16 < lanes; g16 += 16) {  // 16 at a time: GCC leaves 32 scalar on SSE
          VPCE_SIMD
          for (std::int64_t l = 0; l < 16; ++l) total[k][g16 + l] += double(part[k][g16 + l]);
        }
      }
      pace(j1);
    }
    T rest[K][lanes] = {};  // the last n % lanes columns, a lane each
    VPCE_SIMD
    for (std::int64_t l = 0; l < n - whole; ++l) {
      const T v = value(whole + l);
      const Terms<T, K> e = terms(whole + l, v);
      rest[0][l] = e.v[0];
      if constexpr (K > 1) rest[1][l] = e.v[1];
      mx[l] = v > mx[l] ? v : mx[l];
    }
    return lane_totals<T, K, lanes>(total, rest, mx, max);
  }
  /// The end of sums_max: the lane totals and the last columns' terms added, *max from the lanes' maxima.
  /// More than 16 lanes are first folded into 16 (lane 16 g + l into lane l, in order of g), then the 16
  /// added in order.
  template <class T, int K, std::int64_t lanes>
  KOKKOS_FORCEINLINE_FUNCTION static Terms<T, K> lane_totals(const double (&total)[K][lanes], const T (&rest)[K][lanes],
                                                             T (&mx)[lanes], T* max) {
    static_assert(lanes % 16 == 0, "lanes in groups of 16");
    Terms<T, K> out;
    for (int k = 0; k < K; ++k) {
      double t16[16];
      VPCE_SIMD
      for (std::int64_t l = 0; l < 16; ++l) t16[l] = total[k][l] + double(rest[k][l]);
      for (std::int64_t g16 = 16; g16 < lanes; g16 += 16) {
        VPCE_SIMD
        for (std::int64_t l = 0; l < 16; ++l) t16[l] += total[k][g16 + l] + double(rest[k][g16 + l]);
      }
      double t = 0;
      for (std::int64_t l = 0; l < 16; ++l) t += t16[l];
      out.v[k] = T(t);
    }
    for (std::int64_t g16 = 16; g16 < lanes; g16 += 16) {
      VPCE_SIMD
      for (std::int64_t l = 0; l < 16; ++l) mx[l] = mx[g16 + l] > mx[l] ? mx[g16 + l] : mx[l];
    }
    T m = neg_inf<T>();
    for (std::int64_t l = 0; l < 16; ++l) m = mx[l] > m ? mx[l] : m;
    *max = m;
    return out;
  }
  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION VPCE_FLATTEN void for_each(std::int64_t n, const F& f) const {
    VPCE_SIMD
    for (std::int64_t j = 0; j < n; ++j) f(j);
  }
  /// line[l] = G(v(j + l)) for the columns of a 64-byte line of G (v gives G's compute type). A 16-bit G is
  /// rounded by the CPU's conversion instructions where the build has them, bfloat16 without them by its
  /// integer steps in AVX2's or AVX-512's instructions (round_line_hw, stream.hpp), with the same bits as
  /// G(float).
  template <class G, class F>
  KOKKOS_FORCEINLINE_FUNCTION VPCE_FLATTEN static void round_line(G* line, const F& v, std::int64_t j) {
    constexpr std::int64_t lanes = 64 / std::int64_t(sizeof(G));
    if constexpr (have_round_line_hw<G, L> || exps_in_lanes_v<F> || widens_values_v<F>) {
      alignas(64) float f[lanes];
      values(v, j, f);
      if constexpr (have_round_line_hw<G, L>) {
        if (round_line_hw<G, L>(line, f)) return;
      }
      VPCE_SIMD
      for (std::int64_t l = 0; l < lanes; ++l) line[l] = to_storage<G>(f[l]);
    } else {
      VPCE_SIMD_LINE
      for (std::int64_t l = 0; l < lanes; ++l) line[l] = to_storage<G>(v(j + l));
    }
  }
  /// f[l] = v(j + l) for l < lanes; an ExpValue v that takes its exps in lanes: 16 at a time (exp_lanes16), the
  /// columns' x and exp arguments formed before, their values after; a WidenedExpValue that widens: its logits
  /// 16 at a time (widen16_hw), then their values.
  template <class F, class T, std::int64_t lanes>
  KOKKOS_FORCEINLINE_FUNCTION static void values(const F& v, std::int64_t j, T (&f)[lanes]) {
    if constexpr (exps_in_lanes_v<F>) {
      static_assert(lanes % 16 == 0, "16 exps at a time");
      for (std::int64_t g16 = 0; g16 < lanes; g16 += 16) {
        T xs[16], u[16], e[16];
        VPCE_SIMD
        for (std::int64_t l = 0; l < 16; ++l) {
          xs[l] = v.x(j + g16 + l);
          u[l] = xs[l] - v.shift;
        }
        exp_lanes16<F::accuracy, L>(u, e);
        VPCE_SIMD
        for (std::int64_t l = 0; l < 16; ++l) f[g16 + l] = v.value(j + g16 + l, xs[l], e[l]);
      }
    } else if constexpr (widens_values_v<F>) {
      static_assert(lanes % 16 == 0, "16 columns at a time");
      for (std::int64_t g16 = 0; g16 < lanes; g16 += 16) {
        T zs[16];
        widen16_hw<L>(v.z + j + g16, zs);
        VPCE_SIMD
        for (std::int64_t l = 0; l < 16; ++l) f[g16 + l] = v.at(j + g16 + l, zs[l]);
      }
    } else {
      VPCE_SIMD_LINE
      for (std::int64_t l = 0; l < lanes; ++l) f[l] = v(j + l);
    }
  }
  /// y[j] = G(v(j)) for j in [0, n) (v gives G's compute type), then y[c] = fix if 0 <= c < n; the row v
  /// reads from memory is prefetched `ahead`. Store::streaming (rows of at least a line): y's whole 64-byte
  /// lines are formed a line at a time in registers (round_line) and written with streaming stores
  /// (stream.hpp), the row written once and never read; the columns before its first line and after its last
  /// one are copied with plain stores from a line formed at the row's first (last) columns, so that every loop
  /// is a whole vector line; then stream_fence(), unless `fence` is false (the caller fences later: a fence
  /// per piece of a row written piecewise cost ~7% of `loss_and_grad`) and c is not in the row.
  template <class G, class F, Hint H = Hint::l2>
  KOKKOS_FORCEINLINE_FUNCTION VPCE_FLATTEN void store(std::int64_t n, G* y, const F& v, std::int64_t c, G fix,
                                                      Store how, const Ahead<H>& ahead = {}, bool fence = true) const {
    constexpr std::int64_t lanes = 64 / std::int64_t(sizeof(G));  // columns per line
    const std::int64_t off = std::int64_t(reinterpret_cast<std::uintptr_t>(y) % 64);
    if (how == Store::plain || n < lanes || off % std::int64_t(sizeof(G)) != 0) {
      fill(n, y, v, ahead);
    } else {
      alignas(64) G line[lanes];
      auto form = [&](std::int64_t j) { round_line(line, v, j); };                // line = columns [j, j + lanes)
      const std::int64_t head = (lanes - off / std::int64_t(sizeof(G))) % lanes;  // columns before y's first line
      if (head > 0) {
        form(0);
        std::memcpy(y, line, std::size_t(head) * sizeof(G));
      }
      const std::int64_t lines_end = head + (n - head) / lanes * lanes;
      for (std::int64_t j = head; j < lines_end; j += lanes) {
        ahead.at(j, lanes);
        kick_next_page(y + j);     // the next page's address translation, while this one is written
        alignas(64) G one[lanes];  // a line of its own: GCC keeps it in registers (it stored `line` each time)
        round_line(one, v, j);
        stream_line<!is_16bit_v<G> || round_line_whole<G, L>, L>(y + j, one);
      }
      if (lines_end < n) {
        form(n - lanes);
        std::memcpy(y + lines_end, line + (lanes - (n - lines_end)), std::size_t(n - lines_end) * sizeof(G));
      }
      if (fence || (c >= 0 && c < n)) stream_fence();  // also before the plain store below: maybe to a streamed line
    }
    if (c >= 0 && c < n) y[c] = fix;
  }
  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION void single(const F& f) const {
    f();
  }
  KOKKOS_FORCEINLINE_FUNCTION void barrier() const {}

  /// The statistics of a row of n columns, reading it ONCE from memory, chunk by chunk (online softmax): per
  /// chunk, one pass against the running max m computes the chunk's exps (summed, maybe stored) and its max
  /// together, so that the loads overlap the exp; if the max grew, the sum is rescaled; by more than e^80
  /// (the exps might overflow) the chunk's terms are formed again against the new max from the first pass's
  /// (again(), from L1). While m is -inf a chunk takes two passes: its max, then its exps.
  /// z(j): the raw logit of column j in T; x(z): the transform (increasing, so the max of x is x of the max
  /// of z); with `sum_x`, also the sum of x (of w_j x_j with `weights`, a row of n: class weights), in the
  /// chunk's own pass from L1 (online_stats_folded: in the exps' pass); with `entropy`, also
  /// h = sum exp(x - m) (x - m), in the exps' pass. With
  /// `exps` (a row of n), stores e_j = exp(x_j - m_c) there, m_c being the running max when chunk c was
  /// stored, given to chunk_max(c, m_c): Finalize then only rescales, one exp per element. `over_logits`: exps
  /// is the row z reads (in place, logits of the compute type; not with `entropy`): each exp is stored over the
  /// logit it comes from, and a chunk done again takes its terms from the values stored (again()). `ahead`: the
  /// row z reads, prefetched (stream.hpp); `pace`: told the columns read as the exps' loops go (NoPace).
  template <class T, int Lanes, ExpAccuracy A, class Z, class X, class ChunkMax, Hint H, class P = NoPace>
  KOKKOS_FORCEINLINE_FUNCTION OnlineStats<T> online_stats(std::int64_t n, const Z& z, const X& x, bool sum_x,
                                                          const T* weights, bool entropy, T* exps, bool over_logits,
                                                          const ChunkMax& chunk_max, const Ahead<H>& ahead,
                                                          const P& pace = P{}) const {
    if (entropy) return online<2, false, T, Lanes, A>(n, z, x, sum_x, weights, exps, chunk_max, ahead, pace);
    if (over_logits) return online<1, true, T, Lanes, A>(n, z, x, sum_x, weights, exps, chunk_max, ahead, pace);
    return online<1, false, T, Lanes, A>(n, z, x, sum_x, weights, exps, chunk_max, ahead, pace);
  }
  /// online_stats with the sum of x (of w_j x_j with `weights`) and without the entropy, that sum taken as the
  /// exps' second sum (ExpTerms: x_j formed as (x_j - m) + m) instead of in a pass of its own: label
  /// smoothing's statistics (LocalStats::row_folded).
  template <class T, int Lanes, ExpAccuracy A, class Z, class X, class ChunkMax, Hint H, class P = NoPace>
  KOKKOS_FORCEINLINE_FUNCTION OnlineStats<T> online_stats_folded(std::int64_t n, const Z& z, const X& x, const T* w,
                                                                 T* exps, bool over_logits, const ChunkMax& chunk_max,
                                                                 const Ahead<H>& ahead, const P& pace = P{}) const {
    constexpr Second wx = Second::weighted_x, sx = Second::x;
    if (over_logits && w != nullptr)
      return online<2, true, T, Lanes, A, wx>(n, z, x, true, w, exps, chunk_max, ahead, pace);
    if (over_logits) return online<2, true, T, Lanes, A, sx>(n, z, x, true, w, exps, chunk_max, ahead, pace);
    if (w != nullptr) return online<2, false, T, Lanes, A, wx>(n, z, x, true, w, exps, chunk_max, ahead, pace);
    return online<2, false, T, Lanes, A, sx>(n, z, x, true, w, exps, chunk_max, ahead, pace);
  }

  /// zs[j] = float(x[j]) for j in [0, n) by the CPU's instructions (widen16_hw), x prefetched `ahead`.
  template <class S, Hint H>
  KOKKOS_FORCEINLINE_FUNCTION static void widen(std::int64_t n, const S* x, float* zs, const Ahead<H>& ahead) {
    const std::int64_t whole = n - n % 32;
    for (std::int64_t j = 0; j < whole; j += 32) {
      ahead.at(j, 32);
      widen16_hw<L>(x + j, zs + j);
      widen16_hw<L>(x + j + 16, zs + j + 16);
    }
    for (std::int64_t j = whole; j < n; ++j) zs[j] = float(x[j]);
  }

 private:
  /// y[j] = v(j) for j in [0, n), prefetching `ahead` once per 64 bytes of y; whole lines by round_line, so
  /// that a 16-bit G is rounded by the CPU's conversions where the build has them (bfloat16 in place -15%,
  /// backward -22% on an AMD EPYC Zen 5 against to_storage's integer rounding; NOTES.md, issue 12,
  /// seventeenth round).
  template <class G, class F, Hint H>
  KOKKOS_FORCEINLINE_FUNCTION VPCE_FLATTEN void fill(std::int64_t n, G* y, const F& v, const Ahead<H>& ahead) const {
    constexpr std::int64_t lanes = 64 / std::int64_t(sizeof(G));
    const std::int64_t whole = n - n % lanes;
    for (std::int64_t j = 0; j < whole; j += lanes) {
      ahead.at(j, lanes);
      round_line(y + j, v, j);
    }
    VPCE_SIMD
    for (std::int64_t j = whole; j < n; ++j) y[j] = to_storage<G>(v(j));
  }

  /// online_stats with K = 1 (s) or 2 sums (s and h, or s and the sum of x as S2 says), the exps stored over the
  /// logits if OverLogits.
  template <int K, bool OverLogits, class T, int Lanes, ExpAccuracy A, Second S2 = Second::entropy, class Z, class X,
            class ChunkMax, Hint H, class P>
  KOKKOS_FORCEINLINE_FUNCTION OnlineStats<T> online(std::int64_t n, const Z& z, const X& x, bool sum_x,
                                                    const T* weights, T* exps, const ChunkMax& chunk_max,
                                                    const Ahead<H>& ahead, const P& pace) const {
    // A provisional max from the row's first 64 columns, so that the first chunk too is read once (its exps
    // against it, its max in the same pass) rather than in two passes; if they are all -inf (or NaN) the
    // first chunk is done in two passes.
    OnlineState<T> st;
    st.zmax = max<T>(n < 64 ? n : 64, z);
    st.m = st.zmax != neg_inf<T>() ? x(st.zmax) : neg_inf<T>();
    for (std::int64_t j0 = 0; j0 < n; j0 += chunk_cols) {
      const std::int64_t len = j0 + chunk_cols < n ? chunk_cols : n - j0;
      if constexpr (widens_v<Z, L>) {
        // The chunk widened to float, read from L1 by every loop over it; their prefetches fetch the next
        // chunk's logits while they compute, so that the widening (a pure read) finds them in cache.
        alignas(64) float zs[chunk_cols];
        widen(len, z.x + j0, zs, ahead.from(j0));
        online_chunk<K, OverLogits, Lanes, A, S2>(j0, len, Widened<reads_pairs_v<Z>>{zs}, x, sum_x, weights, exps,
                                                  chunk_max, ahead.from(j0 + chunk_cols), pace, st);
      } else {
        online_chunk<K, OverLogits, Lanes, A, S2>(j0, len, ColumnsFrom<Z>{z, j0}, x, sum_x, weights, exps, chunk_max,
                                                  ahead.from(j0), pace, st);
      }
    }
    return {st.m, T(st.acc), st.zmax, st.sx, T(st.acc_h)};
  }
  /// online's running state: the max m, the max of z, the sum of x, the sums (acc_h relative to m, as acc).
  template <class T>
  struct OnlineState {
    T m, zmax, sx = 0;
    double acc = 0, acc_h = 0;
  };
  /// online's chunk j0 of len columns, read by zc, prefetched by ahd, into the state st.
  template <int K, bool OverLogits, int Lanes, ExpAccuracy A, Second S2, class T, class ZC, class X, class ChunkMax,
            Hint H, class P>
  KOKKOS_FORCEINLINE_FUNCTION void online_chunk(std::int64_t j0, std::int64_t len, const ZC& zc, const X& x, bool sum_x,
                                                const T* weights, T* exps, const ChunkMax& chunk_max,
                                                const Ahead<H>& ahd, const P& pace, OnlineState<T>& st) const {
    constexpr bool entropy = K == 2 && S2 == Second::entropy;  // the second sum is h
    constexpr bool folded = K == 2 && !entropy;                // the second sum is the sum of x (label smoothing)
    T* yc = exps == nullptr ? nullptr : exps + j0;
    const T* wc = weights == nullptr ? nullptr : weights + j0;
    SecondTerm<S2, T> sec{};
    if constexpr (S2 == Second::weighted_x) sec.w = wc;
    // The sum of x (label smoothing), where it is not the exps' second sum (with the entropy, whose h takes that
    // place), in a pass of its own before the exps. Where it is the first to read the chunk
    // from the logits, it prefetches the row as the exps' pass does (fp32 smoothing at N 4096 x V_local 32768 on
    // a Zen 4: 0.89 / 0.97x in time at 1x2 / 2x1, bfloat16 0.86 / 0.96x); a widened chunk is in L1 already.
    // The lambdas hold their values, as sum() holds them.
    if constexpr (!folded) {
      const Ahead<H> sum_ahead = is_widened_v<ZC> ? Ahead<H>{} : ahd;
      if (sum_x && weights != nullptr) {
        st.sx += sum<T>(
            len, [wc, x, zc](std::int64_t j) { return wc[j] * x(zc(j)); }, sum_ahead);
      } else if (sum_x) {
        st.sx += sum<T>(
            len, [x, zc](std::int64_t j) { return x(zc(j)); }, sum_ahead);
      }
    }
    if (st.m != neg_inf<T>()) {
      T cz;
      const Terms<T, K> sc =
          exp_sums<K, true, Lanes, A, OverLogits, S2>(len, zc, x, yc, st.m, &cz, ahd, PaceFrom<P>{pace, j0}, sec);
      if constexpr (folded) st.sx += sc.v[1];  // whatever the max does below
      const T m_new = cz > st.zmax ? x(cz) : st.m;
      if (m_new - st.m <= T(80)) {
        if (yc != nullptr) chunk_max(j0 / chunk_cols, st.m);  // what the stored exps are relative to
        const double e = double(fast_exp(st.m - m_new)), before = st.acc + double(sc.v[0]);
        if constexpr (entropy) st.acc_h = (st.acc_h + double(sc.v[1]) + double(st.m - m_new) * before) * e;
        st.acc = before * e;
        st.zmax = cz > st.zmax ? cz : st.zmax;
        st.m = m_new;
        return;
      }
      // The chunk's max is more than 80 above m: its terms again against m_new, the sums so far rescaled.
      const double e = double(fast_exp(st.m - m_new));
      if constexpr (entropy) st.acc_h = (st.acc_h + double(st.m - m_new) * st.acc) * e;
      st.acc *= e;
      constexpr int Ka = entropy ? 2 : 1;  // the sum of x, folded, was taken in the first pass
      const Terms<T, Ka> sa = again<Ka, OverLogits, Lanes, A>(len, zc, x, yc, st.m, m_new - st.m);
      st.acc += double(sa.v[0]);
      if constexpr (entropy) st.acc_h += double(sa.v[1]);
      st.m = m_new;
      st.zmax = cz;
      if (yc != nullptr) chunk_max(j0 / chunk_cols, st.m);
      return;
    }
    // m = -inf (every logit so far -inf or NaN): the chunk's max, then its exps against it (from L1). acc is 0
    // (or NaN from a NaN among the -inf): it stays as it is.
    const T cz = max<T>(len, zc);
    if (cz > st.zmax) {
      st.m = x(cz);
      st.zmax = cz;
    }
    T unused;
    const Terms<T, K> sc =
        exp_sums<K, false, Lanes, A, false, S2>(len, zc, x, yc, st.m, &unused, ahd, PaceFrom<P>{pace, j0}, sec);
    st.acc += double(sc.v[0]);
    if constexpr (entropy) st.acc_h += double(sc.v[1]);
    if constexpr (folded) st.sx += sc.v[1];
    if (yc != nullptr) chunk_max(j0 / chunk_cols, st.m);
  }

  /// Column j's terms against the max m: e = exp(x_j - m), stored in y[j] if `Store`, and with K = 2 also, as S2
  /// says, e (x_j - m) (0 where e is 0: a -inf logit adds nothing), x_j or w_j x_j (sec.w: the chunk's class
  /// weights), x_j formed as (x_j - m) + m (within a rounding of m: label smoothing's sum, in the exps' pass). m is the
  /// running max, which x_j may exceed: by more than 80, online() discards the chunk's terms and does them again
  /// (again()), so exp never overflows in a result that is kept. `Mark` (the exps stored over the logits): where u =
  /// x_j - m > 80, -u is stored instead of e, for again() (an exp is never negative). Where exp_in_lanes<T, A, L>,
  /// sums_max takes the exps of 16 columns at a time apart (exp_lanes16): arg(j) gives column j's u, terms(j, u, e) the
  /// rest.
  template <int K, bool Store, bool Mark, ExpAccuracy A, class T, class Z, class X, Second S2 = Second::entropy>
  struct ExpTerms {
    static constexpr bool in_lanes = exp_in_lanes<T, A, L>;
    static constexpr ExpAccuracy accuracy = A;
    const Z& z;
    const X& x;
    T* y;
    T m;
    SecondTerm<S2, T> sec;
    KOKKOS_FORCEINLINE_FUNCTION Terms<T, K> operator()(std::int64_t j) const { return at(j, z(j)); }
    /// Column j's terms from its value zj = z(j).
    KOKKOS_FORCEINLINE_FUNCTION Terms<T, K> at(std::int64_t j, T zj) const {
      const T u = x(zj) - m;
      return terms(j, u, exp_per_element<A, L>(u));
    }
    KOKKOS_FORCEINLINE_FUNCTION T arg(std::int64_t j) const { return x(z(j)) - m; }
    /// Column j's terms from u = x_j - m and its exp e.
    KOKKOS_FORCEINLINE_FUNCTION Terms<T, K> terms(std::int64_t j, T u, T e) const {
      if constexpr (Store) y[j] = Mark ? select(u > T(80), -u, e) : e;
      if constexpr (K == 1) {
        return {{e}};
      } else if constexpr (S2 == Second::entropy) {
        return {{e, select(e == T(0), T(0), e * u)}};
      } else if constexpr (S2 == Second::x) {
        return {{e, u + m}};
      } else {
        return {{e, sec.w[j] * (u + m)}};
      }
    }
  };

  /// The K sums of exp(x_j - m) (and the second term of ExpTerms, as S2 says, with sec's weights) over len
  /// columns, storing each exp in y if set (as ExpTerms with `Mark`); with
  /// `WithMax` also *cz = the max of z over the same columns, in the same pass (m is then finite). With m = -inf
  /// (every logit so far -inf or NaN) the sums are 0 -- s NaN if a NaN hides among them -- but for a sum of x,
  /// and y gets zeros.
  template <int K, bool WithMax, int Lanes, ExpAccuracy A, bool Mark = false, Second S2 = Second::entropy, class T,
            class Z, class X, Hint H, class P>
  KOKKOS_FORCEINLINE_FUNCTION VPCE_FLATTEN Terms<T, K> exp_sums(std::int64_t len, const Z& z, const X& x, T* y, T m,
                                                                T* cz, const Ahead<H>& ahead, const P& pace,
                                                                const SecondTerm<S2, T>& sec = {}) const {
    using Exps = ExpTerms<K, false, false, A, T, Z, X, S2>;
    auto no_max = [](std::int64_t) { return neg_inf<T>(); };
    if constexpr (!WithMax) {
      if (m == neg_inf<T>()) {
        auto zero = [&](std::int64_t j) {
          Terms<T, K> r{};
          r.v[0] = nan_or_zero(z(j));
          if constexpr (K == 2 && S2 == Second::x) r.v[1] = x(z(j));
          if constexpr (K == 2 && S2 == Second::weighted_x) r.v[1] = sec.w[j] * x(z(j));
          return r;
        };
        // The sums before the zeros are stored, as y may be the row z reads: two loops (GCC leaves one that
        // reads z(j) and then stores y[j] scalar).
        const Terms<T, K> sums = sums_max<T, K, Lanes>(len, zero, no_max, cz);
        if (y != nullptr) for_each(len, [&](std::int64_t j) { y[j] = T(0); });
        return sums;
      }
    }
    auto g = [&](std::int64_t j) {
      if constexpr (WithMax) {
        return z(j);
      } else {
        return no_max(j);
      }
    };
    // 16-bit logits whose exps are not stored read pairs of columns (sums_max_pairs). Where they are stored,
    // the exps of a pair would be interleaved into column order by two shuffles per 32 columns, which cost
    // what the pairs save (bfloat16 loss_and_grad +10% / -3% at 1x2 / 2x1 on an AMD Zen 5, noise about 5%).
    if constexpr (WithMax && reads_pairs_v<Z>) {
      if (y == nullptr) {
        return sums_max_pairs<T, K>(len, z, Exps{z, x, y, m, sec}, cz, ahead, pace);
      }
    }
    constexpr bool from_bits = WithMax && reads_pairs_v<Z> && !is_widened_v<Z>;  // the max of 16-bit logits' bits
    if (y == nullptr) return sums_max<T, K, Lanes, from_bits>(len, Exps{z, x, y, m, sec}, g, cz, ahead, pace);
    return sums_max<T, K, Lanes, from_bits>(len, ExpTerms<K, true, Mark, A, T, Z, X, S2>{z, x, y, m, sec}, g, cz,
                                            ahead.template as<Hint::l1>(), pace);
  }

  /// A chunk's K sums again, against m + d where the first pass against m found its max more than 80 above m
  /// (d > 80), each exp stored in y if set: e = exp(u - d) where u = x_j - m > 80, else exp(u) exp(-d/2)^2 (two
  /// factors: exp(-d) alone may be below the normal range where exp(u - d) is not). FromStored: from the
  /// values the first pass stored in y over the logits (ExpTerms' `Mark`: exp(u), or -u where u > 80); else
  /// from the logits, with the same bits.
  template <int K, bool FromStored, int Lanes, ExpAccuracy A, class T, class Z, class X>
  KOKKOS_FORCEINLINE_FUNCTION VPCE_FLATTEN Terms<T, K> again(std::int64_t len, const Z& z, const X& x, T* y, T m,
                                                             T d) const {
    static_assert(!FromStored || K == 1, "the entropy's sum needs x - m beside each stored exp");
    const T half = fast_exp(d * T(-0.5));
    auto exp_again = [&](T u, T e0, bool big) { return select(big, exp_per_element<A, L>(u - d), e0 * half * half); };
    // Each lambda below forms its Terms in its return statement: GCC leaves the loop scalar where a Terms is
    // copied out of a named one ("more than one data ref").
    auto terms = [&](T e, T u) -> Terms<T, K> {
      if constexpr (K == 1) {
        return {{e}};
      } else {
        return {{e, select(e == T(0), T(0), e * (u - d))}};
      }
    };
    auto no_max = [](std::int64_t) { return neg_inf<T>(); };
    T unused;
    if constexpr (FromStored) {
      return sums_max<T, K, Lanes>(
          len,
          [&](std::int64_t j) {
            const T v = y[j];
            const T e = exp_again(-v, v, v < T(0));
            y[j] = e;
            return terms(e, -v);
          },
          no_max, &unused);
    }
    // Two loops, as exp_sums: GCC leaves a store under `if (y != nullptr)` scalar.
    if (y == nullptr) {
      return sums_max<T, K, Lanes>(
          len,
          [&](std::int64_t j) {
            const T u = x(z(j)) - m;
            return terms(exp_again(u, exp_per_element<A, L>(u), u > T(80)), u);
          },
          no_max, &unused);
    }
    return sums_max<T, K, Lanes>(
        len,
        [&](std::int64_t j) {
          const T u = x(z(j)) - m;
          const T e = exp_again(u, exp_per_element<A, L>(u), u > T(80));
          y[j] = e;
          return terms(e, u);
        },
        no_max, &unused);
  }
};

/// Max reducer whose identity is -inf (Kokkos::Max starts from the lowest finite value, which would hide
/// a row of -inf).
template <class T>
struct MaxOrNegInf {
  using reducer = MaxOrNegInf;
  using value_type = T;
  using result_view_type = Kokkos::View<T, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  T& value;
  KOKKOS_INLINE_FUNCTION explicit MaxOrNegInf(T& v) : value(v) {}
  KOKKOS_INLINE_FUNCTION void join(T& dst, const T& src) const { dst = src > dst ? src : dst; }
  KOKKOS_INLINE_FUNCTION void join(volatile T& dst, const volatile T& src) const { dst = src > dst ? src : dst; }
  KOKKOS_INLINE_FUNCTION void init(T& v) const { v = neg_inf<T>(); }
  KOKKOS_INLINE_FUNCTION T& reference() const { return value; }
  KOKKOS_INLINE_FUNCTION result_view_type view() const { return result_view_type(&value); }
  KOKKOS_INLINE_FUNCTION bool references_scalar() const { return true; }
};

/// Reducer of OnlineStats across a team: the same (m, s) merge as the collective's (row_stats.hpp).
template <class T>
struct OnlineReducer {
  using reducer = OnlineReducer;
  using value_type = OnlineStats<T>;
  using result_view_type = Kokkos::View<value_type, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  value_type& value;
  KOKKOS_INLINE_FUNCTION explicit OnlineReducer(value_type& v) : value(v) {}
  KOKKOS_INLINE_FUNCTION void join(value_type& dst, const value_type& src) const {
    dst.join(src.m, src.s, src.zmax, src.sx, src.h);
  }
  KOKKOS_INLINE_FUNCTION void join(volatile value_type& dst, const volatile value_type& src) const {
    value_type d{dst.m, dst.s, dst.zmax, dst.sx, dst.h};
    d.join(src.m, src.s, src.zmax, src.sx, src.h);
    dst.m = d.m;
    dst.s = d.s;
    dst.zmax = d.zmax;
    dst.sx = d.sx;
    dst.h = d.h;
  }
  KOKKOS_INLINE_FUNCTION void init(value_type& v) const { v = {neg_inf<T>(), T(0), neg_inf<T>(), T(0), T(0)}; }
  KOKKOS_INLINE_FUNCTION void init(volatile value_type& v) const {
    v.m = neg_inf<T>();
    v.s = T(0);
    v.zmax = neg_inf<T>();
    v.sx = T(0);
    v.h = T(0);
  }
  KOKKOS_INLINE_FUNCTION value_type& reference() const { return value; }
  KOKKOS_INLINE_FUNCTION result_view_type view() const { return result_view_type(&value); }
  KOKKOS_INLINE_FUNCTION bool references_scalar() const { return true; }
};

/// A team thread's running statistics over its chunks of a row (TeamInner::online_stats): the sums in double,
/// as the host's lane totals, so that a row of 2^31 columns keeps float's accuracy (a float sum of 2^24 terms
/// per thread stops growing). add() merges a chunk's float partial as OnlineStats::join does.
template <class T>
struct ThreadTotal {
  T m = neg_inf<T>(), zmax = neg_inf<T>();
  double s = 0, sx = 0, h = 0;
  KOKKOS_INLINE_FUNCTION void add(const OnlineStats<T>& c) {
    merge_msh(m, s, h, c.m, double(c.s), double(c.h), m, s, h);
    zmax = c.zmax > zmax ? c.zmax : zmax;
    sx += double(c.sx);
  }
};

/// Whether an inner policy is the host's (HostInner<L>, any L).
template <class Inner>
struct is_host_inner : std::false_type {};
template <Isa L>
struct is_host_inner<HostInner<L>> : std::true_type {};
template <class Inner>
inline constexpr bool is_host_inner_v = is_host_inner<Inner>::value;

/// f() out of line, for the functions a row calls apart on purpose (not inlined into its loops): compiled for the
/// inner policy's instruction sets (Inner::isa): in the copies (VPCE_HOST_CLONES, isa.hpp) with their target,
/// everything f calls inlined (Copy<L>::apart); at Isa::build as the build's (`Flatten`: everything inlined).
template <Isa L, bool Flatten>
struct Apart;
template <>
struct Apart<Isa::build, false> {
  template <class F>
  KOKKOS_FUNCTION VPCE_NOINLINE static void call(const F& f) {
    f();
  }
};
template <>
struct Apart<Isa::build, true> {
  template <class F>
  KOKKOS_FUNCTION VPCE_NOINLINE VPCE_FLATTEN static void call(const F& f) {
    f();
  }
};
#if VPCE_HOST_CLONES
template <Isa L, bool Flatten>
struct Apart {
  template <class F>
  static void call(const F& f) {
    Copy<L>::apart(f);
  }
};
#endif

/// A device's policy: a row is one team, its threads across the vocabulary: thread t of nt reads columns
/// t, t + nt, ... (coalesced loads), `unroll` of them before it uses them, so that each thread has several
/// loads in flight (one at a time kept an H200 at a quarter to a half of its copy bandwidth).
template <class Member>
struct TeamInner {
  static constexpr Isa isa = Isa::build;
  const Member& member;
  static constexpr int unroll = 8;
  /// Columns a thread sums in T before adding them to its double total (ThreadTotal, sum()).
  static constexpr std::int64_t chunk_per_thread = 256;

  /// Thread t's columns of [b, e) (b + t, b + t + nt, ...): in groups of `unroll`, group(j, nt) for columns
  /// j + u nt (u < unroll), then the rest one by one, one(j).
  template <class Group, class One>
  KOKKOS_FORCEINLINE_FUNCTION void columns(std::int64_t b, std::int64_t e, const Group& group, const One& one) const {
    const std::int64_t nt = member.team_size();
    std::int64_t j = b + member.team_rank();
    for (; j + (unroll - 1) * nt < e; j += unroll * nt) group(j, nt);
    for (; j < e; j += nt) one(j);
  }
  /// columns() over [0, n) in chunks of chunk_per_thread columns per thread: per chunk, acc starts from init,
  /// group(j, nt, acc) adds a group of columns and one(j, acc) one column; done(acc) after each chunk.
  template <class Acc, class Group, class One, class Done>
  KOKKOS_FORCEINLINE_FUNCTION void chunks(std::int64_t n, const Acc& init, const Group& group, const One& one,
                                          const Done& done) const {
    const std::int64_t step = chunk_per_thread * member.team_size();
    for (std::int64_t b = 0; b < n; b += step) {
      Acc acc = init;
      columns(
          b, b + step < n ? b + step : n, [&](std::int64_t j, std::int64_t nt) { group(j, nt, acc); },
          [&](std::int64_t j) { one(j, acc); });
      done(acc);
    }
  }
  /// K columns j + u nt (u < K) into a thread's chunk statistics a: their loads, their max, then (the sums so
  /// far moved to a new max, rarely after the first groups) their exps against it: one exp per column, the K
  /// exps independent of each other. As the host's online_stats: a -inf logit adds nothing, a NaN makes s NaN,
  /// h and sx only where asked for.
  template <int K, ExpAccuracy A, class T, class Z, class X>
  KOKKOS_FORCEINLINE_FUNCTION static void add_group(std::int64_t j, std::int64_t nt, const Z& z, const X& x,
                                                    const T* weights, bool sum_x, bool entropy, OnlineStats<T>& a) {
    T zv[K], xv[K];
    for (int u = 0; u < K; ++u) zv[u] = z(j + u * nt);
    T gx = a.m;
    for (int u = 0; u < K; ++u) {
      xv[u] = x(zv[u]);
      gx = xv[u] > gx ? xv[u] : gx;
      a.zmax = zv[u] > a.zmax ? zv[u] : a.zmax;
    }
    if (gx > a.m) merge_msh(a.m, a.s, a.h, gx, T(0), T(0), a.m, a.s, a.h);
    for (int u = 0; u < K; ++u) {
      const T d = xv[u] - a.m;
      const T e = select(xv[u] == neg_inf<T>(), T(0), fast_exp_no_overflow<A, Isa::build>(d));
      a.s += e;
      if (entropy) a.h += select(e == T(0), T(0), e * d);
      if (sum_x) a.sx += weights != nullptr ? weights[j + u * nt] * xv[u] : xv[u];
    }
  }

  /// columns() over [b, e) column by column: use(j, load(j)), a group's loads all issued before any use.
  template <class Load, class Use>
  KOKKOS_FORCEINLINE_FUNCTION void each_column(std::int64_t b, std::int64_t e, const Load& load, const Use& use) const {
    columns(
        b, e,
        [&](std::int64_t j, std::int64_t nt) {
          decltype(load(j)) v[unroll];
          for (int u = 0; u < unroll; ++u) v[u] = load(j + u * nt);
          for (int u = 0; u < unroll; ++u) use(j + u * nt, v[u]);
        },
        [&](std::int64_t j) { use(j, load(j)); });
  }

  template <class T, class F>
  KOKKOS_FORCEINLINE_FUNCTION T max(std::int64_t n, const F& f) const {
    T m = neg_inf<T>();
    each_column(
        0, n, [&](std::int64_t j) { return T(f(j)); }, [&](std::int64_t, T v) { m = v > m ? v : m; });
    member.team_reduce(MaxOrNegInf<T>(m));
    return m;
  }
  template <class T, class F>
  KOKKOS_FORCEINLINE_FUNCTION T sum(std::int64_t n, const F& f) const {
    return sums_max<T, 1>(
               n, [&](std::int64_t j) { return Terms<T, 1>{{T(f(j))}}; }, [](std::int64_t) { return neg_inf<T>(); },
               nullptr)
        .v[0];
  }
  /// K sums of f(j)'s terms (Terms<T, K>), each summed per thread in T over chunks of chunk_per_thread columns
  /// and in double across them, and *max = the max of g(j) (not formed where max is null), in one pass: the
  /// contract of HostInner::sums_max (the row is not prefetched: `ahead` is the host's).
  template <class T, int K, class F, class G, Hint H = Hint::l2>
  KOKKOS_FORCEINLINE_FUNCTION Terms<T, K> sums_max(std::int64_t n, const F& f, const G& g, T* max,
                                                   const Ahead<H>& /*ahead*/ = {}) const {
    double total[K] = {};
    T mx = neg_inf<T>();
    auto add = [&](const Terms<T, K>& v, T gv, Terms<T, K>& acc) {
      for (int k = 0; k < K; ++k) acc.v[k] += v.v[k];
      mx = gv > mx ? gv : mx;
    };
    chunks(
        n, Terms<T, K>{},
        [&](std::int64_t j, std::int64_t nt, Terms<T, K>& acc) {
          Terms<T, K> v[unroll];
          T gv[unroll];
          for (int u = 0; u < unroll; ++u) {
            gv[u] = g(j + u * nt);
            v[u] = f(j + u * nt);
          }
          for (int u = 0; u < unroll; ++u) add(v[u], gv[u], acc);
        },
        [&](std::int64_t j, Terms<T, K>& acc) {
          const T gv = g(j);
          add(f(j), gv, acc);
        },
        [&](const Terms<T, K>& acc) {
          for (int k = 0; k < K; ++k) total[k] += double(acc.v[k]);
        });
    Terms<T, K> out;
    for (int k = 0; k < K; ++k) {
      out.v[k] = T(total[k]);
      member.team_reduce(Kokkos::Sum<T>(out.v[k]));
    }
    if (max != nullptr) {
      member.team_reduce(MaxOrNegInf<T>(mx));
      *max = mx;
    }
    return out;
  }
  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION void for_each(std::int64_t n, const F& f) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, n), f);
  }
  /// y[j] = G(v(j)) for j in [0, n), then y[c] = fix if 0 <= c < n (plain stores: a device writes whole lines).
  /// A group's values are all formed before any is stored (their loads in flight together, also in place).
  template <class G, class F, Hint H = Hint::l2>
  KOKKOS_FORCEINLINE_FUNCTION void store(std::int64_t n, G* y, const F& v, std::int64_t c, G fix, Store,
                                         const Ahead<H>& = {}, bool /*fence*/ = true) const {
    each_column(
        0, n, [&](std::int64_t j) { return to_storage<G>(v(j)); }, [&](std::int64_t j, G o) { y[j] = o; });
    barrier();
    if (c >= 0 && c < n) single([&]() { y[c] = fix; });
  }
  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION void single(const F& f) const {
    Kokkos::single(Kokkos::PerTeam(member), f);
  }
  KOKKOS_FORCEINLINE_FUNCTION void barrier() const { member.team_barrier(); }

  /// The statistics of a row (HostInner::online_stats's contract) in one read: each thread keeps running
  /// statistics over its columns (add_group: per chunk in T, ThreadTotal across chunks), merged across the
  /// team. No exps are stored (exps and chunk_max are not used): Finalize recomputes them from the logits,
  /// which keeps the device's pass count at 2 reads + 1 write.
  template <class T, int /*Lanes*/, ExpAccuracy A, class Z, class X, class ChunkMax, Hint H, class P = NoPace>
  KOKKOS_FORCEINLINE_FUNCTION OnlineStats<T> online_stats(std::int64_t n, const Z& z, const X& x, bool sum_x,
                                                          const T* weights, bool entropy, T* /*exps*/,
                                                          bool /*over_logits*/, const ChunkMax& /*chunk_max*/,
                                                          const Ahead<H>& /*ahead*/, const P& /*pace*/ = P{}) const {
    auto zt = [&](std::int64_t j) { return T(z(j)); };
    ThreadTotal<T> total;
    chunks(
        n, OnlineStats<T>{neg_inf<T>(), T(0), neg_inf<T>(), T(0), T(0)},
        [&](std::int64_t j, std::int64_t nt, OnlineStats<T>& acc) {
          add_group<unroll, A>(j, nt, zt, x, weights, sum_x, entropy, acc);
        },
        [&](std::int64_t j, OnlineStats<T>& acc) { add_group<1, A>(j, 0, zt, x, weights, sum_x, entropy, acc); },
        [&](const OnlineStats<T>& acc) { total.add(acc); });
    OnlineStats<T> r{total.m, T(total.s), total.zmax, T(total.sx), T(total.h)};
    member.team_reduce(OnlineReducer<T>(r));
    return r;
  }
};

/// Runs `functor.row(inner, i)` for rows i in [row0, row1): a vectorised loop per row on the host, a team
/// per row on a device. `UseTeams` can force the device form on the host (tests use it).
template <class ExecSpace, class Functor>
struct RowDriver {
  Functor f;
  std::int64_t row0;
#if VPCE_HOST_CLONES
  Isa level = host_level();  ///< the copy of the row loops this CPU runs (VPCE_HOST_CLONES, isa.hpp)
  /// Row i in the copy for `level` (at_level, stream.hpp): compiled for its instruction sets, everything it calls
  /// inlined, with the host policy of its level (whose paths in intrinsics are the level's).
  void operator()(std::int64_t i) const { at_level(level, Row{f, row0 + i}); }
  /// The row at a level. A class of its own, not a generic lambda: the names of the copies' functions carry it, and
  /// binutils 2.40 (c++filt, objdump -C, perf) cannot demangle a generic lambda's there.
  struct Row {
    const Functor& f;
    std::int64_t i;
    template <Isa L>
    void operator()(std::integral_constant<Isa, L>) const {
      f.row(HostInner<L>{}, i);
    }
  };
#else
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { f.row(HostInner<Isa::build>{}, row0 + i); }
#endif
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
    // A league size is an int: launches of at most INT_MAX rows.
    constexpr std::int64_t max_league = std::numeric_limits<int>::max();
    for (std::int64_t r = row0; r < row1; r += max_league) {
      d.row0 = r;
      const int league = static_cast<int>(row1 - r < max_league ? row1 - r : max_league);
      Kokkos::parallel_for(label, Kokkos::TeamPolicy<ExecSpace>(exec, league, Kokkos::AUTO), d);
    }
  } else {
    Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, row1 - row0),
                         d);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Row kernels. S: the logits' storage type, T: the compute type (float for 16-bit S), G: the type the
// gradient (or stash) rows are written in. Rows are pointers + a row stride.

KOKKOS_FORCEINLINE_FUNCTION float to_compute(bfloat16 v) { return float(v); }
KOKKOS_FORCEINLINE_FUNCTION float to_compute(float16 v) { return float(v); }
KOKKOS_FORCEINLINE_FUNCTION float to_compute(float v) { return v; }
KOKKOS_FORCEINLINE_FUNCTION double to_compute(double v) { return v; }

/// The logits of a row as the statistics read them (Inner::online_stats's z): z(j) = column j in the compute
/// type; for 16-bit logits on a little-endian host also pair(j) = columns j and j + 1 from ONE 32-bit load
/// (HostInner::sums_max_pairs), the same values.
template <class S>
struct Logits {
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
  static constexpr bool pairs = is_16bit_v<S> && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
#else
  static constexpr bool pairs = false;
#endif
  struct Pair {
    compute_type_t<S> a, b;
  };
  const S* x;
  KOKKOS_FORCEINLINE_FUNCTION compute_type_t<S> operator()(std::int64_t j) const { return to_compute(x[j]); }
  /// w[l] = column j + l for l < 32 (widen32_hw), for bfloat16 at a level L that has it.
  template <Isa L, class U = S, std::enable_if_t<std::is_same_v<U, bfloat16>, int> = 0>
  KOKKOS_FORCEINLINE_FUNCTION void widen32(std::int64_t j, float* w) const {
    widen32_hw<L>(x + j, w);
  }
  KOKKOS_FORCEINLINE_FUNCTION Pair pair(std::int64_t j) const {
    static_assert(pairs, "16-bit logits");
    std::uint32_t w;
    std::memcpy(&w, x + j, sizeof(w));  // column j in the low half
    if constexpr (std::is_same_v<S, bfloat16>) {
      return {from_bits(w << 16), from_bits(w & 0xffff0000u)};  // a bfloat16 is a float's upper half
    } else {
      S lo, hi;
      lo.bits = std::uint16_t(w);
      hi.bits = std::uint16_t(w >> 16);
      return {to_compute(lo), to_compute(hi)};
    }
  }
};

/// Logits of a type the CPU widens (Widened).
template <class S, Isa L>
struct widens<Logits<S>, L> : std::bool_constant<have_widen_hw<S, L>> {};

/// The map x(z) from a stored logit z to the x of the formulas (docs/design.md, section 1) that a kernel is
/// compiled for: `none` x = z (logit_scale 1, no softcap: the default), `scale` x = logit_scale z, `softcap`.
/// `none` is a form of its own because the multiply by 1 is not free: x_j - m was a fused multiply-add where a
/// subtraction serves, and the gradient took a multiply by dx/dz = 1, on the pipes that bind the exps (without
/// them, rows in L3 on an AMD EPYC Zen 4: `loss_and_grad` -6 to -9%, forward -6 to -7%, backward -7 to -16%;
/// perf_tests/NOTES.md, issue 12, thirty-seventh round). The same bits as `scale` with logit_scale 1.
enum class Transform { none, scale, softcap };

/// The options as the kernels use them (docs/design.md, section 1).
template <class T>
struct Params {
  T scale = 1;  ///< logit_scale
  T cap = 0;    ///< softcap (0: off)
  T inv_cap = 0;
  T alpha = 0;           ///< label smoothing
  T zeta = 0;            ///< z-loss
  T inv_vocab = 0;       ///< 1 / V (global)
  T beta = 0;            ///< entropy_weight
  bool entropy = false;  ///< the records carry h (Options::entropy or an entropy_weight)
  /// Class weights of the GLOBAL vocabulary (column begin + j is this rank's column j), or nullptr; their
  /// sum over V (W / V).
  const T* weights = nullptr;
  T w_over_v = 1;
  std::int64_t ignore_index = -100;

  /// x from the stored z; -inf (masked) stays -inf.
  template <Transform Xf>
  KOKKOS_FORCEINLINE_FUNCTION T transform(T z) const {
    if constexpr (Xf == Transform::softcap) {
      const T x = cap * fast_tanh(z * scale * inv_cap);
      return select(z == neg_inf<T>(), z, x);
    } else if constexpr (Xf == Transform::scale) {
      return z * scale;
    } else {
      return z;
    }
  }
  /// dx/dz at x (0 at a masked logit).
  template <Transform Xf>
  KOKKOS_FORCEINLINE_FUNCTION T chain(T x) const {
    if constexpr (Xf == Transform::softcap) {
      const T u = x * inv_cap;
      return select(x == neg_inf<T>(), T(0), scale * (T(1) - u * u));
    } else if constexpr (Xf == Transform::scale) {
      return scale;
    } else {
      return T(1);
    }
  }
};

template <class S, class T, class MemSpace>
struct KernelArgs {
  const S* x = nullptr;  ///< logits rows
  std::int64_t ld_x = 0;
  std::int64_t n = 0;                                   ///< local vocabulary width
  std::int64_t begin = 0;                               ///< first global column of this rank
  Kokkos::View<const std::int64_t*, MemSpace> targets;  ///< target ids (empty with probability targets)
  Params<T> p;
  /// Probability targets (Options::probability_targets): every row counts, no row has a target column; q:
  /// their rows (N x n, row stride ld_q; nullptr where a kernel does not read them).
  bool probs = false;
  const S* q = nullptr;
  std::int64_t ld_q = 0;
  KOKKOS_INLINE_FUNCTION std::int64_t local_target(std::int64_t i) const {
    if (probs) return -1;
    const std::int64_t c = targets(i) - begin;
    return (c >= 0 && c < n) ? c : -1;
  }
  KOKKOS_INLINE_FUNCTION bool valid(std::int64_t i) const { return probs || targets(i) != p.ignore_index; }
};

/// The sums of a row's target probabilities q (with class weights w, or nullptr) against its logits x(j):
/// t = sum w_j q_j x_j (a q_j of 0 adds 0, also at a -inf logit), q = sum q_j, or -inf if some q_j < 0, and
/// wq = sum w_j q_j. One pass forms t, wq and the most negative q_j; with weights a second one forms q.
/// `ahead`: the row that q reads, prefetched (the logits' row is in cache after the statistics). Each sum as
/// the inner policy's sum() forms it.
template <class T, class Inner, class Q, class X, class A>
KOKKOS_INLINE_FUNCTION void probability_sums(const Inner& in, std::int64_t n, const Q& q, const X& x, const T* w, T* t,
                                             T* qs, T* wq, const A& ahead) {
  auto neg_q = [q](std::int64_t j) { return -q(j); };
  T most_negative;
  Terms<T, 2> s;
  if (w != nullptr) {  // the branch outside the loops: inside, GCC leaves some of them scalar
    s = in.template sums_max<T, 2>(
        n,
        [q, x, w](std::int64_t j) {
          const T wq_j = w[j] * q(j);
          return Terms<T, 2>{{select(wq_j == T(0), T(0), wq_j * x(j)), wq_j}};
        },
        neg_q, &most_negative, ahead);
    *qs = in.template sum<T>(n, q);
  } else {
    s = in.template sums_max<T, 2>(
        n,
        [q, x](std::int64_t j) {
          const T q_j = q(j);
          return Terms<T, 2>{{select(q_j == T(0), T(0), q_j * x(j)), q_j}};
        },
        neg_q, &most_negative, ahead);
    *qs = s.v[1];
  }
  *t = s.v[0];
  *wq = s.v[1];
  if (most_negative > T(0)) *qs = neg_inf<T>();
}

/// probability_sums of row i of a's logits (transformed as a.p says) and target probabilities. On the host, rows
/// of float16 go in pieces of chunk_cols columns, each piece of q and of the logits widened to float first
/// (HostInner::widen: F16C's vcvtph2ps where the build has it), the pieces' sums added in double; the same
/// pieces without F16C, so that the bits do not depend on the ISA. Read in the loops, float16 in software took
/// ~10 integer operations per vector for each row: float16 probability targets cost 2.8x the plain call in cache
/// on a Zen 4, bfloat16 1.6x (perf_tests/NOTES.md, issue 12, twenty-sixth round).
template <Transform Xf, class S, class T, class MemSpace, class Inner>
KOKKOS_INLINE_FUNCTION void row_probability_sums(const Inner& in, const KernelArgs<S, T, MemSpace>& a, std::int64_t i,
                                                 T* t, T* qs, T* wq) {
  const S* x = a.x + i * a.ld_x;
  const S* qr = a.q + i * a.ld_q;
  const Params<T> p = a.p;  // the lambdas hold their values: by reference GCC gathered them per column
  const T* w = p.weights == nullptr ? nullptr : p.weights + a.begin;
  const Ahead<read_hint<S>> ahead = Ahead<read_hint<S>>::of(qr);
  if constexpr (std::is_same_v<S, float16> && is_host_inner_v<Inner>) {
    double sum_t = 0, sum_q = 0, sum_wq = 0;
    bool negative = false;
    for (std::int64_t j0 = 0; j0 < a.n; j0 += chunk_cols) {
      const std::int64_t len = j0 + chunk_cols < a.n ? chunk_cols : a.n - j0;
      alignas(64) float qw[chunk_cols], xw[chunk_cols];
      Inner::widen(len, qr + j0, qw, ahead.from(j0));
      Inner::widen(len, x + j0, xw, Ahead<Hint::l2>{});  // in cache after the statistics
      const Widened<false> xc{xw};
      T piece_t, piece_q, piece_wq;
      probability_sums<T>(
          in, len, Widened<false>{qw}, [xc, p](std::int64_t j) { return p.template transform<Xf>(xc(j)); },
          w == nullptr ? nullptr : w + j0, &piece_t, &piece_q, &piece_wq, Ahead<Hint::l2>{});
      sum_t += double(piece_t);
      sum_wq += double(piece_wq);
      negative = negative || piece_q == neg_inf<T>();
      sum_q += double(piece_q);
    }
    *t = T(sum_t);
    *wq = T(sum_wq);
    *qs = negative ? neg_inf<T>() : T(sum_q);
  } else {
    probability_sums<T>(
        in, a.n, [qr](std::int64_t j) { return to_compute(qr[j]); },
        [x, p](std::int64_t j) { return p.template transform<Xf>(to_compute(x[j])); }, w, t, qs, wq, ahead);
  }
}

/// row_probability_sums, not inlined on the host (everything it calls is: VPCE_FLATTEN's reason): inlined into
/// the statistics' row (LocalStats), it cost their loop 2% in calls without probability targets (fp32
/// `loss_and_grad` in cache on a Zen 4).
template <Transform Xf, class S, class T, class MemSpace, class Inner>
KOKKOS_INLINE_FUNCTION void row_probability_sums_apart(const Inner& in, const KernelArgs<S, T, MemSpace>& a,
                                                       std::int64_t i, T* t, T* qs, T* wq) {
  Apart<Inner::isa, true>::call([&] { row_probability_sums<Xf>(in, a, i, t, qs, wq); });
}

/// The records a statistics kernel writes (one per row) and Finalize reads (the merged ones), flat.
template <class T, class MemSpace>
using records_view = Kokkos::View<T*, MemSpace>;
/// Per row and chunk of the host's stored exps: the max they are relative to (N x num_chunks(V_local)).
template <class T, class MemSpace>
using chunk_max_view = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;
/// The seed strategy's per-row statistics: N x 4 (max, sum, target logit, logit sum), a column per collective;
/// N x 5 with the entropy's h.
template <class T, class MemSpace>
using seed_stats_view = Kokkos::View<T**, Kokkos::LayoutLeft, MemSpace>;

/// Local (m, s, t, a) of each row (row_stats.hpp), a NaN/+inf row marked (status.hpp), from one read of the
/// row: the inner policy's online_stats (the host's, chunk by chunk, can also store the exps).
template <class S, class T, class MemSpace, Transform Xf>
class LocalStats {
  static_assert(std::is_same_v<T, compute_type_t<S>>, "T is the compute type of S");

 public:
  /// Statistics only.
  LocalStats(const KernelArgs<S, T, MemSpace>& args, const Records<T, MemSpace>& out) : m_a(args), m_out(out) {}
  /// Statistics, and (on the host) the exps of row i stored at exps.row(i), with chunk_max(i, c) the max that
  /// chunk c's exps are relative to.
  LocalStats(const KernelArgs<S, T, MemSpace>& args, const Records<T, MemSpace>& out, const RowPtr<T>& exps,
             const chunk_max_view<T, MemSpace>& chunk_max)
      : m_a(args), m_out(out), m_exps(exps), m_chunk_max(chunk_max) {}
  /// The same statistics, the exps stored at exps.row(i) instead.
  KOKKOS_INLINE_FUNCTION LocalStats with_exps(const RowPtr<T>& exps) const {
    LocalStats s = *this;
    s.m_exps = exps;
    return s;
  }

  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t i) const {
    row(in, i, NoPace{});
  }
  /// The same, pace(j) told the columns read as it goes (HostInner::online_stats).
  template <class Inner, class P>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t i, const P& pace) const {
    if constexpr (is_host_inner_v<Inner> && !widens_v<Logits<S>, Inner::isa>) {
      if (m_a.p.alpha > T(0) && !m_a.p.entropy) return row_folded(in, i, pace);
    }
    row_as<false>(in, i, pace);
  }

 private:
  /// Label smoothing's row on the host (without the entropy): its sum of x in the exps' pass
  /// (HostInner::online_stats_folded; fp32 smoothing 0.79-0.84x in time at N 4096 x V_local 32768, with class
  /// weights 0.74-0.79x, bfloat16 0.88 / 0.81x on a Zen 4), out of line, so that the other rows' loops are the
  /// code they were (with the folded forms inlined beside them, fp32 `loss_and_grad` without smoothing ran 9%
  /// slower at 2 ranks x 1 thread). Not for logits widened chunk by chunk (float16 with F16C): their sum of x
  /// reads the widened chunk from L1 and costs little, and the branch to this call cost their other rows 3%.
  template <class Inner, class P>
  KOKKOS_INLINE_FUNCTION void row_folded(const Inner& in, std::int64_t i, const P& pace) const {
    Apart<Inner::isa, true>::call([&] { row_as<true>(in, i, pace); });
  }

 public:
  /// The row with the fold or without it, inline (row() picks; the vectorisation probes call both forms).
  template <bool Folded, class Inner, class P>
  KOKKOS_FORCEINLINE_FUNCTION void row_as(const Inner& in, std::int64_t i, const P& pace) const {
    const S* x = m_a.x + i * m_a.ld_x;
    const Params<T>& p = m_a.p;
    const std::int64_t c = m_a.local_target(i);
    const T t = c >= 0 ? p.template transform<Xf>(to_compute(x[c])) : T(0);
    const bool smoothing = p.alpha > T(0);
    T* const e = m_exps.data == nullptr ? nullptr : m_exps.row(i);
    // In place over logits of the compute type: the strategy's decision (FusedStrategy::keeps_exps_in_logits,
    // never with the entropy), seen here as the exps' row being the logits' own. Never for a row that stores
    // no exps, so that no copy of the loops assumes x null.
    bool over_logits = false;
    if constexpr (std::is_same_v<S, T>) over_logits = e != nullptr && e == x;
    // The two calls spell their arguments out: the same lambdas named once made the row 5 KB larger and fp32's
    // forward 7% slower in cache.
    OnlineStats<T> o;
    if constexpr (Folded) {
      o = in.template online_stats_folded<T, sum_lanes<S>, exp_accuracy<S>>(
          m_a.n, Logits<S>{x}, [&](T z) { return p.template transform<Xf>(z); },
          p.weights == nullptr ? nullptr : p.weights + m_a.begin, e, over_logits,
          [&](std::int64_t chunk, T m) { m_chunk_max(i, chunk) = m; }, Ahead<read_hint<S>>::of(x), pace);
    } else {
      o = in.template online_stats<T, sum_lanes<S>, exp_accuracy<S>>(
          m_a.n, Logits<S>{x}, [&](T z) { return p.template transform<Xf>(z); }, smoothing,
          p.weights == nullptr ? nullptr : p.weights + m_a.begin, p.entropy, e, over_logits,
          [&](std::int64_t chunk, T m) { m_chunk_max(i, chunk) = m; }, Ahead<read_hint<S>>::of(x), pace);
    }
    RowStats<T> r = mark_row(o.m, o.s, t, smoothing ? o.sx : T(0), p.entropy ? o.h : T(0), o.zmax);
    if (m_a.probs) row_probability_sums_apart<Xf>(in, m_a, i, &r.t, &r.q, &r.wq);  // the row still in cache
    in.single([&]() { m_out.store(i, r); });
  }

 private:
  KernelArgs<S, T, MemSpace> m_a;
  Records<T, MemSpace> m_out;
  RowPtr<T> m_exps;
  chunk_max_view<T, MemSpace> m_chunk_max;
};

/// The seed strategy's first pass: the local max only (marked +inf if the row holds +inf: status.hpp).
template <class S, class T, class MemSpace, Transform Xf>
class LocalMax {
 public:
  LocalMax(const KernelArgs<S, T, MemSpace>& args, const seed_stats_view<T, MemSpace>& out) : m_a(args), m_out(out) {}
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t i) const {
    const S* x = m_a.x + i * m_a.ld_x;
    const T zmax = in.template max<T>(m_a.n, [&](std::int64_t j) { return to_compute(x[j]); });
    in.single([&]() { m_out(i, 0) = seed_row_max(zmax, m_a.p.template transform<Xf>(zmax)); });
  }

 private:
  KernelArgs<S, T, MemSpace> m_a;
  seed_stats_view<T, MemSpace> m_out;
};

/// The seed strategy's second pass: sum of exp against the GLOBAL max (column 0), the target logit, the
/// logit sum.
template <class S, class T, class MemSpace, Transform Xf>
class LocalSumGather {
 public:
  LocalSumGather(const KernelArgs<S, T, MemSpace>& args, const seed_stats_view<T, MemSpace>& stats)
      : m_a(args), m_out(stats) {}
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t i) const {
    const S* x = m_a.x + i * m_a.ld_x;
    const Params<T>& p = m_a.p;
    const T m = m_out(i, 0);
    T s = 0;
    if (seed_max_is_marked(m)) {
      s = m - m;  // +inf somewhere in the row: NaN on every rank
    } else if (m == neg_inf<T>()) {
      s = in.template sum<T>(m_a.n, [&](std::int64_t j) { return nan_or_zero(to_compute(x[j])); });
    } else {
      s = in.template sum<T>(m_a.n, [&](std::int64_t j) {
        return fast_exp_no_overflow<exp_accuracy<S>, Inner::isa>(p.template transform<Xf>(to_compute(x[j])) - m);
      });
    }
    T sum_x = 0;
    if (p.alpha > T(0) && p.weights != nullptr) {
      const T* w = p.weights + m_a.begin;
      sum_x =
          in.template sum<T>(m_a.n, [&](std::int64_t j) { return w[j] * p.template transform<Xf>(to_compute(x[j])); });
    } else if (p.alpha > T(0)) {
      sum_x = in.template sum<T>(m_a.n, [&](std::int64_t j) { return p.template transform<Xf>(to_compute(x[j])); });
    }
    T h = 0;  // the entropy's sum of e (x - m) against the global max (a finite one; else the row is marked)
    if (p.entropy && m != neg_inf<T>() && !seed_max_is_marked(m)) {
      h = in.template sum<T>(m_a.n, [&](std::int64_t j) {
        const T u = p.template transform<Xf>(to_compute(x[j])) - m;
        const T e = fast_exp_no_overflow<exp_accuracy<S>, Inner::isa>(u);
        return select(e == T(0), T(0), e * u);
      });
    }
    const std::int64_t c = m_a.local_target(i);
    const T t = c >= 0 ? p.template transform<Xf>(to_compute(x[c])) : T(0);
    in.barrier();
    in.single([&]() {
      m_out(i, 1) = s;
      m_out(i, 2) = t;  // with probability targets, TargetProbSums writes it after
      m_out(i, 3) = sum_x;
      if (p.entropy) m_out(i, RecordLayout{m_a.probs, true}.h()) = h;
    });
  }

 private:
  KernelArgs<S, T, MemSpace> m_a;
  seed_stats_view<T, MemSpace> m_out;
};

/// With probability targets, the seed strategy's pass after LocalSumGather: the sums of each row's target
/// probabilities (probability_sums) into its columns 2, 4, 5 (the fused strategy's LocalStats forms them with
/// the statistics).
template <class S, class T, class MemSpace, Transform Xf>
class TargetProbSums {
 public:
  TargetProbSums(const KernelArgs<S, T, MemSpace>& args, const seed_stats_view<T, MemSpace>& seed)
      : m_a(args), m_seed(seed) {}
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t i) const {
    T t, qs, wq;
    row_probability_sums<Xf>(in, m_a, i, &t, &qs, &wq);
    in.single([&]() {
      m_seed(i, 2) = t;
      m_seed(i, 4) = qs;
      m_seed(i, 5) = wq;
    });
  }

 private:
  KernelArgs<S, T, MemSpace> m_a;
  seed_stats_view<T, MemSpace> m_seed;
};

/// What the checks of the targets found (one pass over N int64 values).
struct TargetCheck {
  std::int64_t first_bad = 0;  ///< the first row whose target is outside [0, V) and not ignore_index, or N
  std::int64_t checksum = 0;   ///< order-independent hash of (row, target): ranks with other targets differ
  std::int64_t n_valid = 0;    ///< rows whose target is not ignore_index
};

template <class ExecSpace, class MemSpace>
TargetCheck check_targets(const ExecSpace& exec, const Kokkos::View<const std::int64_t*, MemSpace>& targets,
                          std::int64_t vocab, std::int64_t ignore) {
  const std::int64_t n = targets.extent(0);
  using policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  std::int64_t first_bad = n;
  Kokkos::parallel_reduce(
      "vpce::check_targets", policy(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & lo) {
        const std::int64_t t = targets(i);
        if ((t < 0 || t >= vocab) && t != ignore && i < lo) lo = i;
      },
      Kokkos::Min<std::int64_t>(first_bad));
  std::uint64_t sum = 0;
  Kokkos::parallel_reduce(
      "vpce::checksum_targets", policy(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i, std::uint64_t & acc) {
        std::uint64_t h =
            static_cast<std::uint64_t>(targets(i)) * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i);
        h ^= h >> 31;
        acc += h * 0xBF58476D1CE4E5B9ull;
      },
      sum);
  std::int64_t n_valid = 0;
  Kokkos::parallel_reduce(
      "vpce::count_valid", policy(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & c) { c += targets(i) != ignore ? 1 : 0; }, n_valid);
  // The Min reducer starts from the largest int64: no bad row leaves it there.
  return {first_bad < n ? first_bad : n, static_cast<std::int64_t>(sum >> 1), n_valid};
}

/// Sum of a View in double, in row order on the host: the same bits whatever the number of threads.
template <class ExecSpace, class View>
double ordered_sum(const ExecSpace& exec, const View& v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(exec, h, v);
  exec.fence();
  double s = 0;
  for (std::size_t i = 0; i < h.extent(0); ++i) s += double(h(i));
  return s;
}

/// Per-row incoming gradient: a View (one value per row) or one scalar for all rows.
template <class T, class MemSpace>
struct GradScale {
  Kokkos::View<const T*, MemSpace> per_row;
  T value = 1;
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t i) const { return per_row.extent(0) ? per_row(i) : value; }
};

enum class Source { logits, stored_exp };

/// Where Finalize writes the loss and lse of each row; none() for backward(), which writes neither.
template <class T, class MemSpace>
struct LossOut {
  Kokkos::View<T*, MemSpace> loss, lse;
  bool write = true;
  static LossOut none() { return {{}, {}, false}; }
};

/// The host's stored exps (Source::stored_exp): row i's at exps.row(i), chunk c relative to chunk_max(i, c).
template <class T, class MemSpace>
struct StoredExps {
  RowPtr<const T> exps;
  Kokkos::View<const T**, Kokkos::LayoutRight, MemSpace> chunk_max;
};

/// After the collective: loss and lse per row (LossOut), and by `What` the stash or the gradient.
/// The gradient row is (p_j (C + 2 zeta lse + beta (mu - x_j)) - c_j) * dx_j/dz_j * g_i (zero for an ignored
/// row), with c the target distribution (docs/design.md, section 1: (1 - alpha) onehot + alpha / V, times
/// the class weights; with probability targets (1 - alpha) q + alpha / V) and C = sum_j c_j (1 without
/// weights), mu = sum_j p_j x_j; the loss adds beta H, the entropy H = lse - mu = log(s) - h / s from the
/// record. The stash holds the same with g = 1 and without the target term, whose coefficient
/// (1 - alpha) w_t dx_c/dz_c goes to `stash_target`; backward() then needs only the stash.
/// Source::logits: p computed from the logits (y may be the logits' own buffer). Source::stored_exp: from
/// the exps the statistics stored (no softcap, no probability targets), rescaled by exp(m_c - lse).
template <class S, class T, class G, class MemSpace, Write What, Source From, Transform Xf>
class Finalize {
  static_assert(std::is_same_v<T, compute_type_t<S>>, "T is the compute type of S");
  static_assert(std::is_same_v<G, T> || std::is_same_v<G, S>, "rows are written in the compute or the logits' type");
  static_assert(What != Write::stash || std::is_same_v<G, T>, "the stash is kept in the compute type");
  static_assert(From == Source::logits || Xf != Transform::softcap, "stored exps are not used with the softcap");

 public:
  /// y: the stash or gradient rows (What != Write::loss); stash_target: per row (Write::stash only).
  Finalize(const KernelArgs<S, T, MemSpace>& args, const Records<const T, MemSpace>& stats,
           const LossOut<T, MemSpace>& out, const RowPtr<G>& y, const GradScale<T, MemSpace>& g,
           const Kokkos::View<T*, MemSpace>& stash_target, const StoredExps<T, MemSpace>& stored, Store store)
      : m_a(args),
        m_stats(stats),
        m_out(out),
        m_y(y),
        m_g(g),
        m_stash_target(stash_target),
        m_stored(stored),
        m_store(store) {}
  /// The same rows, their stored exps read at exps.row(i) instead.
  KOKKOS_INLINE_FUNCTION Finalize with_exps(const RowPtr<const T>& exps) const {
    Finalize f = *this;
    f.m_stored.exps = exps;
    return f;
  }

  /// Whether the gradient (or stash) of a row can be written piecewise, in step with another kernel
  /// (begin, write, end): from stored exps.
  static constexpr bool piecewise = From == Source::stored_exp && What != Write::loss;

  /// A row's constants, from its merged record (row(), and begin() for the piecewise writes).
  struct Row {
    std::int64_t i;
    RowStats<T> r;
    T l, mu, w_t, c_lse;
    bool valid;
    // What != Write::loss: the row written, the coefficients of p_j (kp), of the smoothing (ka) and of the
    // target (kt), g_i, the target column c (or -1), its dx/dz, the column that gets the target term (or
    // -1) and, from stored exps, that column's value; xc: the target's x.
    G* yr;
    const S* x;
    T gi, kp, ka, kt, xc, chain_c, fix;
    std::int64_t c, fix_at;
  };

  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t i) const {
    const Row k = begin(i);
    if constexpr (What != Write::loss) {
      in.barrier();  // a team: every thread has read the target's logit before the row is written
      if constexpr (piecewise) {
        write(in, k, 0, m_a.n);
      } else if (What == Write::grad && !k.valid) {
        in.store(
            m_a.n, k.yr, [&](std::int64_t) { return T(0); }, -1, G(T(0)), m_store);
      } else {
        write_from_logits(in, k);
      }
    }
    end(in, k);
  }

  /// The piecewise form of row(i) (`piecewise`): begin(i), then write(in, k, a, b) for consecutive column
  /// ranges covering the row, then end(in, k). The target column's value is formed in begin(), before any of
  /// the row is written (in place, the row is the logits').
  KOKKOS_INLINE_FUNCTION Row begin(std::int64_t i) const {
    Row k = constants(i);
    if constexpr (piecewise) k.fix = stored_fix(k);
    return k;
  }
  /// Columns [a, b) of the row's gradient (stash); `fence`: as Inner::store's (the last piece of a row must
  /// fence).
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void write(const Inner& in, const Row& k, std::int64_t a, std::int64_t b,
                                    bool fence = true) const {
    static_assert(piecewise, "rows from stored exps");
    if (What == Write::grad && !k.valid) {
      in.store(
          b - a, k.yr + a, [&](std::int64_t) { return T(0); }, -1, G(T(0)), m_store, {}, fence);
    } else {
      write_stored(in, k, a, b, fence);
    }
  }
  /// The stash's target coefficient, the loss and the lse of the row.
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void end(const Inner& in, const Row& k) const {
    const Params<T>& p = m_a.p;
    if constexpr (What == Write::stash) in.single([&]() { m_stash_target(k.i) = k.kt * k.chain_c; });
    if (m_out.write) {
      in.single([&]() {
        const RowStats<T>& r = k.r;
        const T l = k.l;
        m_out.lse(k.i) = l;
        // Weighted: (1 - A) w_t (lse - x_t) + A / V (W lse - sum_j w_j x_j), i.e. c_lse lse - ... .
        T loss = p.weights != nullptr || m_a.probs
                     ? k.c_lse * l - (T(1) - p.alpha) * k.w_t * r.t - p.alpha * p.inv_vocab * r.a + p.zeta * l * l
                     : l - (T(1) - p.alpha) * r.t - p.alpha * p.inv_vocab * r.a + p.zeta * l * l;
        if (p.beta != T(0)) loss += p.beta * (kmath::log(r.s) - k.mu);
        m_out.loss(k.i) = k.valid ? loss : T(0);
      });
    }
  }

 private:
  KOKKOS_INLINE_FUNCTION Row constants(std::int64_t i) const {
    const Params<T>& p = m_a.p;
    Row k{};
    k.i = i;
    k.r = m_stats.load(i);
    k.l = k.r.m + kmath::log(k.r.s);
    k.mu = k.r.h / k.r.s;  // E[x] - m: the entropy is log(s) - mu
    k.valid = m_a.valid(i);
    // With class weights: the target's weight w_t, and lse's coefficient (1 - A) w_t + A W / V (else 1).
    // With probability targets: (1 - A) sum_j w_j q_j + A W / V, w_j = 1 without class weights.
    const bool weighted = p.weights != nullptr;
    k.w_t = weighted && k.valid && !m_a.probs ? p.weights[m_a.targets(i)] : T(1);
    k.c_lse = weighted ? (T(1) - p.alpha) * k.w_t + p.alpha * p.w_over_v : T(1);
    if (m_a.probs) k.c_lse = (T(1) - p.alpha) * k.r.wq + p.alpha * p.w_over_v;
    k.c = k.fix_at = -1;
    if constexpr (What != Write::loss) {
      k.yr = m_y.row(i);
      k.x = m_a.x + i * m_a.ld_x;
      k.gi = What == Write::stash ? T(1) : (k.valid ? m_g(i) : T(0));
      k.kp = k.gi * (k.c_lse + T(2) * p.zeta * k.l);  // coefficient of p_j
      k.ka = k.gi * p.alpha * p.inv_vocab;            // smoothing term, every column (times w_j if weighted)
      k.kt = weighted ? k.gi * (T(1) - p.alpha) * k.w_t : k.gi * (T(1) - p.alpha);  // target term
      k.c = m_a.local_target(i);
      // The target's dx/dz, from its x read before the row (which may alias the logits) is overwritten.
      k.xc = k.c >= 0 ? p.template transform<Xf>(to_compute(k.x[k.c])) : T(0);
      k.chain_c = k.c >= 0 ? p.template chain<Xf>(k.xc) : T(0);
      // The column whose value gets the target term (formed in T and rounded once), or -1.
      k.fix_at = What == Write::grad && k.valid ? k.c : -1;
    }
    return k;
  }

  /// Source::logits: the row's gradient (stash) with p computed from the logits.
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void write_from_logits(const Inner& in, const Row& k) const {
    const Params<T>& p = m_a.p;
    const T gi = k.gi, kp = k.kp, ka = k.ka, kt = k.kt, chain_c = k.chain_c, l = k.l, mu = k.mu, xc = k.xc;
    const std::int64_t c = k.c, fix_at = k.fix_at;
    const RowStats<T>& r = k.r;
    G* yr = k.yr;
    const S* x = k.x;
    const bool weighted = p.weights != nullptr;
    // y_j = (term(x_j) - smooth(j)) dx_j/dz_j, and the target's value formed apart (fix).
    // term(x_j, e) with e = exp(x_j - lse). The lambdas of the row's loop (and ExpValue) hold their scalars by
    // value: held by reference, GCC reloaded them from the stack in the loop (the backward in cache on a Zen 4:
    // fp32 -12%, bfloat16 -9%, float16 -6% by value; perf_tests/NOTES.md, issue 12, twenty-fourth round).
    constexpr ExpAccuracy A = exp_accuracy<S>;
    constexpr Isa L = Inner::isa;
    auto target_fix = [&](const auto& term, const auto& smooth) {
      return G(c >= 0 ? ((term(xc, exp_per_element<A, L>(xc - l)) - smooth(c)) - kt) * chain_c : T(0));
    };
    auto write_row = [&](const auto& term, const auto& smooth) {
      const G fix = target_fix(term, smooth);
      auto xs = [p, x](std::int64_t j) { return p.template transform<Xf>(to_compute(x[j])); };
      auto value = [term, smooth, p](std::int64_t j, T xj, T e) {
        return (term(xj, e) - smooth(j)) * p.template chain<Xf>(xj);
      };
      // ExpValue only where its exps go 16 at a time: as the value of every type it cost the bfloat16 backward
      // 4% in cache with the same exps (perf_tests/NOTES.md, issue 12, twenty-second round).
      if constexpr (exp_in_lanes<T, A, L>) {
        in.store(m_a.n, yr, ExpValue<T, A, L, decltype(xs), decltype(value)>{xs, l, value}, fix_at, fix, m_store,
                 Ahead<read_hint<S>>::of(x));
      } else if constexpr (have_widen_hw<S, L>) {
        auto transform = [p](T z) { return p.template transform<Xf>(z); };
        in.store(m_a.n, yr, WidenedExpValue<T, A, L, S, decltype(transform), decltype(value)>{x, transform, l, value},
                 fix_at, fix, m_store, Ahead<read_hint<S>>::of(x));
      } else {
        in.store(
            m_a.n, yr,
            [=](std::int64_t j) {
              const T xj = xs(j);
              return value(j, xj, exp_per_element<A, L>(xj - l));
            },
            fix_at, fix, m_store, Ahead<read_hint<S>>::of(x));
      }
    };
    auto softmax = [kp](T, T e) { return e * kp; };
    // The entropy's term p_j beta (mu - x_j): 0 where p_j is 0 (a -inf logit).
    const T kb = gi * p.beta;
    auto entropic = [kp, kb, mu, rm = r.m](T xj, T e) {
      return select(e == T(0), T(0), e * (kp + kb * (mu - (xj - rm))));
    };
    // The terms of the target distribution at column j: A w_j / V, and with probability targets
    // (1 - A) w_j q_j (w_j = 1 without class weights).
    auto smooth = [ka](std::int64_t) { return ka; };
    const T* w = weighted ? p.weights + m_a.begin : nullptr;
    auto smooth_weighted = [ka, w](std::int64_t j) { return ka * w[j]; };
    const S* qr = q_row(k.i);
    const T kq = gi * (T(1) - p.alpha);
    auto probs = [ka, kq, qr](std::int64_t j) { return ka + kq * to_compute(qr[j]); };
    auto probs_weighted = [ka, kq, qr, w](std::int64_t j) { return (ka + kq * to_compute(qr[j])) * w[j]; };
    // Where the host widens float16 by F16C (write_row's WidenedExpValue), the row's q too, a chunk at a time
    // first, as write_stored does: read in the loop, each vector of q took ~10 integer operations (the backward
    // with probability targets 2.7x slower in cache on a Zen 5; perf_tests/NOTES.md, issue 12, fortieth round).
    auto write_probs = [&](const auto& term, const auto& smooth) {
      if constexpr (have_widen_hw<S, L> && is_host_inner_v<Inner>) {
        const G fix = target_fix(term, smooth);
        auto transform = [p](T z) { return p.template transform<Xf>(z); };
        for (std::int64_t c0 = 0; c0 < m_a.n; c0 += chunk_cols) {
          const std::int64_t len = m_a.n - c0 < chunk_cols ? m_a.n - c0 : chunk_cols;
          alignas(64) float qw[chunk_cols];
          Inner::widen(len, qr + c0, qw, Ahead<Hint::l2>{});
          auto write = [&](const auto& smooth_c) {  // smooth_c(j): column c0 + j's
            auto value = [term, smooth_c, p](std::int64_t j, T xj, T e) {
              return (term(xj, e) - smooth_c(j)) * p.template chain<Xf>(xj);
            };
            in.store(len, yr + c0,
                     WidenedExpValue<T, A, L, S, decltype(transform), decltype(value)>{x + c0, transform, l, value},
                     fix_at - c0, fix, m_store, Ahead<read_hint<S>>::of(x + c0), c0 + len == m_a.n);
          };
          const float* qc = qw;
          if (weighted) {
            write([ka, kq, qc, wc = w + c0](std::int64_t j) { return (ka + kq * qc[j]) * wc[j]; });
          } else {
            write([ka, kq, qc](std::int64_t j) { return ka + kq * qc[j]; });
          }
        }
      } else {
        write_row(term, smooth);
      }
    };
    auto with_term = [&](const auto& term) {
      if (qr != nullptr && weighted) {
        write_probs(term, probs_weighted);
      } else if (qr != nullptr) {
        write_probs(term, probs);
      } else if (weighted && p.alpha > T(0)) {
        write_row(term, smooth_weighted);
      } else {
        write_row(term, smooth);
      }
    };
    if (p.beta == T(0)) {
      with_term(softmax);
    } else {
      with_term(entropic);
    }
  }

  /// Source::stored_exp: p_j = e_j exp(m_c - lse), e_j the stored exp of column j relative to its chunk's max
  /// m_c. Per chunk: f = exp(m_c - lse) kp S, fb = exp(m_c - lse) kb S, d = mu + M - m_c.
  struct ChunkK {
    T f, fb, d, m_c;
  };
  KOKKOS_INLINE_FUNCTION ChunkK chunk_k(const Row& k, std::int64_t j) const {
    const Params<T>& p = m_a.p;
    const T m_c = m_stored.chunk_max(k.i, j / chunk_cols),
            big_f = fast_exp_no_overflow<ExpAccuracy::full, Isa::build>(m_c - k.l);
    return ChunkK{big_f * k.kp * p.scale, big_f * k.gi * p.beta * p.scale, k.mu + (k.r.m - m_c), m_c};
  }
  /// f(term, smooth) for the columns from j0 on, column j0 + j's softmax part term(e, j, chunk constants) from
  /// its stored exp e, and the terms of the target distribution smooth(j), both times dx/dz = S; q(j) and z(j)
  /// read that column's target probability and logit. With an entropy weight the term p_j beta (mu - x_j) needs
  /// x_j: read from the logits (still in cache), and mu - x_j formed as (mu + M - m_c) - (x_j - m_c) against the
  /// chunk's max. With class weights and smoothing the smoothing term is k0 w_j (the weights read beside the
  /// exps); with probability targets (k0 + kq q_j) w_j, the row of q read beside the exps (w_j = 1 without class
  /// weights).
  template <class Q, class Z, class F>
  KOKKOS_INLINE_FUNCTION void with_stored_terms(const Row& k, std::int64_t j0, const Q& q, const Z& z,
                                                const F& f) const {
    static_assert(Xf != Transform::softcap, "x_j = S z_j here");
    const Params<T>& p = m_a.p;
    const T k0 = k.ka * p.scale, kq = k.gi * (T(1) - p.alpha) * p.scale;
    const bool probs = m_a.q != nullptr;
    const T* w = p.weights != nullptr && (p.alpha > T(0) || probs) ? p.weights + m_a.begin + j0 : nullptr;
    // Scalars held by value, as in write_from_logits.
    auto softmax = [](T e, std::int64_t, const ChunkK& ck) { return e * ck.f; };
    auto entropic = [z, scale = p.scale](T e, std::int64_t j, const ChunkK& ck) {
      const T xj = z(j) * scale;
      return select(e == T(0), T(0), e * (ck.f + ck.fb * (ck.d - (xj - ck.m_c))));
    };
    auto smooth = [k0](std::int64_t) { return k0; };
    auto smooth_weighted = [k0, w](std::int64_t j) { return k0 * w[j]; };
    auto target_probs = [k0, kq, q](std::int64_t j) { return k0 + kq * q(j); };
    auto target_probs_weighted = [k0, kq, q, w](std::int64_t j) { return (k0 + kq * q(j)) * w[j]; };
    auto with_smooth = [&](const auto& term) {
      if (probs && w != nullptr) {
        f(term, target_probs_weighted);
      } else if (probs) {
        f(term, target_probs);
      } else if (w != nullptr) {
        f(term, smooth_weighted);
      } else {
        f(term, smooth);
      }
    };
    if (p.beta == T(0)) {
      with_smooth(softmax);
    } else {
      with_smooth(entropic);
    }
  }
  /// Row i's target probabilities, or null.
  KOKKOS_INLINE_FUNCTION const S* q_row(std::int64_t i) const {
    return m_a.q == nullptr ? nullptr : m_a.q + i * m_a.ld_q;
  }
  /// The value of the target column (fix_at), formed apart, or 0.
  KOKKOS_INLINE_FUNCTION T stored_fix(const Row& k) const {
    if constexpr (From == Source::stored_exp) {
      T fix = T(0);
      if (k.fix_at >= 0) {
        with_stored_terms(k, 0, Logits<S>{q_row(k.i)}, Logits<S>{k.x}, [&](const auto& term, const auto& smooth) {
          fix = term(m_stored.exps.row(k.i)[k.c], k.c, chunk_k(k, k.c)) - smooth(k.c) - k.kt * k.chain_c;
        });
      }
      return fix;
    } else {
      (void)k;
      return T(0);
    }
  }
  /// Columns [a, b) of a valid row from the stored exps, a chunk's constants at a time; one fence at the
  /// end if `fence`. Where the host widens float16 by F16C (have_widen_hw), a chunk's q and logits (for the
  /// entropy weight) are widened to float first, 16 columns a vcvtph2ps: read in the loop, each took ~10
  /// integer operations per vector (perf_tests/NOTES.md, issue 12, twenty-sixth round).
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void write_stored(const Inner& in, const Row& k, std::int64_t a, std::int64_t b,
                                           bool fence) const {
    const T* er = m_stored.exps.row(k.i);
    const S* qr = q_row(k.i);
    if constexpr (have_widen_hw<S, Inner::isa> && is_host_inner_v<Inner>) {
      for (std::int64_t c0 = a - a % chunk_cols; c0 < b; c0 += chunk_cols) {
        const std::int64_t j0 = c0 > a ? c0 : a, j1 = c0 + chunk_cols < b ? c0 + chunk_cols : b;
        const ChunkK ck = chunk_k(k, j0);
        const T* ec = er + j0;
        alignas(64) float qw[chunk_cols], zw[chunk_cols];
        if (qr != nullptr) Inner::widen(j1 - j0, qr + j0, qw, Ahead<Hint::l2>{});
        if (m_a.p.beta != T(0)) Inner::widen(j1 - j0, k.x + j0, zw, Ahead<Hint::l2>{});
        with_stored_terms(k, j0, Widened<false>{qw}, Widened<false>{zw}, [&](const auto& term, const auto& smooth) {
          in.store(
              j1 - j0, k.yr + j0, [=](std::int64_t j) { return term(ec[j], j, ck) - smooth(j); }, k.fix_at - j0,
              G(k.fix), m_store, {}, fence && j1 == b);
        });
      }
    } else {
      // The same loop with the row's terms formed once, outside it: formed per chunk, as above, they cost
      // bfloat16 `loss_and_grad` 2-5% (the code around the loop; in place at 1 rank x 2 threads on a Zen 4).
      with_stored_terms(k, 0, Logits<S>{qr}, Logits<S>{k.x}, [&](const auto& term, const auto& smooth) {
        for (std::int64_t c0 = a - a % chunk_cols; c0 < b; c0 += chunk_cols) {
          const std::int64_t j0 = c0 > a ? c0 : a, j1 = c0 + chunk_cols < b ? c0 + chunk_cols : b;
          const ChunkK ck = chunk_k(k, j0);
          const T* ec = er + j0;
          in.store(
              j1 - j0, k.yr + j0, [=](std::int64_t j) { return term(ec[j], j0 + j, ck) - smooth(j0 + j); },
              k.fix_at - j0, G(k.fix), m_store, {}, fence && j1 == b);
        }
      });
    }
  }

  KernelArgs<S, T, MemSpace> m_a;
  Records<const T, MemSpace> m_stats;
  LossOut<T, MemSpace> m_out;
  RowPtr<G> m_y;
  GradScale<T, MemSpace> m_g;
  Kokkos::View<T*, MemSpace> m_stash_target;
  StoredExps<T, MemSpace> m_stored;
  Store m_store;
};

/// A per-row output from the merged records and lse (RowOutput): the entropy log(s) - h / s of every row;
/// the target's log-softmax x_t - lse, and the z-loss term zeta lse^2, of each non-ignored row (else 0).
template <class T, class MemSpace>
struct RowOutputs {
  Records<const T, MemSpace> stats;
  Kokkos::View<const T*, MemSpace> lse;
  Kokkos::View<const std::int64_t*, MemSpace> targets;
  Kokkos::View<T*, MemSpace> out;
  RowOutput what;
  std::int64_t ignore_index;
  T zeta;
  bool probs;  ///< probability targets: every row counts (and logprob() is not asked for)
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const RowStats<T> r = stats.load(i);
    const bool valid = probs || targets(i) != ignore_index;
    if (what == RowOutput::entropy) {
      out(i) = kmath::log(r.s) - r.h / r.s;
    } else if (what == RowOutput::logprob) {
      out(i) = valid ? r.t - lse(i) : T(0);
    } else {
      out(i) = valid ? zeta * lse(i) * lse(i) : T(0);
    }
  }
};

/// y(i, j) = value for rows [0, rows) and columns [0, cols) (row stride ld): poisons outputs after an error.
template <class ExecSpace, class G>
void fill_rows(const char* label, const ExecSpace& exec, G* y, std::int64_t ld, std::int64_t rows, std::int64_t cols,
               G value) {
  if (rows <= 0 || cols <= 0) return;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, rows),
      KOKKOS_LAMBDA(std::int64_t i) {
        G* yr = y + i * ld;
        for (std::int64_t j = 0; j < cols; ++j) yr[j] = value;
      });
}

/// backward() from the stash: y_j = (q_j - [j == target] * stash_target_i) * g_i, zero for ignored rows.
template <class T, class G, class MemSpace>
class BackwardFromStash {
 public:
  /// args.x: the stash.
  BackwardFromStash(const KernelArgs<T, T, MemSpace>& args, const Kokkos::View<const T*, MemSpace>& stash_target,
                    const RowPtr<G>& y, const GradScale<T, MemSpace>& g, Store store)
      : m_a(args), m_stash_target(stash_target), m_y(y), m_g(g), m_store(store) {}
  template <class Inner>
  KOKKOS_INLINE_FUNCTION void row(const Inner& in, std::int64_t i) const {
    const T* q = m_a.x + i * m_a.ld_x;
    G* yr = m_y.row(i);
    const T gi = m_a.valid(i) ? m_g(i) : T(0);
    const std::int64_t c = m_a.local_target(i);
    const std::int64_t fix_at = c >= 0 && gi != T(0) ? c : -1;
    const G fix = G(fix_at >= 0 ? (q[c] - m_stash_target(i)) * gi : T(0));
    in.store(
        m_a.n, yr, [&](std::int64_t j) { return q[j] * gi; }, fix_at, fix, m_store, Ahead<read_hint<T>>::of(q));
  }

 private:
  KernelArgs<T, T, MemSpace> m_a;
  Kokkos::View<const T*, MemSpace> m_stash_target;
  RowPtr<G> m_y;
  GradScale<T, MemSpace> m_g;
  Store m_store;
};

}  // namespace vpce::impl
