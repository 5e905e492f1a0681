#!/usr/bin/env bash
# Builds the vpce tool's libFuzzer harness with clang in BUILD_DIR, replays every file of regressions/ (each a
# crash the fuzzer once found: must pass now), then fuzzes for SECONDS from the seed corpus in corpus/.
# Fails (never skips) when clang++ or libFuzzer is missing: scripts/setup.sh installs them (Debian packages
# clang and libclang-rt-14-dev).
#
#   run_fuzz.sh --build-dir DIR [--seconds 60] [--clang clang++] [--jobs 2] [--new-corpus DIR] [-- libFuzzer args]
#
# Crashes found are written to BUILD_DIR/artifacts/ (crash-*, leak-*, timeout-*): copy one into regressions/
# under a name that says what it was, fix the bug, and it is replayed by every run from then on.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=""
seconds=60
clangxx=""
jobs=2
new_corpus=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --clang) clangxx=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --new-corpus) new_corpus=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "run_fuzz.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$build" ] || { echo "run_fuzz.sh: --build-dir is required" >&2; exit 2; }

fail() {
  echo "run_fuzz.sh: FAILED: $*" >&2
  exit 1
}

# clang++ and libFuzzer: required.
[ -n "$clangxx" ] || clangxx=$(command -v clang++ || true)
[ -n "$clangxx" ] && [ -x "$(command -v "$clangxx" || true)" ] ||
  fail "no clang++ found (install the Debian packages clang and libclang-rt-14-dev; scripts/setup.sh does)"
clangc=${clangxx%++}
[ -x "$(command -v "$clangc" || true)" ] || clangc=$clangxx
mkdir -p "$build"
probe="$build/probe"
mkdir -p "$probe"
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$probe/p.cpp"
"$clangxx" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" >"$probe/log" 2>&1 ||
  fail "$clangxx cannot link -fsanitize=fuzzer (libFuzzer missing? Debian: libclang-rt-14-dev):
$(cat "$probe/log")"

# Configure and build (incremental when BUILD_DIR is kept).
echo "run_fuzz.sh: building the harness with $clangxx in $build/build"
cmake -S "$here" -B "$build/build" -DCMAKE_CXX_COMPILER="$clangxx" -DCMAKE_C_COMPILER="$clangc" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; fail "configuring the harness"; }
cmake --build "$build/build" -j "$jobs" >"$build/build.log" 2>&1 ||
  { cat "$build/build.log"; fail "building the harness"; }
fuzzer="$build/build/fuzz_tool_input"

# The harness' files go to a folder of its own; sanitizers stop at the first report. No leak detection: Open MPI
# and HDF5 keep growing caches, so LeakSanitizer would scan after nearly every input (3x slower) to find nothing
# of the tool's (its HDF5 handles are checked by the harness itself: none may be left open).
work="$build/work"
rm -rf "$work"
mkdir -p "$work" "$build/artifacts"
export VPCE_FUZZ_WORKDIR="$work"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}

# 1. Regressions: every file must run without a crash.
shopt -s nullglob
regressions=("$here"/regressions/*)
if [ ${#regressions[@]} -gt 0 ]; then
  echo "run_fuzz.sh: replaying ${#regressions[@]} regression input(s)"
  "$fuzzer" -runs=1 "${regressions[@]}" >"$build/regressions.log" 2>&1 ||
    { tail -n 60 "$build/regressions.log"; fail "a regression input crashes the harness again"; }
fi

# 2. Fuzz from the seed corpus (new inputs go to a corpus folder in the build tree, not the sources).
corpus="$build/corpus"
mkdir -p "$corpus"
[ -z "$new_corpus" ] || mkdir -p "$new_corpus"
echo "run_fuzz.sh: fuzzing for $seconds s (seeds: $here/corpus)"
status=0
"$fuzzer" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=3072 -max_len=512 -print_final_stats=1 \
  -artifact_prefix="$build/artifacts/" ${new_corpus:+"$new_corpus"} "$corpus" "$here/corpus" "${extra[@]}" \
  >"$build/fuzz.log" 2>&1 || status=$?
grep -E "^(#[0-9]+ +DONE|stat::|Done )" "$build/fuzz.log" || true
if [ $status -ne 0 ]; then
  tail -n 80 "$build/fuzz.log"
  fail "the fuzzer found a problem (exit $status); the input is in $build/artifacts/ (add it to $here/regressions/)"
fi
echo "run_fuzz.sh: passed"
