#pragma once
/// \file dtype.hpp
/// \brief The element type of the logits as a run-time value (DType): its names, parsing, element size, and the
/// one switch that turns a DType into a compile-time type (dispatch).
///
/// Standard headers only, no Kokkos: the tool's input checks (compiled by the fuzz harness without Kokkos), the C
/// API and the benchmark harness all use it. The 16-bit types are only declared here; code that uses their values
/// includes vpce/half.hpp.

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace vpce {

struct bfloat16;  // defined in vpce/half.hpp
struct float16;   // defined in vpce/half.hpp

/// An element type of logits (and of their gradient): the types CrossEntropy is built for (float, double,
/// vpce::bfloat16, vpce::float16). The values are the C API's vpce_dtype (VPCE_FLOAT32 = 0, ...).
enum class DType : int { float32 = 0, float64 = 1, bfloat16 = 2, float16 = 3 };

/// Every DType, in the order of the enumeration.
inline constexpr DType all_dtypes[] = {DType::float32, DType::float64, DType::bfloat16, DType::float16};

/// "float32", "float64", "bfloat16" or "float16" (PyTorch's names; those of the tool's files and options).
constexpr const char* to_string(DType t) noexcept {
  constexpr const char* names[] = {"float32", "float64", "bfloat16", "float16"};  // in the enumeration's order
  const int k = static_cast<int>(t);
  return k >= 0 && k < 4 ? names[k] : "?";
}

/// The DType named `name` (one of to_string's names, exactly), or nothing.
constexpr std::optional<DType> parse_dtype(std::string_view name) noexcept {
  for (const DType t : all_dtypes)
    if (name == to_string(t)) return t;
  return std::nullopt;
}

/// Bytes per element, in memory and in files (the 16-bit types as their bits).
constexpr std::size_t element_size(DType t) noexcept { return t == DType::float64 ? 8 : t == DType::float32 ? 4 : 2; }

/// Whether t is one of the 16-bit storage types (computed in float; uint16 bits in files).
constexpr bool is_16bit(DType t) noexcept { return t == DType::bfloat16 || t == DType::float16; }

/// The argument dispatch passes: stands for the type S (which may be incomplete here). `typename
/// decltype(tag)::type` in a generic lambda names S.
template <class S>
struct type_tag {
  using type = S;
};

/// The DType of the element type S (float, double, vpce::bfloat16 or vpce::float16; anything else does not
/// compile).
template <class S>
constexpr DType dtype_of() noexcept {
  static_assert(std::is_same_v<S, float> || std::is_same_v<S, double> || std::is_same_v<S, bfloat16> ||
                    std::is_same_v<S, float16>,
                "vpce::dtype_of: S must be float, double, vpce::bfloat16 or vpce::float16");
  if constexpr (std::is_same_v<S, float>)
    return DType::float32;
  else if constexpr (std::is_same_v<S, double>)
    return DType::float64;
  else if constexpr (std::is_same_v<S, bfloat16>)
    return DType::bfloat16;
  else
    return DType::float16;
}

/// THE switch on the element type: calls `f(type_tag<S>{})` with S the element type of `t` (float, double,
/// vpce::bfloat16, vpce::float16) and returns what it returns (the same type for every S). f is instantiated for
/// all four types: a caller that takes only some discards the others with `if constexpr`. A value outside the
/// enumeration (a cast from a bad integer) throws std::invalid_argument.
///
///     vpce::dispatch(t, [&](auto tag) { using S = typename decltype(tag)::type; run<S>(...); });
template <class F>
auto dispatch(DType t, F&& f) -> decltype(f(type_tag<float>{})) {
  switch (t) {
    case DType::float32:
      return f(type_tag<float>{});
    case DType::float64:
      return f(type_tag<double>{});
    case DType::bfloat16:
      return f(type_tag<bfloat16>{});
    case DType::float16:
      return f(type_tag<float16>{});
  }
  throw std::invalid_argument("dispatch: " + std::to_string(static_cast<int>(t)) + " is not a vpce::DType");
}

}  // namespace vpce
