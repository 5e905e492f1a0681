#!/usr/bin/env bash
# Runs the benchmark over problem sizes, thread counts and rank counts and leaves one JSON file per run in
# OUT (default perf_tests/results/<date>): the input of perf_tests/plot.py. Usage:
#   perf_tests/sweep.sh [BUILD_DIR] [OUT]      (BUILD_DIR default: build)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-$here/../build}
out=${2:-$here/results/$(date +%Y-%m-%d)}
perf=$build/perf_tests/vpce_perf
reps=${REPS:-7}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_PROC_BIND=${OMP_PROC_BIND:-false}
run() {  # ranks threads tokens vocab name
  echo "sweep: $5 ($1 rank(s) x $2 thread(s), N=$3, V=$4)"
  # --bind-to none: OpenMPI binds each of up to 2 ranks to a core of its own, so 2 threads would share it
  OMP_NUM_THREADS=$2 mpirun -np "$1" --oversubscribe --bind-to none "$perf" "$3" "$4" float32 "$reps" \
    "$out/$5.json" >/dev/null 2>&1
}
# GB/s against problem size (1 rank x 2 threads, V_local = 32768)
for n in 256 1024 4096 8192; do run 1 2 $n 32768 size_1x2_n$n; done
# the same at 2 ranks x 1 thread
for n in 256 1024 4096 8192; do run 2 1 $n 65536 size_2x1_n$n; done
# threads (1 rank)
for t in 1 2; do run 1 $t 4096 32768 threads_$t; done
# strong scaling: fixed N = 4096, V = 65536 over 1, 2, 4 ranks (4 ranks oversubscribe 2 cores)
for r in 1 2 4; do run $r 1 4096 65536 strong_$r; done
# weak scaling: V_local = 32768 per rank
for r in 1 2 4; do run $r 1 4096 $((32768 * r)) weak_$r; done
echo "sweep: results in $out"
