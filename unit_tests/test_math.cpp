// The host math of the kernels (vpce/impl/math.hpp, vpce/half.hpp), element by element against the C
// library: fast_exp's relative error over the whole range it computes (at both of its accuracies), its out-of-range
// results and non-finite inputs; fast_tanh's absolute error; every float16 bit pattern through float and back; the
// host's rounding of lines of floats to bfloat16 and float16 (by the CPU's instructions where the build has
// them) against the scalar conversions. Compiled with the library's own flags (unit_tests/CMakeLists.txt).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "vpce/half.hpp"
#include "vpce/impl/kernels.hpp"
#include "vpce/impl/math.hpp"

namespace {

using vpce::impl::fast_exp;
using vpce::impl::fast_tanh;

using vpce::impl::ExpAccuracy;
using vpce::impl::Isa;

// f(level) for each level of the host policy this build and CPU run (HostInner<L>): the build's own, and where
// the build makes copies of the rows (VPCE_HOST_CLONES, impl/isa.hpp), those of them the CPU has, whose paths
// in intrinsics are helpers of their own. level: a std::integral_constant of the Isa.
template <class F>
void for_each_level(const F& f) {
  f(std::integral_constant<Isa, Isa::build>{});
#if VPCE_HOST_CLONES
  const Isa cpu = vpce::impl::cpu_level();
  if (cpu >= Isa::v3) f(std::integral_constant<Isa, Isa::v3>{});
  if (cpu >= Isa::v4) f(std::integral_constant<Isa, Isa::v4>{});
  if (cpu >= Isa::v4bf16) f(std::integral_constant<Isa, Isa::v4bf16>{});
#endif
}

using vpce::impl::in_level;  // f() compiled as the row loops of level L are

// The largest relative error of fast_exp<A> over every 61st float from lo (-86.98) up to ln(FLT_MAX) = 88.72
// (36 M values), and where it is.
template <ExpAccuracy A>
std::pair<double, float> float_exp_error() {
  double worst = 0;
  float at = 0;
  auto check = [&](std::uint32_t bits) {
    const float x = vpce::impl::from_bits(bits);
    const double ref = std::exp(double(x)), err = std::abs(double(fast_exp<A>(x)) - ref) / ref;
    if (err > worst) worst = err, at = x;
  };
  const std::uint32_t lo = vpce::impl::as_bits(-86.98f);  // the negative floats: bits grow with |x|
  const std::uint32_t hi = vpce::impl::as_bits(std::log(std::numeric_limits<float>::max()));
  for (std::uint32_t b = 0x80000000u; b <= lo; b += 61) check(b);
  for (std::uint32_t b = 0; b < hi; b += 61) check(b);
  return {worst, at};
}

TEST(Math, FastExpFloatRelativeError) {
  const auto [full, at_full] = float_exp_error<ExpAccuracy::full>();
  EXPECT_LT(full, 1.2e-7) << "at x = " << at_full;  // 1.0e-7 measured
  const auto [short16, at_short16] = float_exp_error<ExpAccuracy::input16>();
  EXPECT_LT(short16, 3.2e-6) << "at x = " << at_short16;  // 3.1e-6 measured with FMA, 2.9e-6 without
  EXPECT_GT(short16, full);                               // the shorter polynomial is the one taken
}

// double: a grid of 1.9 M points over [lo, ln(DBL_MAX)] against long double: 1.8e-16 measured.
TEST(Math, FastExpDoubleRelativeError) {
  double worst = 0, at = 0;
  for (double x = -708.0; x < 709.78; x += 7.31e-4) {
    const long double ref = std::exp(static_cast<long double>(x));
    const double err = double(std::abs(static_cast<long double>(fast_exp(x)) - ref) / ref);
    if (err > worst) worst = err, at = x;
  }
  EXPECT_LT(worst, 2.5e-16) << "at x = " << at;
}

template <class T, ExpAccuracy A = ExpAccuracy::full>
void expect_exp_specials() {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  auto exp = [](T x) { return fast_exp<A>(x); };
  EXPECT_EQ(exp(-inf), T(0));
  EXPECT_EQ(exp(inf), inf);
  EXPECT_TRUE(std::isnan(exp(nan)));
  EXPECT_TRUE(std::isnan(exp(-nan)));
  EXPECT_EQ(exp(T(0)), T(1));
  EXPECT_EQ(exp(-std::numeric_limits<T>::max()), T(0));
  EXPECT_EQ(exp(std::numeric_limits<T>::max()), inf);
  // Below lo: flushed to 0, never a subnormal or garbage from the scale's bits.
  const T lo = std::is_same_v<T, float> ? T(-86.98) : T(-708.0);
  EXPECT_EQ(exp(std::nextafter(lo, -inf)), T(0));
  EXPECT_GT(exp(lo), T(0));
  EXPECT_GE(exp(lo), std::numeric_limits<T>::min());
  // Up to overflow: finite, then +inf.
  const T top = std::log(std::numeric_limits<T>::max());
  EXPECT_TRUE(std::isfinite(exp(std::nextafter(top, T(0)) - T(1e-3) * top / T(100))));
  EXPECT_EQ(exp(top + T(1)), inf);
}

TEST(Math, FastExpSpecialValues) {
  expect_exp_specials<float>();
  expect_exp_specials<float, ExpAccuracy::input16>();
  expect_exp_specials<double>();
}

// fast_exp_no_overflow is fast_exp without the overflow select: the same bits for every x <= 89 (every 61st
// float from -inf up, and every double of a grid), and for -inf and NaN; at both accuracies.
template <ExpAccuracy A>
void expect_no_overflow_same_bits() {
  using vpce::impl::as_bits;
  auto no_overflow = [](float x) { return vpce::impl::fast_exp_no_overflow<A, Isa::build>(x); };
  std::uint64_t checked = 0;
  auto same_f = [&](float x) {
    ++checked;
    return as_bits(no_overflow(x)) == as_bits(fast_exp<A>(x));
  };
  const std::uint32_t top = as_bits(89.0f);
  for (std::uint32_t b = 0x80000000u; b <= 0xff800000u; b += 61) ASSERT_TRUE(same_f(vpce::impl::from_bits(b))) << b;
  for (std::uint32_t b = 0; b <= top; b += 61) ASSERT_TRUE(same_f(vpce::impl::from_bits(b))) << b;
  EXPECT_GT(checked, 40000000u);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(no_overflow(-inf), 0.0f);
  EXPECT_EQ(no_overflow(89.0f), fast_exp<A>(89.0f));
  EXPECT_TRUE(std::isnan(no_overflow(std::numeric_limits<float>::quiet_NaN())));
}

TEST(Math, FastExpNoOverflowSameBitsInRange) {
  using vpce::impl::as_bits;
  auto no_overflow = [](double x) { return vpce::impl::fast_exp_no_overflow<ExpAccuracy::full, Isa::build>(x); };
  expect_no_overflow_same_bits<ExpAccuracy::full>();
  expect_no_overflow_same_bits<ExpAccuracy::input16>();
  for (double x = -800.0; x <= 710.0; x += 1.37e-3) {
    ASSERT_EQ(as_bits(no_overflow(x)), as_bits(fast_exp(x))) << x;
  }
  EXPECT_EQ(no_overflow(-std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_TRUE(std::isnan(no_overflow(-std::numeric_limits<double>::quiet_NaN())));
}

// The table form of float's exp (exp_table_no_overflow, the exp per element of `full` on builds with
// VPCE_EXP_TABLE; tested on every build): its relative error over every 61st float of [lo, 88], and its
// values at -inf, NaN, 0 and below lo.
TEST(Math, ExpTableRelativeError) {
  using vpce::impl::exp_table_no_overflow;
  double worst = 0;
  float at = 0;
  auto check = [&](std::uint32_t bits) {
    const float x = vpce::impl::from_bits(bits);
    const double ref = std::exp(double(x)), err = std::abs(double(exp_table_no_overflow<Isa::build>(x)) - ref) / ref;
    if (err > worst) worst = err, at = x;
  };
  for (std::uint32_t b = 0x80000000u; b <= vpce::impl::as_bits(-86.98f); b += 61) check(b);
  for (std::uint32_t b = 0; b <= vpce::impl::as_bits(88.0f); b += 61) check(b);
  // 1.15e-7 measured (every 7th float) with its last step fused; 1.34e-7 (every 61st) where the build has no
  // FMA (a build for no CPU in particular), which only this test runs: the library takes the table form on
  // AVX-512 builds only (VPCE_EXP_TABLE), whose step is fused.
  EXPECT_LT(worst, VPCE_HOST_FMA ? 1.3e-7 : 1.4e-7) << "at x = " << at;
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_table_no_overflow<Isa::build>(-inf), 0.0f);
  EXPECT_EQ(exp_table_no_overflow<Isa::build>(0.0f), 1.0f);
  EXPECT_EQ(exp_table_no_overflow<Isa::build>(std::nextafter(-86.98f, -inf)), 0.0f);
  EXPECT_GE(exp_table_no_overflow<Isa::build>(-86.98f), std::numeric_limits<float>::min());
  EXPECT_TRUE(std::isnan(exp_table_no_overflow<Isa::build>(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(exp_table_no_overflow<Isa::build>(-std::numeric_limits<float>::quiet_NaN())));
}

// The exps per element of the host's loops at each level (exp_per_element<A, L>: the table form and the one-step
// reduction where the level has them), compiled as that level's loops are (in_level): largest relative error over
// every 61st float of [lo, 88], and their values at -inf, NaN, 0 and below lo.
template <ExpAccuracy A, vpce::impl::Isa L>
void expect_per_element_accurate(double bound) {
  using vpce::impl::exp_per_element;
  double worst = 0;
  float at = 0;
  const float inf = std::numeric_limits<float>::infinity();
  float special[4] = {-inf, 0.0f, std::nextafter(-86.98f, -inf), std::numeric_limits<float>::quiet_NaN()};
  in_level<L>([&] {
    auto check = [&](std::uint32_t bits) {
      const float x = vpce::impl::from_bits(bits);
      const double ref = std::exp(double(x)), err = std::abs(double(exp_per_element<A, L>(x)) - ref) / ref;
      if (err > worst) worst = err, at = x;
    };
    for (std::uint32_t b = 0x80000000u; b <= vpce::impl::as_bits(-86.98f); b += 61) check(b);
    for (std::uint32_t b = 0; b <= vpce::impl::as_bits(88.0f); b += 61) check(b);
    for (float& v : special) v = exp_per_element<A, L>(v);
  });
  EXPECT_LT(worst, bound) << "at x = " << at << ", level " << int(L);
  EXPECT_EQ(special[0], 0.0f);
  EXPECT_EQ(special[1], 1.0f);
  EXPECT_EQ(special[2], 0.0f);
  EXPECT_TRUE(std::isnan(special[3]));
}
TEST(Math, ExpPerElementAtEachLevel) {
  for_each_level([](auto level) {
    expect_per_element_accurate<ExpAccuracy::full, decltype(level)::value>(1.3e-7);
    expect_per_element_accurate<ExpAccuracy::input16, decltype(level)::value>(3.2e-6);
  });
}

// exp_lanes16 (16 exps at a time: a vector form where exp_in_lanes) gives exp_per_element's bits, which the
// scalar tails of the same loops take: every 61st float from -inf to 89, NaNs, -inf, lines of mixed values; at
// level L (for_each_level).
template <ExpAccuracy A, vpce::impl::Isa L>
void expect_lanes_same_bits() {
  using vpce::impl::as_bits;
  using vpce::impl::exp_per_element;
  using vpce::impl::from_bits;
  float u[16], e[16];
  std::uint64_t lines = 0;
  auto check = [&]() {
    ++lines;
    float want[16];
    in_level<L>([&] {  // both as the loops of level L form them
      vpce::impl::exp_lanes16<A, L>(u, e);
      for (int l = 0; l < 16; ++l) want[l] = exp_per_element<A, L>(u[l]);
    });
    for (int l = 0; l < 16; ++l) {
      if (as_bits(e[l]) != as_bits(want[l]) && !(std::isnan(e[l]) && std::isnan(want[l])))
        return ::testing::AssertionFailure() << "x = " << u[l] << ": " << e[l] << " vs " << want[l];
    }
    return ::testing::AssertionSuccess();
  };
  int k = 0;
  auto add = [&](float x) {
    u[k++] = x;
    if (k < 16) return ::testing::AssertionSuccess();
    k = 0;
    return check();
  };
  for (std::uint32_t b = 0x80000000u; b <= 0xff800000u; b += 61) ASSERT_TRUE(add(from_bits(b)));
  for (std::uint32_t b = 0; b <= as_bits(89.0f); b += 61) ASSERT_TRUE(add(from_bits(b)));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float mixed[16] = {0.0f,    -inf,   nan,        -nan,       -86.98f, std::nextafter(-86.98f, -inf),
                           -1e-30f, 1e-30f, -0.0f,      1.0f,       -1.0f,   80.0f,
                           88.0f,   -88.0f, 0.0216608f, -0.0216608f};
  for (int l = 0; l < 16; ++l) u[l] = mixed[l];
  ASSERT_TRUE(check());
  EXPECT_GT(lines, 2500000u);
}

TEST(Math, ExpLanesSameBitsAsPerElement) {
  for_each_level([](auto level) {
    expect_lanes_same_bits<ExpAccuracy::full, decltype(level)::value>();
    expect_lanes_same_bits<ExpAccuracy::input16, decltype(level)::value>();
  });
  std::printf(
      "[exp] float `full` exps per element in the table form: %s%s\n",
      vpce::impl::exp_in_lanes<float, ExpAccuracy::full, Isa::build> ? "yes (VPCE_EXP_TABLE)" : "no (the polynomial)",
      !VPCE_HOST_CLONES                                             ? ""
      : vpce::impl::exp_in_lanes<float, ExpAccuracy::full, Isa::v4> ? "; in the run-time copies for AVX-512: yes"
                                                                    : "; in the run-time copies for AVX-512: no");
}

TEST(Math, FastTanh) {
  double worst_f = 0, worst_d = 0;
  for (double u = -30; u < 30; u += 1.37e-4) {
    worst_f = std::max(worst_f, std::abs(double(fast_tanh(float(u))) - std::tanh(double(float(u)))));
    worst_d = std::max(worst_d, std::abs(fast_tanh(u) - std::tanh(u)));
  }
  EXPECT_LT(worst_f, 3e-7);   // 1.8e-7 measured
  EXPECT_LT(worst_d, 1e-15);  // 3.3e-16 measured
  for (double s : {1.0, -1.0}) {
    EXPECT_EQ(fast_tanh(float(s) * std::numeric_limits<float>::infinity()), float(s));
    EXPECT_EQ(fast_tanh(s * std::numeric_limits<double>::infinity()), s);
  }
  EXPECT_TRUE(std::isnan(fast_tanh(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(fast_tanh(std::numeric_limits<double>::quiet_NaN())));
}

// float16 -> float is exact and float -> float16 gives back the same bits, for all 65536 patterns (NaNs:
// a NaN). The branch-free conversions are checked against the C library's ldexp.
TEST(Math, Float16AllPatterns) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    vpce::float16 h;
    h.bits = static_cast<std::uint16_t>(b);
    const float f = static_cast<float>(h);
    const std::uint32_t e = (b >> 10) & 0x1f, m = b & 0x3ff;
    const double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(double(m | 0x400), int(e) - 25);
    const double want = (b & 0x8000) ? -mag : mag;
    if (e == 0x1f && m != 0) {
      ASSERT_TRUE(std::isnan(f)) << b;
      ASSERT_TRUE(std::isnan(static_cast<float>(vpce::float16(f)))) << b;
      continue;
    }
    if (e == 0x1f) {
      ASSERT_EQ(f, (b & 0x8000) ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity());
    } else {
      ASSERT_EQ(double(f), want) << b;
    }
    ASSERT_EQ(vpce::float16(f).bits, h.bits) << b;
  }
}

// float16 widened by the CPU's instructions where the build has them (widen16_hw: the chunks of float16 logits
// in HostInner::online) has float(float16)'s bits for all 65536 patterns, from any alignment, but a signalling
// NaN, which the instruction quiets; at every level (for_each_level).
TEST(Math, Float16WidenedSameBitsAsScalar) {
  for_each_level([](auto level) {
    constexpr vpce::impl::Isa L = decltype(level)::value;
    alignas(64) vpce::float16 h[17];
    float f[16];
    for (std::uint32_t b0 = 0; b0 < 65536; b0 += 16) {
      for (int skew = 0; skew < 2; ++skew) {
        for (int l = 0; l < 16; ++l) h[skew + l].bits = static_cast<std::uint16_t>(b0 + l);
        vpce::impl::widen16_hw<L>(h + skew, f);
        for (int l = 0; l < 16; ++l) {
          const std::uint32_t want = vpce::impl::as_bits(static_cast<float>(h[skew + l]));
          const bool signalling = (want & 0x7fc00000u) == 0x7f800000u && (want & 0x003fffffu) != 0;
          const std::uint32_t quiet = vpce::impl::have_widen_hw<vpce::float16, L> && signalling ? 0x00400000u : 0u;
          ASSERT_EQ(vpce::impl::as_bits(f[l]), want | quiet) << (b0 + l) << " level " << int(L);
        }
      }
    }
  });
}

// max16_hw (16 lanes' maxima by vmaxps: HostInner::sums_max's MaxApart) gives the loops' own v > mx ? v : mx, bit
// for bit (a NaN in v ignored, a NaN in mx kept, signed zeros, infinities, subnormals), and widen32_hw (32
// bfloat16 columns widened by vpermw) gives float(bfloat16) for all 65536 patterns from any alignment, at every
// level that has them, compiled as that level's row loops (in_level: the copies' forms are GCC's generic
// vectors, which take the copy's instructions only there).
TEST(Math, Max16AndWiden32AsTheLoops) {
  for_each_level([](auto level) {
    constexpr Isa L = decltype(level)::value;
    if constexpr (vpce::impl::have_max16_hw<float, L>) {
      const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
      const float vals[] = {nan, -inf, inf, -0.0f, 0.0f, 1.0f, -1.0f, 3.0e38f, 1.0e-40f, -2.5f, 1.0f + 0x1p-23f};
      constexpr int n = sizeof(vals) / sizeof(vals[0]);
      alignas(64) float v[16], mx[16], want[16];
      for (int a = 0; a < n; ++a) {
        for (int b = 0; b < n; ++b) {
          for (int l = 0; l < 16; ++l) {
            v[l] = vals[(a + l) % n];
            mx[l] = vals[(b + 3 * l) % n];
            want[l] = v[l] > mx[l] ? v[l] : mx[l];
          }
          in_level<L>([&] { vpce::impl::max16_hw<L>(v, mx); });
          for (int l = 0; l < 16; ++l) {
            ASSERT_EQ(vpce::impl::as_bits(mx[l]), vpce::impl::as_bits(want[l]))
                << a << " " << b << " lane " << l << " level " << int(L);
          }
        }
      }
    }
    if constexpr (vpce::impl::have_widen32_hw<L>) {
      alignas(64) vpce::bfloat16 x[33];
      alignas(64) float w[32];
      for (std::uint32_t b0 = 0; b0 < 65536; b0 += 32) {
        for (int skew = 0; skew < 2; ++skew) {
          for (int l = 0; l < 32; ++l) x[skew + l].bits = static_cast<std::uint16_t>(b0 + l);
          in_level<L>([&] { vpce::impl::widen32_hw<L>(x + skew, w); });
          for (int l = 0; l < 32; ++l) ASSERT_EQ(vpce::impl::as_bits(w[l]), (b0 + l) << 16) << " level " << int(L);
        }
      }
    }
  });
}

// The one-pass statistics of rows of float16 logits (HostInner::online_stats, the chunks widened to float where
// the build has F16C) have the bits of the same loops reading the logits in software (a reader without
// `widens`): rows of 1 to 3 chunks and a tail, with and without stored exps, the entropy and the sum of x.
// The kernels' callbacks are host and device functions (as FromBits below), never lambdas of a host function.
struct Float16InSoftware {  // Logits<float16> but for widening
  static constexpr bool pairs = vpce::impl::Logits<vpce::float16>::pairs;
  vpce::impl::Logits<vpce::float16> z;
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t j) const { return z(j); }
  KOKKOS_INLINE_FUNCTION auto pair(std::int64_t j) const { return z.pair(j); }
};
struct HalfOf {  // the logits' transform
  KOKKOS_INLINE_FUNCTION float operator()(float v) const { return 0.5f * v; }
};
struct ChunkMaxInto {
  float* cm;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t c, float m) const { cm[c] = m; }
};
template <vpce::impl::Isa L>
void expect_widened_statistics_same_bits() {
  using vpce::impl::ExpAccuracy;
  std::mt19937 gen(11);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  for (std::int64_t n :
       {std::int64_t(100), std::int64_t(4096), std::int64_t(3 * 4096 + 77), std::int64_t(-3 * 4096 - 77)}) {
    // n < 0: |n| columns, the first chunk and some masked (-inf)
    std::vector<vpce::float16> x(std::size_t(std::abs(n) + 1));
    for (auto& v : x) v = vpce::float16(logit(gen));
    x[x.size() / 2] = vpce::float16(40.0f);  // a later chunk's max far above the first's
    if (n < 0) {
      for (std::size_t j = 0; j < 4200; ++j) x[j] = vpce::float16(-std::numeric_limits<float>::infinity());
      n = -n;
    }
    for (int variant = 0; variant < 4; ++variant) {
      const bool entropy = variant == 1, stored = variant >= 2, sum_x = variant == 3;
      const std::size_t cols = static_cast<std::size_t>(n);
      std::vector<float> ea(cols), eb(cols), ca(8), cb(8);
      auto run = [&](const auto& z, std::vector<float>& e, std::vector<float>& cm) {
        const vpce::impl::HostInner<L> in;
        return in.template online_stats<float, vpce::impl::sum_lanes<vpce::float16>, ExpAccuracy::input16>(
            n, z, HalfOf{}, sum_x, nullptr, entropy, stored ? e.data() : nullptr, false, ChunkMaxInto{cm.data()},
            vpce::impl::Ahead<vpce::impl::Hint::l2>::of(x.data()));
      };
      const auto a = run(vpce::impl::Logits<vpce::float16>{x.data() + 1}, ea, ca);
      const auto b = run(Float16InSoftware{{x.data() + 1}}, eb, cb);
      // an array, not a braced list in the loop: nvcc's front end rejects the latter in a template
      const std::pair<float, float> values[] = {{a.m, b.m}, {a.s, b.s}, {a.zmax, b.zmax}, {a.sx, b.sx}, {a.h, b.h}};
      for (const auto& [u, v] : values)
        ASSERT_EQ(vpce::impl::as_bits(u), vpce::impl::as_bits(v)) << n << " " << variant;
      for (std::size_t j = 0; j < ea.size(); ++j)
        ASSERT_EQ(vpce::impl::as_bits(ea[j]), vpce::impl::as_bits(eb[j])) << j;
      ASSERT_EQ(ca, cb);
    }
  }
}

TEST(Math, Float16StatisticsWidenedSameBits) {
  for_each_level([](auto level) { expect_widened_statistics_same_bits<decltype(level)::value>(); });
}

// The values of a row written from float16 logits (HostInner::store of a WidenedExpValue: the backward from the
// logits, the logits widened 16 at a time where the build has F16C) have the bits of the same store reading the
// logits in software, column by column: into float and float16 rows, plain and streaming, from any alignment.
struct TestValue {  // a column's value from x_j and e = exp(x_j - shift)
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t j, float xj, float e) const {
    return e * 0.25f - (j == 7 ? xj : 0.0f);
  }
};
template <class V>
struct ColumnBySoftware {  // V's values column by column: no `widens`, float(float16) per column
  const V& v;
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t j) const { return v(j); }
};
template <vpce::impl::Isa L, class G>
void expect_widened_values_same_bits() {
  using vpce::impl::ExpAccuracy;
  std::mt19937 gen(13);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  const std::int64_t n = 1000;
  std::vector<vpce::float16> x(std::size_t(n + 1));
  for (auto& v : x) v = vpce::float16(logit(gen));
  const HalfOf transform;
  const TestValue value;
  const vpce::impl::HostInner<L> in;
  for (int skew = 0; skew < 2; ++skew) {
    using V = vpce::impl::WidenedExpValue<float, ExpAccuracy::input16, L, vpce::float16, HalfOf, TestValue>;
    const V v{x.data() + skew, transform, 1.5f, value};
    const ColumnBySoftware<V> software{v};
    for (const auto how : {vpce::impl::Store::plain, vpce::impl::Store::streaming}) {
      alignas(64) G a[n + 32], b[n + 32];
      in.store(n, a + skew, v, 3, G(1.0f), how);
      in.store(n, b + skew, software, 3, G(1.0f), how);
      for (std::int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(std::memcmp(&a[skew + j], &b[skew + j], sizeof(G)), 0) << j << " " << skew;
      }
    }
  }
}
TEST(Math, Float16ValuesWidenedSameBits) {
  for_each_level([](auto level) {
    expect_widened_values_same_bits<decltype(level)::value, float>();
    expect_widened_values_same_bits<decltype(level)::value, vpce::float16>();
  });
}

// The gradient's lines of 16-bit values (HostInner::round_line: the CPU's conversion instructions where built
// for them) have bfloat16(float)'s and float16(float)'s bits: every 61st line of 32 consecutive bit patterns
// (every sign and exponent, NaN payloads, the lines of subnormals), and lines of normal floats with a
// subnormal or a NaN at each position (lines the instructions would round otherwise are done in software).
// Column l of a line: the float with bits u[l] (host and device, as the kernels' callbacks: round_line is).
struct FromBits {
  const std::uint32_t* u;
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t l) const { return vpce::impl::from_bits(u[l]); }
};
template <vpce::impl::Isa L, class G>
void expect_lines_same_bits_as_scalar() {
  constexpr int lanes = 32;
  auto check = [](const std::uint32_t* u) {
    alignas(64) G line[lanes];
    vpce::impl::HostInner<L>::round_line(line, FromBits{u}, 0);
    for (int l = 0; l < lanes; ++l) {
      const G want(vpce::impl::from_bits(u[l]));
      if (line[l].bits != want.bits) return ::testing::AssertionFailure() << std::hex << u[l];
    }
    return ::testing::AssertionSuccess();
  };
  std::uint32_t u[lanes];
  for (std::uint64_t b = 0; b < (std::uint64_t(1) << 32); b += 61 * lanes) {
    for (int l = 0; l < lanes; ++l) u[l] = std::uint32_t(b + l);
    ASSERT_TRUE(check(u));
  }
  std::mt19937 gen(7);
  std::uniform_int_distribution<std::uint32_t> normal(0x00800000u, 0x7f7fffffu), sub(1u, 0x007fffffu),
      nan(0x7f800001u, 0x7fffffffu);
  for (int at = 0; at < lanes; ++at) {
    for (int l = 0; l < lanes; ++l) u[l] = normal(gen) | (l % 2 == 0 ? 0u : 0x80000000u);
    u[at] = sub(gen) | (at % 3 == 0 ? 0x80000000u : 0u);
    ASSERT_TRUE(check(u));
    u[at] = nan(gen) | (at % 3 == 0 ? 0x80000000u : 0u);
    ASSERT_TRUE(check(u));
  }
}
TEST(Math, Bfloat16LinesSameBitsAsScalar) {
  for_each_level([](auto level) { expect_lines_same_bits_as_scalar<decltype(level)::value, vpce::bfloat16>(); });
}
TEST(Math, Float16LinesSameBitsAsScalar) {
  for_each_level([](auto level) { expect_lines_same_bits_as_scalar<decltype(level)::value, vpce::float16>(); });
}

}  // namespace
