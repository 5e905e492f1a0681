#!/usr/bin/env bash
# vpce set-up from nothing on Debian 12: Debian packages, Kokkos 3.4.01 + Kokkos Kernels (OpenMP+Serial,
# BLAS TPL on OpenBLAS) from Debian's trilinos source package into a cache outside the clone, then vpce.
#
# Environment:
#   VPCE_CACHE      cache folder for Kokkos (default: ~/.cache/vpce); rebuilt when missing
#   Kokkos_ROOT     an existing Kokkos install (any version >= 3.4): nothing is built for Kokkos then
#   KokkosKernels_ROOT  likewise for Kokkos Kernels (optional; without it the fused LM-head path is off)
#   VPCE_MPI        openmpi (default: Debian's default MPI) or mpich: Debian's MPICH (libmpich-dev, mpich,
#                   libhdf5-mpich-dev, installed when missing; they co-exist with OpenMPI, which stays the
#                   default), with CMake's FindMPI and FindHDF5 pointed at it (mpicxx.mpich, mpiexec.mpich, h5pcc.mpich)
#   VPCE_SANITIZE   1: AddressSanitizer + LeakSanitizer + UndefinedBehaviorSanitizer build (GCC, -O0 -g, Debug;
#                   every UBSan error is fatal: -fno-sanitize-recover=all); sourcing this exports the
#                   ASAN/LSAN/UBSAN_OPTIONS the tests run with (a report exits with status 86; what the MPI
#                   runtime keeps until exit is suppressed by scripts/lsan.supp, never vpce's own leaks) and
#                   LD_PRELOAD (scripts/keep_modules.c: no shared object unloaded, for LeakSanitizer's speed)
#   VPCE_CUDA       1: a CUDA build, compiled and never run (this machine needs no GPU): NVIDIA's CUDA 13 compiler
#                   from PyPI's wheels (pinned, in a virtual environment in the cache), Kokkos 3.4.01 + Kokkos
#                   Kernels from the same Debian source built for CUDA (Kokkos_ARCH_AMPERE80, CUDA + Serial; four
#                   call sites edited for CUDA 13, cuda13_edits below), vpce compiled by its nvcc_wrapper. Any
#                   compiler warning fails it. Not with VPCE_MPI=mpich or VPCE_SANITIZE=1.
#   VPCE_COMPILER   gcc (default: the system's c++, GCC on Debian) or clang: Debian's clang++ (with libomp-dev for
#                   <omp.h>, installed when missing), against the same Kokkos built by GCC. Not with VPCE_MPI=mpich,
#                   VPCE_SANITIZE=1 or VPCE_CUDA=1.
#   VPCE_BUILD      build folder (default: <clone>/build, or build-asan, build-mpich, build-mpich-asan, build-cuda,
#                   build-clang)
#   VPCE_BUILD_TYPE CMake build type (default: Release; Debug with VPCE_SANITIZE=1)
#   VPCE_CMAKE_ARGS extra arguments for vpce's CMake configure (default: -DVPCE_ENABLE_NATIVE=ON, the
#                   kernels compiled for this machine's CPU; the build folder is never shared between machines)
# The Python package (python/) is built against a virtual environment in $VPCE_CACHE/python-env-*: Debian's
# python3 with its packages (numpy, mpi4py, pytest, torch) plus nanobind and scikit-build-core from PyPI. Not
# with VPCE_MPI=mpich (Debian's mpi4py is built on OpenMPI), VPCE_SANITIZE=1 (Python itself is not
# instrumented), VPCE_CUDA=1 nor VPCE_COMPILER=clang.
# Source it (scripts/demo.sh and scripts/test.sh do) or run it.
set -euo pipefail

VPCE_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VPCE_CACHE=${VPCE_CACHE:-${HOME:-/root}/.cache/vpce}
VPCE_MPI=${VPCE_MPI:-openmpi}
VPCE_SANITIZE=${VPCE_SANITIZE:-0}
VPCE_CUDA=${VPCE_CUDA:-0}
VPCE_COMPILER=${VPCE_COMPILER:-gcc}
case "$VPCE_MPI" in openmpi|mpich) ;; *) echo "[vpce setup] VPCE_MPI must be openmpi or mpich" >&2; exit 2 ;; esac
case "$VPCE_SANITIZE" in 0|1) ;; *) echo "[vpce setup] VPCE_SANITIZE must be 0 or 1" >&2; exit 2 ;; esac
case "$VPCE_CUDA" in 0|1) ;; *) echo "[vpce setup] VPCE_CUDA must be 0 or 1" >&2; exit 2 ;; esac
case "$VPCE_COMPILER" in gcc|clang) ;; *) echo "[vpce setup] VPCE_COMPILER must be gcc or clang" >&2; exit 2 ;; esac
if [ "$VPCE_COMPILER" = clang ] && { [ "$VPCE_MPI" != openmpi ] || [ "$VPCE_SANITIZE" = 1 ] || [ "$VPCE_CUDA" = 1 ]; }; then
  echo "[vpce setup] VPCE_COMPILER=clang goes with neither VPCE_MPI=mpich, VPCE_SANITIZE=1 nor VPCE_CUDA=1" >&2; exit 2
fi
if [ "$VPCE_CUDA" = 1 ] && { [ "$VPCE_MPI" != openmpi ] || [ "$VPCE_SANITIZE" = 1 ]; }; then
  echo "[vpce setup] VPCE_CUDA=1 goes with neither VPCE_MPI=mpich nor VPCE_SANITIZE=1" >&2; exit 2
fi
_vpce_suffix=
[ "$VPCE_MPI" = openmpi ] || _vpce_suffix+=-$VPCE_MPI
[ "$VPCE_SANITIZE" = 0 ] || _vpce_suffix+=-asan
[ "$VPCE_CUDA" = 0 ] || _vpce_suffix+=-cuda
[ "$VPCE_COMPILER" = gcc ] || _vpce_suffix+=-clang
VPCE_BUILD=${VPCE_BUILD:-$VPCE_SRC/build$_vpce_suffix}
VPCE_BUILD_TYPE=${VPCE_BUILD_TYPE:-$([ "$VPCE_SANITIZE" = 1 ] && echo Debug || echo Release)}
JOBS=${JOBS:-$(nproc)}
KOKKOS_VERSION_TAG=kokkos-3.4.01-trilinos-13.2.0-omp-serial-v1
CUDA_WHEELS=13.5.37  # NVIDIA's CUDA compiler wheels on PyPI (nvcc, cicc, headers, cudart): the same version each
CUDA_ENV=$VPCE_CACHE/cuda-$CUDA_WHEELS-wheels
[ "$VPCE_CUDA" = 0 ] || KOKKOS_VERSION_TAG=kokkos-3.4.01-trilinos-13.2.0-cuda-$CUDA_WHEELS-ampere80-serial-v1
KOKKOS_PREFIX=$VPCE_CACHE/$KOKKOS_VERSION_TAG

log() { echo "[vpce setup] $*"; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

install_packages() {
  local pkgs=(build-essential cmake dpkg-dev ca-certificates libopenmpi-dev openmpi-bin libgtest-dev libgmock-dev
              libbenchmark-dev libhdf5-openmpi-dev hdf5-tools libopenblas-dev python3 python3-numpy python3-h5py gfortran
              clang libclang-rt-14-dev clang-tidy  # clang + libFuzzer: vpce_tool_fuzz; clang-tidy: vpce_clang_tidy
              clang-format  # vpce_format (Debian 12's: version 14)
              g++-aarch64-linux-gnu  # vpce_vectorized's aarch64 (NEON) target
              ccache  # compiler cache in $VPCE_CACHE/ccache: repeated builds (CI on an unchanged tree) are fast
              python3-dev python3-venv python3-mpi4py python3-pytest python3-torch)  # the Python package, its tests
  [ "$VPCE_MPI" = mpich ] && pkgs+=(libmpich-dev mpich libhdf5-mpich-dev)
  [ "$VPCE_COMPILER" = clang ] && pkgs+=(libomp-dev)  # <omp.h> for Kokkos' OpenMP headers under clang++
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

# The archive this machine's apt uses for its release's main component (a mirror too), from apt's own view
# of its configured sources (sources.list or deb822 .sources alike): "URI SUITE", or nothing.
debian_archive() {
  local codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || return 0
  apt-cache policy 2>/dev/null | awk -v want="$codename/main" '$3 == want && / Packages$/ { print $2, "'"$codename"'"; exit }'
}

# Debian's trilinos source package holds Kokkos 3.4.01 and Kokkos Kernels 3.4.01 (packages/kokkos*).
fetch_trilinos_source() {
  local dir=$1 archive
  archive=$(debian_archive)
  if [ -z "$archive" ]; then  # no package lists yet: read the sources once
    as_root apt-get update -q >/dev/null
    archive=$(debian_archive)
  fi
  if [ -z "$archive" ]; then
    echo "[vpce setup] no apt source for this Debian release's main component is configured (apt-cache policy" \
         "lists none): add one (a mirror works) or set Kokkos_ROOT to an installed Kokkos" >&2
    return 1
  fi
  mkdir -p "$dir/lists/partial"
  echo "deb-src $archive main" >"$dir/sources.list"
  local apt_opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
                  -o "Dir::State::Lists=$dir/lists" -o Debug::NoLocking=1)
  (cd "$dir" && apt-get "${apt_opts[@]}" update -q >/dev/null &&
     apt-get "${apt_opts[@]}" source --download-only trilinos >/dev/null 2>&1)
  local tarball
  tarball=$(ls "$dir"/trilinos_*.orig.tar.* | head -n 1)
  log "extracting Kokkos from $(basename "$tarball")"
  tar -C "$dir" -xf "$tarball" --wildcards '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
}

# NVIDIA's CUDA compiler from PyPI (VPCE_CUDA=1): nvcc and its tools, cicc, the headers and cudart of one
# version, in a virtual environment of the cache; CUDA_ROOT is the toolkit's root, nvcc first in PATH.
cuda_toolchain() {
  if [ -f "$CUDA_ENV/.complete" ]; then
    log "CUDA $CUDA_WHEELS compiler cached in $CUDA_ENV"
  else
    log "installing NVIDIA's CUDA $CUDA_WHEELS compiler wheels from PyPI into $CUDA_ENV"
    rm -rf "$CUDA_ENV"
    /usr/bin/python3 -m venv "$CUDA_ENV"
    "$CUDA_ENV/bin/pip" install -q --disable-pip-version-check "nvidia-cuda-nvcc==$CUDA_WHEELS" \
      "nvidia-nvvm==$CUDA_WHEELS" "nvidia-cuda-crt==$CUDA_WHEELS" "nvidia-cuda-runtime==$CUDA_WHEELS"
  fi
  CUDA_ROOT=$(ls -d "$CUDA_ENV"/lib/python3*/site-packages/nvidia/cu13 | head -n 1)
  # The wheels carry libcudart.so.13 only; CMake and Kokkos look for libcudart.so.
  ln -sf libcudart.so.13 "$CUDA_ROOT/lib/libcudart.so"
  "$CUDA_ROOT/bin/nvcc" --version >/dev/null
  touch "$CUDA_ENV/.complete"
  export CUDA_ROOT PATH=$CUDA_ROOT/bin:$PATH
}

# Kokkos 3.4.01 predates CUDA 13 (Kokkos 4.7 is the first release for it): what vpce's build reaches needs four
# call sites edited (CUDA 13 dropped __half2double and the implicit conversions of the half functions'
# arguments, gave cudaMemPrefetchAsync a cudaMemLocation and a flags argument and cudaGraphAddDependencies an
# edge-data argument, and dropped sm_35, nvcc_wrapper's default architecture). Each edit must take.
cuda13_edits() {  # kokkos source folder
  local k=$1/core/src/Cuda
  sed -i -E 's/return __half2double\(val\);/return static_cast<double>(__half2float(__half(val)));/;
             s/return (__half2[a-z0-9_]+)\(val\);/return \1(__half(val));/' "$k/Kokkos_Cuda_Half.hpp"
  local device='space.cuda_device()' location='cudaMemLocation{cudaMemLocationTypeDevice, space.cuda_device()}'
  sed -i "s/cudaMemPrefetchAsync(ptr, bytes, $device,/cudaMemPrefetchAsync(ptr, bytes, $location, 0,/" \
    "$k/Kokkos_CudaSpace.cpp"
  sed -i 's/(m_graph, &pred_cuda_node, &cuda_node, 1)/(m_graph, \&pred_cuda_node, \&cuda_node, nullptr, 1)/' \
    "$k/Kokkos_Cuda_Graph_Impl.hpp"
  sed -i 's/^default_arch="sm_35"/default_arch="sm_80"/' "$1/bin/nvcc_wrapper"
  [ "$(grep -c '(__half(val))' "$k/Kokkos_Cuda_Half.hpp")" = 8 ] &&
    grep -q 'cudaMemLocation{cudaMemLocationTypeDevice' "$k/Kokkos_CudaSpace.cpp" &&
    grep -q '&cuda_node, nullptr, 1)' "$k/Kokkos_Cuda_Graph_Impl.hpp" &&
    grep -q '^default_arch="sm_80"' "$1/bin/nvcc_wrapper" ||
    { echo "[vpce setup] Kokkos 3.4.01's CUDA 13 edits did not apply" >&2; return 1; }
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
  local kokkos_args=(-DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON) kk_args=()
  if [ "$VPCE_CUDA" = 1 ]; then
    cuda13_edits "$tri/kokkos"
    kokkos_args=(-DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_CUDA_LAMBDA=ON -DKokkos_ENABLE_SERIAL=ON
                 -DKokkos_ARCH_AMPERE80=ON -DCMAKE_CXX_COMPILER="$tri/kokkos/bin/nvcc_wrapper" -DCUDA_ROOT="$CUDA_ROOT")
    kk_args=(-DCMAKE_CXX_COMPILER="$KOKKOS_PREFIX/bin/nvcc_wrapper" -DKokkosKernels_ENABLE_TPL_CUBLAS=OFF
             -DKokkosKernels_ENABLE_TPL_CUSPARSE=OFF)  # no cuBLAS in the wheels: Kokkos Kernels' own gemm
  fi
  cmake -S "$tri/kokkos" -B "$work/build-kokkos" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 \
    -DCMAKE_INSTALL_PREFIX="$KOKKOS_PREFIX" "${kokkos_args[@]}" -DBUILD_SHARED_LIBS=ON >"$work/kokkos-configure.log"
  cmake --build "$work/build-kokkos" -j "$JOBS" >"$work/kokkos-build.log"
  cmake --install "$work/build-kokkos" >/dev/null
  # Without ETI Kokkos Kernels is header-only for what vpce uses (gemm); the BLAS TPL sends host gemm to OpenBLAS.
  cmake -S "$tri/kokkos-kernels" -B "$work/build-kk" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 \
    -DCMAKE_INSTALL_PREFIX="$KOKKOS_PREFIX" -DKokkos_ROOT="$KOKKOS_PREFIX" -DBUILD_SHARED_LIBS=ON \
    -DKokkosKernels_ENABLE_TPL_BLAS=ON -DKokkosKernels_INST_DOUBLE=OFF -DKokkosKernels_INST_FLOAT=OFF \
    -DKokkosKernels_INST_LAYOUTLEFT=OFF -DKokkosKernels_INST_OFFSET_INT=OFF -DKokkosKernels_INST_OFFSET_SIZE_T=OFF \
    -DKokkosKernels_INST_ORDINAL_INT=OFF -DKokkosKernels_ENABLE_TESTS=OFF ${kk_args[@]+"${kk_args[@]}"} \
    >"$work/kk-configure.log"
  cmake --build "$work/build-kk" -j "$JOBS" >"$work/kk-build.log"
  cmake --install "$work/build-kk" >/dev/null
  touch "$KOKKOS_PREFIX/.complete"
  rm -rf "$work"
}

# Debian's python3 and its packages, plus what PyPI has and Debian 12 lacks (nanobind; scikit-build-core for
# `pip install .`), pinned: a virtual environment in the cache, made again when missing.
PYTHON_ENV=$VPCE_CACHE/python-env-nanobind-3.1.0-skbuild-1.1.2
python_env() {
  if [ -x "$PYTHON_ENV/bin/python" ] && [ -f "$PYTHON_ENV/.complete" ]; then
    log "Python environment cached in $PYTHON_ENV"
    return
  fi
  log "making the Python environment $PYTHON_ENV (nanobind, scikit-build-core from PyPI)"
  rm -rf "$PYTHON_ENV"
  /usr/bin/python3 -m venv --system-site-packages "$PYTHON_ENV"
  "$PYTHON_ENV/bin/pip" install -q --disable-pip-version-check nanobind==3.1.0 scikit-build-core==1.1.2
  touch "$PYTHON_ENV/.complete"
}

configure_vpce() {
  local args=(-DCMAKE_BUILD_TYPE="$VPCE_BUILD_TYPE")
  if [ "$VPCE_MPI" = mpich ] || [ "$VPCE_SANITIZE" = 1 ] || [ "$VPCE_CUDA" = 1 ] || [ "$VPCE_COMPILER" = clang ]; then
    args+=(-DVPCE_ENABLE_PYTHON=OFF)
  else
    args+=(-DVPCE_ENABLE_PYTHON=ON -DPython_EXECUTABLE="$PYTHON_ENV/bin/python")
  fi
  if [ -n "${Kokkos_ROOT:-}" ]; then
    args+=(-DKokkos_ROOT="$Kokkos_ROOT")
    [ -n "${KokkosKernels_ROOT:-}" ] && args+=(-DKokkosKernels_ROOT="$KokkosKernels_ROOT")
  else
    args+=(-DKokkos_ROOT="$KOKKOS_PREFIX" -DKokkosKernels_ROOT="$KOKKOS_PREFIX")
  fi
  if [ "$VPCE_MPI" = mpich ]; then
    args+=(-DMPI_C_COMPILER=/usr/bin/mpicc.mpich -DMPI_CXX_COMPILER=/usr/bin/mpicxx.mpich
           -DMPI_Fortran_COMPILER=/usr/bin/mpif90.mpich -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich
           -DHDF5_C_COMPILER_EXECUTABLE=/usr/bin/h5pcc.mpich)
  fi
  [ "$VPCE_CUDA" = 1 ] && args+=(-DCMAKE_CXX_COMPILER="${Kokkos_ROOT:-$KOKKOS_PREFIX}/bin/nvcc_wrapper")
  [ "$VPCE_COMPILER" = clang ] && args+=(-DCMAKE_CXX_COMPILER=clang++)  # C (the examples) stays GCC's
  if [ "$VPCE_SANITIZE" = 1 ]; then
    args+=(-DCMAKE_CXX_COMPILER=g++ -DCMAKE_C_COMPILER=gcc -DCMAKE_Fortran_COMPILER=gfortran
           "-DCMAKE_CXX_FLAGS=$VPCE_SANITIZE_FLAGS" "-DCMAKE_C_FLAGS=$VPCE_SANITIZE_FLAGS"
           "-DCMAKE_Fortran_FLAGS=$VPCE_SANITIZE_FLAGS" "-DCMAKE_EXE_LINKER_FLAGS=$VPCE_SANITIZE_LDFLAGS"
           "-DCMAKE_SHARED_LINKER_FLAGS=$VPCE_SANITIZE_LDFLAGS" "-DCMAKE_MODULE_LINKER_FLAGS=$VPCE_SANITIZE_LDFLAGS")
  fi
  args+=(-DVPCE_CLANG_TIDY_CACHE="$VPCE_CACHE/clang-tidy")  # clean clang-tidy results (the vpce_clang_tidy test)
  if command -v ccache >/dev/null 2>&1; then
    if [ -z "${CCACHE_DIR:-}" ]; then
      # At most 2 GB (ccache's default is 5 GB; the disk is shared with the build folders): a week of CI runs
      # over changing kernels left 1.1 GB here.
      export CCACHE_DIR=$VPCE_CACHE/ccache CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-2G}
    fi
    # Hits across clones at other paths (CI clones afresh): ccache hashes, and hands the compiler, the paths
    # under the clone relative to the build folder, and leaves the folder out of the -g builds' hash. So
    # __FILE__ in vpce's error locations reads ../include/... in these builds, and the debug information of
    # an object reused from another clone names that clone's build folder.
    export CCACHE_BASEDIR=$VPCE_SRC CCACHE_NOHASHDIR=1
    args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  # shellcheck disable=SC2206
  args+=(${VPCE_CMAKE_ARGS:--DVPCE_ENABLE_NATIVE=ON})
  log "configuring vpce in $VPCE_BUILD"
  cmake -S "$VPCE_SRC" -B "$VPCE_BUILD" "${args[@]}" >/dev/null
  log "building vpce"
  if [ "$VPCE_CUDA" = 0 ]; then
    cmake --build "$VPCE_BUILD" -j "$JOBS"
    return
  fi
  # The CUDA build is a check: any warning fails it (nvcc's warnings were the first sign of device code that
  # breaks: a host lambda handed to the kernels, a KOKKOS_LAMBDA in a private member).
  local build_log=$VPCE_BUILD/cuda-build.log
  cmake --build "$VPCE_BUILD" -j "$JOBS" 2>&1 | tee "$build_log"
  if grep -E -n "warning( #[0-9A-Za-z-]+)?:|nvcc warning" "$build_log"; then
    echo "[vpce setup] the CUDA build has warnings (above; $build_log)" >&2
    return 1
  fi
}

# Running MPI programs from the scripts: root is allowed, more ranks than cores too. Kokkos' OpenMP
# backend warns without OMP_PROC_BIND; ranks share the cores, so threads are not bound by default.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_PROC_BIND=${OMP_PROC_BIND:-false}

# Sanitizers: GCC's ASan + UBSan (+ LSan at exit). A report ends the program with status 86 (not 1 or 2, the
# statuses the tool's error tests expect), so every test fails on one. Kokkos (cached, shared with the normal
# build) is not instrumented: the interceptors still check its allocations. Leaks are suppressed only inside
# the MPI runtime (scripts/lsan.supp). -O0: a third of -O1's compile time, the tests still fast enough.
# float-cast-overflow (not in GCC's "undefined") catches e.g. NaN converted to an integer. GCC's
# -Wmaybe-uninitialized gives false positives under ASan (in libstdc++'s <regex>): off in this build only.
# fast_unwind_on_malloc=0: the MPI libraries have no frame pointers, and the suppressions need whole stacks.
VPCE_SANITIZE_FLAGS="-O0 -g -fno-omit-frame-pointer -fsanitize=address,undefined,float-cast-overflow"
VPCE_SANITIZE_FLAGS+=" -fno-sanitize-recover=all -Wno-maybe-uninitialized"
VPCE_SANITIZE_LDFLAGS="-fsanitize=address,undefined,float-cast-overflow"
if [ "$VPCE_SANITIZE" = 1 ]; then
  # The caller's own *SAN_OPTIONS come last: they override these.
  # allocator_may_return_null: an allocation too large fails as without ASan (the tool's tests of a file
  # beyond memory expect vpce's error, not ASan's report).
  _o=detect_leaks=1:fast_unwind_on_malloc=0:exitcode=86:check_initialization_order=1:strict_init_order=1
  export ASAN_OPTIONS=$_o:detect_stack_use_after_return=1:allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}
  export LSAN_OPTIONS=suppressions=$VPCE_SRC/scripts/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=86${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}
fi

install_packages
[ "$VPCE_CUDA" = 0 ] || cuda_toolchain
[ -n "${Kokkos_ROOT:-}" ] || build_kokkos
[ "$VPCE_MPI" = mpich ] || [ "$VPCE_SANITIZE" = 1 ] || [ "$VPCE_CUDA" = 1 ] || [ "$VPCE_COMPILER" = clang ] || python_env
configure_vpce
if [ "$VPCE_SANITIZE" = 1 ]; then
  # After Kokkos' build (never instrumented): what the tests build against the installed package (the
  # install test's consumer) gets the same flags.
  export CXXFLAGS="$VPCE_SANITIZE_FLAGS" CFLAGS="$VPCE_SANITIZE_FLAGS" FFLAGS="$VPCE_SANITIZE_FLAGS"
  export LDFLAGS="$VPCE_SANITIZE_LDFLAGS"
  # The tests keep every shared object loaded to the end (scripts/keep_modules.c: OpenMPI's components
  # unloaded at MPI_Finalize cost LeakSanitizer 1 s per program). Preloaded before ASan's runtime, which
  # would refuse that order unless told (verify_asan_link_order=0).
  gcc -O2 -shared -fPIC -o "$VPCE_BUILD/keep_modules.so" "$VPCE_SRC/scripts/keep_modules.c"
  export LD_PRELOAD="$VPCE_BUILD/keep_modules.so${LD_PRELOAD:+:$LD_PRELOAD}"
  export ASAN_OPTIONS=verify_asan_link_order=0:$ASAN_OPTIONS
fi
