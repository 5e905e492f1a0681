#pragma once
/// \file compat.hpp
/// \brief The one place where Kokkos 3.4 and Kokkos 4.x/5.x differences are bridged.

#include <Kokkos_Core.hpp>
#include <string>
#include <type_traits>

namespace vpce::impl {

#if KOKKOS_VERSION >= 30700
namespace kmath = ::Kokkos;
#else
namespace kmath = ::Kokkos::Experimental;
#endif

/// create_mirror_view without initialisation: (space, view, tag) in 3.4, (tag, space, view) from 4.0.
template <class Space, class View>
auto mirror_view_no_init(const Space& space, const View& v) {
#if KOKKOS_VERSION >= 40000
  return Kokkos::create_mirror_view(Kokkos::WithoutInitializing, space, v);
#else
  return Kokkos::create_mirror_view(space, v, Kokkos::WithoutInitializing);
#endif
}

/// Named fences exist from 3.5.
template <class ExecSpace>
void fence(const ExecSpace& space, const char* label) {
#if KOKKOS_VERSION >= 30500
  space.fence(label);
#else
  (void)label;
  space.fence();
#endif
}

/// Kokkos Tools region (Profiling::ScopedRegion exists only from 4.1).
class ScopedRegion {
 public:
  explicit ScopedRegion(const std::string& name) { Kokkos::Profiling::pushRegion(name); }
  ~ScopedRegion() { Kokkos::Profiling::popRegion(); }
  ScopedRegion(const ScopedRegion&) = delete;
  ScopedRegion& operator=(const ScopedRegion&) = delete;
};

/// True when the execution space runs on the host (vectorised loops per row), false on a device
/// (a team per row, threads across the vocabulary).
template <class ExecSpace>
inline constexpr bool is_host_space_v =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;

}  // namespace vpce::impl
