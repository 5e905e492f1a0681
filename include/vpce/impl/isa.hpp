#pragma once
/// \file isa.hpp
/// \brief The instruction sets the host's row loops are compiled for: the build's own, and in a build for no
/// CPU in particular the copies for higher x86-64 levels, one of which every row runs (picked at run time).

#include <cstdio>
#include <cstdlib>
#include <cstring>

// An x86-64 build for no CPU in particular (no AVX2: neither -march nor VPCE_ENABLE_NATIVE) compiles the
// host's row loops four times: for the baseline (SSE2) and as copies for x86-64-v3 (AVX2, FMA, F16C), x86-64-v4
// (AVX-512) and x86-64-v4 with AVX512-BF16 in 512-bit registers (Isa); every row runs the copy of the highest
// level the CPU has (host_level: one branch per row, at_level in stream.hpp). Each copy runs the row with the
// host policy of its level (HostInner<L>), whose paths in intrinsics are the helpers of Copy<L> (stream.hpp),
// with the copy's own target attribute. -DVPCE_NO_HOST_CLONES turns the copies off.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__INTEL_COMPILER) && !defined(__INTEL_LLVM_COMPILER) && \
    __GNUC__ >= 11 && defined(__x86_64__) && !defined(__CUDACC__) && !defined(__HIPCC__) &&                      \
    !defined(__SYCL_DEVICE_ONLY__)
#define VPCE_X86_LEVELS 1  // cpu_level() below: GCC 11 and later on x86-64 (the -march names x86-64-v3, v4)
#else
#define VPCE_X86_LEVELS 0
#endif
#if VPCE_X86_LEVELS && !defined(__AVX2__) && !defined(VPCE_NO_HOST_CLONES)
#define VPCE_HOST_CLONES 1
#define VPCE_TARGET_V3 "arch=x86-64-v3"
#define VPCE_TARGET_V4 "arch=x86-64-v4"
#define VPCE_TARGET_V4_BF16 "arch=x86-64-v4,avx512bf16,prefer-vector-width=512"
// On the helpers in intrinsics that the copies share with builds for such CPUs: the instruction sets they use.
#define VPCE_NEEDS(isas) __attribute__((target(isas)))
#else
#define VPCE_HOST_CLONES 0
#define VPCE_NEEDS(isas)
#endif
#if VPCE_HOST_CLONES
#include <immintrin.h>
#endif

namespace vpce::impl {

/// The instruction sets a host row's loops are compiled for (HostInner<L>, kernels.hpp), in increasing order.
/// `build`: those of the translation unit's own -march, the paths in intrinsics (stream.hpp, math.hpp)
/// chosen by the preprocessor. The others: the copies that a build for no CPU in particular picks from at run time
/// (VPCE_HOST_CLONES): x86-64-v3, x86-64-v4 (256-bit registers, GCC's default there), and x86-64-v4 with
/// AVX512-BF16 in 512-bit registers (as -march=native builds for such CPUs: Intel since Cooper Lake, AMD since
/// Zen 4); their paths in intrinsics are Copy<L>'s.
enum class Isa { build, v3, v4, v4bf16 };

#if VPCE_X86_LEVELS
/// The highest level this CPU has (Isa::build where it is below x86-64-v3), by the levels' features:
/// x86-64-v3 is AVX2, FMA, F16C, BMI1, BMI2, LZCNT and MOVBE (with AVX, XSAVE and x86-64-v2's, which they
/// imply on every CPU), x86-64-v4 adds AVX-512 F, BW, CD, DQ and VL, v4bf16 AVX512-BF16. GCC's
/// __builtin_cpu_supports counts a feature whose registers the OS does not save as absent. (Its level names
/// came with GCC 12; GCC 11 is the floor for the copies' target attributes, arch=x86-64-v3 and v4.)
inline Isa cpu_level() {
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
        __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("lzcnt") &&
        __builtin_cpu_supports("movbe"))) {
    return Isa::build;
  }
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))) {
    return Isa::v3;
  }
  return __builtin_cpu_supports("avx512bf16") ? Isa::v4bf16 : Isa::v4;
}
#endif

#if VPCE_HOST_CLONES
/// The helpers of the copy at level L (stream.hpp): each with the copy's own target attribute.
template <Isa L>
struct Copy;

/// The level of the copies this CPU runs: the highest it has, at most the one the environment variable
/// VPCE_HOST_COPY names (baseline, x86-64-v3, x86-64-v4 or x86-64-v4-bf16: to run a lower copy, e.g. in tests;
/// another value is ignored, with a warning on stderr). Read once per process.
inline Isa host_level() {
  static const Isa level = [] {
    Isa l = cpu_level();
    if (const char* cap = std::getenv("VPCE_HOST_COPY")) {
      constexpr const char* names[] = {"baseline", "x86-64-v3", "x86-64-v4", "x86-64-v4-bf16"};
      int k = 0;
      while (k < 4 && std::strcmp(cap, names[k]) != 0) ++k;
      if (k == 4) {
        std::fprintf(stderr, "vpce: VPCE_HOST_COPY=%s ignored (baseline, x86-64-v3, x86-64-v4 or x86-64-v4-bf16)\n",
                     cap);
      } else if (Isa(k) < l) {
        l = Isa(k);
      }
    }
    return l;
  }();
  return level;
}
#endif

}  // namespace vpce::impl
