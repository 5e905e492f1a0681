// Why Clang's omp simd loops lost their promise (issue 12, thirty-sixth round). Compile with
//   clang++-19 -std=c++17 -O1 -fopenmp-simd -S -emit-llvm access_group.cpp -Xclang -disable-llvm-passes
// and look at the call to test1<float>'s lambda inside each loop: under `omp simd` it is an `invoke` (the lambda is not
// noexcept and no exception may leave an OpenMP region) with no !llvm.access.group; under the Clang pragma
// (-DCLANG_PRAGMA) a `call` with it. Only with the group do the lambda's load and store, once inlined, carry it
// at -O3: without it the vectoriser checks x and y for overlap at run time and keeps a scalar copy of the loop.
#include <cstdint>
#ifdef CLANG_PRAGMA
#define SIMD _Pragma("clang loop vectorize(assume_safety)")
#else
#define SIMD _Pragma("omp simd")
#endif
template <class G>
__attribute__((always_inline)) inline void run1(std::int64_t n, const G& g, float* acc) {
  SIMD
  for (std::int64_t l = 0; l < n; ++l) acc[l] += g(l);
}
// A template, as the library's kernels are: its lambda has linkonce_odr linkage. In a plain function the lambda is
// internal, and LLVM's argument promotion then rewrites its call without the group before the inliner runs.
template <class T>
void test1(const T* x, T* y, T* acc, std::int64_t n) {
  auto g = [=](std::int64_t j) {
    y[j] = x[j] * 2;
    return x[j];
  };
  run1(n, g, acc);
}
template void test1<float>(const float*, float*, float*, std::int64_t);
