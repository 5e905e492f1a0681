// Explicit instantiations of vpce::LinearCrossEntropy for the default execution space.
#include "vpce/linear_cross_entropy.hpp"

template class vpce::LinearCrossEntropy<float, Kokkos::DefaultExecutionSpace>;
template class vpce::LinearCrossEntropy<double, Kokkos::DefaultExecutionSpace>;
