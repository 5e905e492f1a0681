#!/usr/bin/env bash
# vpce set-up from nothing on Debian 12: Debian packages, Kokkos 3.4.01 + Kokkos Kernels (OpenMP+Serial,
# BLAS TPL on OpenBLAS) from Debian's trilinos source package into a cache outside the clone, then vpce.
#
# Environment:
#   VPCE_CACHE      cache folder for Kokkos (default: ~/.cache/vpce); rebuilt when missing
#   Kokkos_ROOT     an existing Kokkos install (any version >= 3.4): nothing is built for Kokkos then
#   KokkosKernels_ROOT  likewise for Kokkos Kernels (optional; without it the fused LM-head path is off)
#   VPCE_BUILD      build folder (default: <clone>/build)
#   VPCE_BUILD_TYPE CMake build type (default: Release)
#   VPCE_CMAKE_ARGS extra arguments for vpce's CMake configure (default: -DVPCE_ENABLE_NATIVE=ON, the
#                   kernels compiled for this machine's CPU; the build folder is never shared between machines)
# Source it (scripts/demo.sh and scripts/test.sh do) or run it.
set -euo pipefail

VPCE_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VPCE_CACHE=${VPCE_CACHE:-${HOME:-/root}/.cache/vpce}
VPCE_BUILD=${VPCE_BUILD:-$VPCE_SRC/build}
VPCE_BUILD_TYPE=${VPCE_BUILD_TYPE:-Release}
JOBS=${JOBS:-$(nproc)}
KOKKOS_VERSION_TAG=kokkos-3.4.01-trilinos-13.2.0-omp-serial-v1
KOKKOS_PREFIX=$VPCE_CACHE/$KOKKOS_VERSION_TAG

log() { echo "[vpce setup] $*"; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

install_packages() {
  local pkgs=(build-essential cmake dpkg-dev ca-certificates libopenmpi-dev openmpi-bin libgtest-dev libgmock-dev
              libbenchmark-dev libhdf5-openmpi-dev hdf5-tools libopenblas-dev python3 python3-numpy python3-h5py gfortran
              clang libclang-rt-14-dev clang-tidy)  # clang + libFuzzer: vpce_tool_fuzz; clang-tidy: vpce_clang_tidy
  local missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

# Debian's trilinos source package holds Kokkos 3.4.01 and Kokkos Kernels 3.4.01 (packages/kokkos*).
fetch_trilinos_source() {
  local dir=$1
  mkdir -p "$dir/lists/partial"
  echo "deb-src http://deb.debian.org/debian bookworm main" >"$dir/sources.list"
  local apt_opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
                  -o "Dir::State::Lists=$dir/lists" -o Debug::NoLocking=1)
  (cd "$dir" && apt-get "${apt_opts[@]}" update -q >/dev/null &&
     apt-get "${apt_opts[@]}" source --download-only trilinos >/dev/null 2>&1)
  local tarball
  tarball=$(ls "$dir"/trilinos_*.orig.tar.* | head -n 1)
  log "extracting Kokkos from $(basename "$tarball")"
  tar -C "$dir" -xf "$tarball" --wildcards '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
}

build_kokkos() {
  if [ -f "$KOKKOS_PREFIX/.complete" ]; then
    log "Kokkos + Kokkos Kernels cached in $KOKKOS_PREFIX"
    return
  fi
  log "building Kokkos 3.4.01 + Kokkos Kernels into $KOKKOS_PREFIX"
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/vpce-kokkos.XXXXXX")
  fetch_trilinos_source "$work"
  local tri
  tri=$(ls -d "$work"/Trilinos-*/packages | head -n 1)
  rm -rf "$KOKKOS_PREFIX"
  cmake -S "$tri/kokkos" -B "$work/build-kokkos" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 \
    -DCMAKE_INSTALL_PREFIX="$KOKKOS_PREFIX" -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON \
    -DBUILD_SHARED_LIBS=ON >"$work/kokkos-configure.log"
  cmake --build "$work/build-kokkos" -j "$JOBS" >"$work/kokkos-build.log"
  cmake --install "$work/build-kokkos" >/dev/null
  # Without ETI Kokkos Kernels is header-only for what vpce uses (gemm); the BLAS TPL sends host gemm to OpenBLAS.
  cmake -S "$tri/kokkos-kernels" -B "$work/build-kk" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 \
    -DCMAKE_INSTALL_PREFIX="$KOKKOS_PREFIX" -DKokkos_ROOT="$KOKKOS_PREFIX" -DBUILD_SHARED_LIBS=ON \
    -DKokkosKernels_ENABLE_TPL_BLAS=ON -DKokkosKernels_INST_DOUBLE=OFF -DKokkosKernels_INST_FLOAT=OFF \
    -DKokkosKernels_INST_LAYOUTLEFT=OFF -DKokkosKernels_INST_OFFSET_INT=OFF -DKokkosKernels_INST_OFFSET_SIZE_T=OFF \
    -DKokkosKernels_INST_ORDINAL_INT=OFF -DKokkosKernels_ENABLE_TESTS=OFF >"$work/kk-configure.log"
  cmake --build "$work/build-kk" -j "$JOBS" >"$work/kk-build.log"
  cmake --install "$work/build-kk" >/dev/null
  touch "$KOKKOS_PREFIX/.complete"
  rm -rf "$work"
}

configure_vpce() {
  local args=(-DCMAKE_BUILD_TYPE="$VPCE_BUILD_TYPE")
  if [ -n "${Kokkos_ROOT:-}" ]; then
    args+=(-DKokkos_ROOT="$Kokkos_ROOT")
    [ -n "${KokkosKernels_ROOT:-}" ] && args+=(-DKokkosKernels_ROOT="$KokkosKernels_ROOT")
  else
    args+=(-DKokkos_ROOT="$KOKKOS_PREFIX" -DKokkosKernels_ROOT="$KOKKOS_PREFIX")
  fi
  # shellcheck disable=SC2206
  args+=(${VPCE_CMAKE_ARGS:--DVPCE_ENABLE_NATIVE=ON})
  log "configuring vpce in $VPCE_BUILD"
  cmake -S "$VPCE_SRC" -B "$VPCE_BUILD" "${args[@]}" >/dev/null
  log "building vpce"
  cmake --build "$VPCE_BUILD" -j "$JOBS"
}

# Running MPI programs from the scripts: root is allowed, more ranks than cores too. Kokkos' OpenMP
# backend warns without OMP_PROC_BIND; ranks share the cores, so threads are not bound by default.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_PROC_BIND=${OMP_PROC_BIND:-false}

install_packages
[ -n "${Kokkos_ROOT:-}" ] || build_kokkos
configure_vpce
