// Explicit instantiation for the default execution space, compiled with vpce's own flags (-fopenmp-simd
// for the vectorised row loops). Other execution spaces are instantiated from the headers.
#include "vpce/cross_entropy.hpp"

template class vpce::CrossEntropy<float, Kokkos::DefaultExecutionSpace>;
