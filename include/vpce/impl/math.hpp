#pragma once
/// \file math.hpp
/// \brief A branch-free exp that vectorises on CPUs without -ffast-math and keeps exp(-inf) = 0 and
/// exp(NaN) = NaN, which the -inf handling and the non-finite check rely on.
///
/// exp(x) = 2^n * p(r), n = round(x / ln2) by the 1.5 * 2^k magic constant (floor() kept GCC 12 from
/// vectorising), r = x - n ln2 in two parts (Cody-Waite), p a Taylor polynomial on |r| <= ln2/2
/// (float: degree 7, error < 1e-8 relative; double: degree 13, < 2e-16). Results below the smallest
/// normal number are flushed to 0.

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>

#include "vpce/impl/compat.hpp"

namespace vpce::impl {

KOKKOS_FORCEINLINE_FUNCTION float fast_exp(float x) {
  constexpr float lo = -87.33654f;  // exp(lo) = 2^-126, the smallest normal float
  constexpr float hi = 88.0f;       // keeps 2^n finite
  float xc = x < lo ? lo : x;       // NaN passes through both clamps
  xc = xc > hi ? hi : xc;
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693145751953125f;
  r = r - n * 1.42860682030941723212e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // n is NaN only when x is (then p is NaN too): 0 instead, as converting NaN to an integer is undefined.
  const std::int32_t bits = (static_cast<std::int32_t>(n == n ? n : 0.0f) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const float e = p * scale;
  return x < lo ? 0.0f : e;
}

KOKKOS_FORCEINLINE_FUNCTION double fast_exp(double x) {
  constexpr double lo = -708.3964185322641;  // exp(lo) = 2^-1022
  constexpr double hi = 709.0;
  double xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const double n = (xc * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0;
  double r = xc - n * 0.6931471803691238;
  r = r - n * 1.9082149292705877e-10;
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const std::int64_t bits = (static_cast<std::int64_t>(n == n ? n : 0.0) + 1023) << 52;  // NaN: as above
  double scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const double e = p * scale;
  return x < lo ? 0.0 : e;
}

/// tanh for the softcap: 1 - 2 / (exp(2u) + 1) with fast_exp (vectorises), an odd Taylor polynomial for
/// |u| < 1/8 where that form cancels; absolute error about 1e-7. Double precision uses the library tanh.
KOKKOS_FORCEINLINE_FUNCTION float fast_tanh(float u) {
  const float u2 = u * u;
  const float small = u * (1.0f + u2 * (-1.0f / 3.0f + u2 * (2.0f / 15.0f + u2 * (-17.0f / 315.0f))));
  const float big = 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f);
  return (u < 0.125f && u > -0.125f) ? small : big;
}

KOKKOS_FORCEINLINE_FUNCTION double fast_tanh(double u) { return kmath::tanh(u); }

}  // namespace vpce::impl
