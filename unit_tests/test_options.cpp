// The training options of vpce::Options (ignore_index, reduction, global label smoothing, z-loss,
// logit_scale, softcap), alone and combined, against the float64 reference of test_utils.hpp, with both
// strategies, both memory modes and every call path; and their errors.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "test_utils.hpp"

namespace {

using namespace vpce_test;

template <class C>
class OptionsTest : public ::testing::Test {
 protected:
  using scalar = typename C::scalar;
  using cross_entropy = typename C::cross_entropy;
  using compute = typename cross_entropy::compute_type;
  vpce::Communicator comm{MPI_COMM_WORLD};

  /// The partitions of these tests: an uneven even split, and explicit sizes with zero-width ranks.
  std::vector<NamedPartition> partitions() {
    auto all = test_partitions(comm);
    return {all[0], all[2]};
  }

  /// The incoming gradient per row that a path applies under `reduction` (mean: grad_scale / the valid rows'
  /// weight, n_valid without class weights).
  static std::vector<double> incoming(const Problem& p, const Reference& ref, Path path, vpce::Reduction reduction) {
    auto g = path_scale(p, path);
    if (reduction == vpce::Reduction::mean) {
      for (auto& v : g) v = ref.valid_weight > 0 ? v / ref.valid_weight : 0.0;
    }
    return g;
  }

  /// Class weights for a vocabulary of v: in [0, 2), some exactly 0 (every 7th), the same on every rank.
  static std::vector<double> class_weights(std::int64_t v, std::uint64_t seed) {
    Rng rng(seed);
    std::vector<double> w(v);
    for (std::int64_t j = 0; j < v; ++j) w[j] = j % 7 == 3 ? 0.0 : double(static_cast<compute>(rng.uniform(0.0, 2.0)));
    return w;
  }

  /// Every strategy x memory mode x path (per-row grad_loss paths only with Reduction::none) matches the
  /// reference: loss, lse, gradient, num_valid() and reduced_loss(); ignored rows get exactly 0.
  /// `edit` adjusts the problem to the partition's vocabulary size (e.g. sets ignored targets).
  /// With `weighted`, class weights (class_weights()) are set on every CrossEntropy.
  template <class Edit>
  void expect_all_match(const vpce::Options& base, Edit edit, const std::string& label, bool weighted = false) {
    std::uint64_t seed = 500;
    for (const auto& np : partitions()) {
      const auto& part = np.part;
      Problem p = make_problem<scalar>(23, part.vocab_size(), seed++);
      edit(p);
      const std::vector<double> w = class_weights(part.vocab_size(), seed);
      const Reference ref = reference(p, base, weighted ? &w : nullptr);
      const auto in = make_local<C>(p, part);
      Kokkos::View<compute*, typename C::memory_space> local_w("local weights", part.local_size());
      auto h_w = Kokkos::create_mirror_view(local_w);
      for (std::int64_t j = 0; j < part.local_size(); ++j) h_w(j) = compute(w[part.begin() + j]);
      Kokkos::deep_copy(local_w, h_w);
      for (auto strategy : {vpce::Strategy::fused, vpce::Strategy::seed}) {
        for (auto mode : {vpce::Mode::stash_softmax, vpce::Mode::recompute}) {
          vpce::Options opt = base;
          opt.strategy = strategy;
          opt.mode = mode;
          cross_entropy ce(comm, part, opt);
          if (weighted) ce.set_class_weights(local_w);
          for (Path path : all_paths()) {
            if (uses_grad_view(path) && opt.reduction != vpce::Reduction::none) continue;
            const std::string what = label + ", " + np.name + ", " + describe(opt) + ", " + to_string(path);
            const Outputs out = run_path<C>(ce, in, path);
            const auto g = incoming(p, ref, path, opt.reduction);
            expect_matches_reference<C>(out, ref, p, part.begin(), part.local_size(), g, what);
            // The per-row outputs of the same call (computed from its records when asked).
            expect_allclose(to_host(ce.logprob()), ref.logprob, Tolerance<scalar>::loss, what + ": logprob");
            expect_allclose(to_host(ce.z_loss_terms()), ref.z_loss, Tolerance<scalar>::loss, what + ": z_loss_terms");
            if (opt.entropy || opt.entropy_weight != 0)
              expect_allclose(to_host(ce.entropy()), ref.entropy, Tolerance<scalar>::loss, what + ": entropy");
            EXPECT_EQ(ce.num_valid(), ref.n_valid) << what;
            EXPECT_TRUE(close(ce.valid_weight(), ref.valid_weight, Tolerance<scalar>::loss)) << what;
            if (opt.reduction != vpce::Reduction::none) {  // none: ReductionNoneReportsTheSum
              const double want = ref.reduced(opt.reduction);
              EXPECT_TRUE(close(ce.reduced_loss(), want, Tolerance<scalar>::loss))
                  << what << ": reduced_loss " << ce.reduced_loss() << ", expected " << want;
            }
            int not_zero = 0;
            for (std::int64_t i = 0; i < p.n; ++i) {
              if (ref.valid[i]) continue;
              if (out.loss[i] != 0.0) ++not_zero;
              for (std::int64_t j = 0; j < part.local_size(); ++j)
                not_zero += out.grad[i * part.local_size() + j] != 0.0;
            }
            EXPECT_EQ(not_zero, 0) << "rank " << world_rank() << ": " << what << ": ignored rows not exactly 0";
          }
        }
      }
    }
  }
};

TYPED_TEST_SUITE(OptionsTest, AllConfigs, ConfigName);

/// Rows 3, 7 and 8 get the target `ignore`.
auto ignore_rows(std::int64_t ignore) {
  return [ignore](Problem& p) {
    for (std::int64_t i : {3, 7, 8}) p.y[i] = ignore;
  };
}

/// A setting of the Options and the text the resulting error must contain.
struct OptionCase {
  const char* needle;
  void (*set)(vpce::Options&);
};

/// For each case, the ranks where `apply` is true change the Options; building a CrossEntropy must then
/// fail on every rank with the case's text; afterwards the ranks are still in step.
template <class C, std::size_t N>
void expect_constructor_errors(const vpce::Communicator& comm, const vpce::VocabPartition& part,
                               const OptionCase (&cases)[N], bool apply) {
  for (const auto& c : cases) {
    vpce::Options opt;
    if (apply) c.set(opt);
    expect_error_on_all_ranks([&] { typename C::cross_entropy ce(comm, part, opt); }, c.needle);
  }
  typename C::cross_entropy ce(comm, part);
  expect_in_step<C>(ce);
}

TYPED_TEST(OptionsTest, IgnoreIndexDefault) {
  vpce::Options opt;
  EXPECT_EQ(opt.ignore_index, -100);
  this->expect_all_match(opt, ignore_rows(-100), "ignore_index -100");
}

// An ignore_index inside [0, V) ignores the rows with that target (and only those).
TYPED_TEST(OptionsTest, IgnoreIndexInsideTheVocabulary) {
  vpce::Options opt;
  opt.ignore_index = 4;
  this->expect_all_match(opt, ignore_rows(4), "ignore_index 4");
}

TYPED_TEST(OptionsTest, LabelSmoothing) {
  vpce::Options opt;
  opt.label_smoothing = 0.1;
  this->expect_all_match(opt, ignore_rows(-100), "label_smoothing 0.1");
  opt.label_smoothing = 1.0;
  this->expect_all_match(
      opt, [](Problem&) {}, "label_smoothing 1");
}

TYPED_TEST(OptionsTest, ZLoss) {
  vpce::Options opt;
  opt.z_loss = 1e-3;
  this->expect_all_match(opt, ignore_rows(-100), "z_loss 1e-3");
}

// The entropy as an output (its statistic in the records), alone and with the z-loss; then as a term of the
// loss, an entropy bonus (negative weight) with everything else that changes the gradient.
TYPED_TEST(OptionsTest, Entropy) {
  vpce::Options opt;
  opt.entropy = true;
  this->expect_all_match(opt, ignore_rows(-100), "entropy");
  opt.z_loss = 1e-3;
  this->expect_all_match(opt, ignore_rows(-100), "entropy, z_loss 1e-3");
}

TYPED_TEST(OptionsTest, EntropyWeight) {
  vpce::Options opt;
  opt.entropy_weight = 0.3;
  this->expect_all_match(opt, ignore_rows(-100), "entropy_weight 0.3");
  opt.entropy_weight = -0.2;
  opt.label_smoothing = 0.1;
  opt.z_loss = 1e-3;
  opt.reduction = vpce::Reduction::mean;
  this->expect_all_match(opt, ignore_rows(-100), "entropy_weight -0.2, smoothing, z-loss, mean");
  opt.softcap = 5;
  opt.logit_scale = 0.5;
  this->expect_all_match(opt, ignore_rows(-100), "entropy_weight -0.2, smoothing, z-loss, mean, softcap");
  opt.force_team_kernels = true;  // the device's form: h per thread, merged across the team
  this->expect_all_match(opt, ignore_rows(-100), "entropy_weight -0.2, ..., softcap, team kernels");
  opt.softcap = 0;
  opt.logit_scale = 1;
  this->expect_all_match(opt, ignore_rows(-100), "entropy_weight -0.2, smoothing, z-loss, mean, team kernels");
}

// Class weights (PyTorch's `weight`, some of them 0): alone; with label smoothing, ignored rows and the mean
// (PyTorch's: divided by the valid targets' weights); with everything else too; in the device's form.
TYPED_TEST(OptionsTest, ClassWeights) {
  vpce::Options opt;
  this->expect_all_match(opt, ignore_rows(-100), "class weights", true);
  opt.label_smoothing = 0.1;
  opt.reduction = vpce::Reduction::mean;
  this->expect_all_match(opt, ignore_rows(-100), "class weights, smoothing, ignore, mean", true);
  opt.z_loss = 1e-3;
  opt.entropy_weight = 0.2;
  opt.softcap = 5;
  this->expect_all_match(opt, ignore_rows(-100), "class weights, smoothing, mean, z-loss, entropy, softcap", true);
  opt.force_team_kernels = true;
  opt.softcap = 0;
  this->expect_all_match(opt, ignore_rows(-100), "class weights, ..., team kernels", true);
}

// Bad class weights on one rank: the same error on every rank, and the ranks stay in step; weights set and
// then cleared give the unweighted results.
TYPED_TEST(OptionsTest, ClassWeightErrors) {
  using C = TypeParam;
  using compute = typename C::cross_entropy::compute_type;
  const auto part = vpce::VocabPartition::even(11, this->comm);
  typename C::cross_entropy ce(this->comm, part);
  const int last = this->comm.size() - 1;
  auto weights = [&](std::int64_t n, double value_on_last) {
    Kokkos::View<compute*, typename C::memory_space> w("w", n);
    Kokkos::deep_copy(w, compute(this->comm.rank() == last ? value_on_last : 1.0));
    return w;
  };
  const std::int64_t v = part.local_size();
  expect_error_on_all_ranks([&] { ce.set_class_weights(weights(this->comm.rank() == last ? v + 1 : v, 1.0)); },
                            "the class weights have");
  expect_error_on_all_ranks([&] { ce.set_class_weights(weights(v, -0.5)); }, "is negative or not finite");
  expect_error_on_all_ranks([&] { ce.set_class_weights(weights(v, std::nan(""))); }, "is negative or not finite");
  expect_in_step<C>(ce);
  ce.set_class_weights(weights(v, 3.0));
  ce.clear_class_weights();
  expect_in_step<C>(ce);
}

// entropy() without its statistic is a clear error (local: the options are the same on every rank).
TYPED_TEST(OptionsTest, EntropyWithoutTheOption) {
  using C = TypeParam;
  const auto part = vpce::VocabPartition::even(11, this->comm);
  typename C::cross_entropy ce(this->comm, part);
  const Problem p = make_problem<typename C::scalar>(4, part.vocab_size(), 3);
  const auto in = make_local<C>(p, part);
  run_path<C>(ce, in, Path::fused_scalar);
  expect_error_on_all_ranks([&] { ce.entropy(); }, "needs Options::entropy");
}

TYPED_TEST(OptionsTest, LogitScale) {
  vpce::Options opt;
  opt.logit_scale = 0.625;
  this->expect_all_match(
      opt, [](Problem&) {}, "logit_scale 0.625");
}

TYPED_TEST(OptionsTest, Softcap) {
  vpce::Options opt;
  opt.softcap = 30;
  this->expect_all_match(
      opt, [](Problem&) {}, "softcap 30");
  opt.logit_scale = 1.5;
  opt.softcap = 15;
  this->expect_all_match(opt, ignore_rows(-100), "softcap 15, logit_scale 1.5");
}

TYPED_TEST(OptionsTest, AllCombined) {
  vpce::Options opt;
  opt.label_smoothing = 0.2;
  opt.z_loss = 1e-4;
  opt.logit_scale = 0.75;
  opt.softcap = 20;
  this->expect_all_match(opt, ignore_rows(-100), "all options");
}

// Reduction::sum and ::mean: reduced_loss() and the gradient of grad_scale * (sum or mean), with ignored
// rows (not counted in the mean), alone and with the other options.
TYPED_TEST(OptionsTest, Reductions) {
  for (auto reduction : {vpce::Reduction::sum, vpce::Reduction::mean}) {
    vpce::Options opt;
    opt.reduction = reduction;
    const std::string name = vpce::to_string(reduction);
    this->expect_all_match(opt, ignore_rows(-100), "reduction " + name);
    opt.label_smoothing = 0.1;
    opt.z_loss = 1e-4;
    opt.softcap = 25;
    this->expect_all_match(opt, ignore_rows(-100), "reduction " + name + " with options");
  }
}

// Reduction::none: reduced_loss() is the sum of the per-token losses (cross_entropy.hpp: "the sum for none").
TYPED_TEST(OptionsTest, ReductionNoneReportsTheSum) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(31, this->comm);
  Problem p = make_problem<scalar>(9, part.vocab_size(), 21);
  p.y[4] = -100;
  const Reference ref = reference(p);
  const auto in = make_local<TypeParam>(p, part);
  typename TestFixture::cross_entropy ce(this->comm, part);
  auto loss = poisoned_vector<TypeParam>(p.n);
  ce.forward(in.x, in.y, loss);
  EXPECT_EQ(ce.num_valid(), 8);
  EXPECT_TRUE(close(ce.reduced_loss(), ref.reduced(vpce::Reduction::none), Tolerance<scalar>::loss))
      << "reduced_loss " << ce.reduced_loss() << ", expected " << ref.reduced(vpce::Reduction::none);
}

// Every row ignored: loss 0, gradient 0, num_valid 0, and the mean is 0 (not NaN).
TYPED_TEST(OptionsTest, EveryRowIgnored) {
  for (auto reduction : {vpce::Reduction::none, vpce::Reduction::sum, vpce::Reduction::mean}) {
    vpce::Options opt;
    opt.reduction = reduction;
    this->expect_all_match(
        opt,
        [](Problem& p) {
          for (auto& t : p.y) t = -100;
        },
        std::string("every row ignored, reduction ") + vpce::to_string(reduction));
  }
}

// A per-row grad_loss needs Reduction::none: every rank throws, in loss_and_grad() and in backward().
TYPED_TEST(OptionsTest, PerRowGradLossNeedsReductionNone) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(31, this->comm);
  const Problem p = make_problem<scalar>(6, part.vocab_size(), 9);
  const auto in = make_local<TypeParam>(p, part);
  for (auto reduction : {vpce::Reduction::sum, vpce::Reduction::mean}) {
    vpce::Options opt;
    opt.reduction = reduction;
    typename TestFixture::cross_entropy ce(this->comm, part, opt);
    auto loss = poisoned_vector<TypeParam>(p.n);
    auto grad = poisoned_matrix<TypeParam>(p.n, part.local_size());
    const std::string needle =
        std::string("a per-row grad_loss needs Options::reduction none, not ") + vpce::to_string(reduction);
    expect_error_on_all_ranks([&] { ce.loss_and_grad(in.x, in.y, loss, grad, in.g); }, needle);
    ce.forward(in.x, in.y, loss);
    expect_error_on_all_ranks([&] { ce.backward(in.g, grad); }, needle);
    // Still in step, and the scalar form works.
    ce.loss_and_grad(in.x, in.y, loss, grad, scalar(2));
    const Reference ref = reference(p, opt);
    const double n = reduction == vpce::Reduction::mean ? double(ref.n_valid) : 1.0;
    expect_allclose(to_host(grad),
                    expected_grad(ref, p, part.begin(), part.local_size(), std::vector<double>(p.n, 2 / n)),
                    Tolerance<scalar>::grad, "grad after the error", part.local_size());
  }
}

// Out-of-range option values (on the last rank only): every rank throws.
TYPED_TEST(OptionsTest, InvalidValues) {
  const auto part = vpce::VocabPartition::even(12, this->comm);
  const bool me = this->comm.rank() == this->comm.size() - 1;
  const OptionCase cases[] = {
      {"Options::label_smoothing is -0.1", [](vpce::Options& o) { o.label_smoothing = -0.1; }},
      {"Options::label_smoothing is 1.5", [](vpce::Options& o) { o.label_smoothing = 1.5; }},
      {"Options::z_loss is -1", [](vpce::Options& o) { o.z_loss = -1; }},
      {"Options::logit_scale is 0", [](vpce::Options& o) { o.logit_scale = 0; }},
      {"Options::logit_scale is -2", [](vpce::Options& o) { o.logit_scale = -2; }},
      {"Options::softcap is -1", [](vpce::Options& o) { o.softcap = -1; }},
      {"Options::entropy_weight is nan", [](vpce::Options& o) { o.entropy_weight = std::nan(""); }},
  };
  expect_constructor_errors<TypeParam>(this->comm, part, cases, me);
}

// Options differing between ranks (rank 0 differs): every rank throws naming the option.
TYPED_TEST(OptionsTest, DifferingBetweenRanks) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const auto part = vpce::VocabPartition::even(12, this->comm);
  const bool me = this->comm.rank() == 0;
  const OptionCase cases[] = {
      {"Options::ignore_index differs between ranks", [](vpce::Options& o) { o.ignore_index = -1; }},
      {"Options::reduction differs between ranks", [](vpce::Options& o) { o.reduction = vpce::Reduction::mean; }},
      {"Options::label_smoothing (bits) differs between ranks", [](vpce::Options& o) { o.label_smoothing = 0.1; }},
      {"Options::z_loss (bits) differs between ranks", [](vpce::Options& o) { o.z_loss = 1e-4; }},
      {"Options::logit_scale (bits) differs between ranks", [](vpce::Options& o) { o.logit_scale = 2; }},
      {"Options::softcap (bits) differs between ranks", [](vpce::Options& o) { o.softcap = 30; }},
      {"Options::entropy differs between ranks", [](vpce::Options& o) { o.entropy = true; }},
      {"Options::entropy_weight (bits) differs between ranks", [](vpce::Options& o) { o.entropy_weight = 0.1; }},
  };
  expect_constructor_errors<TypeParam>(this->comm, part, cases, me);
}

// With a custom ignore_index, the default one (-100) is an ordinary out-of-range target.
TYPED_TEST(OptionsTest, TargetMinus100IsAnErrorWithAnotherIgnoreIndex) {
  using scalar = typename TestFixture::scalar;
  const auto part = vpce::VocabPartition::even(12, this->comm);
  Problem p = make_problem<scalar>(5, part.vocab_size(), 3);
  p.y[2] = -100;
  const auto in = make_local<TypeParam>(p, part);
  vpce::Options opt;
  opt.ignore_index = -1;
  typename TestFixture::cross_entropy ce(this->comm, part, opt);
  auto loss = poisoned_vector<TypeParam>(p.n);
  expect_error_on_all_ranks([&] { ce.forward(in.x, in.y, loss); }, "target -100 of row 2 is outside [0, 12)");
  expect_in_step<TypeParam>(ce);
}

}  // namespace

// The default block size comes from the core's L2 (half of it: blocks large enough that their collectives
// cost little, the exps of three of them in L2 and L3), clamped.
TEST(OptionsDefaults, BlockBytesFromTheCache) {
  const std::int64_t b = vpce::default_block_bytes_per_thread();
  EXPECT_GE(b, std::int64_t(128) << 10);
  EXPECT_LE(b, std::int64_t(8) << 20);
  EXPECT_EQ(vpce::Options().block_bytes_per_thread, b);
#if defined(_SC_LEVEL2_CACHE_SIZE)
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (l2 >= (256 << 10) && l2 <= (16 << 20)) {
    EXPECT_EQ(b, l2 / 2);
  }
#endif
}
