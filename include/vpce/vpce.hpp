#pragma once
/// \file vpce.hpp
/// \brief Everything a user of vpce's C++ API needs: declarations only, no kernels (the definitions are in the
/// library; vpce/definitions.hpp is the opt-in for other execution spaces).

#include "vpce/communicator.hpp"
#include "vpce/config.hpp"
#include "vpce/cross_entropy.hpp"
#include "vpce/dtype.hpp"
#include "vpce/error.hpp"
#include "vpce/half.hpp"
#if defined(VPCE_HAVE_KOKKOSKERNELS)
#include "vpce/linear_cross_entropy.hpp"
#endif
#include "vpce/options.hpp"
#include "vpce/partition.hpp"
