// Part of the vpce_math_<level> executables (unit_tests/CMakeLists.txt): test_math.cpp compiled for one x86-64
// level (VPCE_TEST_ISA, e.g. "x86-64-v4"), this file without any -march. Where the CPU lacks that level the
// executable exits with 77 (CTest: skipped) from a constructor that runs before the static initialisers of
// the tests, which might already use the level's instructions.

#include <cstdio>
#include <cstdlib>

namespace {

__attribute__((constructor(101))) void require_isa() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports(VPCE_TEST_ISA)) {
    std::printf("this CPU is not %s: skipped\n", VPCE_TEST_ISA);
    std::fflush(stdout);
    std::_Exit(77);
  }
}

}  // namespace
