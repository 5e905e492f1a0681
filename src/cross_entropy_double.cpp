// Explicit instantiation for the default execution space, compiled with vpce's own flags (-fopenmp-simd
// for the vectorised row loops). Other execution spaces: vpce/definitions.hpp in the user's code.
#include "vpce/impl/cross_entropy_impl.hpp"

template class vpce::CrossEntropy<double, Kokkos::DefaultExecutionSpace>;
