// The Kokkos::Serial instances of the typed tests' configurations (test_utils.hpp declares them extern), in
// one translation unit: a change to the kernels recompiles them once, not in every test.
#include <Kokkos_Core.hpp>

#include "vpce/definitions.hpp"

#if defined(KOKKOS_ENABLE_SERIAL) && !defined(KOKKOS_ENABLE_DEFAULT_DEVICE_TYPE_SERIAL)
template class vpce::CrossEntropy<float, Kokkos::Serial>;
template class vpce::CrossEntropy<double, Kokkos::Serial>;
#endif
