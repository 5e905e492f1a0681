// Part of the vpce_math_<level> executables (unit_tests/CMakeLists.txt): test_math.cpp compiled for one x86-64
// level (VPCE_TEST_ISA, e.g. "x86-64-v4"), this file without any -march. Where the CPU lacks that level the
// executable exits with 77 (CTest: skipped) from a constructor that runs before the static initialisers of
// the tests, which might already use the level's instructions.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vpce/impl/isa.hpp>

namespace {

__attribute__((constructor(101))) void require_isa() {
  using vpce::impl::Isa;
  const Isa level = std::strcmp(VPCE_TEST_ISA, "x86-64-v4") == 0 ? Isa::v4 : Isa::v3;
  if (vpce::impl::cpu_level() < level) {
    std::printf("this CPU is not %s: skipped\n", VPCE_TEST_ISA);
    std::fflush(stdout);
    std::_Exit(77);
  }
}

}  // namespace
