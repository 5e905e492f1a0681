#pragma once
/// \file half.hpp
/// \brief 16-bit storage types for logits and gradients: vpce::bfloat16 and vpce::float16.
///
/// Storage only: vpce loads them into float, computes in float, and rounds results back to nearest-even.
/// The bit layouts are those of bfloat16 (the top half of an IEEE float) and IEEE binary16, the same as
/// Kokkos::Experimental::bhalf_t / half_t, CUDA's __nv_bfloat16 / __half and PyTorch's tensors, so buffers
/// can be shared by pointer. (Kokkos 3.4 has no bhalf_t, hence vpce's own types.)

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>

namespace vpce {

namespace impl {
KOKKOS_FORCEINLINE_FUNCTION std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
KOKKOS_FORCEINLINE_FUNCTION float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
}  // namespace impl

struct bfloat16 {
  std::uint16_t bits;
  bfloat16() = default;
  /// Round to nearest even; NaN stays NaN.
  KOKKOS_FORCEINLINE_FUNCTION explicit bfloat16(float f) {
    const std::uint32_t u = impl::float_bits(f);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    bits = static_cast<std::uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
  }
  KOKKOS_FORCEINLINE_FUNCTION explicit operator float() const { return impl::bits_float(std::uint32_t(bits) << 16); }
};

struct float16 {
  std::uint16_t bits;
  float16() = default;
  /// Round to nearest even, with subnormals, overflow to inf, NaN kept.
  KOKKOS_FORCEINLINE_FUNCTION explicit float16(float f) {
    std::uint32_t u = impl::float_bits(f);
    const std::uint32_t sign = u & 0x80000000u;
    u ^= sign;
    std::uint32_t o;
    if (u >= 0x47800000u) {  // >= 65536 after rounding, inf or NaN
      o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (u < 0x38800000u) {  // subnormal half or zero: let the FPU round
      const std::uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
      o = impl::float_bits(impl::bits_float(u) + impl::bits_float(denorm_magic)) - denorm_magic;
    } else {
      const std::uint32_t odd = (u >> 13) & 1u;
      u += ((15u - 127u) << 23) + 0xfffu + odd;
      o = u >> 13;
    }
    bits = static_cast<std::uint16_t>(o | (sign >> 16));
  }
  KOKKOS_FORCEINLINE_FUNCTION explicit operator float() const {
    const std::uint32_t shifted_exp = 0x7c00u << 13;
    std::uint32_t o = (std::uint32_t(bits) & 0x7fffu) << 13;
    const std::uint32_t exp = shifted_exp & o;
    o += (127u - 15u) << 23;
    if (exp == shifted_exp) {
      o += (128u - 16u) << 23;  // inf, NaN
    } else if (exp == 0) {
      o += 1u << 23;  // zero, subnormal: renormalise
      o = impl::float_bits(impl::bits_float(o) - impl::bits_float(113u << 23));
    }
    return impl::bits_float(o | ((std::uint32_t(bits) & 0x8000u) << 16));
  }
};

/// The type vpce computes in for a storage type: float for the 16-bit types.
template <class S>
struct compute_type {
  using type = S;
};
template <>
struct compute_type<bfloat16> {
  using type = float;
};
template <>
struct compute_type<float16> {
  using type = float;
};
template <class S>
using compute_type_t = typename compute_type<S>::type;

template <class S>
inline constexpr bool is_16bit_v = std::is_same_v<S, bfloat16> || std::is_same_v<S, float16>;

}  // namespace vpce
