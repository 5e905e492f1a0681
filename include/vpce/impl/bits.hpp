#pragma once
/// \file bits.hpp
/// \brief A float's bits and back, and a branch-free select.
///
/// `c ? a : b` on floats compiles to control flow under GCC's default -ftrapping-math, which keeps a loop
/// from being vectorised on instruction sets without mask registers (SSE4.2, AVX2): the compiler may not
/// speculate a float compare. `select` does the choice on the bits with integer operations, which the
/// vectoriser always turns into a blend, on every ISA and with any floating-point flags.

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace vpce::impl {

KOKKOS_FORCEINLINE_FUNCTION std::uint32_t as_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
KOKKOS_FORCEINLINE_FUNCTION std::uint64_t as_bits(double d) {
  std::uint64_t u;
  std::memcpy(&u, &d, sizeof(u));
  return u;
}
KOKKOS_FORCEINLINE_FUNCTION float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
KOKKOS_FORCEINLINE_FUNCTION double from_bits(std::uint64_t u) {
  double d;
  std::memcpy(&d, &u, sizeof(d));
  return d;
}

/// c ? a : b without a branch (see the file comment). T: float, double or an unsigned integer. Also for
/// integers: with `?:` GCC may sink a float operation that feeds only one side into a branch, which it
/// then cannot vectorise either; here both sides are used.
template <class T>
KOKKOS_FORCEINLINE_FUNCTION T select(bool c, T a, T b) {
  if constexpr (std::is_unsigned_v<T>) {
    const T mask = T(0) - T(c);  // all ones or all zeros
    return T((a & mask) | (b & ~mask));
  } else {
    return from_bits(select(c, as_bits(a), as_bits(b)));
  }
}

}  // namespace vpce::impl
