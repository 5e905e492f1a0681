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

#include "vpce/impl/bits.hpp"

namespace vpce {

struct bfloat16 {
  std::uint16_t bits;
  bfloat16() = default;
  /// Round to nearest even; NaN stays NaN. The choice is impl::select, never `?:`: GCC turned that into a
  /// branch with a store in each arm where the result is stored straight into an array, and left the loop
  /// scalar.
  KOKKOS_FORCEINLINE_FUNCTION explicit bfloat16(float f) {
    const std::uint32_t u = impl::as_bits(f);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    bits = static_cast<std::uint16_t>(impl::select(nan, (u >> 16) | 0x40u, rounded));
  }
  KOKKOS_FORCEINLINE_FUNCTION explicit operator float() const { return impl::from_bits(std::uint32_t(bits) << 16); }
};

struct float16 {
  std::uint16_t bits;
  float16() = default;
  /// Round to nearest even, with subnormals, overflow to inf, NaN kept. Every case is computed and the
  /// result chosen by impl::select: no branch, so loops of conversions vectorise.
  KOKKOS_FORCEINLINE_FUNCTION explicit float16(float f) {
    std::uint32_t u = impl::as_bits(f);
    const std::uint32_t sign = u & 0x80000000u;
    u ^= sign;
    // >= 65536 after rounding, inf or NaN
    const std::uint32_t special = impl::select(u > 0x7f800000u, 0x7e00u, 0x7c00u);
    // subnormal half or zero: let the FPU round
    const std::uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    const std::uint32_t sub = impl::as_bits(impl::from_bits(u) + impl::from_bits(denorm_magic)) - denorm_magic;
    const std::uint32_t normal = (u + ((15u - 127u) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
    const std::uint32_t o = impl::select(u >= 0x47800000u, special, impl::select(u < 0x38800000u, sub, normal));
    bits = static_cast<std::uint16_t>(o | (sign >> 16));
  }
  KOKKOS_FORCEINLINE_FUNCTION explicit operator float() const {
    const std::uint32_t shifted_exp = 0x7c00u << 13;
    const std::uint32_t o = ((std::uint32_t(bits) & 0x7fffu) << 13) + ((127u - 15u) << 23);
    const std::uint32_t exp = shifted_exp & (std::uint32_t(bits) << 13);
    const std::uint32_t special = o + ((128u - 16u) << 23);  // inf, NaN
    // zero, subnormal: renormalise
    const std::uint32_t sub = impl::as_bits(impl::from_bits(o + (1u << 23)) - impl::from_bits(113u << 23));
    const std::uint32_t r = impl::select(exp == shifted_exp, special, impl::select(exp == 0u, sub, o));
    return impl::from_bits(r | ((std::uint32_t(bits) & 0x8000u) << 16));
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
