#!/usr/bin/env bash
# GPU run: builds Kokkos for CUDA from a Kokkos source tarball you provide, builds vpce against it, runs the
# unit tests, and runs the benchmark (fp32 and bf16, N = 16384, V_local = 32768, with the device's own copy
# ceiling) plus, where PyTorch with CUDA is installed, eager F.cross_entropy, torch.compile of it, and the
# seed's algorithm on the same GPU and sizes. Writes JSON files and table.md into OUT.
#
#   perf_tests/gpu/run_gpu.sh KOKKOS_TARBALL [OUT]
#
# Environment: KOKKOS_ARCH (default HOPPER90), WORK (scratch, default /tmp/vpce-gpu), JOBS, TOKENS,
# VOCAB_LOCAL, REPS. Needs nvcc, CMake, an MPI and GoogleTest. Kokkos before 4.7 does not compile with
# CUDA 13 as released: two calls in core/src/Cuda/Kokkos_Cuda_Instance.hpp changed signature; this script
# adapts them when it finds the old ones and CUDA >= 13.
set -euo pipefail
tarball=$(realpath "$1")
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=$(realpath -m "${2:-$src/perf_tests/gpu/results}")
work=${WORK:-/tmp/vpce-gpu}
arch=${KOKKOS_ARCH:-HOPPER90}
jobs=${JOBS:-$(nproc)}
tokens=${TOKENS:-16384}
vlocal=${VOCAB_LOCAL:-32768}
reps=${REPS:-20}
mkdir -p "$work" "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
log() { echo "[vpce gpu] $*"; }

# 1. Kokkos for CUDA.
if [ ! -f "$work/kokkos/.complete" ]; then
  log "building Kokkos ($arch) from $(basename "$tarball")"
  rm -rf "$work/kokkos-src" && mkdir -p "$work/kokkos-src"
  tar -xf "$tarball" -C "$work/kokkos-src" --strip-components=1
  inst="$work/kokkos-src/core/src/Cuda/Kokkos_Cuda_Instance.hpp"
  cuda_major=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  if [ "${cuda_major:-0}" -ge 13 ] && grep -q "cudaGraphAddDependencies(graph, from, to, numDependencies)" "$inst"; then
    log "adapting Kokkos to CUDA 13's cudaGraphAddDependencies and cudaMemPrefetchAsync"
    sed -i 's/cudaGraphAddDependencies(graph, from, to, numDependencies)/cudaGraphAddDependencies(graph, from, to, nullptr, numDependencies)/' "$inst"
    sed -i 's/return cudaMemPrefetchAsync(devPtr, count, dstDevice, m_stream);/cudaMemLocation loc{}; loc.type = cudaMemLocationTypeDevice; loc.id = dstDevice; return cudaMemPrefetchAsync(devPtr, count, loc, 0, m_stream);/' "$inst"
  fi
  # nvcc_wrapper's default architecture (sm_70) is gone from CUDA 13; the real one comes from Kokkos_ARCH.
  sed -i 's/^default_arch="sm_70"/default_arch="sm_90"/' "$work/kokkos-src/bin/nvcc_wrapper"
  cmake -S "$work/kokkos-src" -B "$work/kokkos-build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 \
    -DCMAKE_CXX_COMPILER="$work/kokkos-src/bin/nvcc_wrapper" -DKokkos_ENABLE_CUDA=ON -DKokkos_ARCH_${arch}=ON \
    -DKokkos_ENABLE_SERIAL=ON -DCMAKE_INSTALL_PREFIX="$work/kokkos" >"$work/kokkos-configure.log"
  cmake --build "$work/kokkos-build" -j "$jobs" >"$work/kokkos-build.log"
  cmake --install "$work/kokkos-build" >/dev/null
  touch "$work/kokkos/.complete"
fi

# 2. vpce.
log "building vpce"
cmake -S "$src" -B "$work/vpce-build" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$work/kokkos" \
  -DCMAKE_CXX_COMPILER="$work/kokkos/bin/nvcc_wrapper" -DVPCE_ENABLE_TOOL=OFF -DVPCE_ENABLE_TESTS=ON \
  -DVPCE_ENABLE_EXAMPLES=ON -DVPCE_ENABLE_BENCHMARKS=ON >"$out/vpce-configure.log"
cmake --build "$work/vpce-build" -j "$jobs" >"$out/vpce-build.log" 2>&1

# 3. Unit tests (the MPI tests at 1-4 ranks share the one GPU).
log "unit tests"
(cd "$work/vpce-build" && ctest --output-on-failure --timeout 300 >"$out/ctest.log" 2>&1) && log "tests passed" ||
  log "TESTS FAILED: see $out/ctest.log"

# 4. Benchmark: one rank, the whole slice on the GPU.
for dtype in float32 bfloat16; do
  log "benchmark $dtype"
  "$work/vpce-build/perf_tests/vpce_perf" "$tokens" "$vlocal" "$dtype" "$reps" "$out/vpce_$dtype.json" \
    >"$out/vpce_$dtype.txt" 2>&1
done

# 5. PyTorch on the same GPU and sizes, where it is installed.
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  log "PyTorch"
  python3 "$src/perf_tests/gpu/compare_torch_gpu.py" --tokens "$tokens" --vocab "$vlocal" --reps "$reps" \
    --json "$out/torch.json" >"$out/torch.txt" 2>&1 || log "PyTorch comparison failed: see $out/torch.txt"
fi

# 6. Table.
python3 - "$out" <<'PY' >"$out/table.md"
import json, os, sys
out = sys.argv[1]
print("| dtype | record | ms | GB/s | x copy |")
print("|---|---|---|---|---|")
for dtype in ("float32", "bfloat16"):
    path = os.path.join(out, f"vpce_{dtype}.json")
    if not os.path.exists(path):
        continue
    for r in json.load(open(path)):
        print(f"| {dtype} | {r['name']} | {r['ms_median']:.3f} | {r['gbps']:.0f} | {r['ratio_to_copy']:.2f} |")
path = os.path.join(out, "torch.json")
if os.path.exists(path):
    for name, ms in json.load(open(path))["ms"].items():
        print(f"| | {name} | {ms:.3f} | | |")
PY
log "results in $out (table.md)"
