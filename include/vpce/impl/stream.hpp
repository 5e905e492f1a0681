#pragma once
/// \file stream.hpp
/// \brief Copies with streaming (non-temporal) stores on the host.
///
/// A plain store to a line that is not in cache first reads the line (read-for-ownership): a copy of B bytes
/// moves 3B through memory. Streaming stores write whole lines without reading them (2B), the STREAM
/// convention. x86-64 has them from SSE2 on (every x86-64 CPU), wider with AVX and AVX-512: the widest the
/// compiler targets is used. Elsewhere a plain copy.

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if (defined(__x86_64__) || defined(_M_X64)) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && \
    !defined(__SYCL_DEVICE_ONLY__)
#include <immintrin.h>
#define VPCE_HAVE_STREAMING_STORES 1
#else
#define VPCE_HAVE_STREAMING_STORES 0
#endif

namespace vpce::impl {

/// Whether stream_copy writes with streaming stores on this build.
inline constexpr bool have_streaming_stores = VPCE_HAVE_STREAMING_STORES != 0;

/// memcpy(dst, src, bytes), the destination written with streaming stores where the CPU has them. Ends with
/// a store fence, so the data is visible to other threads once the caller synchronises with them.
KOKKOS_INLINE_FUNCTION void stream_copy(void* dst, const void* src, std::size_t bytes) {
#if VPCE_HAVE_STREAMING_STORES
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Plain stores up to the destination's first cache line, then whole aligned vectors.
  const std::size_t head = std::min<std::size_t>(bytes, (64 - reinterpret_cast<std::uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  std::size_t k = 0;
#if defined(__AVX512F__)
  for (; k + 64 <= bytes; k += 64) _mm512_stream_si512(reinterpret_cast<__m512i*>(d + k), _mm512_loadu_si512(s + k));
#elif defined(__AVX__)
  for (; k + 32 <= bytes; k += 32)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + k), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + k)));
#endif
  for (; k + 16 <= bytes; k += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + k), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k)));
  std::memcpy(d + k, s + k, bytes - k);
  _mm_sfence();
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace vpce::impl
