#pragma once
/// \file definitions.hpp
/// \brief Opt-in: the template definitions of vpce's classes, for a user who instantiates them on an
/// execution space other than Kokkos::DefaultExecutionSpace (the library holds the explicit instantiations
/// for the default one and the four scalar types; <vpce/vpce.hpp> declares, and never pulls in the kernels).
///
/// A translation unit that includes this header compiles vpce's row kernels: give it the flags the library's
/// own get (README, "Using another execution space"): `-fopenmp-simd` (the vectorised row loops; linking
/// the CMake target vpce::definitions adds it), and the same -march as the library for identical bits.

#include "vpce/config.hpp"
#include "vpce/impl/cross_entropy_impl.hpp"
#if defined(VPCE_HAVE_KOKKOSKERNELS)
#include "vpce/impl/linear_cross_entropy_impl.hpp"
#endif
