// The statistics that store their exps (LocalStats::with_exps: sums_max over ExpTerms), alone: for the object
// code of HostInner<Isa::build>::sums_max under each compiler (README.md).
#include "vpce/impl/kernels.hpp"
using namespace vpce::impl;
// the statistics storing the exps (LocalStats with_exps): sums_max over ExpTerms-like terms
float stats_store(const float* x, float* y, std::int64_t n, float m0, float* maxo) {
  HostInner<Isa::build> in{};
  const float m = m0;
  auto f = [=](std::int64_t j) {
    const float u = x[j] - m;
    const float e = exp_per_element<ExpAccuracy::full, Isa::build>(u);
    y[j] = e;
    return Terms<float, 1>{{e}};
  };
  auto g = [=](std::int64_t j) { return x[j]; };
  return in.sums_max<float, 1>(n, f, g, maxo).v[0];
}
