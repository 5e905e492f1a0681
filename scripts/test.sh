#!/usr/bin/env bash
# Installs what is missing, builds Kokkos (cached) and vpce, then runs the whole test suite through CTest
# (the MPI tests at 1, 2, 3 and 4 ranks). Usage: scripts/test.sh [extra ctest arguments]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$VPCE_BUILD"
ctest --output-on-failure "$@"
