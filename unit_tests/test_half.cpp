// 16-bit logits (vpce::bfloat16, vpce::float16), computed in float: loss, lse and a float gradient as
// accurate as for float logits (the reference takes the rounded 16-bit values), and a gradient stored in
// the 16-bit type within its rounding, including in place (the gradient overwrites the logits).

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_utils.hpp"

namespace {

using namespace vpce_test;

template <class S>
class HalfTest : public ::testing::Test {
 protected:
  using cross_entropy = vpce::CrossEntropy<S, DefaultExec>;
  using memory_space = typename cross_entropy::memory_space;
  using storage_matrix = Kokkos::View<S**, Kokkos::LayoutRight, memory_space>;
  using float_C = Config<float, DefaultExec>;  // for the float outputs (loss, lse, float gradient)
  vpce::Communicator comm{MPI_COMM_WORLD};

  /// Rounding of a 16-bit store: half an ulp of 2^-8 (bfloat16) or 2^-11 (float16) relative, and the
  /// absolute spacing of float16's subnormals.
  static constexpr Tol storage_tol = std::is_same_v<S, vpce::bfloat16> ? Tol{4e-3, 1e-7} : Tol{6e-4, 1e-7};

  static double round16(double v) { return static_cast<float>(S(static_cast<float>(v))); }

  /// This rank's slice of the problem's logits, in S.
  static storage_matrix logits(const Problem& p, std::int64_t begin, std::int64_t w) {
    storage_matrix x("x16", p.n, w);
    auto h = Kokkos::create_mirror_view(x);
    for (std::int64_t i = 0; i < p.n; ++i)
      for (std::int64_t j = 0; j < w; ++j) h(i, j) = S(static_cast<float>(p.at(i, begin + j)));
    Kokkos::deep_copy(x, h);
    return x;
  }

  /// EXPECTs a 16-bit gradient within `storage_tol` of the reference, except that at the target the
  /// current library rounds twice (see TargetGradientRoundedOnce): there one more rounding of
  /// softmax_t * g_i is allowed.
  static void expect_grad16(const std::vector<double>& actual, const Reference& ref, const Problem& p,
                            const vpce::VocabPartition& part, const std::vector<double>& g, const std::string& what) {
    const std::int64_t w = part.local_size();
    const auto expected = expected_grad(ref, p, part.begin(), w, g);
    Tol tol = storage_tol;
    int bad = 0;
    for (std::int64_t i = 0; i < p.n; ++i) {
      for (std::int64_t j = 0; j < w; ++j) {
        const double b = expected[i * w + j];
        double slack = 0;
        if (part.begin() + j == p.y[i]) slack = tol.rtol * std::abs((ref.dloss[i * p.v + p.y[i]] + 1.0) * g[i]);
        if (std::abs(actual[i * w + j] - b) <= tol.atol + tol.rtol * std::abs(b) + slack) continue;
        if (++bad <= 5) {
          ADD_FAILURE() << "rank " << world_rank() << ": " << what << "(" << i << ", " << j
                        << ") = " << actual[i * w + j] << ", expected " << b;
        }
      }
    }
    EXPECT_EQ(bad, 0) << what;
  }

  static std::vector<double> to_host16(const storage_matrix& v) {
    auto h = Kokkos::create_mirror_view(v);
    Kokkos::deep_copy(h, v);
    std::vector<double> out(v.extent(0) * v.extent(1));
    for (std::size_t i = 0; i < v.extent(0); ++i)
      for (std::size_t j = 0; j < v.extent(1); ++j) out[i * v.extent(1) + j] = static_cast<float>(h(i, j));
    return out;
  }
};

using HalfTypes = ::testing::Types<vpce::bfloat16, vpce::float16>;
struct HalfName {
  template <class S>
  static std::string GetName(int) {
    return std::is_same_v<S, vpce::bfloat16> ? "bfloat16" : "float16";
  }
};
TYPED_TEST_SUITE(HalfTest, HalfTypes, HalfName);

TYPED_TEST(HalfTest, MatchesReferenceEveryStrategyModeAndGradientType) {
  using F = typename TestFixture::float_C;
  std::uint64_t seed = 700;
  for (const auto& np : test_partitions(this->comm)) {
    const auto& part = np.part;
    const std::int64_t w = part.local_size();
    Problem p = make_problem<float>(29, part.vocab_size(), seed++);
    for (auto& v : p.x) v = TestFixture::round16(v);
    const Reference ref = reference(p);
    const auto x = TestFixture::logits(p, part.begin(), w);
    const auto in = make_local<F>(p, part);  // targets and the per-row gradient (float)
    const std::vector<double> scale(p.n, kGradScale);
    const auto s = static_cast<float>(kGradScale);
    for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
      for (auto mode : {vpce::Mode::stash_softmax, vpce::Mode::recompute}) {
        vpce::Options opt;
        opt.strategy = strategy;
        opt.mode = mode;
        typename TestFixture::cross_entropy ce(this->comm, part, opt);
        const std::string what = np.name + ", " + describe(opt);
        auto check_loss = [&](const auto& loss, const std::string& how) {
          expect_allclose(to_host(loss), ref.loss, Tolerance<float>::loss, what + ", " + how + ": loss");
          expect_allclose(to_host(ce.lse()), ref.lse, Tolerance<float>::loss, what + ", " + how + ": lse");
        };
        auto grad_f = [&] { return poisoned_matrix<F>(p.n, w); };
        auto grad16 = [&] {  // poisoned with NaN too
          typename TestFixture::storage_matrix g("g16", p.n, w);
          Kokkos::deep_copy(g, TypeParam(std::numeric_limits<float>::quiet_NaN()));
          return g;
        };
        {  // forward, backward into float and into 16-bit gradients
          auto loss = poisoned_vector<F>(p.n);
          ce.forward(x, in.y, loss);
          check_loss(loss, "forward");
          auto g1 = grad_f();
          ce.backward(s, g1);
          expect_allclose(to_host(g1), expected_grad(ref, p, part.begin(), w, scale), Tolerance<float>::grad,
                          what + ", backward(scale) float grad", w);
          auto g2 = grad16();
          ce.backward(in.g, g2);
          TestFixture::expect_grad16(TestFixture::to_host16(g2), ref, p, part, p.g,
                                     what + ", backward(view) 16-bit grad");
        }
        {  // loss_and_grad into float and 16-bit gradients
          auto loss = poisoned_vector<F>(p.n);
          auto g1 = grad_f();
          ce.loss_and_grad(x, in.y, loss, g1, in.g);
          check_loss(loss, "loss_and_grad");
          expect_allclose(to_host(g1), expected_grad(ref, p, part.begin(), w, p.g), Tolerance<float>::grad,
                          what + ", loss_and_grad(view) float grad", w);
          auto g2 = grad16();
          ce.loss_and_grad(x, in.y, loss, g2, s);
          TestFixture::expect_grad16(TestFixture::to_host16(g2), ref, p, part, scale,
                                     what + ", loss_and_grad(scale) 16-bit grad");
        }
        {  // in place: the 16-bit gradient overwrites the logits
          auto loss = poisoned_vector<F>(p.n);
          typename TestFixture::storage_matrix buf("buf16", p.n, w);
          Kokkos::deep_copy(buf, x);
          ce.loss_and_grad(buf, in.y, loss, buf, s);
          check_loss(loss, "loss_and_grad in place");
          TestFixture::expect_grad16(TestFixture::to_host16(buf), ref, p, part, scale,
                                     what + ", loss_and_grad in place 16-bit grad");
        }
      }
    }
  }
}

// The target's gradient (softmax_t - 1) * g is rounded to 16 bits once: with a confident prediction
// (softmax_t close to 1) it is small, and rounding softmax_t * g first loses it entirely.
TYPED_TEST(HalfTest, TargetGradientRoundedOnce) {
  using F = typename TestFixture::float_C;
  const auto part = vpce::VocabPartition::even(16, this->comm);
  const std::int64_t w = part.local_size();
  Problem p = make_problem<float>(4, part.vocab_size(), 5);
  const double gaps[] = {12.0, 9.0, 7.0, 5.0};  // softmax_t about 1 - 1e-4, 1 - 2e-3, 1 - 1.5e-2, 0.89
  for (std::int64_t i = 0; i < p.n; ++i) {
    for (std::int64_t j = 0; j < p.v; ++j) p.at(i, j) = TestFixture::round16(0.125 * double(j % 3));
    p.y[i] = (5 * i + 3) % p.v;
    p.at(i, p.y[i]) = TestFixture::round16(gaps[i]);
  }
  const Reference ref = reference(p);
  const auto in = make_local<F>(p, part);
  const std::vector<double> one(p.n, 1.0);
  typename TestFixture::cross_entropy ce(this->comm, part);
  auto loss = poisoned_vector<F>(p.n);
  auto buf = TestFixture::logits(p, part.begin(), w);
  ce.loss_and_grad(buf, in.y, loss, buf, 1.0f);
  expect_allclose(TestFixture::to_host16(buf), expected_grad(ref, p, part.begin(), w, one), TestFixture::storage_tol,
                  "16-bit gradient with a confident target", w);
}

// Rows of several 4096-column chunks per rank (the host's statistics chunk by chunk, their exps stored), 64-byte
// aligned (a multiple of 32 columns per rank: lines whole from the first column) and not,
// with a chunk's max more than 80 above the running max (a chunk done again), a first chunk all -inf, and with
// the options whose gradients read more than the exps (label smoothing with class weights, the entropy weight
// reading the logits, the z-loss, a logit scale): the float and 16-bit gradients (in place too) and the loss
// against the reference, blocks of one row (the gradient written in step with the next row's statistics) and
// the automatic ones.
TYPED_TEST(HalfTest, LongRowsEveryOption) {
  using F = typename TestFixture::float_C;
  const int ranks = this->comm.size();
  for (const std::int64_t per_rank : {std::int64_t(2 * 4096 + 96), std::int64_t(2 * 4096 + 77)}) {
    const auto part = vpce::VocabPartition::even(per_rank * ranks, this->comm);
    const std::int64_t w = part.local_size();
    Problem p = make_problem<float>(6, part.vocab_size(), 31 + per_rank);
    for (int r = 0; r < ranks; ++r) {
      const std::int64_t b = part.begin(r);
      for (std::int64_t j = 0; j < part.local_size(r); ++j) {
        p.at(1, b + j) = -150.0 + 300.0 * double(j) / double(part.local_size(r)) + p.at(1, b + j) - 80.0;
        if (j < 4200) p.at(2, b + j) = -kInf;
      }
      p.at(4, b + 100) = 120.0;
      p.at(4, b + 5000) = 250.0;
    }
    p.y[2] = p.v - 1;
    for (auto& v : p.x) v = TestFixture::round16(v);
    std::vector<double> cw(p.v);
    for (std::int64_t j = 0; j < p.v; ++j) cw[j] = j % 7 == 3 ? 0.0 : 0.5 + double(j % 4) * 0.375;
    Kokkos::View<float*, typename TestFixture::memory_space> local_w("w", w);
    auto h_w = Kokkos::create_mirror_view(local_w);
    for (std::int64_t j = 0; j < w; ++j) h_w(j) = float(cw[part.begin() + j]);
    Kokkos::deep_copy(local_w, h_w);
    const auto x = TestFixture::logits(p, part.begin(), w);
    const auto in = make_local<F>(p, part);
    const std::vector<double> scale(p.n, kGradScale);
    const auto s = static_cast<float>(kGradScale);
    std::vector<vpce::Options> opts(4);
    opts[1].label_smoothing = 0.1;
    opts[2].entropy_weight = 0.05;
    opts[2].z_loss = 1e-3;
    opts[3].logit_scale = 0.5;
    for (std::size_t o = 0; o < opts.size(); ++o) {
      const bool weighted = o == 1;
      const Reference ref = reference(p, opts[o], weighted ? &cw : nullptr);
      for (const std::int64_t rows : {std::int64_t(1), std::int64_t(0)}) {
        vpce::Options opt = opts[o];
        opt.block_rows = rows;
        typename TestFixture::cross_entropy ce(this->comm, part, opt);
        if (weighted) ce.set_class_weights(local_w);
        const std::string what =
            "V_local " + std::to_string(w) + ", options " + std::to_string(o) + ", " + describe(opt);
        auto loss = poisoned_vector<F>(p.n);
        auto g1 = poisoned_matrix<F>(p.n, w);
        ce.loss_and_grad(x, in.y, loss, g1, in.g);
        expect_allclose(to_host(loss), ref.loss, Tolerance<float>::loss, what + ": loss");
        expect_allclose(to_host(g1), expected_grad(ref, p, part.begin(), w, p.g), Tolerance<float>::grad,
                        what + ": float gradient", w);
        typename TestFixture::storage_matrix g2("g16", p.n, w);
        ce.loss_and_grad(x, in.y, loss, g2, s);
        TestFixture::expect_grad16(TestFixture::to_host16(g2), ref, p, part, scale, what + ": 16-bit gradient");
        typename TestFixture::storage_matrix buf("buf16", p.n, w);
        Kokkos::deep_copy(buf, x);
        ce.loss_and_grad(buf, in.y, loss, buf, s);
        expect_allclose(to_host(loss), ref.loss, Tolerance<float>::loss, what + ": loss in place");
        TestFixture::expect_grad16(TestFixture::to_host16(buf), ref, p, part, scale,
                                   what + ": 16-bit gradient in place");
      }
    }
  }
}

// Non-finite 16-bit logits: NaN is an error on every rank; a row half -inf gives a finite, right loss.
TYPED_TEST(HalfTest, NonFinite) {
  using F = typename TestFixture::float_C;
  const auto part = vpce::VocabPartition::even(40, this->comm);
  const std::int64_t w = part.local_size();
  Problem p = make_problem<float>(6, part.vocab_size(), 9);
  for (auto& v : p.x) v = TestFixture::round16(v);
  for (std::int64_t j = p.v / 2; j < p.v; ++j) p.at(3, j) = -kInf;
  p.y[3] = 0;
  const auto in = make_local<F>(p, part);
  typename TestFixture::cross_entropy ce(this->comm, part);
  auto loss = poisoned_vector<F>(p.n);
  ce.forward(TestFixture::logits(p, part.begin(), w), in.y, loss);
  expect_allclose(to_host(loss), reference(p).loss, Tolerance<float>::loss, "loss with a half -inf row");
  Problem bad = p;
  bad.at(2, p.v - 1) = kNaN;
  expect_error_on_all_ranks([&] { ce.forward(TestFixture::logits(bad, part.begin(), w), in.y, loss); },
                            "row 2 of the logits holds NaN or +inf");
}

}  // namespace
