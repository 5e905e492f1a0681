#pragma once
/// \file test_utils.hpp
/// \brief Shared pieces of vpce's unit tests: the typed-test configurations, a deterministic random
/// generator, the float64 host reference of the GLOBAL loss and gradient, View helpers (NaN-poisoned
/// outputs, host copies), an allclose comparison, and MPI helpers that make a check collective.
///
/// Every test runs on every rank of MPI_COMM_WORLD and makes the same collective calls in the same order.
/// A failed check never returns early (EXPECT, not ASSERT, around collective calls), so one rank's failure
/// cannot leave the others waiting in a collective.

#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "vpce/impl/collective.hpp"  // StatsReduction's exchange threshold
#include "vpce/vpce.hpp"

#if defined(KOKKOS_ENABLE_SERIAL) && !defined(KOKKOS_ENABLE_DEFAULT_DEVICE_TYPE_SERIAL)
// The typed tests' Kokkos::Serial configurations are instantiated once, in serial_instances.cpp (the library
// has the default space's): compiling the kernels in every test's translation unit made a kernel change
// recompile them ~14 times per build. A test that needs Serial for another scalar type includes
// vpce/definitions.hpp itself.
extern template class vpce::CrossEntropy<float, Kokkos::Serial>;
extern template class vpce::CrossEntropy<double, Kokkos::Serial>;
#endif

namespace vpce_test {

// ---------------------------------------------------------------------------------------------------------
// Typed-test configurations: scalar type x execution space.

template <class S, class E>
struct Config {
  using scalar = S;
  using exec = E;
  using memory_space = typename E::memory_space;
  using cross_entropy = vpce::CrossEntropy<S, E>;
};

using DefaultExec = Kokkos::DefaultExecutionSpace;

#if defined(KOKKOS_ENABLE_SERIAL)
inline constexpr bool kSerialIsExtra = !std::is_same_v<DefaultExec, Kokkos::Serial>;
using AllConfigs = std::conditional_t<kSerialIsExtra,
                                      ::testing::Types<Config<float, DefaultExec>, Config<double, DefaultExec>,
                                                       Config<float, Kokkos::Serial>, Config<double, Kokkos::Serial>>,
                                      ::testing::Types<Config<float, DefaultExec>, Config<double, DefaultExec>>>;
using DoubleConfigs =
    std::conditional_t<kSerialIsExtra, ::testing::Types<Config<double, DefaultExec>, Config<double, Kokkos::Serial>>,
                       ::testing::Types<Config<double, DefaultExec>>>;
#else
using AllConfigs = ::testing::Types<Config<float, DefaultExec>, Config<double, DefaultExec>>;
using DoubleConfigs = ::testing::Types<Config<double, DefaultExec>>;
#endif

/// Names typed instances "float_OpenMP", "double_Serial", ...: CTest selects the Serial runs by name.
struct ConfigName {
  template <class C>
  static std::string GetName(int) {
    return std::string(std::is_same_v<typename C::scalar, float> ? "float" : "double") + "_" + C::exec::name();
  }
};

// ---------------------------------------------------------------------------------------------------------
// MPI helpers

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

/// MPI calls of one all-reduce of records (vpce::impl::StatsReduction) on MPI_COMM_WORLD: none on one rank, an
/// MPI_Irecv and an MPI_Isend per other rank where the ranks exchange their records, else one MPI_Iallreduce.
inline long record_reduction_calls() {
  const int p = world_size();
  if (p == 1) return 0;
  return p <= vpce::impl::StatsReduction<float>::default_exchange_ranks ? 2 * (p - 1) : 1;
}

/// True on every rank iff `ok` is true on every rank.
inline bool all_ranks(bool ok) {
  int in = ok ? 1 : 0, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return out == 1;
}

/// True on every rank iff every rank passed the same string (compares the length and a 64-bit hash).
inline bool same_on_all_ranks(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  std::uint64_t in[2] = {h, s.size()}, lo[2], hi[2];
  MPI_Allreduce(in, lo, 2, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(in, hi, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo[0] == hi[0] && lo[1] == hi[1];
}

/// Runs `f`, which must throw vpce::Error on EVERY rank, with a message containing `needle`, the same
/// everywhere unless `same_message` is false (local checks of a non-collective call may name local shapes).
/// Returns the message (empty where nothing was thrown).
template <class F>
std::string expect_error_on_all_ranks(F&& f, const std::string& needle, bool same_message = true) {
  const int rank = world_rank();
  std::string msg;
  bool threw = false;
  try {
    f();
  } catch (const vpce::Error& e) {
    threw = true;
    msg = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank " << rank << ": expected vpce::Error, got another exception: " << e.what();
  }
  EXPECT_TRUE(threw) << "rank " << rank << ": no vpce::Error thrown (expected one containing '" << needle << "')";
  EXPECT_TRUE(all_ranks(threw)) << "some rank did not throw vpce::Error (expected '" << needle << "')";
  EXPECT_NE(msg.find(needle), std::string::npos)
      << "rank " << rank << ": message '" << msg << "' lacks '" << needle << "'";
  if (same_message) {
    EXPECT_TRUE(same_on_all_ranks(msg)) << "rank " << rank << ": the message differs between ranks: '" << msg << "'";
  }
  return msg;
}

// ---------------------------------------------------------------------------------------------------------
// Deterministic inputs: the same seed gives the same numbers on every rank and platform (splitmix64).

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : m_state(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (m_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform in [0, n).
  std::int64_t below(std::int64_t n) { return static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n)); }

 private:
  std::uint64_t m_state;
};

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// The GLOBAL inputs of one case (N x V logits, N targets, N incoming gradients), identical on every rank.
/// Stored in double, already rounded to the scalar type under test, so the reference sees what vpce sees.
struct Problem {
  std::int64_t n = 0;
  std::int64_t v = 0;
  std::vector<double> x;        ///< n x v, row-major
  std::vector<std::int64_t> y;  ///< targets in [0, v)
  std::vector<double> g;        ///< per-row incoming gradient, never 0
  double& at(std::int64_t i, std::int64_t j) { return x[i * v + j]; }
  double at(std::int64_t i, std::int64_t j) const { return x[i * v + j]; }
};

/// Random logits in [-4, 4) plus a per-row offset in [-20, 20); rows 1 and 2 (when present) are shifted by
/// +80 and -80, beyond where exp overflows (float) without the max subtraction. Targets are uniform, except
/// row 0 -> column 0 and the last row -> column V-1 (the edge columns). g in +-[0.25, 2).
template <class Scalar>
Problem make_problem(std::int64_t n, std::int64_t v, std::uint64_t seed) {
  Rng rng(seed);
  Problem p;
  p.n = n;
  p.v = v;
  p.x.resize(n * v);
  p.y.resize(n);
  p.g.resize(n);
  for (std::int64_t i = 0; i < n; ++i) {
    double offset = rng.uniform(-20.0, 20.0);
    if (i == 1) offset = 80.0;
    if (i == 2) offset = -80.0;
    for (std::int64_t j = 0; j < v; ++j) p.at(i, j) = static_cast<Scalar>(offset + rng.uniform(-4.0, 4.0));
    p.y[i] = rng.below(v);
    const double mag = rng.uniform(0.25, 2.0);
    p.g[i] = static_cast<Scalar>(rng.next() % 2 ? mag : -mag);
  }
  if (n > 0) p.y[0] = 0;
  if (n > 1) p.y[n - 1] = v - 1;
  return p;
}

/// float64 host reference over the GLOBAL row, with the maths of vpce::Options (options.hpp,
/// docs/design.md section 1), written independently of the library:
///   x_j = c tanh(s z_j / c) (softcap c > 0) or s z_j;  lse = log sum_j exp(x_j);
///   loss = lse - (1 - alpha) x_t - alpha mean_j x_j + zeta lse^2 + beta H  (0 where the target is
///   ignore_index), H = lse - mu the entropy, mu = sum_j softmax_j x_j;
///   d loss / d z_j = (softmax_j (1 + 2 zeta lse + beta (mu - x_j)) - (1 - alpha) [j == t] - alpha / V) dx_j/dz_j.
/// With the default options: lse - z_t and softmax - onehot. Multiply dloss by g_i for the gradient. NaN
/// logits propagate; -inf logits stay -inf and contribute exp = 0; a target logit of -inf gives loss +inf.
struct Reference {
  std::vector<double> lse;
  std::vector<double> loss;
  std::vector<double> entropy;  ///< every row
  std::vector<double> logprob;  ///< x_t - lse, 0 where ignored
  std::vector<double> z_loss;   ///< zeta lse^2, 0 where ignored
  std::vector<double> dloss;    ///< n x v, d loss_i / d z_ij
  std::vector<bool> valid;      ///< target != ignore_index
  std::int64_t n_valid = 0;
  double valid_weight = 0;  ///< sum of the valid targets' class weights (n_valid without weights)
  /// The sum of the losses, or their mean (PyTorch's: divided by valid_weight; 0 when that is 0), as
  /// Options::reduction says.
  double reduced(vpce::Reduction r) const {
    double total = 0;
    for (double l : loss) total += l;
    if (r != vpce::Reduction::mean) return total;
    return valid_weight > 0 ? total / valid_weight : 0.0;
  }
};

/// With class weights w (PyTorch's definition, W = sum_j w_j):
///   loss = (1 - alpha) w_t (lse - x_t) + alpha / V (W lse - sum_j w_j x_j) + zeta lse^2 + beta H,
///   d loss / d z_j = (p_j ((1 - alpha) w_t + alpha W / V + 2 zeta lse + beta (mu - x_j)) - (1 - alpha) w_t [j == t]
///                     - alpha w_j / V) dx_j/dz_j.
inline Reference reference(const Problem& p, const vpce::Options& o = {},
                           const std::vector<double>* weights = nullptr) {
  const double scale = o.logit_scale, cap = o.softcap, alpha = o.label_smoothing, zeta = o.z_loss;
  const double beta = o.entropy_weight;
  Reference r;
  r.lse.assign(p.n, 0.0);
  r.loss.assign(p.n, 0.0);
  r.entropy.assign(p.n, 0.0);
  r.logprob.assign(p.n, 0.0);
  r.z_loss.assign(p.n, 0.0);
  r.dloss.assign(p.n * p.v, 0.0);
  r.valid.assign(p.n, false);
  std::vector<double> x(p.v), dxdz(p.v);
  for (std::int64_t i = 0; i < p.n; ++i) {
    double m = -kInf;
    bool has_nan = false;
    long double sum_x = 0;
    for (std::int64_t j = 0; j < p.v; ++j) {
      const double z = p.at(i, j);
      if (z == -kInf) {
        x[j] = -kInf;
        dxdz[j] = cap > 0 ? 0.0 : scale;
      } else if (cap > 0) {
        x[j] = cap * std::tanh(scale * z / cap);
        dxdz[j] = scale * (1.0 - (x[j] / cap) * (x[j] / cap));
      } else {
        x[j] = scale * z;
        dxdz[j] = scale;
      }
      if (std::isnan(x[j])) has_nan = true;
      if (x[j] > m) m = x[j];
      sum_x += x[j];
    }
    long double s = 0;
    for (std::int64_t j = 0; j < p.v; ++j) s += std::exp(static_cast<long double>(x[j]) - m);
    const double lse = has_nan ? kNaN : static_cast<double>(m + std::log(s));
    r.lse[i] = lse;
    long double mu = 0;  // sum_j softmax_j x_j (a -inf logit adds nothing)
    for (std::int64_t j = 0; j < p.v; ++j) {
      if (x[j] != -kInf) mu += std::exp(static_cast<long double>(x[j]) - lse) * x[j];
    }
    if (has_nan) mu = kNaN;
    double big_w = 0;  // W, and sum_j w_j x_j
    long double wx = 0;
    if (weights) {
      for (std::int64_t j = 0; j < p.v; ++j) {
        big_w += (*weights)[j];
        wx += (*weights)[j] * x[j];
      }
    }
    r.entropy[i] = lse - static_cast<double>(mu);
    const std::int64_t t = p.y[i];
    r.valid[i] = t != o.ignore_index;
    if (!r.valid[i]) continue;  // loss 0, gradient 0
    ++r.n_valid;
    const double w_t = weights ? (*weights)[t] : 1.0;
    r.valid_weight += w_t;
    r.logprob[i] = x[t] - lse;
    r.z_loss[i] = zeta * lse * lse;
    double loss = weights ? (1.0 - alpha) * w_t * (lse - x[t]) : lse - (1.0 - alpha) * x[t];
    if (alpha > 0 && weights) loss += alpha / double(p.v) * (big_w * lse - static_cast<double>(wx));
    if (alpha > 0 && !weights) loss -= alpha * static_cast<double>(sum_x) / double(p.v);
    if (zeta > 0) loss += zeta * lse * lse;
    if (beta != 0) loss += beta * r.entropy[i];
    r.loss[i] = loss;
    for (std::int64_t j = 0; j < p.v; ++j) {
      const double pj = std::exp(x[j] - lse);
      const double c_lse = weights ? (1.0 - alpha) * w_t + alpha * big_w / double(p.v) : 1.0;
      double d = pj * (c_lse + 2.0 * zeta * lse) - (j == t ? (1.0 - alpha) * w_t : 0.0);
      if (beta != 0 && pj > 0) d += pj * beta * (static_cast<double>(mu) - x[j]);
      if (alpha > 0) d -= alpha * (weights ? (*weights)[j] : 1.0) / double(p.v);
      r.dloss[i * p.v + j] = d * dxdz[j];
    }
  }
  return r;
}

/// This rank's slice [begin, begin + width) of the reference gradient, times g_i per row.
inline std::vector<double> expected_grad(const Reference& ref, const Problem& p, std::int64_t begin, std::int64_t width,
                                         const std::vector<double>& g) {
  std::vector<double> out(p.n * width);
  for (std::int64_t i = 0; i < p.n; ++i)
    for (std::int64_t j = 0; j < width; ++j) out[i * width + j] = ref.dloss[i * p.v + begin + j] * g[i];
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Tolerances and allclose: |a - b| <= atol + rtol * |b| (b the float64 reference). Infinities must match
// exactly, NaN only NaN. The losses are O(1..10), the gradient entries O(1e-4..1).
//
// float:  loss rtol 1e-5, atol 1e-5;  gradient rtol 5e-5, atol 2e-6;  strategy vs strategy the same.
// double: loss rtol 1e-12, atol 1e-12; gradient rtol 1e-11, atol 1e-14.
// The gradient's error is that of exp(x - lse), i.e. softmax times the absolute error of lse, up to
// ~|lse| * eps with the rows shifted by +-80 (~1e-5 in float, ~2e-14 in double); at the target,
// softmax - 1 cancels, hence the atol. The largest errors seen on 1-4 ranks: 0.68 of the float
// tolerance (a target entry, |lse| = 78, before atol was raised from 1e-6), 0.04 of the double one.

struct Tol {
  double rtol;
  double atol;
};

template <class Scalar>
struct Tolerance;
template <>
struct Tolerance<float> {
  static constexpr Tol loss{1e-5, 1e-5};
  static constexpr Tol grad{5e-5, 2e-6};
};
template <>
struct Tolerance<double> {
  static constexpr Tol loss{1e-12, 1e-12};
  static constexpr Tol grad{1e-11, 1e-14};
};

inline bool close(double a, double b, Tol t) {
  if (std::isnan(b)) return std::isnan(a);
  if (std::isinf(b)) return a == b;
  return std::isfinite(a) && std::abs(a - b) <= t.atol + t.rtol * std::abs(b);
}

/// EXPECTs every element of `actual` close to `expected` (sizes must match); reports the first few
/// mismatches with the rank, the index (row, column for a `width`-wide matrix) and both values.
inline bool expect_allclose(const std::vector<double>& actual, const std::vector<double>& expected, Tol tol,
                            const std::string& what, std::int64_t width = 0) {
  const int rank = world_rank();
  EXPECT_EQ(actual.size(), expected.size()) << "rank " << rank << ": " << what << ": size";
  if (actual.size() != expected.size()) return false;
  int bad = 0;
  for (std::size_t k = 0; k < actual.size(); ++k) {
    if (close(actual[k], expected[k], tol)) continue;
    if (++bad <= 5) {
      std::ostringstream where;
      if (width > 0) {
        where << "(" << static_cast<std::int64_t>(k) / width << ", " << static_cast<std::int64_t>(k) % width << ")";
      } else {
        where << "(" << k << ")";
      }
      ADD_FAILURE() << "rank " << rank << ": " << what << where.str() << " = " << actual[k] << ", expected "
                    << expected[k] << " (rtol " << tol.rtol << ", atol " << tol.atol << ")";
    }
  }
  if (bad > 5) ADD_FAILURE() << "rank " << rank << ": " << what << ": " << bad << " mismatches in all";
  return bad == 0;
}

// ---------------------------------------------------------------------------------------------------------
// Views

/// Host copy of a 1-D View as doubles.
template <class T, class... P>
std::vector<double> to_host(const Kokkos::View<T*, P...>& v) {
  using view = Kokkos::View<T*, P...>;
  Kokkos::View<std::remove_const_t<T>*, typename view::array_layout, Kokkos::HostSpace> h("h", v.extent(0));
  Kokkos::deep_copy(h, v);
  return std::vector<double>(h.data(), h.data() + h.extent(0));
}

/// Host copy of a 2-D View as doubles, row-major.
template <class T, class... P>
std::vector<double> to_host(const Kokkos::View<T**, P...>& v) {
  using view = Kokkos::View<T**, P...>;
  Kokkos::View<std::remove_const_t<T>**, typename view::array_layout, Kokkos::HostSpace> h("h", v.extent(0),
                                                                                           v.extent(1));
  Kokkos::deep_copy(h, v);
  std::vector<double> out(v.extent(0) * v.extent(1));
  for (std::size_t i = 0; i < v.extent(0); ++i)
    for (std::size_t j = 0; j < v.extent(1); ++j) out[i * v.extent(1) + j] = h(i, j);
  return out;
}

/// This rank's inputs in the execution space's memory: the logits slice (non-const, so that it can also
/// serve as the gradient buffer), the targets and the per-row incoming gradient.
template <class C>
struct LocalInputs {
  using scalar = typename C::scalar;
  using memory_space = typename C::memory_space;
  Kokkos::View<scalar**, Kokkos::LayoutRight, memory_space> x;
  Kokkos::View<std::int64_t*, memory_space> y;
  Kokkos::View<scalar*, memory_space> g;
};

template <class C>
LocalInputs<C> make_local(const Problem& p, std::int64_t begin, std::int64_t width) {
  using scalar = typename C::scalar;
  LocalInputs<C> in;
  in.x = decltype(in.x)("x", p.n, width);
  in.y = decltype(in.y)("y", p.n);
  in.g = decltype(in.g)("g", p.n);
  auto hx = Kokkos::create_mirror_view(in.x);
  auto hy = Kokkos::create_mirror_view(in.y);
  auto hg = Kokkos::create_mirror_view(in.g);
  for (std::int64_t i = 0; i < p.n; ++i) {
    for (std::int64_t j = 0; j < width; ++j) hx(i, j) = static_cast<scalar>(p.at(i, begin + j));
    hy(i) = p.y[i];
    hg(i) = static_cast<scalar>(p.g[i]);
  }
  Kokkos::deep_copy(in.x, hx);
  Kokkos::deep_copy(in.y, hy);
  Kokkos::deep_copy(in.g, hg);
  return in;
}

template <class C>
LocalInputs<C> make_local(const Problem& p, const vpce::VocabPartition& part) {
  return make_local<C>(p, part.begin(), part.local_size());
}

/// EXPECTs the inputs still hold the problem's values (bit for bit): the calls must not write them.
template <class C>
void expect_inputs_unchanged(const LocalInputs<C>& in, const Problem& p, std::int64_t begin, const std::string& what) {
  const std::int64_t w = in.x.extent(1);
  const auto x = to_host(in.x);
  const auto g = to_host(in.g);
  auto y = Kokkos::create_mirror_view(in.y);
  Kokkos::deep_copy(y, in.y);
  int changed = 0;
  for (std::int64_t i = 0; i < p.n; ++i) {
    for (std::int64_t j = 0; j < w; ++j) {
      const double want = static_cast<typename C::scalar>(p.at(i, begin + j));
      const double got = x[i * w + j];
      if (!(got == want || (std::isnan(got) && std::isnan(want)))) ++changed;
    }
    if (y(i) != p.y[i] || g[i] != static_cast<typename C::scalar>(p.g[i])) ++changed;
  }
  EXPECT_EQ(changed, 0) << "rank " << world_rank() << ": " << what << ": the inputs were modified";
}

/// Outputs filled with NaN, so that an element the library does not write fails the comparison.
template <class C>
Kokkos::View<typename C::scalar*, typename C::memory_space> poisoned_vector(std::int64_t n) {
  Kokkos::View<typename C::scalar*, typename C::memory_space> v("poisoned_vector", n);
  Kokkos::deep_copy(v, std::numeric_limits<typename C::scalar>::quiet_NaN());
  return v;
}

template <class C>
Kokkos::View<typename C::scalar**, Kokkos::LayoutRight, typename C::memory_space> poisoned_matrix(std::int64_t n,
                                                                                                  std::int64_t w) {
  Kokkos::View<typename C::scalar**, Kokkos::LayoutRight, typename C::memory_space> v("poisoned_matrix", n, w);
  Kokkos::deep_copy(v, std::numeric_limits<typename C::scalar>::quiet_NaN());
  return v;
}

// ---------------------------------------------------------------------------------------------------------
// The ways of getting the loss and the gradient.

enum class Path {
  forward_backward_scalar,  ///< forward(), then backward(grad_scale)
  forward_backward_view,    ///< forward(), then backward(grad_loss View)
  fused_scalar,             ///< loss_and_grad(..., grad_scale)
  fused_view,               ///< loss_and_grad(..., grad_loss View)
  fused_in_place_scalar,    ///< loss_and_grad with grad_logits = the logits' own buffer, grad_scale
  fused_in_place_view       ///< the same with a grad_loss View
};

inline const std::vector<Path>& all_paths() {
  static const std::vector<Path> paths{
      Path::forward_backward_scalar, Path::forward_backward_view, Path::fused_scalar, Path::fused_view,
      Path::fused_in_place_scalar,   Path::fused_in_place_view};
  return paths;
}

inline bool uses_grad_view(Path p) {
  return p == Path::forward_backward_view || p == Path::fused_view || p == Path::fused_in_place_view;
}

inline const char* to_string(Path p) {
  switch (p) {
    case Path::forward_backward_scalar:
      return "forward+backward(scale)";
    case Path::forward_backward_view:
      return "forward+backward(view)";
    case Path::fused_scalar:
      return "loss_and_grad(scale)";
    case Path::fused_view:
      return "loss_and_grad(view)";
    case Path::fused_in_place_scalar:
      return "loss_and_grad in place(scale)";
    case Path::fused_in_place_view:
      return "loss_and_grad in place(view)";
  }
  return "?";
}

/// A grad_scale that is not 1 and is exact in float.
inline constexpr double kGradScale = 0.625;

struct Outputs {
  std::vector<double> loss;
  std::vector<double> lse;
  std::vector<double> grad;  ///< n x local width
};

/// Runs one path on fresh NaN-poisoned outputs and returns host copies. Collective (every rank calls it).
template <class C>
Outputs run_path(typename C::cross_entropy& ce, const LocalInputs<C>& in, Path path) {
  using scalar = typename C::scalar;
  const std::int64_t n = in.x.extent(0);
  const std::int64_t w = in.x.extent(1);
  const auto scale = static_cast<scalar>(kGradScale);
  auto loss = poisoned_vector<C>(n);
  auto grad = poisoned_matrix<C>(n, w);
  Outputs out;
  switch (path) {
    case Path::forward_backward_scalar:
    case Path::forward_backward_view:
      ce.forward(in.x, in.y, loss);
      out.lse = to_host(ce.lse());
      if (path == Path::forward_backward_scalar) {
        ce.backward(scale, grad);
      } else {
        ce.backward(in.g, grad);
      }
      break;
    case Path::fused_scalar:
      ce.loss_and_grad(in.x, in.y, loss, grad, scale);
      out.lse = to_host(ce.lse());
      break;
    case Path::fused_view:
      ce.loss_and_grad(in.x, in.y, loss, grad, in.g);
      out.lse = to_host(ce.lse());
      break;
    case Path::fused_in_place_scalar:
    case Path::fused_in_place_view:
      Kokkos::deep_copy(grad, in.x);  // the logits, in a buffer the gradient will overwrite
      if (path == Path::fused_in_place_scalar) {
        ce.loss_and_grad(grad, in.y, loss, grad, scale);
      } else {
        ce.loss_and_grad(grad, in.y, loss, grad, in.g);
      }
      out.lse = to_host(ce.lse());
      break;
  }
  out.loss = to_host(loss);
  out.grad = to_host(grad);
  return out;
}

/// The per-row incoming gradient a path applies.
inline std::vector<double> path_scale(const Problem& p, Path path) {
  return uses_grad_view(path) ? p.g : std::vector<double>(p.n, kGradScale);
}

/// EXPECTs loss, lse and this rank's gradient slice close to the reference. Returns true when all match.
template <class C>
bool expect_matches_reference(const Outputs& out, const Reference& ref, const Problem& p, std::int64_t begin,
                              std::int64_t width, const std::vector<double>& g, const std::string& what) {
  using scalar = typename C::scalar;
  bool ok = expect_allclose(out.loss, ref.loss, Tolerance<scalar>::loss, what + ": loss");
  ok = expect_allclose(out.lse, ref.lse, Tolerance<scalar>::loss, what + ": lse") && ok;
  ok = expect_allclose(out.grad, expected_grad(ref, p, begin, width, g), Tolerance<scalar>::grad, what + ": grad",
                       width) &&
       ok;
  return ok;
}

/// A normal loss_and_grad on `ce` after an expected error: proves that the ranks are still in step and
/// that the object still works (no hang, no desynchronised collective, correct numbers).
template <class C>
void expect_in_step(typename C::cross_entropy& ce, std::uint64_t seed = 99) {
  const auto& part = ce.partition();
  const Problem p = make_problem<typename C::scalar>(5, part.vocab_size(), seed);
  const Reference ref = reference(p);
  const auto in = make_local<C>(p, part);
  Outputs out;
  bool threw = false;
  try {
    out = run_path<C>(ce, in, Path::fused_view);
  } catch (const std::exception& e) {
    threw = true;
    ADD_FAILURE() << "rank " << world_rank() << ": a valid call after an error threw: " << e.what();
  }
  EXPECT_TRUE(all_ranks(!threw)) << "a valid call after an error threw on some rank";
  if (!threw) expect_matches_reference<C>(out, ref, p, part.begin(), part.local_size(), p.g, "call after an error");
}

// ---------------------------------------------------------------------------------------------------------
// Partitions to run every correctness test over (V and the split depend on the number of ranks).

struct NamedPartition {
  std::string name;
  vpce::VocabPartition part;
};

/// even(97) (not divisible by 2, 3, 4); even(16 W) (divisible); explicit sizes with zero-width ranks;
/// from_local_size with uneven widths and a zero-width last rank; the whole vocabulary on the last rank.
inline std::vector<NamedPartition> test_partitions(const vpce::Communicator& comm) {
  const int w = comm.size();
  std::vector<NamedPartition> out;
  out.push_back({"even(97)", vpce::VocabPartition::even(97, comm)});
  out.push_back({"even(16W)", vpce::VocabPartition::even(16 * w, comm)});
  std::vector<std::int64_t> sizes(w);
  std::int64_t v = 0;
  for (int r = 0; r < w; ++r) v += (sizes[r] = (w > 1 && r % 2 == 0) ? 0 : 7 + 5 * r);
  out.push_back({"from_sizes(zeros on even ranks)", vpce::VocabPartition::from_sizes(sizes, comm, v)});
  const int r = comm.rank();
  out.push_back({"from_local_size(5 + 11 r, last 0)",
                 vpce::VocabPartition::from_local_size((w > 1 && r == w - 1) ? 0 : 5 + 11 * r, comm)});
  std::vector<std::int64_t> one(w, 0);
  one[w - 1] = 29;
  out.push_back({"from_sizes(all on the last rank)", vpce::VocabPartition::from_sizes(one, comm, 29)});
  return out;
}

inline std::string describe(const vpce::Options& o) {
  std::ostringstream s;
  s << "strategy " << vpce::to_string(o.strategy) << ", mode " << vpce::to_string(o.mode) << ", block_rows "
    << o.block_rows << (o.force_team_kernels ? ", team kernels" : "");
  return s.str();
}

}  // namespace vpce_test
