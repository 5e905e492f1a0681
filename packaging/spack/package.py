# Spack package recipe for vpce. Copy into a Spack repository as packages/vpce/package.py, e.g.
#   spack repo create myrepo && cp package.py myrepo/packages/vpce/ && spack repo add myrepo
#   spack install vpce+cuda cuda_arch=90 ^openmpi+cuda
from spack.package import *


class Vpce(CMakePackage, CudaPackage):
    """Vocab-parallel softmax cross-entropy (loss and gradient) over MPI ranks with Kokkos kernels:
    Megatron-LM's vocab-parallel cross entropy as a C++17 library (with C and Fortran APIs)."""

    homepage = "https://example.invalid/vpce"
    git = "https://example.invalid/vpce.git"

    maintainers("vpce-developers")
    license("BSD-3-Clause")

    version("main", branch="main")

    variant("openmp", default=True, description="Kokkos OpenMP backend for the host")
    variant("hdf5", default=True, description="Build the vpce command-line tool (parallel HDF5 input/output)")
    variant("gpu_aware_mpi", default=False, description="Pass device buffers to MPI directly (needs a CUDA-aware MPI)")
    variant("tests", default=False, description="Build the unit tests (GoogleTest)")

    depends_on("cmake@3.16:", type="build")
    depends_on("mpi")
    depends_on("kokkos@3.4:")
    depends_on("kokkos+openmp", when="+openmp")
    depends_on("kokkos+serial", when="~openmp~cuda")
    depends_on("hdf5+mpi", when="+hdf5")
    depends_on("googletest", type="build", when="+tests")

    conflicts("+gpu_aware_mpi", when="~cuda", msg="GPU-aware MPI only matters for device memory")

    for arch in CudaPackage.cuda_arch_values:
        depends_on(f"kokkos+cuda+cuda_lambda cuda_arch={arch}", when=f"+cuda cuda_arch={arch}")

    def cmake_args(self):
        args = [
            self.define("Kokkos_ROOT", self.spec["kokkos"].prefix),
            self.define_from_variant("VPCE_ENABLE_TOOL", "hdf5"),
            self.define_from_variant("VPCE_ENABLE_GPU_AWARE_MPI", "gpu_aware_mpi"),
            self.define_from_variant("VPCE_ENABLE_TESTS", "tests"),
            self.define("VPCE_ENABLE_BENCHMARKS", False),
            self.define("VPCE_ENABLE_EXAMPLES", False),
        ]
        if self.spec.satisfies("+cuda"):
            args.append(self.define("CMAKE_CXX_COMPILER", self.spec["kokkos"].kokkos_cxx))
        return args
