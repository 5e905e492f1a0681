#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <vector>
#include <chrono>
#include <algorithm>
#include <immintrin.h>
#include <x86intrin.h>
#include "vpce/impl/math.hpp"
using namespace vpce::impl;
constexpr int L = 32;
static inline float bf(uint16_t h) { uint32_t u = uint32_t(h) << 16; float f; std::memcpy(&f, &u, 4); return f; }

alignas(64) static float T0[16], T2[16];
static float C2 = 0.5f;
static void init_tab(float c2) { C2 = c2; for (int k = 0; k < 16; ++k) { double t = std::exp2(k / 16.0); T0[k] = float(t); T2[k] = float(t * c2); } }

// exp(u) for 16 lanes: u = (n + k/16) ln2 + r, |r| <= ln2/32; e = 2^n T[k] (1 + r + c2 r^2)
static inline __m512 exp16(__m512 u, __m512 t0, __m512 t2) {
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 t = _mm512_fmadd_ps(u, _mm512_set1_ps(float(16.0 / M_LN2)), magic);
  const __m512 n = _mm512_sub_ps(t, magic);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(float(M_LN2 / 16.0)), u);
  const __m512i ti = _mm512_castps_si512(t);
  const __m512 a = _mm512_permutexvar_ps(ti, t0);
  const __m512 b = _mm512_permutexvar_ps(ti, t2);
  const __m512 p = _mm512_fmadd_ps(r, _mm512_fmadd_ps(r, b, a), a);
  const __m512i k = _mm512_srai_epi32(_mm512_sub_epi32(ti, _mm512_castps_si512(magic)), 4);
  const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k, _mm512_set1_epi32(127)), 23));
  const __mmask16 ok = _mm512_cmp_ps_mask(u, _mm512_set1_ps(-86.98f), _CMP_NLT_UQ);
  return _mm512_maskz_mul_ps(ok, p, scale);
}

template <ExpAccuracy A, bool Store>
__attribute__((noinline)) float stats(const uint16_t* __restrict x, float* __restrict y, long n, float m, float* mxo) {
  float part[L] = {}; float mx[L]; for (int l = 0; l < L; ++l) mx[l] = -1e30f;
  double tot = 0;
  for (long j0 = 0; j0 < n; j0 += 32 * L) {
    for (long j = j0; j < j0 + 32 * L; j += L) {
#pragma omp simd
      for (int l = 0; l < L; ++l) {
        const float v = bf(x[j + l]);
        const float e = fast_exp_no_overflow<A>(v - m);
        if (Store) y[j + l] = e;
        part[l] += e;
        mx[l] = v > mx[l] ? v : mx[l];
      }
    }
    for (int l = 0; l < L; ++l) { tot += part[l]; part[l] = 0; }
  }
  float M = -1e30f; for (int l = 0; l < L; ++l) M = mx[l] > M ? mx[l] : M; *mxo = M;
  return float(tot);
}

template <int Mode>
__attribute__((noinline)) float stats_var(const uint16_t* __restrict x, float* __restrict y, long n, float m, float* mxo) {
  const __m512 t0 = _mm512_load_ps(T0), t2 = _mm512_load_ps(T2), mv = _mm512_set1_ps(m);
  __m512 mx0 = _mm512_set1_ps(-1e30f), mx1 = mx0;
  double tot = 0;
  for (long j0 = 0; j0 < n; j0 += 32 * L) {
    __m512 p0 = _mm512_setzero_ps(), p1 = p0;
    for (long j = j0; j < j0 + 32 * L; j += L) {
      const __m512i raw = _mm512_loadu_si512(x + j);
      const __m512 v0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(raw)), 16));
      const __m512 v1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(raw, 1)), 16));
      __m512 e0, e1;
      if (Mode == 0) { e0 = _mm512_sub_ps(v0, mv); e1 = _mm512_sub_ps(v1, mv); }
      if (Mode == 1) { e0 = _mm512_fmadd_ps(_mm512_sub_ps(v0, mv), t0, t2); e1 = _mm512_fmadd_ps(_mm512_sub_ps(v1, mv), t0, t2);
        for (int q = 0; q < 7; ++q) { e0 = _mm512_fmadd_ps(e0, t0, t2); e1 = _mm512_fmadd_ps(e1, t0, t2);} }
      if (Mode == 2) { e0 = _mm512_fmadd_ps(_mm512_sub_ps(v0, mv), t0, t2); e1 = _mm512_fmadd_ps(_mm512_sub_ps(v1, mv), t0, t2);
        for (int q = 0; q < 3; ++q) { e0 = _mm512_fmadd_ps(e0, t0, t2); e1 = _mm512_fmadd_ps(e1, t0, t2);} }
      p0 = _mm512_add_ps(p0, e0); p1 = _mm512_add_ps(p1, e1);
      mx0 = _mm512_max_ps(mx0, v0); mx1 = _mm512_max_ps(mx1, v1);
    }
    alignas(64) float a[32]; _mm512_store_ps(a, p0); _mm512_store_ps(a + 16, p1);
    for (int l = 0; l < L; ++l) tot += a[l];
  }
  *mxo = _mm512_reduce_max_ps(_mm512_max_ps(mx0, mx1));
  return float(tot);
}
static inline float exp_cw1(float x) {
  constexpr float lo = -86.98f, magic = 12582912.0f;
  const float t = x * 1.44269504088896341f + magic;
  const float n = t - magic;
  const float r = x - n * 0.693147180559945f;
  float p = 0.08302771f;
  p = p * r + 0.3357495f; p = p * r + 1.0000603f; p = p * r + 1.9999337f; p = p * r + 2.0f;
  const float scale = from_bits(std::uint32_t((as_bits(t) - as_bits(magic) + 126u) << 23));
  return select(x < lo, 0.0f, p * scale);
}
template <int Store>
__attribute__((noinline)) float stats_eo1(const uint16_t* __restrict x16, float* __restrict y, long n, float m, float* mxo) {
  const uint32_t* x = reinterpret_cast<const uint32_t*>(x16);
  constexpr int W = 16;
  float pa[W] = {}, pb[W] = {}; float mx[W]; for (int l = 0; l < W; ++l) mx[l] = -1e30f;
  double tot = 0;
  for (long j0 = 0; j0 < n / 2; j0 += 32 * W) {
    for (long j = j0; j < j0 + 32 * W; j += W) {
#pragma omp simd
      for (int l = 0; l < W; ++l) {
        const uint32_t w = x[j + l];
        const float va = from_bits(w << 16), vb = from_bits(w & 0xffff0000u);
        const float ea = exp_cw1(va - m), eb = exp_cw1(vb - m);
        if (Store == 2) { y[2 * (j + l)] = ea; y[2 * (j + l) + 1] = eb; }
        pa[l] += ea; pb[l] += eb;
        const float vm = va > vb ? va : vb;
        mx[l] = vm > mx[l] ? vm : mx[l];
      }
    }
    for (int l = 0; l < W; ++l) { tot += pa[l]; tot += pb[l]; pa[l] = 0; pb[l] = 0; }
  }
  float M = -1e30f; for (int l = 0; l < W; ++l) M = mx[l] > M ? mx[l] : M; *mxo = M;
  return float(tot);
}
// even/odd: a 32-bit word holds two bf16: low = even column, high = odd column
template <ExpAccuracy A, int Store>
__attribute__((noinline)) float stats_eo(const uint16_t* __restrict x16, float* __restrict y, long n, float m, float* mxo) {
  const uint32_t* x = reinterpret_cast<const uint32_t*>(x16);
  constexpr int W = 16;
  float pa[W] = {}, pb[W] = {}; float mx[W]; for (int l = 0; l < W; ++l) mx[l] = -1e30f;
  double tot = 0;
  for (long j0 = 0; j0 < n / 2; j0 += 32 * W) {
    for (long j = j0; j < j0 + 32 * W; j += W) {
#pragma omp simd
      for (int l = 0; l < W; ++l) {
        const uint32_t w = x[j + l];
        const float va = from_bits(w << 16), vb = from_bits(w & 0xffff0000u);
        const float ea = fast_exp_no_overflow<A>(va - m), eb = fast_exp_no_overflow<A>(vb - m);
        if (Store == 1) { y[2 * j + l] = ea; y[2 * j + W + l] = eb; } if (Store == 2) { y[2 * (j + l)] = ea; y[2 * (j + l) + 1] = eb; }
        pa[l] += ea; pb[l] += eb;
        const float vm = va > vb ? va : vb;
        mx[l] = vm > mx[l] ? vm : mx[l];
      }
    }
    for (int l = 0; l < W; ++l) { tot += pa[l]; tot += pb[l]; pa[l] = 0; pb[l] = 0; }
  }
  float M = -1e30f; for (int l = 0; l < W; ++l) M = mx[l] > M ? mx[l] : M; *mxo = M;
  return float(tot);
}
template <bool Store>
__attribute__((noinline)) float stats_tab(const uint16_t* __restrict x, float* __restrict y, long n, float m, float* mxo) {
  const __m512 t0 = _mm512_load_ps(T0), t2 = _mm512_load_ps(T2), mv = _mm512_set1_ps(m);
  __m512 mx0 = _mm512_set1_ps(-1e30f), mx1 = mx0;
  double tot = 0;
  for (long j0 = 0; j0 < n; j0 += 32 * L) {
    __m512 p0 = _mm512_setzero_ps(), p1 = p0;
    for (long j = j0; j < j0 + 32 * L; j += L) {
      const __m512i raw = _mm512_loadu_si512(x + j);
      const __m512 v0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(raw)), 16));
      const __m512 v1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(raw, 1)), 16));
      const __m512 e0 = exp16(_mm512_sub_ps(v0, mv), t0, t2);
      const __m512 e1 = exp16(_mm512_sub_ps(v1, mv), t0, t2);
      if (Store) { _mm512_storeu_ps(y + j, e0); _mm512_storeu_ps(y + j + 16, e1); }
      p0 = _mm512_add_ps(p0, e0); p1 = _mm512_add_ps(p1, e1);
      mx0 = _mm512_max_ps(mx0, v0); mx1 = _mm512_max_ps(mx1, v1);
    }
    alignas(64) float a[32]; _mm512_store_ps(a, p0); _mm512_store_ps(a + 16, p1);
    for (int l = 0; l < L; ++l) tot += a[l];
  }
  *mxo = _mm512_reduce_max_ps(_mm512_max_ps(mx0, mx1));
  return float(tot);
}

int main() {
  init_tab(0.5f);
  // accuracy of exp16 over a sweep
  {
    double worst = 0, mean = 0; long cnt = 0; float wu = 0;
    const __m512 t0 = _mm512_load_ps(T0), t2 = _mm512_load_ps(T2);
    for (float u = -86.9f; u < 88.0f; ) {
      alignas(64) float in[16], out[16];
      for (int l = 0; l < 16; ++l) { in[l] = u; u = std::nextafter(u, 100.f); for (int s = 0; s < 60; ++s) u = std::nextafter(u, 100.f); }
      _mm512_store_ps(out, exp16(_mm512_load_ps(in), t0, t2));
      for (int l = 0; l < 16; ++l) { double ex = std::exp(double(in[l])); double e = (out[l] - ex) / ex; mean += e; ++cnt; if (std::fabs(e) > worst) { worst = std::fabs(e); wu = in[l]; } }
    }
    printf("table exp: worst rel %.3g at %g, mean %.3g (n=%ld)\n", worst, wu, mean / cnt, cnt);
  }
  const long n = 16384;
  std::vector<uint16_t> x(n); std::vector<float> y(n);
  uint64_t s = 1; for (auto& v : x) { s = s * 6364136223846793005ull + 1442695040888963407ull; float f = float(int(s >> 40) % 2000) / 200.0f - 5.0f; uint32_t u; std::memcpy(&u, &f, 4); v = uint16_t(u >> 16); }
  float mxo;
  auto run = [&](const char* name, auto fn) {
    double best = 1e30; float r = 0;
    for (int k = 0; k < 3000; ++k) { auto t0 = __rdtsc(); r += fn(); auto t1 = __rdtsc(); best = std::min(best, double(t1 - t0)); }
    printf("%-28s cycles/16 %.2f   %.6g\n", name, best / (n / 16.0) / 0.65, r / 3000);
  };
  run("convert+sum+max", [&] { return stats_var<0>(x.data(), y.data(), n, 3.0f, &mxo); });
  run("+8 fma chain", [&] { return stats_var<1>(x.data(), y.data(), n, 3.0f, &mxo); });
  run("+4 fma chain", [&] { return stats_var<2>(x.data(), y.data(), n, 3.0f, &mxo); });
  for (int rep = 0; rep < 1; ++rep) {
  run("evenodd poly4 nostore", [&] { return stats_eo<ExpAccuracy::input16, 0>(x.data(), y.data(), n, 3.0f, &mxo); });
  run("evenodd poly4 store natural", [&] { return stats_eo<ExpAccuracy::input16, 2>(x.data(), y.data(), n, 3.0f, &mxo); });
  run("evenodd cw1 nostore", [&] { return stats_eo1<0>(x.data(), y.data(), n, 3.0f, &mxo); });
  run("evenodd cw1 store natural", [&] { return stats_eo1<2>(x.data(), y.data(), n, 3.0f, &mxo); });
  run("evenodd poly4 store", [&] { return stats_eo<ExpAccuracy::input16, 1>(x.data(), y.data(), n, 3.0f, &mxo); });
  run("poly4 nostore", [&] { return stats<ExpAccuracy::input16, false>(x.data(), y.data(), n, 3.0f, &mxo); });
  run("poly4 store", [&] { return stats<ExpAccuracy::input16, true>(x.data(), y.data(), n, 3.0f, &mxo); });
  run("table nostore", [&] { return stats_tab<false>(x.data(), y.data(), n, 3.0f, &mxo); });
  run("table store", [&] { return stats_tab<true>(x.data(), y.data(), n, 3.0f, &mxo); });
  }
}
