// Explicit instantiations of vpce::LinearCrossEntropy for the default execution space.
#include "vpce/impl/linear_cross_entropy_impl.hpp"

template class vpce::LinearCrossEntropy<float, Kokkos::DefaultExecutionSpace>;
template class vpce::LinearCrossEntropy<double, Kokkos::DefaultExecutionSpace>;
template class vpce::LinearCrossEntropy<vpce::bfloat16, Kokkos::DefaultExecutionSpace>;
template class vpce::LinearCrossEntropy<vpce::float16, Kokkos::DefaultExecutionSpace>;
