// Probability (soft) targets: N x V_local target probabilities instead of target ids (PyTorch's "class
// probabilities"), alone and with label smoothing, class weights, the z-loss and an entropy weight, every
// strategy, memory mode and call path, 1-4 ranks with uneven and empty shards, against an independent float64
// reference over the gathered vocabulary; their errors (negative entries, rows that do not sum to 1, the
// wrong kind of targets for the options), the same on every rank.

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "test_utils.hpp"

namespace vpce_test {
extern std::atomic<long> g_mpi_calls;  // the PMPI counters of test_errors.cpp
}

namespace {

using namespace vpce_test;

/// MPI calls made by f() on this rank.
template <class F>
long count_mpi_calls(F&& f) {
  const long before = g_mpi_calls.load();
  f();
  return g_mpi_calls.load() - before;
}

/// The GLOBAL target probabilities (n x v, row-major), rounded to the scalar type: a few columns per row
/// carry most of the mass (distillation-like), some are exactly 0; each row sums to 1 before the rounding.
template <class Scalar>
std::vector<double> make_probs(std::int64_t n, std::int64_t v, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<double> q(n * v);
  for (std::int64_t i = 0; i < n; ++i) {
    double total = 0;
    for (std::int64_t j = 0; j < v; ++j) {
      double r = j % 5 == 2 ? 0.0 : rng.uniform(0.0, 1.0);
      if (rng.next() % 11 == 0) r += 20.0;  // a peak
      q[i * v + j] = r;
      total += r;
    }
    for (std::int64_t j = 0; j < v; ++j) {
      if constexpr (vpce::is_16bit_v<Scalar>) {
        q[i * v + j] = static_cast<float>(Scalar(static_cast<float>(q[i * v + j] / total)));
      } else {
        q[i * v + j] = double(static_cast<Scalar>(q[i * v + j] / total));
      }
    }
  }
  return q;
}

/// float64 reference with probability targets q (PyTorch's definition; w: class weights or nullptr):
///   c_j = w_j ((1 - alpha) q_j + alpha / V),  loss = sum_j c_j (lse - x_j) + zeta lse^2 + beta H,
///   d loss / d z_j = (p_j (sum_k c_k + 2 zeta lse + beta (mu - x_j)) - c_j) dx_j/dz_j.
/// Every row counts (no ignore_index); the mean divides by N.
Reference reference_probs(const Problem& p, const std::vector<double>& q, const vpce::Options& o,
                          const std::vector<double>* w) {
  const double scale = o.logit_scale, cap = o.softcap, alpha = o.label_smoothing, zeta = o.z_loss;
  const double beta = o.entropy_weight;
  Reference r;
  r.lse.assign(p.n, 0.0);
  r.loss.assign(p.n, 0.0);
  r.entropy.assign(p.n, 0.0);
  r.logprob.assign(p.n, 0.0);
  r.z_loss.assign(p.n, 0.0);
  r.dloss.assign(p.n * p.v, 0.0);
  r.valid.assign(p.n, true);
  r.n_valid = p.n;
  r.valid_weight = double(p.n);
  std::vector<double> x(p.v), dxdz(p.v), c(p.v);
  for (std::int64_t i = 0; i < p.n; ++i) {
    double m = -kInf;
    for (std::int64_t j = 0; j < p.v; ++j) {
      const double z = p.at(i, j);
      x[j] = cap > 0 ? cap * std::tanh(scale * z / cap) : scale * z;
      dxdz[j] = cap > 0 ? scale * (1.0 - (x[j] / cap) * (x[j] / cap)) : scale;
      m = std::max(m, x[j]);
    }
    long double s = 0;
    for (std::int64_t j = 0; j < p.v; ++j) s += std::exp(static_cast<long double>(x[j]) - m);
    const double lse = static_cast<double>(m + std::log(s));
    long double mu = 0, sum_c = 0, loss = 0;
    for (std::int64_t j = 0; j < p.v; ++j) {
      mu += std::exp(static_cast<long double>(x[j]) - lse) * x[j];
      c[j] = (w ? (*w)[j] : 1.0) * ((1.0 - alpha) * q[i * p.v + j] + alpha / double(p.v));
      sum_c += c[j];
      loss += c[j] * (static_cast<long double>(lse) - x[j]);
    }
    r.lse[i] = lse;
    r.entropy[i] = lse - static_cast<double>(mu);
    r.z_loss[i] = zeta * lse * lse;
    r.loss[i] = static_cast<double>(loss) + zeta * lse * lse + beta * r.entropy[i];
    for (std::int64_t j = 0; j < p.v; ++j) {
      const double pj = std::exp(x[j] - lse);
      const double d =
          pj * (static_cast<double>(sum_c) + 2.0 * zeta * lse + beta * (static_cast<double>(mu) - x[j])) - c[j];
      r.dloss[i * p.v + j] = d * dxdz[j];
    }
  }
  return r;
}

template <class C>
class ProbabilityTest : public ::testing::Test {
 protected:
  using scalar = typename C::scalar;
  using cross_entropy = typename C::cross_entropy;
  using compute = typename cross_entropy::compute_type;
  using matrix = Kokkos::View<scalar**, Kokkos::LayoutRight, typename C::memory_space>;
  vpce::Communicator comm{MPI_COMM_WORLD};

  /// This rank's columns of a global n x v matrix.
  matrix local_columns(const std::vector<double>& global, std::int64_t n, std::int64_t v,
                       const vpce::VocabPartition& part) {
    matrix out("local", n, part.local_size());
    auto h = Kokkos::create_mirror_view(out);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < part.local_size(); ++j)
        h(i, j) = static_cast<scalar>(global[i * v + part.begin() + j]);
    Kokkos::deep_copy(out, h);
    return out;
  }

  /// Every strategy x mode x path against reference_probs(); with `weighted`, class weights too. Each with
  /// the blocks the cache sets (13 rows: the head alone) and with blocks of 4 rows, whose rows after the head
  /// the fused strategy writes from stored exps (chained on one rank, in step with the next block's
  /// statistics on more).
  void expect_all_match(const vpce::Options& base, const std::string& label, bool weighted) {
    for (const std::int64_t rows : {base.block_rows, std::int64_t(4)}) {
      vpce::Options opt = base;
      opt.block_rows = rows;
      expect_all_match_blocks(opt, label + ", block_rows " + std::to_string(rows), weighted);
    }
  }
  void expect_all_match_blocks(const vpce::Options& base, const std::string& label, bool weighted) {
    std::uint64_t seed = 700;
    for (const auto& np : test_partitions(comm)) {
      const auto& part = np.part;
      const Problem p = make_problem<scalar>(13, part.vocab_size(), seed++);
      const std::vector<double> q = make_probs<scalar>(p.n, p.v, seed++);
      std::vector<double> w(p.v);
      for (std::int64_t j = 0; j < p.v; ++j) w[j] = j % 7 == 3 ? 0.0 : 0.5 + double(j % 4) * 0.375;
      const Reference ref = reference_probs(p, q, base, weighted ? &w : nullptr);
      const auto in = make_local<C>(p, part);
      const matrix probs = local_columns(q, p.n, p.v, part);
      Kokkos::View<compute*, typename C::memory_space> local_w("w", part.local_size());
      auto h_w = Kokkos::create_mirror_view(local_w);
      for (std::int64_t j = 0; j < part.local_size(); ++j) h_w(j) = compute(w[part.begin() + j]);
      Kokkos::deep_copy(local_w, h_w);
      for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
        for (auto mode : {vpce::Mode::stash_softmax, vpce::Mode::recompute}) {
          vpce::Options opt = base;
          opt.strategy = strategy;
          opt.mode = mode;
          opt.probability_targets = true;
          cross_entropy ce(comm, part, opt);
          if (weighted) ce.set_class_weights(local_w);
          for (Path path : all_paths()) {
            if (uses_grad_view(path) && opt.reduction != vpce::Reduction::none) continue;
            const std::string what = label + ", " + np.name + ", " + describe(opt) + ", " + to_string(path);
            const Outputs out = run(ce, in, probs, path);
            auto g = path_scale(p, path);
            if (opt.reduction == vpce::Reduction::mean)
              for (auto& v : g) v /= double(p.n);
            expect_matches_reference<C>(out, ref, p, part.begin(), part.local_size(), g, what);
            if (opt.reduction != vpce::Reduction::none) {
              const double want = ref.reduced(opt.reduction);
              EXPECT_TRUE(close(ce.reduced_loss(), want, Tolerance<scalar>::loss))
                  << what << ": reduced_loss " << ce.reduced_loss() << ", expected " << want;
            }
            expect_allclose(to_host(ce.z_loss_terms()), ref.z_loss, Tolerance<scalar>::loss, what + ": z_loss_terms");
            if (opt.entropy || opt.entropy_weight != 0)
              expect_allclose(to_host(ce.entropy()), ref.entropy, Tolerance<scalar>::loss, what + ": entropy");
          }
        }
      }
    }
  }

  /// run_path() with the target probabilities in place of the ids.
  Outputs run(cross_entropy& ce, const LocalInputs<C>& in, const matrix& probs, Path path) {
    const std::int64_t n = in.x.extent(0), w = in.x.extent(1);
    const auto s = static_cast<compute>(kGradScale);
    auto loss = poisoned_vector<C>(n);
    auto grad = poisoned_matrix<C>(n, w);
    Kokkos::View<compute*, typename C::memory_space> g("g", n);
    Kokkos::deep_copy(g, Kokkos::View<scalar*, typename C::memory_space>(in.g));
    Outputs out;
    switch (path) {
      case Path::forward_backward_scalar:
      case Path::forward_backward_view:
        ce.forward(in.x, probs, loss);
        if (path == Path::forward_backward_scalar) {
          ce.backward(s, grad);
        } else {
          ce.backward(g, grad);
        }
        break;
      case Path::fused_scalar:
        ce.loss_and_grad(in.x, probs, loss, grad, s);
        break;
      case Path::fused_view:
        ce.loss_and_grad(in.x, probs, loss, grad, g);
        break;
      case Path::fused_in_place_scalar:
      case Path::fused_in_place_view:
        Kokkos::deep_copy(grad, in.x);
        if (path == Path::fused_in_place_scalar) {
          ce.loss_and_grad(grad, probs, loss, grad, s);
        } else {
          ce.loss_and_grad(grad, probs, loss, grad, g);
        }
        break;
    }
    out.lse = to_host(ce.lse());
    out.loss = to_host(loss);
    out.grad = to_host(grad);
    return out;
  }
};

TYPED_TEST_SUITE(ProbabilityTest, AllConfigs, ConfigName);

TYPED_TEST(ProbabilityTest, Alone) { this->expect_all_match(vpce::Options{}, "probabilities", false); }

// PyTorch's label smoothing on top of the probabilities, the mean (divided by N); then class weights.
TYPED_TEST(ProbabilityTest, SmoothingMeanAndClassWeights) {
  vpce::Options opt;
  opt.label_smoothing = 0.2;
  opt.reduction = vpce::Reduction::mean;
  this->expect_all_match(opt, "probabilities, smoothing, mean", false);
  this->expect_all_match(opt, "probabilities, smoothing, mean, class weights", true);
}

// With the z-loss, an entropy bonus and the softcap; without the softcap (the host's gradient from stored
// exps); then the device's form of the kernels.
TYPED_TEST(ProbabilityTest, WithEverything) {
  vpce::Options opt;
  opt.label_smoothing = 0.1;
  opt.z_loss = 1e-3;
  opt.entropy_weight = -0.2;
  opt.softcap = 6;
  opt.reduction = vpce::Reduction::sum;
  this->expect_all_match(opt, "probabilities, smoothing, z-loss, entropy bonus, softcap", true);
  opt.softcap = 0;
  this->expect_all_match(opt, "probabilities, smoothing, z-loss, entropy bonus", true);
  opt.force_team_kernels = true;
  this->expect_all_match(opt, "probabilities, ..., team kernels", true);
}

// Bad probabilities on one rank's columns, and the wrong kind of targets: the same error on every rank,
// outputs untouched before the check, and the ranks still in step afterwards.
TYPED_TEST(ProbabilityTest, Errors) {
  using C = TypeParam;
  using scalar = typename C::scalar;
  const auto part = vpce::VocabPartition::even(11, this->comm);
  const Problem p = make_problem<scalar>(6, part.vocab_size(), 5);
  const auto in = make_local<C>(p, part);
  vpce::Options opt;
  opt.probability_targets = true;
  typename C::cross_entropy ce(this->comm, part, opt);
  auto loss = poisoned_vector<C>(p.n);
  auto grad = poisoned_matrix<C>(p.n, part.local_size());
  const int last = this->comm.size() - 1;
  const std::int64_t last_begin = part.begin(last), last_width = part.end(last) - part.begin(last);
  // A negative entry in row 4 on the last rank's columns (the rest a valid distribution).
  std::vector<double> q = make_probs<scalar>(p.n, p.v, 9);
  const std::vector<double> good = q;
  q[4 * p.v + last_begin] -= 0.5;
  q[4 * p.v + last_begin + (last_width > 1 ? 1 : 0)] += last_width > 1 ? 0.5 : 0.0;
  expect_error_on_all_ranks([&] { ce.loss_and_grad(in.x, this->local_columns(q, p.n, p.v, part), loss, grad); },
                            "row 4 of the target probabilities has a negative entry");
  // Row 2 sums to 0.5.
  q = good;
  for (std::int64_t j = 0; j < p.v; ++j) q[2 * p.v + j] *= 0.5;
  expect_error_on_all_ranks([&] { ce.forward(in.x, this->local_columns(q, p.n, p.v, part), loss); },
                            "row 2 of the target probabilities sums to 0.5");
  // Ids where probabilities are expected, and the other way round; logprob() has no target.
  expect_error_on_all_ranks([&] { ce.forward(in.x, in.y, loss); }, "Options::probability_targets is set");
  typename C::cross_entropy ids(this->comm, part);
  expect_error_on_all_ranks([&] { ids.forward(in.x, this->local_columns(good, p.n, p.v, part), loss); },
                            "need Options::probability_targets");
  ce.forward(in.x, this->local_columns(good, p.n, p.v, part), loss);
  expect_error_on_all_ranks([&] { ce.logprob(); }, "logprob() needs target ids");
  // Still in step: a valid call gives the reference.
  const Reference ref = reference_probs(p, good, opt, nullptr);
  const auto out = this->run(ce, in, this->local_columns(good, p.n, p.v, part), Path::fused_scalar);
  expect_matches_reference<C>(out, ref, p, part.begin(), part.local_size(), path_scale(p, Path::fused_scalar),
                              "after the errors");
}

// The one collective: probability targets add no MPI call (fused), two values per record: one all-reduce
// per block, as target ids make on more than one rank (on one rank, where a call keeps its exps, its rows
// after the head are chained and make none).
TYPED_TEST(ProbabilityTest, NoExtraCollective) {
  using C = TypeParam;
  using scalar = typename C::scalar;
  const auto part = vpce::VocabPartition::even(13, this->comm);
  const Problem p = make_problem<scalar>(7, part.vocab_size(), 3);
  const auto in = make_local<C>(p, part);
  const auto probs = this->local_columns(make_probs<scalar>(p.n, p.v, 4), p.n, p.v, part);
  vpce::Options opt;
  opt.block_rows = 3;
  typename C::cross_entropy ids(this->comm, part, opt);
  opt.probability_targets = true;
  typename C::cross_entropy soft(this->comm, part, opt);
  auto loss = poisoned_vector<C>(p.n);
  auto grad = poisoned_matrix<C>(p.n, part.local_size());
  const long soft_calls = count_mpi_calls([&] { soft.loss_and_grad(in.x, probs, loss, grad); });
  EXPECT_EQ(soft_calls, (1 + (p.n - soft.head_rows() + 2) / 3) * record_reduction_calls());  // head, blocks of 3
  if (this->comm.size() > 1) {
    EXPECT_EQ(soft_calls, count_mpi_calls([&] { ids.loss_and_grad(in.x, in.y, loss, grad); }));
  }
}

// 16-bit logits and target probabilities (bfloat16, float16; the host widens float16 to float 16 columns at a
// time where the CPU has F16C): rows of over two chunks of 4096 columns and a ragged end on every rank, with
// smoothing, class weights and an entropy weight, every strategy and mode, blocks of 4 rows (the fused
// strategy's gradient from stored exps, written in pieces in step with the next rows' statistics) and the
// default; against the float64 reference over the rounded values: the loss, a float gradient, and a 16-bit
// gradient out of place and in place within its rounding.
template <class S>
void expect_sixteen_bit_probabilities_match() {
  using F = Config<float, DefaultExec>;
  using cross_entropy = vpce::CrossEntropy<S, DefaultExec>;
  using memory_space = typename cross_entropy::memory_space;
  using matrix16 = Kokkos::View<S**, Kokkos::LayoutRight, memory_space>;
  const vpce::Communicator comm{MPI_COMM_WORLD};
  const auto part = vpce::VocabPartition::even(std::int64_t(9011) * comm.size() - 3, comm);
  const std::int64_t w = part.local_size();
  Problem p = make_problem<float>(13, part.vocab_size(), 41);
  for (auto& v : p.x) v = static_cast<float>(S(static_cast<float>(v)));
  const std::vector<double> q = make_probs<S>(p.n, p.v, 42);
  std::vector<double> cw(p.v);
  for (std::int64_t j = 0; j < p.v; ++j) cw[j] = j % 7 == 3 ? 0.0 : 0.5 + double(j % 4) * 0.375;
  auto local16 = [&](const std::vector<double>& global) {
    matrix16 out("local16", p.n, w);
    auto h = Kokkos::create_mirror_view(out);
    for (std::int64_t i = 0; i < p.n; ++i)
      for (std::int64_t j = 0; j < w; ++j) h(i, j) = S(static_cast<float>(global[i * p.v + part.begin() + j]));
    Kokkos::deep_copy(out, h);
    return out;
  };
  const matrix16 x = local16(p.x), probs = local16(q);
  Kokkos::View<float*, memory_space> local_w("w", w);
  auto h_w = Kokkos::create_mirror_view(local_w);
  for (std::int64_t j = 0; j < w; ++j) h_w(j) = float(cw[part.begin() + j]);
  Kokkos::deep_copy(local_w, h_w);
  const float s = static_cast<float>(kGradScale);
  const std::vector<double> scale(p.n, kGradScale);
  const Tol tol16 = std::is_same_v<S, vpce::bfloat16> ? Tol{4e-3, 1e-7} : Tol{6e-4, 1e-7};  // half an ulp
  auto to_host16 = [&](const matrix16& v) {
    auto h = Kokkos::create_mirror_view(v);
    Kokkos::deep_copy(h, v);
    std::vector<double> out(p.n * w);
    for (std::int64_t i = 0; i < p.n; ++i)
      for (std::int64_t j = 0; j < w; ++j) out[i * w + j] = static_cast<float>(h(i, j));
    return out;
  };
  for (const bool weighted : {false, true}) {
    vpce::Options base;
    base.probability_targets = true;
    base.label_smoothing = 0.1;
    base.entropy_weight = weighted ? -0.2 : 0.0;
    const Reference ref = reference_probs(p, q, base, weighted ? &cw : nullptr);
    const auto expected = expected_grad(ref, p, part.begin(), w, scale);
    for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
      for (auto mode : {vpce::Mode::stash_softmax, vpce::Mode::recompute}) {
        for (const std::int64_t rows : {base.block_rows, std::int64_t(4)}) {
          vpce::Options opt = base;
          opt.strategy = strategy;
          opt.mode = mode;
          opt.block_rows = rows;
          cross_entropy ce(comm, part, opt);
          if (weighted) ce.set_class_weights(local_w);
          const std::string what = std::string(weighted ? "class weights, entropy weight, " : "") + describe(opt);
          auto loss = poisoned_vector<F>(p.n);
          auto grad = poisoned_matrix<F>(p.n, w);
          ce.loss_and_grad(x, probs, loss, grad, s);
          expect_allclose(to_host(loss), ref.loss, Tolerance<float>::loss, what + ": loss");
          expect_allclose(to_host(grad), expected, Tolerance<float>::grad, what + ": float gradient", w);
          matrix16 g16("g16", p.n, w);
          ce.loss_and_grad(x, probs, loss, g16, s);
          expect_allclose(to_host16(g16), expected, tol16, what + ": 16-bit gradient", w);
          matrix16 buf("buf16", p.n, w);
          Kokkos::deep_copy(buf, x);
          ce.loss_and_grad(buf, probs, loss, buf, s);
          expect_allclose(to_host(loss), ref.loss, Tolerance<float>::loss, what + ": loss in place");
          expect_allclose(to_host16(buf), expected, tol16, what + ": 16-bit gradient in place", w);
          auto grad_b = poisoned_matrix<F>(p.n, w);
          ce.forward(x, probs, loss);
          ce.backward(s, grad_b);
          expect_allclose(to_host(grad_b), expected, Tolerance<float>::grad, what + ": backward", w);
        }
      }
    }
  }
}

TEST(ProbabilityTest16, BFloat16) { expect_sixteen_bit_probabilities_match<vpce::bfloat16>(); }
TEST(ProbabilityTest16, Float16) { expect_sixteen_bit_probabilities_match<vpce::float16>(); }

}  // namespace
