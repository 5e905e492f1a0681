// Finite-difference check of the gradient in double (without options; with z-loss, logit scale and
// softcap; with an entropy weight (an entropy bonus) and the z-loss): F = sum_i g_i * loss_i, dF/dx_ij by central
// differences of vpce's own forward() (the loss is a collective: every rank calls forward() for every
// perturbation; only the rank that owns column j perturbs it), against loss_and_grad() and backward().

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "test_utils.hpp"

namespace {

using namespace vpce_test;

template <class C>
class GradCheckTest : public ::testing::Test {
 protected:
  vpce::Communicator comm{MPI_COMM_WORLD};
};

TYPED_TEST_SUITE(GradCheckTest, DoubleConfigs, ConfigName);

// h = 1e-5: truncation ~h^2 * |f'''| ~ 1e-10, rounding ~ eps * |F| / h ~ 1e-10; tolerance 1e-7 + 1e-6 |.|.
TYPED_TEST(GradCheckTest, GradientMatchesFiniteDifferences) {
  constexpr double h = 1e-5;
  constexpr Tol tol{1e-6, 1e-7};
  const int rank = this->comm.rank(), size = this->comm.size();
  for (const auto& part : {vpce::VocabPartition::even(9, this->comm),
                           vpce::VocabPartition::from_local_size(size == 1 ? 5 : (rank == 0 ? 0 : 3), this->comm)}) {
    Problem p = make_problem<double>(4, part.vocab_size(), 61);
    for (std::int64_t i = 0; i < p.n; ++i) p.at(i, i % p.v) -= 20 * i;  // a few small probabilities too
    p.at(3, (p.y[3] + 1) % p.v) = -kInf;                                // and a padding column
    const auto in = make_local<TypeParam>(p, part);
    const std::int64_t w = part.local_size();
    // Without options, and with z-loss, a logit scale and a softcap small enough that the large logits
    // (down to -60 above) sit deep in tanh's saturation.
    for (int with_options = 0; with_options < 3; ++with_options)
      for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
        vpce::Options opt;
        opt.strategy = strategy;
        opt.mode = vpce::Mode::stash_softmax;
        if (with_options == 1) {
          opt.z_loss = 1e-2;
          opt.logit_scale = 1.3;
          opt.softcap = 3;
        } else if (with_options == 2) {
          opt.z_loss = 1e-2;
          opt.entropy_weight = -0.7;
        }
        typename TypeParam::cross_entropy ce(this->comm, part, opt);
        const std::string what = "V " + std::to_string(p.v) + ", " + describe(opt);
        // Analytic, two ways.
        const Outputs fused = run_path<TypeParam>(ce, in, Path::fused_view);
        const Outputs backward = run_path<TypeParam>(ce, in, Path::forward_backward_view);
        // Numeric: every rank runs forward() for every (i, j); the owner of column j perturbs x_ij.
        auto x = Kokkos::create_mirror_view(in.x);
        Kokkos::deep_copy(x, in.x);
        auto loss = poisoned_vector<TypeParam>(p.n);
        auto objective = [&]() {
          Kokkos::deep_copy(in.x, x);
          ce.forward(in.x, in.y, loss);
          const auto l = to_host(loss);
          double f = 0;
          for (std::int64_t k = 0; k < p.n; ++k) f += p.g[k] * l[k];
          return f;
        };
        std::vector<double> numeric(p.n * w, 0.0);
        for (std::int64_t i = 0; i < p.n; ++i) {
          for (std::int64_t j = 0; j < p.v; ++j) {
            if (p.at(i, j) == -kInf) continue;  // no finite neighbourhood; the gradient there must be exactly 0
            const bool mine = j >= part.begin() && j < part.end();
            const std::int64_t c = j - part.begin();
            const double x0 = p.at(i, j);
            if (mine) x(i, c) = x0 + h;
            const double f_plus = objective();
            if (mine) x(i, c) = x0 - h;
            const double f_minus = objective();
            if (mine) {
              x(i, c) = x0;
              numeric[i * w + c] = (f_plus - f_minus) / (2 * h);
            }
          }
        }
        Kokkos::deep_copy(in.x, x);
        expect_allclose(fused.grad, numeric, tol, what + ": loss_and_grad vs finite differences", w);
        expect_allclose(backward.grad, numeric, tol, what + ": backward vs finite differences", w);
        // The numeric gradient is not trivially small: it has entries of size O(1) where the target is.
        double biggest = 0;
        for (double d : numeric) biggest = std::max(biggest, std::abs(d));
        double global = 0;
        MPI_Allreduce(&biggest, &global, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        EXPECT_GT(global, with_options ? 0.05 : 0.2) << what;  // the softcap damps the gradient
      }
  }
}

}  // namespace
