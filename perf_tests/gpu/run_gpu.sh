#!/usr/bin/env bash
# GPU run: builds vpce against an installed CUDA Kokkos, runs the unit tests, and runs the benchmark (fp32
# and bf16, N = 16384, V_local = 32768, with the device's own copy ceiling) plus, where PyTorch with CUDA is
# installed, eager F.cross_entropy, torch.compile of it, and the seed's algorithm on the same GPU and sizes.
# Writes JSON files and table.md into OUT.
#
#   Kokkos_ROOT=/path/to/cuda-kokkos perf_tests/gpu/run_gpu.sh [OUT]
#
# Kokkos_ROOT: a Kokkos (>= 3.4) installed with -DKokkos_ENABLE_CUDA=ON and the GPU's Kokkos_ARCH_*; its
# bin/nvcc_wrapper is the compiler. How to build one, CUDA 13 included: docs/gpu.md.
# Environment: WORK (scratch, default /tmp/vpce-gpu), JOBS, TOKENS, VOCAB_LOCAL, REPS. Needs nvcc, CMake, an
# MPI and GoogleTest.
set -euo pipefail
: "${Kokkos_ROOT:?set Kokkos_ROOT to an installed CUDA Kokkos (see docs/gpu.md)}"
[ -x "$Kokkos_ROOT/bin/nvcc_wrapper" ] || { echo "[vpce gpu] no $Kokkos_ROOT/bin/nvcc_wrapper: not a CUDA Kokkos" >&2; exit 2; }
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=$(realpath -m "${1:-$src/perf_tests/gpu/results}")
work=${WORK:-/tmp/vpce-gpu}
jobs=${JOBS:-$(nproc)}
tokens=${TOKENS:-16384}
vlocal=${VOCAB_LOCAL:-32768}
reps=${REPS:-20}
mkdir -p "$work" "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
log() { echo "[vpce gpu] $*"; }

# 1. vpce.
log "building vpce against $Kokkos_ROOT"
cmake -S "$src" -B "$work/vpce-build" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$Kokkos_ROOT" \
  -DCMAKE_CXX_COMPILER="$Kokkos_ROOT/bin/nvcc_wrapper" -DVPCE_ENABLE_TOOL=OFF -DVPCE_ENABLE_TESTS=ON \
  -DVPCE_ENABLE_EXAMPLES=ON -DVPCE_ENABLE_BENCHMARKS=ON -DVPCE_ENABLE_PYTHON=OFF >"$out/vpce-configure.log"
cmake --build "$work/vpce-build" -j "$jobs" >"$out/vpce-build.log" 2>&1

# 2. Unit tests (the MPI tests at 1-4 ranks share the one GPU).
log "unit tests"
(cd "$work/vpce-build" && ctest --output-on-failure --timeout 300 >"$out/ctest.log" 2>&1) && log "tests passed" ||
  log "TESTS FAILED: see $out/ctest.log"

# 3. Benchmark: one rank, the whole slice on the GPU.
for dtype in float32 bfloat16; do
  log "benchmark $dtype"
  "$work/vpce-build/perf_tests/vpce_perf" "$tokens" "$vlocal" "$dtype" "$reps" "$out/vpce_$dtype.json" \
    >"$out/vpce_$dtype.txt" 2>&1
done

# 4. PyTorch on the same GPU and sizes, where it is installed.
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  log "PyTorch"
  python3 "$src/perf_tests/gpu/compare_torch_gpu.py" --tokens "$tokens" --vocab "$vlocal" --reps "$reps" \
    --json "$out/torch.json" >"$out/torch.txt" 2>&1 || log "PyTorch comparison failed: see $out/torch.txt"
fi

# 5. Table.
python3 - "$out" <<'PY' >"$out/table.md"
import json, os, sys
out = sys.argv[1]
print("| dtype | record | ms | GB/s | x copy | x read |")
print("|---|---|---|---|---|---|")
for dtype in ("float32", "bfloat16"):
    path = os.path.join(out, f"vpce_{dtype}.json")
    if not os.path.exists(path):
        continue
    for r in json.load(open(path)):
        print(f"| {dtype} | {r['name']} | {r['ms_median']:.3f} | {r['gbps']:.0f} | {r['ratio_to_copy']:.2f} | "
              f"{r.get('ratio_to_read', 0):.2f} |")
path = os.path.join(out, "torch.json")
if os.path.exists(path):
    for name, ms in json.load(open(path))["ms"].items():
        print(f"| | {name} | {ms:.3f} | | | |")
PY
log "results in $out (table.md)"
