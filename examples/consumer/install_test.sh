#!/usr/bin/env bash
# Installs vpce from a build folder into a fresh prefix, builds examples/consumer against it with
# find_package(vpce), and runs it. Usage: install_test.sh BUILD_DIR SOURCE_DIR KOKKOS_ROOT MPIEXEC [KOKKOSKERNELS_DIR]
# (the last where vpce was built with Kokkos Kernels: its installed config looks for them too)
set -euo pipefail
build=$1 src=$2 kokkos=$3 mpiexec=$4 kk=${5:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/vpce-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
mpi_cxx=$(grep -m1 '^MPI_CXX_COMPILER:' "$build/CMakeCache.txt" | cut -d= -f2 || true)  # the build's MPI, e.g. MPICH
cmake -S "$src/examples/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DKokkos_ROOT="$kokkos" \
  ${kk:+-DKokkosKernels_DIR="$kk"} ${mpi_cxx:+-DMPI_CXX_COMPILER="$mpi_cxx"} \
  -DCMAKE_CXX_COMPILER="${CXX_FOR_CONSUMER:-$(grep -m1 '^CMAKE_CXX_COMPILER:' "$build/CMakeCache.txt" | cut -d= -f2)}" >/dev/null
cmake --build "$work/build" -j 2 >/dev/null
over=()  # OpenMPI's flag; MPICH's mpiexec refuses it
case "$("$mpiexec" --version 2>&1)" in *"Open MPI"* | *OpenRTE*) over=(--oversubscribe) ;; esac
"$mpiexec" -n 2 "${over[@]}" "$work/build/vpce_consumer"
"$mpiexec" -n 2 "${over[@]}" "$work/build/vpce_consumer_definitions"
