// Inputs of more than 2^31 logits on one rank: every index and offset must be 64-bit. bfloat16 logits (2 bytes
// each), the gradient written over them in place (no second buffer): about 4.3 GB at a time.
//  - Rows: 65537 x 32768 (2^31 + 32768 elements); row 65536 starts at element 2^31. forward(), then
//    loss_and_grad() in place; rows 0, 32768, 65535 and 65536 against a float64 reference of the same
//    bfloat16 values.
//  - Columns: one row of 2^31 + 4103 columns; the target and the two largest logits lie beyond column 2^31.
//    The logits repeat a pattern of 1021 values (plus four spikes), so the float64 reference sums in closed
//    form.
// Run by CTest as its own entry (label "large", 1 rank); not part of the unit-test executable.

#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "vpce/vpce.hpp"

namespace {

using S = vpce::bfloat16;
using CE = vpce::CrossEntropy<S>;
using mem = CE::memory_space;
using exec = CE::execution_space;

/// A logit in [-4, 4) from a 64-bit key (splitmix64), as stored (bfloat16).
KOKKOS_INLINE_FUNCTION S logit_of(std::uint64_t key) {
  std::uint64_t z = key * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return S(-4.0f + 8.0f * static_cast<float>(z >> 40) * 0x1.0p-24f);
}

double value(S s) { return static_cast<double>(static_cast<float>(s)); }

/// One row of the stored (16-bit) values, from the View.
std::vector<S> row_of(const Kokkos::View<S**, Kokkos::LayoutRight, mem>& x, std::int64_t i) {
  auto r = Kokkos::subview(x, i, Kokkos::ALL);
  Kokkos::View<S*, Kokkos::HostSpace> h("row", x.extent(1));
  Kokkos::deep_copy(h, r);
  return std::vector<S>(h.data(), h.data() + h.extent(0));
}

template <class V>
double at(const V& v, std::int64_t i) {
  typename V::non_const_value_type h;
  Kokkos::deep_copy(h, Kokkos::subview(v, i));
  return static_cast<double>(h);
}

// The fills below are free functions, not in the TEST bodies: CUDA's extended __host__ __device__ lambdas
// (KOKKOS_LAMBDA) must not be defined in a private member function, and GoogleTest's TestBody() is one.

/// x (n x v, row-major) = logit_of(i v + j); y(i) = i * 2654435761 mod v.
void fill_rows(const Kokkos::View<S**, Kokkos::LayoutRight, mem>& x, const Kokkos::View<std::int64_t*, mem>& y) {
  const std::int64_t n = x.extent(0), v = x.extent(1);
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<exec, Kokkos::IndexType<std::int64_t>>(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        S* r = x.data() + i * v;
        for (std::int64_t j = 0; j < v; ++j) r[j] = logit_of(std::uint64_t(i) * std::uint64_t(v) + std::uint64_t(j));
        y(i) = static_cast<std::int64_t>(static_cast<std::uint64_t>(i) * 2654435761ull % std::uint64_t(v));
      });
}

/// x(0, j) = logit_of(j mod period) for every column of the (single-row) x.
void fill_pattern(const Kokkos::View<S**, Kokkos::LayoutRight, mem>& x, std::int64_t period) {
  const std::int64_t v = x.extent(1);
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<exec, Kokkos::IndexType<std::int64_t>>(0, v),
      KOKKOS_LAMBDA(std::int64_t j) { x(0, j) = logit_of(std::uint64_t(j % period)); });
}

/// |got - want| <= atol + rtol |want|, reported with a label.
void expect_close(double got, double want, double rtol, double atol, const std::string& what) {
  EXPECT_LE(std::abs(got - want), atol + rtol * std::abs(want)) << what << ": " << got << ", expected " << want;
}

TEST(Large, RowsBeyondTwoToThe31Elements) {
  const vpce::Communicator comm(MPI_COMM_SELF);
  const std::int64_t n = 65537, v = 32768;
  ASSERT_GT(n * v, std::int64_t(1) << 31);
  const auto part = vpce::VocabPartition::even(v, comm);
  Kokkos::View<S**, Kokkos::LayoutRight, mem> x(Kokkos::view_alloc(Kokkos::WithoutInitializing, "x"), n, v);
  Kokkos::View<std::int64_t*, mem> y("y", n);
  fill_rows(x, y);
  Kokkos::fence();
  const std::int64_t rows[] = {0, n / 2, n - 2, n - 1};
  // float64 reference of the checked rows, from the stored values (before the gradient overwrites them).
  struct Ref {
    std::vector<double> x;
    std::int64_t t;
    double lse;
  };
  std::vector<Ref> refs;
  for (std::int64_t i : rows) {
    Ref r;
    for (S s : row_of(x, i)) r.x.push_back(value(s));
    r.t = at(y, i);
    double m = -INFINITY, s = 0;
    for (double xv : r.x) m = std::max(m, xv);
    for (double xv : r.x) s += std::exp(xv - m);
    r.lse = m + std::log(s);
    refs.push_back(r);
  }
  CE ce(comm, part);
  Kokkos::View<float*, mem> loss("loss", n);
  ce.forward(x, y, loss);
  for (std::size_t k = 0; k < refs.size(); ++k) {
    const std::string what = "forward, row " + std::to_string(rows[k]);
    expect_close(at(loss, rows[k]), refs[k].lse - refs[k].x[refs[k].t], 1e-6, 1e-6, what + ": loss");
    expect_close(at(ce.lse(), rows[k]), refs[k].lse, 1e-6, 1e-6, what + ": lse");
  }
  Kokkos::deep_copy(loss, 0.0f);
  ce.loss_and_grad(x, y, loss, x, 1.0f);  // in place: the bfloat16 gradient over the logits
  for (std::size_t k = 0; k < refs.size(); ++k) {
    const std::string what = "loss_and_grad, row " + std::to_string(rows[k]);
    const Ref& r = refs[k];
    expect_close(at(loss, rows[k]), r.lse - r.x[r.t], 1e-6, 1e-6, what + ": loss");
    const auto grad = row_of(x, rows[k]);
    int bad = 0;
    for (std::int64_t j = 0; j < v; ++j) {
      const double want = std::exp(r.x[j] - r.lse) - (j == r.t ? 1.0 : 0.0);
      // bfloat16 keeps 8 significant bits: half an ulp is 2^-9 relative.
      if (!(std::abs(value(grad[j]) - want) <= 1e-9 + 4e-3 * std::abs(want)) && ++bad <= 3)
        ADD_FAILURE() << what << ", column " << j << ": gradient " << value(grad[j]) << ", expected " << want;
    }
    EXPECT_EQ(bad, 0) << what;
  }
}

TEST(Large, OneRowBeyondTwoToThe31Columns) {
  const vpce::Communicator comm(MPI_COMM_SELF);
  const std::int64_t two31 = std::int64_t(1) << 31;
  const std::int64_t v = two31 + 4103, period = 1021;
  const auto part = vpce::VocabPartition::even(v, comm);
  Kokkos::View<S**, Kokkos::LayoutRight, mem> x(Kokkos::view_alloc(Kokkos::WithoutInitializing, "x"), 1, v);
  fill_pattern(x, period);
  // Spikes (positions, values): the target and the largest logits beyond column 2^31, one before it.
  const std::int64_t target = two31 + 1000;
  const std::vector<std::pair<std::int64_t, float>> spikes = {
      {5, 3.0f}, {two31 + 7, 4.0f}, {target, 2.0f}, {v - 1, 5.0f}};
  for (const auto& [j, val] : spikes) Kokkos::deep_copy(Kokkos::subview(x, 0, j), S(val));
  Kokkos::View<std::int64_t*, mem> y("y", 1);
  Kokkos::deep_copy(y, target);
  Kokkos::fence();
  // float64 reference in closed form: every residue r mod 1021 occurs count(r) times, then the spikes.
  long double sum = 0;
  for (std::int64_t r = 0; r < period; ++r) {
    const std::int64_t count = v / period + (r < v % period ? 1 : 0);
    sum += static_cast<long double>(count) * std::exp(static_cast<long double>(value(logit_of(r))));
  }
  for (const auto& [j, val] : spikes)
    sum += std::exp((long double)val) - std::exp((long double)value(logit_of(j % period)));
  const double lse = static_cast<double>(std::log(sum));
  auto x_at = [&](std::int64_t j) {
    for (const auto& [js, val] : spikes)
      if (js == j) return double(val);
    return value(logit_of(j % period));
  };
  CE ce(comm, part);
  Kokkos::View<float*, mem> loss("loss", 1);
  ce.forward(x, y, loss);
  expect_close(at(loss, 0), lse - 2.0, 1e-6, 1e-6, "forward: loss");
  expect_close(at(ce.lse(), 0), lse, 1e-6, 1e-6, "forward: lse");
  ce.loss_and_grad(x, y, loss, x, 1.0f);  // in place
  expect_close(at(loss, 0), lse - 2.0, 1e-6, 1e-6, "loss_and_grad: loss");
  for (std::int64_t j : {std::int64_t(0), std::int64_t(5), two31 - 1, two31, two31 + 7, target, v - 2, v - 1}) {
    S h;
    Kokkos::deep_copy(h, Kokkos::subview(x, 0, j));
    const double want = std::exp(x_at(j) - lse) - (j == target ? 1.0 : 0.0);
    expect_close(value(h), want, 4e-3, 1e-12, "gradient, column " + std::to_string(j));
  }
}

}  // namespace
