#!/usr/bin/env bash
# Installs what is missing, builds Kokkos (cached) and vpce, then runs the main job: `vpce demo` on 2 MPI
# ranks (a realistic LM-head batch, fused vs seed strategies, checked against a single-rank computation,
# timed against the same run's copy ceiling). Usage: scripts/demo.sh [extra `vpce demo` arguments]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} mpirun -np 2 "$VPCE_BUILD/tools/vpce" demo "$@"
