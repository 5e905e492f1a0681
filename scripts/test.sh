#!/usr/bin/env bash
# Installs what is missing, builds Kokkos (cached) and vpce, then runs the test suite through CTest in
# four configurations and compiles a fifth, each in its own build folder (by default all five, in this
# order):
#
#   default  OpenMPI, Release, -march=native: every test.                                          build/
#   asan     OpenMPI, AddressSanitizer + LeakSanitizer + UndefinedBehaviorSanitizer (setup.sh's      build-asan/
#            VPCE_SANITIZE=1: GCC, -O0 -g; any report fails its test; scripts/lsan.supp): unit tests
#            at 2, 3 ranks and Serial at 3 (their Math suite once, at 1 rank); the tool's
#            loss/options/errors/linear suites at 1 rank, loss at 3, commands and faults at 2; examples
#            (train_lm at 1 and 2); install test; GPU-aware path. Not: unit at 4 ranks, determinism, the
#            tool's other rank counts.
#   mpich    MPICH (setup.sh's VPCE_MPI=mpich; Debian's mpich, libmpich-dev, libhdf5-mpich-dev are     build-mpich/
#            installed when missing), Debug, for no CPU in particular (no -march: the row loops' copy
#            for the CPU's level picked at run time runs here): unit tests at 1 and 2 ranks (their Math
#            suite once), and at 1 rank at each lower level (vpce_unit_copy_*); the tool's suites at 1
#            and 2 ranks and loss at 3 (not faults, nor linear at 2:
#            they kill a rank, see below); examples (C at 3 ranks); install test; GPU-aware path;
#            determinism at 2 ranks.
#   clang    Debian's clang++ (setup.sh's VPCE_COMPILER=clang), OpenMPI, Release, -march=native: the      build-clang/
#            library and the unit tests only, run at 1 and 2 ranks (their Math suite once). The kernels'
#            loops as Clang compiles them: its `omp simd reduction(max)` started at -FLT_MAX, so a row of
#            -inf logits passed unreported in Clang builds until this configuration ran them.
#   cuda     setup.sh's VPCE_CUDA=1: the whole tree (library, LinearCrossEntropy, tests, tool,          build-cuda/
#            examples, benchmark) compiled for CUDA by NVIDIA's nvcc 13 from PyPI against Kokkos 3.4.01
#            built for CUDA (sm_80), Debug; any compiler warning fails it. Nothing runs: no GPU here.
#   Neither asan nor mpich builds the Python package (setup.sh), the benchmark (vpce_perf) or the math at
#   named x86-64 levels (vpce_math_x86-64-v3/v4/v4_256), nor runs clang-tidy, the vectorisation check
#   (vpce_vectorized), the fuzzer or the >2^31-logit test; asan builds no determinism test; cuda compiles all
#   but the Python package. VPCE_TEST_FULL=1 builds and runs every test in every configuration.
#
# Usage: scripts/test.sh [--config NAME]... [extra ctest arguments, passed to every configuration]
#   --config NAME   run only these configurations (repeatable; NAME: default, asan, mpich, clang, cuda, all).
#                   The environment variable VPCE_TEST_CONFIGS="default asan mpich clang cuda" does the same.
#                   A developer's quick run: scripts/test.sh --config default
# VPCE_BUILD, when set, is the default configuration's folder; the others get -asan, -mpich, -clang, -cuda appended.
# Disk: a configuration other than default that passed has its build folder removed (VPCE_TEST_KEEP_BUILDS=1 keeps
# it; a failed one is always kept). The asan folder alone takes ~4.6 GB (-O0 instrumented code), and the five
# together took 11 GB, which filled the disk of a CI machine (an external CI run failed on it, in a link).
# mpich and cuda build without debug information (CMAKE_CXX_FLAGS_DEBUG empty, no -g: they are Debug for -O0 and
# the asserts; debug information made two thirds of the mpich folder's 3.7 GB).
# Every configuration runs even when one fails; the exit status is non-zero when any failed, and a summary
# with the time of each is printed at the end.
set -euo pipefail
VPCE_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

configs=()
ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config) configs+=("${2:?--config needs a name}"); shift 2 ;;
    --config=*) configs+=("${1#--config=}"); shift ;;
    *) ctest_args+=("$1"); shift ;;
  esac
done
if [ ${#configs[@]} -eq 0 ]; then
  # shellcheck disable=SC2206
  configs=(${VPCE_TEST_CONFIGS:-all})
fi
[[ " ${configs[*]} " == *" all "* ]] && configs=(default asan mpich clang cuda)

base_build=${VPCE_BUILD:-$VPCE_SRC/build}
extra_cmake_args="${VPCE_CMAKE_ARGS:--DVPCE_ENABLE_NATIVE=ON} -DVPCE_ENABLE_BENCHMARKS=OFF"
# Not in either extra configuration: clang-tidy, the vectorisation check and the fuzzer (none depends on the build's MPI or
# flags; the fuzz harness is built with clang's own ASan), the >2^31-logit test (minutes at -O0).
not_extra='^vpce_(clang_tidy|vectorized|tool_fuzz|large_np1)$'
# Under the sanitizers the unit tests run at 2 and 3 ranks (and Serial at 3), the tool's loss tests at 1 rank:
# the other rank counts mostly repeat those code paths (left out to hold CI near 25 minutes on 2 cores). Nor
# the install test (CMake packaging): nothing the sanitizers would find. (The determinism tests and the math
# at named x86-64 levels are not built there: asan_cmake_args below.)
asan_skip="$not_extra|^vpce_unit_np[14]\$|^vpce_example_train_lm_np4\$|^vpce_install_test\$"
asan_skip+='|^vpce_tool_(loss_np[23]|options_np[23]|errors_np[23]|commands_np3|linear_np[23]|faults_np3)$'
# MPICH: no runs of 3-4 ranks on the CI's 2 cores where they take minutes (MPICH busy-polls), no
# single-rank determinism (nothing MPI in it), and no killed-rank tests: MPICH's mpiexec SIGKILLs the
# other ranks at once, so the tool cannot remove its temporary output file (vpce_tool_faults_*, and the
# kill case inside vpce_tool_linear_np2): that guarantee holds under OpenMPI's mpiexec only.
mpich_skip="$not_extra|^vpce_unit_(np[34]|serial_np3)\$|^vpce_tool_(options|errors|commands|linear)_np3\$"
mpich_skip+='|^vpce_tool_faults_|^vpce_tool_linear_np2$|^vpce_determinism_(np1|np3|rank_counts_np4)|^vpce_example_train_lm_np4$'
# Nor are the tests that neither runs built there: determinism under the sanitizers (test_determinism.cpp
# compiles in 53 s there), the math at named x86-64 levels in either (at -O0 they ran 51 s in MPICH's, and the
# MPI cannot change them).
asan_cmake_args="$extra_cmake_args -DVPCE_ENABLE_DETERMINISM_TESTS=OFF -DVPCE_ENABLE_ISA_TESTS=OFF"
# MPICH's build is the one for no CPU in particular, so that the copies of the row loops picked at run time
# (impl/isa.hpp, VPCE_HOST_CLONES) run their tests in CI: the CPU's own, and the unit tests again at each lower
# level (vpce_unit_copy_*; the vectorisation check reads their object code).
no_debug_info="-DCMAKE_CXX_FLAGS_DEBUG="  # mpich and cuda: Debug without -g (see "Disk" above)
mpich_cmake_args="${VPCE_CMAKE_ARGS:--DVPCE_ENABLE_NATIVE=OFF} -DVPCE_ENABLE_BENCHMARKS=OFF -DVPCE_ENABLE_ISA_TESTS=OFF"
mpich_cmake_args+=" $no_debug_info"
cuda_cmake_args="${VPCE_CMAKE_ARGS:--DVPCE_ENABLE_NATIVE=ON} $no_debug_info"
# Clang's: the library and the unit tests (what differs between compilers is the kernels' code), no more.
clang_cmake_args="${VPCE_CMAKE_ARGS:--DVPCE_ENABLE_NATIVE=ON} -DVPCE_ENABLE_BENCHMARKS=OFF -DVPCE_ENABLE_TOOL=OFF"
clang_cmake_args+=" -DVPCE_ENABLE_EXAMPLES=OFF -DVPCE_ENABLE_DETERMINISM_TESTS=OFF -DVPCE_ENABLE_ISA_TESTS=OFF"
clang_only='^vpce_unit_(np1|np2|math_np1)$'
if [ "${VPCE_TEST_FULL:-0}" = 1 ]; then
  asan_cmake_args=$extra_cmake_args mpich_cmake_args=${mpich_cmake_args/ -DVPCE_ENABLE_ISA_TESTS=OFF/}
fi

run_config() {  # name
  local name=$1
  # A subshell: each configuration gets setup.sh's environment of its own (and errexit of its own: the
  # caller runs it with set +e to go on to the next configuration).
  (
    set -euo pipefail
    skip=()
    case "$name" in
      default) export VPCE_MPI=openmpi VPCE_SANITIZE=0 VPCE_CUDA=0 VPCE_COMPILER=gcc VPCE_BUILD=$base_build ;;
      asan)
        export VPCE_MPI=openmpi VPCE_SANITIZE=1 VPCE_CUDA=0 VPCE_COMPILER=gcc VPCE_BUILD=$base_build-asan
        export VPCE_CMAKE_ARGS=$asan_cmake_args
        skip=(-E "$asan_skip") ;;
      mpich)
        export VPCE_MPI=mpich VPCE_SANITIZE=0 VPCE_CUDA=0 VPCE_COMPILER=gcc VPCE_BUILD=$base_build-mpich
        export VPCE_CMAKE_ARGS=$mpich_cmake_args
        export VPCE_BUILD_TYPE=${VPCE_BUILD_TYPE:-Debug}
        skip=(-E "$mpich_skip") ;;
      cuda)
        # Debug: the host side at -O0 (the device code is optimised either way), a quarter less compile time.
        export VPCE_MPI=openmpi VPCE_SANITIZE=0 VPCE_CUDA=1 VPCE_COMPILER=gcc VPCE_BUILD=$base_build-cuda
        export VPCE_CMAKE_ARGS=$cuda_cmake_args
        export VPCE_BUILD_TYPE=${VPCE_BUILD_TYPE:-Debug} ;;
      clang)
        export VPCE_MPI=openmpi VPCE_SANITIZE=0 VPCE_CUDA=0 VPCE_COMPILER=clang VPCE_BUILD=$base_build-clang
        export VPCE_CMAKE_ARGS=$clang_cmake_args
        skip=(-R "$clang_only") ;;
      *) echo "[vpce test] unknown configuration '$name' (default, asan, mpich, clang, cuda, all)" >&2; exit 2 ;;
    esac
    [ "${VPCE_TEST_FULL:-0}" = 1 ] && skip=()
    mkdir -p "$(dirname "$VPCE_BUILD")"
    echo "[vpce test] $name: $(df -h --output=avail "$(dirname "$VPCE_BUILD")" | tail -n 1 | tr -d ' ') free on the build folder's disk"
    # shellcheck source=scripts/setup.sh
    source "$VPCE_SRC/scripts/setup.sh"
    cd "$VPCE_BUILD"
    if [ "$VPCE_CUDA" = 1 ]; then  # setup.sh built it, without warnings; CUDA needs a GPU to run anything
      echo "[vpce test] $name: compiled ($(ctest -N | tail -n 1 | tr -d '\n'), not run: no GPU)"
      exit 0
    fi
    echo "[vpce test] $name: ctest in $VPCE_BUILD ${skip[*]}"
    # Twice as many test slots as cores (setup.sh's JOBS) under OpenMPI: CTest schedules by each test's
    # PROCESSORS (its rank count), and the MPI tests mostly wait (mpiexec's start, idle ranks yield their core):
    # on 2 cores -j 4 took the default configuration's tests 298 -> 263 s, asan's 219 -> 192 s. Not under
    # MPICH, whose waiting ranks poll: its tests took 93 -> 104 s.
    slots=$((2 * JOBS))
    [ "$VPCE_MPI" = mpich ] && slots=$JOBS
    ctest --output-on-failure -j "$slots" ${skip[@]+"${skip[@]}"} ${ctest_args[@]+"${ctest_args[@]}"}
    if [ "$VPCE_SANITIZE" = 1 ]; then
      # Belt and braces: a report that did not change a test's outcome still fails the configuration.
      log=Testing/Temporary/LastTest.log
      if grep -E -n "ERROR: (Address|Leak)Sanitizer|runtime error:|SUMMARY: (Address|Leak|UndefinedBehavior)Sanitizer" "$log"; then
        echo "[vpce test] $name: sanitizer reports in $VPCE_BUILD/$log" >&2
        exit 1
      fi
    fi
  )
}

failed=()
summary=()
for c in "${configs[@]}"; do
  start=$SECONDS
  set +e
  run_config "$c"
  rc=$?
  set -e
  if [ $rc = 0 ]; then status=passed; else status="FAILED (status $rc)"; failed+=("$c"); fi
  if [ $rc = 0 ] && [ "$c" != default ] && [ "${VPCE_TEST_KEEP_BUILDS:-0}" != 1 ]; then
    rm -rf "$base_build-$c"
    status+=" (build folder removed)"
  fi
  summary+=("$c: $status in $((SECONDS - start)) s")
done
echo "[vpce test] summary:"
printf '[vpce test]   %s\n' "${summary[@]}"
[ ${#failed[@]} -eq 0 ]
