// vpce::LinearCrossEntropy (the LM head fused with the cross entropy) against the materialised path
// (logits = hidden x W^T computed in full, then CrossEntropy::loss_and_grad, then the two gradient products
// and a SUM over the ranks), at every rank count of the suite, even and uneven partitions (with an empty
// slice), chunk sizes that do and do not divide N or the slice, every reduction and the options; gradients
// by finite differences; the errors.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "test_utils.hpp"
#include "vpce/linear_cross_entropy.hpp"

namespace {

using namespace vpce_test;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;

/// A deterministic value in [-1, 1) from (a, b, seed).
inline double hash_value(std::int64_t a, std::int64_t b, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + std::uint64_t(a) * 0xBF58476D1CE4E5B9ull + std::uint64_t(b);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return double(x >> 11) / double(1ull << 52) - 1.0;
}

/// A problem: hidden (N x H) the same on every rank, the global weight (V x H), targets; bias (V) or empty.
struct LinearProblem {
  std::int64_t n, h, v;
  std::vector<double> hidden, weight;
  std::vector<std::int64_t> targets;
  std::vector<double> bias;
};

LinearProblem make_linear(std::int64_t n, std::int64_t h, std::int64_t v, std::uint64_t seed,
                          std::int64_t ignore_every = 0, std::int64_t ignore_index = -100) {
  LinearProblem p{n, h, v, std::vector<double>(n * h), std::vector<double>(v * h), std::vector<std::int64_t>(n), {}};
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t k = 0; k < h; ++k) p.hidden[i * h + k] = 2 * hash_value(i, k, seed);
  for (std::int64_t j = 0; j < v; ++j)
    for (std::int64_t k = 0; k < h; ++k) p.weight[j * h + k] = hash_value(j, k, seed + 1);
  for (std::int64_t i = 0; i < n; ++i) {
    p.targets[i] = std::int64_t((hash_value(i, 7, seed + 2) + 1) * 0.5 * v) % v;
    if (ignore_every > 0 && i % ignore_every == ignore_every - 1) p.targets[i] = ignore_index;
  }
  return p;
}

template <class T>
Kokkos::View<T**, Kokkos::LayoutRight, Mem> device_matrix(const std::vector<double>& src, std::int64_t row0,
                                                          std::int64_t rows, std::int64_t cols) {
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> d("m", rows, cols);
  auto hst = Kokkos::create_mirror_view(d);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t k = 0; k < cols; ++k) hst(i, k) = T(src[(row0 + i) * cols + k]);
  Kokkos::deep_copy(d, hst);
  return d;
}

/// src[first, first + count) as a device View of T.
template <class T, class V = std::vector<double>>
Kokkos::View<T*, Mem> device_vector(const V& src, std::int64_t first, std::int64_t count) {
  Kokkos::View<T*, Mem> d("v", count);
  auto hst = Kokkos::create_mirror_view(d);
  for (std::int64_t i = 0; i < count; ++i) hst(i) = T(src[first + i]);
  Kokkos::deep_copy(d, hst);
  return d;
}

template <class T>
Kokkos::View<T**, Kokkos::LayoutRight, Mem> poisoned_matrix(std::int64_t rows, std::int64_t cols) {
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> d("g", rows, cols);
  Kokkos::deep_copy(d, std::numeric_limits<T>::quiet_NaN());
  return d;
}

template <class T>
std::vector<double> host_values(const Kokkos::View<T**, Kokkos::LayoutRight, Mem>& d) {
  auto hst = Kokkos::create_mirror_view(d);
  Kokkos::deep_copy(hst, d);
  std::vector<double> out(d.extent(0) * d.extent(1));
  for (std::size_t i = 0; i < d.extent(0); ++i)
    for (std::size_t k = 0; k < d.extent(1); ++k) out[i * d.extent(1) + k] = double(hst(i, k));
  return out;
}

template <class V>
std::vector<double> host_vector(const V& d) {
  auto hst = Kokkos::create_mirror_view(d);
  Kokkos::deep_copy(hst, d);
  std::vector<double> out(d.extent(0));
  for (std::size_t i = 0; i < d.extent(0); ++i) out[i] = double(hst(i));
  return out;
}

/// Largest |a - b| / (atol + rtol |b|); <= 1 passes.
double worst(const std::vector<double>& a, const std::vector<double>& b, double rtol, double atol) {
  double w = a.size() == b.size() ? 0 : 1e300;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double e = std::abs(a[i] - b[i]) / (atol + rtol * std::abs(b[i]));
    w = std::max(w, std::isnan(e) ? 1e300 : e);
  }
  return w;
}

/// The materialised reference, in double on the host: full logits of this rank's slice, the core's
/// loss_and_grad (double) on them, then grad_W = dlogits^T hidden and grad_hidden = sum over ranks of
/// dlogits W_r.
struct Reference {
  std::vector<double> loss, lse, grad_hidden, grad_weight, grad_bias;
  double reduced = 0;
  std::int64_t n_valid = 0;
};

Reference materialised(const vpce::Communicator& comm, const vpce::VocabPartition& part, const LinearProblem& p,
                       const vpce::Options& opt, double grad_scale) {
  const std::int64_t n = p.n, h = p.h, w = part.local_size(), b = part.begin();
  Kokkos::View<double**, Kokkos::LayoutRight, Mem> logits("logits", n, w);
  auto lh = Kokkos::create_mirror_view(logits);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < w; ++j) {
      double s = 0;
      for (std::int64_t k = 0; k < h; ++k) s += p.hidden[i * h + k] * p.weight[(b + j) * h + k];
      lh(i, j) = s + (p.bias.empty() ? 0.0 : p.bias[b + j]);
    }
  Kokkos::deep_copy(logits, lh);
  const auto y = device_vector<std::int64_t>(p.targets, 0, n);
  Kokkos::View<double*, Mem> loss("loss", n);
  vpce::CrossEntropy<double, Exec> ce(comm, part, opt);
  ce.loss_and_grad(logits, y, loss, logits, grad_scale);
  Reference r;
  r.loss = host_vector(loss);
  r.lse = host_vector(ce.lse());
  r.reduced = ce.reduced_loss();
  r.n_valid = ce.num_valid();
  const auto d = host_values(logits);
  r.grad_weight.assign(w * h, 0.0);
  r.grad_hidden.assign(n * h, 0.0);
  r.grad_bias.assign(w, 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < w; ++j) {
      r.grad_bias[j] += d[i * w + j];
      for (std::int64_t k = 0; k < h; ++k) {
        r.grad_weight[j * h + k] += d[i * w + j] * p.hidden[i * h + k];
        r.grad_hidden[i * h + k] += d[i * w + j] * p.weight[(b + j) * h + k];
      }
    }
  MPI_Allreduce(MPI_IN_PLACE, r.grad_hidden.data(), int(n * h), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return r;
}

template <class T>
class LinearTest : public ::testing::Test {
 protected:
  vpce::Communicator comm{MPI_COMM_WORLD};
};
using LinearTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LinearTest, LinearTypes);

std::vector<vpce::VocabPartition> partitions(const vpce::Communicator& comm, std::int64_t v) {
  const int rank = comm.rank(), size = comm.size();
  // Even, and uneven with an empty slice on rank 0 (when there is more than one rank).
  std::vector<std::int64_t> sizes(size, 0);
  std::int64_t left = v;
  for (int r = size - 1; r >= (size > 1 ? 1 : 0); --r) {
    sizes[r] = r == (size > 1 ? 1 : 0) ? left : std::max<std::int64_t>(1, v / (2 * size) + r);
    left -= sizes[r];
  }
  (void)rank;
  return {vpce::VocabPartition::even(v, comm), vpce::VocabPartition::from_sizes(sizes, comm, v)};
}

TYPED_TEST(LinearTest, MatchesMaterialisedPath) {
  using T = TypeParam;
  using LCE = vpce::LinearCrossEntropy<T, Exec>;
  const double rtol = std::is_same_v<T, float> ? 2e-4 : 1e-11, atol = std::is_same_v<T, float> ? 2e-5 : 1e-13;
  const std::int64_t n = 23, h = 5, v = 41;
  std::vector<vpce::Options> options(4);
  options[1].reduction = vpce::Reduction::mean;
  options[1].ignore_index = -1;
  options[2].reduction = vpce::Reduction::sum;
  options[2].label_smoothing = 0.1;
  options[2].z_loss = 1e-3;
  options[3].softcap = 4;
  options[3].logit_scale = 1.5;
  options[3].strategy = vpce::Strategy::seed;
  for (const auto& part : partitions(this->comm, v))
    for (const auto& opt : options) {
      const LinearProblem p = make_linear(n, h, v, 11, 4, opt.ignore_index);
      const double g = 0.75;
      const Reference ref = materialised(this->comm, part, p, opt, g);
      const auto hidden = device_matrix<T>(p.hidden, 0, n, h);
      const auto weight = device_matrix<T>(p.weight, part.begin(), part.local_size(), h);
      const auto y = device_vector<std::int64_t>(p.targets, 0, n);
      for (std::int64_t chunk : {0, 1, 4, 7, 23, 30}) {
        vpce::LinearOptions lo;
        lo.chunk_rows = chunk;
        LCE lce(this->comm, part, h, opt, lo);
        const std::string what = "chunk " + std::to_string(lce.chunk_rows()) + " slice " +
                                 std::to_string(part.local_size()) + " reduction " + vpce::to_string(opt.reduction) +
                                 " smoothing " + std::to_string(opt.label_smoothing);
        Kokkos::View<T*, Mem> loss("loss", n);
        auto gh = poisoned_matrix<T>(n, h);
        auto gw = poisoned_matrix<T>(part.local_size(), h);
        lce.loss_and_grad(hidden, weight, y, loss, gh, gw, T(g));
        EXPECT_LE(worst(host_vector(loss), ref.loss, rtol, atol), 1.0) << what;
        EXPECT_LE(worst(host_vector(lce.lse()), ref.lse, rtol, atol), 1.0) << what;
        EXPECT_LE(worst(host_values(gh), ref.grad_hidden, rtol, atol), 1.0) << what;
        EXPECT_LE(worst(host_values(gw), ref.grad_weight, rtol, atol), 1.0) << what;
        EXPECT_LE(worst({lce.reduced_loss()}, {ref.reduced}, rtol, atol), 1.0) << what;
        EXPECT_EQ(lce.num_valid(), ref.n_valid) << what;

        // forward() then backward(scalar): the same loss and gradients; accumulate_weight adds.
        Kokkos::View<T*, Mem> loss2("loss2", n);
        lce.forward(hidden, weight, y, loss2);
        EXPECT_LE(worst(host_vector(loss2), ref.loss, rtol, atol), 1.0) << what << " (forward)";
        EXPECT_LE(worst({lce.reduced_loss()}, {ref.reduced}, rtol, atol), 1.0) << what << " (forward)";
        auto gh2 = poisoned_matrix<T>(n, h);
        auto gw2 = poisoned_matrix<T>(part.local_size(), h);
        lce.backward(T(g), gh2, gw2);
        EXPECT_LE(worst(host_values(gh2), ref.grad_hidden, rtol, atol), 1.0) << what << " (backward)";
        EXPECT_LE(worst(host_values(gw2), ref.grad_weight, rtol, atol), 1.0) << what << " (backward)";
        lce.backward(T(g), gh2, gw2, /*accumulate_weight=*/true);
        std::vector<double> twice = ref.grad_weight;
        for (auto& x : twice) x *= 2;
        EXPECT_LE(worst(host_values(gw2), twice, rtol, atol), 1.0) << what << " (accumulate)";
      }
    }
}

TYPED_TEST(LinearTest, PerRowGradLoss) {
  using T = TypeParam;
  const double rtol = std::is_same_v<T, float> ? 2e-4 : 1e-11, atol = std::is_same_v<T, float> ? 2e-5 : 1e-13;
  const std::int64_t n = 10, h = 3, v = 13;
  const auto part = vpce::VocabPartition::even(v, this->comm);
  const LinearProblem p = make_linear(n, h, v, 5);
  const auto hidden = device_matrix<T>(p.hidden, 0, n, h);
  const auto weight = device_matrix<T>(p.weight, part.begin(), part.local_size(), h);
  const auto y = device_vector<std::int64_t>(p.targets, 0, n);
  Kokkos::View<T*, Mem> gl("grad_loss", n);
  auto glh = Kokkos::create_mirror_view(gl);
  for (std::int64_t i = 0; i < n; ++i) glh(i) = T(0.1 * (i + 1));
  Kokkos::deep_copy(gl, glh);
  // Reference: the per-row weights applied to the reference with g = 1, row by row (linear in g_i): do it
  // by scaling hidden's gradient contributions through the core directly.
  vpce::LinearOptions lo;
  lo.chunk_rows = 3;
  vpce::LinearCrossEntropy<T, Exec> lce(this->comm, part, h, {}, lo);
  Kokkos::View<T*, Mem> loss("loss", n);
  auto gh = poisoned_matrix<T>(n, h);
  auto gw = poisoned_matrix<T>(part.local_size(), h);
  lce.loss_and_grad(hidden, weight, y, loss, gh, gw, gl);
  // Same thing through forward + backward(per-row).
  auto gh2 = poisoned_matrix<T>(n, h);
  auto gw2 = poisoned_matrix<T>(part.local_size(), h);
  lce.forward(hidden, weight, y, loss);
  lce.backward(gl, gh2, gw2);
  EXPECT_LE(worst(host_values(gh2), host_values(gh), rtol, atol), 1.0);
  EXPECT_LE(worst(host_values(gw2), host_values(gw), rtol, atol), 1.0);
  // And against one chunk of all rows with g_i folded in row by row: rows with g = 0 contribute nothing.
  std::vector<double> ref_h(n * h, 0.0), ref_w(part.local_size() * h, 0.0);
  for (std::int64_t i = 0; i < n; ++i) {
    LinearProblem one = p;
    one.n = 1;
    one.hidden.assign(p.hidden.begin() + i * h, p.hidden.begin() + (i + 1) * h);
    one.targets = {p.targets[i]};
    const Reference r = materialised(this->comm, part, one, {}, 0.1 * (i + 1));
    for (std::int64_t k = 0; k < h; ++k) ref_h[i * h + k] = r.grad_hidden[k];
    for (std::size_t k = 0; k < ref_w.size(); ++k) ref_w[k] += r.grad_weight[k];
  }
  EXPECT_LE(worst(host_values(gh), ref_h, rtol, atol), 1.0);
  EXPECT_LE(worst(host_values(gw), ref_w, rtol, atol), 1.0);
}

// Central differences in double of F = sum_i g_i loss_i with respect to hidden (replicated: every rank
// perturbs it) and to this rank's weight rows (only the owner perturbs).
TEST(LinearGradCheck, FiniteDifferences) {
  vpce::Communicator comm(MPI_COMM_WORLD);
  const std::int64_t n = 5, h = 3, v = 7;
  const double eps = 1e-6;
  const auto part = vpce::VocabPartition::even(v, comm);
  LinearProblem p = make_linear(n, h, v, 3, 5);
  vpce::Options opt;
  opt.z_loss = 1e-2;
  opt.softcap = 2.5;
  opt.label_smoothing = 0.05;
  vpce::LinearOptions lo;
  lo.chunk_rows = 2;
  vpce::LinearCrossEntropy<double, Exec> lce(comm, part, h, opt, lo);
  const auto y = device_vector<std::int64_t>(p.targets, 0, n);
  Kokkos::View<double*, Mem> gl("grad_loss", n), loss("loss", n);
  auto glh = Kokkos::create_mirror_view(gl);
  for (std::int64_t i = 0; i < n; ++i) glh(i) = 1.0 + 0.25 * i;
  Kokkos::deep_copy(gl, glh);
  auto objective = [&](const LinearProblem& q) {
    const auto hd = device_matrix<double>(q.hidden, 0, n, h);
    const auto wd = device_matrix<double>(q.weight, part.begin(), part.local_size(), h);
    lce.forward(hd, wd, y, loss);
    const auto l = host_vector(loss);
    double f = 0;
    for (std::int64_t i = 0; i < n; ++i) f += glh(i) * l[i];
    return f;
  };
  const auto hidden = device_matrix<double>(p.hidden, 0, n, h);
  const auto weight = device_matrix<double>(p.weight, part.begin(), part.local_size(), h);
  auto gh = poisoned_matrix<double>(n, h);
  auto gw = poisoned_matrix<double>(part.local_size(), h);
  lce.loss_and_grad(hidden, weight, y, loss, gh, gw, gl);
  const auto agh = host_values(gh), agw = host_values(gw);
  std::vector<double> ngh(n * h), ngw(part.local_size() * h, 0.0);
  for (std::int64_t e = 0; e < n * h; ++e) {
    LinearProblem q = p;
    q.hidden[e] += eps;
    const double fp = objective(q);
    q.hidden[e] -= 2 * eps;
    ngh[e] = (fp - objective(q)) / (2 * eps);
  }
  for (std::int64_t e = 0; e < v * h; ++e) {  // every rank takes part in every evaluation
    const std::int64_t j = e / h;
    LinearProblem q = p;
    q.weight[e] += eps;
    const double fp = objective(q);
    q.weight[e] -= 2 * eps;
    const double d = (fp - objective(q)) / (2 * eps);
    if (j >= part.begin() && j < part.end()) ngw[(j - part.begin()) * h + e % h] = d;
  }
  EXPECT_LE(worst(agh, ngh, 1e-6, 1e-7), 1.0);
  EXPECT_LE(worst(agw, ngw, 1e-6, 1e-7), 1.0);
}

TEST(LinearErrors, BadInputsThrowOnEveryRank) {
  vpce::Communicator comm(MPI_COMM_WORLD);
  const int rank = comm.rank();
  const std::int64_t n = 6, h = 4, v = 11;
  const auto part = vpce::VocabPartition::even(v, comm);
  const LinearProblem p = make_linear(n, h, v, 9);
  using LCE = vpce::LinearCrossEntropy<float, Exec>;
  const auto hidden = device_matrix<float>(p.hidden, 0, n, h);
  const auto weight = device_matrix<float>(p.weight, part.begin(), part.local_size(), h);
  const auto y = device_vector<std::int64_t>(p.targets, 0, n);
  Kokkos::View<float*, Mem> loss("loss", n);
  auto gh = poisoned_matrix<float>(n, h);
  auto gw = poisoned_matrix<float>(part.local_size(), h);

  expect_error_on_all_ranks([&] { LCE bad(comm, part, 0); }, "hidden_size");
  if (comm.size() > 1) {  // values that must agree across ranks
    expect_error_on_all_ranks([&] { LCE bad(comm, part, h + (rank == 0 ? 1 : 0)); }, "hidden size");
    vpce::LinearOptions lo;
    lo.chunk_rows = rank == 0 ? 2 : 3;
    expect_error_on_all_ranks([&] { LCE bad(comm, part, h, {}, lo); }, "rows per chunk");
  }

  LCE lce(comm, part, h);
  // hidden's width on one rank only.
  const auto wide = device_matrix<float>(std::vector<double>(n * (h + 1), 0.5), 0, n, h + (rank == 0 ? 1 : 0));
  expect_error_on_all_ranks([&] { lce.loss_and_grad(wide, weight, y, loss, gh, gw); }, "hidden", false);
  // N differs between ranks.
  const auto fewer = device_matrix<float>(p.hidden, 0, rank == 0 ? n - 1 : n, h);
  Kokkos::View<std::int64_t*, Mem> y_fewer("y", rank == 0 ? n - 1 : n);
  Kokkos::View<float*, Mem> loss_fewer("l", rank == 0 ? n - 1 : n);
  if (comm.size() > 1)
    expect_error_on_all_ranks([&] { lce.forward(fewer, weight, y_fewer, loss_fewer); }, "number of tokens");
  // weight rows not this rank's slice.
  // (not from p.weight: at 1 rank it has only local_size() rows; ASan found the read past its end)
  const auto wrong_w =
      device_matrix<float>(std::vector<double>((part.local_size() + 1) * h, 0.5), 0, part.local_size() + 1, h);
  expect_error_on_all_ranks([&] { lce.forward(hidden, wrong_w, y, loss); }, "weight", false);
  // A target out of range on one rank only.
  Kokkos::View<std::int64_t*, Mem> y_bad("y", n);
  Kokkos::deep_copy(y_bad, y);
  if (rank == comm.size() - 1) Kokkos::deep_copy(Kokkos::subview(y_bad, 4), std::int64_t(v + 3));
  expect_error_on_all_ranks([&] { lce.forward(hidden, weight, y_bad, loss); }, "target");
  // Gradients sharing memory with the inputs.
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> alias(const_cast<float*>(hidden.data()), n, h);
  expect_error_on_all_ranks([&] { lce.loss_and_grad(hidden, weight, y, loss, alias, gw); }, "share memory");
  // A per-row grad_loss needs Reduction::none; backward needs a forward.
  vpce::Options mean;
  mean.reduction = vpce::Reduction::mean;
  LCE lce_mean(comm, part, h, mean);
  Kokkos::View<float*, Mem> gl("gl", n);
  expect_error_on_all_ranks([&] { lce_mean.loss_and_grad(hidden, weight, y, loss, gh, gw, gl); }, "Reduction::none");
  LCE fresh(comm, part, h);
  expect_error_on_all_ranks([&] { fresh.backward(1.0f, gh, gw); }, "without a forward");
  // A NaN in hidden (every rank's logits of that row become NaN).
  auto nan_hidden = device_matrix<float>(p.hidden, 0, n, h);
  Kokkos::deep_copy(Kokkos::subview(nan_hidden, 2, 1), std::numeric_limits<float>::quiet_NaN());
  expect_error_on_all_ranks([&] { lce.forward(nan_hidden, weight, y, loss); }, "row 2 of the logits");
  vpce::LinearOptions two;
  two.chunk_rows = 2;  // row 2 is the first row of the second chunk: the message says where rows count from
  LCE chunked(comm, part, h, {}, two);
  expect_error_on_all_ranks([&] { chunked.forward(nan_hidden, weight, y, loss); }, "count from 2");
}

/// p with hidden, weight and bias rounded to T: what a caller holding T values passes.
template <class T>
LinearProblem rounded(LinearProblem p) {
  using C = vpce::compute_type_t<T>;
  for (auto* values : {&p.hidden, &p.weight, &p.bias})
    for (double& x : *values) x = double(C(T(C(x))));
  return p;
}

/// Sequence-parallel rows: rank 0 has none (when there are several ranks), the others uneven slices.
std::vector<std::int64_t> token_slices(int size, std::int64_t n) {
  std::vector<std::int64_t> begin(size + 1, 0);
  for (int r = 1; r <= size; ++r) {
    const std::int64_t count = size == 1 ? n : (r == 1 ? 0 : (r == size ? n - begin[r - 1] : n / (size - 1)));
    begin[r] = begin[r - 1] + count;
  }
  return begin;
}

template <class T>
class LinearAllTypes : public ::testing::Test {
 protected:
  vpce::Communicator comm{MPI_COMM_WORLD};
};
using LinearAllTypeList = ::testing::Types<float, double, vpce::bfloat16, vpce::float16>;
TYPED_TEST_SUITE(LinearAllTypes, LinearAllTypeList);

// A bias, 16-bit inputs (weight rows in one block or several), and sequence-parallel input, against the
// materialised path in double on the same (rounded) values.
TYPED_TEST(LinearAllTypes, BiasBlocksAndSequenceParallel) {
  using T = TypeParam;
  using C = vpce::compute_type_t<T>;
  using LCE = vpce::LinearCrossEntropy<T, Exec>;
  const double rtol = std::is_same_v<C, float> ? 2e-4 : 1e-11, atol = std::is_same_v<C, float> ? 2e-5 : 1e-13;
  const std::int64_t n = 23, h = 5, v = 41;
  const int rank = this->comm.rank();
  const auto slices = token_slices(this->comm.size(), n);
  std::vector<vpce::Options> options(3);
  options[1].reduction = vpce::Reduction::mean;
  options[1].ignore_index = -1;
  options[1].label_smoothing = 0.1;
  options[2].reduction = vpce::Reduction::sum;
  options[2].z_loss = 1e-3;
  options[2].softcap = 3;
  for (const auto& part : partitions(this->comm, v))
    for (const auto& opt : options) {
      LinearProblem p = make_linear(n, h, v, 17, 4, opt.ignore_index);
      p.bias.resize(v);
      for (std::int64_t j = 0; j < v; ++j) p.bias[j] = hash_value(j, 3, 99);
      p = rounded<T>(p);
      const double g = 1.25;
      const Reference ref = materialised(this->comm, part, p, opt, g);
      const std::int64_t vl = part.local_size();
      const auto weight = device_matrix<T>(p.weight, part.begin(), vl, h);
      const auto bias = device_vector<T>(p.bias, part.begin(), vl);
      const auto y = device_vector<std::int64_t>(p.targets, 0, n);
      for (bool sp : {false, true})
        for (auto [chunk, bytes] : std::vector<std::pair<std::int64_t, std::int64_t>>{
                 {0, 64 << 20}, {4, std::int64_t(h * sizeof(C) * 3)}, {7, 1}}) {
          vpce::LinearOptions lo;
          lo.chunk_rows = chunk;
          lo.chunk_bytes = bytes;
          lo.sequence_parallel = sp;
          LCE lce(this->comm, part, h, opt, lo);
          const std::int64_t first = sp ? slices[rank] : 0, rows = sp ? slices[rank + 1] - slices[rank] : n;
          const std::string what = std::string(sp ? "sequence-parallel" : "replicated") + " chunk " +
                                   std::to_string(lce.chunk_rows()) + " weight block " +
                                   std::to_string(lce.weight_block_rows()) + " slice " + std::to_string(vl) +
                                   " reduction " + vpce::to_string(opt.reduction);
          if (!vpce::is_16bit_v<T>) {
            EXPECT_EQ(lce.weight_block_rows(), std::max<std::int64_t>(vl, 1)) << what;
          }
          const auto hidden = device_matrix<T>(p.hidden, first, rows, h);
          const std::vector<double> ref_gh(ref.grad_hidden.begin() + first * h,
                                           ref.grad_hidden.begin() + (first + rows) * h);
          Kokkos::View<C*, Mem> loss("loss", n), gb("gb", vl);
          Kokkos::deep_copy(gb, std::numeric_limits<C>::quiet_NaN());
          auto gh = poisoned_matrix<C>(rows, h);
          auto gw = poisoned_matrix<C>(vl, h);
          lce.loss_and_grad(hidden, weight, bias, y, loss, gh, gw, gb, C(g));
          EXPECT_LE(worst(host_vector(loss), ref.loss, rtol, atol), 1.0) << what;
          EXPECT_LE(worst(host_vector(lce.lse()), ref.lse, rtol, atol), 1.0) << what;
          EXPECT_LE(worst(host_values(gh), ref_gh, rtol, atol), 1.0) << what;
          EXPECT_LE(worst(host_values(gw), ref.grad_weight, rtol, atol), 1.0) << what;
          EXPECT_LE(worst(host_vector(gb), ref.grad_bias, rtol, atol), 1.0) << what;
          EXPECT_LE(worst({lce.reduced_loss()}, {ref.reduced}, rtol, atol), 1.0) << what;

          // forward() then backward(scalar) with accumulate_weight: grad_weight and grad_bias add up.
          lce.forward(hidden, weight, bias, y, loss);
          EXPECT_LE(worst(host_vector(loss), ref.loss, rtol, atol), 1.0) << what << " (forward)";
          lce.backward(C(g), gh, gw, gb, /*accumulate_weight=*/true);
          std::vector<double> twice_w = ref.grad_weight, twice_b = ref.grad_bias;
          for (auto* x : {&twice_w, &twice_b})
            for (double& e : *x) e *= 2;
          EXPECT_LE(worst(host_values(gh), ref_gh, rtol, atol), 1.0) << what << " (backward)";
          EXPECT_LE(worst(host_values(gw), twice_w, rtol, atol), 1.0) << what << " (accumulate)";
          EXPECT_LE(worst(host_vector(gb), twice_b, rtol, atol), 1.0) << what << " (accumulate)";
        }
    }
}

TEST(LinearErrors, BiasAndSequenceParallel) {
  vpce::Communicator comm(MPI_COMM_WORLD);
  const int rank = comm.rank();
  const std::int64_t n = 6, h = 4, v = 11;
  const auto part = vpce::VocabPartition::even(v, comm);
  const std::int64_t vl = part.local_size();
  LinearProblem p = make_linear(n, h, v, 9);
  using LCE = vpce::LinearCrossEntropy<float, Exec>;
  const auto hidden = device_matrix<float>(p.hidden, 0, n, h);
  const auto weight = device_matrix<float>(p.weight, part.begin(), vl, h);
  const auto y = device_vector<std::int64_t>(p.targets, 0, n);
  const auto bias = device_vector<float>(std::vector<double>(v, 0.5), 0, vl);
  Kokkos::View<float*, Mem> loss("loss", n), gb("gb", vl);
  auto gh = poisoned_matrix<float>(n, h);
  auto gw = poisoned_matrix<float>(vl, h);

  vpce::Options probs;
  probs.probability_targets = true;
  expect_error_on_all_ranks([&] { LCE bad(comm, part, h, probs); }, "probability_targets");
  LCE lce(comm, part, h);
  const auto long_bias = device_vector<float>(std::vector<double>(v + 1, 0.5), 0, vl + (rank == 0 ? 1 : 0));
  expect_error_on_all_ranks([&] { lce.forward(hidden, weight, long_bias, y, loss); }, "bias has", false);
  if (vl > 0 || comm.size() == 1) {
    expect_error_on_all_ranks([&] { lce.loss_and_grad(hidden, weight, bias, y, loss, gh, gw, {}); }, "grad_bias",
                              false);
    expect_error_on_all_ranks([&] { lce.loss_and_grad(hidden, weight, {}, y, loss, gh, gw, gb); }, "no bias", false);
  }
  if (comm.size() > 1) {
    vpce::LinearOptions lo;
    lo.sequence_parallel = rank == 0;
    expect_error_on_all_ranks([&] { LCE bad(comm, part, h, {}, lo); }, "sequence_parallel");
  }
  // Sequence-parallel: targets and loss have all N rows (the sum of every rank's hidden rows).
  vpce::LinearOptions sp;
  sp.sequence_parallel = true;
  LCE lce_sp(comm, part, h, {}, sp);
  if (comm.size() > 1)
    expect_error_on_all_ranks([&] { lce_sp.forward(hidden, weight, y, loss); }, "targets has", false);
  const auto one_row = device_matrix<float>(p.hidden, rank == 0 ? 0 : 0, rank == 0 ? n - comm.size() + 1 : 1, h);
  lce_sp.forward(one_row, weight, y, loss);  // n rows in all: no error
  EXPECT_EQ(lce_sp.num_valid(), n);
}

}  // namespace
