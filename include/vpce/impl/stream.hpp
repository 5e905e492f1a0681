#pragma once
/// \file stream.hpp
/// \brief Copies with streaming (non-temporal) stores on the host, the software prefetch of the rows the
/// host's loops stream through, and the rounding of a line of floats to a 16-bit type by the CPU's own
/// conversion instructions.
///
/// A plain store to a line that is not in cache first reads the line (read-for-ownership): a copy of B bytes
/// moves 3B through memory. Streaming stores write whole lines without reading them (2B), the STREAM
/// convention. x86-64 has them from SSE2 on (every x86-64 CPU), wider with AVX and AVX-512: the widest the
/// compiler targets is used. Elsewhere a plain copy.

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "vpce/half.hpp"
#include "vpce/impl/isa.hpp"
#include "vpce/impl/math.hpp"

#if (defined(__x86_64__) || defined(_M_X64)) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && \
    !defined(__SYCL_DEVICE_ONLY__)
#include <immintrin.h>
#define VPCE_HAVE_STREAMING_STORES 1
#else
#define VPCE_HAVE_STREAMING_STORES 0
#endif
// The CPU's float -> 16-bit conversions (round_line_hw), where the compiler targets them (float16: F16C with
// AVX2, x86-64-v3 and later).
#if VPCE_HAVE_STREAMING_STORES && defined(__AVX512BF16__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define VPCE_HW_ROUND_BFLOAT16 1
#else
#define VPCE_HW_ROUND_BFLOAT16 0
#endif
#if VPCE_HAVE_STREAMING_STORES && defined(__F16C__) && defined(__AVX2__)
#define VPCE_HW_ROUND_FLOAT16 1
#else
#define VPCE_HW_ROUND_FLOAT16 0
#endif
// Without AVX512-BF16, bfloat16's rounding in AVX2's (AVX-512's) integer instructions (round_line_hw).
#if VPCE_HAVE_STREAMING_STORES && !VPCE_HW_ROUND_BFLOAT16 && defined(__AVX2__) && \
    (!defined(__AVX512F__) || (defined(__AVX512BW__) && defined(__AVX512VL__)))
#define VPCE_INT_ROUND_BFLOAT16 1
#else
#define VPCE_INT_ROUND_BFLOAT16 0
#endif
// Lines of 16-bit values rounded and written whole (round_line_hw) where the kernels are compiled for AVX-512
// with -mprefer-vector-width=512 (the build then defines VPCE_PREFER_VECTOR_WIDTH=512 for vpce's own translation
// units): a line's 32 floats are then formed in two 512-bit registers, so that they can be read as two.
#if VPCE_HAVE_STREAMING_STORES && defined(__AVX512F__) && defined(VPCE_PREFER_VECTOR_WIDTH)
#if VPCE_PREFER_VECTOR_WIDTH >= 512
#define VPCE_WHOLE_16BIT_LINES 1
#endif
#endif
#ifndef VPCE_WHOLE_16BIT_LINES
#define VPCE_WHOLE_16BIT_LINES 0
#endif
#if defined(__AVX512F__)
#define VPCE_AVX512_BUILD 1
#else
#define VPCE_AVX512_BUILD 0
#endif

namespace vpce::impl {

/// Whether stream_line and stream_copy write with streaming stores on this build.
inline constexpr bool have_streaming_stores = VPCE_HAVE_STREAMING_STORES != 0;

// The helpers in intrinsics, each where the build targets its instruction sets or the copies need it.
#if VPCE_HAVE_STREAMING_STORES && (VPCE_HOST_CLONES || defined(__AVX__))
KOKKOS_FORCEINLINE_FUNCTION VPCE_NEEDS("avx") void stream_line_256(void* dst, const void* src) {
  for (int k = 0; k < 2; ++k)
    _mm256_stream_si256(static_cast<__m256i*>(dst) + k, _mm256_loadu_si256(static_cast<const __m256i*>(src) + k));
}
#endif
#if VPCE_HAVE_STREAMING_STORES && (VPCE_HOST_CLONES || defined(__AVX512F__))
KOKKOS_FORCEINLINE_FUNCTION VPCE_NEEDS("avx512f") void stream_line_512(void* dst, const void* src) {
  _mm512_stream_si512(static_cast<__m512i*>(dst), _mm512_loadu_si512(src));
}
#endif

#if VPCE_HOST_CLONES || VPCE_INT_ROUND_BFLOAT16 || VPCE_HW_ROUND_FLOAT16
/// bfloat16(float)'s steps on a vector of floats' bits u (GCC's vector extensions, any width), each result in
/// the low half of its 32-bit lane: (u + 0x7fff + lsb) >> 16 (round to nearest even), and in `quiet` a NaN's top
/// half with its quiet bit set; round_bfloat16_int chooses between them. 7-8 instructions with 3 constants,
/// where GCC's vectorised bfloat16(float) took ~17 with 6 constants (it narrows the NaN test's mask to 16 bits
/// and selects there), and, on AVX2's 16 registers beside the exp's, sent the constants of both to the stack
/// (perf_tests/NOTES.md, issue 12, twenty-ninth round).
template <class U>
KOKKOS_FORCEINLINE_FUNCTION void round_bfloat16_steps(const U& u, U& rounded, U& quiet) {  // by reference: any width
  const U top = u >> 16;
  quiet = top | 0x40u;
  rounded = (u + 0x7fffu + (top & 1u)) >> 16;
}
KOKKOS_FORCEINLINE_FUNCTION VPCE_NEEDS("avx2") __m256i round_bfloat16_int(__m256 v) {
  using U = unsigned __attribute__((vector_size(32)));
  U r, quiet;
  round_bfloat16_steps(U(_mm256_castps_si256(v)), r, quiet);
  const __m256i rounded = __m256i(r);
#if defined(__AVX512VL__)
  // vpblendvb takes only the first 16 vector registers; a mask register, any of 32
  return _mm256_mask_blend_epi32(_mm256_cmp_ps_mask(v, v, _CMP_UNORD_Q), rounded, __m256i(quiet));
#else
  return _mm256_blendv_epi8(rounded, __m256i(quiet), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
#endif
}

/// round_line_hw's form in 256-bit registers by AVX2's and F16C's instructions: bfloat16 by its integer steps
/// (round_bfloat16_int), float16 by vcvtps2ph unless the line holds a NaN (false: see round_line_hw). f is
/// read in 256-bit pieces, the width GCC stores it in (see stream_line), also with AVX-512.
template <class G>
KOKKOS_FORCEINLINE_FUNCTION VPCE_NEEDS("avx2,f16c") bool round_line_256(G* line, const float* f) {
  __m256 v[4];
  unsigned nan = 0;
  for (std::ptrdiff_t k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(f + 8 * k);
    if constexpr (std::is_same_v<G, float16>)
      nan |= unsigned(_mm256_movemask_ps(_mm256_cmp_ps(v[k], v[k], _CMP_UNORD_Q)));
  }
  if constexpr (std::is_same_v<G, bfloat16>) {
    for (std::ptrdiff_t k = 0; k < 2; ++k) {
      // vpackusdw packs within 128-bit lanes (a 0-3, b 0-3, a 4-7, b 4-7); vpermq puts them in order
      const __m256i packed = _mm256_packus_epi32(round_bfloat16_int(v[2 * k]), round_bfloat16_int(v[2 * k + 1]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(line) + k, _mm256_permute4x64_epi64(packed, 0xd8));
    }
  } else {
    if (nan != 0) return false;
    // Two conversions per 256-bit store: stream_line reads the line in 256-bit pieces, and a load that spans
    // two smaller stores is not forwarded from them (it waits for both to reach the cache: float16's
    // `loss_and_grad` 2x slower on a Zen 4 with 128-bit stores here).
    constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (std::ptrdiff_t k = 0; k < 2; ++k) {
      const __m128i lo = _mm256_cvtps_ph(v[2 * k], nearest), hi = _mm256_cvtps_ph(v[2 * k + 1], nearest);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(line) + k,
                          _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
    }
  }
  return true;
}

/// widen16_hw's form by F16C's 256-bit vcvtph2ps (two per 16 values).
KOKKOS_FORCEINLINE_FUNCTION VPCE_NEEDS("avx2,f16c") void widen16_256(const float16* x, float* f) {
  for (std::ptrdiff_t k = 0; k < 2; ++k) {
    _mm256_storeu_ps(f + 8 * k, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x) + k)));
  }
}
#endif

#if VPCE_HOST_CLONES || VPCE_WHOLE_16BIT_LINES
KOKKOS_FORCEINLINE_FUNCTION VPCE_NEEDS("avx512f") __m512i round_bfloat16_int(__m512 v) {
  using U = unsigned __attribute__((vector_size(64)));
  U r, quiet;
  round_bfloat16_steps(U(_mm512_castps_si512(v)), r, quiet);
  const __m512i rounded = __m512i(r);
  return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), rounded, __m512i(quiet));
}
/// round_line_hw's whole-line form: f in two 512-bit registers (VPCE_WHOLE_16BIT_LINES), the line formed in one
/// and stored by one 512-bit store: a third of the instructions of the 256-bit form, which split the registers
/// into halves and passed the line through the stack (bfloat16 `loss_and_grad` -8 to -9%, backward -20%, on an
/// AMD EPYC Zen 5: perf_tests/NOTES.md, issue 12, seventeenth round). bfloat16 by AVX512-BF16's vcvtne2ps2bf16
/// where `HwBf16` (false for a line with a subnormal: see round_line_hw), else by its integer steps; float16 by
/// vcvtps2ph unless the line holds a NaN.
template <class G, bool HwBf16>
KOKKOS_FORCEINLINE_FUNCTION VPCE_NEEDS("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c") bool round_line_512(
    G* line, const float* f) {
  const __m512 lo = _mm512_loadu_ps(f), hi = _mm512_loadu_ps(f + 16);
  __m512i out;
  if constexpr (std::is_same_v<G, bfloat16> && HwBf16) {
    if ((_mm512_fpclass_ps_mask(lo, 0x20) | _mm512_fpclass_ps_mask(hi, 0x20)) != 0) return false;  // subnormal
    out = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
  } else if constexpr (std::is_same_v<G, bfloat16>) {
    // vpackusdw packs within 128-bit lanes (lo 0-3, hi 0-3, lo 4-7, ...); vpermq puts the quadwords in order
    const __m512i packed = _mm512_packus_epi32(round_bfloat16_int(lo), round_bfloat16_int(hi));
    out = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed);
  } else {
    if ((_mm512_cmp_ps_mask(lo, lo, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(hi, hi, _CMP_UNORD_Q)) != 0) return false;
    // The masked forms: GCC 12's unmasked ones pass _mm*_undefined_* and warn (-Wmaybe-uninitialized).
    constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m256i a = _mm512_maskz_cvtps_ph(0xffff, lo, nearest), b = _mm512_maskz_cvtps_ph(0xffff, hi, nearest);
    out = _mm512_maskz_inserti64x4(0xff, _mm512_maskz_inserti64x4(0xff, _mm512_setzero_si512(), a, 0), b, 1);
  }
  _mm512_storeu_si512(line, out);
  return true;
}
#endif
#if VPCE_HOST_CLONES || (VPCE_HW_ROUND_FLOAT16 && defined(__AVX512F__))
/// widen16_hw's form by one 512-bit vcvtph2ps; the masked form: GCC 12's unmasked one passes _mm512_undefined_ps
/// (as the rounding's, round_line_512).
KOKKOS_FORCEINLINE_FUNCTION VPCE_NEEDS("avx512f,f16c") void widen16_512(const float16* x, float* f) {
  _mm512_storeu_ps(f, _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))));
}
#endif

#if VPCE_HAVE_STREAMING_STORES && VPCE_WHOLE_16BIT_LINES && defined(__AVX512BW__)
#define VPCE_WIDEN32_BFLOAT16 1
/// w[l] = float(x[l]) for l < 32, x bfloat16 (a float's upper half): two zero-masked vpermw put column l in the
/// upper half of lane l, in column order, where GCC's own widening takes an extract, two vpmovzxwd and two shifts
/// (HostInner::sums_max). Where the build prefers 512-bit vectors, so that the loop reading w reads it in the
/// two 512-bit halves written here (the copies: widen32_vec).
KOKKOS_FORCEINLINE_FUNCTION VPCE_NEEDS("avx512bw") void widen32_bf16_512(const bfloat16* x, float* w) {
  alignas(64) static constexpr std::uint16_t lo[32] = {0, 0, 0, 1, 0, 2,  0, 3,  0, 4,  0, 5,  0, 6,  0, 7,
                                                       0, 8, 0, 9, 0, 10, 0, 11, 0, 12, 0, 13, 0, 14, 0, 15};
  alignas(64) static constexpr std::uint16_t hi[32] = {0, 16, 0, 17, 0, 18, 0, 19, 0, 20, 0, 21, 0, 22, 0, 23,
                                                       0, 24, 0, 25, 0, 26, 0, 27, 0, 28, 0, 29, 0, 30, 0, 31};
  const __m512i v = _mm512_loadu_si512(x);
  _mm512_store_ps(w, _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xaaaaaaaau, _mm512_load_si512(lo), v)));
  _mm512_store_ps(w + 16, _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xaaaaaaaau, _mm512_load_si512(hi), v)));
}
#else
#define VPCE_WIDEN32_BFLOAT16 0
#endif

#if VPCE_HAVE_STREAMING_STORES && defined(__AVX512F__)
/// max16_hw's forms: mx[l] = v[l] > mx[l] ? v[l] : mx[l] for l < 16 by vmaxps, in 256-bit or 512-bit registers
/// (the instruction's own rule: the second operand where the first is not greater, NaN among them). The
/// copies': max16_vec.
KOKKOS_FORCEINLINE_FUNCTION VPCE_NEEDS("avx") void max16_256(const float* v, float* mx) {
  for (std::ptrdiff_t k = 0; k < 2; ++k)
    _mm256_storeu_ps(mx + 8 * k, _mm256_max_ps(_mm256_loadu_ps(v + 8 * k), _mm256_loadu_ps(mx + 8 * k)));
}
KOKKOS_FORCEINLINE_FUNCTION VPCE_NEEDS("avx512f") void max16_512(const float* v, float* mx) {
  // the masked form: GCC 12's unmasked one passes _mm512_undefined_ps (as round_line_512's)
  _mm512_storeu_ps(mx, _mm512_maskz_max_ps(0xffff, _mm512_loadu_ps(v), _mm512_loadu_ps(mx)));
}
#endif

#if VPCE_HOST_CLONES
/// The copies' helpers at level L (Isa): the forms above for the copy's instruction sets, each with the copy's
/// own target attribute and plain inline, so that GCC inlines them into that copy only (compiled into the
/// functions without a target on the way there, as an always_inline function would be, their instructions
/// could not be). `apart(f)`: f() out of line, compiled for the level with everything it calls inlined (the
/// row of a copy, and what a row calls apart on purpose: Apart, kernels.hpp). GCC may leave a helper called
/// all the same (max16_vec below says why): the copies' object code shows the calls left. The helpers are
/// noexcept: in C++ GCC takes the x86 builtins they call for calls that may throw, and in a function with a
/// cleanup (a row flattened into a copy together with objects holding Views) each would end its block with an
/// exception edge; GCC's store motion then leaves the loop's sums and maxima in memory, a store and a load per
/// 16 columns (perf_tests/NOTES.md, issue 12, forty-fourth round).
template <>
struct Copy<Isa::v3> {
  template <class G>
  __attribute__((target(VPCE_TARGET_V3))) static bool round_line(G* line, const float* f) noexcept {
    return round_line_256(line, f);
  }
  __attribute__((target(VPCE_TARGET_V3))) static void widen16(const float16* x, float* f) noexcept {
    widen16_256(x, f);
  }
  template <bool Whole>
  __attribute__((target(VPCE_TARGET_V3))) static void stream_line(void* dst, const void* src) noexcept {
    stream_line_256(dst, src);
  }
  template <class F>
  __attribute__((target(VPCE_TARGET_V3), noinline, flatten)) static void apart(const F& f) {
    f();
  }
};
template <>
struct Copy<Isa::v4> {
  template <class G>
  __attribute__((target(VPCE_TARGET_V4))) static bool round_line(G* line, const float* f) noexcept {
    return round_line_256(line, f);
  }
  __attribute__((target(VPCE_TARGET_V4))) static void widen16(const float16* x, float* f) noexcept {
    widen16_256(x, f);
  }
  __attribute__((target(VPCE_TARGET_V4))) static void exp_lanes16(const float (&u)[16], float (&e)[16]) noexcept {
    exp_table_lanes16(u, e);
  }
  template <bool Whole>
  __attribute__((target(VPCE_TARGET_V4))) static void stream_line(void* dst, const void* src) noexcept {
    if constexpr (Whole) {
      stream_line_512(dst, src);
    } else {
      stream_line_256(dst, src);
    }
  }
  template <class F>
  __attribute__((target(VPCE_TARGET_V4), noinline, flatten)) static void apart(const F& f) {
    f();
  }
};
template <>
struct Copy<Isa::v4bf16> {
  template <class G>
  __attribute__((target(VPCE_TARGET_V4_BF16))) static bool round_line(G* line, const float* f) noexcept {
    return round_line_512<G, true>(line, f);
  }
  __attribute__((target(VPCE_TARGET_V4_BF16))) static void widen16(const float16* x, float* f) noexcept {
    widen16_512(x, f);
  }
  __attribute__((target(VPCE_TARGET_V4_BF16))) static void exp_lanes16(const float (&u)[16], float (&e)[16]) noexcept {
    exp_table_lanes16(u, e);
  }
  template <bool Whole>
  __attribute__((target(VPCE_TARGET_V4_BF16))) static void stream_line(void* dst, const void* src) noexcept {
    if constexpr (Whole) {
      stream_line_512(dst, src);
    } else {
      stream_line_256(dst, src);
    }
  }
  template <class F>
  __attribute__((target(VPCE_TARGET_V4_BF16), noinline, flatten)) static void apart(const F& f) {
    f();
  }
};
#endif

/// f() compiled as the host's row loops of level L are: in Copy<L>::apart where L is a copy's level (its target
/// attribute, f's whole call tree inlined), so that the compiler forms the same instructions as there; at
/// Isa::build as it is.
template <Isa L, class F>
void in_level(const F& f) {
#if VPCE_HOST_CLONES
  if constexpr (L != Isa::build) {
    Copy<L>::apart(f);
    return;
  }
#endif
  f();
}

#if VPCE_HOST_CLONES
/// f(std::integral_constant<Isa, L>{}) in_level<L>, for the level L = `level` known at run time (host_level():
/// the copy this CPU's rows run in). The one place that picks a copy: RowDriver (kernels.hpp) runs each row
/// through it, the benchmark's read-only pass too. Inlined into its caller, so that at Isa::build f runs there as
/// it would without copies. F: a class with a template operator(), not a generic lambda, whose type the names of
/// the copies' functions would carry in a form binutils 2.40 (c++filt, objdump -C, perf) cannot demangle.
template <class F>
__attribute__((always_inline)) inline void at_level(Isa level, const F& f) {
  switch (level) {
    case Isa::v3:
      return in_level<Isa::v3>([&] { f(std::integral_constant<Isa, Isa::v3>{}); });
    case Isa::v4:
      return in_level<Isa::v4>([&] { f(std::integral_constant<Isa, Isa::v4>{}); });
    case Isa::v4bf16:
      return in_level<Isa::v4bf16>([&] { f(std::integral_constant<Isa, Isa::v4bf16>{}); });
    default:
      f(std::integral_constant<Isa, Isa::build>{});
  }
}
#endif

/// Writes the 64-byte line at dst (64-byte aligned) from src (any alignment) with streaming stores where the
/// CPU has them, else a plain copy. Weakly ordered: stream_fence() before other threads may read the line.
/// `Whole`: src was just formed in ONE 512-bit register where the CPU has AVX-512 (a line of 4- or 8-byte
/// values: GCC keeps it there, also at -mprefer-vector-width=256, and never stores it to src: checked in the
/// object code of x86-64-v4 and -march=native builds; a line of 16-bit values where round_line_whole),
/// written by one 512-bit streaming store: fp32 `loss_and_grad` at 1 rank x 2 threads 41.3 -> 38.9 ms on an
/// AMD EPYC (Zen 4), whose 512-bit stores take two cycles (perf_tests/NOTES.md, issue 12, tenth round).
/// Otherwise, with AVX, src is read and written in 32-byte halves: a 16-bit line is formed in 256-bit halves
/// (round_line_hw's 256-bit conversions, and GCC's stores at its default -mprefer-vector-width=256 on AVX-512
/// CPUs), and a 64-byte load of two 32-byte stores cannot be forwarded from them and stalls (measured: 52% of
/// the bfloat16 Finalize's samples on that load, AVX-512 Xeon). The two streaming stores fill one line of the
/// write-combining buffer, as one 64-byte store would. L: the level's instructions (Isa).
template <bool Whole, Isa L>
KOKKOS_FORCEINLINE_FUNCTION void stream_line(void* dst, const void* src) {
#if VPCE_HOST_CLONES
  if constexpr (L != Isa::build) {
    Copy<L>::template stream_line<Whole>(dst, src);
    return;
  }
#endif
#if VPCE_HAVE_STREAMING_STORES
#if defined(__AVX512F__)
  if constexpr (Whole) {
    stream_line_512(dst, src);
    return;
  }
#endif
#if defined(__AVX__)
  stream_line_256(dst, src);
#else
  for (int k = 0; k < 4; ++k)
    _mm_stream_si128(static_cast<__m128i*>(dst) + k, _mm_loadu_si128(static_cast<const __m128i*>(src) + k));
#endif
#else
  std::memcpy(dst, src, 64);
#endif
}

/// Orders the streaming stores before it before the stores after it (the data is visible to other threads
/// once the caller synchronises with them).
KOKKOS_FORCEINLINE_FUNCTION void stream_fence() {
#if VPCE_HAVE_STREAMING_STORES
  _mm_sfence();
#endif
}

/// memcpy(dst, src, bytes), the destination's whole lines written with stream_line, the bytes before and after
/// them with plain stores. Ends with stream_fence(), so the data is visible to other threads once the caller
/// synchronises with them.
KOKKOS_INLINE_FUNCTION void stream_copy(void* dst, const void* src, std::size_t bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const std::size_t to_line = (64 - reinterpret_cast<std::uintptr_t>(d) % 64) % 64;
  const std::size_t head = bytes < to_line ? bytes : to_line;  // not std::min: a host function for nvcc
  std::memcpy(d, s, head);
  std::size_t k = head;
  for (; k + 64 <= bytes; k += 64) stream_line<false, Isa::build>(d + k, s + k);
  std::memcpy(d + k, s + k, bytes - k);
  stream_fence();
}

/// Whether round_line_hw<G, L> has instructions for G: at Isa::build where the build targets them, in the copies
/// always (F16C, AVX2).
template <class G, Isa L>
inline constexpr bool have_round_line_hw = L != Isa::build ? (VPCE_HOST_CLONES != 0 && is_16bit_v<G>)
                                           : std::is_same_v<G, bfloat16>
                                               ? (VPCE_HW_ROUND_BFLOAT16 != 0 || VPCE_INT_ROUND_BFLOAT16 != 0)
                                               : (VPCE_HW_ROUND_FLOAT16 != 0 && std::is_same_v<G, float16>);

/// Whether round_line_hw<G, L> forms a line of G in ONE 512-bit register (stream_line<true> may then write it):
/// with VPCE_WHOLE_16BIT_LINES at Isa::build, in the copy for AVX512-BF16 (512-bit registers).
template <class G, Isa L>
inline constexpr bool round_line_whole = have_round_line_hw<G, L> &&
                                         (L == Isa::build ? VPCE_WHOLE_16BIT_LINES != 0 : L == Isa::v4bf16);

/// line[l] = G(f[l]) for the 32 floats of a line of 16-bit G, by the CPU's conversion instructions where the
/// level L has them: AVX512-BF16's vcvtne2ps2bf16 for bfloat16 (AVX-512 CPUs since Cooper Lake and Zen 4),
/// F16C's vcvtps2ph for float16 (every x86-64-v3 CPU). Both round to nearest even as bfloat16(float) and
/// float16(float) do, bit for bit, except where the instruction treats a value otherwise: vcvtne2ps2bf16
/// flushes subnormal floats to zero, vcvtps2ph keeps a NaN's payload (float16(float) gives 0x7e00). A line
/// holding such a value is left to the caller: false (always where L has no such instruction), and the caller
/// rounds it in software. So the bits never depend on the ISA (test_math checks every 61st float). In software
/// the rounding is ~10 (bfloat16) to ~20 (float16) integer operations per vector. Without AVX512-BF16,
/// bfloat16(float)'s integer steps written in AVX2's or AVX-512's instructions (round_bfloat16_int): the same
/// bits for every float, every line rounded here.
template <class G, Isa L>
KOKKOS_FORCEINLINE_FUNCTION bool round_line_hw(G* line, const float* f) {
  static_assert(is_16bit_v<G>, "a 16-bit type");
#if VPCE_HOST_CLONES
  if constexpr (L != Isa::build) return Copy<L>::round_line(line, f);
#endif
#if VPCE_WHOLE_16BIT_LINES && (VPCE_HW_ROUND_BFLOAT16 || VPCE_HW_ROUND_FLOAT16 || VPCE_INT_ROUND_BFLOAT16)
  if constexpr (have_round_line_hw<G, Isa::build>) return round_line_512<G, VPCE_HW_ROUND_BFLOAT16 != 0>(line, f);
#elif VPCE_HW_ROUND_BFLOAT16 || VPCE_HW_ROUND_FLOAT16 || VPCE_INT_ROUND_BFLOAT16
#if VPCE_HW_ROUND_BFLOAT16
  if constexpr (std::is_same_v<G, bfloat16>) {
    // f is read in 256-bit pieces, the width GCC stores it in (see stream_line), also with AVX-512.
    __m256 v[4];
    unsigned subnormal = 0;  // lanes the instruction would flush to zero
    for (std::ptrdiff_t k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(f + 8 * k);
      subnormal |= _mm256_fpclass_ps_mask(v[k], 0x20);
    }
    if (subnormal != 0) return false;
    for (std::ptrdiff_t k = 0; k < 2; ++k) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(line) + k,
                          reinterpret_cast<__m256i>(_mm256_cvtne2ps_pbh(v[2 * k + 1], v[2 * k])));
    }
    return true;
  }
#endif
  if constexpr (have_round_line_hw<G, Isa::build>) return round_line_256(line, f);
#endif
  (void)line;
  (void)f;
  return false;
}

/// Whether widen16_hw<L> has instructions for S: F16C's vcvtph2ps for float16 (every x86-64-v3 CPU), at
/// Isa::build where the build targets it, in the copies always.
template <class S, Isa L>
inline constexpr bool have_widen_hw = std::is_same_v<S, float16> &&
                                      (L == Isa::build ? VPCE_HW_ROUND_FLOAT16 != 0 : VPCE_HOST_CLONES != 0);

/// f[l] = float(x[l]) for 16 float16 values (any alignment): one vcvtph2ps with AVX-512, two with F16C alone,
/// where 16 values in software take ~10 integer operations per vector (float16's operator float); elsewhere
/// that. The same bits as float(float16) for every pattern but a signalling NaN, which the instruction quiets
/// (a NaN all the same, and quieted by the first operation on it in either form; test_math checks all 65536).
template <Isa L>
KOKKOS_FORCEINLINE_FUNCTION void widen16_hw(const float16* x, float* f) {
#if VPCE_HOST_CLONES
  if constexpr (L != Isa::build) return Copy<L>::widen16(x, f);
#endif
#if VPCE_HW_ROUND_FLOAT16 && defined(__AVX512F__)
  widen16_512(x, f);
#elif VPCE_HW_ROUND_FLOAT16
  widen16_256(x, f);
#else
  for (std::ptrdiff_t l = 0; l < 16; ++l) f[l] = float(x[l]);
#endif
}

#if VPCE_HOST_CLONES
/// max16_hw's and widen32_hw's forms in the copies (VPCE_HOST_CLONES), in GCC's generic vectors, which GCC
/// compiles into the instructions of the copy they end up in, as it does the loops. As helpers of Copy<L>
/// (stream.hpp's other forms) GCC never inlined max16 into a copy (124 calls a copy in the bfloat16 object: one
/// per 16 columns of loss_and_grad, forward, entropy...): it first tries the helper in the function that
/// calls it (max16_hw, no target), and that failure, a target mismatch, is final also once that function is
/// inlined into the copy. The copy for AVX512-BF16's bfloat16 `loss_and_grad` -38% with them and the
/// widening (perf_tests/NOTES.md, issue 12, forty-third round). Lanes: floats per vector, as the copy's loops
/// (Copy<Isa::v4>: 8, 256-bit registers; Copy<Isa::v4bf16>: 16).
typedef float vpce_f32x8 __attribute__((vector_size(32)));
typedef float vpce_f32x16 __attribute__((vector_size(64)));
typedef short vpce_i16x32 __attribute__((vector_size(64)));
template <int Lanes>
KOKKOS_FORCEINLINE_FUNCTION void max16_vec(const float* v, float* mx) {
  using V = std::conditional_t<Lanes == 8, vpce_f32x8, vpce_f32x16>;
  for (int k = 0; k < 16; k += Lanes) {
    V a, m;
    __builtin_memcpy(&a, v + k, sizeof a);
    __builtin_memcpy(&m, mx + k, sizeof m);
    m = a > m ? a : m;  // vmaxps
    __builtin_memcpy(mx + k, &m, sizeof m);
  }
}
/// widen32_bf16_512's form: two shuffles of 16-bit elements with zeros (vpermt2w), column l in the upper half
/// of lane l.
KOKKOS_FORCEINLINE_FUNCTION void widen32_vec(const bfloat16* x, float* w) {
  const vpce_i16x32 zero = {}, lo = {0, 32, 0, 33, 0, 34, 0, 35, 0, 36, 0, 37, 0, 38, 0, 39,
                                     0, 40, 0, 41, 0, 42, 0, 43, 0, 44, 0, 45, 0, 46, 0, 47},
                    hi = {0, 48, 0, 49, 0, 50, 0, 51, 0, 52, 0, 53, 0, 54, 0, 55,
                          0, 56, 0, 57, 0, 58, 0, 59, 0, 60, 0, 61, 0, 62, 0, 63};
  vpce_i16x32 v;
  __builtin_memcpy(&v, x, sizeof v);
  const vpce_i16x32 a = __builtin_shuffle(zero, v, lo), b = __builtin_shuffle(zero, v, hi);
  __builtin_memcpy(w, &a, sizeof a);
  __builtin_memcpy(w + 16, &b, sizeof b);
}
#endif

/// Whether max16_hw<T, L> has instructions: float where L has AVX-512 (Isa::build where the build targets it).
template <class T, Isa L>
inline constexpr bool have_max16_hw = std::is_same_v<T, float> &&
                                      (L == Isa::build ? VPCE_HAVE_STREAMING_STORES != 0 && VPCE_AVX512_BUILD != 0
                                                       : VPCE_HOST_CLONES != 0 && L != Isa::v3);

/// mx[l] = v[l] > mx[l] ? v[l] : mx[l] for l < 16 (a NaN in v ignored, as the loops' own maxima ignore it; the
/// same bits), by one vmaxps where the level's loops are 512 bits wide, two where they are 256 (have_max16_hw:
/// AVX-512). For the maxima of values formed from 16-bit logits' bits (a shift, a mask), which GCC's AVX-512
/// code selects in the integer domain (HostInner::sums_max's MaxApart). v is read in the width the loops
/// prefer (VPCE_WHOLE_16BIT_LINES: 512 bits): a 512-bit load of an array that a loop stored in two 256-bit
/// halves waits for both stores to reach the cache, so the callers are loops GCC vectorises at that width.
template <Isa L>
KOKKOS_FORCEINLINE_FUNCTION void max16_hw(const float* v, float* mx) {
#if VPCE_HOST_CLONES
  if constexpr (L != Isa::build) {
    max16_vec<L == Isa::v4bf16 ? 16 : 8>(v, mx);
    return;
  }
#endif
#if VPCE_HAVE_STREAMING_STORES && VPCE_AVX512_BUILD
#if VPCE_WHOLE_16BIT_LINES
  max16_512(v, mx);
#else
  max16_256(v, mx);
#endif
#endif
  (void)v;
  (void)mx;
}

/// Whether widen32_hw<L> has instructions: where L's loops are 512 bits wide with AVX512BW (VPCE_WIDEN32_BFLOAT16
/// at Isa::build; the copy for AVX512-BF16).
template <Isa L>
inline constexpr bool have_widen32_hw =
    L == Isa::build ? VPCE_WIDEN32_BFLOAT16 != 0 : VPCE_HOST_CLONES != 0 && L == Isa::v4bf16;

/// w[l] = float(x[l]) for 32 bfloat16 values (x any alignment, w 64-byte aligned) by two vpermw
/// (widen32_bf16_512; the copies' widen32_vec), where have_widen32_hw<L>.
template <Isa L>
KOKKOS_FORCEINLINE_FUNCTION void widen32_hw(const bfloat16* x, float* w) {
  static_assert(have_widen32_hw<L>, "widen32_hw: a level with 512-bit loops and AVX512BW");
#if VPCE_HOST_CLONES
  if constexpr (L != Isa::build) {
    widen32_vec(x, w);
    return;
  }
#endif
#if VPCE_WIDEN32_BFLOAT16
  widen32_bf16_512(x, w);
#endif
  (void)x;
  (void)w;
}

/// How far ahead of its loads a host loop that streams a row prefetches, in bytes (HostInner, kernels.hpp).
/// The hardware prefetchers alone fall behind while the exps keep the core busy: the time of the exp-and-sum
/// pass was that of a read PLUS that of the exps. A line prefetched per line loaded, this far ahead, lets
/// the memory stream run under the exps. Measured (2 threads over 512 MiB, Intel Xeon with AVX-512): 1 KiB
/// ahead 42 ms, 4 KiB 36 ms, 16 KiB 36-39 ms, 64 KiB 38-40 ms, none 56 ms, a read alone 30 ms
/// (perf_tests/NOTES.md, issue 12).
inline constexpr std::int64_t prefetch_distance = 4096;

/// A hint that the line at p will be read soon: into every cache level (Locality 3, x86's prefetcht0) or into
/// L2 and beyond (2, prefetcht1); with Write, that it will be written (x86's prefetchw). Never faults; a no-op
/// on devices and compilers without the builtin.
template <int Locality, bool Write = false>
KOKKOS_FORCEINLINE_FUNCTION void prefetch(const void* p) {
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && \
    !defined(__SYCL_DEVICE_ONLY__)
  __builtin_prefetch(p, Write ? 1 : 0, Locality);
#else
  (void)p;
#endif
}

/// The smallest page size of x86-64 (and most CPUs), in bytes: the unit of the address translations that
/// kick_next_page fetches ahead.
inline constexpr std::uintptr_t small_page_bytes = 4096;

/// Called with each line a host loop writes with streaming stores (HostInner::store), and with each line the
/// loops that read a row of 4-byte columns prefetch into L2 (Ahead::at with Hint::l2_near_l1, a page ahead of
/// their loads): at a page's first line, prefetches the next page's first line for writing, so that the next
/// page's address translation is walked while this page is written (or prefetched). A streaming store into a
/// page whose translation is not in the TLB waits for the page walk, and nothing else walks the destination's
/// pages ahead (the software prefetches are the rows read; no hardware prefetcher follows streaming stores);
/// a read row's L2 prefetches walk each page at its first line only, which then waits for it. One line in 64
/// is read before its streaming store, one read line in 64 fetched for writing. Measured on an AMD EPYC Zen 5
/// (interleaved rounds, paired ratios, 1 rank x 2 threads / 2 ranks x 1 thread): on the stores, bfloat16
/// `loss_and_grad` -14% / -10% (faster in all 32 paired rounds of three A/Bs), backward (recompute) -3 to
/// -13%, fp32 0 to -4%; on the reads, the fp32 forward -8 to -11% / -7 to -14% over four A/Bs, its backward
/// 0 to -8%, where a read prefetch instead (prefetcht1, prefetcht0) gained less (-7% / -7%, -1% / -5%); on the
/// rows of 16-bit logits read by the backward it cost 15% (perf_tests/NOTES.md, issue 12, twentieth and
/// twenty-first rounds). Huge pages for the caller's buffers do the same by other means.
KOKKOS_FORCEINLINE_FUNCTION void kick_next_page(const void* line) {
  if ((reinterpret_cast<std::uintptr_t>(line) & (small_page_bytes - 1)) == 0)
    prefetch<3, true>(static_cast<const char*>(line) + small_page_bytes);
}

/// How far ahead of its loads a loop that only reads a row of 4-byte columns also prefetches into L1, in
/// bytes (Hint::l2_near_l1). Measured (2 threads, fp32 N 4096 x V 32768, Intel Xeon with AVX-512): the
/// backward (recompute) 7-8% faster with 512 B, the forward 2-4%; for 16-bit rows the extra instruction
/// slowed the forward, bound by its exps, by 4-8% (perf_tests/NOTES.md, issue 12, seventh and eighth rounds).
inline constexpr std::int64_t near_distance = 512;

/// Where a host loop's prefetches put the lines of the row it streams: into L2 only, `prefetch_distance`
/// bytes ahead (l2); the same, and into L1 `near_distance` ahead (l2_near_l1); into L1 `prefetch_distance`
/// ahead (l1). Into L2 the loops that only read the row (the forward's statistics, the backward's recompute)
/// ran 14-18% faster than into L1 (fp32 forward at 1x2 31.6 -> 27.2 ms; the L1's fill buffers stay free for
/// the loads), while the fused `loss_and_grad`'s statistics, which store the exps and share the core with
/// another row's streamed gradient, ran 3-4% slower (44.0 -> 45.6 ms; NOTES.md, issue 12, sixth round).
enum class Hint { l2, l2_near_l1, l1 };

/// The hint of a loop that only reads a row of S: the near L1 prefetch for 4-byte (and wider) columns only.
template <class S>
inline constexpr Hint read_hint = sizeof(S) >= 4 ? Hint::l2_near_l1 : Hint::l2;

/// A row a host loop streams through, prefetched as H says (HostInner's loops call at() once per step of
/// columns). The hint is a template parameter, so that the loops carry no test of it. Default: nothing to
/// prefetch (elem 0).
template <Hint H = Hint::l2>
struct Ahead {
  const char* row = nullptr;
  std::int64_t elem = 0;  ///< bytes per column
  template <class S>
  KOKKOS_FORCEINLINE_FUNCTION static Ahead of(const S* row) {
    return {reinterpret_cast<const char*>(row), row == nullptr ? 0 : std::int64_t(sizeof(S))};
  }
  /// The same row from column j0 on.
  KOKKOS_FORCEINLINE_FUNCTION Ahead from(std::int64_t j0) const { return {row + j0 * elem, elem}; }
  /// The same row with another hint.
  template <Hint Other>
  KOKKOS_FORCEINLINE_FUNCTION Ahead<Other> as() const {
    return {row, elem};
  }
  /// Prefetches the lines of columns [j, j + cols), as H says. The default Ahead (elem 0) runs no
  /// iteration, so the loops that call this need no test of row (without one per step of columns the fp32
  /// forward ran 0-4% faster; NOTES.md, issue 12, seventh round); its row (null) is only ever offset by 0.
  KOKKOS_FORCEINLINE_FUNCTION void at(std::int64_t j, std::int64_t cols) const {
    const char* p = row + j * elem;
    const std::int64_t bytes = cols * elem;
    if constexpr (H == Hint::l1) {
      for (std::int64_t b = prefetch_distance; b < prefetch_distance + bytes; b += 64) prefetch<3>(p + b);
    } else {
      for (std::int64_t b = prefetch_distance; b < prefetch_distance + bytes; b += 64) {
        prefetch<2>(p + b);
        if constexpr (H == Hint::l2_near_l1) kick_next_page(p + b);  // a page further ahead
      }
      if constexpr (H == Hint::l2_near_l1) {
        for (std::int64_t b = near_distance; b < near_distance + bytes; b += 64) prefetch<3>(p + b);
      }
    }
  }
};

}  // namespace vpce::impl
